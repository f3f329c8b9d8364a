#!/usr/bin/env python3
"""The coordinator: hands out tasks over loopback HTTP and durably collects results.

Lifecycle: parse -> validate input -> replay journal -> check disk room -> bind
127.0.0.1:0 -> publish endpoint file (0600, with a fresh bearer token) -> serve
-> drain -> exit.

With ``--network-endpoint-file`` (config ``nodes`` above 1) it also listens on this
node's network address (``--interface``, else the address the hostname resolves to)
for workers on the other nodes: TLS with a certificate made at start, whose
fingerprint is published with the endpoint and token in that file (``--no-tls``:
plain HTTP, where the center says so). Every bound of the loopback listener (token
before body, connection and byte caps, strict parsing) holds there too.

Protocol (JSON bodies; all but /health need ``Authorization: Bearer <token>``,
checked from the headers before any body byte is read):

* ``GET /health`` -> exactly ``{"status": "ready", "schemaVersion": 1, "taskCount": N}``
* ``POST /claim {"workerId", "max"?, "results"?, "node"?}`` -> ``{"status": "task", "task"|"tasks"}``,
  ``{"status": "wait", "retryAfter"}``, ``{"status": "done"}`` or ``{"status": "stop", "reason"}``
  (the run is ending, or cannot store more). Results piggybacked on a claim are acknowledged first.
* ``POST /result {"workerId", "taskId", "output", "sha256"}`` -> 201 accepted,
  409 duplicate or unclaimed, 400 bad schema or digest.
* ``POST /results {"workerId", "results": [...]}`` -> 200 with accepted and rejected ids.
* ``POST /heartbeat {"workerId", "taskIds"}`` -> ``{"held": [...]}`` (renews leases).
* ``POST /fail {"workerId", "taskId", "reason"}`` -> ``{"status": "requeued"|"failed"}``: the
  task's handler failed; it is handed out again until it has failed ``--max-attempts`` times.
* ``POST /batch {"requests": [{"path", "body"}, ...]}`` -> ``{"responses": [{"status", "body"}, ...]}``:
  several workers' /claim, /results, /result, /heartbeat and /fail in one round trip, each answered
  as if it had come alone (a job step of several workers sends them through its relay).
* ``GET /status`` -> counts, rate, per-worker and per-node stats (``?history=1`` adds the
  progress series); ``GET /ui`` -> the live status page. Both also accept the read-only
  view token as ``?token=`` (a browser cannot send a header through a tunnel URL).

A result is acknowledged only after it is fsync'd in the journal. When the journal
cannot be written (a full disk, an exhausted quota) results are answered 507,
claims ``stop``, and one ``[storage]`` line names the path and the free space; a
rerun resumes once there is room. On SIGTERM/SIGINT, idle timeout, lifetime, or
the loss of its parent it stops granting claims, drains, writes ``results.json``
and an end record, removes the endpoint file and exits: 0 when every task has a
result, 74 after a storage fault, 75 otherwise.
"""

from __future__ import annotations

import asyncio
import math
import os
import resource
import shutil
import signal
import sys
import time
from typing import Any

from allocstack.common import identity as identities
from allocstack.common import storage
from allocstack.common.cli import ENDING_SIGNALS, echo, run, runtime_facts, silence_stdout
from allocstack.common.endpoint import (
    TUNNEL_PORT,
    needs_tunnel,
    published_socket,
    tunnel_command,
    write_endpoint,
    write_service_file,
)
from allocstack.common.errors import EXIT_IO, EXIT_TEMPFAIL, AllocstackError, report
from allocstack.common.events import append_event
from allocstack.common.jsonio import atomic_write_chunks, read_json
from allocstack.common.loopsignals import ending_quietly
from allocstack.common.names import COORDINATOR_PORT
from allocstack.common.network import NetworkListener, plan_listener
from allocstack.common.scratch import make_private, private_level
from allocstack.common.taskset import load_tasks_and_digest, validated_summary
from allocstack.coordinator import endrecord, eventloop
from allocstack.coordinator.api import CoordinatorApi
from allocstack.coordinator.auth import Tokens
from allocstack.coordinator.httpserver import HttpServer, Limits, Request, Response
from allocstack.coordinator.journal import Journal, produced_otherwise, replay
from allocstack.coordinator.progress import Progress, live_line, progress_line
from allocstack.coordinator.settings import CoordinatorSettings, event_directories, parse_settings
from allocstack.coordinator.taskboard import ALLOCATION_ENDING, TaskBoard
from allocstack.launch import stacknet
from allocstack.launch.lifeline import launcher_alive, launcher_pid
from allocstack.status.stackevents import EventTail

