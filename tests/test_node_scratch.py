"""The run's scratch on a step's own node (node_scratch.py, allocstack/launch/nodescratch.py), without a cluster.

Real processes: the wrapper really execs its command, the task epilog really removes what the
node's last step leaves. tests/test_multinode.py runs it on the test cluster's nodes, whose
scratch is node-local.
"""

from __future__ import annotations

import fcntl
import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import launch
import pytest

from allocstack.common import network
from allocstack.launch.nodescratch import FIRST_NODE, STEP_ENV, enter, leave, lock_path, locked, step_mount_tree
from conftest import SCRIPTS

WRAPPER = SCRIPTS / "node_scratch.py"
# What the wrapped command reports: its PID, whether scratch and a --dir exist, and its environment.
REPORT = ("import json, os, sys; print(json.dumps({'pid': os.getpid(), 'dirs': [os.path.isdir(p) for p in sys.argv[1:]],"
          " 'step': os.environ.get('ALLOCSTACK_STEP'), 'scratch': os.environ.get('ALLOCSTACK_SCRATCH')}))")


def step_env(scratch: Path, component: str) -> dict[str, str]:
    return {**os.environ, "ALLOCSTACK_SCRATCH": str(scratch), STEP_ENV: component}


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_the_node_keeps_the_runs_scratch_while_a_step_uses_it_and_the_last_one_removes_it(tmp_path):
    scratch = tmp_path / "root" / "allocstack-0" / "run"
    tree = step_mount_tree(scratch, "worker-03")
    enter(scratch, "worker-03", [tree, tree / "tmp" / "project"])
    enter(scratch, "worker-04", [])
    assert mode(scratch) == mode(scratch.parent) == mode(tree / "tmp" / "project") == 0o700
    assert not leave(scratch, "worker-03")  # worker-04 still runs here
    assert scratch.is_dir() and not tree.exists()  # the leaver's own mount-point tree goes at once
    assert leave(scratch, "worker-04")
    assert not scratch.exists() and not lock_path(scratch).exists()
    assert scratch.parent.is_dir()  # the user's directory stays, as on the first node
    assert not leave(scratch, "worker-04")  # twice (a retried epilog) or never entered: nothing to do


def test_scratch_the_nodes_share_is_left_to_the_first_node(tmp_path):
    """A ``scratch`` on the shared filesystem: the first node's launch.py marked it before starting the
    step, so the step's node neither counts itself in it nor removes it (collection does, at the end)."""
    scratch = tmp_path / "allocstack-0" / "run"
    scratch.mkdir(parents=True, mode=0o700)
    (scratch / FIRST_NODE).touch()
    (scratch / "endpoint.json").write_text("{}")  # the coordinator's, in use
    tree = step_mount_tree(scratch, "worker-03")
    enter(scratch, "worker-03", [tree / "tmp"])
    assert (tree / "tmp").is_dir() and not (scratch / ".steps").exists()
    assert not leave(scratch, "worker-03")
    assert (scratch / "endpoint.json").exists() and not tree.exists() and not lock_path(scratch).exists()


def test_a_scratch_someone_else_could_read_or_a_symlink_is_refused_and_the_command_never_runs(tmp_path):
    target = tmp_path / "elsewhere"
    target.mkdir()
    (tmp_path / "root").mkdir()
    os.symlink(target, tmp_path / "root" / "allocstack-0")
    ran = tmp_path / "ran"
    done = subprocess.run([sys.executable, str(WRAPPER), "--", "touch", str(ran)], capture_output=True, text=True,
                          env=step_env(tmp_path / "root" / "allocstack-0" / "run", "worker-03"), timeout=60, check=False)
    assert done.returncode == 69 and not ran.exists()
    assert done.stderr.strip().splitlines() == [
        f"allocstack: error [scratch]: scratch path {tmp_path / 'root' / 'allocstack-0'} is not a plain directory"]


def test_the_wrapper_makes_scratch_then_becomes_the_command_and_the_epilog_removes_it(tmp_path):
    scratch = tmp_path / "allocstack-0" / "run"
    tree = step_mount_tree(scratch, "worker-03")
    env = step_env(scratch, "worker-03")
    step = subprocess.Popen([sys.executable, str(WRAPPER), f"--dir={tree / 'tmp'}", "--", sys.executable, "-c", REPORT,
                             str(scratch), str(tree / "tmp")], stdout=subprocess.PIPE, text=True, env=env)
    seen = json.loads(step.communicate(timeout=60)[0])
    assert step.returncode == 0
    assert seen["pid"] == step.pid  # exec'd: the step's process IS the component (signals, exit status)
    assert seen["dirs"] == [True, True] and seen["scratch"] == str(scratch)
    assert seen["step"] is None  # the component's environment is what it was without the wrapper
    assert (scratch / ".steps" / "worker-03").exists()
    epilog = subprocess.run([str(WRAPPER)], env=env, capture_output=True, text=True, timeout=60, check=False)
    assert epilog.returncode == 0, epilog.stderr  # as slurmstepd runs it: by its path, no arguments
    assert not scratch.exists()


def test_an_exit_status_and_a_missing_program_pass_through_the_wrapper(tmp_path):
    scratch = tmp_path / "allocstack-0" / "run"
    env = step_env(scratch, "worker-03")
    failed = subprocess.run([sys.executable, str(WRAPPER), "--", sys.executable, "-c", "raise SystemExit(7)"],
                            env=env, timeout=60, check=False)
    assert failed.returncode == 7
    missing = subprocess.run([sys.executable, str(WRAPPER), "--", "no-such-runtime"], env=env, capture_output=True,
                             text=True, timeout=60, check=False)
    assert missing.returncode == 69
    assert "allocstack: error [prerequisite]: cannot start no-such-runtime on " in missing.stderr
    assert missing.stderr.count("\n") == 1


