#!/usr/bin/env python3
"""The stack's main program (config ``main``, Compose's ``--exit-code-from NAME``): your program, once; its end ends
the stack.

A service of yours that drives the run (a producer that queues the work and waits for it): it waits for the gates
of its ``depends_on`` (with ``--started``, only their start: ``service_started``), then runs once, beside the
workers, with its dependencies' ``ALLOCSTACK_<NAME>_*`` variables, the named volumes' ``ALLOCSTACK_VOLUME_*`` and its ``environment`` (allocstack/launch/program.py).
When it ends it notes so in scratch (``main-ended.json``), which tells every long-running worker to stop
(SIGTERM, ``worker.stop_grace_period``, SIGKILL: replica.py); exit 0 writes its record, and the check then runs.

With ``--init`` it runs an init job (config ``init_jobs``; Compose: a service others wait for with
``service_completed_successfully``) instead: once, before what depends on it, within ``--timeout``; exit 0 writes
its record, which is its dependents' gate; its end does not end the stack.

Exit codes: 0 it exited 0; otherwise its own exit status (a signal N: 128 + N), after one line
``[main-exit]`` naming it, its exit code and its last line of stderr: the run fails; 69 a gate did not pass.
An init job that exits otherwise (or outlives ``--timeout``): 70, after one line ``[init-exit]`` naming it,
its exit code and its last line of stderr; its dependents never start.
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
from allocstack.launch.supervise import Outcome, Supervised


def parse_args(argv: list[str] | None):
    parser = ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--name", required=True, help="the service config main names")
    add_program_arguments(parser, "your main program", required=False)
    add_placement_arguments(parser)
    add_gate_arguments(parser)
    add_started_arguments(parser)
    parser.add_argument("--record", type=Path, required=True, help="its record (JSON), written when it exited 0")
    parser.add_argument("--init", action="store_true",
                        help="an init job (config init_jobs): its record is its dependents' gate; it ends no stack")
    parser.add_argument("--timeout", type=float, default=None,
                        help="an init job: seconds it may run before it is stopped (SIGTERM, --stop-grace, SIGKILL)")
    parser.add_argument("--stop-grace", type=float, default=10.0,
                        help="an init job: seconds from SIGTERM to SIGKILL when it outlived --timeout")
    args = parser.parse_args(argv)
    if args.scratch is None:
        parser.error("--scratch (or $ALLOCSTACK_SCRATCH) is required")
    return args


def note_the_end(scratch: Path, name: str, code: int) -> None:
    """Tell the workers (replica.py ``--stop-when-main-ends``) that the main program ended, and how."""
    atomic_write_json(scratch / names.MAIN_ENDED, {"schemaVersion": SCHEMA_VERSION, "main": name, "exitCode": code,
                                                   "endedAt": time.time()})


def init_ended(args, shown: list[str], outcome: Outcome, status: str, started: float, ended: float, log) -> int:
    """An init job ended: exit 0 writes its record (its dependents' gate); otherwise ONE ``[init-exit]`` line."""
    name = args.name
    if status != "done":
        late = (f" (still running after its readiness.timeout, {args.timeout:g} s: stopped by allocstack)"
                if outcome.stopped_by is not None and args.timeout else "")
        return report(AllocstackError("init-exit", f"init job {name} ({describe(shown)}) {outcome.how()}{late}: "
                                                   "what depends on it does not start, and the stack stops"))
    atomic_write_json(args.record, {"schemaVersion": SCHEMA_VERSION, "service": name, "status": "ready",
                                    "role": "init", "exitCode": 0, "startedAt": started, "endedAt": ended}, 0o644)
    log(f"init job {describe(shown)} exited 0 after {ended - started:.3f} s: what depends on it starts")
    return EXIT_OK


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    name = args.name
    log = lambda message: print(f"{name}: {message}", file=sys.stderr, flush=True)  # noqa: E731
    events = args.scratch / names.component_events(name)
    role = "init" if args.init else "main"
    program = Supervised(name)
    try:
        make_private(events.parent)
        events.unlink(missing_ok=True)
        await_dependencies(args.gate_record, args.started, args.scratch, args.gate_timeout, log)
        env = program_environment(os.environ, services_environment(args.scratch, args.uses), args.environment_json,
                                  f"services.{name}")
        how = prepare(Placement.from_args(args), args.command_json, env, set(args.environment_json),
                      args.scratch / names.PROGRAMS / name, f"services.{name}")
        if how.container:
            log(f"in its image: {how.line()}")
        started = time.time()
        append_event(events, f"{role}-start", service=name,
                     **{**runtime_facts(), **({"container": how.container} if how.container else {})})
        pid = program.start(how.argv, how.env, cwd=how.cwd, deliver=how.deliver, preexec=how.preexec,
                            grace=args.stop_grace if args.timeout else None)
    except AllocstackError as error:
        if not args.init:
            note_the_end(args.scratch, name, error.exit_code)
        append_event(events, f"{role}-end", service=name, status=error.diag)
        return report(error)
    watching = exposure.watch(pid, "main", name, events)  # what it listens on beyond loopback
    deadline = time.monotonic() + args.timeout if args.timeout else None
    outcome = program.wait(stop_when=(lambda: time.monotonic() > deadline) if deadline is not None else None)
    watching.set()
    ended = time.time()
    status = "done" if outcome.code == 0 and outcome.stopped_by is None else "failed"
    append_event(events, f"{role}-end", service=name, status=status, exitCode=outcome.status)
    if args.init:
        return init_ended(args, how.shown, outcome, status, started, ended, log)
    note_the_end(args.scratch, name, outcome.status)
    if outcome.code != 0:
        why = " (stopped by allocstack)" if outcome.stop_signal is not None else ""
        report(AllocstackError("main-exit", f"main {name} ({describe(how.shown)}) {outcome.how()}{why}: the stack "
                                            f"ended with it, and its exit code {outcome.status} fails the run"))
        return outcome.status
    atomic_write_json(args.record, {"schemaVersion": SCHEMA_VERSION, "service": name, "status": status,
                                    "exitCode": 0, "startedAt": started, "endedAt": ended}, 0o644)
    log(f"{describe(how.shown)} exited 0 after {ended - started:.3f} s: the stack ends (the workers are stopped)")
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(run(main))