#: Seconds between housekeeping ticks (lease expiry, progress samples, own bounds).
TICK_SECONDS = 0.25
#: Seconds between redraws of the live line.
LIVE_INTERVAL = 0.5
#: Open files besides the connections: the journal, the event log, results.json, the listeners.
FILES_MARGIN = 64


def allow_connections(connections: int) -> None:
    """Let this process hold ``connections`` sockets at once: its soft limit of open files raised toward the hard
    one where it is lower. A hard limit too low is one line in the log: what the kernel refuses past it is a
    client's connection error, which it retries."""
    wanted = connections + FILES_MARGIN
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= wanted:
        return
    target = wanted if hard == resource.RLIM_INFINITY else min(hard, wanted)
    resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    if target < wanted:
        log(f"coordinator: open files are limited to {hard} here (ulimit -Hn), below the {connections} connections "
            "the run may open at once: ask your center for a higher limit, or use fewer job steps")


def peak_rss_mb() -> float:
    """This process's peak resident memory since it started its program (``VmHWM``), in MB.

    Not ``getrusage``'s ``ru_maxrss`` alone: Linux carries that over ``fork`` and ``exec``, so a
    coordinator that Snakemake's shell execs into (launch.py running it in its own process) would
    report Snakemake's own size at the fork.
    """
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        pass
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


def log(line: str) -> None:
    """The coordinator's log is its stderr."""
    print(line, file=sys.stderr, flush=True)


