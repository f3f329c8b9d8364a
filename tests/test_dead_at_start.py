"""A program that dies at start is seen at once: its gate ends within 2 s of its end, with its last line;
the end-of-run verdict quotes the first failed component's last line (and a hint for known runtime failures).

Real launchers, gates and programs: without an image (a program that crashes), in Apptainer (the program
killed at start, as the OOM killer does) and in Charliecloud (a SquashFS image on a node whose /dev/fuse is
not usable: ch-run gives up after its retries, the program never starts). The same for a service of your own
(app_service.py) and its gate, in whole runs without an image and in Apptainer.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from allocstack.common import names
from allocstack.common.attempts import COMMAND_ENV
from allocstack.common.scratch import run_scratch
from allocstack.coordinator.endrecord import launcher_saw_end
from conftest import SCRIPTS, pids_mentioning, write_json
from real_parts import require_apptainer, require_charliecloud, require_charliecloud_squashfs
from workflow_helpers import copy_project, snakemake

#: What the issue asks of the gate: it ends within this many seconds of the end of what it gates.
GATE_BOUND = 2.0
#: A gate's own deadline, far beyond: only the program's end can end it this early.
GATE_DEADLINE = 120

# A coordinator that dies at start with a line of its own (no allocstack line: a crash).
CRASH = "import sys, time\ntime.sleep(1.0)\nprint('boom: the program died at start', file=sys.stderr)\nsys.exit(3)\n"
# A coordinator that starts and waits (to be killed from outside, as the OOM killer does).
WAIT = "import sys, time\nprint('started', flush=True)\ntime.sleep(120)\n"


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "ALLOCSTACK_"))}
    return {**env, COMMAND_ENV: "testhost:1:1", "USER": env.get("USER") or "root", **extra}


def start(tmp_path: Path, component: str, script: list[str], *options: str, wrap: list[str] | None = None,
          stdout=subprocess.DEVNULL) -> subprocess.Popen:
    """launch.py for ``component`` of run ``r`` (scratch under tmp_path/root), its log in tmp_path/<component>.log."""
    log = open(tmp_path / f"{component}.log", "w")  # noqa: SIM115  (the launcher's stderr, as a rule's log)
    argv = [sys.executable, str(SCRIPTS / "launch.py"), f"--component={component}", "--run=r",
            f"--scratch-root={tmp_path / 'root'}", *options, "--", *script]
    return subprocess.Popen([*(wrap or []), *argv], cwd=tmp_path, stdout=stdout, stderr=log, env=clean_env())


def gate(tmp_path: Path, *image: str) -> subprocess.Popen:
    """The coordinator's readiness gate, as the workflow starts it (its endpoint in scratch, a long deadline)."""
    return start(tmp_path, "readiness", [str(SCRIPTS / "readiness.py"), "--task-count", "1", "--timeout",
                                         str(GATE_DEADLINE)], *image)


def program(tmp_path: Path, code: str) -> str:
    path = tmp_path / "program.py"
    path.write_text(code)
    return str(path)


def assert_gate_ended_with_the_program(tmp_path: Path, waiting: subprocess.Popen, line: str) -> float:
    """The gate ended within GATE_BOUND s of the program's end (as its launcher noted it), with that line."""
    waiting.wait(timeout=GATE_DEADLINE)
    gate_end = time.time()
    scratch = run_scratch(tmp_path / "root", "r", tmp_path)
    note = launcher_saw_end(scratch, "coordinator", clean_env())
    assert note is not None, (tmp_path / "coordinator.log").read_text()
    lag = gate_end - note["endedAt"]
    log = (tmp_path / "readiness.log").read_text()
    [error] = [text for text in log.splitlines() if text.startswith("allocstack: error [")]
    assert error.startswith("allocstack: error [coordinator-exit]: the coordinator ended before it was ready (exit ")
    assert line in error, log
    assert waiting.returncode == 70
    assert lag <= GATE_BOUND, f"the gate ended {lag:.2f} s after the program"
    print(f"gate ended {lag:.2f} s after the program's end")
    return lag


