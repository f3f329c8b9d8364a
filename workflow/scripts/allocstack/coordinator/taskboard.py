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
releases them when it could not. A worker's batch for consecutive tasks, every
result good (the usual case), takes :meth:`stage_run` and :meth:`commit_run`: the
same checks and the same state, a few operations over the whole batch instead of
several per result. The claim policy lives here too: a claim gets
at most a fair share of the unfinished work (no more than is pending), and none once claims are closed
(draining, a storage fault) or a lease would outlast the allocation, and a
share stays held back for each expected worker that has had none yet.

Memory: a task is its position in the :class:`TaskSet` (ids and raw payload bytes);
its state is one byte, its result its output's JSON text (as results.json and the
journal write it), 32 digest bytes and a worker number, so a task and its result cost
their own bytes and about 30 more, whatever the ids' order or text (no object per task
or per field). A claim's tasks share one lease.

All operations are O(1) per task touched; :meth:`expire` scans only the live
leases (at most workers x batch size). Times are the caller's monotonic clock.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from array import array
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from itertools import accumulate, compress, islice, repeat
from json.encoder import encode_basestring_ascii
from operator import add, methodcaller
from typing import Any

from .. import SCHEMA_VERSION
from ..common.jsonio import RESULT_ENTRY, results_document_entries, sha256_text
from ..common.taskset import SHA256_PATTERN, TASK_ID_PATTERN, TaskSet

PENDING, LEASED, DONE, FAILED = 0, 1, 2, 3
WORKER_ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
MAX_OUTPUT_CHARS = 16 << 20
ALLOCATION_ENDING = "less than one lease remains before the allocation ends"
#: results.json entries encoded per chunk (see :meth:`TaskBoard.result_rows`).
RESULTS_CHUNK = 4096
_DONE_BYTE, _LEASED_BYTE, _ONE = bytes([DONE]), bytes([LEASED]), b"\x01"
#: :data:`RESULT_ENTRY` around its four values, for a digest and a task id given bare (neither has a
#: character JSON escapes); and what separates two entries.
_ENTRY = RESULT_ENTRY.replace(b'"sha256": %s', b'"sha256": "%s"').replace(b'"taskId": %s', b'"taskId": "%s"').split(b"%s")
_ENTRY_SEPARATOR = _ENTRY[4] + b",\n" + _ENTRY[0]
_hexdigest = methodcaller("hexdigest")


@dataclass(slots=True)
class Lease:
    worker: str
    deadline: float


@dataclass(slots=True)
class WorkerStats:
    """What one worker did: tasks claimed and completed, results rejected, when it was last heard from,
    and the node it said it runs on (None: it did not say; one node)."""

    claimed: int = 0
    completed: int = 0
    rejected: int = 0
    last_seen: float = 0.0
    node: str | None = None


@dataclass
class Verdict:
    """The outcome of one submitted result: HTTP-like ``code`` and a short ``reason``."""

    task_id: str | None
    code: int
    reason: str

    @property
    def accepted(self) -> bool:
        return self.code == 201


_RESULT_KEYS = frozenset({"taskId", "workerId", "output", "sha256"})
_ACCEPTED = Verdict(None, 201, "accepted")


@dataclass(slots=True)
class Staged:
    """An accepted result on its way to the journal: the task's position and the result's fields."""

    position: int
    task_id: str
    worker: str
    output: str
    sha256: str


@dataclass(slots=True)
class StagedRun:
    """A batch staged by :meth:`TaskBoard.stage_run`: results for the ``count`` consecutive positions ``start`` on,
    every one accepted, by ``worker``. Their outputs and digests are already in the board's stores (the decoded
    batch need not wait for the journal); they become the tasks' results at :meth:`TaskBoard.commit_run`."""

    start: int
    count: int
    worker: str


@dataclass
class Claim:
    """The answer to a claim: ``task`` (with the granted tasks' ``positions``), ``wait``, ``done``, or ``stop``
    with a ``reason``."""

    status: str
    positions: list[int] | range = field(default_factory=list)
    reason: str = ""
    #: The worker's first granted claim (the coordinator logs a ``first-claim`` event).
    first: bool = False


