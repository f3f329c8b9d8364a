#!/usr/bin/env python3
"""Your own long-running service (config ``service.command``), run like the coordinator.

A database or a model server your workers use: it gets the same treatment as the
built-in coordinator. This wrapper picks a free port on 127.0.0.1, publishes
``SCRATCH/app.json`` (``{"schemaVersion": 1, "endpoint", "token"}``, mode 0600),
writes the Snakemake service file, then runs your command with
``$ALLOCSTACK_APP_PORT``, ``$ALLOCSTACK_APP_ENDPOINT`` and ``$ALLOCSTACK_APP_TOKEN``.
Your service must listen on 127.0.0.1 at that port (and may require the token).
SIGTERM/SIGINT/SIGHUP are forwarded; when the workers are done Snakemake stops
it, and it stops by itself if its launcher is gone.

Exit code: your command's (0 when it ended on our forwarded signal).
"""

from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import sys
from pathlib import Path

from allocstack.cli import ArgumentParser, argv_list, run
from allocstack.endpoint import app_environment, write_endpoint, write_service_file
from allocstack.errors import AllocstackError, report
from allocstack.events import append_event
from allocstack.lifeline import forward_signals, watch_launcher
from allocstack.scratch import ensure_private_dir


def free_loopback_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def parse_args(argv: list[str] | None):
    parser = ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--command-json", type=argv_list, required=True, help="your service as a JSON argv list")
    parser.add_argument("--scratch", type=Path, default=os.environ.get("ALLOCSTACK_SCRATCH") or None,
                        help="job-scoped scratch (default $ALLOCSTACK_SCRATCH): app.json goes there")
    parser.add_argument("--service-file", type=Path, help="the Snakemake service output, written first thing")
    args = parser.parse_args(argv)
    if args.scratch is None:
        parser.error("--scratch (or $ALLOCSTACK_SCRATCH) is required")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.service_file:
        write_service_file(args.service_file)
    try:
        ensure_private_dir(args.scratch)
    except AllocstackError as error:
        return report(error)
    port, token = free_loopback_port(), secrets.token_urlsafe(32)
    endpoint, published = f"http://127.0.0.1:{port}", args.scratch / "app.json"
    env = {**os.environ, **app_environment(endpoint, token)}
    try:
        child = subprocess.Popen(args.command_json, env=env)
    except OSError as exc:
        return report(AllocstackError("prerequisite", f"cannot start service.command {args.command_json[0]}: {exc.strerror}"))
    write_endpoint(published, endpoint, token, "")
    # Its own event file: the coordinator clears events.jsonl of earlier runs when it starts.
    events = args.scratch / "app-events.jsonl"
    events.unlink(missing_ok=True)
    append_event(events, "app-started", endpoint=endpoint, command=args.command_json[0])
    print(f"app_service: {args.command_json[0]} started on {endpoint} (pid {child.pid})", file=sys.stderr, flush=True)
    forwarded: set[int] = set()

    def forward(signum: int, _frame: object) -> None:
        forwarded.add(signum)
        child.send_signal(signum)

    forward_signals(forward)
    watch_launcher(lambda: forward(signal.SIGTERM, None))
    code = child.wait()
    published.unlink(missing_ok=True)
    append_event(events, "app-end", exitCode=code)
    print(f"app_service: {args.command_json[0]} ended with {code}", file=sys.stderr, flush=True)
    if code < 0 and -code in forwarded:
        return 0
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(run(main))
