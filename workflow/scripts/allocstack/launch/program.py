"""Your own programs (services, long-running workers, the check): what they are told, and how they are run.

What a program of yours gets in its environment, besides what it inherits:

* for every service NAME it uses (that is up): ``ALLOCSTACK_<NAME>_HOST`` (where it runs:
  127.0.0.1 on one node), ``ALLOCSTACK_<NAME>_PORT``, ``ALLOCSTACK_<NAME>_ENDPOINT``
  (``http://HOST:PORT``) and ``ALLOCSTACK_<NAME>_TOKEN`` (see :mod:`allocstack.common.endpoint`);
* for every named volume V: ``ALLOCSTACK_VOLUME_<V>``, its job-scoped scratch directory
  (set by ``launch.py`` for every component, see :func:`volume_environment`);
* your ``environment`` values.

``${ALLOCSTACK_...}`` in your commands and ``environment`` values is replaced by
allocstack itself when it starts the program (no shell is involved), e.g.
``http://${ALLOCSTACK_KV_HOST}:8080``, and so is ``${env:NAME}``, the variable NAME of the
environment allocstack runs in (the import writes a secret from your environment that way,
never its value); a name that is not set is an error, never an empty string.

Where they run (:func:`prepare`): with an image of their own (``services.<name>.image``,
``worker.image``, ``verify.image``, else ``image``) in it, started by this supervisor, which runs
beside it on the node: the image's own command by Compose's rules when the config gives none
(allocstack/common/images.py), its mounts at their targets, its working directory, and of the
environment only allocstack's variables and the program's own; without an image on this machine,
with the mounts' targets rewritten to their sources (allocstack/launch/mounts.py).

How they are run: a program that lives as long as the stack (a service, a long-running
worker) is supervised by :class:`allocstack.launch.supervise.Supervised`, the one supervisor
(signals passed on so it can stop cleanly, stopped when its launcher is gone, its
stderr in the component's log with its last lines kept for the one-line error); a
program that runs to its end (``worker.command`` per task, a readiness ``command``,
``verify.command``) by :func:`run_program`.
"""

from __future__ import annotations

import errno
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..common.endpoint import service_end_path, service_endpoint_path
from ..common.errors import AllocstackError
from ..common.jsonio import read_json
from ..common.names import VOLUME_PREFIX, VOLUMES, volume_variable
from ..common.scratch import make_private

REFERENCE = re.compile(r"\$\{(ALLOCSTACK_[A-Z0-9_]+)\}|\$\{env:([A-Za-z_][A-Za-z0-9_]*)\}")
#: allocstack's own working directory (it holds the tokens) and its supervisor's stop request: a program of yours is
#: not given them.
PRIVATE = ("ALLOCSTACK_SCRATCH", "ALLOCSTACK_STOP_REQUEST")


def volume_environment(scratch: Path, volumes: list[str], kept: Path | None = None,
                       keep: frozenset[str] = frozenset()) -> dict[str, str]:
    """Create each named volume as ``SCRATCH/volumes/<name>`` (0700: fresh per attempt, the attempt's first
    launcher emptied the scratch) or, for one in ``keep``, ``KEPT/volumes/<name>`` (the run's state directory:
    carried across attempts), and name it in ``ALLOCSTACK_VOLUME_<NAME>``."""
    env = {}
    for volume in volumes:
        home = kept if kept is not None and volume in keep else scratch
        env[volume_variable(volume)] = str(make_private(home / VOLUMES / volume))
    return env


def expand(text: str, env: Mapping[str, str], where: str) -> str:
    """Replace every ``${ALLOCSTACK_...}`` in ``text`` with its value in ``env``, and every ``${env:NAME}`` with
    NAME in the environment allocstack runs in.

    :raises AllocstackError: ``config`` naming ``where`` and the variable when it is not set.
    """

    def value(match: re.Match[str]) -> str:
        name = match.group(1)
        if name is None:
            outside = match.group(2)
            if outside not in os.environ:
                raise AllocstackError("config", f"{where}: ${{env:{outside}}} is not set in the environment allocstack "
                                                f"runs in: export {outside} before snakemake (it is read when the "
                                                "program starts, never written in a file)")
            return os.environ[outside]
        if name not in env:
            raise AllocstackError("config", f"{where}: ${{{name}}} is not set for this program (is the service it "
                                            "names one of its depends_on, or the volume in `volumes`?)")
        return env[name]

    return REFERENCE.sub(value, text)


