"""64 workers, 20,000 tasks on loopback: nothing lost, nothing twice, memory bounded (reported)."""

from __future__ import annotations

import json
import subprocess
import sys
import time

from conftest import SCRIPTS, expected_for, make_tasks, memory_mb, run_script, write_json

WORKERS = 64
TASKS = 20_000


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