@dataclass
class TaskBoard:
    tasks: TaskSet
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
    #: Each task's state (PENDING, LEASED, DONE, FAILED) by position.
    state: bytearray = field(init=False)
    #: The queue: ``front`` (leases that expired), then positions from ``cursor`` on (never handed
    #: out), then ``back`` (handlers that failed and get another attempt).
    front: deque[int] = field(init=False, default_factory=deque)
    cursor: int = 0
    back: deque[int] = field(init=False, default_factory=deque)
    leases: dict[int, Lease] = field(default_factory=dict)
    #: 1 for each task ever handed out.
    granted: bytearray = field(init=False)
    attempts: dict[int, int] = field(default_factory=dict)
    failures: dict[str, str] = field(default_factory=dict)
    workers: dict[str, WorkerStats] = field(default_factory=dict)
    #: 1 for each task whose result is being written to the journal (staged, not yet committed).
    committing: bytearray = field(init=False)
    expired_leases: int = 0
    restored: int = 0
    #: Results by position: the output as JSON text (``encode_basestring_ascii``: ASCII, quoted, in one
    #: growing blob, at ``output_at`` for ``output_size`` bytes: no string object per result), the SHA-256
    #: (32 bytes at 32 * position), the worker's number.
    outputs: bytearray = field(init=False, default_factory=bytearray)
    output_at: array = field(init=False)
    output_size: array = field(init=False)
    digests: bytearray = field(init=False)
    result_worker: array = field(init=False)
    worker_names: list[str] = field(default_factory=lambda: [""])
    worker_numbers: dict[str, int] = field(default_factory=dict)
    done: int = 0

    def __post_init__(self) -> None:
        count = len(self.tasks)
        self.state = bytearray(count)
        self.granted = bytearray(count)
        self.committing = bytearray(count)
        self.output_at = array("Q", bytes(8 * count))
        self.output_size = array("I", bytes(4 * count))
        self.digests = bytearray(32 * count)
        self.result_worker = array("I", bytes(4 * count))

    # -- queries -------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.state)

    @property
    def complete(self) -> bool:
        return self.done == len(self.state)

    @property
    def finished(self) -> bool:
        """Nothing left to hand out or wait for: every task is done or has failed for good."""
        return self.done + len(self.failures) == len(self.state)

    def counts(self) -> dict[str, int]:
        done, failed, leased = self.done, len(self.failures), len(self.leases)
        return {"total": len(self.state), "pending": len(self.state) - done - failed - leased, "leased": leased,
                "done": done, "failed": failed}

    def result(self, task_id: str) -> dict[str, str] | None:
        """The accepted result of ``task_id`` as results.json holds it, or None."""
        position = self.tasks.position(task_id)
        if position is None or self.state[position] != DONE:
            return None
        return {"output": self.output(position), "sha256": self.digests[32 * position:32 * position + 32].hex(),
                "taskId": task_id, "workerId": self.worker_names[self.result_worker[position]]}

    def output(self, position: int) -> str:
        start = self.output_at[position]
        return json.loads(self.outputs[start:start + self.output_size[position]])

    def done_in_id_order(self) -> Iterator[tuple[range | None, range | array | list[int]]]:
        """The tasks with a result, by ascending task id, a chunk at a time: their ranks by ascending id (a
        :class:`range`) when every task of the chunk has one (the usual case), else None; and their positions.

        No list of a million positions to sort: the task set keeps its positions in id order (and
        when its ids ascend, a chunk's positions are a :class:`range`).
        """
        state, count, tasks = self.state, len(self.state), self.tasks
        for start in range(0, count, RESULTS_CHUNK):
            end = min(count, start + RESULTS_CHUNK)
            positions = tasks.in_id_order(start, end)
            states = state[start:end] if type(positions) is range else bytes(map(state.__getitem__, positions))
            if states.count(DONE) == end - start:
                yield range(start, end), positions
            else:
                yield None, list(compress(positions, map(DONE.__eq__, states)))

    def pending_ids(self) -> Iterator[str]:
        """The ids of the tasks that have no result yet."""
        state, task_id = self.state, self.tasks.task_id
        return (task_id(position) for position in range(len(state)) if state[position] != DONE)

    def result_entries(self) -> Iterator[bytes]:
        """results.json's entries (:data:`RESULT_ENTRY`, joined by ",\\n"), in task id order, a chunk at a time:
        a few operations per chunk, each over all of its results (the stored output is its JSON text). Ids
        that ascend in task order make a chunk's values a slice of each store; others are gathered from where
        their tasks are (a C call or two a value; memory latency bounds it: about 1.2 s of a shuffled
        million's 1.9) and the chunk joined once. The values are copied out of the stores, never views of
        them: results.json is written in a thread while a late result (for a task that failed for good) may
        still grow them."""
        tasks, at, size, workers = self.tasks, self.output_at, self.output_size, self.result_worker
        names = [encode_basestring_ascii(name).encode("ascii") for name in self.worker_names]
        blob, digests = self.outputs, self.digests
        for ranks, positions in self.done_in_id_order():
            if not positions:
                continue
            chunk_ids = tasks.ranked_ids(ranks.start, ranks.stop) if ranks is not None else tasks.ids_at(positions)
            if type(positions) is range:
                start, end = positions.start, positions.stop
                starts, numbers = at[start:end], workers[start:end]
                outputs = map(blob.__getitem__, map(slice, starts, map(add, starts, size[start:end])))
                hexes = digests[32 * start:32 * end].hex().encode("ascii")
                digest = map(hexes.__getitem__, map(slice, range(0, len(hexes), 64), range(64, len(hexes) + 64, 64)))
                yield _ENTRY[0] + _ENTRY_SEPARATOR.join(map(b"".join, zip(
                    outputs, repeat(_ENTRY[1]), digest, repeat(_ENTRY[2]), chunk_ids, repeat(_ENTRY[3]),
                    map(names.__getitem__, numbers), strict=False))) + _ENTRY[4]  # (repeat() never ends)
            else:  # gathered (list comprehensions: fewer objects a value than chains of maps), one join
                count = len(positions)
                hexes = b"".join([digests[32 * p:32 * p + 32] for p in positions]).hex().encode("ascii")
                parts = [_ENTRY_SEPARATOR, b"", _ENTRY[1], b"", _ENTRY[2], b"", _ENTRY[3], b""] * count
                parts[0] = _ENTRY[0]
                parts[1::8] = [blob[at[p]:at[p] + size[p]] for p in positions]
                parts[3::8] = map(hexes.__getitem__, map(slice, range(0, 64 * count, 64),
                                                         range(64, 64 * count + 64, 64)))
                parts[5::8] = chunk_ids
                parts[7::8] = map(names.__getitem__, map(workers.__getitem__, positions))
                parts.append(_ENTRY[4])
                yield b"".join(parts)

    def results_json(self) -> Iterator[bytes]:
        """results.json, in chunks: ``{"results": [...], "schemaVersion": 1}`` sorted by task id (see
        :func:`results_document_entries`)."""
        return results_document_entries({"schemaVersion": SCHEMA_VERSION}, self.result_entries())

    def _seen(self, worker: str, now: float) -> WorkerStats:
        stats = self.workers.get(worker)
        if stats is None:
            stats = self.workers[worker] = WorkerStats()
        stats.last_seen = now
        return stats

    def _number(self, worker: str) -> int:
        number = self.worker_numbers.get(worker)
        if number is None:
            number = self.worker_numbers[worker] = len(self.worker_names)
            self.worker_names.append(worker)
        return number

    def _record(self, position: int, worker: str, output: str, sha256: str) -> None:
        self.state[position] = DONE
        self.output_at[position] = len(self.outputs)
        self.outputs += encode_basestring_ascii(output).encode("ascii")
        self.output_size[position] = len(self.outputs) - self.output_at[position]
        self.digests[32 * position:32 * position + 32] = bytes.fromhex(sha256)
        self.result_worker[position] = self._number(worker)
        self.done += 1

    # -- transitions ---------------------------------------------------------
    def restore(self, results: list[dict[str, Any]]) -> int:
        """Mark journaled results done (resume); returns how many were restored."""
        for result in results:
            task_id = result.get("taskId")
            position = self.tasks.position(task_id) if isinstance(task_id, str) else None
            if position is not None and self.state[position] == PENDING:
                self._record(position, result["workerId"], result["output"], result["sha256"])
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
        unfinished = len(self.state) - self.done - len(self.failures)
        pending = unfinished - len(self.leases)
        if self.reservation is None:
            self.reservation = (pending // self.expected_workers, now + self.lease_seconds)
        reserve_each = self.reservation[0] if now < self.reservation[1] else 0
        newcomer = stats.claimed == 0
        waiting = max(0, self.expected_workers - self.workers_with_work - newcomer)
        return fair_share(max_tasks, pending, self.expected_workers, newcomer=newcomer, waiting=waiting,
                          reserve_each=reserve_each, unfinished=unfinished)

    def _next_pending(self) -> int | None:
        """Take the next queued task that is still pending (a late result may have finished a requeued one)."""
        state = self.state
        while self.front:
            position = self.front.popleft()
            if state[position] == PENDING:
                return position
        while self.cursor < len(state):
            position = self.cursor
            self.cursor += 1
            if state[position] == PENDING:
                return position
        while self.back:
            position = self.back.popleft()
            if state[position] == PENDING:
                return position
        return None

    def claim(self, worker: str, max_tasks: int, now: float, node: str | None = None) -> Claim:
        """Lease up to a fair share of ``max_tasks`` pending tasks to ``worker`` (on ``node``, when it
        says), or say why not."""
        if self.closed:
            return Claim("stop", reason=self.closed)
        if now + self.lease_seconds > self.claims_until:
            self.allocation_ending = True
            return Claim("stop", reason=ALLOCATION_ENDING)
        stats = self._seen(worker, now)
        if node is not None:
            stats.node = node
        wanted = self.share(stats, max_tasks, now)
        lease = Lease(worker, now + self.lease_seconds)  # one object for the claim: a heartbeat replaces it
        granted = self._grant_run(wanted, lease) if wanted else []
        while len(granted) < wanted:
            position = self._next_pending()
            if position is None:
                break
            self.state[position] = LEASED
            self.leases[position] = lease
            self.granted[position] = 1
            granted.append(position)
        if granted:
            first = stats.claimed == 0
            self.workers_with_work += first
            stats.claimed += len(granted)
            return Claim("task", granted, first=first)
        return Claim("done") if self.finished else Claim("wait")

    def _grant_run(self, wanted: int, lease: Lease) -> list[int] | range:
        """The next ``wanted`` queued tasks when they are consecutive never-handed-out pending positions (the
        usual claim), granted in a few operations; else [] (:meth:`claim` takes them one by one)."""
        start, state = self.cursor, self.state
        end = start + wanted
        if self.front or end > len(state) or state.count(PENDING, start, end) != wanted:
            return []
        self.cursor = end
        state[start:end] = _LEASED_BYTE * wanted
        self.granted[start:end] = _ONE * wanted
        run = range(start, end)
        self.leases.update(dict.fromkeys(run, lease))
        return run

    def check(self, result: Any) -> Verdict:
        """Validate one result's shape and state without changing anything."""
        verdict, position = self._check(result)
        return verdict if position < 0 else Verdict(result["taskId"], 201, "accepted")

    def _check(self, result: Any) -> tuple[Verdict, int]:
        """The verdict on one result, and its task's position (-1 unless accepted).

        Ordered for speed, with the verdicts of the plain order (shape, then state, then digest):
        a task id found among the tasks is well-formed, and a digest equal to the output's is
        64 lowercase hex digits, so the patterns are only asked when the fast test fails.
        """
        if type(result) is not dict:
            return Verdict(None, 400, "a result must be a JSON object"), -1
        task_id = result.get("taskId")
        position = self.tasks.position(task_id)
        if position is None and (type(task_id) is not str or not TASK_ID_PATTERN.match(task_id)):
            return Verdict(None, 400, "taskId is missing or malformed"), -1
        if len(result) > 4 or not result.keys() <= _RESULT_KEYS:
            return Verdict(task_id, 400, f"unknown key {min(result.keys() - _RESULT_KEYS)!r}"), -1
        output, digest = result.get("output"), result.get("sha256")
        if type(output) is not str or len(output) > MAX_OUTPUT_CHARS:
            return Verdict(task_id, 400, "output must be a string"), -1
        try:
            digest_matches = type(digest) is str and sha256_text(output) == digest
        except UnicodeEncodeError as exc:  # "\ud800" in JSON reads as a lone surrogate, which UTF-8 cannot hold
            return Verdict(task_id, 400, f"output is not Unicode text: a lone surrogate at character {exc.start} "
                                         "(sha256 is of the output's UTF-8 bytes)"), -1
        if not digest_matches and (type(digest) is not str or not SHA256_PATTERN.match(digest)):
            return Verdict(task_id, 400, "sha256 must be 64 lowercase hex digits"), -1
        if position is None:
            return Verdict(task_id, 409, "unknown task"), -1
        if self.state[position] == DONE or self.committing[position]:
            return Verdict(task_id, 409, "duplicate: the task already has a result"), -1
        if not self.granted[position]:
            return Verdict(task_id, 409, "unclaimed: the task was never handed out"), -1
        if not digest_matches:
            return Verdict(task_id, 400, "sha256 is not the digest of output"), -1
        return _ACCEPTED, position

    def stage(self, worker: str, results: list[Any], now: float) -> tuple[list[Staged], list[dict[str, Any]]]:
        """Check ``results`` and reserve the tasks of the good ones for :meth:`commit`.

        :returns: (the results to journal, ``{"taskId", "code", "reason"}`` for each rejected result).
        """
        stats = self._seen(worker, now)
        staged: list[Staged] = []
        rejected: list[dict[str, Any]] = []
        committing = self.committing
        for result in results:
            verdict, position = self._check(result)
            if position < 0:
                stats.rejected += 1
                rejected.append({"taskId": verdict.task_id, "code": verdict.code, "reason": verdict.reason})
                continue
            committing[position] = 1
            staged.append(Staged(position, result["taskId"], worker, result["output"], result["sha256"]))
        return staged, rejected

    def stage_run(self, worker: str, task_ids: list[str], outputs: list[str], sha256: list[str],
                  now: float) -> tuple[StagedRun, list[str]] | None:
        """:meth:`stage` for a batch of results (strings all) when every one is accepted and their tasks are
        consecutive positions (a batch as it was claimed), in a few operations over the whole batch.

        The outputs (as JSON text) and digests go to the board's stores now, at the reserved positions: what
        waits for the journal is the staged run and its journal lines, not the batch as it was decoded (a
        result staged and then aborted leaves its output's bytes unused in the blob; no position points there).

        :returns: the staged batch and its outputs as JSON text (``encode_basestring_ascii``, for the journal's
            lines), or None (nothing changed) when :meth:`stage` must judge it result by result.
        """
        count = len(task_ids)
        start = self.tasks.position(task_ids[0]) if count else None
        if start is None or start + count > len(self.state):
            return None
        end = start + count
        try:
            if self.tasks.id_run(start, end) != "\n".join(task_ids).encode():
                return None  # (no id holds a newline: equal text, equal ids)
        except UnicodeEncodeError:  # a lone surrogate: no task's id
            return None
        if (self.state.find(DONE, start, end) >= 0 or self.granted.find(0, start, end) >= 0
                or max(map(len, outputs)) > MAX_OUTPUT_CHARS
                or self.committing.find(1, start, end) >= 0):
            return None
        try:
            encoded = list(map(str.encode, outputs))
        except UnicodeEncodeError:  # a lone surrogate: stage() names it
            return None
        if list(map(_hexdigest, map(hashlib.sha256, encoded))) != sha256:
            return None
        self._seen(worker, now)
        self.committing[start:end] = _ONE * count
        escaped = list(map(encode_basestring_ascii, outputs))
        sizes = list(map(len, escaped))
        self.output_at[start:end] = array("Q", islice(accumulate(sizes, initial=len(self.outputs)), count))
        self.output_size[start:end] = array("I", sizes)
        self.outputs += "".join(escaped).encode("ascii")
        self.digests[32 * start:32 * end] = bytes.fromhex("".join(sha256))
        return StagedRun(start, count, worker), escaped

    def commit_run(self, run: StagedRun, now: float) -> None:
        """:meth:`commit` of a :meth:`stage_run` batch: the same state, written a slice at a time."""
        start, count = run.start, run.count
        end = start + count
        self.committing[start:end] = bytes(count)
        deque(map(self.leases.pop, range(start, end), repeat(None)), maxlen=0)
        self.state[start:end] = _DONE_BYTE * count
        self.result_worker[start:end] = array("I", [self._number(run.worker)]) * count
        self.done += count
        self._seen(run.worker, now).completed += count

    def abort_run(self, run: StagedRun) -> None:
        """The journal could not store ``run``: nothing of it was accepted."""
        self.committing[run.start:run.start + run.count] = bytes(run.count)

    def commit(self, staged: list[Staged], now: float) -> None:
        """The journal holds ``staged`` durably: their tasks are done."""
        for record in staged:
            position = record.position
            self.committing[position] = 0
            self.leases.pop(position, None)
            self._record(position, record.worker, record.output, record.sha256)
        if staged:
            self._seen(staged[0].worker, now).completed += len(staged)

    def abort(self, staged: list[Staged]) -> None:
        """The journal could not store ``staged``: nothing of them was accepted."""
        for record in staged:
            self.committing[record.position] = 0

    def heartbeat(self, worker: str, task_ids: list[str], now: float) -> list[str]:
        """Extend ``worker``'s leases on ``task_ids``; return the ids it still holds."""
        self._seen(worker, now)
        held = []
        renewed = Lease(worker, now + self.lease_seconds)  # a claim's tasks share a lease: each renewed one moves
        for task_id in task_ids:
            position = self.tasks.position(task_id)
            lease = self.leases.get(position)
            if lease is not None and lease.worker == worker:
                self.leases[position] = renewed
                held.append(task_id)
        return held

    def fail(self, worker: str, task_id: str, reason: str, now: float) -> str:
        """The task's handler failed on ``worker``: requeue it (at the back), or fail it for good.

        :returns: ``"requeued"``, ``"failed"``, or ``"ignored"`` when ``worker`` does not hold its lease.
        """
        position = self.tasks.position(task_id)
        lease = self.leases.get(position)
        if lease is None or lease.worker != worker or self.committing[position]:
            return "ignored"
        del self.leases[position]
        self._seen(worker, now)
        self.attempts[position] = self.attempts.get(position, 0) + 1
        if self.attempts[position] >= self.max_attempts:
            self.state[position] = FAILED
            self.failures[task_id] = reason
            return "failed"
        self.state[position] = PENDING
        self.back.append(position)
        return "requeued"

    def expire(self, now: float) -> list[str]:
        """Return overdue leased tasks to the FRONT of the queue; returns their ids."""
        overdue = [position for position, lease in self.leases.items() if lease.deadline <= now]
        for position in reversed(overdue):
            del self.leases[position]
            self.state[position] = PENDING
            self.front.appendleft(position)
        self.expired_leases += len(overdue)
        return list(map(self.tasks.task_id, overdue))


def fair_share(max_tasks: int, pending: int, workers: int, *, newcomer: bool = False, waiting: int = 0,
               reserve_each: int = 0, unfinished: int | None = None) -> int:
    """How many tasks one claim may take (0 = wait).

    At most an equal share of what is unfinished (``ceil(unfinished / workers)``: pending or leased, no
    result yet), and no more than is pending, so a big batch never starves the other workers: no worker
    holds more than its part of the work left. (An equal share of what is *pending* instead shrinks with
    every claim while the others hold theirs: with thousands of workers the tasks went out in ever smaller
    claims, several a worker where one does.) While some expected workers have had no work yet
    (``waiting`` of them, not counting this one), ``reserve_each`` tasks stay held back for
    each of them; a ``newcomer`` (its first grant) may take its own reserved share at once.
    So with as many tasks as workers, every worker gets work, however late it starts.

    :param max_tasks: what the worker asked for (its batch size).
    :param reserve_each: ``tasks // workers`` at the first grant; 0 once the reservation lapsed.
    :param unfinished: the tasks without a result (pending and leased); ``pending`` when not given.
    """
    share = -(-(pending if unfinished is None else unfinished) // max(workers, 1))
    if newcomer:
        share = max(share, reserve_each)
    share = min(share, pending - waiting * reserve_each)
    return max(0, min(max_tasks, share))
