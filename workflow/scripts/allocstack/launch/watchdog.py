"""Nothing a component started outlives it: the watchdog beside each supervised child.

The supervisor's parent-death signal (``PR_SET_PDEATHSIG``, allocstack/launch/supervise.py) kills only its
DIRECT child. When Snakemake SIGKILLs a failed run's other jobs on this machine, that child's own children
survive: uvicorn ``--reload``'s server process (a multiprocessing child) kept the service's port. Under Slurm
the job step's process tracking ends them; locally nothing did. So :meth:`Supervised.start` starts this
watchdog (:func:`start`) beside its child:

* in its own session (``setsid``), so whatever kills the job's process group does not kill it; it ignores
  the signals that end a job (:data:`lifeline.FORWARDED_SIGNALS`: Ctrl-C, Slurm's or Snakemake's stop), which
  reach the child as before: the child's process group and session are not touched;
* holding the read end of a pipe whose write end only the supervisor holds (close-on-exec: the child does not
  get it). The pipe's end (EOF) is its one message: the supervisor closes it when the child ended
  (:meth:`Watchdog.child_ended`, which then waits for the watchdog to end: when the supervisor goes on, nothing
  of its child runs any more), and the kernel closes it when the supervisor died, SIGKILL included;
* while the pipe is open, every :data:`SCAN` seconds it records the child's descendants
  (``/proc/PID/task/*/children``, recursively, from the child and from every process recorded before, so a
  daemon's orphaned children are kept too), each with its start time (``/proc/PID/stat`` field 22): a
  process is only ever signalled while its pid still has the recorded start time (never a reused pid);
* at EOF it records once more, sends SIGTERM to every recorded process still running, gives them ``grace``
  seconds (the component's stop grace, else :data:`GRACE`), SIGKILLs what is left, writes one line to the
  component's log when it stopped something, and exits.

Other watchdogs (a supervisor inside the child: launch.py runs app_service.py) are never recorded: each ends
by itself once its own cleanup is done. A process that appears and daemonizes faster than one scan (or before
the watchdog's first one, about 50 ms after the child started) is not seen. Standard library only.
"""

from __future__ import annotations

import os
import select
import signal
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING

from .lifeline import FORWARDED_SIGNALS
from .procfs import child_pids, running_start

if TYPE_CHECKING:
    import argparse
    import subprocess

MODULE = "allocstack.launch.watchdog"
#: Seconds between two records of the child's descendants.
SCAN = 0.5
#: Seconds a leftover process gets between SIGTERM and SIGKILL when the component has no stop grace.
GRACE = 5.0
#: Seconds the supervisor waits for its watchdog at the child's end beyond the grace (its last record, SIGKILL).
END_SLACK = 10.0
#: Seconds the child gets to die of its parent-death signal after the supervisor died, before it is signalled too.
SETTLE = 0.5
#: Seconds between two looks whether the signalled processes are gone.
POLL = 0.05
#: pid -> its start time (clock ticks since boot).
Tree = dict[int, int]
StartOf = Callable[[int], "int | None"]


def is_watchdog(pid: int) -> bool:
    """Whether process ``pid`` is a watchdog (of a supervisor inside the child)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            return MODULE.encode() in handle.read().split(b"\0")
    except OSError:
        return False


def still_running(recorded: Mapping[int, int], now: Mapping[int, int | None]) -> list[int]:
    """The recorded processes still running: their pid has the recorded start time now (a pid reused by a later
    process has another one)."""
    return sorted(pid for pid, start in recorded.items() if now.get(pid) == start)


def record(tree: Mapping[int, int], start_of: StartOf = running_start,
           children_of: Callable[[int], Iterable[int]] = child_pids,
           skip: Callable[[int], bool] = is_watchdog) -> Tree:
    """The processes of ``tree`` still running and all their descendants, each with its start time."""
    found: Tree = {pid: tree[pid] for pid in still_running(tree, {pid: start_of(pid) for pid in tree})}
    todo = list(found)
    while todo:
        for child in children_of(todo.pop()):
            start = start_of(child) if child not in found else None
            if start is not None and not skip(child):
                found[child] = start
                todo.append(child)
    return found


def signal_all(pids: Iterable[int], signum: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, signum)
        except (ProcessLookupError, PermissionError):
            continue


def stop(tree: Mapping[int, int], grace: float, start_of: StartOf = running_start) -> tuple[list[int], list[int]]:
    """SIGTERM to every process of ``tree`` still running, SIGKILL to those still running ``grace`` seconds later;
    (the pids signalled, the pids killed)."""
    targets = still_running(tree, {pid: start_of(pid) for pid in tree})
    signal_all(targets, signal.SIGTERM)
    deadline = time.monotonic() + grace
    left = targets
    while left and time.monotonic() < deadline:
        time.sleep(POLL)
        left = still_running({pid: tree[pid] for pid in left}, {pid: start_of(pid) for pid in left})
    signal_all(left, signal.SIGKILL)
    return targets, left


def report(label: str, stopped: list[int], killed: list[int]) -> str:
    """The one line for the component's log."""
    plural = "process" if len(stopped) == 1 else "processes"
    line = f"watchdog: stopped {len(stopped)} leftover {plural} of {label}: pids {' '.join(map(str, stopped))}"
    return line + (f" (SIGKILL: {' '.join(map(str, killed))})" if killed else "")


