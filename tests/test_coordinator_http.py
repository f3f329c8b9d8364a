"""The coordinator's HTTP contract, against a real process on an ephemeral loopback port."""

from __future__ import annotations

import hashlib
import json
import signal
import socket
import subprocess
import time

import pytest
import requests

from conftest import PYTHON, SCRIPTS, make_tasks


def digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def session(coordinator, token: str | None = None) -> requests.Session:
    s = requests.Session()
    s.headers["Authorization"] = f"Bearer {coordinator.token if token is None else token}"
    return s


def test_health_is_exactly_the_seed_contract_and_needs_no_token(start_coordinator):
    coordinator = start_coordinator(make_tasks(4))
    response = requests.get(coordinator.url + "/health", timeout=5)
    assert response.status_code == 200
    assert response.json() == {"status": "ready", "schemaVersion": 1, "taskCount": 4}


def test_seed_compose_healthcheck_line_passes_as_written(start_coordinator, tmp_path):
    coordinator = start_coordinator(make_tasks(4))
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "endpoint.json").write_text(coordinator.endpoint_file.read_text())
    line = ("import json, urllib.request as u; e = json.load(open('endpoint.json'))['endpoint']; "
            "assert json.load(u.urlopen(e + '/health', timeout=1)) == "
            "{'status': 'ready', 'schemaVersion': 1, 'taskCount': 4}")
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", line], cwd=tmp_path / "work", capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr


def test_endpoint_file_is_private_and_loopback(start_coordinator):
    coordinator = start_coordinator()
    assert coordinator.endpoint_file.stat().st_mode & 0o777 == 0o600
    assert coordinator.scratch.stat().st_mode & 0o777 == 0o700
    assert coordinator.url.startswith("http://127.0.0.1:")
    assert len(coordinator.token) >= 32


def test_everything_but_health_needs_the_token(start_coordinator):
    coordinator = start_coordinator()
    for path in ("/claim", "/result", "/results", "/heartbeat"):
        assert requests.post(coordinator.url + path, json={"workerId": "w"}, timeout=5).status_code == 401
        assert session(coordinator, "wrong").post(coordinator.url + path, json={"workerId": "w"}).status_code == 401
    assert requests.get(coordinator.url + "/status", timeout=5).status_code == 401
    assert session(coordinator).get(coordinator.url + "/status").status_code == 200


def test_claim_result_duplicate_unclaimed_and_done(start_coordinator):
    coordinator = start_coordinator(make_tasks(2))
    s = session(coordinator)
    first = s.post(coordinator.url + "/claim", json={"workerId": "worker-01"}).json()
    assert first["status"] == "task" and first["task"]["id"] == "task-000000"
    output = "m0m0"
    ok = s.post(coordinator.url + "/result", json={"workerId": "worker-01", "taskId": "task-000000",
                                                   "output": output, "sha256": digest(output)})
    assert ok.status_code == 201
    again = s.post(coordinator.url + "/result", json={"workerId": "worker-01", "taskId": "task-000000",
                                                      "output": output, "sha256": digest(output)})
    assert again.status_code == 409 and "duplicate" in again.json()["error"]
    unclaimed = s.post(coordinator.url + "/result", json={"workerId": "worker-01", "taskId": "task-000001",
                                                          "output": "m1m1", "sha256": digest("m1m1")})
    assert unclaimed.status_code == 409 and "unclaimed" in unclaimed.json()["error"]
    second = s.post(coordinator.url + "/claim", json={"workerId": "worker-01"}).json()
    assert second["task"]["id"] == "task-000001"
    assert s.post(coordinator.url + "/claim", json={"workerId": "worker-01"}).json()["status"] == "wait"
    s.post(coordinator.url + "/result", json={"workerId": "worker-01", "taskId": "task-000001",
                                              "output": "m1m1", "sha256": digest("m1m1")})
    assert s.post(coordinator.url + "/claim", json={"workerId": "worker-01"}).json() == {"status": "done"}
    assert (coordinator.tmp / "state" / "journal.jsonl").read_text().count('"kind":"result"') == 2