class Coordinator:
    """The lifecycle around the protocol (:class:`CoordinatorApi`): serve, keep house, drain, write the outcome."""

    def __init__(self, settings: CoordinatorSettings, board: TaskBoard, journal: Journal, input_sha256: str,
                 network: NetworkListener | None = None, about: dict[str, Any] | None = None) -> None:
        self.settings = settings
        #: What the end record says about the results beyond the counts (see :func:`prepare`).
        self.about = about or {}
        self.network = network
        #: Where the other nodes reach this coordinator, once :meth:`listen_network` listens there.
        self.network_url: str | None = None
        self.board = board
        self.journal = journal
        self.input_sha256 = input_sha256
        self.tokens = Tokens()
        self.progress = Progress()
        self.api = CoordinatorApi(board, journal, self.progress, event=self.event, on_fault=self.storage_fault,
                                  on_change=self.finish_if_finished, log=log,
                                  stack_events=EventTail(event_directories(settings)))
        self.router = self.api.router()
        limits = Limits(max_body_bytes=settings.max_body_bytes, idle_timeout=settings.connection_timeout,
                        max_connections=settings.max_connections, max_buffered_bytes=settings.max_buffered_bytes)
        self.server = HttpServer(self.handle, admit=self.tokens.admit, limits=limits, log=log)
        self.stopping = asyncio.Event()
        self.stop_reason = ""
        self.last_request = time.monotonic()
        self.outcome_written = False
        self.outcome: asyncio.Future[None] | None = None  # results.json being written on completion
        self.fault: AllocstackError | None = None
        self.reported: set[str] = set()
        # A person watches a terminal: a live line instead of a line every 5 s (the log keeps those).
        self.live = settings.progress == "live" or (settings.progress == "auto" and sys.stdout.isatty())

    async def handle(self, request: Request) -> Response:
        self.last_request = time.monotonic()
        return await self.router.dispatch(request)

    # -- what went wrong, said once -------------------------------------------
    def report_once(self, error: AllocstackError, then: str = "") -> None:
        if error.message not in self.reported:
            self.reported.add(error.message)
            log(error.line() + then)

    def storage_fault(self, error: AllocstackError) -> None:
        """The journal cannot write: grant no more claims, and say so in one line."""
        self.fault = self.fault or error
        self.board.close_claims(f"the coordinator cannot store results: {error.message}")
        self.report_once(error, "; no more claims: free space, then run the same command again (it resumes "
                                "from the journal)")

    def event(self, name: str, **fields: Any) -> None:
        """Append a run event; a full scratch costs the event, never the request."""
        try:
            append_event(self.settings.events, name, **fields)
        except OSError as exc:
            self.report_once(storage.write_error("event log", self.settings.events or "?", exc))

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
            await asyncio.sleep(TICK_SECONDS)
            now = time.monotonic()
            expired = self.board.expire(now)
            if expired:
                log(f"coordinator: {len(expired)} lease(s) expired, requeued: {', '.join(expired[:5])}")
                self.event("leases-expired", count=len(expired), taskIds=expired[:20])
            self.progress.sample(self.board.done)
            if now - last_line >= self.settings.progress_interval:
                last_line = now
                self.print_progress()
            if self.live and not self.outcome_written and now - last_live >= LIVE_INTERVAL:
                last_live = now
                self.draw_live()
            if self.settings.idle_timeout and now - self.last_request > self.settings.idle_timeout:
                self.stop("idle-timeout")
            elif self.settings.lifetime and time.time() - self.progress.started_at > self.settings.lifetime:
                self.stop("lifetime")
            elif os.getppid() != parent or (launcher is not None and not launcher_alive(launcher)):
                self.stop("parent-exit")

    def print_progress(self) -> None:
        """One progress line to the log (stderr) and, unless a live line is drawn there, to stdout.

        stdout is Snakemake's output: the terminal, or under Slurm the job's log.
        """
        line = progress_line(self.progress.summary(self.board))
        if not self.live:  # a closed terminal pipe (| head, a killed tee) drops the line, never the coordinator
            echo(line)
        log(line)

    def draw_live(self, final: bool = False) -> None:
        """The live one-line progress on a terminal, redrawn in place (the final one ends the line)."""
        width = shutil.get_terminal_size((100, 24)).columns - 1  # a wrapped line could not be redrawn
        line = live_line(self.progress.summary(self.board), self.settings.workers)[:width]
        try:
            sys.stdout.write("\r\033[K" + line + ("\n" if final else ""))
            sys.stdout.flush()
        except BrokenPipeError:  # the terminal went away: the line is lost, never the coordinator
            silence_stdout()

    async def listen_network(self) -> None:
        """Listen on the network address for the other nodes (first: nothing is published if it fails).

        :raises AllocstackError: ``network`` when the address cannot be bound.
        """
        if self.network is None:
            return
        try:
            # 0 (any free port), or in the stack's private network the one pasta forwards in from the node's address
            wanted = stacknet.inbound_port(self.settings.endpoint_file.parent, "coordinator")
            port = await self.server.start(self.network.address, wanted, ssl=self.network.tls)
        except OSError as exc:
            raise AllocstackError("network", f"cannot listen on {self.network.address}: {exc.strerror}; the bind "
                                             "address is config network.interface") from exc
        self.network_url = self.network.url(port)

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        for signum in ENDING_SIGNALS:  # it drains, then writes its outcome
            loop.add_signal_handler(signum, self.stop, f"signal:{signal.Signals(signum).name}")
        network_url = self.network_url
        port = await self.server.start("127.0.0.1", 0)
        url = f"http://127.0.0.1:{port}"
        if network_url and self.network and self.settings.network_endpoint_file:
            write_endpoint(self.settings.network_endpoint_file, network_url, self.tokens.token,
                           self.tokens.view_token, tls=self.network.tls is not None,
                           fingerprint=self.network.fingerprint)
        write_endpoint(self.settings.endpoint_file, url, self.tokens.token, self.tokens.view_token)
        self.progress.listening()
        event_loop = eventloop.loop_name()
        self.event("coordinator-listening", endpoint=url, taskCount=len(self.board),
                   restored=self.board.restored, networkEndpoint=network_url, eventLoop=event_loop, **runtime_facts())
        log(f"coordinator: listening on {url} with {len(self.board)} tasks "
            f"({self.board.restored} restored from the journal; event loop: {event_loop})")
        if network_url and self.network:
            how = (f"TLS, certificate SHA-256 {self.network.fingerprint}" if self.network.tls else
                   "PLAIN TEXT (config network.tls: false)")
            log(f"coordinator: listening for the other nodes on {network_url} ({how})")
        if needs_tunnel(os.environ) or published_socket(COORDINATOR_PORT, os.environ):
            log(f"coordinator: status page: {tunnel_command(port, os.environ, name=COORDINATOR_PORT)} ; then open the URL that "
                f"`python workflow/scripts/status.py --url` prints (with {TUNNEL_PORT} as the port)")
        else:
            log(f"coordinator: status page: {url}/ui (`python workflow/scripts/status.py --url` prints it with its "
                "view token)")
        self.finish_if_finished()  # everything restored from the journal: nothing left to hand out
        keeper = asyncio.create_task(self.housekeeping())
        await self.stopping.wait()
        return await self.shutdown(keeper)

    def write_outcome(self, reason: str) -> None:
        """Write results.json, then the end record (both atomic).

        Called the moment every task has a durable result ("all tasks done"), or at shutdown
        when the run is incomplete. Writing on completion, not on SIGTERM, means the files are
        there when Snakemake checks the service's outputs, and they never change after
        downstream jobs have read them. A write that fails (no room) is reported once and
        tried again at shutdown; nothing is half-written.
        """
        try:
            results_sha256 = atomic_write_chunks(self.settings.results, self.board.results_json())
            summary = self.progress.summary(self.board)
            status = (endrecord.COMPLETED if self.board.complete else
                      endrecord.FAILED if self.board.finished else endrecord.INCOMPLETE)
            if self.settings.end_record:
                endrecord.write(
                    self.settings.end_record, status, reason,
                    taskCount=summary["total"], resultCount=summary["done"],
                    failedTasks=dict(list(self.board.failures.items())[:100]), failedCount=len(self.board.failures),
                    restored=summary["restored"],
                    expiredLeases=summary["expiredLeases"], inputSha256=self.input_sha256,
                    resultsSha256=results_sha256, startedAt=self.progress.started_at,
                    listeningAt=self.progress.listening_at, endedAt=time.time(), requests=self.server.requests,
                    journalFsyncs=self.journal.fsyncs, workers=summary["workers"], pid=os.getpid(),
                    peakRssMb=peak_rss_mb(), **self.about)
        except AllocstackError as error:
            self.fault = self.fault or error
            self.report_once(error, "; the run's outcome is not written: free space, then run the same command "
                                    "again (every acknowledged result is in the journal)")
            return
        self.outcome_written = True
        self.event("coordinator-end", status=status, reason=reason, resultCount=summary["done"])
        self.print_progress()
        if self.live:
            self.draw_live(final=True)
        line = (f"coordinator: {status} ({reason}), {summary['done']}/{summary['total']} results, "
                f"{self.journal.fsyncs} journal fsyncs")
        echo(line)
        log(line)

    def finish_if_finished(self) -> None:
        """On completion, write the outcome in a thread: the workers hear "done" at once and end while it is
        written (a million results: a second), and the coordinator ends only once it is written (shutdown)."""
        if self.board.finished and not self.outcome_written and self.outcome is None:
            failed = len(self.board.failures)
            reason = ("all tasks done" if not failed else f"{failed} task(s) failed {self.board.max_attempts} times: "
                      + ", ".join(list(self.board.failures)[:5]))
            self.outcome = asyncio.get_running_loop().run_in_executor(None, self.write_outcome, reason)

    async def shutdown(self, keeper: asyncio.Task[None]) -> int:
        self.board.close_claims("the coordinator is draining")
        log(f"coordinator: stopping ({self.stop_reason}); draining")
        deadline = time.monotonic() + self.settings.drain_seconds
        # Let requests already inside the handler (waiting for their fsync) finish.
        while self.journal.busy and time.monotonic() < deadline:
            await asyncio.sleep(0.005)
        await self.server.close()
        keeper.cancel()
        await self.journal.drain()
        self.journal.close()
        for published in (self.settings.endpoint_file, self.settings.network_endpoint_file):
            if published:
                published.unlink(missing_ok=True)
        if self.outcome is not None:
            await self.outcome  # written, or a fault reported: then written again below
        if not self.outcome_written:  # why the run is incomplete: a storage fault, the allocation's end, ...
            self.write_outcome(f"storage: {self.fault.message}" if self.fault else
                               ALLOCATION_ENDING if self.board.allocation_ending else self.stop_reason)
        log(f"coordinator: stopped ({self.stop_reason})")
        if self.fault is not None:
            return EXIT_IO
        return 0 if self.board.complete else EXIT_TEMPFAIL


