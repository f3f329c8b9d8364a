"""Supervising one child process: the one implementation behind launch.py, app_service.py and replica.py.

* Nothing is orphaned: the child gets SIGKILL when its supervisor dies
  (``PR_SET_PDEATHSIG``), and the supervisor passes SIGTERM on when its own
  launcher is gone (:func:`lifeline.watch_launcher`: inside Apptainer the kernel's
  parent-death signal does not reach the program), or when launch.py asks it to stop
  (:func:`lifeline.watch_stop_request`: one SIGTERM to the child alone, as Compose sends it).
* The signals that end a job (:data:`lifeline.FORWARDED_SIGNALS`) are passed on so
  the child can drain, through ``deliver`` (launch.py: ``scancel --signal`` to its
  job step), and remembered: a supervisor tells "ended on our signal" from "killed
  from outside" (``kill -9``, the OOM killer) by :attr:`Outcome.ended_by_us`.
* With ``grace``, a child still running that many seconds after the first
  forwarded signal is killed (:attr:`Outcome.killed`).
* With ``keep_tail``, its stderr is copied to ours (the component's log) and its last
  lines are kept for the one-line error (:attr:`Outcome.tail`); without, it writes
  to our stderr directly.
* With a restart policy (:meth:`Supervised.wait`'s ``restart``, allocstack/launch/restart.py), a child that
  ended by itself is started again with the same command, environment and directory (so a service keeps its
  port), after the policy's delay; each restart is a line in our log and a call of ``on_restart``. A child
  ended by our stop signal is never restarted, and a stop signal during the delay cancels the restart.
* What the child's own children leave running when it ends, or when the supervisor dies, is stopped by its
  watchdog (allocstack/launch/watchdog.py): the parent-death signal reaches the child alone.
"""

from __future__ import annotations

import collections
import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import IO

from ..common.errors import EXIT_TEMPFAIL, AllocstackError
from . import watchdog
from .lifeline import FORWARDED_SIGNALS, forward_signals, watch_launcher, watch_stop_request
from .restart import RestartPolicy, restart_after

PR_SET_PDEATHSIG = 1
TAIL_LINES = 20
#: Seconds between two looks for a stop signal while the child runs (:meth:`Supervised.wait`).
SIGNAL_CHECK = 0.5
#: Seconds between two looks at what says the child must stop (:meth:`Supervised.wait`'s ``stop_when``).
STOP_CHECK = 0.1


def _find_prctl() -> Callable[..., int] | None:
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


#: Looked up here, not in the child: a forked child of a threaded process must not load libraries.
_PRCTL = _find_prctl()


def die_with_parent() -> None:
    """In the child, before exec: get SIGKILL when the supervisor dies (Linux)."""
    if _PRCTL is not None:
        _PRCTL(PR_SET_PDEATHSIG, signal.SIGKILL)


def exit_status(code: int) -> int:
    """A child's return code as a shell reports it: a signal N becomes 128 + N."""
    return code if code >= 0 else 128 - code


Deliver = Callable[["subprocess.Popen[bytes]", int], None]


def send_to_child(child: subprocess.Popen[bytes], signum: int) -> None:
    child.send_signal(signum)


@dataclass
class Outcome:
    """How a supervised child ended."""

    code: int  # its return code; negative: killed by that signal
    stopped_by: int | None = None  # the first signal passed on to it, if any
    killed: bool = False  # still running ``grace`` seconds after that signal: SIGKILLed
    tail: list[str] = field(default_factory=list)  # its last lines of stderr (with keep_tail)
    forwarded: frozenset[int] = frozenset()  # every signal passed on to it
    #: Every stop signal the supervisor itself got, passed on or not: a signal to the job's whole process group
    #: may kill a child without a handler before the supervisor's own handler runs (it then finds the child gone).
    received: frozenset[int] = frozenset()
    restarts: int = 0  # how many times it was started again (a restart policy)
    #: It had ended by itself and waited for its restart when a stop signal came: not started again, it counts as
    #: stopped by that signal.
    cancelled_restart: bool = False

    @property
    def ended_by_us(self) -> bool:
        """It ended on a signal we got too (not ``kill -9`` or the OOM killer from outside)."""
        return self.code < 0 and -self.code in self.received

    @property
    def stop_signal(self) -> int | None:
        """The stop signal that ended it: the first one passed on to it; or, when a signal to the job's whole
        process group (Snakemake stopping a service, Slurm signalling a step) ended it before the supervisor's
        own handler ran, the signal the supervisor got too and it ended as that signal ends a program.
        None: it ended by itself."""
        if self.stopped_by is not None:
            return self.stopped_by
        return next((sig for sig in sorted(self.received) if self.code in (0, -sig, 128 + sig)), None)

    @property
    def clean_stop(self) -> bool:
        """Stopped by us and ended as a program stopped that way should: 0, or by that signal."""
        sig = self.stop_signal
        return sig is not None and not self.killed and (self.cancelled_restart or self.code in (0, -sig, 128 + sig))

    @property
    def status(self) -> int:
        """The exit status to pass on (:func:`exit_status`)."""
        return exit_status(self.code)

    def how(self) -> str:
        ended = f"killed by {signal.Signals(-self.code).name}" if self.code < 0 else f"exited {self.code}"
        last = f": {self.tail[-1][-300:]}" if self.tail else ""
        return ended + last


