"""Job-scoped scratch: the private directory holding a run's endpoint, token and events.

A Compose named volume becomes a per-user, per-run directory (mode 0700) under
the job's own temporary storage: ``$SLURM_TMPDIR`` where the center provides it,
else ``$TMPDIR``, else (only outside a Slurm job, e.g. on a laptop) the system
temporary directory. Inside a Slurm job with neither variable set we refuse
rather than silently fall back to a /tmp shared with other users of the node.
"""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from collections.abc import Mapping
from pathlib import Path

from .errors import AllocstackError

PRIVATE_DIR = 0o700


def resolve_root(configured: str | None, env: Mapping[str, str]) -> Path:
    """Pick the scratch root: configured path, $SLURM_TMPDIR, $TMPDIR, or the local temp dir.

    :raises AllocstackError: ``prerequisite`` inside a Slurm job with no private temp dir.
    """
    if configured:
        return Path(os.path.expandvars(os.path.expanduser(configured))).absolute()
    for name in ("SLURM_TMPDIR", "TMPDIR"):
        if env.get(name):
            return Path(env[name]).absolute()
    if env.get("SLURM_JOB_ID"):
        raise AllocstackError(
            "prerequisite",
            "inside Slurm job {} neither SLURM_TMPDIR nor TMPDIR is set; set 'scratch' in the config "
            "to your center's job-private storage".format(env["SLURM_JOB_ID"]),
        )
    return Path(tempfile.gettempdir()).absolute()


def run_scratch(root: Path, run: str, uid: int | None = None) -> Path:
    """``<root>/allocstack-<uid>/<run>``: one directory per user and run."""
    return root / f"allocstack-{os.getuid() if uid is None else uid}" / run


def ensure_private_dir(path: Path) -> Path:
    """Create ``path`` (and its parent) as 0700 directories owned by us, or refuse.

    :raises AllocstackError: ``prerequisite`` when a level exists but is a symlink,
        not ours, or accessible to group/others (someone else could read the token).
    """
    private_level(path.parent)
    return private_level(path)


def private_level(level: Path) -> Path:
    """Create the one directory ``level`` (parents as needed, untouched) as 0700 and ours, or refuse.

    :raises AllocstackError: ``prerequisite`` when it is a symlink, not a directory or not ours.
    """
    try:
        level.mkdir(mode=PRIVATE_DIR, parents=True, exist_ok=True)
    except OSError as exc:
        raise AllocstackError("prerequisite", f"cannot create scratch directory {level}: {exc.strerror}") from exc
    info = os.lstat(level)
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
        raise AllocstackError("prerequisite", f"scratch path {level} is not a plain directory")
    if info.st_uid != os.getuid():
        raise AllocstackError("prerequisite", f"scratch directory {level} belongs to uid {info.st_uid}, not to you")
    if info.st_mode & 0o077:
        os.chmod(level, PRIVATE_DIR)
    return level


def remove_scratch(path: Path) -> None:
    """Remove a run's scratch directory.

    :raises AllocstackError: ``cleanup`` when it cannot be removed.
    """
    try:
        shutil.rmtree(path)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise AllocstackError("cleanup", f"cannot remove scratch directory {path}: {exc.strerror}") from exc