def start_fresh(settings: CoordinatorSettings) -> None:
    """Before anything else: announce the process, and clear what an earlier run left in scratch.

    The service file tells Snakemake the coordinator process is up (see
    :func:`write_service_file`); a stale endpoint or event log from a crashed run
    must not be mistaken for this run's.
    """
    if settings.service_file:
        write_service_file(settings.service_file)
    if settings.end_record:
        settings.end_record.unlink(missing_ok=True)
    if settings.scratch:  # the directory it was given: its launcher made and checked it on the host
        make_private(settings.scratch)
    if settings.network_endpoint_file:  # the run's state directory: the other nodes read the endpoint there
        private_level(settings.network_endpoint_file.parent, "prerequisite")
    for stale in (settings.endpoint_file, settings.events, settings.network_endpoint_file):
        if stale:
            stale.unlink(missing_ok=True)


def claims_until(stop_claims_at: float) -> float:
    """The allocation's end (epoch seconds, 0 = unknown) on the monotonic clock the board uses."""
    return time.monotonic() + (stop_claims_at - time.time()) if stop_claims_at else math.inf


def check_room(settings: CoordinatorSettings, board: TaskBoard) -> None:
    """Refuse at once when the journal's and results.json's filesystems cannot hold the run.

    :raises AllocstackError: ``storage``.
    """
    summary = read_json(settings.inputs_summary, "inputs summary", diag="prerequisite") if settings.inputs_summary else {}
    output_bytes = (summary.get("outputBytes") if isinstance(summary, dict) else None) or 0
    every = len(board.tasks), board.tasks.id_bytes()  # (valid ids are ASCII: a character a byte)
    pending = every if not board.restored else storage.id_totals(board.pending_ids())  # a fresh run: every task
    journal, results = storage.estimate(every, output_bytes, pending)
    storage.check_room([("the journal", settings.journal, journal),
                        ("results.json and the marker", settings.results, results)])


