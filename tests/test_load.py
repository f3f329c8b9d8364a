"""Load on loopback: 64 workers on 20,000 tasks, and 100,000 tasks of either shape through a coordinator killed
mid-run: nothing lost, nothing twice, memory bounded (reported)."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from conftest import SCRIPTS, expected_for, make_tasks, memory_mb, run_script, write_json

WORKERS = 64
TASKS = 20_000
BIG = 100_000


def test_64_workers_20000_tasks(start_coordinator, tmp_path):
    tasks = make_tasks(TASKS)
    coordinator = start_coordinator(tasks, "--lease-seconds", "120")
    gate = tmp_path / "gate.json"
    gate.write_text('{"status": "ready"}')
    started = time.monotonic()
    workers = [
        subprocess.Popen([sys.executable, str(SCRIPTS / "worker.py"), "--worker-id", f"worker-{i:02d}",
                          "--scratch", str(coordinator.scratch), "--gate-record", str(gate), "--batch", "4",
                          "--record", str(tmp_path / f"w{i:02d}.json")],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        for i in range(1, WORKERS + 1)
    ]
    for worker in workers:
        assert worker.wait(timeout=600) == 0, worker.stderr.read()
    elapsed = time.monotonic() - started
    peak = memory_mb(coordinator.proc.pid, "VmHWM")
    assert coordinator.stop() == 0
    end = json.loads(coordinator.end_record.read_text())
    results = json.loads(coordinator.results.read_text())["results"]
    assert len(results) == TASKS and len({r["taskId"] for r in results}) == TASKS  # zero lost, zero duplicate
    completed = sum(json.loads((tmp_path / f"w{i:02d}.json").read_text())["tasksCompleted"]
                    for i in range(1, WORKERS + 1))
    assert completed == TASKS and end["resultCount"] == TASKS
    expected = write_json(tmp_path / "expected.json", expected_for(tasks))
    verify = run_script("verify.py", "--input", coordinator.tasks_path, "--results", coordinator.results,
                        "--expected", expected, "--output", tmp_path / "result.json",
                        "--end-record", coordinator.end_record, timeout=300)
    assert verify.returncode == 0, verify.stderr
    assert peak < 400, f"coordinator peak RSS {peak:.0f} MB"
    print(f"{WORKERS} workers, {TASKS} tasks: {elapsed:.1f} s ({TASKS / elapsed:.0f} tasks/s), "
          f"coordinator peak RSS {peak:.0f} MB, {end['journalFsyncs']} journal fsyncs for {TASKS} results")


def _journaled(journal) -> int:
    """Results the journal holds durably: its whole lines but the header."""
    data = journal.read_bytes() if journal.exists() else b""
    return max(0, data.count(b"\n") - 1)


def _coordinator(tmp_path, files, log):
    """A coordinator as the workflow starts it: the validated summary and its compact task set, the run's journal."""
    return subprocess.Popen(
        [sys.executable, str(SCRIPTS / "coordinator.py"), "--input", str(files["tasks"]), "--results",
         str(tmp_path / "results.json"), "--end-record", str(tmp_path / "end.json"), "--inputs-summary",
         str(files["summary"]), "--compact-tasks", str(files["compact"]), "--journal", str(files["journal"]),
         "--scratch", str(tmp_path / "scratch"), "--workers", "2", "--lease-seconds", "600",
         "--progress-interval", "3600"],
        stdout=subprocess.DEVNULL, stderr=log)


