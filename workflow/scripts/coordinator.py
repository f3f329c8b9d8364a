#!/usr/bin/env python3
"""The coordinator: hands out tasks over loopback HTTP and durably collects results.

Lifecycle: parse -> validate input -> replay journal -> bind 127.0.0.1:0 ->
publish endpoint file (0600, with a fresh bearer token) -> serve -> drain -> exit.

Protocol (JSON bodies; all but /health need ``Authorization: Bearer <token>``):

* ``GET /health`` -> exactly ``{"status": "ready", "schemaVersion": 1, "taskCount": N}``
* ``POST /claim {"workerId", "max"?, "results"?}`` -> ``{"status": "task", "task"|"tasks"}``,
  ``{"status": "wait", "retryAfter"}``, ``{"status": "done"}`` or ``{"status": "stop"}``
  (draining: the run is ending). Results piggybacked on a claim are acknowledged first.
* ``POST /result {"workerId", "taskId", "output", "sha256"}`` -> 201 accepted,
  409 duplicate or unclaimed, 400 bad schema or digest.
* ``POST /results {"workerId", "results": [...]}`` -> 200 with accepted and rejected ids.
* ``POST /heartbeat {"workerId", "taskIds"}`` -> ``{"held": [...]}`` (renews leases).
* ``POST /fail {"workerId", "taskId", "reason"}`` -> ``{"status": "requeued"|"failed"}``: the
  task's handler failed; it is handed out again until it has failed ``--max-attempts`` times.
* ``GET /status`` -> counts, rate, per-worker stats (``?history=1`` adds the progress
  series); ``GET /ui`` -> the live status page. Both also accept the read-only
  view token as ``?token=`` (a browser cannot send a header through a tunnel URL).

A result is acknowledged only after it is fsync'd in the journal. On SIGTERM/SIGINT,
idle timeout, lifetime, or the loss of its parent it stops granting claims, drains,
writes ``results.json`` and an end record, removes the endpoint file and exits:
0 when every task has a result, 75 otherwise.
"""

from __future__ import annotations

import asyncio
import hmac
import os
import secrets
import shutil
import signal
import sys
import time
from collections import deque
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

from allocstack import SCHEMA_VERSION
from allocstack.cli import (
    ArgumentParser,
    echo,
    non_negative_float,
    positive_float,
    positive_int,
    run,
    runtime_facts,
    scratch_defaults,
    silence_stdout,
)
from allocstack.endpoint import TUNNEL_PORT, tunnel_command, write_endpoint, write_service_file
from allocstack.errors import EXIT_TEMPFAIL, AllocstackError, report
from allocstack.events import append_event
from allocstack.httpserver import HttpServer, Request, Response
from allocstack.journal import Journal, replay
from allocstack.jsonio import atomic_write_json, sha256_file, sha256_text
from allocstack.lifeline import launcher_alive, launcher_pid
from allocstack.scratch import ensure_private_dir
from allocstack.statuspage import PAGE
from allocstack.taskboard import WORKER_ID_PATTERN, TaskBoard, fair_share
from allocstack.taskset import load_tasks

WAIT_HINT_SECONDS = 0.1
ALLOCATION_ENDING = "less than one lease remains before the allocation ends"
MAX_CLAIM_BATCH = 10_000
LIVE_INTERVAL = 0.5


def live_line(s: dict[str, Any], workers: int) -> str:
    """``allocstack: 3,016/10,000 tasks done (30%), 16 leased, 327 tasks/s, 21 s left, 2/2 workers`` (pure).

    The last count: workers that have asked for work, of those the run starts.
    """
    percent = 100 * s["done"] // s["total"] if s["total"] else 100
    eta = f"{s['etaSeconds']:,.0f} s left" if s["etaSeconds"] is not None else "time left -"
    active = len(s["workers"])
    failed = f", {s['failed']:,} failed" if s.get("failed") else ""
    return (f"allocstack: {s['done']:,}/{s['total']:,} tasks done ({percent}%){failed}, {s['leased']:,} leased, "
            f"{s['ratePerSecond']:,.0f} tasks/s, {eta}, {active}/{workers} workers")