def test_outside_a_step_launch_py_started_the_wrapper_says_so(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("ALLOCSTACK_SCRATCH", STEP_ENV)}
    done = subprocess.run([sys.executable, str(WRAPPER), "--", "true"], env=env, capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 64 and done.stderr.startswith("allocstack: error [usage]: node_scratch.py runs inside")


def test_a_step_that_waited_while_the_last_one_left_makes_scratch_anew(tmp_path):
    """The last step's epilog holds the lock and removes scratch and the lock file; a step starting
    then waits on the old file, and must make scratch again rather than trust the one removed."""
    scratch = tmp_path / "allocstack-0" / "run"
    enter(scratch, "worker-03", [])
    with locked(scratch):
        step = subprocess.Popen([sys.executable, str(WRAPPER), "--", sys.executable, "-c", REPORT, str(scratch)],
                                stdout=subprocess.PIPE, text=True, env=step_env(scratch, "worker-04"))
        deadline = time.monotonic() + 30
        while not waiting_on(lock_path(scratch), step.pid):
            assert step.poll() is None and time.monotonic() < deadline
            time.sleep(0.02)
        (scratch / ".steps" / "worker-03").unlink()  # what leave() does for the last step
        for path in sorted(scratch.rglob("*"), reverse=True):
            path.rmdir()
        scratch.rmdir()
        lock_path(scratch).unlink()
    seen = json.loads(step.communicate(timeout=60)[0])
    assert seen["dirs"] == [True] and (scratch / ".steps" / "worker-04").exists()


def waiting_on(lock: Path, pid: int) -> bool:
    """Whether process ``pid`` has ``lock`` open (and so waits for its flock, held by the test)."""
    try:
        return any(os.readlink(fd) == str(lock) for fd in Path(f"/proc/{pid}/fd").iterdir())
    except OSError:
        return False


def test_a_lock_held_elsewhere_is_waited_for(tmp_path):
    scratch = tmp_path / "allocstack-0" / "run"
    scratch.parent.mkdir(mode=0o700)
    with open(lock_path(scratch), "w", encoding="utf-8") as held:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        step = subprocess.Popen([sys.executable, str(WRAPPER), "--", "true"], env=step_env(scratch, "worker-03"))
        time.sleep(0.5)
        assert step.poll() is None and not scratch.exists()
    assert step.wait(timeout=60) == 0 and scratch.is_dir()


# -- what launch.py runs for a step on another node ----------------------------------------
@pytest.mark.parametrize("runtime", ["apptainer", "charliecloud"])
def test_a_step_off_the_first_node_runs_the_wrapper_first_and_as_its_task_epilog(tmp_path, monkeypatch, runtime):
    image = tmp_path / "image"
    # the image has the top-level directories the run's paths live under, wherever the checkout is
    for top in {Path(path).resolve().parts[1] for path in (Path.cwd(), SCRIPTS, tmp_path)}:
        (image / top).mkdir(parents=True)
    scratch = tmp_path / "allocstack-0" / "run"
    monkeypatch.setattr(network, "node_for", lambda index, here, job: f"mn{index + 1}")  # launch.py imports it there
    args = launch.parse_args(["--component=worker-03", "--run=run", "--job-steps", "--node-index=1",
                              f"--image={image}", f"--runtime={runtime}", "--", str(SCRIPTS / "worker.py")])
    environ = {"SLURM_JOB_ID": "7", "SLURMD_NODENAME": "mn1", "USER": "root"}
    tree, step_dirs = launch.prepare_binds(args, scratch, environ)
    argv = launch.build_argv(args, scratch, environ, tree, step_dirs)
    assert not scratch.exists()  # nothing made here for the other node: its step makes it there
    # (launch.py's main makes this node's scratch, and marks it, before it starts the step)
    wrapper = argv.index(str(WRAPPER))
    assert argv[:wrapper][:1] == ["srun"] and "--nodelist=mn2" in argv and f"--task-epilog={WRAPPER}" in argv
    end = argv.index("--", wrapper)
    assert argv[end + 1] == {"apptainer": "apptainer", "charliecloud": "ch-run"}[runtime]
    made = [arg.removeprefix("--dir=") for arg in argv[wrapper + 1:end]]
    if runtime == "charliecloud":
        assert made[0] == str(step_mount_tree(scratch, "worker-03")) and all(m.startswith(made[0]) for m in made)
        assert f"--bind={step_mount_tree(scratch, 'worker-03') / tmp_path.parts[1]}:/{tmp_path.parts[1]}" in argv
    else:
        assert made == []
    on_first = launch.parse_args(["--component=worker-01", "--run=run", "--job-steps", f"--image={image}",
                                  f"--runtime={runtime}", "--", str(SCRIPTS / "worker.py")])
    assert str(WRAPPER) not in launch.build_argv(on_first, scratch, environ, *launch.prepare_binds(on_first, scratch,
                                                                                                   environ))


def test_the_wrapper_is_executable_for_slurmstepd():
    assert os.access(WRAPPER, os.X_OK) and WRAPPER.read_text().startswith("#!/usr/bin/env python3\n")

