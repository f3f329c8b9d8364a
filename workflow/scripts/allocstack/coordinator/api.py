"""The coordinator's protocol: one handler per endpoint, over a :class:`TaskBoard` and a :class:`Journal`.

Request bodies are checked here (a bad one is a :class:`ClientError`, 400);
what a result means is the board's business; durability is the journal's: a
result is acknowledged only once the journal has it on disk, and the board
counts it done only then. A journal that cannot write (a full disk, an
exhausted quota) answers 507 and, through ``on_fault``, stops the run granting
claims. See ``workflow/scripts/coordinator.py`` for the protocol itself.

Speed: a /claim or /results body as a worker sends it is read by msgspec into a
typed record (:func:`typed_post`), and a batch of good results for consecutive
tasks is accepted whole (:meth:`CoordinatorApi.submit_batch`): one digest check
over the batch, one journal string, slices of the board's arrays. Anything else
(a bad result, a body of another shape) takes the general path, which judges
result by result and names each problem; both give the same answers (tested).
A relay's /batch of claims (:func:`typed_claims`) is answered in one pass
(:meth:`CoordinatorApi.claims`): one decode, one journal append for all its good
results, then each claim granted, as each would have been answered alone (tested).
"""

from __future__ import annotations

import asyncio
import re
from collections import deque
from collections.abc import Callable
from itertools import repeat
from typing import Any
from urllib.parse import parse_qs

from .. import SCHEMA_VERSION
from ..common.errors import AllocstackError
from ..common.jsonio import dumps_compact, msgspec
from ..status.stackevents import EventTail
from .httpserver import ClientError, HttpError, Request, Response
from .journal import Journal, result_line, result_lines
from .progress import Clock, Progress
from .routing import Router
from .statuspage import PAGE
from .taskboard import WORKER_ID_PATTERN, StagedRun, TaskBoard

WAIT_HINT_SECONDS = 0.1
MAX_CLAIM_BATCH = 10_000
#: Requests one /batch may carry (a job step's relay sends what its workers asked meanwhile).
MAX_BATCH_REQUESTS = 1024
#: What a /batch may carry: a worker's requests (each answered as if it had come alone).
BATCHED = ("/claim", "/results", "/result", "/heartbeat", "/fail")
#: A failure reason is kept up to this many characters (its tail).
MAX_REASON_CHARS = 2000
#: What a worker may call its node (a host name as Slurm and DNS spell them).
NODE_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
_PAGE = Response(200, PAGE.encode("utf-8"), content_type="text/html; charset=utf-8")

Event = Callable[..., None]

if msgspec is not None:
    class _Result(msgspec.Struct, forbid_unknown_fields=True, gc=False):
        taskId: str
        output: str
        sha256: str
        workerId: str | msgspec.UnsetType = msgspec.UNSET

    class _Post(msgspec.Struct, forbid_unknown_fields=True, gc=False):
        """A /claim or /results body as a worker sends it, every value of the type the protocol asks."""

        workerId: str
        max: int | msgspec.UnsetType = msgspec.UNSET
        results: list[_Result] | msgspec.UnsetType = msgspec.UNSET
        node: str | None = None

    _POST = msgspec.json.Decoder(_Post)

    class _Part(msgspec.Struct, forbid_unknown_fields=True, gc=False):
        path: str
        body: msgspec.Raw

    class _Batch(msgspec.Struct, forbid_unknown_fields=True, gc=False):
        requests: list[_Part]

    _BATCH = msgspec.json.Decoder(_Batch)

    class _ClaimPart(msgspec.Struct, forbid_unknown_fields=True, gc=False):
        path: str
        body: _Post

    class _Claims(msgspec.Struct, forbid_unknown_fields=True, gc=False):
        requests: list[_ClaimPart]

    _CLAIMS = msgspec.json.Decoder(_Claims)
    _ENCODE = msgspec.json.encode
else:
    _POST = _BATCH = _CLAIMS = _ENCODE = None


