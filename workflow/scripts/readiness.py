#!/usr/bin/env python3
"""The readiness gate: pass only when the coordinator can really serve.

By default polls ``GET /health`` on a loopback endpoint until it answers exactly
``{"status": "ready", "schemaVersion": 1, "taskCount": N}`` (the seed's contract);
``--mode`` changes what "ready" means for your own service (an HTTP path with
expected JSON fields, a TCP connection, or a command exiting 0). Always within
ONE total deadline on the monotonic clock. With ``--endpoint-file`` (or
``--scratch``) it first waits, within the same deadline, for the coordinator to
publish its endpoint.

It stops waiting as soon as what it gates has ended: the coordinator's end record (or your
service's) says so, or the launcher of that program noted its process's end in scratch
(``ended/<name>.json``: it died at start, its container runtime failed, it crashed), and
it fails then with that program's last line (``coordinator-exit``, ``service-exit``).

With ``--off-node`` (config ``nodes`` above 1) it is the gate of another node than the
coordinator's: it reads the endpoint published for the other nodes (https, the run's
certificate pinned by fingerprint) and proves the coordinator is reachable from here. Not
reachable within the deadline, or a certificate that is not the run's: ``[network]``.

The gate of a service of yours, once it passed, names what the service's process listens on beyond
loopback (``warning:`` lines, allocstack/launch/exposure.py), before it writes its record.

Exit codes: 0 ready, 24 timed out, 64 bad arguments (e.g. a non-loopback URL), 69 the
coordinator's network address is unreachable from this node (``--off-node``).
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from allocstack import SCHEMA_VERSION
from allocstack.common import names
from allocstack.common.cli import ArgumentParser, add_placement_arguments, argv_list, positive_float, run, runtime_facts
from allocstack.common.endpoint import (
    Endpoint,
    read_endpoint,
    require_loopback,
    service_end_path,
    service_endpoint_path,
    services_environment,
)
from allocstack.common.errors import EXIT_OK, AllocstackError, report
from allocstack.common.events import append_event, ensure_log_dir
from allocstack.common.jsonio import atomic_write_json, read_json
from allocstack.coordinator import endrecord
from allocstack.launch import exposure
from allocstack.launch.program import Placement, ProgramError, describe, prepare, program_environment, run_program
from allocstack.worker.httpclient import HttpConnection, TransportError


def expected_health(task_count: int) -> dict[str, Any]:
    return {"status": "ready", "schemaVersion": SCHEMA_VERSION, "taskCount": task_count}


def while_alive(check: Check, record: Path | None, service: str | None, scratch: Path | None = None) -> Check:
    """``check``, failing at once when what it probes has ended (a crash after it published its endpoint)."""

    def alive(timeout: float) -> tuple[bool, str]:
        endrecord.ended_before_ready(record, service, scratch)
        return check(timeout)

    return alive


def following(path: Path, endpoint: Endpoint,
              make: Callable[[Endpoint], tuple[Check, str]]) -> tuple[Check, Callable[[], tuple[str, str]]]:
    """``make(endpoint)``'s check, made again whenever the endpoint file at ``path`` names another endpoint
    (URL, or certificate to pin); and a function telling the URL in use and how its check is named.

    An endpoint file an earlier run left in scratch (a crash, ``kill -9``) stays until the
    new service clears it and publishes its own, and the gate may read it first: probing
    that dead port until the deadline would fail a run whose service is up.
    """
    current = {"endpoint": endpoint, "made": make(endpoint)}

    def check(timeout: float) -> tuple[bool, str]:
        try:
            latest = read_endpoint(path) if path.exists() else None
        except AllocstackError as error:
            if error.diag == "usage":
                raise
            latest = None  # being replaced
        if latest is None:
            return False, f"no endpoint file at {path} (an earlier run's was cleared): waiting for the new one"
        if (latest.url, latest.fingerprint) != (current["endpoint"].url, current["endpoint"].fingerprint):
            current.update(endpoint=latest, made=make(latest))
        return current["made"][0](timeout)

    return check, lambda: (current["endpoint"].url, current["made"][1])


def wait_for_endpoint(path: Path, deadline: float, interval: float, record: Path | None = None,
                      service: str | None = None, scratch: Path | None = None) -> Endpoint | None:
    """Wait for the endpoint file; return its endpoint, or None at the deadline (or raise when what publishes it
    has ended: :func:`endrecord.ended_before_ready`)."""
    while True:
        endrecord.ended_before_ready(record, service, scratch)
        if path.exists():
            try:
                return read_endpoint(path)
            except AllocstackError as error:
                if error.diag == "usage":
                    raise
        if time.monotonic() + interval > deadline:
            return None
        time.sleep(interval)


Check = Callable[[float], tuple[bool, str]]
#: ``GET url`` within a timeout: the answer's status and its body decoded as JSON (None when it is empty).
Get = Callable[[str, float], tuple[int, Any]]


def session_get(session: Any) -> Get:
    """:data:`Get` through a ``requests`` session (:mod:`allocstack.worker.sessions`): any HTTP service, redirects
    followed, https pinned."""

    def get(url: str, timeout: float) -> tuple[int, Any]:
        response = session.get(url, timeout=timeout)
        return response.status_code, response.json() if response.content else None

    return get


def plain_get(url: str, timeout: float) -> tuple[int, Any]:
    """:data:`Get` over plain HTTP through :mod:`allocstack.worker.httpclient`, a connection a probe: the built-in
    coordinator's ``/health`` on this node, without importing ``requests`` (~100 ms of CPU in the stack's
    first second, beside the coordinator's start)."""
    parts = urlsplit(url)
    connection = HttpConnection(f"{parts.scheme}://{parts.netloc}", timeout)
    try:
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        answer = connection.request(b"GET", target.encode("ascii"))
    finally:
        connection.close()
    return answer.status, json.loads(answer.body) if answer.body else None