def test_bad_requests_get_4xx_and_the_server_stays_up(start_coordinator):
    coordinator = start_coordinator()
    s = session(coordinator)
    url = coordinator.url
    assert s.post(url + "/claim", data=b"{not json").status_code == 400
    assert s.post(url + "/claim", json=[1, 2]).status_code == 400
    assert s.post(url + "/claim", json={"workerId": ""}).status_code == 400
    assert s.post(url + "/claim", json={"workerId": "w", "max": 0}).status_code == 400
    for node in ("", "a b", "-x", "n" * 65, 7):  # the node a worker names (more than one node): a host name
        bad = s.post(url + "/claim", json={"workerId": "w", "node": node})
        assert bad.status_code == 400 and bad.json()["error"] == "node must be a host name", node
    assert s.post(url + "/result", json={"workerId": "w", "taskId": "task-000000", "output": 3,
                                         "sha256": "0" * 64}).status_code == 400
    claimed = s.post(url + "/claim", json={"workerId": "w"}).json()["task"]["id"]
    wrong = s.post(url + "/result", json={"workerId": "w", "taskId": claimed, "output": "x", "sha256": digest("y")})
    assert wrong.status_code == 400 and "digest" in wrong.json()["error"]
    # JSON's "\ud800" reads as a lone surrogate, which has no UTF-8 bytes to digest: a clear 400, never a 500
    lone = hashlib.sha256("x\ud800".encode("utf-8", "surrogatepass")).hexdigest()
    for path, body in (("/result", {"workerId": "w", "taskId": claimed, "output": "x\ud800", "sha256": lone}),
                       ("/claim", {"workerId": "w", "max": 2, "results": [
                           {"taskId": claimed, "output": "x\ud800", "sha256": lone}]})):
        answer = s.post(url + path, json=body)
        error = answer.json()["error"] if path == "/result" else answer.json()["rejected"][0]["reason"]
        assert answer.status_code == (400 if path == "/result" else 200) and "lone surrogate at character 1" in error
    assert s.get(url + "/nope").status_code == 404
    assert s.get(url + "/claim").status_code == 405
    assert s.post(url + "/claim", data=b"x" * (33 << 20)).status_code == 413
    assert requests.get(url + "/health", timeout=5).status_code == 200
    assert "internal error" not in coordinator.log_text()


def test_raw_socket_garbage_and_slow_clients_do_not_hurt(start_coordinator):
    coordinator = start_coordinator(make_tasks(1), "--connection-timeout", "0.5")
    port = int(coordinator.url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port)) as raw:
        raw.sendall(b"GARBAGE\r\n\r\n")
        assert raw.recv(1000).startswith(b"HTTP/1.1 400")
    with socket.create_connection(("127.0.0.1", port)) as raw:
        raw.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n" + b"X-Big: " + b"a" * 20000 + b"\r\n\r\n")
        assert raw.recv(1000).startswith(b"HTTP/1.1 431")
    idle = socket.create_connection(("127.0.0.1", port))
    time.sleep(1.0)
    assert idle.recv(10) == b""  # closed by the server after the connection timeout
    idle.close()
    assert requests.get(coordinator.url + "/health", timeout=5).json()["taskCount"] == 1


def test_keep_alive_round_trips_are_fast(start_coordinator):
    """Regression guard for the Nagle/delayed-ACK trap: 200 keep-alive requests well under 40 ms each."""
    coordinator = start_coordinator()
    s = requests.Session()
    started = time.monotonic()
    for _ in range(200):
        s.get(coordinator.url + "/health")
    assert (time.monotonic() - started) / 200 < 0.02


def test_sigterm_drains_and_writes_results_end_record(start_coordinator):
    coordinator = start_coordinator(make_tasks(2))
    s = session(coordinator)
    task = s.post(coordinator.url + "/claim", json={"workerId": "w", "max": 5}).json()["tasks"]
    for t in task:
        out = t["payload"]["message"] * t["payload"]["repeat"]
        s.post(coordinator.url + "/result", json={"workerId": "w", "taskId": t["id"], "output": out, "sha256": digest(out)})
    assert coordinator.stop(signal.SIGTERM) == 0
    end = json.loads(coordinator.end_record.read_text())
    assert end["status"] == "completed" and end["reason"] == "all tasks done" and end["resultCount"] == 2
    assert [r["taskId"] for r in json.loads(coordinator.results.read_text())["results"]] == ["task-000000", "task-000001"]
    assert not coordinator.endpoint_file.exists()
    assert coordinator.results.stat().st_mode & 0o777 == 0o600


def test_stopped_before_completion_exits_75_and_says_incomplete(start_coordinator):
    coordinator = start_coordinator(make_tasks(3))
    assert coordinator.stop(signal.SIGINT) == 75
    end = json.loads(coordinator.end_record.read_text())
    assert end["status"] == "incomplete" and end["resultCount"] == 0


def test_idle_timeout_bounds_the_coordinator(start_coordinator):
    coordinator = start_coordinator(make_tasks(1), "--idle-timeout", "0.5")
    assert coordinator.proc.wait(timeout=10) == 75
    assert json.loads(coordinator.end_record.read_text())["reason"] == "idle-timeout"


