"""The Snakemake command's exit code where it is not Snakemake's own (allocstack/status/exitcode.py)."""

from __future__ import annotations

import json
import os
import sys
import time

from allocstack.status.exitcode import main_exit_code, settle

MAIN_LINE = ("allocstack: error [main-exit]: main producer (python3 -c) exited 3: producer: failing on purpose: "
             "the stack ended with it, and its exit code 3 fails the run\n")


def exits(monkeypatch) -> list[object]:
    """What the replaced ``sys.exit`` passes to the original (the test's own stand-in)."""
    called: list[object] = []
    monkeypatch.setattr(sys, "exit", sys.exit)  # undone after the test
    return called


def test_a_failed_main_gives_the_command_its_own_exit_code(tmp_path, monkeypatch):
    called = exits(monkeypatch)
    log = tmp_path / "main.log"
    log.write_text("producer: queued 12 tasks\n" + MAIN_LINE)
    assert main_exit_code(log, time.time()) == 3
    assert settle("error", tmp_path / "no-marker.json", log, time.time(), called.append) == 3
    sys.exit(1)  # as Snakemake ends after onerror
    assert called == [3]


def test_no_main_an_old_log_or_a_success_leave_snakemakes_code(tmp_path, monkeypatch):
    called = exits(monkeypatch)
    log = tmp_path / "main.log"
    assert settle("error", tmp_path / "none.json", log, time.time(), called.append) is None  # no main: no log
    log.write_text("producer: done\n")
    assert main_exit_code(log, time.time()) is None  # it did not fail
    log.write_text(MAIN_LINE)
    os.utime(log, (time.time() - 3600, time.time() - 3600))
    assert main_exit_code(log, time.time()) is None  # an earlier command's log
    os.utime(log)
    assert settle("success", tmp_path / "none.json", log, time.time(), called.append) is None
    assert called == []


def test_a_serving_stack_that_was_up_exits_0(tmp_path, monkeypatch):
    called = exits(monkeypatch)
    marker = tmp_path / "result.json"
    marker.write_text(json.dumps({"mode": "serve", "status": "success"}))
    assert settle("error", marker, tmp_path / "main.log", time.time(), called.append) == 0
    sys.exit(1)
    assert called == [0]
