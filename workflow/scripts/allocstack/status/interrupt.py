"""Ctrl-C (or SIGTERM) in the Snakemake command that runs a stack: the run is INTERRUPTED, not failed.

Left to itself, Snakemake 9 answers SIGINT with a KeyboardInterrupt wherever its main thread is:
its jobs, which the terminal interrupted too, then end with errors it reports one by one ("Error in
rule ..." and each job's log, about 150 lines for the baseline), the end says FAILED, the exit code
is 1; a SIGINT to Snakemake's pid alone leaves its jobs running (it waits for them); and a second
Ctrl-C lands in Snakemake's own cleanup ("RuntimeError: Cannot close a running event loop").

:func:`install` (``workflow/rules/common.smk``, in the command that starts a run) takes SIGINT over:

* the first one is noted (:data:`STATE`) and said in one line; every job Snakemake runs on this
  machine gets SIGINT passed on (its launcher passes it to its component: a job the terminal
  interrupted already ignores the copy; one that only Snakemake got, with ``kill -INT PID``,
  now stops the same way), and Snakemake's scheduler is asked to stop once they ended (its own
  graceful stop, as on SIGTERM: no job is started any more, no KeyboardInterrupt lands anywhere).
  When Snakemake submits its jobs elsewhere (the Slurm executor) its own Ctrl-C handling runs
  instead: it cancels them.
* every later one is said in one line and does nothing else.
* :class:`allocstack.status.terminal.TerminalFilter` then drops what Snakemake reports about the
  jobs the interruption ended, and the command exits 130 (128 + SIGINT, as a shell reports a
  program Ctrl-C ended) instead of 1.

SIGTERM to the command (``kill PID``, a session or a batch system ending it) is the same interruption:
Snakemake's own answer is a graceful stop that waits for the running jobs, and a stack's services and
long-running workers never end by themselves, so it would wait for ever. :func:`take_sigterm` (from the
command's onstart, after Snakemake's scheduler installed its own handler) takes it over: its line says
SIGTERM, the jobs get SIGINT passed on as above, and the command exits 143 (128 + SIGTERM).

The pieces that touch Snakemake come in as functions, so the handling is tested without it.
Standard library only.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

#: The exit code of an interrupted command, as a shell reports a program that Ctrl-C ended.
EXIT_INTERRUPTED = 128 + signal.SIGINT
FIRST = ("allocstack: interrupted (Ctrl-C): stopping the run's jobs; what is done stays done, and the same "
         "command resumes\n")
#: The first line for each signal the command takes over.
FIRST_LINES = {signal.SIGINT: FIRST, signal.SIGTERM: FIRST.replace("(Ctrl-C)", "(SIGTERM)")}
AGAIN = "allocstack: interrupted already: waiting for the run's jobs to stop\n"


@dataclass
class Interruption:
    """Whether (and when) this process was interrupted, and how often."""

    at: float | None = None
    count: int = 0

    @property
    def interrupted(self) -> bool:
        return self.at is not None


#: This process's interruption (one per process: the handler and the terminal's filter share it).
STATE = Interruption()


@dataclass(frozen=True)
class Snakemake:
    """What the handler asks of the Snakemake it runs in.

    :param jobs: the processes of the jobs it runs on this machine now (their pids).
    :param scheduling: whether its scheduler runs (not while the DAG is being built).
    :param stop: asks its scheduler to start no job and end once the running ones did.
    :param local: whether its jobs run on this machine (else an executor submitted them: Slurm).
    """

    jobs: Callable[[], Iterable[int]]
    scheduling: Callable[[], bool]
    stop: Callable[[], None]
    local: Callable[[], bool]


def pass_on(pids: Iterable[int], signum: int = signal.SIGINT) -> list[int]:
    """Send ``signum`` to each of ``pids`` that still runs; return those it reached."""
    reached = []
    for pid in pids:
        try:
            os.kill(pid, signum)
        except (ProcessLookupError, PermissionError):
            continue
        reached.append(pid)
    return reached


def stop_the_run(snakemake: Snakemake) -> None:
    """What the first Ctrl-C sets going, off the signal handler (Snakemake's locks may be held where it landed)."""
    pass_on(snakemake.jobs())
    snakemake.stop()


def exits_interrupted(original: Callable[..., object] = sys.exit,
                      interrupted: int = EXIT_INTERRUPTED) -> Callable[..., object]:
    """``sys.exit`` for an interrupted command: Snakemake's ``exit(1)`` (some job did not complete: the ones the
    interruption ended) becomes ``interrupted`` (130; 143 after SIGTERM); any other code stays. Once, then it is
    ``original`` again."""

    def exit(code: object = None) -> object:
        sys.exit = original
        return original(interrupted if code == 1 else code)

    return exit


def exits_served(marker: str | os.PathLike[str], since: float, original: Callable[..., object] = sys.exit) -> bool:
    """A serving stack (config ``mode: serve``) that this command ran ended after it was up (Ctrl-C, scancel, the
    time limit): its success marker says so, and the command exits 0 whatever code Snakemake gives (its jobs were
    stopped, as a serving stack always ends). True when it did."""
    try:
        with open(marker, encoding="utf-8") as handle:
            document = json.load(handle)
        fresh = os.stat(marker).st_mtime >= since - 2
    except (OSError, ValueError):
        return False
    if not (fresh and isinstance(document, dict) and document.get("mode") == "serve"
            and document.get("status") == "success"):
        return False
    sys.exit = lambda code=None: original(0)
    return True


def handler(snakemake: Snakemake, write: Callable[[int, bytes], int] = os.write,
            clock: Callable[[], float] = time.time) -> Callable[[int, object], None]:
    """The SIGINT (and SIGTERM) handler of a Snakemake command (see the module's docstring).

    It only notes, writes (a raw write: a print could land inside one the main thread is doing) and starts
    a thread; it raises KeyboardInterrupt only where Snakemake's own handling must run: a first Ctrl-C while
    it submits its jobs elsewhere, or before it schedules anything (nothing runs yet).
    """

    def on_sigint(signum: int, frame: object) -> None:
        STATE.count += 1
        first = STATE.at is None
        if first:
            STATE.at = clock()
            sys.exit = exits_interrupted(sys.exit, 128 + signum)
        line = FIRST_LINES.get(signum, FIRST) if first else AGAIN
        try:  # on a terminal, from the start of a line (a live progress line may be drawn there)
            write(2, (("\r\033[K" if os.isatty(2) else "") + line).encode())
        except OSError:
            pass
        if not first:
            return
        if not snakemake.local() or not snakemake.scheduling():
            raise KeyboardInterrupt  # Snakemake's own: it cancels what it submitted (scancel), or nothing ran yet
        threading.Thread(target=stop_the_run, args=(snakemake,), name="interrupt", daemon=True).start()

    return on_sigint


def install(snakemake: Snakemake) -> None:
    """Take SIGINT over in this (Snakemake's main) process; once."""
    if getattr(signal.getsignal(signal.SIGINT), "allocstack", False):
        return
    on_sigint = handler(snakemake)
    on_sigint.allocstack = True  # type: ignore[attr-defined]
    signal.signal(signal.SIGINT, on_sigint)


def take_sigterm() -> None:
    """Where :func:`install` took SIGINT over (the command that starts a run), SIGTERM goes to the same handler;
    called once Snakemake's scheduler has installed its own SIGTERM handler (onstart), which this replaces."""
    on_sigint = signal.getsignal(signal.SIGINT)
    if getattr(on_sigint, "allocstack", False):
        signal.signal(signal.SIGTERM, on_sigint)
