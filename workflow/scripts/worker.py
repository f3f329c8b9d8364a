#!/usr/bin/env python3
"""A worker: claims tasks from the coordinator until there are none left.

Each round trip posts the results of the previous batch and claims the next one
(up to ``--batch`` tasks). Long tasks keep their leases alive with heartbeats.
Every wait is bounded: consecutive "wait" answers by ``--wait-timeout``, an
unreachable coordinator by ``--connect-timeout``.

A task whose handler fails (the built-in one, or ``--command-json``, the user's
program run once per task) is reported to the coordinator, which hands it out
again until it has failed ``max_attempts`` times; the worker goes on.

Each claim asks for at most ``--batch`` tasks, and no more than half a lease of work
at the pace measured so far: work in hand always fits in a lease.

A ``--command-json`` program that cannot be started at all (no such file, not executable)
fails no task: the worker ends at once with one ``config`` line naming worker.command.

Exit codes: 0 all tasks done (or failed for good), or the coordinator stopped the run
(the allocation ends, or it is draining: the record says "stopped: REASON"); 64 bad
arguments; 69 the coordinator could not be reached; 75 the wait bound was hit;
77 the token was refused; 78 worker.command cannot be started; 130 Ctrl-C.
"""

from __future__ import annotations

import functools
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from operator import itemgetter
from pathlib import Path
from typing import Any

from allocstack import SCHEMA_VERSION
from allocstack.common import names
from allocstack.common.cli import (
    EXIT_INTERRUPTED,
    ArgumentParser,
    add_gate_arguments,
    add_started_arguments,
    argv_list,
    json_object,
    non_negative_float,
    positive_float,
    positive_int,
    run,
    runtime_facts,
    scratch_defaults,
)
from allocstack.common.endpoint import (
    Endpoint,
    instances_environment,
    local_instances,
    read_endpoint,
    require_loopback,
    services_environment,
)
from allocstack.common.errors import EXIT_OK, EXIT_TEMPFAIL, AllocstackError, report
from allocstack.common.events import append_event, ensure_log_dir
from allocstack.common.jsonio import atomic_write_json, sha256_texts
from allocstack.launch.lifeline import watch_launcher
from allocstack.launch.program import await_dependencies, expand_argv, program_environment
from allocstack.worker.client import CoordinatorClient
from allocstack.worker.handlers import TaskFailure, baseline, command_handler
from allocstack.worker.httpclient import ConnectFailed, TimedOut, TransportError

Handler = Callable[[str, dict[str, Any]], str]


@dataclass
class Tally:
    claims: int = 0
    completed: int = 0
    failed: int = 0
    rejected: int = 0
    waits: int = 0
    current: list[str] = field(default_factory=list)
    batch_started: float = 0.0


def make_results(done: list[tuple[str, str]]) -> list[dict[str, Any]]:
    """The results of ``done`` (task id, output) as the coordinator takes them, digests computed in one pass."""
    return [{"taskId": task_id, "output": output, "sha256": digest}
            for (task_id, output), digest in zip(done, sha256_texts([output for _, output in done]), strict=True)]


def simulated(handler: Handler, seconds: float) -> Handler:
    """Wrap ``handler`` so each task also takes ``seconds`` (to show leases, time limits, kills)."""
    if seconds <= 0:
        return handler

    def slow(task_id: str, payload: dict[str, Any]) -> str:
        time.sleep(seconds)
        return handler(task_id, payload)

    return slow


class Heartbeat(threading.Thread):
    """Renews the leases of the batch in hand when it has run longer than a third of a lease."""

    def __init__(self, endpoint: Endpoint, worker: str, tally: Tally, lease: float) -> None:
        super().__init__(daemon=True, name="heartbeat")
        self.client = CoordinatorClient(endpoint.url, endpoint.token, timeout=max(1.0, lease / 3),
                                        fingerprint=endpoint.fingerprint)
        self.worker, self.tally, self.period = worker, tally, lease / 3
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.wait(self.period / 2):
            current = list(self.tally.current)
            if current and time.monotonic() - self.tally.batch_started > self.period:
                try:
                    self.client.heartbeat(self.worker, current)
                except (TransportError, AllocstackError):
                    pass  # the main loop notices a dead coordinator; leases just expire


@functools.cache
def node_name() -> str:
    """This worker's node as Slurm names it (the status shows workers per node); sent with every claim."""
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname()


