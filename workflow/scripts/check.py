#!/usr/bin/env python3
"""Your check (config ``verify.command``) for your own stack: run once every worker has ended, while the services are up.

Compose's one-shot service that waits for the workers with
``service_completed_successfully``: it may ask your services for the results.
This waits until every worker's record exists (a failed worker fails the whole
stack, and this with it), then runs your command (no shell) with every
service's ``ALLOCSTACK_<NAME>_*`` variables, the volumes' ``ALLOCSTACK_VOLUME_*`` and
``verify.environment``. Exit 0 = correct: the check record is written.
Verification (verify.py) then checks the services' ends and writes the success marker.

Exit codes: 0 passed; 65 the check failed (one line with its last line of output).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from allocstack import SCHEMA_VERSION
from allocstack.common import names
from allocstack.common.cli import ArgumentParser, add_placement_arguments, add_program_arguments, run
from allocstack.common.endpoint import services_environment
from allocstack.common.errors import EXIT_OK, EXIT_TEMPFAIL, AllocstackError, report
from allocstack.common.events import append_event
from allocstack.common.jsonio import atomic_write_json
from allocstack.common.scratch import make_private
from allocstack.launch.lifeline import watch_launcher
from allocstack.launch.program import Placement, prepare, program_environment, run_check

#: Seconds between the lines that say the check still waits for workers that keep running.
PROGRESS_EVERY = 30.0


def still_running(missing: list[Path], waited: float, max_lifetime: float | None) -> str:
    """The line that says which workers the check still waits for, why that may be, and what to do about it."""
    line = (f"still waiting for {len(missing)} worker(s) after {waited:.0f} s "
            f"({', '.join(path.stem for path in missing)}): a worker that runs a daemon (celery worker, rq worker, "
            "a server) never ends by itself")
    if max_lifetime:
        return f"{line}; worker.max_lifetime ({max_lifetime:g} s) stops them when it has passed"
    return (f"{line}, and the run then waits until its time limit; make it end on its own (rq worker --burst), "
            "end the stack from your producer (config main), bound the workers (config worker.max_lifetime) "
            "or stop the run (Ctrl-C, scancel)")


def await_files(paths: list[Path], log, every: float = PROGRESS_EVERY, max_lifetime: float | None = None) -> None:
    """Wait for every file in ``paths``: the workers' records; every ``every`` seconds, one line naming the workers
    that still run and why that may be (a daemon never ends by itself), so a wait is never silent.

    No deadline of its own: the wait ends when the last worker has ended, and when a
    worker fails Snakemake stops the whole stack, this included (and this stops when
    its launcher is gone).
    """
    missing = [path for path in paths if not path.exists()]
    if missing:
        log(f"waiting for {len(missing)} worker(s) to end")
    started = next_line = time.monotonic()
    next_line += every
    while missing:
        time.sleep(0.05)
        missing = [path for path in missing if not path.exists()]
        if missing and time.monotonic() >= next_line:
            next_line += every
            log(still_running(missing, time.monotonic() - started, max_lifetime))


def parse_args(argv: list[str] | None):
    parser = ArgumentParser(description=__doc__.split("\n\n")[0])
    add_program_arguments(parser, "your check", required=False)
    add_placement_arguments(parser)
    parser.add_argument("--wait-for", type=Path, action="append", default=[],
                        help="a worker's record: run only once every one exists (repeatable)")
    parser.add_argument("--progress-every", type=float, default=PROGRESS_EVERY,
                        help="seconds between the lines that say which workers the check still waits for")
    parser.add_argument("--max-lifetime", type=float, default=None,
                        help="config worker.max_lifetime: named in the lines of the wait for the workers")
    parser.add_argument("--main-decides", action="store_true",
                        help="no check of yours: the main program's exit 0 (its record, a --wait-for) is the verdict")
    parser.add_argument("--record", type=Path, required=True, help="the check record, written when it passed")
    args = parser.parse_args(argv)
    if args.scratch is None:
        parser.error("--scratch (or $ALLOCSTACK_SCRATCH) is required")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    log = lambda message: print(f"check: {message}", file=sys.stderr, flush=True)  # noqa: E731
    events = args.scratch / names.component_events("check")
    watch_launcher(lambda: os._exit(EXIT_TEMPFAIL))  # the stack was stopped: so is this
    try:
        make_private(events.parent)
        events.unlink(missing_ok=True)
        await_files(args.wait_for, log, args.progress_every, args.max_lifetime)
        if args.main_decides:
            log("no check of yours: the main program exited 0, which decides")
            atomic_write_json(args.record, {"schemaVersion": SCHEMA_VERSION, "status": "passed", "by": "main",
                                            "startedAt": time.time(), "endedAt": time.time()}, 0o644)
            return EXIT_OK
        env = program_environment(os.environ, services_environment(args.scratch, args.uses),
                                  args.environment_json, "verify")
        how = prepare(Placement.from_args(args), args.command_json, env, set(args.environment_json),
                      args.scratch / names.PROGRAMS / "check", "verify")
        if how.container:
            log(f"in its image: {how.line()}")
        started = time.time()
        append_event(events, "check-start", **({"container": how.container} if how.container else {}))
        run_check(how.argv, how.env, how.cwd, how.shown, how.preexec)
    except AllocstackError as error:
        append_event(events, "check-end", status="failed")
        return report(error)
    append_event(events, "check-end", status="passed")
    atomic_write_json(args.record, {"schemaVersion": SCHEMA_VERSION, "status": "passed", "startedAt": started,
                                    "endedAt": time.time()}, 0o644)
    log(f"passed in {time.time() - started:.3f} s")
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(run(main))