class Supervised:
    """One child: create this first thing (it takes over the stop signals), then :meth:`start`, :meth:`wait`.

    A stop signal, or the loss of the launcher, before the child started ends this
    process at once (exit 75); after, it is passed on to the child with ``deliver``
    (default: to the child process itself).
    """

    def __init__(self, label: str, deliver: Deliver = send_to_child, keep_tail: bool = True) -> None:
        self.label = label
        self.child: subprocess.Popen[bytes] | None = None
        self.stopped_by: int | None = None
        self.forwarded: set[int] = set()
        self.received: set[int] = set()
        self.killed = False
        self.tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
        self.grace: float | None = None
        self.reader: threading.Thread | None = None
        self._deliver = deliver
        self._preexec: Callable[[], None] = die_with_parent
        self._keep_tail = keep_tail
        self._started: tuple[list[str], Mapping[str, str], str | None] | None = None  # what a restart starts again
        self.waiting_restart = False
        self.watchdog: watchdog.Watchdog | None = None
        forward_signals(self._forward)
        watch_launcher(lambda: self._forward(signal.SIGTERM, None))
        watch_stop_request(lambda: self._forward(signal.SIGTERM, None))

    def start(self, argv: list[str], env: Mapping[str, str], grace: float | None = None, cwd: str | None = None,
              deliver: Deliver | None = None, preexec: Callable[[], None] | None = None) -> int:
        """Start ``argv`` with exactly ``env`` (in ``cwd``: None, ours); return its pid. ``grace``: seconds it may take
        to stop before SIGKILL; ``deliver``: how a stop signal reaches it, if not as given to the constructor;
        ``preexec``: run in the child before exec instead of :func:`die_with_parent` alone (it must call that too:
        allocstack/launch/privatenames.py ``entering``).

        :raises AllocstackError: ``prerequisite`` when it cannot be started.
        """
        self.grace = grace
        if deliver is not None:
            self._deliver = deliver
        self._started = (argv, env, cwd)
        if preexec is not None:
            self._preexec = preexec
        try:
            self.child = subprocess.Popen(argv, env=dict(env), preexec_fn=self._preexec, cwd=cwd,
                                          stderr=subprocess.PIPE if self._keep_tail else None)
        except OSError as exc:
            raise AllocstackError("prerequisite", f"cannot start {self.label} ({argv[0]}): {exc.strerror}") from exc
        self.watchdog = watchdog.start(self.child.pid, self.label, grace)
        if self.child.stderr is not None:
            self.reader = threading.Thread(target=self._copy_stderr, args=(self.child.stderr,), name="stderr",
                                           daemon=True)
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
        self.received.add(signum)
        if self.child.poll() is not None:
            if self.waiting_restart and self.stopped_by is None:  # its restart is cancelled: stopped by this signal
                self.stopped_by = signum
            return
        self.forwarded.add(signum)
        if self.stopped_by is None:
            self.stopped_by = signum
            if self.grace is not None:
                threading.Thread(target=self._kill_after_grace, args=(self.child, self.grace), name="grace",
                                 daemon=True).start()
        self._deliver(self.child, signum)

    def _kill_after_grace(self, child: subprocess.Popen[bytes], grace: float) -> None:
        try:
            child.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            self.killed = True
            child.kill()

    def wait(self, stop_when: Callable[[], bool] | None = None, restart: RestartPolicy | None = None,
             on_restart: Callable[[int, Outcome, int], None] | None = None) -> Outcome:
        """Wait for the child's end, looking for stop signals at least every :data:`SIGNAL_CHECK` seconds; with
        ``stop_when``, stop it (SIGTERM, then SIGKILL after the ``grace`` of :meth:`start`) once that says so
        (asked every :data:`STOP_CHECK` seconds). With ``restart``, a child that ended by itself is started again
        as its policy says (allocstack/launch/restart.py), and ``on_restart(restart number, how the child ended,
        new pid)`` is called after each restart; the outcome returned is the last child's.
        """
        if self.child is None:
            raise RuntimeError("wait() before start()")
        made: list[float] = []  # when each restart was made (monotonic)
        policy = restart or RestartPolicy()
        while True:
            outcome = replace(self._wait_child(stop_when), restarts=len(made))
            pause = restart_after(policy, outcome.code, self.stopping, made, time.monotonic())
            if pause is None:
                return outcome
            if outcome.status - 128 in FORWARDED_SIGNALS:
                # A stop signal to the job's whole process group may end the child before our handler runs: give
                # the handler its chance to say it was ours before starting the child again.
                pause = max(pause, SIGNAL_CHECK)
            limit = f" of at most {policy.max_attempts}" if policy.max_attempts is not None else ""
            print(f"{self.label}: {outcome.how()}; starting it again in {pause:g} s (restart {len(made) + 1}{limit}; "
                  f"{policy.describe()})", file=sys.stderr, flush=True)
            if not self._pause(pause, stop_when):
                print(f"{self.label}: not started again: the stack is stopping", file=sys.stderr, flush=True)
                return replace(self._outcome(outcome.code), restarts=len(made), cancelled_restart=True)
            argv, env, cwd = self._started or ([], {}, None)
            try:
                pid = self.start(argv, env, self.grace, cwd)
            except AllocstackError as error:
                print(f"{self.label}: {error.message}", file=sys.stderr, flush=True)
                return outcome
            made.append(time.monotonic())
            if self.received:  # a stop signal came between the pause and the start: the new child gets it too
                self._forward(min(self.received), None)
            if on_restart is not None:
                on_restart(len(made), outcome, pid)

    @property
    def stopping(self) -> bool:
        """We were asked to stop (a stop signal came, or ``stop_when`` said so): no restart follows."""
        return self.stopped_by is not None or bool(self.received)

    def _pause(self, seconds: float, stop_when: Callable[[], bool] | None) -> bool:
        """Wait ``seconds`` before a restart; False when a stop came meanwhile (the restart is cancelled)."""
        self.waiting_restart = True
        try:
            deadline = time.monotonic() + seconds
            while True:
                if stop_when is not None and not self.stopping and stop_when():
                    self._forward(signal.SIGTERM, None)
                if self.stopping:
                    return False
                left = deadline - time.monotonic()
                if left <= 0:
                    return True
                time.sleep(min(STOP_CHECK, left))
        finally:
            self.waiting_restart = False

    def _wait_child(self, stop_when: Callable[[], bool] | None) -> Outcome:
        """Wait for the current child's end (see :meth:`wait`).

        Python runs a signal's handler between two bytecodes: a signal that lands after the last look
        and before a blocking wait starts would be passed on only when the child ends (never, for a
        component waiting to be stopped). So a thread waits for the child and this one in short slices.
        """
        child = self.child
        if child is None:
            raise RuntimeError("wait() before start()")
        ended = threading.Event()
        threading.Thread(target=lambda: (child.wait(), ended.set()), name="child", daemon=True).start()
        while not ended.wait(SIGNAL_CHECK if stop_when is None else STOP_CHECK):
            if stop_when is not None and self.stopped_by is None and stop_when():
                self._forward(signal.SIGTERM, None)
        code = child.wait()
        if self.watchdog is not None:
            self.watchdog.child_ended()
        if self.reader is not None:
            self.reader.join(timeout=5)
        return self._outcome(code)

    def _outcome(self, code: int) -> Outcome:
        return Outcome(code, self.stopped_by, self.killed, list(self.tail), frozenset(self.forwarded),
                       frozenset(self.received))