def health_check(get: Get, url: str, task_count: int) -> Check:
    """The seed's contract: ``GET /health`` answers exactly ``{"status": "ready", "schemaVersion": 1, "taskCount": N}``."""
    want = expected_health(task_count)

    def check(timeout: float) -> tuple[bool, str]:
        status, health = get(f"{url}/health", timeout)
        return status == 200 and health == want, f"HTTP {status} {str(health)[:120]}"

    return check


def http_check(get: Get, url: str, path: str, expect: dict[str, Any]) -> Check:
    """``GET path`` answers 200 with a JSON object containing every field of ``expect``."""

    def check(timeout: float) -> tuple[bool, str]:
        status, body = get(f"{url}{path}", timeout)
        fields = isinstance(body, dict) and all(body.get(key) == value for key, value in expect.items())
        return status == 200 and fields, f"HTTP {status} {str(body)[:120]}"

    return check


def tcp_check(url: str) -> Check:
    """The service accepts a TCP connection on its loopback port."""
    parts = urlsplit(url)

    def check(timeout: float) -> tuple[bool, str]:
        with socket.create_connection((parts.hostname, parts.port), timeout=timeout):
            return True, "connected"

    return check


def command_check(argv: list[str], env: dict[str, str], probe_timeout: float, cwd: str | None = None,
                  preexec: Callable[[], None] | None = None) -> Check:
    """``argv`` exits 0 within ``probe_timeout`` (with ``env``: the service's variables, see allocstack/launch/program.py;
    ``preexec``: the stack's names without an image)."""

    def check(timeout: float) -> tuple[bool, str]:
        try:
            done = run_program(argv, env, timeout=max(timeout, probe_timeout), cwd=cwd, preexec=preexec)
        except ProgramError as exc:
            return False, str(exc)
        return done.returncode == 0, f"exit {done.returncode} {done.tail(120)}"

    return check


def probe(check: Check, deadline: float, interval: float, probe_timeout: float = 1.0,
          fatal: tuple[type[Exception], ...] = ()) -> tuple[bool, int, str]:
    """Run ``check`` until it passes or the deadline passes.

    :param fatal: errors that are not transient (raised at once): ``requests``' SSLError, when the server
        there does not present the pinned certificate.
    :returns: (ready, attempts, last observation).
    """
    attempts, last = 0, "no answer yet"
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False, attempts, last
        attempts += 1
        try:
            ready, last = check(max(0.05, min(probe_timeout, remaining)))
            if ready:
                return True, attempts, "ready"
        except fatal:
            raise
        except (TransportError, ValueError, OSError) as exc:  # requests' RequestException is an OSError
            last = type(exc).__name__
        time.sleep(max(0.0, min(interval, deadline - time.monotonic())))


def command_environment(args, url: str) -> dict[str, str]:
    """What a command gate is told: the variables of the service it gates (and of those it uses).

    The single ``service:`` block's service is ``app``: ``$ALLOCSTACK_APP_ENDPOINT``, as before.
    """
    if args.service and args.scratch:
        stack = services_environment(args.scratch, [args.service, *args.uses])
    else:
        stack = {"ALLOCSTACK_APP_ENDPOINT": url}
    return program_environment(os.environ, stack, {}, f"services.{args.service or 'app'}.readiness")


