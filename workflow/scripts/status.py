#!/usr/bin/env python3
"""Show a running stack's state on one screen (or the URL of its live status page).

    python workflow/scripts/status.py --run baseline          # on the node the stack runs on
    python workflow/scripts/status.py --run baseline --url    # the /ui page address (view token)
    srun --jobid JOB --overlap python workflow/scripts/status.py --run baseline   # from a login node

It reads the run's endpoint file in job-scoped scratch (only you can read it)
and asks the coordinator for ``/status``. Exit 0, or 69 when no stack of that
run is serving.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import requests

from allocstack.cli import ArgumentParser
from allocstack.client import CoordinatorClient
from allocstack.endpoint import TUNNEL_PORT, read_endpoint, read_view_token, tunnel_command
from allocstack.errors import EXIT_OK, AllocstackError, report
from allocstack.scratch import resolve_root, run_scratch


def render(status: dict[str, Any], url: str) -> str:
    """The one-screen summary (pure: tested directly)."""
    eta = f"{status['etaSeconds']:.0f} s" if status.get("etaSeconds") is not None else "-"
    ready = f"{status['readySeconds']:.3f} s" if status.get("readySeconds") is not None else "-"
    state = "complete" if status.get("complete") else ("stopping" if status.get("draining") else "running")
    lines = [
        f"allocstack stack at {url}: {state}",
        f"  tasks     {status['done']:>9,} done  {status['leased']:>7,} leased  {status['pending']:>9,} pending"
        f"  {status.get('failed', 0):>5,} failed  of {status['total']:,}",
        f"  rate      {status['ratePerSecond']:>9,.0f} tasks/s (last 30 s), time left {eta}",
        f"  elapsed   {status['elapsedSeconds']:>9.1f} s, ready after {ready}",
        f"  leases    {status['expiredLeases']:>9,} expired and requeued; {status.get('rejected', 0):,} results rejected;"
        f" {status.get('restored', 0):,} restored from the journal",
        "  workers   claimed   completed  last seen",
    ]
    for worker, stats in status["workers"].items():
        lines.append(f"  {worker:<12}{stats['claimed']:>7,} {stats['completed']:>11,}  {stats['lastSeenSecondsAgo']:.1f} s ago")
    if not status["workers"]:
        lines.append("  (no worker has claimed yet)")
    return "\n".join(lines)


def parse_args(argv: list[str] | None):
    parser = ArgumentParser(description=__doc__.split("\n\n")[0])
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--run", help="run name (config `run`); the endpoint is in its job-scoped scratch")
    where.add_argument("--endpoint-file", type=Path, help="the endpoint file itself")
    parser.add_argument("--scratch-root", default="", help="config `scratch` if you set one")
    parser.add_argument("--url", action="store_true", help="print the live page's URL and the SSH tunnel command")
    parser.add_argument("--json", action="store_true", help="print the raw /status document")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        path = args.endpoint_file or run_scratch(resolve_root(args.scratch_root, os.environ), args.run) / "endpoint.json"
        if not path.exists():
            raise AllocstackError("prerequisite", f"no endpoint file at {path}: is the stack running on this node?")
        url, token = read_endpoint(path)
        if args.url:
            port, view = url.rsplit(":", 1)[1], read_view_token(path)
            print(f"{url}/ui?token={view}")
            print(f"from your laptop: {tunnel_command(port, os.environ)}"
                  f"  then open http://127.0.0.1:{TUNNEL_PORT}/ui?token={view}")
            return EXIT_OK
        client = CoordinatorClient(url, token, timeout=10)
        try:
            status = client.status()
        except requests.RequestException as exc:
            raise AllocstackError("prerequisite", f"the coordinator at {url} does not answer ({type(exc).__name__})") from exc
    except AllocstackError as error:
        return report(error)
    if args.json:
        print(json.dumps(status, indent=2, sort_keys=True))
    else:
        print(render(status, url))
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