def test_lease_expiry_requeues_a_task(start_coordinator):
    coordinator = start_coordinator(make_tasks(1), "--lease-seconds", "0.3")
    s = session(coordinator)
    assert s.post(coordinator.url + "/claim", json={"workerId": "dead"}).json()["status"] == "task"
    assert s.post(coordinator.url + "/claim", json={"workerId": "alive"}).json()["status"] == "wait"
    time.sleep(0.8)
    again = s.post(coordinator.url + "/claim", json={"workerId": "alive"}).json()
    assert again["status"] == "task" and again["task"]["id"] == "task-000000"


def test_a_batch_claim_gets_at_most_a_fair_share(start_coordinator):
    coordinator = start_coordinator(make_tasks(10), "--workers", "2")
    s = session(coordinator)
    first = s.post(coordinator.url + "/claim", json={"workerId": "a", "max": 64}).json()["tasks"]
    # the other worker's half is held for it: a second claim of the first waits
    assert s.post(coordinator.url + "/claim", json={"workerId": "a", "max": 64}).json()["status"] == "wait"
    second = s.post(coordinator.url + "/claim", json={"workerId": "b", "max": 64}).json()["tasks"]
    assert len(first) == 5 and len(second) == 5  # ceil(10/2), then the share held for b
    assert not {t["id"] for t in first} & {t["id"] for t in second}


def test_a_share_held_for_a_worker_that_never_comes_lapses_after_one_lease(start_coordinator):
    coordinator = start_coordinator(make_tasks(4), "--workers", "2", "--lease-seconds", "0.5")
    s = session(coordinator)
    claim = {"workerId": "a", "max": 64}
    first = s.post(coordinator.url + "/claim", json=claim).json()["tasks"]
    outputs = [t["payload"]["message"] * t["payload"]["repeat"] for t in first]
    results = [{"taskId": t["id"], "output": o, "sha256": hashlib.sha256(o.encode()).hexdigest()}
               for t, o in zip(first, outputs, strict=True)]
    again = s.post(coordinator.url + "/claim", json={**claim, "results": results}).json()
    assert len(first) == 2 and again["accepted"] == [t["id"] for t in first] and again["status"] == "wait"
    time.sleep(0.6)
    later = s.post(coordinator.url + "/claim", json=claim).json()
    assert later["status"] == "task" and len(later["tasks"]) == 1  # an equal share of the 2 left


@pytest.mark.parametrize("loop", ["uvloop", "asyncio"])
def test_either_event_loop_serves_the_protocol_exactly_once(loop, start_coordinator, tmp_path):
    """uvloop when it can be imported (the venv and the images pin it), else the standard library's loop:
    both serve two workers (batch 1 and batch 3, sharing fsyncs) exactly once, refuse a stranger and a
    body over the bound, and drain on SIGTERM. The run's event names the loop that served it."""
    env = {}
    if loop == "asyncio":  # a Python without uvloop: the import fails, as there
        hidden = tmp_path / "no-uvloop"
        hidden.mkdir()
        (hidden / "uvloop.py").write_text("raise ImportError('uvloop is hidden from this test')\n")
        env["PYTHONPATH"] = str(hidden)
    coordinator = start_coordinator(make_tasks(40), "--workers", "2", "--max-body-bytes", "100000",
                                    env=env)
    gate = tmp_path / "gate.json"
    gate.write_text('{"status": "ready"}')
    workers = [subprocess.Popen([PYTHON, str(SCRIPTS / "worker.py"), "--worker-id", f"worker-0{i}", "--scratch",
                                 str(coordinator.scratch), "--gate-record", str(gate), "--batch", str(batch)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
               for i, batch in ((1, 1), (2, 3))]
    assert requests.post(coordinator.url + "/claim", json={"workerId": "stranger"}, timeout=5).status_code == 401
    too_big = session(coordinator).post(coordinator.url + "/results", data=b"x" * 100_001)
    assert too_big.status_code == 413
    for worker in workers:
        assert worker.wait(timeout=60) == 0, worker.stderr.read().decode()
    assert coordinator.stop(signal.SIGTERM) == 0
    results = json.loads(coordinator.results.read_text())["results"]
    assert sorted(r["taskId"] for r in results) == [f"task-{i:06d}" for i in range(40)]
    assert coordinator.journal.read_text().count('"kind":"result"') == 40  # each result journaled once
    end = json.loads(coordinator.end_record.read_text())
    assert end["status"] == "completed" and end["journalFsyncs"] <= 40
    events = [json.loads(line) for line in (coordinator.scratch / "events.jsonl").read_text().splitlines()]
    listening = next(e for e in events if e["event"] == "coordinator-listening")
    assert listening["eventLoop"] == loop
    assert f"event loop: {loop}" in coordinator.log_text()