def claim_with_retry(client: CoordinatorClient, worker: str, batch: int, results: list[dict[str, Any]],
                     connect_timeout: float) -> dict[str, Any]:
    """One claim round trip, retried on connection errors for at most ``connect_timeout`` seconds.

    :raises AllocstackError: ``prerequisite`` when the coordinator stays unreachable.
    """
    deadline = time.monotonic() + connect_timeout
    delay = 0.05
    while True:
        try:
            return client.claim(worker, batch, results, node=node_name())
        except (ConnectFailed, TimedOut) as exc:
            if time.monotonic() + delay > deadline:
                raise AllocstackError(
                    "prerequisite", f"coordinator {client.url} unreachable for {connect_timeout:g} s ({type(exc).__name__})"
                ) from exc
            time.sleep(delay)
            delay = min(delay * 2, 1.0)


#: Results of a batch are posted at least this often while the batch runs, so slow
#: tasks are acknowledged (and survive a crash) without waiting for the whole batch.
FLUSH_SECONDS = 1.0
#: Results are posted in requests of at most about this many output bytes (the
#: coordinator refuses bodies over --max-body-bytes, 32 MiB by default).
MAX_POST_BYTES = 8 << 20


def post_large(client: CoordinatorClient, worker: str, results: list[dict[str, Any]], tally: Tally,
               log: Callable[[str], None]) -> list[dict[str, Any]]:
    """Post all but the last ~MAX_POST_BYTES of ``results`` now; return what is left to ride on the next claim."""
    if sum(map(len, map(itemgetter("output"), results))) <= MAX_POST_BYTES:
        return results  # the usual batch: it all rides on the next claim
    chunk: list[dict[str, Any]] = []
    size = 0
    for result in results:
        if chunk and size + len(result["output"]) > MAX_POST_BYTES:
            count(client.post_results(worker, chunk), tally, log)
            chunk, size = [], 0
        chunk.append(result)
        size += len(result["output"])
    return chunk


def count(reply: dict[str, Any], tally: Tally, log: Callable[[str], None]) -> None:
    tally.completed += len(reply.get("accepted", ()))
    for rejection in reply.get("rejected", ()):
        tally.rejected += 1
        log(f"result for {rejection.get('taskId')} rejected: {rejection.get('code')} {rejection.get('reason')}")


def report_failure(client: CoordinatorClient, worker: str, task_id: str, reason: str, tally: Tally,
                   log: Callable[[str], None]) -> None:
    tally.failed += 1
    log(f"task {task_id} failed: {reason[-500:]}")
    try:
        outcome = client.fail(worker, task_id, reason).get("status", "?")
    except TransportError as exc:  # the lease expires and the task is handed out again anyway
        outcome = f"not reported ({type(exc).__name__})"
    log(f"task {task_id}: {outcome}")


def claim_size(batch: int, lease: float, seconds_per_task: float | None) -> int:
    """How many tasks to claim: ``batch``, but no more than half a lease of work at the pace so far.

    Work in hand then always fits in a lease; and when the coordinator stops claims because
    less than one lease remains in the allocation, every worker finishes what it holds before
    the allocation ends, so no result is computed and then lost with it. The first claim asks
    for one task, which measures the pace.
    """
    if seconds_per_task is None:
        return 1
    if seconds_per_task <= 0:
        return batch
    return max(1, min(batch, int(lease / 2 / seconds_per_task)))