def program_environment(base: Mapping[str, str], stack: Mapping[str, str], own: Mapping[str, str],
                        where: str) -> dict[str, str]:
    """``base`` (minus allocstack's private variables) + ``stack`` (services, replica) + ``own`` values, expanded."""
    env = {name: value for name, value in base.items() if name not in PRIVATE}
    env.update(stack)
    for name, value in own.items():
        env[name] = expand(value, env, f"{where}: environment {name}")
    return env


def expand_argv(argv: list[str], env: Mapping[str, str], where: str) -> list[str]:
    return [expand(arg, env, f"{where}: command") for arg in argv]


def describe(argv: list[str]) -> str:
    """How a program is named in one-line errors: its first two words."""
    return " ".join(argv[:2])


#: How a service's end reads in one-line errors, by the status its supervisor recorded.
ENDINGS = {
    "exited": "ended by itself before the stack was done",
    "killed": "did not stop within its stop_grace_period after SIGTERM and was killed",
    "unclean": "did not stop cleanly on SIGTERM",
    "failed": "failed to start",
}


def service_problem(name: str, record: object) -> str | None:
    """Why a service's end record (see app_service.py) is not a clean stop by allocstack; None when it is."""
    if not isinstance(record, dict):
        return f"service {name} left no end record"
    status = record.get("status")
    if status == "stopped":
        return None
    ending = ENDINGS.get(str(status), "left no end record")
    return f"service {name} {ending} ({record.get('how') or record.get('reason') or '?'})"


def await_gates(paths: list[Path], timeout: float, log: Callable[[str], None]) -> None:
    """Wait (polling every 20 ms, at most ``timeout`` s in all) for every gate record to say ready.

    A gate record is the sentinel between a readiness gate and what must wait for it
    (workers, a service that depends on another): nothing starts before the gate has
    passed. Whoever has to wait says so once in its log, so a stuck run shows where it stands.

    :raises AllocstackError: ``prerequisite`` when a record does not appear or does not say ready.
    """
    deadline = time.monotonic() + timeout
    for path in paths:
        if not path.exists():
            log(f"waiting for the readiness gate ({path}, at most {timeout:g} s in all)")
        while not path.exists():
            if time.monotonic() > deadline:
                raise AllocstackError("prerequisite", f"the readiness gate did not pass within {timeout:g} s (no {path})")
            time.sleep(0.02)
        record = read_json(path, "gate record", diag="prerequisite")
        if not isinstance(record, dict) or record.get("status") != "ready":
            raise AllocstackError("prerequisite", f"gate record {path} does not say ready: refusing to start")


def await_dependencies(gates: list[Path], started: list[str], scratch: Path, timeout: float,
                       log: Callable[[str], None]) -> None:
    """Wait, within ``timeout`` s in all, for every gate record (:func:`await_gates`), then for every service in
    ``started`` to have started: its endpoint file in ``scratch``, which its supervisor writes once its program is
    running (depends_on ``service_started``, as Compose starts a dependent once its dependency's container started).

    :raises AllocstackError: ``prerequisite`` when a gate does not pass, or a service has not started in time or
        ended before it started (its end record says why).
    """
    deadline = time.monotonic() + timeout
    await_gates(gates, timeout, log)
    for name in started:
        published, ended = service_endpoint_path(scratch, name), service_end_path(scratch, name)
        if not published.exists():
            log(f"waiting for service {name} to start (its endpoint file {published}; not its gate: depends_on "
                f"service_started; at most {timeout:g} s in all)")
        while not published.exists():
            if ended.exists():
                problem = service_problem(name, read_json(ended, "service end record", diag="prerequisite"))
                raise AllocstackError("prerequisite", f"{problem or f'service {name} ended'} before it started: "
                                                      "refusing to start")
            if time.monotonic() > deadline:
                raise AllocstackError("prerequisite", f"service {name} did not start within {timeout:g} s (no "
                                                      f"{published}): refusing to start")
            time.sleep(0.02)