def typed_post(request: Request) -> Any:
    """The body as a typed record when msgspec reads it as one (a claim or a batch of results as a worker
    sends them, with a well-formed workerId); else None, and the body takes the general path.

    Only what the general path reads the same way gets here: no unknown key (nothing is skipped
    unread), each value of its type; msgspec refuses what the standard library reads otherwise.
    """
    if _POST is None or not request.body:
        return None
    try:
        post = _POST.decode(request.body)
    except (msgspec.MsgspecError, RecursionError):
        return None
    return post if WORKER_ID_PATTERN.match(post.workerId) else None


def typed_claims(body: bytes) -> list[Any] | None:
    """A /batch body whose every request is a claim as a worker sends it (:func:`typed_post`'s records, with a
    good ``max`` and ``node``), as those records, decoded in one call; else None (the batch takes the general path).
    """
    if _CLAIMS is None:
        return None
    try:
        parts = _CLAIMS.decode(body).requests
    except (msgspec.MsgspecError, RecursionError):
        return None
    if not 1 <= len(parts) <= MAX_BATCH_REQUESTS:
        return None
    posts = [part.body for part in parts]
    plain = CoordinatorApi.plain_claim
    if all(part.path == "/claim" and WORKER_ID_PATTERN.match(post.workerId) and plain(post)
           for part, post in zip(parts, posts, strict=True)):
        return posts
    return None


def worker_body(request: Request) -> dict[str, Any]:
    """The request's JSON object with a well-formed ``workerId``.

    :raises ClientError: 400 otherwise.
    """
    body = request.json()
    if not isinstance(body, dict):
        raise ClientError("body must be a JSON object")
    worker = body.get("workerId")
    if not isinstance(worker, str) or not WORKER_ID_PATTERN.match(worker):
        raise ClientError("workerId is missing or malformed")
    return body


def batch_parts(body: bytes) -> list[tuple[str, bytes]]:
    """A /batch body's requests as (path, body bytes as sent).

    :raises ClientError: 400 unless it is ``{"requests": [{"path": str, "body": JSON}, ...]}`` of 1 to
        :data:`MAX_BATCH_REQUESTS`.
    """
    parts: list[tuple[str, bytes]] | None = None
    if _BATCH is not None:
        try:
            parts = [(part.path, bytes(part.body)) for part in _BATCH.decode(body).requests]
        except (msgspec.MsgspecError, RecursionError):
            parts = None
    if parts is None:  # the general path: it names the problem
        document = Request("POST", "/batch", "", {}, body).json()
        requests = document.get("requests") if isinstance(document, dict) and set(document) == {"requests"} else None
        if not isinstance(requests, list) or not all(
                isinstance(part, dict) and set(part) == {"path", "body"} and isinstance(part["path"], str)
                for part in requests):
            raise ClientError('body must be {"requests": [{"path": "/claim", "body": {...}}, ...]}')
        parts = [(part["path"], dumps_compact(part["body"])) for part in requests]
    if not 1 <= len(parts) <= MAX_BATCH_REQUESTS:
        raise ClientError(f"a batch carries 1 to {MAX_BATCH_REQUESTS} requests, not {len(parts)}")
    return parts