def work(client: CoordinatorClient, worker: str, handler: Handler, batch: int, wait_timeout: float,
         connect_timeout: float, tally: Tally, log: Callable[[str], None], lease: float = 60.0) -> str:
    """Claim and run tasks until the coordinator says done ("done") or stop ("stopped: REASON").

    :raises AllocstackError: ``worker-exit`` when no work comes within ``wait_timeout`` or the
        coordinator answers something unexpected.
    """
    results: list[dict[str, Any]] = []
    waited_since: float | None = None
    busy, ran = 0.0, 0  # seconds spent in the handler, and tasks run: the pace
    while True:
        results = post_large(client, worker, results, tally, log)
        wanted = claim_size(batch, lease, busy / ran if ran else None)
        reply = claim_with_retry(client, worker, wanted, results, connect_timeout)
        tally.claims += 1
        count(reply, tally, log)
        results = []
        status = reply.get("status")
        if status == "task":
            waited_since = None
            tasks = reply["tasks"]
            ids = [t["id"] for t in tasks]
            tally.current, tally.batch_started = ids, time.monotonic()
            done: list[tuple[str, str]] = []  # (task id, output): digests and records once per post
            flushed = last = time.monotonic()
            for position, task in enumerate(tasks, start=1):
                failure = None
                try:
                    done.append((task["id"], handler(task["id"], task["payload"])))
                except AllocstackError:
                    raise  # the handler cannot run any task (worker.command cannot be started): the run ends
                except Exception as exc:  # noqa: BLE001  (a handler may raise anything: that task's failure, not ours)
                    failure = str(exc) if isinstance(exc, TaskFailure) else f"{type(exc).__name__}: {exc}"
                now = time.monotonic()
                busy, ran = busy + now - last, ran + 1
                last = now
                if failure is not None:
                    report_failure(client, worker, task["id"], failure, tally, log)
                    last = time.monotonic()  # reporting it is not the task's time
                    continue
                if position < len(tasks) and now - flushed > FLUSH_SECONDS:
                    try:  # a slow batch: acknowledge what is done now (the last result rides on the next claim)
                        count(client.post_results(worker, make_results(done)), tally, log)
                        done, tally.current = [], ids[position:]
                    except TransportError as exc:
                        log(f"could not post results mid-batch ({type(exc).__name__}); they go with the next claim")
                    flushed = last = time.monotonic()
            results = make_results(done)
            tally.current = []
        elif status == "wait":
            now = time.monotonic()
            waited_since = waited_since or now
            tally.waits += 1
            if now - waited_since > wait_timeout:
                raise AllocstackError("worker-exit", f"no task became available for {wait_timeout:g} s")
            time.sleep(float(reply.get("retryAfter", 0.1)))
        elif status == "done":
            return "done"
        elif status == "stop":
            # Not a failure of this worker: it did all it was given. Exiting 0 lets the other
            # workers finish what they hold (Snakemake kills a group when one member fails); the
            # coordinator's end record says the run is incomplete, and verification fails it.
            reason = reply.get("reason", "the coordinator is draining")
            log(f"stopping: the coordinator stopped the run ({reason})")
            return f"stopped: {reason}"
        else:
            raise AllocstackError("worker-exit", f"unexpected claim answer {str(reply)[:200]}")


def parse_args(argv: list[str] | None):
    parser = ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--worker-id", default=os.environ.get("ALLOCSTACK_WORKER_ID"),
                        help="e.g. worker-01 (default $ALLOCSTACK_WORKER_ID, set for long-running workers)")
    parser.add_argument("--scratch", type=Path, default=os.environ.get("ALLOCSTACK_SCRATCH") or None,
                        help=f"job-scoped scratch (default $ALLOCSTACK_SCRATCH): {names.ENDPOINT} and {names.EVENTS}")
    parser.add_argument("--endpoint-file", help=f"endpoint file (default SCRATCH/{names.ENDPOINT})")
    parser.add_argument("--events", type=Path, help=f"event log (default SCRATCH/{names.EVENTS})")
    parser.add_argument("--remote-services", type=Path,
                        help="off the first node (more than one node): where your services are published for the "
                             "other nodes; each is reached through a local end of its TLS tunnel")
    parser.add_argument("--local-service", action="append", default=[],
                        help="off the first node: NAME=INSTANCE, a global service reached at its instance on this "
                             "node (SCRATCH/services/INSTANCE.json), not through the tunnel (repeatable)")
    add_gate_arguments(parser)
    add_started_arguments(parser)
    parser.add_argument("--record", type=Path, help="write this worker's record (JSON) here at the end")
    parser.add_argument("--batch", type=positive_int, default=1, help="tasks claimed per round trip")
    parser.add_argument("--command-json", type=argv_list, default=None,
                        help='the user\'s program as a JSON argv list, run once per task, e.g. \'["python3", "x.py"]\'')
    parser.add_argument("--environment-json", type=json_object, default={},
                        help="with --command-json: more variables for the program (config worker.environment)")
    parser.add_argument("--uses", action="append", default=[],
                        help="your own service whose ALLOCSTACK_<NAME>_* variables the program gets (repeatable)")
    parser.add_argument("--task-timeout", type=non_negative_float, default=0.0, help="seconds per task (0 = none)")
    parser.add_argument("--simulate-seconds", type=non_negative_float, default=0.0, help="extra seconds per task")
    parser.add_argument("--wait-timeout", type=positive_float, default=300.0, help="bound on waiting for work")
    parser.add_argument("--connect-timeout", type=positive_float, default=30.0, help="bound on an unreachable coordinator")
    parser.add_argument("--lease-seconds", type=positive_float, default=60.0, help="the coordinator's lease (heartbeat period /3)")
    args = parser.parse_args(argv)
    scratch_defaults(args)
    if not args.worker_id:
        parser.error("--worker-id (or $ALLOCSTACK_WORKER_ID) is required")
    if not args.endpoint_file and not os.environ.get("ALLOCSTACK_COORDINATOR_ENDPOINT"):
        parser.error("--endpoint-file is required when no --scratch (or $ALLOCSTACK_SCRATCH) is given "
                     "(or $ALLOCSTACK_COORDINATOR_ENDPOINT, as a long-running worker gets it)")
    ensure_log_dir(args.events)
    return args