class ProgramError(Exception):
    """The program could not be started, or did not end within its timeout."""


#: Why a program cannot be started that no retry changes (its path, its mode, its format): not the
#: resources of the moment (EAGAIN, ENOMEM), which another try may have.
LASTING_START_ERRORS = frozenset({errno.ENOENT, errno.EACCES, errno.EPERM, errno.ENOEXEC, errno.ENOTDIR,
                                  errno.EISDIR, errno.ELOOP, errno.ENAMETOOLONG, errno.E2BIG})


class CannotStart(ProgramError):
    """The program cannot be started, and would not start on another try either (:data:`LASTING_START_ERRORS`).

    :param errno: the error ``execve`` (or the search for the program) gave.
    """

    def __init__(self, message: str, error: int) -> None:
        super().__init__(message)
        self.errno = error


def why_not_started(argv: list[str], error: int) -> str:
    """Why ``argv[0]`` could not be started with ``error``, and what to do: one clause."""
    program, strerror = argv[0], os.strerror(error)
    if error == errno.ENOENT and "/" not in program:
        return f"{program}: not found on PATH"
    if error == errno.ENOENT:
        return (f"{program}: {strerror} (a relative path starts in the directory snakemake runs in; or its #! line "
                "names an interpreter that does not exist)")
    if error in (errno.EACCES, errno.EPERM):
        return (f"{program}: {strerror}: it is not executable; chmod +x it, or name its interpreter first, "
                f"e.g. [\"python3\", \"{program}\"]")
    if error == errno.ENOEXEC:
        return f"{program}: {strerror}: give it a #! line, or name its interpreter first"
    return f"{program}: {strerror}"


@dataclass(frozen=True)
class Finished:
    """A program that ran to its end: its exit status and what it wrote (bytes: the protocol is UTF-8
    whatever the node's locale says)."""

    returncode: int
    stdout: bytes
    stderr: bytes

    def text(self) -> str:
        """stdout then stderr, decoded with replacement (for logs)."""
        return (self.stdout + self.stderr).decode("utf-8", errors="replace")

    def tail(self, chars: int) -> str:
        """The last ``chars`` characters of stderr (of stdout when stderr is empty), stripped."""
        stream = self.stderr.strip() or self.stdout.strip()
        return stream.decode("utf-8", errors="replace")[-chars:].strip()


def run_program(argv: list[str], env: Mapping[str, str] | None = None, stdin: bytes = b"",
                timeout: float | None = None, cwd: str | None = None,
                preexec: Callable[[], None] | None = None) -> Finished:
    """Run ``argv`` (no shell) to its end with exactly ``env`` (None: ours) and ``stdin`` as its input (in ``cwd``).

    The one way allocstack runs a program of yours that is not supervised for the
    stack's life: ``worker.command`` per task, a readiness ``command``, ``verify.command``. ``preexec``: run in
    its process before exec (the stack's names without an image, :attr:`Started.preexec`).

    :raises CannotStart: when it cannot be started, lastingly (no such file, not executable, ...).
    :raises ProgramError: saying why it could not run otherwise, or that it timed out (it is killed).
    """
    try:
        done = subprocess.run(argv, input=stdin, capture_output=True, timeout=timeout, check=False, cwd=cwd,
                              env=None if env is None else dict(env), preexec_fn=preexec)
    except subprocess.TimeoutExpired as exc:
        raise ProgramError(f"timed out after {timeout:g} s") from exc
    except OSError as exc:
        if exc.errno in LASTING_START_ERRORS:
            raise CannotStart(f"cannot run {argv[0]}: {exc.strerror}", exc.errno) from exc
        raise ProgramError(f"cannot run {argv[0]}: {exc.strerror}") from exc
    return Finished(done.returncode, done.stdout, done.stderr)


#: Bound on ``verify.command``.
CHECK_TIMEOUT = 3600.0