def prepare(settings: CoordinatorSettings) -> tuple[TaskBoard, Journal, str, dict[str, Any]]:
    """Load the tasks, replay the journal (set aside first when another program produced it), check for room,
    open the journal. Returns the board, the journal, the task document's digest and what the end record says
    about them (the identity's digest; the journal set aside, where and why).

    :raises AllocstackError: on bad input, a corrupt journal, or no room.
    """
    start_fresh(settings)
    validated = validated_summary(settings.inputs_summary)
    tasks, input_sha256 = load_tasks_and_digest(str(settings.input), validated_sha256=validated.get("inputSha256"),
                                                compact=settings.compact_tasks,
                                                compact_sha256=validated.get("compactTasksSha256"))
    try:
        settings.journal.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as exc:
        raise storage.write_error("state directory", settings.journal.parent, exc) from exc
    produced = validated.get(identities.KEY) if isinstance(validated.get(identities.KEY), dict) else None
    about: dict[str, Any] = {identities.KEY: identities.digest_of(produced)}
    why = produced_otherwise(settings.journal, input_sha256, produced)
    if why is not None:  # another program's results: computed again, the old journal kept beside
        try:
            aside = identities.set_aside(settings.journal)
        except OSError as exc:
            raise storage.write_error("journal", settings.journal, exc) from exc
        about["journalSetAside"] = {"path": str(aside), "because": why}
        line = f"coordinator: {why}: the journal's results are not resumed, kept as {aside}"
        echo(line)
        log(line)
    restored, note = replay(settings.journal, input_sha256)
    log(f"coordinator: journal {settings.journal}: {note}")
    board = TaskBoard(tasks, settings.lease_seconds, settings.max_attempts, expected_workers=settings.workers,
                      claims_until=claims_until(settings.stop_claims_at))
    board.restore(restored)
    check_room(settings, board)
    journal = Journal(settings.journal, input_sha256, group=settings.workers, window=settings.commit_window,
                      identity=produced)
    return board, journal, input_sha256, about


def network_listener(settings: CoordinatorSettings) -> NetworkListener | None:
    """The address for the other nodes (config network.*) and the run's TLS context, before anything listens.

    :raises AllocstackError: ``network`` for a wrong or unreachable address, ``prerequisite``
        when the certificate cannot be made.
    """
    if settings.network_endpoint_file is None:
        return None
    return plan_listener(settings.interface, settings.address, settings.no_tls, settings.endpoint_file.parent,
                         "coordinator")


def startup_failed(settings: CoordinatorSettings, error: AllocstackError) -> int:
    """Before serving: record why in the end record, so the gate fails at once with the reason."""
    if settings.end_record:
        try:
            endrecord.write_startup_failure(settings.end_record, error, time.time())
        except AllocstackError as unwritable:
            report(unwritable)
    return report(error)


async def serve(coordinator: Coordinator) -> int:
    """Listen for the other nodes first (a wrong address is a startup failure), then run."""
    try:
        await coordinator.listen_network()
    except AllocstackError as error:
        return startup_failed(coordinator.settings, error)
    return await coordinator.run()


def main(argv: list[str] | None = None) -> int:
    settings = parse_settings(argv, __doc__.split("\n\n")[0])
    allow_connections(settings.max_connections)
    try:
        board, journal, input_sha256, about = prepare(settings)
        network = network_listener(settings)
    except AllocstackError as error:
        return startup_failed(settings, error)
    except OSError as exc:  # what the system refused where no step expected it: still one line, and the record
        return startup_failed(settings, AllocstackError("io", f"the coordinator cannot start: {exc}"))
    return eventloop.run(ending_quietly(serve(Coordinator(settings, board, journal, input_sha256, network, about)),
                                        ENDING_SIGNALS))


if __name__ == "__main__":
    sys.exit(run(main))
