"""Your own service (config service.command) with its own readiness contract, and the gate's modes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

from conftest import SCRIPTS, make_tasks, run_script, write_tasks_and_expected
from workflow_helpers import snakemake

#: The HTTP server of the test services, for a program to put before its own lines: ``serve(host, port, token,
#: health, noted)`` answers ``GET /health`` with ``health`` to anyone, and ``GET /word/W`` with ``{"value": W
#: upper-cased}`` to the holder of ``token`` only (401 without it), calling ``noted(W)`` first.
WORD_SERVER = textwrap.dedent("""
    import json
    from http.server import BaseHTTPRequestHandler, HTTPServer
    def serve(host, port, token, health, noted=lambda word: None):
        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                if self.path == "/health":
                    return self.reply(200, health)
                if self.headers.get("Authorization") != "Bearer " + token:
                    return self.reply(401, {"error": "token"})
                word = self.path.rsplit("/", 1)[1]
                noted(word)
                return self.reply(200, {"value": word.upper()})
            def reply(self, code, body):
                data = json.dumps(body).encode()
                self.send_response(code); self.send_header("Content-Length", str(len(data))); self.end_headers()
                self.wfile.write(data)
            def log_message(self, *args):
                pass
        HTTPServer((host, port), Handler).serve_forever()
""")

#: Your own service "shouter": upper-cases a word for the token's holder, after a slow start.
SERVICE = WORD_SERVER + textwrap.dedent("""
    import os, time
    time.sleep(0.5)  # a slow start: the gate must wait for it
    TOKEN = os.environ["ALLOCSTACK_APP_TOKEN"]
    serve("127.0.0.1", int(os.environ["ALLOCSTACK_APP_PORT"]), TOKEN, {"status": "ok", "service": "shouter"})
""")

CLIENT = textwrap.dedent("""
    import json, os, sys, urllib.request
    word = json.load(sys.stdin)["message"]
    request = urllib.request.Request(os.environ["ALLOCSTACK_APP_ENDPOINT"] + "/word/" + word,
                                     headers={"Authorization": "Bearer " + os.environ["ALLOCSTACK_APP_TOKEN"]})
    sys.stdout.write(json.load(urllib.request.urlopen(request, timeout=5))["value"])
