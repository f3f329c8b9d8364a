#!/usr/bin/env python3
"""Show a stack's state on one screen: live while it runs, from its records once it ended.

    python workflow/scripts/status.py                         # the only run there is
    python workflow/scripts/status.py --run baseline          # on the node the stack runs on
    python workflow/scripts/status.py --run baseline --url    # the /ui page address (view token)
    srun --jobid JOB --overlap python workflow/scripts/status.py --run baseline   # from a login node

While the stack runs it reads the run's endpoint file in job-scoped scratch (only
you can read it) and asks the coordinator for ``/status``; with more than one node
it works from any node of the allocation (off the coordinator's node it reads the
endpoint published for the other nodes in the run's state directory: TLS, pinned).
Once it ended it shows the run from ``results/<run>/`` (the verdict, counts,
workers, where the marker is). ``--run`` may be left out when there is exactly one
run serving (else exactly one run with records). Snakemake calls it with ``--end-of-run`` for the
summary it prints when a run ends. Exit 0, or 69 when there is no such run.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from allocstack.common import names
from allocstack.common.cli import ArgumentParser, run
from allocstack.common.errors import EXIT_OK, AllocstackError, report
from allocstack.status.summary import (
    error_lines,
    failed_components,
    known_runs,
    live_runs,
    read_run,
    render_finished,
    render_interrupted,
    served,
)


def render(status: dict[str, Any], url: str) -> str:
    """The one-screen summary (pure: tested directly)."""
    eta = f"{status['etaSeconds']:.0f} s" if status.get("etaSeconds") is not None else "-"
    ready = f"{status['readySeconds']:.3f} s" if status.get("readySeconds") is not None else "-"
    state = "complete" if status.get("complete") else ("stopping" if status.get("draining") else "running")
    lines = [
        f"allocstack stack at {url}: {state}",
        (f"  tasks     {status['done']:>9,} done  {status['leased']:>7,} leased  {status['pending']:>9,} pending"
        f"  {status.get('failed', 0):>5,} failed  of {status['total']:,}"),
        f"  rate      {status['ratePerSecond']:>9,.0f} tasks/s (last 30 s), time left {eta}",
        f"  elapsed   {status['elapsedSeconds']:>9.1f} s, ready after {ready}",
        (f"  leases    {status['expiredLeases']:>9,} expired and requeued; {status.get('rejected', 0):,} results rejected;"
        f" {status.get('restored', 0):,} restored from the journal"),
        "  workers   claimed   completed  last seen",
    ]
    for worker, stats in status["workers"].items():
        node = f"  on {stats['node']}" if stats.get("node") else ""
        lines.append(f"  {worker:<12}{stats['claimed']:>7,} {stats['completed']:>11,}  "
                     f"{stats['lastSeenSecondsAgo']:.1f} s ago{node}")
    if not status["workers"]:
        lines.append("  (no worker has claimed yet)")
    nodes = status.get("nodes") or {}
    if nodes:
        lines.append("  nodes     workers   completed  last seen")
        for node, stats in nodes.items():
            lines.append(f"  {node:<12}{len(stats['workers']):>7,} {stats['completed']:>11,}  "
                         f"{stats['lastSeenSecondsAgo']:.1f} s ago  ({', '.join(stats['workers'])})")
    events = status.get("events") or []
    if events:
        lines.append("  events    (restarts, sockets beyond loopback, failed gates; the newest last)")
        now = time.time()
        for event in events:
            ago = f"{max(0.0, now - event['t']):.0f} s ago" if isinstance(event.get("t"), (int, float)) else "-"
            lines.append(f"  {ago:>10}  {event['line']}")
    return "\n".join(lines)


def parse_args(argv: list[str] | None):
    parser = ArgumentParser(description=__doc__.split("\n\n")[0])
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--run", help="run name (config `run`); default: the only run there is")
    where.add_argument("--endpoint-file", type=Path, help="the endpoint file itself")
    parser.add_argument("--scratch-root", default="", help="config `scratch` if you set one")
    parser.add_argument("--results-dir", type=Path, default=Path("results"), help="where runs leave their records")
    parser.add_argument("--logs-dir", type=Path, default=Path("logs"), help="where the components' logs are")
    parser.add_argument("--state-dir", type=Path, default=Path("state"),
                        help="config `state_dir`: off the coordinator's node (more than one node), the endpoint is there")
    parser.add_argument("--url", action="store_true",
                        help="print the live page's URL (and, in a Slurm allocation, the SSH tunnel command)")
    parser.add_argument("--json", action="store_true", help="print the raw /status document")
    parser.add_argument("--end-of-run", choices=["success", "error", "interrupted"],
                        help="Snakemake's summary when a run ends (onsuccess/onerror; interrupted: Ctrl-C): from the "
                             "records only")
    parser.add_argument("--resume", default="", help="with --end-of-run interrupted: the command that resumes the run")
    parser.add_argument("--since", type=float, default=0.0,
                        help="epoch seconds the command started: wall time, and which logs are this run's")
    return parser.parse_args(argv)


def user_scratch(scratch_root: str) -> Path | None:
    """``<root>/allocstack-<uid>``, where live runs publish their endpoints (None if it cannot be resolved)."""
    from allocstack.common import scratch

    try:
        return scratch.user_scratch(scratch.resolve_root(scratch_root, os.environ))
    except AllocstackError:
        return None


def stack_network_of(endpoint: Path):
    """The stack's private network (config network.isolation: private) of the run whose endpoint is ``endpoint``,
    if it has one and it is up (allocstack/launch/stacknet.py), else None."""
    from allocstack.launch import stacknet

    return stacknet.read_held(endpoint.parent)


def enter_stack_network(held) -> None:
    """Run this same command again inside the stack's network (``nsenter`` execs it: the run's owner may enter it,
    no one else can)."""
    from allocstack.launch import stacknet

    os.environ[names.NETWORK_ENV] = "private"
    argv = [*stacknet.join_prefix(held), sys.executable, *sys.argv]
    os.execvp(argv[0], argv)  # noqa: S606 - nsenter, then this same command: no shell


def live_endpoint(scratch: Path, run: str) -> Path | None:
    """The endpoint file of ``run`` of this checkout in ``scratch`` (``<root>/allocstack-<uid>``): the one of this
    Slurm job (``srun --jobid JOB``), else the run's only one that is there."""
    from allocstack.common.scratch import runs_in, scratch_of

    own = scratch_of(scratch.parent, run, os.environ) / names.ENDPOINT
    if own.exists():
        return own
    published = [d / names.ENDPOINT for d in runs_in(scratch).get(run, []) if (d / names.ENDPOINT).exists()]
    return published[0] if len(published) == 1 else own


