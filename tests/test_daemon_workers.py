"""Daemon workers are named, never a silent hang (issue 25, point 2): the import says when the workers run a known
daemon that nothing ends; the check, while it waits for workers that keep running, says so every so often."""

from __future__ import annotations

import copy
import threading
import time

import pytest
from check import await_files
from test_compose_import import BASE, import_document


@pytest.mark.parametrize("command, daemon", [
    (["rq", "worker", "--url", "redis://redis:6379"], "rq worker"),
    ("celery -A tasks worker --loglevel=info", "celery worker"),
    (["dramatiq", "tasks"], "dramatiq"),
    (["rq", "worker", "--burst"], None),
    (["python3", "app.py"], None),
])
def test_the_import_names_a_daemon_worker_that_nothing_ends(tmp_path, capsys, monkeypatch, command, daemon):
    document = copy.deepcopy(BASE)
    document["services"]["worker"]["command"] = command
    code, _, _ = import_document(tmp_path, document, env={}, monkeypatch=monkeypatch)
    out = capsys.readouterr()
    assert code == 0, out.err
    said = f"worker: the workers run `{daemon}`, a daemon that never ends by itself, and nothing ends the stack"
    if daemon:
        assert said in out.out + out.err and "1 gap(s)" in out.out
    else:
        assert "a daemon that never ends by itself" not in out.out + out.err and "0 gap(s)" in out.out


def test_the_check_says_which_workers_it_still_waits_for(tmp_path):
    records = [tmp_path / "worker-01.json", tmp_path / "worker-02.json"]
    records[0].write_text("{}")
    lines: list[str] = []
    ends = threading.Timer(0.8, records[1].write_text, ["{}"])
    ends.start()
    started = time.monotonic()
    await_files(records, lines.append, every=0.3)
    ends.join()
    assert time.monotonic() - started >= 0.8  # it waited for the record
    assert lines[0] == "waiting for 1 worker(s) to end"
    assert len(lines) >= 2 and all(line.startswith("still waiting for 1 worker(s) after ") for line in lines[1:])
    assert "(worker-02): a worker that runs a daemon (celery worker, rq worker, a server) never ends by itself" \
        in lines[1] and "rq worker --burst" in lines[1]