def coordinator(endpoint_file: str | None) -> Endpoint:
    """The coordinator's endpoint: from its endpoint file, else (run as a long-running worker of yours)
    from ``$ALLOCSTACK_COORDINATOR_ENDPOINT`` and ``_TOKEN``."""
    if endpoint_file:
        return read_endpoint(endpoint_file)
    return Endpoint(require_loopback(os.environ["ALLOCSTACK_COORDINATOR_ENDPOINT"]),
                    os.environ["ALLOCSTACK_COORDINATOR_TOKEN"])


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    worker, tally = args.worker_id, Tally()
    started = time.time()
    log = lambda message: print(f"{worker}: {message}", file=sys.stderr, flush=True)  # noqa: E731
    status, code = "done", EXIT_OK

    def orphaned() -> None:
        log("launcher gone (the job was killed): stopping")
        os._exit(EXIT_TEMPFAIL)

    watch_launcher(orphaned)
    try:
        await_dependencies(args.gate_record, args.started, args.scratch, args.gate_timeout, log)
        if args.remote_services:  # off the first node: your services through their TLS tunnels
            from allocstack.launch.tunnel import remote_services_environment  # asyncio: only here (~20 ms to import)

            here = local_instances(args.local_service)
            os.environ.update(remote_services_environment(args.remote_services,
                                                          [name for name in args.uses if name not in here],
                                                          scratch=args.scratch))
            os.environ.update(instances_environment(args.scratch, here))
        elif args.scratch:  # your own services' variables (config services), for your program
            os.environ.update(services_environment(args.scratch, args.uses))
        endpoint = coordinator(args.endpoint_file)
        append_event(args.events, "worker-start", worker=worker, node=node_name(), **runtime_facts())
        client = CoordinatorClient(endpoint.url, endpoint.token, fingerprint=endpoint.fingerprint)
        heartbeat = Heartbeat(endpoint, worker, tally, args.lease_seconds)
        heartbeat.start()
        try:
            if args.command_json:
                env = program_environment(os.environ, {}, args.environment_json, "worker")
                os.environ.update(env)
                # Off the first node the run's scratch may not exist here: then the node's own temp dir.
                private = str(args.scratch) if args.scratch and args.scratch.is_dir() else None
                handler = command_handler(expand_argv(args.command_json, env, "worker"), args.task_timeout or None,
                                          private)
            else:
                handler = lambda _task_id, payload: baseline(payload)  # noqa: E731
            handler = simulated(handler, args.simulate_seconds)
            status = work(client, worker, handler, args.batch, args.wait_timeout, args.connect_timeout, tally, log,
                          args.lease_seconds)
        finally:
            heartbeat.stopped.set()
            client.close()
    except AllocstackError as error:
        status, code = error.diag, report(error)
    except KeyboardInterrupt:  # Ctrl-C: one line, no traceback; what is acknowledged is in the journal
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        log("interrupted (SIGINT)")
        status, code = "interrupted", EXIT_INTERRUPTED
    ended = time.time()
    append_event(args.events, "worker-end", worker=worker, status=status, completed=tally.completed, exitCode=code)
    if args.record and code == EXIT_OK:
        try:
            atomic_write_json(args.record, {
                "schemaVersion": SCHEMA_VERSION, "workerId": worker, "status": status,
                "tasksCompleted": tally.completed, "claims": tally.claims, "waits": tally.waits,
                "rejected": tally.rejected, "failed": tally.failed, "startedAt": started, "endedAt": ended,
            }, 0o644)
        except AllocstackError as error:
            code = report(error)
    print(f"{worker}: {status}: {tally.completed} tasks in {ended - started:.3f} s, "
          f"{tally.claims} claims, {tally.waits} waits", flush=True)
    return code


if __name__ == "__main__":
    sys.exit(run(main))
