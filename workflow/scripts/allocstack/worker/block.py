"""A job step of several workers: its worker processes, supervised as one, each keeping its identity.

``worker_block.py`` runs a node's block of per-task workers (config ``worker.per_step``) in ONE
job step, as the seed ran each in its own. What each worker was, it stays: its own process
(``worker.py``, unchanged), id, record (``results/<run>/workers/<step>/<worker>.json``), log
(``logs/run_workers/<run>/<worker>.log``), event log and leases at the coordinator. What the
step adds is supervision (:class:`Members`, no I/O but the processes it is given):

* a worker killed by a signal the step did not send (``kill -9``, the OOM killer) is started
  again, after a pause that doubles each time, at most :data:`MAX_RESTARTS` times; its leases
  expire as ever and the other workers finish those tasks; past the bound it is recorded
  ``killed`` and the others go on;
* a worker that exits with an error (its coordinator unreachable, its token refused, no work
  for ``--wait-timeout``) fails the step as it would have failed its own: the others are
  stopped and the step ends with that worker's exit code;
* the signals that end a job step are passed on to every worker, and the step ends with them.
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum

#: Times a worker killed from outside is started again before it is recorded killed.
MAX_RESTARTS = 3
#: Seconds before the first restart of a worker; doubled at each further one.
RESTART_PAUSE = 0.5


class Fate(Enum):
    """What becomes of a worker process that ended."""

    DONE = "done"  # exited 0: its record is its own
    RESTART = "restart"  # killed from outside: started again
    KILLED = "killed"  # killed from outside too often: recorded killed, the others go on
    STOPPED = "stopped"  # ended after the step passed a stop signal on
    FAILED = "failed"  # exited with an error: the step fails


def fate(code: int, stopping: bool, restarts: int, max_restarts: int = MAX_RESTARTS) -> Fate:
    """The fate of a worker process that ended with ``code`` (Popen's: negative = killed by that signal)."""
    if stopping:
        return Fate.DONE if code == 0 else Fate.STOPPED
    if code == 0:
        return Fate.DONE
    if code < 0:
        return Fate.RESTART if restarts < max_restarts else Fate.KILLED
    return Fate.FAILED


def restart_pause(restarts: int) -> float:
    """Seconds before the ``restarts``-th restart (1 = the first)."""
    return RESTART_PAUSE * 2 ** (restarts - 1)


@dataclass
class Member:
    """One worker of the step: its id, and what became of its process so far."""

    worker: str
    pid: int | None = None
    starts: int = 0
    restarts: int = 0
    #: How it ended for good (None while it runs or waits to be started again).
    fate: Fate | None = None
    code: int | None = None


@dataclass
class Members:
    """The step's workers and the supervision policy over them (processes are started and signalled through the
    callables it is given, so the policy is tested without any).

    :param start: starts a worker's process (its id, whether it is a restart); returns its pid.
    :param send: sends a signal to a pid.
    :param log: the step's log.
    """

    workers: list[str]
    start: Callable[[str, bool], int]
    send: Callable[[int, int], None]
    log: Callable[[str], None]
    max_restarts: int = MAX_RESTARTS
    members: dict[str, Member] = field(init=False)
    by_pid: dict[int, Member] = field(init=False, default_factory=dict)
    #: The first stop signal passed on to every worker (None: none).
    stopped_by: int | None = None
    #: The worker whose error fails the step, and its exit code.
    failed: Member | None = None

    def __post_init__(self) -> None:
        self.members = {worker: Member(worker) for worker in self.workers}

    def launch(self, member: Member) -> None:
        restart = member.starts > 0
        member.pid = self.start(member.worker, restart)
        member.starts += 1
        self.by_pid[member.pid] = member

    def start_all(self) -> None:
        for member in self.members.values():
            self.launch(member)

    @property
    def running(self) -> list[Member]:
        return [member for member in self.members.values() if member.pid is not None]

    @property
    def finished(self) -> bool:
        return all(member.fate is not None for member in self.members.values())

    def stop(self, signum: int) -> None:
        """Pass ``signum`` on to every running worker; none is started again from now on."""
        if self.stopped_by is None:
            self.stopped_by = signum
        for member in self.running:
            self.send(member.pid, signum)
        for member in self.members.values():
            if member.fate is None and member.pid is None:  # waiting for its restart: it stays ended
                member.fate = Fate.STOPPED

    def ended(self, pid: int, code: int) -> Member | None:
        """The process ``pid`` ended with ``code``: decide its worker's fate. Returns the member to start again
        (after :func:`restart_pause`), or None."""
        member = self.by_pid.pop(pid, None)
        if member is None:
            return None
        member.pid, member.code = None, code
        outcome = fate(code, self.stopped_by is not None, member.restarts, self.max_restarts)
        how = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exited {code}"
        if outcome is Fate.RESTART:
            member.restarts += 1
            self.log(f"{member.worker} was {how} from outside; started again ({member.restarts} of at most "
                     f"{self.max_restarts}); the tasks it held go back to the queue when their lease expires")
            return member
        member.fate = outcome
        if outcome is Fate.KILLED:
            self.log(f"{member.worker} was {how} from outside {member.restarts + 1} times; recorded killed, the "
                     "other workers go on")
        elif outcome is Fate.FAILED:
            self.log(f"{member.worker} {how}: the step fails")
            if self.failed is None:
                self.failed = member
                self.stop(signal.SIGTERM)
        return None

    def exit_code(self) -> int:
        """The step's exit code once every worker ended: the failed worker's, 128 + the stop signal, or 0."""
        if self.failed is not None and self.failed.code is not None:
            return self.failed.code
        if self.stopped_by is not None and any(m.fate is Fate.STOPPED for m in self.members.values()):
            return 128 + self.stopped_by
        return 0
