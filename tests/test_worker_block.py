"""A job step of several workers (worker_block.py): real worker processes, a real relay and a real coordinator on
loopback. Each worker keeps its identity (id, record, log, event log, leases); a worker killed from outside is
started again, then recorded killed; a failing worker fails the step; the step's stop signal reaches every worker;
the relay lets no stranger through and batches its workers' requests (POST /batch on the coordinator)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import requests

from allocstack.common.events import read_events
from allocstack.worker.block import Fate, Members, fate
from allocstack.worker.client import MAX_BACKOFF, backoff
from conftest import PYTHON, SCRIPTS, make_tasks, pids_mentioning, wait_for, write_json


def gate(tmp_path: Path) -> Path:
    return write_json(tmp_path / "gate.json", {"status": "ready"})


def start_step(coordinator, tmp_path: Path, workers: int, *worker_args: str, step: str = "workers-01",
               first: int = 1, extra: tuple[str, ...] = ()) -> subprocess.Popen:
    """worker_block.py with ``workers`` workers (worker-NN from ``first``) against ``coordinator``, its gate passed."""
    ids = [f"--worker=worker-{i:02d}" for i in range(first, first + workers)]
    return subprocess.Popen(
        [PYTHON, str(SCRIPTS / "worker_block.py"), f"--step={step}", *ids, f"--records={tmp_path / 'records' / step}",
         f"--log-dir={tmp_path / 'logs'}", f"--scratch={coordinator.scratch}", f"--gate-record={gate(tmp_path)}",
         *extra, *(f"--worker-arg={arg}" for arg in worker_args)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def records(tmp_path: Path, step: str = "workers-01") -> dict[str, dict]:
    return {path.stem: json.loads(path.read_text()) for path in (tmp_path / "records" / step).glob("*.json")}


def worker_pid(step: subprocess.Popen, worker: str) -> int | None:
    """The pid of ``worker``'s current process, a child of the step."""
    for pid in pids_mentioning(f"--worker-id={worker}"):
        try:
            if int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1]) == step.pid:
                return pid
        except (OSError, ValueError, IndexError):
            continue
    return None


def test_each_worker_of_a_step_keeps_its_id_record_log_and_events(start_coordinator, tmp_path):
    tasks = make_tasks(3000)
    coordinator = start_coordinator(tasks, "--workers", "8")
    step = start_step(coordinator, tmp_path, 8, "--batch=16")
    _, stderr = step.communicate(timeout=120)
    assert step.returncode == 0, stderr
    assert coordinator.stop() == 0
    found = records(tmp_path)
    names = [f"worker-{i:02d}" for i in range(1, 9)]
    assert sorted(found) == names and all(record["status"] == "done" for record in found.values())
    end = json.loads(coordinator.end_record.read_text())
    assert end["resultCount"] == 3000 and sorted(end["workers"]) == names  # the coordinator knows each by its id
    assert sum(record["tasksCompleted"] for record in found.values()) == 3000
    assert {worker: stats["completed"] for worker, stats in end["workers"].items()} == \
        {worker: record["tasksCompleted"] for worker, record in found.items()}
    results = json.loads(coordinator.results.read_text())["results"]
    assert len({r["taskId"] for r in results}) == 3000 and {r["workerId"] for r in results} <= set(names)
    for worker in names:  # its own log, its own events
        assert f"{worker}: done: {found[worker]['tasksCompleted']} tasks" in (tmp_path / "logs" / f"{worker}.log").read_text()
    starts = [e["worker"] for e in read_events(coordinator.scratch / "events.jsonl") if e["event"] == "worker-start"]
    assert sorted(starts) == names
    summary = stderr.strip().splitlines()[-1]
    assert summary.startswith("workers-01: ended: 8 done; ") and "round trips to the coordinator" in summary
    assert not (coordinator.scratch / "relay-workers-01.json").exists()  # its relay's endpoint: gone with it


def test_a_worker_killed_from_outside_is_started_again_and_its_leases_expire(start_coordinator, tmp_path):
    tasks = make_tasks(120)
    coordinator = start_coordinator(tasks, "--workers", "4", "--lease-seconds", "2")
    step = start_step(coordinator, tmp_path, 4, "--batch=4", "--simulate-seconds=0.05", "--lease-seconds=2")
    victim = wait_for(lambda: worker_pid(step, "worker-02"), what="worker-02")
    wait_for(lambda: coordinator.journal.exists() and coordinator.journal.read_text().count('"kind":"result"') >= 8,
             what="results")  # mid-run: worker-02 holds leases
    os.kill(victim, signal.SIGKILL)
    again = wait_for(lambda: (pid := worker_pid(step, "worker-02")) != victim and pid, what="worker-02 again")
    assert again != victim
    _, stderr = step.communicate(timeout=120)
    assert step.returncode == 0, stderr
    assert "worker-02 was killed by SIGKILL from outside; started again (1 of at most 3)" in stderr
    assert coordinator.stop() == 0
    found = records(tmp_path)
    assert found["worker-02"]["status"] == "done"  # the second run of it wrote its record
    end = json.loads(coordinator.end_record.read_text())
    assert end["resultCount"] == 120 and end["expiredLeases"] >= 1  # what the killed process held came back
    results = json.loads(coordinator.results.read_text())["results"]
    assert len(results) == len({r["taskId"] for r in results}) == 120  # each task exactly once
    log = (tmp_path / "logs" / "worker-02.log").read_text()
    assert "workers-01: worker-02 was killed from outside; started again" in log and "worker-02: done:" in log
    starts = [e for e in read_events(coordinator.scratch / "events.jsonl")
              if e["event"] == "worker-start" and e["worker"] == "worker-02"]
    assert len(starts) == 2