def test_no_image_the_gate_ends_with_a_crashed_programs_last_line(tmp_path):
    waiting = gate(tmp_path)
    coordinator = start(tmp_path, "coordinator", [program(tmp_path, CRASH)])
    assert coordinator.wait(timeout=60) == 3
    assert_gate_ended_with_the_program(tmp_path, waiting, "(exit 3): boom: the program died at start")
    log = (tmp_path / "coordinator.log").read_text().splitlines()
    assert log[-2:] == ["boom: the program died at start", "launch: coordinator exited 3"]


@pytest.mark.apptainer
def test_apptainer_the_gate_ends_when_the_program_is_killed_at_start(tmp_path):
    image = require_apptainer()
    (tmp_path / "bound").mkdir()
    options = [f"--image={image}", "--runtime-arg=--cleanenv", "--runtime-arg=--contain", f"--bind={tmp_path / 'bound'}"]
    waiting = gate(tmp_path, *options)
    script = program(tmp_path, WAIT)
    coordinator = start(tmp_path, "coordinator", [script], *options, stdout=subprocess.PIPE)
    assert coordinator.stdout.readline().strip() == b"started"
    [inside] = [pid for pid in pids_mentioning(script) if Path(f"/proc/{pid}/exe").resolve().name.startswith("python")
                and pid != coordinator.pid]
    os.kill(inside, signal.SIGKILL)  # as the OOM killer would, the launcher is not told
    assert coordinator.wait(timeout=60) == 128 + signal.SIGKILL
    assert_gate_ended_with_the_program(tmp_path, waiting, f"(exit {128 + signal.SIGKILL}")


def broken_fuse() -> list[str]:
    """Run a command where /dev/fuse is not usable (a node that does not allow FUSE): its own mount namespace."""
    if os.geteuid() != 0:
        pytest.skip("a mount namespace with an unusable /dev/fuse needs root (CI runs the suite as root)")
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c",
            'mount --bind /dev/null /dev/fuse && exec "$@"', "sh"]


@pytest.mark.charliecloud
def test_charliecloud_the_gate_ends_when_ch_run_cannot_mount_the_image(tmp_path):
    squashfs, directory = require_charliecloud_squashfs(), require_charliecloud()
    runtime = ["--runtime=charliecloud"]
    waiting = gate(tmp_path, f"--image={directory}", *runtime)  # this gate's node mounts nothing: a directory image
    coordinator = start(tmp_path, "coordinator", [program(tmp_path, WAIT)], f"--image={squashfs}", *runtime,
                        wrap=broken_fuse())
    assert coordinator.wait(timeout=120) != 0
    assert_gate_ended_with_the_program(tmp_path, waiting, "error: too many FUSE errors; giving up")


@pytest.mark.charliecloud
def test_a_run_whose_runtime_fails_says_why_in_its_verdict_with_a_hint(tmp_path):
    """Every component's ch-run gives up (no allocstack line anywhere): the verdict quotes the first failed
    component's last line, ch-run's, and what to do about it."""
    squashfs = require_charliecloud_squashfs()
    project = copy_project(tmp_path / "project")
    wrapper = broken_fuse()
    done = subprocess.run([*wrapper, "timeout", "-k", "10", "300", str(Path(sys.executable).parent / "snakemake"),
                           "--cores", "4", "--config", f"image={squashfs}", "runtime=charliecloud"],
                          cwd=project, capture_output=True, text=True, timeout=330, check=False,
                          env={**os.environ, "TMPDIR": str(project / "tmp"), "USER": os.environ.get("USER") or "root"})
    output = done.stdout + done.stderr
    assert done.returncode != 0
    verdict = output[output.index("allocstack: run baseline FAILED"):].splitlines()
    assert "exited 1: ch-run[" in verdict[1] and "error: too many FUSE errors; giving up" in verdict[1], verdict
    assert verdict[2].startswith("      (in logs/")
    assert verdict[3].startswith("      hint: ch-run could not use /dev/fuse on this node"), verdict
    assert "see the failed job's log above" not in output


