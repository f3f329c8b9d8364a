"""The coordinator's state machine, free of I/O so it can be tested directly.

Every task is ``pending``, ``leased`` (claimed by a worker until a deadline),
``done`` (its result accepted) or ``failed`` (its handler failed ``max_attempts``
times; a failure before that puts it back in the queue). A lease that is not finished or renewed by a
heartbeat before its deadline returns the task to the queue. The first valid
result for a task wins; every later one is rejected idempotently (409), so each
task appears exactly once whatever workers die or come back late.

Results are accepted in two steps so the board never runs ahead of the journal:
:meth:`stage` checks a batch (shape, state, digest) and reserves its tasks;
:meth:`commit` marks them done once the journal has them on disk, :meth:`abort`
releases them when it could not. The claim policy lives here too: a claim gets
at most a fair share of what is pending, and none once claims are closed
(draining, a storage fault) or a lease would outlast the allocation, and a
share stays held back for each expected worker that has had none yet.

All operations are O(1) per task touched; :meth:`expire` scans only the live
leases (at most workers x batch size). Times are the caller's monotonic clock.
"""

from __future__ import annotations

import math
import re
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from .jsonio import sha256_text
from .taskset import SHA256_PATTERN, TASK_ID_PATTERN

PENDING, LEASED, DONE, FAILED = 0, 1, 2, 3
WORKER_ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
MAX_OUTPUT_CHARS = 16 << 20
ALLOCATION_ENDING = "less than one lease remains before the allocation ends"


@dataclass
class Lease:
    worker: str
    deadline: float


@dataclass(slots=True)
class WorkerStats:
    """What one worker did: tasks claimed and completed, results rejected, when it was last heard from."""

    claimed: int = 0
    completed: int = 0
    rejected: int = 0
    last_seen: float = 0.0


@dataclass
class Verdict:
    """The outcome of one submitted result: HTTP-like ``code`` and a short ``reason``."""

    task_id: str | None
    code: int
    reason: str

    @property
    def accepted(self) -> bool:
        return self.code == 201


@dataclass
class Claim:
    """The answer to a claim: ``task`` (with ``tasks``), ``wait``, ``done``, or ``stop`` with a ``reason``."""

    status: str
    tasks: list[dict[str, Any]] = field(default_factory=list)
    reason: str = ""
    #: The worker's first granted claim (the coordinator logs a ``first-claim`` event).
    first: bool = False