class Coordinator:
    """The HTTP application around a :class:`TaskBoard` and a :class:`Journal`."""

    def __init__(self, args, board: TaskBoard, journal: Journal, input_sha256: str) -> None:
        self.args = args
        self.board = board
        self.journal = journal
        self.input_sha256 = input_sha256
        self.token = secrets.token_urlsafe(32)
        self.view_token = secrets.token_urlsafe(24)
        self.server = HttpServer(self.handle, max_body_bytes=args.max_body_bytes, idle_timeout=args.connection_timeout)
        self.stopping = asyncio.Event()
        self.stop_reason = ""
        self.draining = False
        self.started_at = time.time()
        self.started_mono = time.monotonic()
        self.listening_at = 0.0
        self.last_request = time.monotonic()
        self.first_claims: set[str] = set()
        self.reservation: tuple[int, float] | None = None  # (tasks held back per waiting worker, until)
        self.outcome_written = False
        self.allocation_ending = False
        self.progress: deque[tuple[float, int]] = deque()
        self.history: deque[tuple[float, int]] = deque(maxlen=1800)
        # A person watches a terminal: a live line instead of a line every 5 s (the log keeps those).
        self.live = args.progress == "live" or (args.progress == "auto" and sys.stdout.isatty())

    # -- HTTP ----------------------------------------------------------------
    def authorized(self, request: Request) -> bool:
        supplied = request.headers.get("authorization", "")
        expected = f"Bearer {self.token}"
        return hmac.compare_digest(supplied.encode("utf-8", "replace"), expected.encode("utf-8"))

    def may_view(self, request: Request) -> bool:
        """The worker token, or the read-only view token in ``?token=``, may read status."""
        supplied = parse_qs(request.query).get("token", [""])[0]
        view = hmac.compare_digest(supplied.encode("utf-8", "replace"), self.view_token.encode("utf-8"))
        return view or self.authorized(request)

    async def handle(self, request: Request) -> Response:
        self.last_request = time.monotonic()
        routes = {
            ("GET", "/health"): self.health,
            ("GET", "/ui"): self.page,
            ("GET", "/status"): self.status,
            ("POST", "/claim"): self.claim,
            ("POST", "/result"): self.result,
            ("POST", "/results"): self.results,
            ("POST", "/heartbeat"): self.heartbeat,
            ("POST", "/fail"): self.fail,
        }
        viewing = request.method == "GET" and request.path in ("/status", "/ui")
        if request.path != "/health" and not (self.may_view(request) if viewing else self.authorized(request)):
            return Response(401, b'{"error":"missing or wrong bearer token"}', headers={"WWW-Authenticate": "Bearer"})
        route = routes.get((request.method, request.path))
        if route is None:
            known = {path for _, path in routes}
            if request.path in known:
                return Response.json(405, {"error": f"{request.method} is not allowed on {request.path}"})
            return Response.json(404, {"error": f"no such endpoint {request.path}"})
        return await route(request)

    async def health(self, request: Request) -> Response:
        return Response.json(200, {"status": "ready", "schemaVersion": SCHEMA_VERSION, "taskCount": len(self.board.by_id)})

    def _body(self, request: Request) -> dict[str, Any]:
        body = request.json()
        if not isinstance(body, dict):
            raise ValueError("body must be a JSON object")
        worker = body.get("workerId")
        if not isinstance(worker, str) or not WORKER_ID_PATTERN.match(worker):
            raise ValueError("workerId is missing or malformed")
        return body

    async def _submit(self, worker: str, results: Any) -> tuple[list[str], list[dict[str, Any]]]:
        """Check, accept and durably journal ``results``; return (accepted ids, rejections)."""
        if not isinstance(results, list):
            raise ValueError("results must be a list")
        now = time.monotonic()
        accepted: list[dict[str, Any]] = []
        rejected: list[dict[str, Any]] = []
        for result in results:
            verdict = self.board.check(result)
            if verdict.accepted and sha256_text(result["output"]) != result["sha256"]:
                verdict.code, verdict.reason = 400, "sha256 is not the digest of output"
            if not verdict.accepted:
                self.board.reject(worker, now)
                rejected.append({"taskId": verdict.task_id, "code": verdict.code, "reason": verdict.reason})
                continue
            self.board.accept(worker, result, now)
            accepted.append(self.board.results[result["taskId"]])
        await self.journal.append(accepted)
        self.finish_if_finished()
        return [r["taskId"] for r in accepted], rejected

    async def result(self, request: Request) -> Response:
        body = self._body(request)
        ids, rejected = await self._submit(body["workerId"], [body])
        if ids:
            return Response.json(201, {"status": "accepted", "taskId": ids[0]})
        return Response.json(rejected[0]["code"], {"error": rejected[0]["reason"], "taskId": rejected[0]["taskId"]})

    async def results(self, request: Request) -> Response:
        body = self._body(request)
        ids, rejected = await self._submit(body["workerId"], body.get("results"))
        return Response.json(200, {"accepted": ids, "rejected": rejected})

    def claims_closed(self) -> str:
        if self.draining:
            return "the coordinator is draining"
        if self.args.stop_claims_at and time.time() + self.args.lease_seconds > self.args.stop_claims_at:
            self.allocation_ending = True
            return ALLOCATION_ENDING
        return ""

    async def claim(self, request: Request) -> Response:
        body = self._body(request)
        worker = body["workerId"]
        batched = "max" in body
        max_tasks = body.get("max", 1)
        if type(max_tasks) is not int or not 1 <= max_tasks <= MAX_CLAIM_BATCH:
            raise ValueError(f"max must be an integer in 1..{MAX_CLAIM_BATCH}")
        reply: dict[str, Any] = {}
        if "results" in body:
            ids, rejected = await self._submit(worker, body["results"])
            reply.update(accepted=ids, rejected=rejected)
        closed = self.claims_closed()
        if closed:
            return Response.json(200, {**reply, "status": "stop", "reason": closed})
        now = time.monotonic()
        granted = self.board.claim(worker, self.fair_share(worker, max_tasks, now), now)
        if granted:
            if worker not in self.first_claims:
                self.first_claims.add(worker)
                append_event(self.args.events, "first-claim", worker=worker)
            reply.update(status="task", leaseSeconds=self.args.lease_seconds)
            reply.update({"tasks": granted} if batched else {"task": granted[0]})
        elif self.board.finished:
            reply.update(status="done")
        else:
            reply.update(status="wait", retryAfter=WAIT_HINT_SECONDS)
        return Response.json(200, reply)

    async def fail(self, request: Request) -> Response:
        body = self._body(request)
        task_id, reason = body.get("taskId"), body.get("reason", "")
        if not isinstance(task_id, str) or not isinstance(reason, str):
            raise ValueError("taskId and reason must be strings")
        outcome = self.board.fail(body["workerId"], task_id, reason[-2000:], time.monotonic())
        if outcome == "ignored":
            return Response.json(409, {"error": f"{body['workerId']} does not hold a lease on {task_id[:80]!r}"})
        print(f"coordinator: task {task_id} failed on {body['workerId']} ({outcome}): {reason[-300:]}",
              file=sys.stderr, flush=True)
        append_event(self.args.events, "task-failed", taskId=task_id, worker=body["workerId"], outcome=outcome)
        self.finish_if_finished()
        return Response.json(200, {"status": outcome})

    def fair_share(self, worker: str, max_tasks: int, now: float) -> int:
        """An equal share of what is pending, and a share held back for each worker that has had none yet.

        The reservation lapses one lease after the first grant: a worker that never comes
        holds back work no longer than a worker that died holding it.
        """
        pending = self.board.counts()["pending"]
        if self.reservation is None:
            self.reservation = (pending // self.args.workers, now + self.args.lease_seconds)
        reserve_each, _ = self.reservation if now < self.reservation[1] else (0, 0.0)
        newcomer = worker not in self.first_claims
        waiting = max(0, self.args.workers - len(self.first_claims) - newcomer)
        return fair_share(max_tasks, pending, self.args.workers, newcomer=newcomer, waiting=waiting,
                          reserve_each=reserve_each)

    async def heartbeat(self, request: Request) -> Response:
        body = self._body(request)
        task_ids = body.get("taskIds")
        if not isinstance(task_ids, list) or not all(isinstance(t, str) for t in task_ids):
            raise ValueError("taskIds must be a list of strings")
        held = self.board.heartbeat(body["workerId"], task_ids, time.monotonic())
        return Response.json(200, {"held": held, "leaseSeconds": self.args.lease_seconds})

    def summary(self) -> dict[str, Any]:
        """The status document shared by ``GET /status``, progress lines and the end record."""
        now, wall = time.monotonic(), time.time()
        counts = self.board.counts()
        rate = self._rate()
        remaining = counts["total"] - counts["done"]
        return {
            "schemaVersion": SCHEMA_VERSION,
            **counts,
            "restored": self.board.restored,
            "expiredLeases": self.board.expired_leases,
            "rejected": sum(stats.rejected for stats in self.board.workers.values()),
            "complete": self.board.complete,
            "ratePerSecond": round(rate, 2),
            "etaSeconds": round(remaining / rate, 1) if rate > 0 else None,
            "elapsedSeconds": round(wall - self.started_at, 3),
            "readySeconds": round(self.listening_at - self.started_at, 3) if self.listening_at else None,
            "draining": self.draining,
            "workers": {
                worker: {
                    "claimed": stats.claimed,
                    "completed": stats.completed,
                    "rejected": stats.rejected,
                    "lastSeenSecondsAgo": round(now - stats.last_seen, 3),
                }
                for worker, stats in sorted(self.board.workers.items())
            },
        }

    async def status(self, request: Request) -> Response:
        summary = self.summary()
        if parse_qs(request.query).get("history") == ["1"]:
            summary["history"] = list(self.history)
        return Response.json(200, summary)

    async def page(self, request: Request) -> Response:
        return Response(200, PAGE.encode("utf-8"), content_type="text/html; charset=utf-8")

    def _rate(self) -> float:
        """Results per second over the last ~30 s of progress samples."""
        if len(self.progress) < 2:
            return 0.0
        (t0, d0), (t1, d1) = self.progress[0], self.progress[-1]
        return (d1 - d0) / (t1 - t0) if t1 > t0 else 0.0

    # -- lifecycle -----------------------------------------------------------
    def stop(self, reason: str) -> None:
        if not self.stop_reason:
            self.stop_reason = reason
        self.stopping.set()

    async def housekeeping(self) -> None:
        """Expire leases, sample progress, print progress lines, enforce the coordinator's own bounds."""
        parent = os.getppid()
        launcher = launcher_pid()
        last_line = last_live = 0.0
        while not self.stopping.is_set():
            await asyncio.sleep(0.25)
            now = time.monotonic()
            expired = self.board.expire(now)
            if expired:
                print(f"coordinator: {len(expired)} lease(s) expired, requeued: {', '.join(expired[:5])}",
                      file=sys.stderr, flush=True)
                append_event(self.args.events, "leases-expired", count=len(expired), taskIds=expired[:20])
            self.progress.append((now, len(self.board.results)))
            if not self.history or now - self.started_mono - self.history[-1][0] >= 1.0:
                self.history.append((round(now - self.started_mono, 2), len(self.board.results)))
            while now - self.progress[0][0] > 30.0:
                self.progress.popleft()
            if now - last_line >= self.args.progress_interval:
                last_line = now
                self.print_progress()
            if self.live and not self.outcome_written and now - last_live >= LIVE_INTERVAL:
                last_live = now
                self.draw_live()
            if self.args.idle_timeout and now - self.last_request > self.args.idle_timeout:
                self.stop("idle-timeout")
            elif self.args.lifetime and time.time() - self.started_at > self.args.lifetime:
                self.stop("lifetime")
            elif os.getppid() != parent or (launcher is not None and not launcher_alive(launcher)):
                self.stop("parent-exit")

    def print_progress(self) -> None:
        """One progress line to the log (stderr) and, unless a live line is drawn there, to stdout.

        stdout is Snakemake's output: the terminal, or under Slurm the job's log.
        """
        s = self.summary()
        eta = f"{s['etaSeconds']:.0f} s" if s["etaSeconds"] is not None else "-"
        line = (f"coordinator: progress {s['done']}/{s['total']} done, {s['leased']} leased, "
                f"{s['ratePerSecond']:.0f} tasks/s, eta {eta}")
        if not self.live:  # a closed terminal pipe (| head, a killed tee) drops the line, never the coordinator
            echo(line)
        print(line, file=sys.stderr, flush=True)

    def draw_live(self, final: bool = False) -> None:
        """The live one-line progress on a terminal, redrawn in place (the final one ends the line)."""
        width = shutil.get_terminal_size((100, 24)).columns - 1  # a wrapped line could not be redrawn
        try:
            sys.stdout.write("\r\033[K" + live_line(self.summary(), self.args.workers)[:width] + ("\n" if final else ""))
            sys.stdout.flush()
        except BrokenPipeError:  # the terminal went away: the line is lost, never the coordinator
            silence_stdout()

    def tunnel_hint(self, port: int) -> str:
        """How to reach the status page from a laptop: the coordinator listens on the node's loopback only."""
        return (f"coordinator: status page: {tunnel_command(port, os.environ)} ; then open the URL "
                f"that `python workflow/scripts/status.py --url` prints (with {TUNNEL_PORT} as the port)")

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            loop.add_signal_handler(signum, self.stop, f"signal:{signal.Signals(signum).name}")
        port = await self.server.start("127.0.0.1", 0)
        url = f"http://127.0.0.1:{port}"
        write_endpoint(self.args.endpoint_file, url, self.token, self.view_token)
        self.listening_at = time.time()
        append_event(self.args.events, "coordinator-listening", endpoint=url, taskCount=len(self.board.by_id),
                     restored=self.board.restored, **runtime_facts())
        print(f"coordinator: listening on {url} with {len(self.board.by_id)} tasks "
              f"({self.board.restored} restored from the journal)", file=sys.stderr, flush=True)
        print(self.tunnel_hint(port), file=sys.stderr, flush=True)
        self.finish_if_finished()  # everything restored from the journal: nothing left to hand out
        keeper = asyncio.create_task(self.housekeeping())
        await self.stopping.wait()
        return await self.shutdown(keeper)

    def write_outcome(self, reason: str) -> dict[str, Any]:
        """Write results.json, then the end record (both atomic); return the end record.

        Called once: the moment every task has a durable result ("all tasks done"),
        or at shutdown when the run is incomplete. Writing on completion, not on
        SIGTERM, means the files are there when Snakemake checks the service's
        outputs, and they never change after downstream jobs have read them.
        """
        self.outcome_written = True
        atomic_write_json(self.args.results, {"schemaVersion": SCHEMA_VERSION, "results": self.board.sorted_results()})
        summary = self.summary()
        end = {
            "schemaVersion": SCHEMA_VERSION,
            "status": "completed" if self.board.complete else ("failed" if self.board.finished else "incomplete"),
            "reason": reason,
            "taskCount": summary["total"],
            "resultCount": summary["done"],
            "failedTasks": dict(list(self.board.failures.items())[:100]),
            "restored": summary["restored"],
            "expiredLeases": summary["expiredLeases"],
            "inputSha256": self.input_sha256,
            "resultsSha256": sha256_file(self.args.results),
            "startedAt": self.started_at,
            "listeningAt": self.listening_at,
            "endedAt": time.time(),
            "requests": self.server.requests,
            "journalFsyncs": self.journal.fsyncs,
            "workers": summary["workers"],
            "pid": os.getpid(),
        }
        if self.args.end_record:
            atomic_write_json(self.args.end_record, end)
        append_event(self.args.events, "coordinator-end", status=end["status"], reason=reason,
                     resultCount=end["resultCount"])
        self.print_progress()
        if self.live:
            self.draw_live(final=True)
        line = (f"coordinator: {end['status']} ({reason}), {end['resultCount']}/{end['taskCount']} results, "
                f"{self.journal.fsyncs} journal fsyncs")
        echo(line)
        print(line, file=sys.stderr, flush=True)
        return end

    def finish_if_finished(self) -> None:
        if self.board.finished and not self.outcome_written:
            failed = len(self.board.failures)
            self.write_outcome("all tasks done" if not failed else
                               f"{failed} task(s) failed {self.board.max_attempts} times: "
                               + ", ".join(list(self.board.failures)[:5]))

    async def shutdown(self, keeper: asyncio.Task[None]) -> int:
        self.draining = True
        print(f"coordinator: stopping ({self.stop_reason}); draining", file=sys.stderr, flush=True)
        deadline = time.monotonic() + self.args.drain_seconds
        # Let requests already inside the handler (waiting for their fsync) finish.
        while self.journal.busy and time.monotonic() < deadline:
            await asyncio.sleep(0.005)
        await self.server.close()
        keeper.cancel()
        await self.journal.drain()
        self.journal.close()
        try:
            os.unlink(self.args.endpoint_file)
        except FileNotFoundError:
            pass
        if not self.outcome_written:  # why the run is incomplete: the allocation's end, if claims stopped for it
            self.write_outcome(ALLOCATION_ENDING if self.allocation_ending else self.stop_reason)
        print(f"coordinator: stopped ({self.stop_reason})", file=sys.stderr, flush=True)
        return 0 if self.board.complete else EXIT_TEMPFAIL


def parse_args(argv: list[str] | None):
    parser = ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--input", required=True, help="task document (inputs/tasks.json)")
    parser.add_argument("--results", required=True, help="where to write results.json when the run ends")
    parser.add_argument("--scratch", default=os.environ.get("ALLOCSTACK_SCRATCH"),
                        help="job-scoped scratch dir (default $ALLOCSTACK_SCRATCH); holds endpoint.json and events.jsonl")
    parser.add_argument("--endpoint-file", help="where to publish the endpoint and token (default SCRATCH/endpoint.json)")
    parser.add_argument("--events", help="event log to append to (default SCRATCH/events.jsonl)")
    parser.add_argument("--journal", help="durable results journal (default: next to --results)")
    parser.add_argument("--end-record", help="where to write the record of how the coordinator ended")
    parser.add_argument("--service-file", help="file written once listening (the Snakemake service output)")
    parser.add_argument("--max-attempts", type=positive_int, default=3,
                        help="a task whose handler fails is handed out again until it failed this many times")
    parser.add_argument("--workers", type=positive_int, default=1,
                        help="expected number of workers: a claim gets at most pending/workers tasks")
    parser.add_argument("--lease-seconds", type=positive_float, default=60.0, help="a claimed task returns to the queue after this")
    parser.add_argument("--idle-timeout", type=non_negative_float, default=900.0, help="stop after this many seconds without a request (0 = never)")
    parser.add_argument("--lifetime", type=non_negative_float, default=0.0, help="stop after this many seconds in all (0 = no limit)")
    parser.add_argument("--stop-claims-at", type=float, default=_slurm_end_time(),
                        help="epoch seconds after which no claim is granted if a lease would outlast it "
                             "(default: $SLURM_JOB_END_TIME)")
    parser.add_argument("--drain-seconds", type=non_negative_float, default=5.0, help="bound on draining in-flight results at shutdown")
    parser.add_argument("--progress-interval", type=positive_float, default=5.0, help="seconds between progress lines")
    parser.add_argument("--progress", choices=["auto", "live", "lines"], default="auto",
                        help="stdout: a live line redrawn in place (live), a line every --progress-interval "
                             "(lines), or live when stdout is a terminal (auto)")
    parser.add_argument("--max-body-bytes", type=positive_int, default=32 << 20, help="largest request body accepted")
    parser.add_argument("--connection-timeout", type=positive_float, default=120.0, help="close a connection idle this long")
    args = parser.parse_args(argv)
    scratch_defaults(args)
    if not args.endpoint_file:
        parser.error("--endpoint-file is required when no --scratch (or $ALLOCSTACK_SCRATCH) is given")
    args.journal = args.journal or os.path.join(os.path.dirname(os.path.abspath(args.results)), "journal.jsonl")
    return args


def _slurm_end_time() -> float:
    value = os.environ.get("SLURM_JOB_END_TIME", "")
    return float(value) if value.isdigit() else 0.0


def start_fresh(args) -> None:
    """Before anything else: announce the process, and clear what an earlier run left in scratch.

    The service file tells Snakemake the coordinator process is up (see
    :func:`write_service_file`); a stale endpoint or event log from a crashed run
    must not be mistaken for this run's.
    """
    if args.service_file:
        write_service_file(args.service_file)
    if args.end_record:
        Path(args.end_record).unlink(missing_ok=True)
    if args.scratch:
        ensure_private_dir(Path(args.scratch))
    for stale in (args.endpoint_file, args.events):
        if stale:
            Path(stale).unlink(missing_ok=True)


def record_startup_failure(args, error: AllocstackError) -> None:
    """An end record for a coordinator that never served, so the gate can fail fast with the reason."""
    if args.end_record:
        atomic_write_json(args.end_record, {"schemaVersion": SCHEMA_VERSION, "status": "failed",
                                            "reason": error.line(), "endedAt": time.time()})


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        start_fresh(args)
        tasks = load_tasks(args.input)
        input_sha256 = sha256_file(args.input)
        journal_path = Path(args.journal)
        journal_path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        restored, note = replay(journal_path, input_sha256)
        print(f"coordinator: journal {journal_path}: {note}", file=sys.stderr, flush=True)
        board = TaskBoard(tasks.tasks, args.lease_seconds, args.max_attempts)
        board.restore(restored)
        journal = Journal(journal_path, input_sha256)
    except AllocstackError as error:
        record_startup_failure(args, error)
        return report(error)
    return asyncio.run(Coordinator(args, board, journal, input_sha256).run())


if __name__ == "__main__":
    sys.exit(run(main))