def test_a_dead_at_start_coordinator_in_a_workflow_run_ends_its_gate_at_once(project):
    """The whole workflow, no image: the coordinator crashes at start (its script replaced by one that dies,
    as a broken installation would); the run fails in seconds, not at the gate's deadline (30 s)."""
    (project / "workflow/scripts/coordinator.py").write_text(
        "import sys\nprint('Fatal Python error: init_fs_encoding: failed to get the Python codec', file=sys.stderr)\n"
        "sys.exit(1)\n")
    write_json(project / "config/long-gate.json", {"readiness": {"timeout": GATE_DEADLINE}})
    started = time.monotonic()
    done = snakemake(project, "--cores", "4", "--configfile", "config/long-gate.json")
    took = time.monotonic() - started
    output = done.stdout + done.stderr
    assert done.returncode != 0
    gate_log = (project / "logs/await_readiness/baseline.log").read_text()
    assert ("allocstack: error [coordinator-exit]: the coordinator ended before it was ready (exit 1): Fatal Python "
            "error: init_fs_encoding: failed to get the Python codec") in gate_log
    assert "allocstack: error [coordinator-exit]: the coordinator ended before it was ready" in output
    assert took < GATE_DEADLINE, f"{took:.1f} s: the gate waited for its deadline"
    print(f"dead-at-start coordinator, whole run: {took:.1f} s (gate deadline {GATE_DEADLINE} s)")
    events = [json.loads(line) for line in next((project / "tmp").glob("allocstack-*/baseline.*/events.jsonl"))
              .read_text().splitlines()]
    assert [e["event"] for e in events] == ["gate-failed"]


def test_what_a_failed_program_last_said_is_its_error_line_else_its_last_own_line():
    from allocstack.status.summary import hint, last_line

    traceback_tail = ("launch: coordinator: apptainer exec ...\nTraceback (most recent call last):\n  File \"x.py\"\n"
                      "OSError: [Errno 30] Read-only file system: '/local/job123/allocstack-0'\n")
    assert last_line(traceback_tail) == "OSError: [Errno 30] Read-only file system: '/local/job123/allocstack-0'"
    assert hint(last_line(traceback_tail)).startswith("a directory the run writes is read-only there")
    said = "starting\nallocstack: error [input]: tasks x.json: bad\nlaunch: coordinator exited 65\n"
    assert last_line(said) == "allocstack: error [input]: tasks x.json: bad"
    assert last_line("launch: coordinator: in this process: ...\n") is None
    in_a_step = ("Fatal Python error: init_fs_encoding\nsrun: error: vm: task 0: Exited with exit code 1\n"
                 "srun: launch/slurm: _step_signal: Terminating StepId=97.4\n")
    assert last_line(in_a_step) == "Fatal Python error: init_fs_encoding"
    assert last_line("srun: error: Unable to create step for job 97: Memory required by task is not available\n") \
        == "srun: error: Unable to create step for job 97: Memory required by task is not available"
    assert hint("FATAL: all fine") is None


DEAD = ("import sys\nprint('Fatal Python error: init_fs_encoding: failed to get the Python codec', file=sys.stderr)\n"
        "sys.exit(1)\n")


@pytest.mark.slurm
@pytest.mark.apptainer
def test_under_slurm_a_dead_at_start_coordinator_ends_its_gate_within_2_s(tmp_path):
    """The Slurm profile, each component a job step in the image: the coordinator's step dies at start. Its
    gate (another step) ends within 2 s of it, quoting its line, not Slurm's about the step."""
    from test_attempts import elapsed_seconds, submitted

    from real_parts import require_slurm

    require_slurm()
    image = require_apptainer()
    project = copy_project(tmp_path / "project")
    (project / "workflow/scripts/coordinator.py").write_text(DEAD)
    write_json(project / "config/long-gate.json", {"readiness": {"timeout": GATE_DEADLINE}})
    started = time.monotonic()
    done = snakemake(project, "--profile", "profiles/slurm", "--retries", "0", "--configfile", "config/long-gate.json",
                     "--default-resources", "slurm_account=allocstack", "slurm_partition=debug", "mem_mb=300",
                     "runtime=10", "--config", f"image={image}", timeout=600)
    took = time.monotonic() - started
    output = done.stdout + done.stderr
    assert done.returncode != 0
    gate_log = (project / "logs/await_readiness/baseline.log").read_text()
    assert ("allocstack: error [coordinator-exit]: the coordinator ended before it was ready (exit 1): Fatal Python "
            "error: init_fs_encoding: failed to get the Python codec") in gate_log, gate_log[-2000:]
    assert "Fatal Python error" in output.split("allocstack: run baseline FAILED", 1)[1]
    [scratch] = (project / "tmp").glob("allocstack-*/baseline.*.*")  # keyed by the Slurm job too
    note = json.loads((scratch / "ended/coordinator.json").read_text())
    [failed] = [json.loads(line) for line in (scratch / "events.jsonl").read_text().splitlines()
                if json.loads(line)["event"] == "gate-failed"]
    lag = failed["t"] - note["endedAt"]
    assert lag <= GATE_BOUND, f"the gate ended {lag:.2f} s after the coordinator"
    [job] = submitted(output)  # (its time pending in the queue is the rest of the whole run's)
    print(f"under Slurm: the gate ended {lag:.2f} s after the coordinator's step; the whole run failed in {took:.1f} s, "
          f"its job ran {elapsed_seconds(job)} s (sacct)")