@dataclass
class TaskBoard:
    tasks: list[dict[str, Any]]
    lease_seconds: float
    max_attempts: int = 3
    #: Workers expected to share the tasks (the claim policy, :func:`fair_share`).
    expected_workers: int = 1
    #: No claim is granted when its lease would end after this time (the allocation's end).
    claims_until: float = math.inf
    #: Why claims are closed ("" while they are open); the first reason stays.
    closed: str = ""
    #: (tasks held back for each worker with no work yet, until when), set at the first claim.
    reservation: tuple[int, float] | None = None
    workers_with_work: int = 0
    #: A claim was refused because the allocation ends within a lease (the end record says so).
    allocation_ending: bool = False
    by_id: dict[str, dict[str, Any]] = field(init=False)
    state: dict[str, int] = field(init=False)
    pending: deque[str] = field(init=False)
    leases: dict[str, Lease] = field(default_factory=dict)
    grants: dict[str, int] = field(default_factory=dict)
    results: dict[str, dict[str, Any]] = field(default_factory=dict)
    attempts: dict[str, int] = field(default_factory=dict)
    failures: dict[str, str] = field(default_factory=dict)
    workers: dict[str, WorkerStats] = field(default_factory=dict)
    #: Tasks whose result is being written to the journal (staged, not yet committed).
    committing: set[str] = field(default_factory=set)
    expired_leases: int = 0
    restored: int = 0

    def __post_init__(self) -> None:
        self.by_id = {task["id"]: task for task in self.tasks}
        self.state = dict.fromkeys(self.by_id, PENDING)
        self.pending = deque(self.by_id)

    # -- queries -------------------------------------------------------------
    @property
    def complete(self) -> bool:
        return len(self.results) == len(self.by_id)

    @property
    def finished(self) -> bool:
        """Nothing left to hand out or wait for: every task is done or has failed for good."""
        return len(self.results) + len(self.failures) == len(self.by_id)

    def counts(self) -> dict[str, int]:
        done, failed, leased = len(self.results), len(self.failures), len(self.leases)
        return {"total": len(self.by_id), "pending": len(self.by_id) - done - failed - leased, "leased": leased,
                "done": done, "failed": failed}

    def sorted_results(self) -> list[dict[str, Any]]:
        return [self.results[task_id] for task_id in sorted(self.results)]

    def _seen(self, worker: str, now: float) -> WorkerStats:
        stats = self.workers.get(worker)
        if stats is None:
            stats = self.workers[worker] = WorkerStats()
        stats.last_seen = now
        return stats

    # -- transitions ---------------------------------------------------------
    def restore(self, results: list[dict[str, Any]]) -> int:
        """Mark journaled results done (resume); returns how many were restored."""
        for result in results:
            task_id = result.get("taskId")
            if self.state.get(task_id) == PENDING:
                self.state[task_id] = DONE
                self.results[task_id] = result
                self.restored += 1
        return self.restored

    def close_claims(self, reason: str) -> None:
        """Grant no more claims (draining, a storage fault); the first reason is the one reported."""
        self.closed = self.closed or reason

    def share(self, stats: WorkerStats, max_tasks: int, now: float) -> int:
        """How many tasks this claim may take (see :func:`fair_share`); 0 = wait.

        The reservation for workers that have had no work yet is fixed at the first claim and
        lapses one lease later: a worker that never comes holds back work no longer than a
        worker that died holding it.
        """
        pending = len(self.by_id) - len(self.results) - len(self.failures) - len(self.leases)
        if self.reservation is None:
            self.reservation = (pending // self.expected_workers, now + self.lease_seconds)
        reserve_each = self.reservation[0] if now < self.reservation[1] else 0
        newcomer = stats.claimed == 0
        waiting = max(0, self.expected_workers - self.workers_with_work - newcomer)
        return fair_share(max_tasks, pending, self.expected_workers, newcomer=newcomer, waiting=waiting,
                          reserve_each=reserve_each)

    def claim(self, worker: str, max_tasks: int, now: float) -> Claim:
        """Lease up to a fair share of ``max_tasks`` pending tasks to ``worker``, or say why not."""
        if self.closed:
            return Claim("stop", reason=self.closed)
        if now + self.lease_seconds > self.claims_until:
            self.allocation_ending = True
            return Claim("stop", reason=ALLOCATION_ENDING)
        stats = self._seen(worker, now)
        wanted = self.share(stats, max_tasks, now)
        granted: list[dict[str, Any]] = []
        while self.pending and len(granted) < wanted:
            task_id = self.pending.popleft()
            if self.state[task_id] != PENDING:
                continue  # lazily dropped: done by a late result after its lease expired
            self.state[task_id] = LEASED
            self.leases[task_id] = Lease(worker, now + self.lease_seconds)
            self.grants[task_id] = self.grants.get(task_id, 0) + 1
            granted.append(self.by_id[task_id])
        if granted:
            first = stats.claimed == 0
            self.workers_with_work += first
            stats.claimed += len(granted)
            return Claim("task", granted, first=first)
        return Claim("done") if self.finished else Claim("wait")

    def check(self, result: Any) -> Verdict:
        """Validate one result's shape and state without changing anything."""
        if not isinstance(result, dict):
            return Verdict(None, 400, "a result must be a JSON object")
        task_id = result.get("taskId")
        if not isinstance(task_id, str) or not TASK_ID_PATTERN.match(task_id):
            return Verdict(None, 400, "taskId is missing or malformed")
        unknown = set(result) - {"taskId", "workerId", "output", "sha256"}
        if unknown:
            return Verdict(task_id, 400, f"unknown key {min(unknown)!r}")
        output, digest = result.get("output"), result.get("sha256")
        if not isinstance(output, str) or len(output) > MAX_OUTPUT_CHARS:
            return Verdict(task_id, 400, "output must be a string")
        if not isinstance(digest, str) or not SHA256_PATTERN.match(digest):
            return Verdict(task_id, 400, "sha256 must be 64 lowercase hex digits")
        if task_id not in self.state:
            return Verdict(task_id, 409, "unknown task")
        if self.state[task_id] == DONE or task_id in self.committing:
            return Verdict(task_id, 409, "duplicate: the task already has a result")
        if task_id not in self.grants:
            return Verdict(task_id, 409, "unclaimed: the task was never handed out")
        if sha256_text(output) != digest:
            return Verdict(task_id, 400, "sha256 is not the digest of output")
        return Verdict(task_id, 201, "accepted")

    def stage(self, worker: str, results: list[Any], now: float) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """Check ``results`` and reserve the tasks of the good ones for :meth:`commit`.

        :returns: (the records to journal, ``{"taskId", "code", "reason"}`` for each rejected result).
        """
        stats = self._seen(worker, now)
        staged: list[dict[str, Any]] = []
        rejected: list[dict[str, Any]] = []
        for result in results:
            verdict = self.check(result)
            if not verdict.accepted:
                stats.rejected += 1
                rejected.append({"taskId": verdict.task_id, "code": verdict.code, "reason": verdict.reason})
                continue
            self.committing.add(verdict.task_id)
            staged.append({"taskId": verdict.task_id, "workerId": worker, "output": result["output"],
                           "sha256": result["sha256"]})
        return staged, rejected

    def commit(self, staged: list[dict[str, Any]], now: float) -> None:
        """The journal holds ``staged`` durably: their tasks are done."""
        for record in staged:
            task_id = record["taskId"]
            self.committing.discard(task_id)
            self.state[task_id] = DONE
            self.leases.pop(task_id, None)
            self.results[task_id] = record
            self._seen(record["workerId"], now).completed += 1

    def abort(self, staged: list[dict[str, Any]]) -> None:
        """The journal could not store ``staged``: nothing of them was accepted."""
        for record in staged:
            self.committing.discard(record["taskId"])

    def heartbeat(self, worker: str, task_ids: list[str], now: float) -> list[str]:
        """Extend ``worker``'s leases on ``task_ids``; return the ids it still holds."""
        self._seen(worker, now)
        held = []
        for task_id in task_ids:
            lease = self.leases.get(task_id)
            if lease is not None and lease.worker == worker:
                lease.deadline = now + self.lease_seconds
                held.append(task_id)
        return held

    def fail(self, worker: str, task_id: str, reason: str, now: float) -> str:
        """The task's handler failed on ``worker``: requeue it (at the back), or fail it for good.

        :returns: ``"requeued"``, ``"failed"``, or ``"ignored"`` when ``worker`` does not hold its lease.
        """
        lease = self.leases.get(task_id)
        if lease is None or lease.worker != worker or task_id in self.committing:
            return "ignored"
        del self.leases[task_id]
        self._seen(worker, now)
        self.attempts[task_id] = self.attempts.get(task_id, 0) + 1
        if self.attempts[task_id] >= self.max_attempts:
            self.state[task_id] = FAILED
            self.failures[task_id] = reason
            return "failed"
        self.state[task_id] = PENDING
        self.pending.append(task_id)
        return "requeued"

    def expire(self, now: float) -> list[str]:
        """Return overdue leased tasks to the FRONT of the queue; returns their ids."""
        overdue = [task_id for task_id, lease in self.leases.items() if lease.deadline <= now]
        for task_id in reversed(overdue):
            del self.leases[task_id]
            self.state[task_id] = PENDING
            self.pending.appendleft(task_id)
        self.expired_leases += len(overdue)
        return overdue


def fair_share(max_tasks: int, pending: int, workers: int, *, newcomer: bool = False, waiting: int = 0,
               reserve_each: int = 0) -> int:
    """How many tasks one claim may take (0 = wait).

    At most an equal share of what is pending (``ceil(pending / workers)``), so a big batch
    never starves the other workers. While some expected workers have had no work yet
    (``waiting`` of them, not counting this one), ``reserve_each`` tasks stay held back for
    each of them; a ``newcomer`` (its first grant) may take its own reserved share at once.
    So with as many tasks as workers, every worker gets work, however late it starts.

    :param max_tasks: what the worker asked for (its batch size).
    :param reserve_each: ``tasks // workers`` at the first grant; 0 once the reservation lapsed.
    """
    share = -(-pending // max(workers, 1))
    if newcomer:
        share = max(share, reserve_each)
    share = min(share, pending - waiting * reserve_each)
    return max(0, min(max_tasks, share))