def test_a_worker_killed_too_often_is_recorded_killed_and_the_others_finish(start_coordinator, tmp_path):
    tasks = make_tasks(80)
    coordinator = start_coordinator(tasks, "--workers", "3", "--lease-seconds", "2")
    step = start_step(coordinator, tmp_path, 3, "--batch=2", "--simulate-seconds=0.05", "--lease-seconds=2",
                      extra=("--max-restarts=0",))
    victim = wait_for(lambda: worker_pid(step, "worker-03"), what="worker-03")
    time.sleep(0.5)
    os.kill(victim, signal.SIGKILL)
    _, stderr = step.communicate(timeout=120)
    assert step.returncode == 0, stderr
    assert "worker-03 was killed by SIGKILL from outside 1 times; recorded killed, the other workers go on" in stderr
    found = records(tmp_path)
    assert found["worker-03"]["status"] == "killed" and found["worker-03"]["signal"] == "SIGKILL"
    assert found["worker-01"]["status"] == found["worker-02"]["status"] == "done"
    assert coordinator.stop() == 0
    assert json.loads(coordinator.end_record.read_text())["resultCount"] == 80


def test_a_worker_that_fails_fails_the_step_with_its_code_and_stops_the_others(start_coordinator, tmp_path):
    tasks = make_tasks(400)
    coordinator = start_coordinator(tasks, "--workers", "3")
    (tmp_path / "records" / "workers-01" / "worker-02.json").mkdir(parents=True)  # worker-02 cannot write its record
    step = start_step(coordinator, tmp_path, 3, "--batch=8", "--simulate-seconds=0.001")
    _, stderr = step.communicate(timeout=120)
    log = (tmp_path / "logs" / "worker-02.log").read_text()
    assert "allocstack: error [io]" in log, log
    assert step.returncode == 74, stderr  # worker-02's own exit code ([io])
    assert "worker-02 exited 74: the step fails" in stderr
    coordinator.stop()