def _workers(tmp_path, round_: str, *extra: str) -> list[subprocess.Popen]:
    gate = tmp_path / "gate.json"
    gate.write_text('{"status": "ready"}')
    return [subprocess.Popen([sys.executable, str(SCRIPTS / "worker.py"), "--worker-id", f"{round_}-{i}", "--scratch",
                              str(tmp_path / "scratch"), "--gate-record", str(gate), "--batch", "256",
                              "--record", str(tmp_path / f"{round_}-{i}.json"), *extra],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            for i in (1, 2)]


def _await_endpoint(tmp_path, proc) -> None:
    endpoint = tmp_path / "scratch" / "endpoint.json"
    deadline = time.monotonic() + 60
    while not endpoint.exists():
        assert proc.poll() is None and time.monotonic() < deadline, "the coordinator did not start"
        time.sleep(0.01)


@pytest.mark.parametrize("shape", ["plain", "realistic"])
def test_100000_tasks_of_either_shape_exactly_once_through_a_coordinator_killed_mid_run(shape, tmp_path):
    """100,000 tasks of make_tasks.py's plain shape and of its realistic one (shuffled ids of several forms,
    non-ASCII messages, some outside the BMP, quotes, backslashes, control characters), validated as the
    workflow does, two workers at batch 256. The coordinator is killed (SIGKILL) mid-run and started again
    on the same journal with two new workers: every task has exactly one result, every result journaled
    before the kill is restored and not computed again, and verification passes (on its validated path)."""
    files = {"tasks": tmp_path / "tasks.json", "expected": tmp_path / "expected.json", "summary": tmp_path / "inputs.json",
             "compact": tmp_path / "tasks.compact", "journal": tmp_path / "state" / "journal.jsonl"}
    made = run_script("make_tasks.py", str(BIG), "--shape", shape, "--tasks", files["tasks"], "--expected",
                      files["expected"], timeout=300)
    assert made.returncode == 0, made.stderr
    validated = run_script("validate_inputs.py", "--tasks", files["tasks"], "--expected", files["expected"],
                           "--workers", "2", "--output", files["summary"], "--compact-tasks", files["compact"],
                           timeout=300)
    assert validated.returncode == 0, validated.stderr
    log = open(tmp_path / "coordinator.log", "ab")  # noqa: SIM115  (both coordinators' log, closed below)
    started: list[subprocess.Popen] = []
    try:
        first = _coordinator(tmp_path, files, log)
        started.append(first)
        _await_endpoint(tmp_path, first)
        # Slowed down (0.1 ms a task) so that the kill lands mid-run; unreachable after it, they give up in a second.
        doomed = _workers(tmp_path, "first", "--simulate-seconds", "0.0001", "--connect-timeout", "1")
        started += doomed
        deadline = time.monotonic() + 120
        while _journaled(files["journal"]) < BIG // 10:
            assert time.monotonic() < deadline and first.poll() is None, "no progress before the kill"
            time.sleep(0.005)
        first.kill()
        first.wait()
        for worker in doomed:
            assert worker.wait(timeout=120) != 0  # the coordinator is gone: no worker ends as if all were done
        durable = _journaled(files["journal"])
        assert BIG // 10 <= durable < BIG

        (tmp_path / "scratch" / "endpoint.json").unlink(missing_ok=True)
        second = _coordinator(tmp_path, files, log)
        started.append(second)
        _await_endpoint(tmp_path, second)
        workers = _workers(tmp_path, "second")
        started += workers
        for worker in workers:
            assert worker.wait(timeout=300) == 0, worker.stderr.read()
        peak = memory_mb(second.pid, "VmHWM")
        second.terminate()
        assert second.wait(timeout=120) == 0
    finally:
        for proc in started:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        log.close()
    end = json.loads((tmp_path / "end.json").read_text())
    assert end["status"] == "completed" and end["resultCount"] == BIG and end["restored"] == durable
    computed = sum(json.loads((tmp_path / f"second-{i}.json").read_text())["tasksCompleted"] for i in (1, 2))
    assert computed == BIG - durable  # nothing journaled was computed again
    results = json.loads((tmp_path / "results.json").read_text())["results"]
    ids = [result["taskId"] for result in results]
    assert len(ids) == BIG and ids == sorted(set(ids))  # each task once, in task id order
    verified = run_script("verify.py", "--input", files["tasks"], "--results", tmp_path / "results.json",
                          "--expected", files["expected"], "--inputs-summary", files["summary"],
                          "--end-record", tmp_path / "end.json", "--output", tmp_path / "result.json", timeout=300)
    assert verified.returncode == 0, verified.stderr
    assert json.loads((tmp_path / "result.json").read_text())["taskCount"] == BIG
    print(f"{shape}: {durable} results journaled before the kill, {computed} after; coordinator peak {peak:.0f} MB")
