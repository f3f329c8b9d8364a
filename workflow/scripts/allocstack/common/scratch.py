"""Job-scoped scratch: the private directory holding a run's endpoint, token and events.

A Compose named volume becomes a per-user, per-run directory (mode 0700) under
the job's own temporary storage: ``$SLURM_TMPDIR`` where the center provides it,
else ``$TMPDIR``, else (only outside a Slurm job, e.g. on a laptop) the system
temporary directory. Inside a Slurm job with neither variable set we refuse
rather than silently fall back to a /tmp shared with other users of the node.

A run's scratch is its own: ``<root>/allocstack-<uid>/<run>.<checkout>[.<job>]``
(:func:`run_scratch`), keyed by the run's name, the checkout it runs from (the
working directory's real path, as a digest) and the Slurm job where there is one,
so two clones of the project, or two jobs sharing a node and its ``/tmp``, never
touch each other's endpoint, token or events.

Made and checked once, on the host, by the launcher (:func:`prepare`, launch.py),
before any container starts: only there is the user's level (``allocstack-<uid>``)
the real directory. Inside a container a component only uses the directory it was
given (:func:`make_private` for what it makes in it): the levels above it are the
runtime's mount-point placeholders there (Apptainer makes a mode-0755 one on its
read-only overlay), which say nothing about the host's directories and cannot be
changed.
"""

from __future__ import annotations

import errno
import hashlib
import os
import re
import shutil
import stat
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path

from .errors import AllocstackError

PRIVATE_DIR = 0o700
#: Bytes the scratch root must have free when a component starts: its endpoint, tokens, event logs and
#: (Charliecloud) mount-point tree take a few kilobytes; less than this and it is full for every purpose.
MIN_FREE_BYTES = 1 << 20
#: Hex digits of the checkout's digest in the key (48 bits: two checkouts of one user never collide).
CHECKOUT_DIGITS = 12
KEY = re.compile(rf"^(?P<run>.+)\.(?P<checkout>[0-9a-f]{{{CHECKOUT_DIGITS}}})(?:\.(?P<job>[0-9_]+))?$")


def resolve_root(configured: str | None, env: Mapping[str, str]) -> Path:
    """Pick the scratch root: configured path, $SLURM_TMPDIR, $TMPDIR, or the local temp dir.

    :raises AllocstackError: ``scratch`` inside a Slurm job with no private temp dir.
    """
    if configured:
        return Path(os.path.expandvars(os.path.expanduser(configured))).absolute()
    for name in ("SLURM_TMPDIR", "TMPDIR"):
        if env.get(name):
            return Path(env[name]).absolute()
    if env.get("SLURM_JOB_ID"):
        raise AllocstackError(
            "scratch",
            "inside Slurm job {} neither SLURM_TMPDIR nor TMPDIR is set; set 'scratch' in the config "
            "to your center's job-private storage".format(env["SLURM_JOB_ID"]),
        )
    return Path(tempfile.gettempdir()).absolute()


def root_source(configured: str | None, env: Mapping[str, str]) -> str:
    """Where :func:`resolve_root` took the root from, as a user would set it (for messages)."""
    if configured:
        return "config scratch"
    return next((f"${name}" for name in ("SLURM_TMPDIR", "TMPDIR") if env.get(name)), "the system temporary directory")


def checkout_digest(checkout: Path) -> str:
    """The checkout (the working directory the run's results and state are under), as a short digest."""
    return hashlib.sha256(os.fsencode(os.path.realpath(checkout))).hexdigest()[:CHECKOUT_DIGITS]


def run_key(run: str, checkout: Path, job: str | None) -> str:
    """``<run>.<checkout>[.<job>]``: what makes a run's scratch its own."""
    key = f"{run}.{checkout_digest(checkout)}"
    return f"{key}.{job}" if job else key