def choose_run(args) -> str:
    """``--run``, or the one run that is live (serving, in this checkout's scratch); with none live, the only run
    whose records are in the results directory.

    :raises AllocstackError: ``usage`` naming the runs when there are several, ``prerequisite`` when none.
    """
    if args.run:
        return args.run
    scratch = user_scratch(args.scratch_root)
    live = sorted(live_runs(scratch)) if scratch else []
    if len(live) == 1:
        return live[0]
    if live:
        raise AllocstackError("usage", f"{len(live)} runs are serving: {', '.join(live)}; say which with --run")
    runs = sorted(known_runs(args.results_dir))
    if len(runs) == 1:
        return runs[0]
    if not runs:
        raise AllocstackError("prerequisite", f"no run found: no stack is serving here and {args.results_dir}/ "
                                              "holds no run's records; give --run")
    raise AllocstackError("usage", f"{len(runs)} runs: {', '.join(runs)}, none serving; say which with --run")


def live_status(path: Path) -> tuple[str, dict[str, Any]]:
    """(url, /status document) from a serving coordinator.

    :raises AllocstackError: ``prerequisite`` when it does not answer.
    """
    from allocstack.common.endpoint import read_endpoint
    from allocstack.worker.client import CoordinatorClient  # only a live stack needs the HTTP client
    from allocstack.worker.httpclient import TransportError

    endpoint = read_endpoint(path)
    client = CoordinatorClient(endpoint.url, endpoint.token, timeout=10, fingerprint=endpoint.fingerprint)
    try:
        return endpoint.url, client.status()
    except TransportError as exc:
        raise AllocstackError("prerequisite", f"the coordinator at {endpoint.url} does not answer "
                                              f"({type(exc).__name__})") from exc


