"""How a service is stopped when its stack is done: as Compose stops a container, one SIGTERM to its main process
alone, also in a Slurm job step (real Slurm, a real Apptainer image, real signals).

Slurm signals every process of a step (its process group; its cgroup with proctrack/cgroup). A signal to a
service's step reached its program twice (straight, and passed on by its supervisor or Apptainer's runtime) and
reached the program's own children too. uvicorn 0.21's ``--reload`` supervisor (testdrivenio/fastapi-celery's
``web``) hung on such a stop in 3 of 15 tries, measured, and was killed after its stop_grace_period: the run
failed. So launch.py asks the service's supervisor to stop through a file, and it passes one SIGTERM on.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import textwrap

import pytest
from test_slurm import TEST_RESOURCES, cluster_project, recorded_steps, the_stack_job  # noqa: F401 (a fixture)

from conftest import SCRIPTS
from real_parts import require_slurm
from workflow_helpers import snakemake

#: The service: a parent that listens (its readiness) and a child of its own, as uvicorn's reloader and its server.
#: Each notes every SIGTERM it gets; the parent, once it got one, waits 2 s (a second one would come meanwhile), ends
#: its child with SIGUSR1 and exits 0.
SERVICE = ("import os, signal, socket, sys, time\n"
           "server = socket.create_server(('127.0.0.1', int(os.environ['ALLOCSTACK_SIG_PORT'])))\n"
           "child = os.fork()\n"
           "if child == 0:\n"
           "    signal.signal(signal.SIGTERM, lambda *_: print('child: SIGTERM', file=sys.stderr, flush=True))\n"
           "    signal.signal(signal.SIGUSR1, lambda *_: os._exit(0))\n"
           "    while True: time.sleep(0.1)\n"
           "got = []\n"
           "def note(*_):\n"
           "    got.append(1); print(f'parent: SIGTERM {len(got)}', file=sys.stderr, flush=True)\n"
           "signal.signal(signal.SIGTERM, note)\n"
           "print('parent: serving', file=sys.stderr, flush=True)\n"
           "while not got: time.sleep(0.05)\n"
           "time.sleep(2)\n"
           "os.kill(child, signal.SIGUSR1); os.waitpid(child, 0)\n"
           "print(f'parent: stopped after {len(got)} SIGTERM', file=sys.stderr, flush=True)\n")


@pytest.mark.slurm
@pytest.mark.apptainer
@pytest.mark.parametrize("where", ["the stack's image", "its own image"])
def test_a_service_in_a_job_step_gets_one_sigterm_to_its_main_process_alone(cluster_project, where):  # noqa: F811
    project, image = cluster_project
    own = where == "its own image"
    (project / "config/stop.yaml").write_text(textwrap.dedent(f"""
        run: stop
        tasks: null
        expected: null
        image: {json.dumps(None if own else image)}
        workers: 1
        worker: {{mode: long-running, command: [python3, -c, "print('worker: done')"]}}
        services:
          sig: {{command: [python3, -c, {json.dumps(SERVICE)}], readiness: {{mode: tcp}}{f", image: {image}" if own else ""}}}
        verify: {{command: [python3, -c, "print('check: ok')"]}}
    """))
    done = snakemake(project, "--profile", "profiles/slurm", *TEST_RESOURCES, "runtime=10", "--configfile",
                     "config/stop.yaml", timeout=600)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    assert json.loads((project / "results/stop/result.json").read_text())["status"] == "success"
    log = (project / "logs/serve_service/stop/sig.log").read_text()
    assert "launch: sig: asked to stop (SIGTERM): its supervisor passes one SIGTERM to your program" in log, log
    said = log.splitlines()  # (the log quotes the program's text too)
    assert "parent: stopped after 1 SIGTERM" in said, log
    assert "child: SIGTERM" not in said, log  # the program's own child: not signalled by anyone but its parent
    assert "CANCELLED" not in log, log  # its step was never signalled: it ended by itself once the program had
    job = the_stack_job(output, project)
    assert recorded_steps(job, {"sig"}).get("sig") == "COMPLETED"
    services = json.loads((project / "results/stop/services.json").read_text())["services"]
    assert services["sig"]["status"] == "stopped" and services["sig"]["exitCode"] == 0, services


#: A component that never reads its stop request: it says when SIGTERM reaches it (through its step), and ends.
DEAF = ("import signal, sys, time\n"
        "def stop(*_):\n"
        "    print(f'deaf: SIGTERM through the step at {time.time():.3f}', file=sys.stderr, flush=True)\n"
        "    sys.exit(0)\n"
        "signal.signal(signal.SIGTERM, stop)\n"
        "print('deaf: up', file=sys.stderr, flush=True)\n"
        "while True: time.sleep(0.05)\n")


@pytest.mark.slurm
def test_a_step_that_does_not_end_on_its_stop_request_is_signalled_after_the_wait(tmp_path):
    """The fallback: launch.py asks, waits ``--stop-request`` seconds (a service's stop_grace_period + 10), then
    signals the step as before. A real sbatch job, a real job step, a real SIGTERM to launch.py."""
    require_slurm()
    component, log, asked = tmp_path / "deaf.py", tmp_path / "launch.log", tmp_path / "asked"
    component.write_text(DEAF)
    (tmp_path / "scratch").mkdir()
    launch = [sys.executable, str(SCRIPTS / "launch.py"), "--component=deaf", "--run=deaf",
              f"--scratch-root={tmp_path / 'scratch'}", "--cpus=1", "--job-steps", "--step-arg=--overlap",
              "--step-arg=--mem=0", "--stop-request=2", "--", str(component)]
    (tmp_path / "job.sh").write_text(textwrap.dedent(f"""\
        #!/bin/bash
        {shlex.join(launch)} > {log} 2>&1 &
        launcher=$!
        for _ in $(seq 600); do grep -q 'deaf: up' {log} && break; sleep 0.05; done
        date +%s.%N > {asked}
        kill -TERM $launcher
        wait $launcher
        echo "launch exit $?" >> {log}
    """))
    done = subprocess.run(["sbatch", "--wait", "--account=allocstack", "--partition=debug", "--mem=300", "--time=5",
                           f"--output={tmp_path / 'job.out'}", str(tmp_path / "job.sh")],
                          capture_output=True, text=True, timeout=300, check=False, cwd=tmp_path)
    text = log.read_text()
    assert done.returncode == 0, done.stdout + done.stderr + text
    assert "launch: deaf: asked to stop (SIGTERM)" in text and "launch exit 0" in text, text
    [signalled] = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith("deaf: SIGTERM through the step at ")]
    waited = signalled - float(asked.read_text())
    assert 2 <= waited < 12, (waited, text)  # its step was signalled once the 2 s had passed, not before
