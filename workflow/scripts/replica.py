#!/usr/bin/env python3
"""A long-running worker (config ``worker.mode: long-running``): your program, once, for the stack's life.

Compose's ``deploy.replicas`` copies of your worker: each waits for every
readiness gate, then runs ``worker.command`` once (no per-task protocol: your
program talks to your own services itself) with ``ALLOCSTACK_WORKER_ID``
(``worker-01``...), ``ALLOCSTACK_REPLICA_INDEX`` (0..N-1), ``ALLOCSTACK_WORKERS`` (N),
every service's ``ALLOCSTACK_<NAME>_*`` variables, the named volumes'
``ALLOCSTACK_VOLUME_*`` and ``worker.environment`` (see allocstack/launch/program.py).
Signals are passed on to it; it is stopped when its launcher is gone. Off the
first node (config ``nodes`` above 1) the services' variables name the local ends
of their TLS tunnels (``allocstack/launch/tunnel.py``): your program does not change.

With ``--max-lifetime`` (config ``worker.max_lifetime``) a program still running after that many seconds
(a daemon that never ends by itself) is stopped (SIGTERM, ``--stop-grace``, SIGKILL), one line says
max_lifetime ended it, and its record is written (status ``stopped``): the run goes on to the check.

With a restart policy (``--restart``, config ``worker.restart``: allocstack/launch/restart.py) a program
that ended by itself is started again in this same job step after the policy's delay, each restart a
``worker-restart`` event and a line in this log; stopped by allocstack (``main`` ended, max_lifetime, the
stack's end), it is never restarted.

Exit codes: 0 your program exited 0, or max_lifetime ended it (the worker's record is written); 75 it
exited otherwise or was stopped, with one line naming the replica, how it
ended and its last line of stderr: the run fails; 69 a gate did not pass.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from allocstack import SCHEMA_VERSION
from allocstack.common import names
from allocstack.common.cli import (
    ArgumentParser,
    add_gate_arguments,
    add_placement_arguments,
    add_program_arguments,
    add_started_arguments,
    positive_int,
    run,
    runtime_facts,
)
from allocstack.common.endpoint import services_environment
from allocstack.common.errors import EXIT_OK, AllocstackError, report
from allocstack.common.events import append_event
from allocstack.common.jsonio import atomic_write_json
from allocstack.common.scratch import make_private
from allocstack.launch import exposure
from allocstack.launch.program import Placement, await_dependencies, describe, prepare, program_environment
from allocstack.launch.restart import RestartPolicy, exhausted
from allocstack.launch.restart import add_arguments as add_restart_arguments
from allocstack.launch.supervise import Outcome, Supervised
from allocstack.launch.tunnel import remote_services_environment


class Lifetime:
    """config worker.max_lifetime: over once the program ran that long (None: never); :attr:`ended` says it was."""

    def __init__(self, seconds: float | None) -> None:
        self.deadline = time.monotonic() + seconds if seconds else None
        self.ended = False

    def over(self) -> bool:
        if self.deadline is not None and time.monotonic() >= self.deadline:
            self.ended = True
        return self.ended


def replica_variables(worker: str, index: int, workers: int) -> dict[str, str]:
    return {"ALLOCSTACK_WORKER_ID": worker, "ALLOCSTACK_REPLICA_INDEX": str(index), "ALLOCSTACK_WORKERS": str(workers)}


def parse_args(argv: list[str] | None):
    parser = ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--worker-id", required=True, help="e.g. worker-01")
    parser.add_argument("--index", type=int, required=True, help="replica index, 0..workers-1")
    parser.add_argument("--workers", type=positive_int, required=True, help="how many replicas run")
    add_program_arguments(parser, "your worker program", required=False)
    add_placement_arguments(parser)
    parser.add_argument("--uses-coordinator", action="store_true",
                        help="also the built-in coordinator's variables (ALLOCSTACK_COORDINATOR_*)")
    add_gate_arguments(parser)
    add_started_arguments(parser)
    parser.add_argument("--stop-when-main-ends", metavar="NAME",
                        help="config main: stop the program once NAME ended (SIGTERM, --stop-grace, SIGKILL)")
    parser.add_argument("--max-lifetime", type=float, default=None,
                        help="config worker.max_lifetime: stop the program once it ran this many seconds (SIGTERM, "
                             "--stop-grace, SIGKILL); its record is written and the run goes on")
    parser.add_argument("--stop-grace", type=float, default=10.0,
                        help="seconds from SIGTERM to SIGKILL when the main program ended or max_lifetime passed")
    add_restart_arguments(parser)
    parser.add_argument("--record", type=Path, help="this worker's record (JSON), written when it exited 0")
    parser.add_argument("--events", type=Path, help=f"event log (default SCRATCH/{names.component_events('WORKER')})")
    parser.add_argument("--endpoint-file", type=Path,
                        help="off the first node: the coordinator's endpoint published for the other nodes")
    parser.add_argument("--remote-services", type=Path,
                        help="off the first node: where your services are published for the other nodes")
    args = parser.parse_args(argv)
    if args.scratch is None:
        parser.error("--scratch (or $ALLOCSTACK_SCRATCH) is required")
    if not 0 <= args.index < args.workers:
        parser.error("--index must be in 0..workers-1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    worker = args.worker_id
    log = lambda message: print(f"{worker}: {message}", file=sys.stderr, flush=True)  # noqa: E731
    events = args.events or args.scratch / names.component_events(worker)
    program = Supervised(worker)
    try:
        make_private(events.parent)
        events.unlink(missing_ok=True)
        await_dependencies(args.gate_record, args.started, args.scratch, args.gate_timeout, log)
        if args.remote_services:  # off the first node: through the TLS tunnels
            services = remote_services_environment(args.remote_services, args.uses,
                                                   args.endpoint_file if args.uses_coordinator else None,
                                                   scratch=args.scratch)
        else:
            services = services_environment(args.scratch, args.uses, args.uses_coordinator)
        stack = {**services, **replica_variables(worker, args.index, args.workers)}
        env = program_environment(os.environ, stack, args.environment_json, "worker")
        how = prepare(Placement.from_args(args), args.command_json, env, set(args.environment_json),
                      args.scratch / names.PROGRAMS / worker, "worker")
        if how.container:
            log(f"in its image: {how.line()}")
        started = time.time()
        append_event(events, "worker-start", worker=worker,
                     **{**runtime_facts(), **({"container": how.container} if how.container else {})})
        pid = program.start(how.argv, how.env, cwd=how.cwd, deliver=how.deliver, preexec=how.preexec,
                            grace=args.stop_grace if args.stop_when_main_ends or args.max_lifetime else None)
    except AllocstackError as error:
        append_event(events, "worker-end", worker=worker, status=error.diag)
        return report(error)
    main_ended = args.scratch / names.MAIN_ENDED
    policy = RestartPolicy.from_args(args)
    lifetime = Lifetime(args.max_lifetime)
    watching = [exposure.watch(pid, "worker", worker, events)]  # what it listens on beyond loopback

    def restarted(attempt: int, ended: Outcome, pid: int) -> None:
        append_event(events, "worker-restart", worker=worker, attempt=attempt, exitCode=ended.code, how=ended.how(),
                     pid=pid)
        watching[0].set()
        watching[0] = exposure.watch(pid, "worker", worker, events)

    outcome = program.wait(stop_when=lambda: (bool(args.stop_when_main_ends) and main_ended.exists()) or lifetime.over(),
                           restart=policy, on_restart=restarted)
    watching[0].set()
    ended = time.time()
    by_main = bool(args.stop_when_main_ends) and outcome.stopped_by is not None and main_ended.exists()
    by_lifetime = not by_main and outcome.stopped_by is not None and lifetime.ended
    status = "stopped" if (by_main and outcome.clean_stop) or by_lifetime else "done" if outcome.code == 0 else "failed"
    append_event(events, "worker-end", worker=worker, status=status, exitCode=outcome.code,
                 **({"by": "max_lifetime"} if by_lifetime else {}))
    if by_lifetime:
        killed = f"killed after its stop_grace_period ({args.stop_grace:g} s)" if outcome.killed else outcome.how()
        log(f"{describe(how.shown)} still ran after worker.max_lifetime ({args.max_lifetime:g} s): max_lifetime "
            f"ended it (SIGTERM; {killed}); the run goes on to the check")
    if by_main and outcome.killed:
        return report(AllocstackError("worker-exit", f"{worker} ({describe(how.shown)}) did not stop within its "
                                                     f"stop_grace_period ({args.stop_grace:g} s) after main "
                                                     f"{args.stop_when_main_ends} ended: killed"))
    if by_main and status == "stopped":
        log(f"{describe(how.shown)} stopped ({outcome.how()}) after main {args.stop_when_main_ends} ended")
    elif outcome.code != 0 and not by_lifetime:
        why = " (stopped by allocstack)" if outcome.stop_signal is not None else ""
        given_up = exhausted(policy, outcome.code, program.stopping, outcome.restarts)
        why += f"; {given_up}" if given_up else ""
        return report(AllocstackError("worker-exit", f"{worker} ({describe(how.shown)}) {outcome.how()}{why}"))
    if args.record:
        atomic_write_json(args.record, {"schemaVersion": SCHEMA_VERSION, "workerId": worker, "status": status,
                                        "mode": "long-running", "exitCode": outcome.code, "startedAt": started,
                                        "endedAt": ended, "restarts": outcome.restarts}, 0o644)
    if status == "done":
        log(f"{describe(how.shown)} exited 0 after {ended - started:.3f} s")
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(run(main))
