"""The readiness gate's contract: exit 0 ready, 24 timeout, 64 bad arguments."""

from __future__ import annotations

import json
import time

from readiness import following

from allocstack.common.endpoint import Endpoint, write_endpoint
from conftest import make_tasks, run_script


def test_ready_writes_gate_record(start_coordinator, tmp_path):
    coordinator = start_coordinator(make_tasks(4))
    record = tmp_path / "gate.json"
    done = run_script("readiness.py", "--endpoint", coordinator.url, "--task-count", 4, "--timeout", 5,
                      "--record", record)
    assert done.returncode == 0, done.stderr
    gate = json.loads(record.read_text())
    assert gate["status"] == "ready" and gate["taskCount"] == 4 and gate["secondsToReady"] < 5


def test_endpoint_file_mode_waits_for_the_file(start_coordinator):
    coordinator = start_coordinator(make_tasks(2))
    done = run_script("readiness.py", "--scratch", coordinator.scratch, "--task-count", 2, "--timeout", 5)
    assert done.returncode == 0, done.stderr
    events = coordinator.scratch / "events.jsonl"
    assert '"event":"gate-passed"' in events.read_text()


def test_wrong_task_count_times_out_with_24(start_coordinator):
    coordinator = start_coordinator(make_tasks(3))
    started = time.monotonic()
    done = run_script("readiness.py", "--endpoint", coordinator.url, "--task-count", 4, "--timeout", 0.5)
    assert done.returncode == 24
    assert "[readiness-timeout]" in done.stderr and "taskCount 4" in done.stderr
    assert time.monotonic() - started < 5


def test_nothing_listening_times_out_with_24(tmp_path):
    done = run_script("readiness.py", "--endpoint", "http://127.0.0.1:9", "--task-count", 1, "--timeout", 0.3)
    assert done.returncode == 24


def test_missing_endpoint_file_times_out_with_24(tmp_path):
    done = run_script("readiness.py", "--endpoint-file", tmp_path / "none.json", "--task-count", 1, "--timeout", 0.3)
    assert done.returncode == 24 and "no endpoint file" in done.stderr


def test_non_loopback_and_bad_arguments_exit_64():
    for args in (
        ["--endpoint", "http://10.0.0.1:80", "--task-count", 1, "--timeout", 1],
        ["--endpoint", "http://example.org:80", "--task-count", 1, "--timeout", 1],
        ["--endpoint", "https://127.0.0.1:80", "--task-count", 1, "--timeout", 1],
        ["--endpoint", "http://127.0.0.1:80", "--task-count", 0, "--timeout", 1],
        ["--endpoint", "http://127.0.0.1:80", "--task-count", 1, "--timeout", -1],
        ["--endpoint", "http://127.0.0.1:80", "--task-count", 1],
    ):
        done = run_script("readiness.py", *args)
        assert done.returncode == 64, (args, done.stderr)
        assert done.stderr.count("\n") == 1 and "[usage]" in done.stderr


def test_the_gate_follows_the_endpoint_file_past_an_earlier_runs(tmp_path):
    """A crashed run's endpoint file is read first; the gate moves to the new service's as soon as it is published."""
    path = tmp_path / "endpoint.json"
    old, new = "http://127.0.0.1:9", "http://127.0.0.1:8"
    write_endpoint(path, old, "t0", "")
    check, in_use = following(path, Endpoint(old, "t0"),
                              lambda latest: ((lambda _timeout: (latest.url == new, f"probed {latest.url}")),
                                              f"{latest.url}/health"))
    assert check(1.0) == (False, f"probed {old}")
    path.unlink()  # what the new coordinator does first thing
    assert check(1.0)[0] is False and "no endpoint file" in check(1.0)[1]
    write_endpoint(path, new, "t1", "")
    assert check(1.0) == (True, f"probed {new}") and in_use() == (new, f"{new}/health")
