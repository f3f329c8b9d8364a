"""Your own programs (services, long-running workers, the check): what they are told, and how they are run.

What a program of yours gets in its environment, besides what it inherits:

* for every service NAME it uses (that is up): ``ALLOCSTACK_<NAME>_HOST`` (where it runs:
  127.0.0.1 on one node), ``ALLOCSTACK_<NAME>_PORT``, ``ALLOCSTACK_<NAME>_ENDPOINT``
  (``http://HOST:PORT``) and ``ALLOCSTACK_<NAME>_TOKEN`` (see :mod:`allocstack.endpoint`);
* for every named volume V: ``ALLOCSTACK_VOLUME_<V>``, its job-scoped scratch directory
  (set by ``launch.py`` for every component, see :func:`volume_environment`);
* your ``environment`` values.

``${ALLOCSTACK_...}`` in your commands and ``environment`` values is replaced by
allocstack itself when it starts the program (no shell is involved), e.g.
``http://${ALLOCSTACK_KV_HOST}:8080``; a name that is not set is an error, never an
empty string.

Supervision (:class:`Supervised`): SIGTERM, SIGINT and SIGHUP are passed on to the
program, so it can stop cleanly; it is stopped too when its launcher is gone; its
stderr goes to the component's log and its last lines are kept for the one-line error.
"""

from __future__ import annotations

import collections
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from .errors import EXIT_TEMPFAIL, AllocstackError
from .jsonio import read_json
from .lifeline import forward_signals, watch_launcher
from .names import volume_variable
from .scratch import ensure_private_dir

REFERENCE = re.compile(r"\$\{(ALLOCSTACK_[A-Z0-9_]+)\}")
#: allocstack's own working directory: a program of yours is not given it (it holds the tokens).
PRIVATE = ("ALLOCSTACK_SCRATCH",)


def volume_environment(scratch: Path, volumes: list[str]) -> dict[str, str]:
    """Create each named volume as ``SCRATCH/volumes/<name>`` (0700) and name it in ``ALLOCSTACK_VOLUME_<NAME>``."""
    env = {}
    for volume in volumes:
        env[volume_variable(volume)] = str(ensure_private_dir(scratch / "volumes" / volume))
    return env


def expand(text: str, env: Mapping[str, str], where: str) -> str:
    """Replace every ``${ALLOCSTACK_...}`` in ``text`` with its value in ``env``.

    :raises AllocstackError: ``config`` naming ``where`` and the variable when it is not set.
    """

    def value(match: re.Match[str]) -> str:
        name = match.group(1)
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


TAIL_LINES = 20


@dataclass
class Outcome:
    """How a supervised program ended."""

    code: int  # its exit status; negative: killed by that signal
    stopped_by: int | None = None  # the signal allocstack passed on to stop it, if any
    killed: bool = False  # still running ``grace`` seconds after that signal: SIGKILLed
    tail: list[str] = field(default_factory=list)

    @property
    def clean_stop(self) -> bool:
        """Stopped by allocstack and ended as a program stopped that way should: 0, or by that signal."""
        sig = self.stopped_by
        return sig is not None and not self.killed and self.code in (0, -sig, 128 + sig)

    def how(self) -> str:
        ended = f"killed by {signal.Signals(-self.code).name}" if self.code < 0 else f"exited {self.code}"
        last = f": {self.tail[-1][-300:]}" if self.tail else ""
        return ended + last


class Supervised:
    """One program of yours: create this first thing (it takes over the stop signals), then :meth:`start`, :meth:`wait`.

    A stop signal, or the loss of the launcher, before the program started ends this
    process at once (exit 75); after, it is passed on to the program.
    """

    def __init__(self, label: str) -> None:
        self.label = label
        self.child: subprocess.Popen[bytes] | None = None
        self.stopped_by: int | None = None
        self.killed = False
        self.tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
        self.grace: float | None = None
        forward_signals(self._forward)
        watch_launcher(lambda: self._forward(signal.SIGTERM, None))

    def start(self, argv: list[str], env: dict[str, str], grace: float | None = None) -> int:
        """Start ``argv``; return its pid. ``grace``: seconds it may take to stop before SIGKILL.

        :raises AllocstackError: ``prerequisite`` when it cannot be started.
        """
        self.grace = grace
        try:
            self.child = subprocess.Popen(argv, env=env, stderr=subprocess.PIPE)
        except OSError as exc:
            raise AllocstackError("prerequisite", f"cannot start {self.label} ({argv[0]}): {exc.strerror}") from exc
        self.reader = threading.Thread(target=self._copy_stderr, args=(self.child.stderr,), name="stderr", daemon=True)
        self.reader.start()
        return self.child.pid

    def _copy_stderr(self, stream: IO[bytes]) -> None:
        for raw in stream:
            sys.stderr.buffer.write(raw)
            sys.stderr.buffer.flush()
            line = raw.decode("utf-8", errors="replace").strip()
            if line:
                self.tail.append(line)

    def _forward(self, signum: int, _frame: object) -> None:
        if self.child is None:
            print(f"{self.label}: stopped ({signal.Signals(signum).name}) before it started", file=sys.stderr,
                  flush=True)
            os._exit(EXIT_TEMPFAIL)
        if self.child.poll() is not None:
            return
        if self.stopped_by is None:
            self.stopped_by = signum
            if self.grace is not None:
                threading.Thread(target=self._kill_after_grace, args=(self.child, self.grace), name="grace",
                                 daemon=True).start()
        self.child.send_signal(signum)

    def _kill_after_grace(self, child: subprocess.Popen[bytes], grace: float) -> None:
        try:
            child.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            self.killed = True
            child.kill()

    def wait(self) -> Outcome:
        if self.child is None:
            raise RuntimeError("wait() before start()")
        code = self.child.wait()
        self.reader.join(timeout=5)
        return Outcome(code, self.stopped_by, self.killed, list(self.tail))


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


def run_check(argv: list[str], env: Mapping[str, str]) -> None:
    """``verify.command``: the application's own correctness check ("only your application can say").

    Runs ``argv`` (no shell) with ``env``; exit 0 means correct. Its last lines of output go to the log.

    :raises AllocstackError: ``verification`` with the last line of its output otherwise.
    """
    try:
        done = subprocess.run(argv, capture_output=True, encoding="utf-8", errors="replace", env=dict(env),
                              timeout=3600, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise AllocstackError("verification", f"verify.command {argv[0]} could not run: {exc}") from exc
    for line in (done.stdout + done.stderr).strip().splitlines()[-20:]:
        print(f"verify.command: {line}", file=sys.stderr, flush=True)
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        raise AllocstackError("verification", f"verify.command exited {done.returncode}: {tail[0][-300:]}")
