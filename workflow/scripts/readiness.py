#!/usr/bin/env python3
"""The readiness gate: pass only when the coordinator can really serve.

By default polls ``GET /health`` on a loopback endpoint until it answers exactly
``{"status": "ready", "schemaVersion": 1, "taskCount": N}`` (the seed's contract);
``--mode`` changes what "ready" means for your own service (an HTTP path with
expected JSON fields, a TCP connection, or a command exiting 0). Always within
ONE total deadline on the monotonic clock. With ``--endpoint-file`` (or
``--scratch``) it first waits, within the same deadline, for the coordinator to
publish its endpoint.

Exit codes: 0 ready, 24 timed out, 64 bad arguments (e.g. a non-loopback URL).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import requests

from allocstack import SCHEMA_VERSION
from allocstack.cli import ArgumentParser, argv_list, positive_float, run, runtime_facts
from allocstack.client import loopback_session
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


Check = Callable[[float], tuple[bool, str]]


def health_check(session: requests.Session, url: str, task_count: int) -> Check:
    """The seed's contract: ``GET /health`` answers exactly ``{"status": "ready", "schemaVersion": 1, "taskCount": N}``."""
    want = expected_health(task_count)

    def check(timeout: float) -> tuple[bool, str]:
        response = session.get(f"{url}/health", timeout=timeout)
        health = response.json()
        return response.status_code == 200 and health == want, f"HTTP {response.status_code} {str(health)[:120]}"

    return check


def http_check(session: requests.Session, url: str, path: str, expect: dict[str, Any]) -> Check:
    """``GET path`` answers 200 with a JSON object containing every field of ``expect``."""

    def check(timeout: float) -> tuple[bool, str]:
        response = session.get(f"{url}{path}", timeout=timeout)
        body = response.json() if response.content else None
        fields = isinstance(body, dict) and all(body.get(key) == value for key, value in expect.items())
        return response.status_code == 200 and fields, f"HTTP {response.status_code} {str(body)[:120]}"

    return check


def tcp_check(url: str) -> Check:
    """The service accepts a TCP connection on its loopback port."""
    parts = urlsplit(url)

    def check(timeout: float) -> tuple[bool, str]:
        with socket.create_connection((parts.hostname, parts.port), timeout=timeout):
            return True, "connected"

    return check


def command_check(argv: list[str], url: str) -> Check:
    """``argv`` exits 0 (it gets the endpoint as $ALLOCSTACK_APP_ENDPOINT)."""
    env = {**os.environ, "ALLOCSTACK_APP_ENDPOINT": url}

    def check(timeout: float) -> tuple[bool, str]:
        done = subprocess.run(argv, capture_output=True, encoding="utf-8", errors="replace", env=env,
                              timeout=max(timeout, 1.0), check=False)
        return done.returncode == 0, f"exit {done.returncode} {(done.stderr or done.stdout).strip()[-120:]}"

    return check


def probe(check: Check, deadline: float, interval: float) -> tuple[bool, int, str]:
    """Run ``check`` until it passes or the deadline passes.

    :returns: (ready, attempts, last observation).
    """
    attempts, last = 0, "no answer yet"
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False, attempts, last
        attempts += 1
        try:
            ready, last = check(max(0.05, min(1.0, remaining)))
            if ready:
                return True, attempts, "ready"
        except (requests.RequestException, ValueError, OSError, subprocess.TimeoutExpired) as exc:
            last = type(exc).__name__
        time.sleep(max(0.0, min(interval, deadline - time.monotonic())))


def make_check(args, session: requests.Session, url: str) -> tuple[Check, str]:
    """The configured meaning of "ready", and how to name it in a timeout message."""
    if args.mode == "http":
        return http_check(session, url, args.path, args.expect_json), f"{url}{args.path} with {args.expect_json}"
    if args.mode == "tcp":
        return tcp_check(url), f"a TCP connection to {url}"
    if args.mode == "command":
        return command_check(args.ready_command_json, url), f"{args.ready_command_json[0]} exiting 0"
    return health_check(session, url, args.task_count), f"{url}/health reporting taskCount {args.task_count}"


def parse_args(argv: list[str] | None):
    parser = ArgumentParser(description=__doc__.split("\n\n")[0])
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--endpoint", help="coordinator URL, e.g. http://127.0.0.1:PORT (loopback only)")
    where.add_argument("--endpoint-file", type=Path, help="wait for this endpoint file and read the URL from it")
    where.add_argument("--scratch", type=Path, default=os.environ.get("ALLOCSTACK_SCRATCH") or None,
                       help="job-scoped scratch (default $ALLOCSTACK_SCRATCH): use SCRATCH/endpoint.json")
    parser.add_argument("--endpoint-name", default="endpoint.json",
                        help="with --scratch: the endpoint file's name there (app.json for your own service)")
    parser.add_argument("--mode", choices=["health", "http", "tcp", "command"], default="health",
                        help="what ready means: the seed's /health contract (default), an HTTP path with expected "
                             "JSON fields, a TCP connection, or a command exiting 0")
    parser.add_argument("--path", default="/health", help="http mode: the path to GET")
    parser.add_argument("--expect-json", type=json.loads, default={}, help="http mode: JSON fields the answer must have")
    parser.add_argument("--ready-command-json", type=argv_list, default=None, help="command mode: a JSON argv list")
    count = parser.add_mutually_exclusive_group()
    count.add_argument("--task-count", type=int, help="taskCount the coordinator must report")
    count.add_argument("--inputs-summary", type=Path, help="read taskCount from validate_inputs' summary")
    parser.add_argument("--timeout", type=positive_float, required=True, help="total deadline in seconds")
    parser.add_argument("--interval", type=positive_float, default=0.05, help="seconds between probes")
    parser.add_argument("--record", type=Path, help="write the gate record (JSON) here when ready")
    parser.add_argument("--coordinator-record", type=Path,
                        help="the coordinator's end record: if it appears while waiting, fail at once with its reason")
    parser.add_argument("--events", type=Path, help="event log to append to (default SCRATCH/events.jsonl)")
    args = parser.parse_args(argv)
    if args.mode == "health" and args.task_count is None and args.inputs_summary is None:
        parser.error("health mode needs --task-count or --inputs-summary")
    if args.mode == "http" and (not isinstance(args.expect_json, dict) or not args.path.startswith("/")):
        parser.error("http mode needs --path starting with / and --expect-json as a JSON object")
    if args.mode == "command" and args.ready_command_json is None:
        parser.error("command mode needs --ready-command-json, a JSON argv list")
    if args.inputs_summary:
        try:
            args.task_count = read_json(args.inputs_summary, "inputs summary", diag="usage")["taskCount"]
        except (AllocstackError, KeyError, TypeError):
            parser.error(f"--inputs-summary {args.inputs_summary} has no taskCount")
    if args.mode == "health" and args.task_count < 1:
        parser.error("--task-count must be at least 1")
    if args.endpoint:
        try:
            args.endpoint = require_loopback(args.endpoint)
        except AllocstackError as error:
            parser.error(error.message)
    elif args.scratch and not args.endpoint_file:
        args.endpoint_file = args.scratch / args.endpoint_name
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
        with loopback_session() as session:
            check, wanted = make_check(args, session, url)
            ready, attempts, last = probe(check, deadline, args.interval)
        if not ready:
            raise AllocstackError(
                "readiness-timeout", f"no {wanted} within {args.timeout:g} s ({attempts} probes; last: {last})"
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
    sys.exit(run(main))