def make_check(args, get: Get, url: str) -> tuple[Check, str]:
    """The configured meaning of "ready", and how to name it in a timeout message."""
    if args.mode == "http":
        return http_check(get, url, args.path, args.expect_json), f"{url}{args.path} with {args.expect_json}"
    if args.mode == "tcp":
        return tcp_check(url), f"a TCP connection to {url}"
    if args.mode == "command":
        env = command_environment(args, url)
        # in the service's image, as Compose runs a healthcheck in the service's container
        how = prepare(Placement.from_args(args), args.ready_command_json, env, set(),
                      (args.scratch or Path(".")) / names.PROGRAMS / f"{args.service or 'app'}-readiness",
                      f"services.{args.service or 'app'}.readiness", probe=True)
        return (command_check(how.argv, how.env, args.probe_timeout, how.cwd, how.preexec),
                f"{describe(how.shown)} exiting 0")
    if args.mode == "started":
        return (lambda timeout: (True, "started")), "its start"
    return health_check(get, url, args.task_count), f"{url}/health reporting taskCount {args.task_count}"


def parse_args(argv: list[str] | None):
    parser = ArgumentParser(description=__doc__.split("\n\n")[0])
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--endpoint", help="coordinator URL, e.g. http://127.0.0.1:PORT (loopback only)")
    where.add_argument("--endpoint-file", type=Path, help="wait for this endpoint file and read the URL from it")
    where.add_argument("--scratch", type=Path, default=os.environ.get("ALLOCSTACK_SCRATCH") or None,
                       help=f"job-scoped scratch (default $ALLOCSTACK_SCRATCH): use SCRATCH/{names.ENDPOINT}")
    parser.add_argument("--service", help="with --scratch: gate your own service NAME (its endpoint and event file)")
    parser.add_argument("--uses", action="append", default=[],
                        help="command mode: a service whose variables the command also gets (repeatable)")
    parser.add_argument("--mode", choices=["health", "http", "tcp", "command", "started"], default="health",
                        help="what ready means: the seed's /health contract (default), an HTTP path with expected "
                             "JSON fields, a TCP connection, a command exiting 0 (in the service's image, see "
                             "--image), or the service's start (Compose's service_started)")
    parser.add_argument("--path", default="/health", help="http mode: the path to GET")
    parser.add_argument("--expect-json", type=json.loads, default={}, help="http mode: JSON fields the answer must have")
    parser.add_argument("--ready-command-json", type=argv_list, default=None, help="command mode: a JSON argv list")
    add_placement_arguments(parser)
    count = parser.add_mutually_exclusive_group()
    count.add_argument("--task-count", type=int, help="taskCount the coordinator must report")
    count.add_argument("--inputs-summary", type=Path, help="read taskCount from validate_inputs' summary")
    parser.add_argument("--timeout", type=positive_float, required=True, help="total deadline in seconds")
    parser.add_argument("--interval", type=positive_float, default=0.05, help="seconds between probes")
    parser.add_argument("--probe-timeout", type=positive_float, default=1.0,
                        help="bound on one probe (command mode: the command's own time limit)")
    parser.add_argument("--start-timeout", type=positive_float,
                        help="bound on waiting for the endpoint file; the --timeout deadline then starts when it "
                             "appears (a service that starts after its dependencies' gates)")
    parser.add_argument("--record", type=Path, help="write the gate record (JSON) here when ready")
    parser.add_argument("--coordinator-record", type=Path,
                        help="the coordinator's end record: if it appears while waiting, fail at once with its reason")
    parser.add_argument("--events", type=Path,
                        help=f"event log to append to (default SCRATCH/{names.EVENTS}; with --service NAME: "
                             f"SCRATCH/{names.component_events('NAME')})")
    parser.add_argument("--off-node", action="store_true",
                        help="the gate of a node other than the coordinator's: unreachable is a [network] error")
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
        args.endpoint_file = (service_endpoint_path(args.scratch, args.service) if args.service
                              else args.scratch / names.ENDPOINT)
    elif not args.endpoint_file:
        parser.error("one of --endpoint, --endpoint-file or --scratch (or $ALLOCSTACK_SCRATCH) is required")
    if args.service and args.scratch and not args.coordinator_record:
        args.coordinator_record = service_end_path(args.scratch, args.service)
    if args.scratch and not args.events:
        args.events = args.scratch / (names.component_events(args.service) if args.service else names.EVENTS)
    ensure_log_dir(args.events)
    return args


def unreachable(url: str, why: str) -> AllocstackError:
    """This node cannot reach the coordinator's network endpoint: the center's network policy is at fault."""
    return AllocstackError("network", f"{socket.gethostname()} cannot reach the coordinator at {url}: {why}; the "
                                      "address it listens on for the other nodes is config network.interface "
                                      "(null = the address the first node's hostname resolves to)")


