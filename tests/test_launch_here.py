"""launch.py outside an allocation and without an image: a component no one watches from outside runs in
launch.py's own process (one interpreter, not two); a worker (``--tolerate-kill``) stays a supervised child.

Real processes and real signals; no Slurm (``$SLURM_JOB_ID`` is removed from the environment).
"""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

from allocstack.launch.lifeline import ENV as LIFELINE_ENV
from conftest import SCRIPTS

# Records what the component sees, then waits for SIGTERM (a service) or exits with the code in argv[2].
COMPONENT = """\
import json, os, pathlib, signal, sys, time
from allocstack.common.names import VOLUME_PREFIX
record = pathlib.Path(sys.argv[1])
def drained(signum, frame):
    record.with_suffix(".term").write_text(str(os.getpid()))
    sys.exit(7)
signal.signal(signal.SIGTERM, drained)
record.write_text(json.dumps({"pid": os.getpid(), "argv": sys.argv, "scratch": os.environ.get("ALLOCSTACK_SCRATCH"),
                              "launcher": os.environ.get("LIFELINE"), "name": __name__}))
if sys.argv[2] == "wait":
    time.sleep(60)
sys.exit(int(sys.argv[2]))
""".replace("LIFELINE", LIFELINE_ENV)


def launch(tmp_path: Path, *options: str, code: str) -> subprocess.Popen[str]:
    script = tmp_path / "component.py"
    script.write_text(COMPONENT)
    env = {name: value for name, value in os.environ.items() if not name.startswith("SLURM_")}
    env["PYTHONPATH"] = str(SCRIPTS)  # the component imports allocstack, as the real ones do
    return subprocess.Popen(
        [sys.executable, str(SCRIPTS / "launch.py"), "--component=probe", "--run=r", f"--scratch-root={tmp_path}",
         "--job-steps", *options, "--", str(script), str(tmp_path / "seen.json"), code],
        env=env, stderr=subprocess.PIPE, text=True,
    )


def seen(tmp_path: Path, timeout: float = 30) -> dict:
    record, deadline = tmp_path / "seen.json", time.monotonic() + timeout
    while not record.exists() or not record.read_text():
        assert time.monotonic() < deadline, "the component never started"
        time.sleep(0.02)
    return json.loads(record.read_text())


def test_an_unwatched_local_component_runs_in_launchs_own_process_with_its_scratch_and_exit_code(tmp_path):
    proc = launch(tmp_path, code="3")
    _, stderr = proc.communicate(timeout=60)
    view = seen(tmp_path)
    assert proc.returncode == 3, stderr  # the component's sys.exit(3) is the job's exit code
    assert view["pid"] == proc.pid  # no second interpreter
    assert view["name"] == "__main__" and view["argv"][0] == str(tmp_path / "component.py")
    assert view["launcher"] is None  # no launcher stays behind to watch
    scratch = Path(view["scratch"])
    assert scratch.is_dir() and stat.S_IMODE(scratch.stat().st_mode) == 0o700
    assert "launch: probe: in this process:" in stderr


def test_sigterm_to_the_job_reaches_the_component_itself(tmp_path):
    proc = launch(tmp_path, code="wait")
    view = seen(tmp_path)
    os.kill(proc.pid, signal.SIGTERM)  # what Snakemake sends a service's job when its consumers are done
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 7, stderr  # the component's own handler ran and chose the exit code
    assert (tmp_path / "seen.term").read_text() == str(view["pid"]) == str(proc.pid)


def test_a_worker_that_may_be_killed_from_outside_stays_a_supervised_child(tmp_path):
    record = tmp_path / "worker.json"
    proc = launch(tmp_path, f"--tolerate-kill={record}", code="wait")
    view = seen(tmp_path)
    assert view["pid"] != proc.pid and view["launcher"] == str(proc.pid)
    os.kill(view["pid"], signal.SIGKILL)  # kill -9 of the worker, not through launch.py
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 0, stderr  # tolerated, and recorded
    assert json.loads(record.read_text())["status"] == "killed"


# A process that fills 200 MB, then forks and execs Python (as Snakemake's shell execs launch.py, which runs
# the coordinator in its own process): what the exec'd program reports as its peak.
INHERITED_PEAK = """\
import os, sys
ballast = bytearray(200 * 1024 * 1024)
ballast[::4096] = b"x" * len(ballast[::4096])
child = os.fork()
if child == 0:
    os.execv(sys.executable, [sys.executable, "-c", "import resource, coordinator; "
             "print(coordinator.peak_rss_mb(), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)"])
os.waitpid(child, 0)
"""


def test_the_coordinators_peak_memory_is_its_own_not_that_of_the_process_it_was_forked_from():
    env = {**os.environ, "PYTHONPATH": str(SCRIPTS)}
    done = subprocess.run([sys.executable, "-c", INHERITED_PEAK], env=env, capture_output=True, text=True,
                          timeout=60, check=True)
    own, inherited = (float(value) for value in done.stdout.split())
    assert inherited > 200  # getrusage carries the forking process's peak over fork and exec
    assert own < 150  # the end record's peakRssMb: this interpreter and the coordinator's modules only


def test_sigterm_to_the_jobs_process_group_stops_a_worker_it_is_not_a_kill_from_outside(tmp_path):
    """A session or batch system ending sends SIGTERM to the job's whole process group: the worker (no handler of
    its own) dies of it, launch.py gets it too. That is the job being stopped (143, so Snakemake never takes the
    stack's outputs as complete), not a worker killed from outside (tolerated: exit 0 and a "killed" record).
    test_supervise covers the order that made this flaky: the child reaped before launch.py's handler ran."""
    record, script = tmp_path / "worker.json", tmp_path / "worker.py"
    script.write_text("import pathlib, sys, time\npathlib.Path(sys.argv[1]).write_text('{}')\ntime.sleep(60)\n")
    env = {name: value for name, value in os.environ.items() if not name.startswith("SLURM_")}
    proc = subprocess.Popen(
        [sys.executable, str(SCRIPTS / "launch.py"), "--component=worker-01", "--run=r", f"--scratch-root={tmp_path}",
         "--job-steps", f"--tolerate-kill={record}", "--", str(script), str(tmp_path / "seen.json")],
        env=env, stderr=subprocess.PIPE, text=True, start_new_session=True)
    seen(tmp_path)
    os.killpg(proc.pid, signal.SIGTERM)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM, stderr
    assert not record.exists() and "killed by SIGTERM from outside" not in stderr