# A service of yours that dies at start, once its gate waits for it (its gate's log is there, and a second more,
# bounded): it says when it exits (stdout: its log), then its last line (stderr), and exits 1. Run by ``python3``,
# which is the image's in one; its working directory is where snakemake runs, in the image too.
SERVICE_DIES = """import os, sys, time
waiting = time.monotonic() + 60
while not os.path.exists(sys.argv[1]) and time.monotonic() < waiting:
    time.sleep(0.05)
time.sleep(1.0)
print(f"db: exiting at {time.time():.3f}", flush=True)
print("db: FATAL: could not open the data directory /var/lib/db: Permission denied", file=sys.stderr, flush=True)
sys.exit(1)
"""
LAST_WORDS = "db: FATAL: could not open the data directory /var/lib/db: Permission denied"


@pytest.mark.parametrize("runtime", ["none", pytest.param("apptainer", marks=pytest.mark.apptainer)])
def test_a_service_of_yours_that_dies_at_start_ends_its_gate_within_2_s(project, runtime):
    """Your own service (app_service.py) dies at start while its gate (readiness.py, a tcp gate with a 120 s
    deadline) waits: the gate ends within 2 s of the program's exit, and the verdict names the service and its
    last line of stderr. Without an image, and in Apptainer (the service in the image, its supervisor beside it)."""
    from test_compose_stacks import run_own_stack

    run = "dead-service"
    gate_log = f"logs/await_service/{run}/db.log"
    args = ["--sdm", "apptainer", "--config", f"image={require_apptainer()}"] if runtime == "apptainer" else []
    started = time.monotonic()
    done = run_own_stack(project, run, 1, "pass", "db", SERVICE_DIES.replace("sys.argv[1]", repr(gate_log)), *args,
                         python="python3", readiness={"timeout": GATE_DEADLINE})
    took = time.monotonic() - started
    output = done.stdout + done.stderr
    assert done.returncode != 0
    # (how it ended as its supervisor recorded it, or as its launcher noted it: whichever the gate saw first)
    said = re.compile(r"allocstack: error \[service-exit\]: service db ended before it was ready(: exited 1| \(exit "
                      rf"1\)): {re.escape(LAST_WORDS)}$")
    gate_lines = (project / gate_log).read_text().splitlines()
    lines = [text for text in gate_lines if said.match(text)]
    assert len(lines) == 1, ("\n".join(gate_lines[-20:]), output[-3000:])
    [line] = lines
    verdict = output.split(f"allocstack: run {run} FAILED", 1)[1]
    assert f"  {line}\n" in verdict, verdict[:3000]
    errors = [text.strip() for text in verdict.splitlines() if text.strip().startswith("allocstack: error [")]
    assert all(error.startswith("allocstack: error [service-exit]: service db ended ") and LAST_WORDS in error
               for error in errors), errors  # (its supervisor's record says so too)
    service_log = (project / f"logs/serve_service/{run}/db.log").read_text()
    exited_at = float(re.search(r"db: exiting at (\d+\.\d+)", service_log)[1])
    [scratch] = (project / "tmp").glob(f"allocstack-*/{run}.*")
    [failed] = [event for event in map(json.loads, (scratch / names.component_events("db")).read_text().splitlines())
                if event["event"] == "gate-failed"]
    assert failed["service"] == "db"
    lag = failed["t"] - exited_at
    assert 0 <= lag <= GATE_BOUND, f"the gate ended {lag:.2f} s after the service's program"
    if runtime == "apptainer":
        assert "db: in its image: apptainer exec" in service_log
    print(f"{runtime}: service db's gate ended {lag:.2f} s after its program; the whole run failed in {took:.1f} s")