def look_at_service(args) -> None:
    """Name what the service this gate passed listens on beyond loopback (allocstack/launch/exposure.py).

    Now, before the gate's record is written, the service is up and nothing that uses it has started (nothing
    stops it yet). Its process is in its endpoint file, on this node (a gate off the first node has none)."""
    if not args.service or args.off_node or args.endpoint_file is None:
        return
    try:
        process = read_endpoint(args.endpoint_file).process
    except AllocstackError:
        return  # it ended meanwhile: its end record says why
    if process is not None:
        exposure.look_at(process, "service", args.service, args.events,
                         lambda line: print(line, file=sys.stderr, flush=True))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started, started_wall = time.monotonic(), time.time()
    deadline = started + args.timeout
    named = {"service": args.service} if args.service else {}
    # Where the launcher of what this gates notes its end: this node's scratch (not another node's gate's).
    noted = None if args.off_node else args.scratch
    try:
        endpoint = (Endpoint(args.endpoint, "") if args.endpoint else
                    wait_for_endpoint(args.endpoint_file, started + (args.start_timeout or args.timeout),
                                      min(args.interval, 0.02), args.coordinator_record, args.service, noted))
        if endpoint is None:
            raise AllocstackError("readiness-timeout", f"no endpoint file at {args.endpoint_file} within "
                                                       f"{args.start_timeout or args.timeout:g} s")
        url = endpoint.url
        if args.start_timeout:  # the service started only now (after its dependencies' gates)
            started, started_wall = time.monotonic(), time.time()
            deadline = started + args.timeout
        # The built-in coordinator's gate on its own node (health, loopback http) without requests; your service's
        # http check, or the coordinator from another node (https, pinned), through a requests session.
        plain = args.mode != "http" and not args.off_node  # (tcp and command need no HTTP client)
        fatal: tuple[type[Exception], ...] = ()
        if not plain:
            import requests

            from allocstack.worker.sessions import NoHttps, PinnedAdapter, loopback_session
            fatal = (requests.exceptions.SSLError,)
        with nullcontext() if plain else loopback_session(endpoint.fingerprint) as session:
            get = plain_get if plain else session_get(session)

            def pinned_check(latest: Endpoint) -> tuple[Check, str]:
                # off the first node, a newer run's endpoint comes with its own certificate to pin
                if not plain:
                    session.mount("https://", PinnedAdapter(latest.fingerprint) if latest.fingerprint else NoHttps())
                return make_check(args, get, latest.url)

            check, wanted = make_check(args, get, url)
            in_use = lambda: (url, wanted)  # noqa: E731
            if args.endpoint_file:
                check, in_use = following(args.endpoint_file, endpoint, pinned_check)
            # (a coordinator may complete, and write its end record, before its gate passes: that is no end)
            check = while_alive(check, args.coordinator_record, args.service, noted)
            try:
                ready, attempts, last = probe(check, deadline, args.interval, args.probe_timeout, fatal)
            except fatal as exc:
                raise unreachable(in_use()[0], f"TLS failed ({str(exc)[-160:]}): the server there does not "
                                               "present this run's certificate") from exc
            url, wanted = in_use()
        if not ready and args.off_node:
            raise unreachable(url, f"no {wanted} within {args.timeout:g} s ({attempts} probes; last: {last})")
        if not ready:
            what = f"service {args.service}: " if args.service else ""
            raise AllocstackError(
                "readiness-timeout", f"{what}no {wanted} within {args.timeout:g} s ({attempts} probes; last: {last})"
            )
    except AllocstackError as error:
        append_event(args.events, "gate-failed", reason=error.message, **named)
        return report(error)
    seconds = time.monotonic() - started
    probed_in = {"container": args.image} if args.mode == "command" and args.image else {}  # its command's image
    event = append_event(args.events, "gate-passed", endpoint=url, secondsToReady=round(seconds, 4),
                         attempts=attempts, **named, **{**runtime_facts(), **probed_in})
    look_at_service(args)
    if args.record:
        atomic_write_json(args.record, {
            "schemaVersion": SCHEMA_VERSION, "status": "ready", "endpoint": url, "taskCount": args.task_count,
            "host": socket.gethostname(),
            "secondsToReady": round(seconds, 4), "attempts": attempts, "startedAt": started_wall,
            "passedAt": event["t"], **named,
        }, 0o644)
    print(f"readiness: {url} ready after {seconds:.3f} s ({attempts} probes)", flush=True)
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(run(main))