def test_the_steps_stop_signal_reaches_every_worker(start_coordinator, tmp_path):
    coordinator = start_coordinator(make_tasks(500), "--workers", "4")
    step = start_step(coordinator, tmp_path, 4, "--batch=1", "--simulate-seconds=0.2")
    pids = wait_for(lambda: all(worker_pid(step, f"worker-{i:02d}") for i in range(1, 5)) and
                    [worker_pid(step, f"worker-{i:02d}") for i in range(1, 5)], what="every worker")
    step.send_signal(signal.SIGTERM)
    _, stderr = step.communicate(timeout=60)
    assert step.returncode == 128 + signal.SIGTERM, stderr
    assert "SIGTERM: stopping its 4 running worker(s)" in stderr and "4 stopped" in stderr
    assert not [pid for pid in pids if Path(f"/proc/{pid}").exists()
                and Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"]
    coordinator.stop()


def test_the_relay_lets_no_stranger_through_and_answers_each_worker_as_the_coordinator_would(start_coordinator,
                                                                                             tmp_path):
    coordinator = start_coordinator(make_tasks(50), "--workers", "2")
    step = start_step(coordinator, tmp_path, 2, "--batch=1", "--simulate-seconds=0.3")
    relay = coordinator.scratch / "relay-workers-01.json"
    document = wait_for(lambda: relay.exists() and json.loads(relay.read_text()), what="the relay's endpoint")
    assert relay.stat().st_mode & 0o777 == 0o600 and document["endpoint"].startswith("http://127.0.0.1:")
    url = document["endpoint"]
    for token in (None, "guess"):
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        assert requests.post(url + "/claim", json={"workerId": "intruder"}, headers=headers, timeout=5).status_code == 401
    assert requests.get(url + "/health", timeout=5).json() == {"status": "ready", "schemaVersion": 1, "taskCount": 50}
    headers = {"Authorization": f"Bearer {document['token']}", "Content-Type": "application/json"}
    bad = requests.post(url + "/claim", data=b"{not json", headers=headers, timeout=5)  # goes alone: its own 400
    assert bad.status_code == 400 and "not valid JSON" in bad.json()["error"]
    unknown = requests.post(url + "/nothing", json={}, headers=headers, timeout=5)
    assert unknown.status_code == 404
    step.send_signal(signal.SIGTERM)
    step.communicate(timeout=60)
    coordinator.stop()
    assert "intruder" not in json.loads(coordinator.end_record.read_text())["workers"]


def test_a_batch_on_the_coordinator_answers_each_request_as_if_it_came_alone(start_coordinator):
    coordinator = start_coordinator(make_tasks(6), "--workers", "2")
    s = requests.Session()
    s.headers["Authorization"] = f"Bearer {coordinator.token}"
    parts = [{"path": "/claim", "body": {"workerId": "worker-01", "max": 2}},
             {"path": "/claim", "body": {"workerId": "worker-02", "max": 2}},
             {"path": "/heartbeat", "body": {"workerId": "worker-01", "taskIds": "no"}},
             {"path": "/batch", "body": {"requests": []}},
             {"path": "/claim", "body": {"workerId": "bad id!"}}]
    answer = s.post(coordinator.url + "/batch", json={"requests": parts}, timeout=5)
    assert answer.status_code == 200
    claims, second, heartbeat, nested, bad = answer.json()["responses"]
    assert claims["status"] == 200 and claims["body"]["status"] == "task"
    assert [t["id"] for t in claims["body"]["tasks"]] == ["task-000000", "task-000001"]
    assert [t["id"] for t in second["body"]["tasks"]] == ["task-000002", "task-000003"]
    assert heartbeat == {"status": 400, "body": {"error": "taskIds must be a list of strings"}}
    assert nested["status"] == 400 and "not '/batch'" in nested["body"]["error"]
    assert bad == {"status": 400, "body": {"error": "workerId is missing or malformed"}}
    from make_tasks import expected_for

    results = [{k: r[k] for k in ("taskId", "output", "sha256")} for r in expected_for(make_tasks(6))["results"]]
    posted = s.post(coordinator.url + "/batch", json={"requests": [
        {"path": "/results", "body": {"workerId": "worker-01", "results": results[:2]}},
        {"path": "/claim", "body": {"workerId": "worker-02", "max": 2, "results": results[2:4]}},
        {"path": "/result", "body": {"workerId": "worker-02", **results[0]}}]}, timeout=5).json()["responses"]
    assert posted[0] == {"status": 200, "body": {"accepted": ["task-000000", "task-000001"], "rejected": []}}
    assert posted[1]["body"]["accepted"] == ["task-000002", "task-000003"]
    assert posted[2]["status"] == 409  # a duplicate, as alone
    for body in ({"requests": []}, {"requests": "x"}, {"nope": []}, [1]):
        assert s.post(coordinator.url + "/batch", json=body, timeout=5).status_code == 400
    assert requests.post(coordinator.url + "/batch", json={"requests": parts}, timeout=5).status_code == 401
    coordinator.stop()


# -- the policy, without processes -----------------------------------------------------------
def test_a_worker_process_fate():
    assert fate(0, stopping=False, restarts=0) is Fate.DONE
    assert fate(-9, stopping=False, restarts=0) is Fate.RESTART
    assert fate(-9, stopping=False, restarts=3) is Fate.KILLED
    assert fate(69, stopping=False, restarts=0) is Fate.FAILED
    assert fate(-15, stopping=True, restarts=0) is Fate.STOPPED
    assert fate(0, stopping=True, restarts=0) is Fate.DONE


def test_members_restart_then_record_and_fail_the_step_on_an_error():
    started, sent, lines = [], [], []

    def start(worker: str, restart: bool) -> int:
        started.append((worker, restart))
        return len(started)

    members = Members(["worker-01", "worker-02", "worker-03"], start, lambda pid, sig: sent.append((pid, sig)),
                      lines.append, max_restarts=1)
    members.start_all()
    assert started == [("worker-01", False), ("worker-02", False), ("worker-03", False)]
    again = members.ended(2, -9)  # worker-02 killed from outside
    assert again is not None and again.worker == "worker-02"
    members.launch(again)
    assert started[-1] == ("worker-02", True)
    assert members.ended(4, -9) is None and members.members["worker-02"].fate is Fate.KILLED
    assert members.ended(1, 0) is None and members.exit_code() == 0
    members.ended(3, 75)  # worker-03 exits with an error: the step fails and stops the rest
    assert members.failed.worker == "worker-03" and members.exit_code() == 75 and members.finished


def test_a_refused_request_backs_off_with_jitter_and_a_bound():
    assert backoff(1.0, 0, lambda: 0.0) == 0.5 and backoff(1.0, 0, lambda: 1.0) == 1.5
    assert backoff(1.0, 2, lambda: 0.5) == 4.0
    assert backoff(1.0, 10, lambda: 0.5) == MAX_BACKOFF
    spread = {round(backoff(1.0, 0), 3) for _ in range(50)}
    assert len(spread) > 10  # clients refused together do not come back together


@pytest.fixture(autouse=True)
def no_leftovers(tmp_path):
    yield
    left = pids_mentioning(str(tmp_path))
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert not left, f"processes left: {left}"