def run_scratch(root: Path, run: str, checkout: Path | None = None, job: str | None = None,
                uid: int | None = None) -> Path:
    """``<root>/allocstack-<uid>/<run>.<checkout>[.<job>]``: one directory per user, checkout, run and Slurm job.

    ``checkout`` defaults to the working directory.
    """
    return user_scratch(root, uid) / run_key(run, Path.cwd() if checkout is None else checkout, job)


def user_scratch(root: Path, uid: int | None = None) -> Path:
    """``<root>/allocstack-<uid>``: this user's level, holding each run's scratch."""
    return root / f"allocstack-{os.getuid() if uid is None else uid}"


def scratch_of(root: Path, run: str, environ: Mapping[str, str]) -> Path:
    """The scratch of ``run`` from this working directory, in this Slurm job (if any): what every component of
    the run computes alike (launch.py, collect.py, status.py)."""
    return run_scratch(root, run, Path.cwd(), environ.get("SLURM_JOB_ID") or None)


def runs_in(user_dir: Path, checkout: Path | None = None) -> dict[str, list[Path]]:
    """The runs of ``checkout`` (default: the working directory) with scratch in ``user_dir``: name -> directories."""
    digest = checkout_digest(Path.cwd() if checkout is None else checkout)
    found: dict[str, list[Path]] = {}
    if not user_dir.is_dir():
        return found
    for entry in sorted(user_dir.iterdir()):
        key = KEY.match(entry.name)
        if key and key["checkout"] == digest and entry.is_dir():
            found.setdefault(key["run"], []).append(entry)
    return found


def remedy(source: str) -> str:
    """What to set instead of a root from ``source`` (:func:`root_source`) that cannot be used."""
    if source == "$TMPDIR":
        return "point $TMPDIR (or config scratch) at a writable, node-local directory"
    if source == "$SLURM_TMPDIR":
        return "set config scratch to a writable, node-local directory (it wins over $SLURM_TMPDIR)"
    return "set config scratch to a writable, node-local directory"


def unusable(path: Path, root: Path, source: str, exc: OSError) -> AllocstackError:
    """One line for an OSError on the scratch root or a level in it, saying what is wrong and where it comes from."""
    where, fix = f"scratch root {root} ({source})", remedy(source)
    if exc.errno == errno.EROFS:
        return AllocstackError("scratch", f"{where} is read-only: allocstack keeps the run's endpoint, token and events "
                                          f"there; {fix}")
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return AllocstackError("scratch", f"{where} is full ({exc.strerror}): free space there, or {fix}")
    if exc.errno in (errno.EACCES, errno.EPERM):
        return AllocstackError("scratch", f"{where}: you may not write {path} ({exc.strerror}); {fix}")
    return AllocstackError("scratch", f"{where}: cannot make {path}: {exc.strerror or exc}")


def prepare(scratch: Path, source: str) -> Path:
    """On the host, before anything starts: the run's scratch (0700, ours, its user level too) on a root that
    is writable and not full, or ONE line saying why not.

    The root itself is the center's (a per-job directory a prolog made, a node-local disk): made when
    missing, never changed.

    :param source: where the root came from (:func:`root_source`), named in the message.
    :raises AllocstackError: ``scratch``.
    """
    root = scratch.parent.parent
    try:
        root.mkdir(parents=True, exist_ok=True)
        room = os.statvfs(root)
    except OSError as exc:
        raise unusable(root, root, source, exc) from exc
    if room.f_flag & os.ST_RDONLY:
        raise unusable(root, root, source, OSError(errno.EROFS, os.strerror(errno.EROFS)))
    free = room.f_bavail * room.f_frsize
    if free < MIN_FREE_BYTES:
        raise AllocstackError("scratch", f"scratch root {root} ({source}) is full: {free:,} bytes free, allocstack needs "
                                         f"at least {MIN_FREE_BYTES >> 20} MiB there (the run's endpoint, token, event "
                                         f"logs): free space there, or {remedy(source)}")
    for level in (scratch.parent, scratch):
        try:
            judged_level(level)
        except OSError as exc:
            raise unusable(level, root, source, exc) from exc
    return scratch