""")


def test_workers_use_your_own_service_after_its_own_gate(project):
    write_tasks_and_expected(project, "own", make_tasks(12, message="w"), lambda payload: payload["message"].upper())
    (project / "apps").mkdir()
    (project / "apps/service.py").write_text(SERVICE)
    (project / "apps/client.py").write_text(CLIENT)
    python = json.dumps(sys.executable)
    (project / "config/own.yaml").write_text(textwrap.dedent(f"""
        run: own
        tasks: inputs/own.json
        expected: expected/own.json
        service:
          command: [{python}, apps/service.py]
          readiness: {{mode: http, path: /health, expect: {{status: ok}}}}
        worker: {{command: [{python}, apps/client.py]}}
    """))
    dry = snakemake(project, "--dry-run", "--configfile", "config/own.yaml")
    assert "serve_service" in dry.stdout and "await_service" in dry.stdout  # the `service:` block is services.app
    done = snakemake(project, "--cores", "4", "--configfile", "config/own.yaml")
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    assert json.loads((project / "results/own/result.json").read_text())["status"] == "success"
    gate = json.loads((project / "results/own/services/app-readiness.json").read_text())
    events = [json.loads(line) for line in (project / "results/own/events.jsonl").read_text().splitlines()]
    started = next(e for e in events if e["event"] == "service-started")
    assert gate["status"] == "ready" and gate["endpoint"] == started["endpoint"]
    assert gate["passedAt"] >= started["t"] + 0.45  # the gate waited for the service's slow start
    assert all(gate["passedAt"] <= e["t"] for e in events if e["event"] == "worker-start")
    assert any(e["event"] == "service-end" for e in events)  # stopped when the workers were done
    ends = json.loads((project / "results/own/services.json").read_text())["services"]
    assert ends["app"]["status"] == "stopped", ends  # by allocstack, cleanly


def test_gate_modes_tcp_http_and_command(start_coordinator, tmp_path):
    coordinator = start_coordinator(make_tasks(2))
    ok = run_script("readiness.py", "--endpoint", coordinator.url, "--mode", "tcp", "--timeout", 2)
    assert ok.returncode == 0, ok.stderr
    http_ok = run_script("readiness.py", "--endpoint", coordinator.url, "--mode", "http", "--path", "/health",
                         "--expect-json", '{"status": "ready", "taskCount": 2}', "--timeout", 2)
    assert http_ok.returncode == 0, http_ok.stderr
    http_bad = run_script("readiness.py", "--endpoint", coordinator.url, "--mode", "http", "--path", "/health",
                          "--expect-json", '{"status": "green"}', "--timeout", 0.5)
    assert http_bad.returncode == 24 and "[readiness-timeout]" in http_bad.stderr and "green" in http_bad.stderr
    check = tmp_path / "check.py"
    check.write_text("import os, sys\nsys.exit(0 if os.environ['ALLOCSTACK_APP_ENDPOINT'].startswith('http://127.') else 1)\n")
    command_ok = run_script("readiness.py", "--endpoint", coordinator.url, "--mode", "command",
                            "--ready-command-json", json.dumps([sys.executable, str(check)]), "--timeout", 5)
    assert command_ok.returncode == 0, command_ok.stderr
    command_bad = run_script("readiness.py", "--endpoint", coordinator.url, "--mode", "command",
                             "--ready-command-json", json.dumps([sys.executable, "-c", "raise SystemExit(1)"]),
                             "--timeout", 0.5)
    assert command_bad.returncode == 24
    closed = run_script("readiness.py", "--endpoint", "http://127.0.0.1:9", "--mode", "tcp", "--timeout", 0.3)
    assert closed.returncode == 24
    usage = run_script("readiness.py", "--endpoint", coordinator.url, "--mode", "command", "--timeout", 1)
    assert usage.returncode == 64


def test_sigterm_to_the_jobs_process_group_stops_your_service_cleanly(tmp_path):
    """Snakemake stops a service job (and Slurm signals a step) with SIGTERM to the whole process group: your
    service (here without a handler) may die of it before app_service.py handles its own copy. Both orders are
    the stack being stopped: "stopped", exit 0, never "exited" (verification would fail a good run with
    service-exit). test_supervise covers the order that made this flaky, deterministically."""
    service = tmp_path / "service.py"
    service.write_text("import time\ntime.sleep(60)\n")
    proc = subprocess.Popen([sys.executable, str(SCRIPTS / "app_service.py"), "--name=db", "--command-json",
                             json.dumps([sys.executable, str(service)]), "--scratch", str(tmp_path / "scratch")],
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    published = tmp_path / "scratch" / "services" / "db.json"
    deadline = time.monotonic() + 30
    while not published.exists():
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGTERM)
    _, stderr = proc.communicate(timeout=60)
    end = json.loads((tmp_path / "scratch" / "services" / "db.end.json").read_text())
    assert proc.returncode == 0 and end["status"] == "stopped", (end, stderr)
    assert end["how"] == "killed by SIGTERM" and "stopped cleanly" in stderr


def test_a_worker_waits_for_a_service_no_gate_covers_to_start_then_gets_its_variables(tmp_path):
    """A service ready once started that nothing depends on has no gate: a worker (here a long-running one,
    replica.py, as the plan starts it with --started) waits until it has published its endpoint, then starts its
    program with the service's variables. Without the wait it read the endpoint file at once and failed when the
    service's supervisor had not written it yet (a race the gates did not cover)."""
    from allocstack.common.endpoint import service_endpoint_path, write_endpoint

    scratch, seen = tmp_path / "scratch", tmp_path / "seen.txt"
    scratch.mkdir(mode=0o700)
    program = [sys.executable, "-c", f"import os; open({str(seen)!r}, 'w').write(os.environ['ALLOCSTACK_SIDECAR_ENDPOINT'])"]
    worker = subprocess.Popen(
        [sys.executable, str(SCRIPTS / "replica.py"), "--worker-id", "worker-01", "--index", "0", "--workers", "1",
         "--scratch", str(scratch), "--uses", "sidecar", "--started", "sidecar", "--gate-timeout", "60",
         "--command-json", json.dumps(program)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path)
    try:
        time.sleep(1.5)
        assert worker.poll() is None and not seen.exists(), "the worker started before the service did"
        published = service_endpoint_path(scratch, "sidecar")
        published.parent.mkdir(mode=0o700, exist_ok=True)  # as app_service.py makes it
        write_endpoint(published, "http://127.0.0.1:5999", "t0ken", "")
        _, stderr = worker.communicate(timeout=60)
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
    assert worker.returncode == 0, stderr
    assert seen.read_text() == "http://127.0.0.1:5999"
    assert "waiting for service sidecar to start" in stderr
