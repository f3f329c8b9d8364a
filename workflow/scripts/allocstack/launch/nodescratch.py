"""The run's scratch on the node a job step runs on: made by the step itself, removed by the node's last one.

With config ``nodes`` above 1, launch.py on the first node starts each worker (and each node's
gate) as a job step on another node. Where scratch is local to each node (``$SLURM_TMPDIR``,
``$TMPDIR`` or a node's ``/tmp``, as at most centers), the scratch directory launch.py made on
the first node does not exist there, and a container runtime told to bind it fails at start.
So srun runs ``node_scratch.py`` on the step's node first::

    srun --task-epilog=node_scratch.py ... python3 node_scratch.py [--dir DIR]... -- COMMAND...

* :func:`enter` makes the run's scratch (``$ALLOCSTACK_SCRATCH``: 0700 and ours, its parent
  too, exactly as launch.py does on the first node) and the directories the runtime needs in
  it (``--dir``: Charliecloud's mount-point tree, :func:`step_mount_tree`), and records the step in
  ``SCRATCH/.steps/<component>`` (``$ALLOCSTACK_STEP``); then the wrapper execs COMMAND, so the
  step's process is the runtime's as before (signals, exit status, lifeline unchanged).
* :func:`leave` is the same program run by slurmstepd as the step's task epilog (no
  arguments; the step's environment): once the step's process ended, however it ended (an
  exit, a signal, SIGKILL of a cancelled step), it removes the step's record and mount-point
  tree and, when no other step of the run is left on the node, the run's scratch.

Both hold an exclusive ``flock`` on ``<scratch>.lock`` (beside the scratch, in the user's 0700
directory) while they work, so a step starting on a node while the last one leaves either
finds its scratch removed before it makes it anew, or keeps it. A node lost with everything
on it takes its scratch with it.

Scratch the nodes share (a ``scratch`` on the shared filesystem) is the first node's: launch.py
marks it there (:data:`FIRST_NODE`) before it starts a step elsewhere, and a step that finds the
mark leaves the scratch alone (it makes only its mount-point tree, and removes only that):
collection on the first node removes it at the end, as with one node.
"""

from __future__ import annotations

import fcntl
import os
import shutil
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from ..common.errors import AllocstackError
from ..common.scratch import PRIVATE_DIR, ensure_private_dir, private_level, remove_scratch

#: The component a step runs (its record's name), set by launch.py in the step's environment.
STEP_ENV = "ALLOCSTACK_STEP"
#: The run's scratch directory, as every component is told it.
SCRATCH_ENV = "ALLOCSTACK_SCRATCH"
STEPS = ".steps"
#: In the run's scratch on the first node, made by launch.py before it starts a step on another
#: node: a step that finds it shares the first node's scratch, which is not the node's to remove.
FIRST_NODE = ".first-node"


def step_mount_tree(scratch: Path, component: str) -> Path:
    """Where a component's Charliecloud mount-point tree is made on its step's node (one per component)."""
    return scratch / f".mounts-{component}"


def lock_path(scratch: Path) -> Path:
    return scratch.with_name(f"{scratch.name}.lock")


@contextmanager
def locked(scratch: Path) -> Iterator[None]:
    """Hold the exclusive lock of ``scratch`` on this node (created as needed; removed by :func:`leave`).

    The file is checked after locking to be the one at the path still: a step that waited on a
    lock file the last leaver removed tries again on the new one.
    """
    path = lock_path(scratch)
    while True:
        descriptor = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX)
            try:
                current = os.stat(path, follow_symlinks=False)
            except FileNotFoundError:
                continue
            if os.fstat(descriptor).st_ino == current.st_ino:
                yield
                return
        finally:
            os.close(descriptor)


def enter(scratch: Path, component: str, dirs: list[Path]) -> None:
    """Make the run's private scratch on this node, ``dirs`` in it, and record ``component`` as using it.

    :raises AllocstackError: ``scratch`` when a level of scratch is unsafe or cannot be made.
    """
    if (scratch / FIRST_NODE).exists():  # the first node's scratch, seen here: only this step's directories
        make_dirs(dirs)
        return
    private_level(scratch.parent)
    try:
        with locked(scratch):
            ensure_private_dir(scratch)
            steps = private_level(scratch / STEPS)
            (steps / component).touch(mode=0o600)
            make_dirs(dirs)
    except OSError as exc:
        raise AllocstackError("scratch", f"cannot make the run's scratch {scratch} on "
                                              f"{os.uname().nodename}: {exc.strerror}") from exc


def make_dirs(dirs: list[Path]) -> None:
    """Make ``dirs`` (0700, in the run's scratch).

    :raises AllocstackError: ``scratch`` when one cannot be made.
    """
    try:
        for directory in dirs:
            directory.mkdir(mode=PRIVATE_DIR, parents=True, exist_ok=True)
    except OSError as exc:
        raise AllocstackError("scratch", f"cannot make {exc.filename} in the run's scratch on "
                                              f"{os.uname().nodename}: {exc.strerror}") from exc


def leave(scratch: Path, component: str) -> bool:
    """Forget ``component`` on this node; remove the run's scratch when no step uses it. True if removed.

    :raises AllocstackError: ``cleanup`` when it cannot be removed.
    """
    if not scratch.is_dir():  # never made here, or already removed (an epilog run twice)
        return False
    if (scratch / FIRST_NODE).exists():  # the first node's: its collection removes it
        shutil.rmtree(step_mount_tree(scratch, component), ignore_errors=True)
        return False
    try:
        with locked(scratch):
            (scratch / STEPS / component).unlink(missing_ok=True)
            shutil.rmtree(step_mount_tree(scratch, component), ignore_errors=True)
            if (scratch / STEPS).is_dir() and any((scratch / STEPS).iterdir()):
                return False
            remove_scratch(scratch)
            lock_path(scratch).unlink(missing_ok=True)
    except OSError as exc:
        raise AllocstackError("cleanup", f"cannot remove the run's scratch {scratch} on "
                                         f"{os.uname().nodename}: {exc.strerror}") from exc
    return not scratch.exists()


def step_facts(environ: Mapping[str, str]) -> tuple[Path, str]:
    """The run's scratch and the step's component, from the step's environment (set by launch.py).

    :raises AllocstackError: ``usage`` when either is missing.
    """
    scratch, component = environ.get(SCRATCH_ENV), environ.get(STEP_ENV)
    if not scratch or not component or "/" in component:
        raise AllocstackError("usage", f"node_scratch.py runs inside a job step that launch.py started: "
                                       f"${SCRATCH_ENV} and ${STEP_ENV} are not both set")
    return Path(scratch), component