def run_check(argv: list[str], env: Mapping[str, str], cwd: str | None = None, shown: list[str] | None = None,
              preexec: Callable[[], None] | None = None) -> None:
    """``verify.command``: the application's own correctness check ("only your application can say").

    Runs ``argv`` (no shell) with ``env``; exit 0 means correct. Its last lines of output go to the log.

    :raises AllocstackError: ``verification`` with the last line of its output otherwise.
    """
    try:
        done = run_program(argv, env, timeout=CHECK_TIMEOUT, cwd=cwd, preexec=preexec)
    except ProgramError as exc:
        raise AllocstackError("verification", f"verify.command {(shown or argv)[0]} could not run: {exc}") from exc
    for line in done.text().strip().splitlines()[-20:]:
        print(f"verify.command: {line}", file=sys.stderr, flush=True)
    if done.returncode != 0:
        tail = done.tail(2000).splitlines()[-1:] or ["no output"]
        raise AllocstackError("verification", f"verify.command exited {done.returncode}: {tail[0][-300:]}")


# ---------------------------------------------------------------- where a program of yours runs


@dataclass(frozen=True)
class Placement:
    """Where and how a program of yours runs (its config's ``image``, ``entrypoint``, ``working_dir``, ``mounts``).

    :param image: its image (None: on this machine); ``runtime`` runs it with ``runtime_args``.
    :param binds: host paths it also sees at the same place (config ``apptainer.binds`` / ``charliecloud.binds``).
    """

    image: str | None = None
    runtime: str = "apptainer"
    runtime_args: tuple[str, ...] = ()
    binds: tuple[str, ...] = ()
    mounts: tuple[dict[str, Any], ...] = ()
    working_dir: str | None = None
    entrypoint: tuple[str, ...] | None = None

    @classmethod
    def from_args(cls, args: Any) -> Placement:
        return cls(args.image or None, args.runtime, tuple(args.runtime_arg), tuple(args.bind),
                   tuple(args.mounts_json), args.working_dir, None if args.entrypoint_json is None
                   else tuple(args.entrypoint_json))


@dataclass
class Started:
    """What to start: ``argv`` with ``env`` in ``cwd`` (None: ours); ``deliver`` passes it a stop signal."""

    argv: list[str]
    env: dict[str, str]
    shown: list[str]  # the program's own argv, without its runtime's
    cwd: str | None = None
    container: str | None = None
    deliver: Callable[[Any, int], None] | None = None
    files: list[Path] = field(default_factory=list)
    #: Run in its process before exec: the stack's names without an image (allocstack/launch/privatenames.py),
    #: then the parent-death signal.
    preexec: Callable[[], None] | None = None

    def line(self) -> str:
        """The whole command, as its log shows it (no value of the environment is on it)."""
        import shlex

        return shlex.join(self.argv)


#: What passes from a supervisor's environment into the image of a program of yours, besides allocstack's
#: variables and the program's own (Compose passes nothing of the host's either).
PASSED = ("SLURM_JOB_ID", "SLURM_JOB_END_TIME", "SLURMD_NODENAME", "SLURM_SUBMIT_HOST", "USER",
          "CUDA_VISIBLE_DEVICES")


def image_meta(placement: Placement):
    """What the program's image says about how it runs (a SquashFS image read through ch-run).

    :raises AllocstackError: ``prerequisite`` when the image cannot be read.
    """
    from ..common.images import read_meta

    def read(path: str) -> str | None:
        from .containers import runtime_environ

        done = subprocess.run(["ch-run", "--unset-env=*", placement.image or "", "--", "cat", path],
                              capture_output=True, text=True, timeout=60, check=False,
                              env=runtime_environ(os.environ))
        return done.stdout if done.returncode == 0 else None

    try:
        return read_meta(placement.image or "", read if placement.runtime == "charliecloud" else None)
    except (OSError, ValueError) as exc:
        raise AllocstackError("prerequisite", f"cannot read image {placement.image}: {exc}") from exc


def stack_hosts() -> Path | None:
    """The stack's hosts file on this node (written by the launcher, which names the run's scratch to us)."""
    from .hostsfile import existing_hosts

    scratch = os.environ.get("ALLOCSTACK_SCRATCH")
    return existing_hosts(Path(scratch) if scratch else None)


def already_bound(hosts: Path, etc_hosts: Path = Path("/etc/hosts")) -> bool:
    """This process already sees the stack's hosts file at /etc/hosts (it runs in the image it is bound in)."""
    try:
        return etc_hosts.read_bytes() == hosts.read_bytes()
    except OSError:
        return False


