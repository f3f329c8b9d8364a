"""Watching a run: the status command and the live page, loaded in real headless Chromium."""

from __future__ import annotations

import json
import re
import shutil
import subprocess

import pytest
import requests

from allocstack.common.jsonio import sha256_text
from conftest import make_tasks, run_script
from real_parts import unavailable

TASKS, DONE = 10_000, 4_000


@pytest.fixture
def half_done(start_coordinator):
    """A 10,000-task stack with 4,000 results in, from two workers on two nodes (worker-02 on
    node-b did the first 500, worker-01 on node-a the rest): a stable state to compare every view against."""
    coordinator = start_coordinator(make_tasks(TASKS))
    session = requests.Session()
    session.headers["Authorization"] = f"Bearer {coordinator.token}"
    while True:
        status = session.get(coordinator.url + "/status").json()
        if status["done"] >= DONE:
            break
        worker, node = ("worker-02", "node-b") if status["done"] == 0 else ("worker-01", "node-a")
        tasks = session.post(coordinator.url + "/claim", json={"workerId": worker, "max": 500, "node": node}).json()["tasks"]
        results = [{"taskId": t["id"], "output": o, "sha256": sha256_text(o)}
                   for t in tasks for o in [t["payload"]["message"] * t["payload"]["repeat"]]]
        session.post(coordinator.url + "/results", json={"workerId": worker, "results": results})
    return coordinator


def test_status_command_summarises_the_run(half_done):
    done = run_script("status.py", "--endpoint-file", half_done.endpoint_file)
    assert done.returncode == 0, done.stderr
    assert "4,000 done" in done.stdout and "6,000 pending" in done.stdout and "of 10,000" in done.stdout
    assert re.search(r"worker-01\s+3,500\s+3,500\s+\S+ s ago\s+on node-a", done.stdout)
    assert re.search(r"worker-02\s+500\s+500\s+\S+ s ago\s+on node-b", done.stdout)
    assert re.search(r"node-a\s+1\s+3,500 .*\(worker-01\)", done.stdout)  # workers per node
    assert re.search(r"node-b\s+1\s+500 .*\(worker-02\)", done.stdout)
    raw = run_script("status.py", "--endpoint-file", half_done.endpoint_file, "--json")
    assert '"done": 4000' in raw.stdout
    assert json.loads(raw.stdout)["nodes"]["node-a"]["workers"] == ["worker-01"]
    missing = run_script("status.py", "--run", "nothing-here", "--scratch-root", half_done.tmp / "none",
                         "--results-dir", half_done.tmp / "results")
    assert missing.returncode == 69 and "run 'nothing-here': no stack is serving on this node" in missing.stderr


def test_the_stacks_restarts_and_exposed_sockets_are_shown_while_it_runs(half_done, tmp_path):
    """A service restarted by its policy and a socket beyond loopback, appended to their components' event logs in
    the run's scratch as app_service.py appends them, are in /status, the status command and the live page."""
    from allocstack.common.events import append_event

    logs = half_done.scratch / "events"
    logs.mkdir(exist_ok=True)
    append_event(logs / "serve_kv.jsonl", "service-restart", service="kv", attempt=1, exitCode=-9,
                 how="was killed by SIGKILL")
    append_event(logs / "serve_kv.jsonl", "listening-exposed", kind="service", name="kv", proto="tcp",
                 address="0.0.0.0", port=6379,  # noqa: S104  (a record, nothing binds)
                 shown="0.0.0.0:6379", listenerPid=1)
    append_event(logs / "serve_kv.jsonl", "service-started", service="kv")  # not notable: not shown
    done = run_script("status.py", "--endpoint-file", half_done.endpoint_file)
    assert done.returncode == 0, done.stderr
    assert re.search(r"s ago  service kv restarted by its restart policy \(attempt 1\): it was killed by SIGKILL",
                     done.stdout), done.stdout
    assert "warning: service kv listens on 0.0.0.0:6379 (tcp)" in done.stdout
    assert "service-started" not in done.stdout
    browser = chromium()
    url = run_script("status.py", "--endpoint-file", half_done.endpoint_file, "--url").stdout.splitlines()[0]
    dom = headless(browser, tmp_path, "--dump-dom", url)
    assert dom.returncode == 0, dom.stderr[-2000:]
    shown = re.findall(r'class="event" data-event="([^"]+)">([^<]*)<', dom.stdout)
    assert [event for event, _ in shown] == ["service-restart", "listening-exposed"], dom.stdout[-3000:]
    assert "service kv restarted by its restart policy (attempt 1)" in shown[0][1]


def test_the_page_needs_the_view_token_which_cannot_claim(half_done):
    url = run_script("status.py", "--endpoint-file", half_done.endpoint_file, "--url").stdout.splitlines()[0]
    base, view = url.split("/ui?token=")
    assert requests.get(url, timeout=5).status_code == 200
    assert requests.get(base + "/ui", timeout=5).status_code == 401
    assert requests.get(base + "/ui?token=wrong", timeout=5).status_code == 401
    assert requests.get(base + f"/status?token={view}", timeout=5).json()["done"] == DONE
    assert requests.post(base + f"/claim?token={view}", json={"workerId": "x"}, timeout=5).status_code == 401


def chromium() -> str:
    for name in ("chromium", "chromium-browser"):
        if shutil.which(name):
            return shutil.which(name)
    unavailable("no chromium (as root: apt-get install chromium; tests/cluster/prepare.sh does it)")


def headless(browser: str, tmp_path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         f"--user-data-dir={tmp_path / 'chromium-profile'}", "--virtual-time-budget=5000", *args],
        capture_output=True, text=True, timeout=120, check=False)


@pytest.mark.browser
def test_page_in_headless_chromium_shows_the_coordinators_numbers(half_done, tmp_path):
    browser = chromium()
    url = run_script("status.py", "--endpoint-file", half_done.endpoint_file, "--url").stdout.splitlines()[0]
    dom = headless(browser, tmp_path, "--dump-dom", url)
    assert dom.returncode == 0, dom.stderr[-2000:]
    shown = dict(re.findall(r'id="(done|total|pending|leased|failed|expired|state)">([^<]*)<', dom.stdout))
    assert shown == {"state": "running", "done": "4,000", "total": "10,000", "pending": "6,000", "leased": "0",
                     "failed": "0", "expired": "0"}, shown
    assert 'data-worker="worker-01" data-node="node-a" data-completed="3500"' in dom.stdout
    # One group per node, its header before its workers' lanes.
    groups = re.findall(r'class="node" data-node="([^"]+)" data-workers="(\d+)" data-completed="(\d+)"', dom.stdout)
    assert groups == [("node-a", "1", "3500"), ("node-b", "1", "500")], groups
    assert dom.stdout.index('data-node="node-b" data-workers') < dom.stdout.index('data-worker="worker-02"')
    assert "<polyline" in dom.stdout or "<svg" in dom.stdout
    shot = tmp_path / "status-page.png"
    picture = headless(browser, tmp_path, f"--screenshot={shot}", "--window-size=1100,760", url)
    assert picture.returncode == 0 and shot.stat().st_size > 10_000, picture.stderr[-2000:]
