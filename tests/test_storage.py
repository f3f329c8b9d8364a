"""Storage faults lose nothing: a full disk or quota under the journal and the results.

Real faults on a small tmpfs (mounting needs root: CI runs as root), plus an
exhausted quota injected into the journal's write (a quota needs a filesystem
with quotas, which this machine does not have).
"""

from __future__ import annotations

import asyncio
import errno
import json
import os
import subprocess
import time
from pathlib import Path

import pytest
import requests

from allocstack.common.errors import AllocstackError
from allocstack.coordinator.journal import Journal, replay
from conftest import RunningCoordinator, expected_for, make_tasks, run_script, write_json
from real_parts import unavailable
from workflow_helpers import SNAKEMAKE, snakemake


@pytest.fixture
def small_disk(tmp_path):
    """Mount a tmpfs of the given size at a fresh directory; unmounted afterwards."""
    mounted: list[Path] = []

    def mount(size: str, where: Path | None = None) -> Path:
        if os.geteuid() != 0:
            unavailable("mounting a small tmpfs needs root (CI runs the suite as root)")
        where = where or tmp_path / f"disk{len(mounted)}"
        where.mkdir(parents=True, exist_ok=True)
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(where)], check=True)
        mounted.append(where)
        return where

    yield mount
    for where in reversed(mounted):
        subprocess.run(["umount", "--lazy", str(where)], check=False)