def names_preexec(hosts: Path | None, where: str) -> Callable[[], None]:
    """What a program without an image runs before exec: into a mount namespace where ``hosts`` is /etc/hosts
    (where this node allows one; else it says once why not), then the parent-death signal."""
    from .privatenames import entering, mode
    from .supervise import die_with_parent

    if hosts is None or already_bound(hosts):
        return die_with_parent
    how, why = mode()
    if how is None:
        print(f"{where}: the stack's names: {why}", file=sys.stderr, flush=True)
    return entering(hosts, how, die_with_parent)


def prepare(placement: Placement, command: list[str] | None, env: dict[str, str], own: set[str], private: Path,
            where: str, probe: bool = False) -> Started:
    """How to start a program of yours (``command``, config ``command``; ``env``, from :func:`program_environment`,
    ``own`` the names of its config ``environment``): in its image, or on this machine.

    :raises AllocstackError: ``config`` when there is nothing to run (no command, and no image that has one of its
        own) or a reference is not set; ``prerequisite`` for a mount or an image that is not there.
    """
    from ..common.images import program_argv
    from .containers import deliverer
    from .mounts import PathRewriter, resolve

    binds = resolve(list(placement.mounts), env, where)
    hosts = stack_hosts()
    # the named volumes' directory at its own path too: ${ALLOCSTACK_VOLUME_<NAME>} names it in the image as well
    volumes = sorted({str(Path(value).parent) for name, value in env.items() if name.startswith(VOLUME_PREFIX)})
    entrypoint = list(placement.entrypoint) if placement.entrypoint is not None else None
    if placement.image is None:
        argv = [*(entrypoint or []), *(command or [])]
        if not argv:
            raise AllocstackError("config", f"{where}: no command, and it runs without an image whose own command "
                                            "would run: set its command (or run it in its image)")
        rewriter = PathRewriter(binds)
        env = rewriter.environment(env, own)
        argv = expand_argv(rewriter.argv(argv), env, where)
        return Started(argv, env, argv, rewriter.directory(placement.working_dir), preexec=names_preexec(hosts, where))
    from .containers import program_prefix, runtime_environ

    meta = image_meta(placement)
    # a probe (a healthcheck's test) runs as written, as `docker exec` runs it: no ENTRYPOINT before it
    argv = list(command or []) if probe else program_argv(meta, entrypoint, command)
    if not argv:
        raise AllocstackError("config", f"{where}: no command, and its image {placement.image} has none of its own "
                                        f"({meta.describe()}): set its command")
    inside = {name: value for name, value in env.items()
              if name in own or name in PASSED or (name.startswith("ALLOCSTACK_") and name != "ALLOCSTACK_LAUNCHER_PID")}
    if placement.runtime == "charliecloud" and any("\n" in value for value in inside.values()):
        bad = next(name for name, value in inside.items() if "\n" in value)
        raise AllocstackError("config", f"{where}: environment {bad}: a value with a newline cannot pass into ch-run")
    # its working directory: working_dir, else the image's WORKDIR, else (as allocstack's programs always start)
    # the directory snakemake runs in, then bound at its own path so that relative paths there work
    host_cwd = not (placement.working_dir or meta.workdir)
    cwd = placement.working_dir or meta.workdir or os.getcwd()
    if hosts is not None:
        from .containers import ETC_HOSTS, Bind, has_etc_hosts

        if placement.runtime == "apptainer" or has_etc_hosts(placement.image):
            # read-only in Apptainer; ch-run binds read-write only (a read-only view costs a namespace)
            binds = [*binds, Bind(str(hosts), ETC_HOSTS, placement.runtime == "apptainer")]
    prefix, runtime_env = program_prefix(placement.runtime, placement.image, list(placement.runtime_args),
                                         [*placement.binds, *volumes, *([cwd] if host_cwd else [])], binds, inside,
                                         cwd, private, host_cwd=host_cwd)
    process_env = {**runtime_environ(os.environ), **runtime_env} if placement.runtime == "charliecloud" else \
        {**os.environ, **runtime_env}
    argv = expand_argv(argv, env, where)
    return Started([*prefix, *argv], process_env, argv, None, placement.image,
                   deliverer(placement.runtime, placement.image), [private])