def watch(fd: int, pid: int, start: int, grace: float, label: str, period: float = SCAN) -> list[int]:
    """Record ``pid``'s descendants until ``fd`` reaches its end, then stop them (:func:`stop`); the pids stopped."""
    tree: Tree = {pid: start}
    while True:
        tree = record(tree)
        ready, _, _ = select.select([fd], [], [], period)
        if ready and not os.read(fd, 512):
            break
    # The supervisor died: the parent-death signal (SIGKILL) is on its way to the child; let it land, so that the
    # child is stopped (and named) only where that signal does not reach it (a set-user-ID runtime).
    deadline = time.monotonic() + SETTLE
    while running_start(pid) == start and time.monotonic() < deadline:
        time.sleep(POLL)
    stopped, killed = stop(record(tree), grace)
    if stopped:
        print(report(label, stopped, killed), file=sys.stderr, flush=True)
    return stopped


class Watchdog:
    """The supervisor's side: the write end of the watchdog's pipe, and the watchdog process."""

    def __init__(self, fd: int, process: subprocess.Popen[bytes], grace: float) -> None:
        self.fd: int | None = fd
        self.process = process
        self.grace = grace

    def child_ended(self) -> None:
        """Close our end and wait for the watchdog: it stops what the child left running (at once when it left
        nothing; at most its grace, and a moment, when something ignores SIGTERM), and exits. So when the
        supervisor goes on, nothing of its child runs any more."""
        import subprocess

        if self.fd is None:
            return
        os.close(self.fd)
        self.fd = None
        try:
            self.process.wait(timeout=self.grace + END_SLACK)
        except subprocess.TimeoutExpired:  # it ends by itself; the supervisor does not wait longer
            pass


def start(pid: int, label: str, grace: float | None) -> Watchdog | None:
    """Start the watchdog of child ``pid`` (just started, not yet waited for: its pid is not reused); None, with a
    line on stderr, when it cannot be started (the child runs on without it)."""
    import subprocess  # here: the watchdog process itself does without (its memory: docs/performance.md)

    start_time = running_start(pid)
    if start_time is None:  # it ended already: its children were seen by nobody
        return None
    reading, writing = os.pipe()  # both close-on-exec: the child, started before, has neither
    scripts = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [scripts, os.environ.get("PYTHONPATH")]))}
    grace = GRACE if grace is None else grace
    argv = [sys.executable, "-m", MODULE, "--fd", str(reading), "--pid", str(pid), "--start", str(start_time),
            "--grace", str(grace), "--label", label]
    try:
        process = subprocess.Popen(argv, env=env, cwd="/", stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                   pass_fds=(reading,), start_new_session=True)
    except OSError as exc:
        os.close(writing)
        print(f"{label}: no watchdog ({exc.strerror}): processes it leaves may outlive it", file=sys.stderr,
              flush=True)
        return None
    finally:
        os.close(reading)
    return Watchdog(writing, process, grace)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fd", type=int, required=True, help="the read end of the supervisor's pipe")
    parser.add_argument("--pid", type=int, required=True, help="the supervised child")
    parser.add_argument("--start", type=int, required=True, help="the child's start time (/proc/PID/stat field 22)")
    parser.add_argument("--grace", type=float, default=GRACE, help="seconds between SIGTERM and SIGKILL")
    parser.add_argument("--label", required=True, help="the component, as its log names it")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    for signum in FORWARDED_SIGNALS:  # they end the job's programs; this one ends at the pipe's end
        signal.signal(signum, signal.SIG_IGN)
    watch(args.fd, args.pid, args.start, args.grace, args.label)
    return 0


if __name__ == "__main__":
    sys.exit(main())