class CoordinatorApi:
    """The endpoints. ``event(name, **fields)`` logs a run event; ``on_fault(error)`` is told of a
    journal that cannot write; ``on_change()`` runs after results or failures changed the board."""

    def __init__(self, board: TaskBoard, journal: Journal, progress: Progress, *, event: Event,
                 on_fault: Callable[[AllocstackError], None], on_change: Callable[[], None],
                 log: Callable[[str], None], stack_events: EventTail | None = None) -> None:
        self.board = board
        #: The other components' event logs: their restarts, exposed sockets and failed gates go in /status.
        self.stack_events = stack_events
        self.journal = journal
        self.progress = progress
        self.clock: Clock = progress.clock
        self.event = event
        self.on_fault = on_fault
        self.on_change = on_change
        self.log = log
        self.health_body = Response.json(200, {"status": "ready", "schemaVersion": SCHEMA_VERSION,
                                               "taskCount": len(board)}).body
        #: What a /batch may carry, by path (:data:`BATCHED`).
        self.batched = dict(zip(BATCHED, (self.claim, self.results, self.result, self.heartbeat, self.fail),
                                strict=True))

    def router(self) -> Router:
        return Router({
            ("GET", "/health"): self.health,
            ("GET", "/ui"): self.page,
            ("GET", "/status"): self.status,
            ("POST", "/claim"): self.claim,
            ("POST", "/result"): self.result,
            ("POST", "/results"): self.results,
            ("POST", "/heartbeat"): self.heartbeat,
            ("POST", "/fail"): self.fail,
            ("POST", "/batch"): self.batch,
        })

    async def health(self, request: Request) -> Response:
        return Response(200, self.health_body)

    async def page(self, request: Request) -> Response:
        return _PAGE

    async def status(self, request: Request) -> Response:
        summary = self.progress.summary(self.board)
        if parse_qs(request.query).get("history") == ["1"]:
            summary["history"] = list(self.progress.history)
        summary["events"] = self.stack_events.poll() if self.stack_events is not None else []
        return Response.json(200, summary)

    async def submit_batch(self, worker: str, results: list[Any]) -> list[str] | None:
        """:meth:`submit` of a typed batch whose results are all accepted (see :meth:`TaskBoard.stage_run`), in
        a few operations over the whole batch; None (nothing done) when :meth:`submit` must judge it.

        :raises HttpError: 507 when the journal cannot store them (none of them is accepted).
        """
        staged = self.stage_typed(worker, results, self.clock())
        if staged is None:
            return None
        run, lines = staged
        await self.store(lines, run.count, lambda: self.board.abort_run(run),
                         lambda: self.board.commit_run(run, self.clock()))
        return [result.taskId for result in results]

    def stage_typed(self, worker: str, results: list[Any], now: float) -> tuple[StagedRun, list[bytes]] | None:
        """:meth:`TaskBoard.stage_run` of typed results, and their journal lines (one item, a list the journal
        empties); None when they must be judged one by one."""
        task_ids = [result.taskId for result in results]
        digests = [result.sha256 for result in results]
        staged = self.board.stage_run(worker, task_ids, [result.output for result in results], digests, now)
        if staged is None:
            return None
        run, escaped = staged
        return run, [result_lines(task_ids, worker, escaped, digests)]

    async def store(self, lines: list[bytes], records: int, abort: Callable[[], None],
                    commit: Callable[[], None]) -> None:
        """Journal ``lines`` (``records`` results) durably, then ``commit()`` them to the board; ``abort()``
        when the journal cannot store them.

        :raises HttpError: 507 then (none of them is accepted).
        """
        try:
            await self.journal.append_lines(lines, records)
        except AllocstackError as error:
            abort()
            self.on_fault(error)
            raise HttpError(507, f"not stored, nothing accepted: {error.message}") from error
        commit()
        self.on_change()

    async def submit(self, worker: str, results: Any) -> tuple[list[str], list[dict[str, Any]]]:
        """Check ``results``, journal the good ones durably, then count them done.

        :returns: (accepted task ids, rejections).
        :raises HttpError: 507 when the journal cannot store them (none of them is accepted).
        """
        if not isinstance(results, list):
            raise ClientError("results must be a list")
        staged, rejected = self.board.stage(worker, results, self.clock())
        if staged:
            await self.store([result_line(s.task_id, s.worker, s.output, s.sha256) for s in staged], len(staged),
                             lambda: self.board.abort(staged), lambda: self.board.commit(staged, self.clock()))
        return [record.task_id for record in staged], rejected

    async def result(self, request: Request) -> Response:
        body = worker_body(request)
        ids, rejected = await self.submit(body["workerId"], [body])
        if ids:
            return Response.json(201, {"status": "accepted", "taskId": ids[0]})
        return Response.json(rejected[0]["code"], {"error": rejected[0]["reason"], "taskId": rejected[0]["taskId"]})

    async def results(self, request: Request) -> Response:
        post = typed_post(request)
        if post is not None and post.results:
            ids = await self.submit_batch(post.workerId, post.results)
            if ids is not None:
                return Response(200, dumps_compact({"accepted": ids, "rejected": []}))
        body = worker_body(request)
        ids, rejected = await self.submit(body["workerId"], body.get("results"))
        return Response.json(200, {"accepted": ids, "rejected": rejected})

    async def claim(self, request: Request) -> Response:
        post = typed_post(request)
        if post is not None and self.plain_claim(post):
            reply: dict[str, Any] = {}
            if post.results is not msgspec.UNSET:
                ids = await self.submit_batch(post.workerId, post.results) if post.results else []
                if ids is not None:
                    reply.update(accepted=ids, rejected=[])
            if reply or post.results is msgspec.UNSET:
                return self.grant(post.workerId, post.max, post.node, reply)
        body = worker_body(request)
        worker = body["workerId"]
        max_tasks = body.get("max", 1)
        if type(max_tasks) is not int or not 1 <= max_tasks <= MAX_CLAIM_BATCH:
            raise ClientError(f"max must be an integer in 1..{MAX_CLAIM_BATCH}")
        node = body.get("node")
        if node is not None and not (isinstance(node, str) and NODE_PATTERN.match(node)):
            raise ClientError("node must be a host name")
        reply = {}
        if "results" in body:
            ids, rejected = await self.submit(worker, body["results"])
            reply.update(accepted=ids, rejected=rejected)
        return self.grant(worker, max_tasks if "max" in body else None, node, reply)

    @staticmethod
    def plain_claim(post: Any) -> bool:
        """A typed claim whose max and node are good (else the general path names the problem)."""
        return ((post.max is msgspec.UNSET or 1 <= post.max <= MAX_CLAIM_BATCH)
                and (post.node is None or NODE_PATTERN.match(post.node) is not None))

    def grant(self, worker: str, max_tasks: Any, node: str | None, reply: dict[str, Any],
              accepted: bytes = b"") -> Response:
        """Claim for ``worker`` and answer with ``reply`` (a submission's outcome) and the claim's.

        :param max_tasks: the claim's ``max``; None or UNSET when it has none (one task, as ``"task"``).
        :param accepted: the submission's outcome as JSON members to put first, instead of in ``reply``.
        """
        batch = type(max_tasks) is int
        claim = self.board.claim(worker, max_tasks if batch else 1, self.clock(), node)
        reply["status"] = claim.status
        if claim.status == "task":
            if claim.first:
                self.event("first-claim", worker=worker)
            reply["leaseSeconds"] = self.board.lease_seconds
        elif claim.status == "wait":
            reply["retryAfter"] = WAIT_HINT_SECONDS
        elif claim.status == "stop":
            reply["reason"] = claim.reason
        body = dumps_compact(reply)
        if accepted:
            body = b"{" + accepted + b"," + body[1:]
        if claim.status == "task":
            # The tasks as the document holds them (raw payload bytes), spliced into the reply.
            tasks = self.board.tasks
            if batch:
                return Response(200, body[:-1] + b',"tasks":' + tasks.tasks_json(claim.positions) + b"}")
            return Response(200, body[:-1] + b',"task":' + tasks.task_json(claim.positions[0]) + b"}")
        return Response(200, body)

    async def batch(self, request: Request) -> Response:
        """``POST /batch {"requests": [{"path", "body"}, ...]}``: several workers' requests in one (a job step's
        relay sends what its workers asked while its last batch was on its way). Each is answered as if it had
        come alone, all at once (their results share a journal fsync): ``{"responses": [{"status", "body"}, ...]}``
        in the same order. A request the batch cannot carry is answered 400 in its place.

        :raises ClientError: 400 for a body that is not such a list.
        """
        posts = typed_claims(request.body)
        if posts is not None:
            request.body = b""  # read: its bytes need not wait for the journal
            answers = await self.claims(posts)
        else:
            parts = batch_parts(request.body)
            answers = await asyncio.gather(*(self.answer_part(path, body) for path, body in parts))
        return Response(200, b'{"responses":[' + b",".join(b'{"status":%d,"body":%s}' % (answer.status, answer.body)
                                                           for answer in answers) + b"]}")

    async def claims(self, posts: list[Any]) -> list[Response]:
        """The answers to a /batch of typed claims (:func:`typed_claims`), each as :meth:`claim` would give it, for
        the price of one: every batch of results that is all good (the usual case) staged at once, their journal
        lines stored in one append, then each claim granted. A claim whose results must be judged one by one
        takes :meth:`claim` meanwhile. What waits for the journal is the staged runs and their lines: the decoded
        bodies are let go first.
        """
        now = self.clock()
        runs: list[StagedRun | None] = []
        lines: list[bytes] = []
        claims: list[tuple[str, Any, str | None, bool]] = []
        alone: dict[int, Any] = {}
        for index, post in enumerate(posts):
            staged = self.stage_typed(post.workerId, post.results, now) if post.results else None
            if staged is None and post.results:
                alone[index] = self.answer_part("/claim", _ENCODE(post))
            elif staged is not None:
                lines += staged[1]
            runs.append(None if staged is None else staged[0])
            claims.append((post.workerId, post.max, post.node, post.results is not msgspec.UNSET))
        posts.clear()
        staged = None  # (its lines are in ``lines``, which the journal empties)
        stored = [run for run in runs if run is not None]
        failure: list[Response] = []

        async def store() -> None:
            try:
                await self.store(lines, sum(run.count for run in stored),
                                 lambda: deque(map(self.board.abort_run, stored), maxlen=0),
                                 lambda: deque(map(self.board.commit_run, stored, repeat(self.clock())), maxlen=0))
            except HttpError as exc:
                failure.append(Response.error(exc.status, exc.message))

        if alone:
            answered = dict(zip(alone, (await asyncio.gather(store(), *alone.values()))[1:], strict=True))
        else:
            answered = {}
            if lines:
                await store()
        answers = []
        ids = self.board.tasks.id_run
        for index, ((worker, max_tasks, node, submitted), run) in enumerate(zip(claims, runs, strict=True)):
            if index in answered:
                answers.append(answered[index])
            elif run is not None and failure:
                answers.append(failure[0])
            elif run is not None:
                accepted = b'"accepted":["' + ids(run.start, run.start + run.count).replace(b"\n", b'","') + b'"]'
                answers.append(self.grant(worker, max_tasks, node, {"rejected": []}, accepted))
            else:
                answers.append(self.grant(worker, max_tasks, node, {"accepted": [], "rejected": []} if submitted else {}))
        return answers


    async def answer_part(self, path: str, body: bytes) -> Response:
        """One request of a /batch, answered by its own endpoint (a handler's 4xx or 507 is its answer)."""
        if path not in BATCHED:
            return Response.error(400, f"a batch carries {', '.join(BATCHED)}, not {path[:100]!r}")
        try:
            return await self.batched[path](Request("POST", path, "", {}, body))
        except HttpError as exc:
            return Response.error(exc.status, exc.message)

    async def fail(self, request: Request) -> Response:
        body = worker_body(request)
        worker, task_id, reason = body["workerId"], body.get("taskId"), body.get("reason", "")
        if not isinstance(task_id, str) or not isinstance(reason, str):
            raise ClientError("taskId and reason must be strings")
        outcome = self.board.fail(worker, task_id, reason[-MAX_REASON_CHARS:], self.clock())
        if outcome == "ignored":
            return Response.error(409, f"{worker} does not hold a lease on {task_id[:80]!r}")
        self.log(f"coordinator: task {task_id} failed on {worker} ({outcome}): {reason[-300:]}")
        self.event("task-failed", taskId=task_id, worker=worker, outcome=outcome)
        self.on_change()
        return Response.json(200, {"status": outcome})

    async def heartbeat(self, request: Request) -> Response:
        body = worker_body(request)
        task_ids = body.get("taskIds")
        if not isinstance(task_ids, list) or not all(isinstance(t, str) for t in task_ids):
            raise ClientError("taskIds must be a list of strings")
        held = self.board.heartbeat(body["workerId"], task_ids, self.clock())
        return Response.json(200, {"held": held, "leaseSeconds": self.board.lease_seconds})
