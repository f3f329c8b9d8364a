#!/usr/bin/env python3
"""A serving stack (config ``mode: serve``): up once every gate passed, until the allocation's end, scancel, Ctrl-C or
main's end.

It waits for every gate record of your services (and init jobs); then the stack is UP: one line says so on stdout
(Snakemake's output; under Slurm the job's log) and in its log, with how to reach each service's port (from a
laptop under Slurm: ``ssh -N -L PORT:127.0.0.1:PORT NODE``), and ``--up-record`` (results/<run>/up.json) holds the
same for the status. It then holds the services up (its job consumes their service files) until:

* SIGTERM under Slurm: ``scancel`` or the time limit (told apart by the allocation's end time: a signal at or
  after it is the time limit); elsewhere a SIGTERM;
* SIGINT: an interrupt (Ctrl-C, a normal end of a serving stack);
* main's record (config ``main`` exited 0).

Every end after UP is a success: ``--record`` says how it ended (``ended by scancel after 42 s up``), and after a
signal, when nothing else of the job will run, the success marker ``--marker`` is written here at once, atomically
(Slurm's KillWait is seconds). After main's end, verification writes it. A signal before UP is a failure: one line,
exit 69, no marker.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

from allocstack import SCHEMA_VERSION
from allocstack.common import names, slurm
from allocstack.common.cli import ENDING_SIGNALS, ArgumentParser, add_gate_arguments, run
from allocstack.common.endpoint import (
    needs_tunnel,
    published_socket,
    read_endpoint,
    service_endpoint_path,
    tunnel_command,
)
from allocstack.common.errors import EXIT_OK, AllocstackError, report
from allocstack.common.events import append_event
from allocstack.common.jsonio import atomic_write_json, read_json

#: A SIGTERM this close to the allocation's end (or after it) is the time limit's.
TIME_LIMIT_SLACK = 5.0


class Ended(Exception):
    """A stop signal arrived before the stack was up."""


def parse_args(argv: list[str] | None):
    parser = ArgumentParser(description=__doc__.split("\n\n")[0])
    add_gate_arguments(parser)
    parser.add_argument("--uses", action="append", default=[], help="a service whose port to show (repeatable)")
    parser.add_argument("--main-record", type=Path, action="append", default=[],
                        help="main's record: when it appears (main exited 0) the stack ends")
    parser.add_argument("--up-record", type=Path, required=True, help="written once the stack is up")
    parser.add_argument("--record", type=Path, required=True, help="how the stack served and ended")
    parser.add_argument("--marker", type=Path, required=True, help="the success marker, written after a signal")
    parser.add_argument("--run", required=True, help="the run's name")
    parser.add_argument("--scratch", type=Path, default=os.environ.get("ALLOCSTACK_SCRATCH") or None,
                        help="job-scoped scratch (default $ALLOCSTACK_SCRATCH): the services' endpoints")
    args = parser.parse_args(argv)
    if args.scratch is None:
        parser.error("--scratch (or $ALLOCSTACK_SCRATCH) is required")
    return args


def what_ended(signum: int | None, main: str | None, now: float, end: float | None, in_slurm: bool) -> str:
    """How a serving stack ended: ``scancel``, ``the time limit``, ``interrupt``, ``SIGTERM``, ``main NAME exiting 0``."""
    if signum is None:
        return f"main {main} exiting 0"
    if signum == signal.SIGINT:
        return "interrupt"
    if not in_slurm:
        return signal.Signals(signum).name
    if end is None:
        return f"{signal.Signals(signum).name} (scancel or the time limit: the allocation's end is unknown)"
    return "the time limit" if now >= end - TIME_LIMIT_SLACK else "scancel"


def reach_lines(scratch: Path, services: list[str], environ: dict[str, str]) -> dict[str, dict[str, str]]:
    """How to reach each service: its loopback URL on the node and, under Slurm, the SSH tunnel from a laptop."""
    found = {}
    for name in services:
        url = read_endpoint(service_endpoint_path(scratch, name)).url
        port = url.rsplit(":", 1)[1]
        entry = {"url": url}
        socket = published_socket(name, environ)  # the stack's private network: the owner-only way in
        if socket:
            entry["socket"] = socket
        if needs_tunnel(environ) or socket:
            entry["tunnel"] = tunnel_command(port, environ, local=port, name=name)
        found[name] = entry
    return found


def wait_until_up(gates: list[Path], timeout: float, stopped, log) -> None:
    """Every gate record says ready (polling every 50 ms, at most ``timeout`` s in all).

    :raises Ended: a stop signal arrived first. :raises AllocstackError: a gate did not pass.
    """
    deadline = time.monotonic() + timeout
    for path in gates:
        if not path.exists():
            log(f"waiting for {path} (at most {timeout:g} s in all)")
        while not path.exists():
            if stopped():
                raise Ended
            if time.monotonic() > deadline:
                raise AllocstackError("readiness-timeout", f"the serving stack was not up within {timeout:g} s "
                                                           f"(no {path})")
            time.sleep(0.05)
        record = read_json(path, "gate record", diag="prerequisite")
        if not isinstance(record, dict) or record.get("status") != "ready":
            raise AllocstackError("prerequisite", f"gate record {path} does not say ready: the stack is not up")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.time()
    caught: list[int] = []
    for signum in ENDING_SIGNALS:
        signal.signal(signum, lambda number, frame: caught.append(number))
    log = lambda message: print(f"serve: {message}", file=sys.stderr, flush=True)  # noqa: E731

    def say(message: str) -> None:  # on Snakemake's output and in the log
        print(message, flush=True)
        log(message)

    events = args.scratch / names.component_events("serve")
    try:
        wait_until_up(args.gate_record, args.gate_timeout, lambda: bool(caught), log)
    except Ended:
        how = what_ended(caught[0], None, time.time(), None, bool(os.environ.get("SLURM_JOB_ID")))
        return report(AllocstackError("prerequisite", f"the serving stack ended by {how} before it was up "
                                                      "(not every gate had passed): no success"))
    up_at = time.time()
    environ = dict(os.environ)
    reach = reach_lines(args.scratch, args.uses, environ)
    in_slurm = bool(environ.get("SLURM_JOB_ID"))
    end = slurm.allocation_end(environ) if in_slurm else None
    atomic_write_json(args.up_record, {"schemaVersion": SCHEMA_VERSION, "run": args.run, "status": "up",
                                       "upAt": up_at, "upAfter": round(up_at - started, 3), "services": reach,
                                       "allocationEnd": end}, 0o644)
    append_event(events, "stack-up", services=sorted(reach))
    stop = f"scancel {environ['SLURM_JOB_ID']}" if in_slurm else "Ctrl-C"
    say(f"allocstack: run {args.run} is UP after {up_at - started:.1f} s (every gate passed); it serves until "
        f"{'the time limit, ' if in_slurm else ''}{stop}{' or main ends' if args.main_record else ''}")
    for name, entry in reach.items():
        where = (f"{entry['socket']} (only you can use it; {entry['url']} in the stack's own network)"
                 if "socket" in entry else f"{entry['url']} on the node")
        say(f"allocstack:   {name}: {where}" + (f"; from your laptop: {entry['tunnel']}" if "tunnel" in entry else ""))
    main_name = None
    while not caught:
        if any(path.exists() for path in args.main_record):
            main_name = str(read_json(args.main_record[0], "main record").get("service", "main"))
            break
        time.sleep(0.1)
    ended_at = time.time()
    how = what_ended(caught[0] if caught else None, main_name, ended_at, end, in_slurm)
    up = ended_at - up_at
    facts = {"mode": "serve", "ended": f"ended by {how} after {up:.0f} s up", "endedBy": how,
             "upSeconds": round(up, 3), "upAfter": round(up_at - started, 3)}
    if caught:  # nothing else of the job runs after a stop signal: the marker, at once
        atomic_write_json(args.marker, {"schemaVersion": SCHEMA_VERSION, "status": "success", **facts,
                                        "services": sorted(reach)})
    atomic_write_json(args.record, {"schemaVersion": SCHEMA_VERSION, "status": "served", **facts,
                                    "endedAt": ended_at}, 0o644)
    append_event(events, "stack-ended", ended=how, upSeconds=round(up, 3))
    say(f"allocstack: run {args.run} {facts['ended']}: success" + (f" ({args.marker})" if caught else ""))
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(run(main))