def show_finished(args, run: str) -> int:
    """The run from its records; an error when it left none."""
    if args.end_of_run in ("interrupted", "error") and served(read_run(args.results_dir, run, args.since)):
        args.end_of_run = "success"  # a serving stack ended after it was up (Ctrl-C, scancel, the time limit)
    if args.end_of_run == "interrupted":
        records = read_run(args.results_dir, run, args.since)
        wall = time.time() - args.since if args.since else None
        journal = args.state_dir / run / names.JOURNAL
        print(render_interrupted(records, wall_seconds=wall, command=args.resume, journal=journal), flush=True)
        return EXIT_OK
    if args.end_of_run:
        failed = args.end_of_run == "error"
        # after an error, what an earlier run left is not this run's: only fresh records count
        records = read_run(args.results_dir, run, args.since if failed else 0.0)
        errors = error_lines(args.logs_dir, run, args.since) if failed else None
        failures = failed_components(args.logs_dir, run, args.since) if failed and not errors else None
        wall = time.time() - args.since if args.since else None
        print(render_finished(records, failed=failed, wall_seconds=wall, errors=errors, failures=failures), flush=True)
        return EXIT_OK
    records = read_run(args.results_dir, run)
    if not records.exists:
        raise AllocstackError("prerequisite", f"run {run!r}: no stack is serving on this node and "
                                              f"{records.directory}/ holds no records")
    if args.url:
        raise AllocstackError("prerequisite", f"run {run!r} has ended: --url needs a running stack")
    if args.json:
        print(json.dumps({**records.documents, "workers": records.workers}, indent=2, sort_keys=True))
    else:
        print(render_finished(records), flush=True)
    return EXIT_OK


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        if args.end_of_run and args.run:  # Snakemake's summary: the records alone (and a quick start)
            return show_finished(args, args.run)
        if args.endpoint_file:
            run, path = None, args.endpoint_file
        else:
            run = choose_run(args)
            scratch = user_scratch(args.scratch_root)
            path = live_endpoint(scratch, run) if scratch else None
            shared = args.state_dir / run / names.ENDPOINT
            if (path is None or not path.exists()) and shared.exists():
                path = shared  # another node of a multi-node stack
        if args.end_of_run or path is None or not path.exists():
            if run is None:
                raise AllocstackError("prerequisite", f"no endpoint file at {path}: is the stack running on this node?")
            return show_finished(args, run)
        private = stack_network_of(path)
        if args.url:
            from allocstack.common.endpoint import (
                TUNNEL_PORT,
                needs_tunnel,
                read_endpoint,
                read_view_token,
                tunnel_command,
            )

            endpoint = read_endpoint(path)
            port, view = endpoint.url.rsplit(":", 1)[1], read_view_token(path)
            print(f"{endpoint.url}/ui?token={view}")
            if endpoint.fingerprint:  # the endpoint for the other nodes (more than one node)
                print(f"TLS with the run's own certificate, SHA-256 {endpoint.fingerprint}; from your laptop, "
                      "run this command on the first node for an SSH tunnel to its loopback page")
            elif needs_tunnel(os.environ) or private:  # a compute node's loopback, or the stack's own network's
                environ = {**os.environ, **({names.NETWORK_ENV: "private", "ALLOCSTACK_SCRATCH": str(path.parent)}
                                            if private else {})}
                print(f"from your laptop: {tunnel_command(port, environ, name='coordinator')}"
                      f"  then open http://127.0.0.1:{TUNNEL_PORT}/ui?token={view}")
            return EXIT_OK
        if private and not names.in_private_network(os.environ):
            enter_stack_network(private)  # the coordinator's loopback is the stack's: ask from in there
        url, status = live_status(path)
    except AllocstackError as error:
        return report(error)
    if args.json:
        print(json.dumps(status, indent=2, sort_keys=True))
    else:
        print(render(status, url))
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(run(main))