def ensure_private_dir(path: Path) -> Path:
    """Create ``path`` (and its parent) as 0700 directories owned by us, or refuse (on the host only: see above).

    :raises AllocstackError: ``scratch`` when a level exists but is a symlink,
        not ours, or cannot be made.
    """
    private_level(path.parent)
    return private_level(path)


def private_level(level: Path, diag: str = "scratch") -> Path:
    """Create the one directory ``level`` (parents as needed, untouched) as 0700 and ours, or refuse.

    A level someone else could read is closed (0700): on the host, where it is the real directory.

    :raises AllocstackError: ``diag`` when it is a symlink, not a directory, not ours, or cannot be made or closed.
    """
    try:
        return judged_level(level, diag)
    except OSError as exc:
        raise AllocstackError(diag, f"cannot create scratch directory {level}: {exc.strerror}") from exc


def judged_level(level: Path, diag: str = "scratch") -> Path:
    """:func:`private_level`, with what the system refused left as the OSError it is (:func:`prepare` names the root).

    :raises AllocstackError: ``diag`` when it is a symlink, not a directory or not ours.
    :raises OSError: when it cannot be made or closed.
    """
    level.mkdir(mode=PRIVATE_DIR, parents=True, exist_ok=True)
    info = os.lstat(level)
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
        raise AllocstackError(diag, f"scratch path {level} is not a plain directory")
    if info.st_uid != os.getuid():
        raise AllocstackError(diag, f"scratch directory {level} belongs to uid {info.st_uid}, not to you")
    if info.st_mode & 0o077:
        os.chmod(level, PRIVATE_DIR)
    return level


def make_private(path: Path) -> Path:
    """Make ``path`` (0700, missing parents too) in the directory a component was given; nothing above it is judged.

    What a component does in its scratch, inside a container or not: the launcher made and checked the run's
    directory on the host (:func:`prepare`), and everything made in it is the user's and private.

    :raises AllocstackError: ``scratch`` when it cannot be made (a read-only or full scratch).
    """
    try:
        path.mkdir(mode=PRIVATE_DIR, parents=True, exist_ok=True)
    except OSError as exc:
        raise AllocstackError("scratch", f"cannot make {path} in the run's scratch: {exc.strerror}") from exc
    return path


#: Times :func:`remove_scratch` tries again when a file appeared while it removed the directory.
REMOVE_TRIES = 5


def remove_scratch(path: Path, pause: float = 0.2) -> None:
    """Remove a run's scratch directory.

    Components that are still ending work in it meanwhile: a launcher writes its last record (its ``ended/``
    note), or removes its own Charliecloud mount-point tree. An entry that vanished meanwhile is gone, as
    wanted (before, that FileNotFoundError ended the removal as if the whole directory were gone, and a VERIFIED
    run left its scratch); "Directory not empty", or the directory still there after the removal, is tried
    again, a few times ``pause`` seconds apart, before it counts.

    :raises AllocstackError: ``cleanup`` when it cannot be removed.
    """

    def gone_already(_function: object, _name: str, info: tuple) -> None:
        if not isinstance(info[1], FileNotFoundError):
            raise info[1]

    for attempt in range(REMOVE_TRIES):
        last = attempt + 1 == REMOVE_TRIES
        try:
            shutil.rmtree(path, onerror=gone_already)
        except OSError as exc:
            if exc.errno == errno.ENOTEMPTY and not last:
                time.sleep(pause)
                continue
            raise AllocstackError("cleanup", f"cannot remove scratch directory {path}: {exc.strerror}") from exc
        if not os.path.lexists(path):
            return
        if last:
            raise AllocstackError("cleanup", f"cannot remove scratch directory {path}: something made it again")
        time.sleep(pause)