def fill(disk: Path) -> Path:
    """Write a ballast file until the filesystem is full; return it (delete it to free the space)."""
    ballast = disk / "ballast"
    fd = os.open(ballast, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        while True:
            os.write(fd, b"\0" * 4096)
    except OSError as exc:
        assert exc.errno == errno.ENOSPC
    finally:
        os.close(fd)
    return ballast


def journal_lines(path: Path) -> list[dict]:
    raw = path.read_bytes()
    assert raw.endswith(b"\n"), "the journal ends in a torn line"
    return [json.loads(line) for line in raw.splitlines()]  # every line whole


def output_of(task: dict) -> str:
    return task["payload"]["message"] * task["payload"]["repeat"]


def result(task: dict) -> dict:
    import hashlib

    output = output_of(task)
    return {"taskId": task["id"], "output": output, "sha256": hashlib.sha256(output.encode()).hexdigest()}


def test_an_exhausted_quota_fails_the_append_and_leaves_whole_lines(tmp_path):
    path = tmp_path / "journal.jsonl"
    calls = {"n": 0}

    def quota_after_two_writes(fd: int, data: bytes) -> int:
        calls["n"] += 1
        if calls["n"] == 3:  # half a batch gets out, then the quota is exhausted
            return os.write(fd, bytes(data[: len(data) // 2]))
        if calls["n"] > 3:
            raise OSError(errno.EDQUOT, os.strerror(errno.EDQUOT))
        return os.write(fd, data)

    tasks = make_tasks(4)["tasks"]

    async def scenario():
        journal = Journal(path, "abc", write=quota_after_two_writes)  # write 1: the header
        await journal.append([result(tasks[0])])  # write 2
        with pytest.raises(AllocstackError) as first:
            await journal.append([result(tasks[1]), result(tasks[2])])  # writes 3 (half) and 4 (EDQUOT)
        with pytest.raises(AllocstackError) as later:
            await journal.append([result(tasks[3])])  # refused at once: the journal stays as it was
        journal.close()
        return first.value, later.value

    first, later = asyncio.run(scenario())
    assert first.diag == "storage" and "Disk quota exceeded" in first.message and str(path) in first.message
    assert "free there" in first.message and later is first
    assert [line.get("taskId") for line in journal_lines(path)] == [None, tasks[0]["id"]]  # the half batch is cut
    results, note = replay(path, "abc")
    assert [r["taskId"] for r in results] == [tasks[0]["id"]] and "torn" not in note


def test_a_full_state_disk_stops_claims_says_so_once_and_the_rerun_resumes(small_disk, tmp_path):
    disk = small_disk("1m")
    tasks = make_tasks(12, message="x" * 100, repeat=80)  # 8 KB outputs
    journal = disk / "state" / "journal.jsonl"
    coordinator = RunningCoordinator(tmp_path, tasks, "--journal", str(journal))
    s = requests.Session()
    s.headers["Authorization"] = f"Bearer {coordinator.token}"
    claimed = s.post(coordinator.url + "/claim", json={"workerId": "w", "max": 5}).json()["tasks"]
    done = s.post(coordinator.url + "/results", json={"workerId": "w", "results": [result(t) for t in claimed[:3]]})
    assert done.json()["accepted"] == [t["id"] for t in claimed[:3]]
    ballast = fill(disk)

    refused = s.post(coordinator.url + "/results", json={"workerId": "w", "results": [result(claimed[3])]})
    assert refused.status_code == 507 and "No space left on device" in refused.json()["error"]
    piggybacked = s.post(coordinator.url + "/claim",
                         json={"workerId": "w", "max": 1, "results": [result(claimed[4])]})
    assert piggybacked.status_code == 507
    stop = s.post(coordinator.url + "/claim", json={"workerId": "w2", "max": 1}).json()
    assert stop["status"] == "stop" and "cannot store results" in stop["reason"]
    status = s.get(coordinator.url + "/status").json()
    assert status["done"] == 3 and status["leased"] == 2  # the board never ran ahead of the journal
    assert coordinator.stop() == 74
    storage_lines = [line for line in coordinator.log_text().splitlines() if "[storage]" in line]
    assert len(storage_lines) == 1, storage_lines
    assert str(journal) in storage_lines[0] and "free there" in storage_lines[0]
    assert [line.get("taskId") for line in journal_lines(journal)[1:]] == [t["id"] for t in claimed[:3]]
    end = json.loads(coordinator.end_record.read_text())
    assert end["status"] == "incomplete" and end["reason"].startswith("storage: cannot write journal")

    ballast.unlink()  # space freed: the same command resumes
    rerun = RunningCoordinator(tmp_path, tasks, "--journal", str(journal))
    gate = tmp_path / "gate.json"
    gate.write_text('{"status": "ready"}')
    worker = run_script("worker.py", "--worker-id", "worker-01", "--scratch", rerun.scratch, "--gate-record", gate,
                        "--record", tmp_path / "worker.json")
    assert worker.returncode == 0, worker.stderr
    assert rerun.stop() == 0
    assert json.loads((tmp_path / "worker.json").read_text())["tasksCompleted"] == 9  # 3 acknowledged: not again
    assert json.loads(rerun.end_record.read_text())["restored"] == 3
    expected = write_json(tmp_path / "expected.json", expected_for(tasks))
    verify = run_script("verify.py", "--input", rerun.tasks_path, "--results", rerun.results, "--expected", expected,
                        "--output", tmp_path / "result.json", "--end-record", rerun.end_record)
    assert verify.returncode == 0, verify.stderr


def test_too_little_room_up_front_is_refused_before_serving(small_disk, tmp_path):
    disk = small_disk("64k")
    tasks = make_tasks(50, message="y" * 100, repeat=50)  # ~250 KB of output
    summary = write_json(tmp_path / "inputs.json", {"schemaVersion": 1, "outputBytes": 50 * 100 * 50})
    tasks_path = write_json(tmp_path / "tasks.json", tasks)
    done = run_script("coordinator.py", "--input", tasks_path, "--results", disk / "results.json",
                      "--journal", disk / "state" / "journal.jsonl", "--endpoint-file", tmp_path / "endpoint.json",
                      "--end-record", tmp_path / "end.json", "--inputs-summary", summary)
    assert done.returncode == 74
    [line] = done.stderr.strip().splitlines()[-1:]
    assert line.startswith("allocstack: error [storage]: not enough room:") and "free there" in line
    assert not (tmp_path / "endpoint.json").exists()
    end = json.loads((tmp_path / "end.json").read_text())
    assert end["status"] == "failed" and "[storage]" in end["reason"]  # the gate fails at once with it


def workflow_config(project: Path, run: str, tasks: int, state_dir: str) -> Path:
    document = make_tasks(tasks, message="z" * 500, repeat=40)  # 20 KB outputs
    write_json(project / f"inputs/{run}.json", document)
    write_json(project / f"expected/{run}.json", expected_for(document))
    config = project / f"config/{run}.yaml"
    config.write_text(
        f"tasks: inputs/{run}.json\nexpected: expected/{run}.json\nrun: {run}\nworkers: 2\nstate_dir: {state_dir}\n"
        "simulate: {task_seconds: 0.15}\ncoordinator: {lease_seconds: 5}\n"
        "worker: {connect_timeout: 5, wait_timeout: 60}\n")
    return config


def test_a_run_with_state_and_results_on_a_disk_that_fills_fails_cleanly_and_resumes(small_disk, project):
    run = "full"
    disk = small_disk("4m", project / "disk")
    (disk / "results").mkdir()
    (project / "results").symlink_to(disk / "results")  # results/<run> on the small disk too
    config = workflow_config(project, run, 40, "disk/state")
    journal = disk / "state" / run / "journal.jsonl"
    proc = subprocess.Popen(["timeout", "-k", "10", "300", SNAKEMAKE, "--cores", "4", "--configfile", str(config)],
                            cwd=project, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "TMPDIR": str(project / "tmp")})
    deadline = time.monotonic() + 120
    while not (journal.exists() and journal.read_bytes().count(b'"kind":"result"') >= 4):
        assert time.monotonic() < deadline and proc.poll() is None, "the run did not start journaling"
        time.sleep(0.05)
    ballast = fill(disk)
    output, _ = proc.communicate(timeout=240)
    assert proc.returncode != 0, output[-3000:]
    assert not (project / f"results/{run}/result.json").exists()  # no marker
    leftovers = [p.name for p in (project / f"results/{run}").rglob("*") if p.name.startswith(".")]
    assert not leftovers, leftovers  # nothing half-written
    acknowledged = [line["taskId"] for line in journal_lines(journal)[1:]]
    assert 4 <= len(acknowledged) < 40
    log = (project / f"logs/serve_coordinator/{run}.log").read_text()
    storage_lines = [line for line in log.splitlines() if "[storage]" in line]
    print("\n".join(storage_lines + [line for line in output.splitlines() if "allocstack: error" in line]))
    assert storage_lines and "journal" in storage_lines[0] and "free there" in storage_lines[0], log[-2000:]

    ballast.unlink()
    rerun = snakemake(project, "--cores", "4", "--configfile", str(config))
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    marker = json.loads((project / f"results/{run}/result.json").read_text())
    assert marker["status"] == "success" and marker["taskCount"] == 40
    end = json.loads((project / f"results/{run}/coordinator.json").read_text())
    assert end["restored"] == len(acknowledged)
    computed = sum(json.loads(p.read_text())["tasksCompleted"]
                   for p in (project / f"results/{run}/workers").glob("*.json"))
    assert computed == 40 - len(acknowledged)  # no acknowledged result was computed again


def test_the_room_estimate_counts_each_id_and_output():
    """The journal's need for the pending tasks, results.json's and the marker's for every task, from the count of
    ids and their characters, counted from a list (a fresh run: every task pending) or one at a time (a resumed
    run's pending ids)."""
    from allocstack.common import storage

    ids = [f"task-{number:0{number % 7 + 1}d}" for number in range(1000)]
    pending = ids[::3]
    journal = sum(storage.JOURNAL_LINE_BYTES + len(task_id) for task_id in pending) + 5000 * len(pending) // 1000
    results = 2 * (sum(storage.RESULTS_ENTRY_BYTES + len(task_id) for task_id in ids) + 5000)
    assert storage.id_totals(ids) == (1000, sum(map(len, ids))) == storage.id_totals(iter(ids))
    assert storage.estimate(storage.id_totals(ids), 5000, storage.id_totals(iter(pending))) == (journal, results)
