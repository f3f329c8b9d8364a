#!/usr/bin/env python3
"""The readiness gate: pass only when the coordinator can really serve.

Polls ``GET /health`` on a loopback endpoint until it answers exactly
``{"status": "ready", "schemaVersion": 1, "taskCount": N}`` (the seed's contract),
within ONE total deadline on the monotonic clock. With ``--endpoint-file`` (or
``--scratch``) it first waits, within the same deadline, for the coordinator to
publish its endpoint.

Exit codes: 0 ready, 24 timed out, 64 bad arguments (e.g. a non-loopback URL).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

import requests

from allocstack import SCHEMA_VERSION
from allocstack.cli import ArgumentParser, positive_float, runtime_facts
from allocstack.endpoint import read_endpoint, require_loopback
from allocstack.errors import EXIT_OK, AllocstackError, report
from allocstack.events import append_event
from allocstack.jsonio import atomic_write_json, read_json


def expected_health(task_count: int) -> dict[str, Any]:
    return {"status": "ready", "schemaVersion": SCHEMA_VERSION, "taskCount": task_count}


def check_coordinator_alive(record: Path | None) -> None:
    """Fail fast when the coordinator already wrote its end record (it died before serving)."""
    if record is not None and record.exists():
        try:
            reason = read_json(record, "coordinator end record", diag="coordinator-exit").get("reason", "?")
        except (AllocstackError, AttributeError):
            reason = "unreadable end record"
        raise AllocstackError("coordinator-exit", f"the coordinator ended before it was ready: {reason}")


def wait_for_endpoint(path: Path, deadline: float, interval: float, record: Path | None = None) -> str | None:
    """Wait for the endpoint file; return its URL, or None at the deadline."""
    while True:
        check_coordinator_alive(record)
        if path.exists():
            try:
                return read_endpoint(path)[0]
            except AllocstackError as error:
                if error.diag == "usage":
                    raise
        if time.monotonic() + interval > deadline:
            return None
        time.sleep(interval)


def probe(url: str, task_count: int, deadline: float, interval: float) -> tuple[bool, int, str]:
    """Poll ``url/health`` until it matches the contract or the deadline passes.

    :returns: (ready, attempts, last observation).
    """
    want = expected_health(task_count)
    attempts, last = 0, "no answer yet"
    with requests.Session() as session:
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False, attempts, last
            attempts += 1
            try:
                response = session.get(f"{url}/health", timeout=max(0.05, min(1.0, remaining)))
                health = response.json()
                if response.status_code == 200 and health == want:
                    return True, attempts, "ready"
                last = f"HTTP {response.status_code} {str(health)[:120]}"
            except (requests.RequestException, ValueError) as exc:
                last = type(exc).__name__
            time.sleep(max(0.0, min(interval, deadline - time.monotonic())))


def parse_args(argv: list[str] | None):
    parser = ArgumentParser(description=__doc__.split("\n\n")[0])
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--endpoint", help="coordinator URL, e.g. http://127.0.0.1:PORT (loopback only)")
    where.add_argument("--endpoint-file", type=Path, help="wait for this endpoint file and read the URL from it")
    where.add_argument("--scratch", type=Path, default=os.environ.get("ALLOCSTACK_SCRATCH") or None,
                       help="job-scoped scratch (default $ALLOCSTACK_SCRATCH): use SCRATCH/endpoint.json")
    count = parser.add_mutually_exclusive_group(required=True)
    count.add_argument("--task-count", type=int, help="taskCount the coordinator must report")
    count.add_argument("--inputs-summary", type=Path, help="read taskCount from validate_inputs' summary")
    parser.add_argument("--timeout", type=positive_float, required=True, help="total deadline in seconds")
    parser.add_argument("--interval", type=positive_float, default=0.05, help="seconds between probes")
    parser.add_argument("--record", type=Path, help="write the gate record (JSON) here when ready")
    parser.add_argument("--coordinator-record", type=Path,
                        help="the coordinator's end record: if it appears while waiting, fail at once with its reason")
    parser.add_argument("--events", type=Path, help="event log to append to (default SCRATCH/events.jsonl)")
    args = parser.parse_args(argv)
    if args.inputs_summary:
        try:
            args.task_count = read_json(args.inputs_summary, "inputs summary", diag="usage")["taskCount"]
        except (AllocstackError, KeyError, TypeError):
            parser.error(f"--inputs-summary {args.inputs_summary} has no taskCount")
    if args.task_count < 1:
        parser.error("--task-count must be at least 1")
    if args.endpoint:
        try:
            args.endpoint = require_loopback(args.endpoint)
        except AllocstackError as error:
            parser.error(error.message)
    elif args.scratch and not args.endpoint_file:
        args.endpoint_file = args.scratch / "endpoint.json"
    elif not args.endpoint_file:
        parser.error("one of --endpoint, --endpoint-file or --scratch (or $ALLOCSTACK_SCRATCH) is required")
    if args.scratch and not args.events:
        args.events = args.scratch / "events.jsonl"
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started, started_wall = time.monotonic(), time.time()
    deadline = started + args.timeout
    try:
        url = args.endpoint or wait_for_endpoint(args.endpoint_file, deadline, min(args.interval, 0.02),
                                                 args.coordinator_record)
        if url is None:
            raise AllocstackError(
                "readiness-timeout", f"no endpoint file at {args.endpoint_file} within {args.timeout:g} s"
            )
        ready, attempts, last = probe(url, args.task_count, deadline, args.interval)
        if not ready:
            raise AllocstackError(
                "readiness-timeout",
                f"{url}/health did not report taskCount {args.task_count} within {args.timeout:g} s "
                f"({attempts} probes; last: {last})",
            )
    except AllocstackError as error:
        append_event(args.events, "gate-failed", reason=error.message)
        return report(error)
    seconds = time.monotonic() - started
    event = append_event(args.events, "gate-passed", endpoint=url, secondsToReady=round(seconds, 4),
                         attempts=attempts, **runtime_facts())
    if args.record:
        atomic_write_json(args.record, {
            "schemaVersion": SCHEMA_VERSION, "status": "ready", "endpoint": url, "taskCount": args.task_count,
            "secondsToReady": round(seconds, 4), "attempts": attempts, "startedAt": started_wall,
            "passedAt": event["t"],
        }, 0o644)
    print(f"readiness: {url} ready after {seconds:.3f} s ({attempts} probes)", flush=True)
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
