"""Daemon workers are named, never a silent hang (issue 25, point 2): the import says when the workers run a known
daemon that nothing ends; the check, while it waits for workers that keep running, says so every so often."""

from __future__ import annotations

import copy
import json
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from check import await_files, still_running
from test_compose_import import BASE, import_document

from workflow_helpers import snakemake


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


def test_the_line_names_worker_max_lifetime_as_the_bound_or_the_way_out():
    missing = [Path("worker-02.json")]
    unbounded = still_running(missing, 30, None)
    assert "(worker-02): a worker that runs a daemon" in unbounded
    assert "bound the workers (config worker.max_lifetime)" in unbounded and "rq worker --burst" in unbounded
    bounded = still_running(missing, 30, 120)
    assert bounded.endswith("; worker.max_lifetime (120 s) stops them when it has passed")


#: A daemon worker: notes that it is up, never ends by itself; on SIGTERM it notes so in the volume and exits 0.
DAEMON = ("import os, signal, sys, time; e = os.environ; out = e['ALLOCSTACK_VOLUME_OUT'];"
          " signal.signal(signal.SIGTERM, lambda *_: (open(os.path.join(out, e['ALLOCSTACK_WORKER_ID']), 'w')"
          ".write('stopped'), sys.exit(0)))\nwhile True: time.sleep(0.1)")
#: The check: every worker was stopped by SIGTERM (its note), so the run got past the wait.
CHECK = ("import os, sys; notes = sorted(n for n in os.listdir(os.environ['ALLOCSTACK_VOLUME_OUT']));"
         " print(f'check: stopped {notes}'); sys.exit(notes != ['worker-01', 'worker-02'])")


def run_daemon_workers(project: Path, run: str, workers: int, program: str, max_lifetime: int,
                       stop_grace_period: int, check: str, more: str = "") -> None:
    """Run ``run``: no tasks, ``workers`` long-running workers that run the Python ``program`` within
    ``max_lifetime``, then the Python ``check`` (``more``: a line more of config); assert the run succeeded."""
    python = json.dumps(sys.executable)
    (project / f"config/{run}.yaml").write_text(textwrap.dedent(f"""
        run: {run}
        tasks: null
        expected: null
        workers: {workers}
        worker: {{mode: long-running, command: [{python}, -c, {json.dumps(program)}], max_lifetime: {max_lifetime},
                  stop_grace_period: {stop_grace_period}}}
        {more}
        verify: {{command: [{python}, -c, {json.dumps(check)}]}}
    """))
    done = snakemake(project, "--cores", "4", "--configfile", f"config/{run}.yaml")
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]


def test_daemon_workers_are_ended_by_worker_max_lifetime_and_the_run_goes_on_to_the_check(project):
    run_daemon_workers(project, "lifetime", 2, DAEMON, max_lifetime=2, stop_grace_period=5, check=CHECK,
                       more="volumes: [out]")
    assert json.loads((project / "results/lifetime/result.json").read_text())["status"] == "success"
    for worker in ("worker-01", "worker-02"):
        log = (project / f"logs/run_worker/lifetime/{worker}.log").read_text()
        line = (f"{worker}: {sys.executable} -c still ran after worker.max_lifetime (2 s): max_lifetime ended it "
                "(SIGTERM; exited 0); the run goes on to the check")
        assert line in log, log[-2000:]
        record = json.loads((project / f"results/lifetime/workers/{worker}.json").read_text())
        assert record["status"] == "stopped"
    assert "check: stopped ['worker-01', 'worker-02']" in (project / "logs/run_check/lifetime.log").read_text()


def test_a_worker_that_ignores_sigterm_past_max_lifetime_is_killed_and_the_run_still_goes_on(project):
    stubborn = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN)\nwhile True: time.sleep(0.1)"
    run_daemon_workers(project, "stubborn", 1, stubborn, max_lifetime=1, stop_grace_period=1,
                       check="print('check: the run went on')")
    log = (project / "logs/run_worker/stubborn/worker-01.log").read_text()
    line = ("still ran after worker.max_lifetime (1 s): max_lifetime ended it (SIGTERM; killed after its "
            "stop_grace_period (1 s)); the run goes on to the check")
    assert line in log, log[-2000:]
    assert "check: the run went on" in (project / "logs/run_check/stubborn.log").read_text()
