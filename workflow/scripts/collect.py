#!/usr/bin/env python3
"""Collect a finished stack: merge the event log, record provenance, clean scratch.

Runs after the coordinator and every worker ended. Reads the job-scoped event log
(``SCRATCH/events.jsonl``) and, with more than one node, the logs of the components
off the first node (``<state_dir>/<run>/events/*.jsonl``, removed once merged),
writes them sorted by time to the results directory, draws them as the run's
timeline (``--timeline-out``, plot_timeline.py), writes ``provenance.json`` (where each component ran: host, Python, OS release
as seen by the component, Slurm job/step, container; the Slurm version, the
container runtime and its version; input and image digests, the run's identity (what produced its
results, allocstack/common/identity.py); the run's scratch and where its
root came from), then removes the run's scratch directory.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from plot_timeline import render as render_timeline
from render_decisions import with_seen

from allocstack import SCHEMA_VERSION
from allocstack.common import names
from allocstack.common.cli import ArgumentParser, positive_float, run, tool_version
from allocstack.common.endpoint import service_end_path
from allocstack.common.errors import EXIT_OK, AllocstackError, report
from allocstack.common.events import read_events
from allocstack.common.jsonio import atomic_write_json, atomic_write_text, read_json
from allocstack.common.scratch import remove_scratch, resolve_root, root_source, scratch_of
from allocstack.launch.containers import PROGRAMS, version_argv
from allocstack.launch.exposure import summary_lines

PROVENANCE_FIELDS = ("host", "python", "pythonVersion", "osRelease", "container", "slurmJobId", "slurmStepId")


def container_runtime(summary: dict[str, Any]) -> dict[str, Any] | None:
    """The runtime that ran the image, and its version as this node reports it (None without an image)."""
    if not summary.get("image") and not summary.get("programImages"):
        return None
    from allocstack.launch.containers import runtime_environ

    runtime = summary.get("runtime", "apptainer")
    version = tool_version(version_argv(runtime), runtime_environ(os.environ))
    return {"name": runtime, "program": PROGRAMS[runtime], "version": version}


def cluster_facts(job: str | None, summary: dict[str, Any]) -> tuple[str | None, Any, dict[str, Any] | None]:
    """Slurm's version, the job's steps as accounting records them, and the container runtime: three client
    programs at once (this runs in the job). Outside an allocation and without an image there is none to ask,
    and nothing of Slurm's or the runtimes' code is imported."""
    if not job and not summary.get("image") and not summary.get("programImages"):
        return None, None, None
    from concurrent.futures import ThreadPoolExecutor

    from allocstack.common import slurm

    with ThreadPoolExecutor(max_workers=3) as pool:
        version = pool.submit(slurm.version) if job else None
        steps = pool.submit(slurm.job_steps, job)
        runtime = pool.submit(container_runtime, summary)
    return version.result() if version else None, steps.result(), runtime.result()


def components(events: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Where each component ran, from the runtime facts in its first event."""
    found: dict[str, dict[str, Any]] = {}
    for event in events:
        gate = f"{event['service']}-readiness" if event.get("service") else "readiness"
        name = {"gate-passed": gate, "worker-start": event.get("worker"), "service-started": event.get("service"),
                "main-start": event.get("service"), "init-start": event.get("service"),
                "coordinator-listening": "coordinator"}.get(event.get("event"))
        if name and name not in found:
            found[name] = {key: event.get(key) for key in PROVENANCE_FIELDS}
    return found


def service_ends(scratch: Path, services: list[str], timeout: float) -> dict[str, dict[str, Any]]:
    """How each of your services ended, from the records their supervisors write once they stopped.

    Snakemake stops the services and starts this job at once: a service still draining
    gets up to ``timeout`` seconds in all (longer than its stop_grace_period, after which
    its supervisor kills it and records that). A record that never comes is ``unknown``.
    """
    deadline = time.monotonic() + timeout
    ends: dict[str, dict[str, Any]] = {}
    for name in services:
        path = service_end_path(scratch, name)
        while not path.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        try:
            ends[name] = read_json(path, f"end record of service {name}", diag="service-exit")
        except AllocstackError as error:
            ends[name] = {"service": name, "status": "unknown", "reason": error.message}
    return ends


def parse_args(argv: list[str] | None):
    parser = ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scratch-root", default="", help="configured scratch root ('' = $SLURM_TMPDIR, $TMPDIR, ...)")
    parser.add_argument("--run", required=True, help="run name (scratch is ROOT/allocstack-UID/RUN.CHECKOUT[.JOB])")
    parser.add_argument("--inputs-summary", type=Path, required=True, help="validate_inputs summary (digests)")
    parser.add_argument("--events-out", type=Path, required=True, help="merged event log to write")
    parser.add_argument("--provenance-out", type=Path, required=True, help="provenance record to write")
    parser.add_argument("--stack-job", type=Path, required=True,
                        help="where the stack's group of jobs started (stack_job.py's record): kept in provenance")
    parser.add_argument("--timeline-out", type=Path, help="the run's timeline to draw (SVG)")
    parser.add_argument("--service", action="append", default=[], help="one of your services (repeatable)")
    parser.add_argument("--services-out", type=Path, help="how each of your services ended (services.json)")
    parser.add_argument("--stop-timeout", type=positive_float, default=30.0,
                        help="bound on waiting for your services' end records")
    parser.add_argument("--component", action="append", default=[],
                        help="a component with its own event file, SCRATCH/events/NAME.jsonl (repeatable)")
    parser.add_argument("--shared-dir", type=Path,
                        help="the run's state directory: merge (and remove) the event logs in its events/")
    parser.add_argument("--decision-record", type=Path,
                        help="the run's decision record: what was seen listening beyond loopback is added to it")
    parser.add_argument("--keep-scratch", action="store_true",
                        help="do not remove the scratch directory (verification still needs the volumes)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        args.scratch = scratch_of(resolve_root(args.scratch_root, os.environ), args.run, os.environ)
        ends = service_ends(args.scratch, args.service, args.stop_timeout)
        if args.services_out:
            atomic_write_json(args.services_out, {"schemaVersion": SCHEMA_VERSION, "services": ends}, 0o644)
        shared = sorted((args.shared_dir / names.EVENTS_DIR).glob("*.jsonl")) if args.shared_dir else []
        logs = [args.scratch / names.EVENTS, *(args.scratch / names.component_events(name) for name in args.component),
                *shared]
        events = sorted((e for log in logs for e in read_events(log)), key=lambda e: e.get("t", 0))
        if not events:
            raise AllocstackError("prerequisite", f"no events in {logs[0]}: did the stack run?")
        atomic_write_text(args.events_out, "".join(json.dumps(e, sort_keys=True) + "\n" for e in events), 0o644)
        if args.timeline_out:
            atomic_write_text(args.timeline_out, render_timeline(events), 0o644)
        if args.decision_record and args.decision_record.exists():
            record = args.decision_record.read_text(encoding="utf-8")
            atomic_write_text(args.decision_record, with_seen(record, summary_lines(events)), 0o644)
        summary = read_json(args.inputs_summary, "inputs summary", diag="prerequisite")
        started = read_json(args.stack_job, "the stack's start record", diag="prerequisite")
        job = os.environ.get("SLURM_JOB_ID")
        slurm_version, steps, runtime = cluster_facts(job, summary)
        atomic_write_json(args.provenance_out, {
            "schemaVersion": SCHEMA_VERSION,
            "collectedAt": time.time(),
            "inputSha256": summary.get("inputSha256"),
            "expectedSha256": summary.get("expectedSha256"),
            "image": summary.get("image"),
            "imageSha256": summary.get("imageSha256"),
            # what produced the results: the task set, the program and the files it names, its settings, the image
            "identity": summary.get("identity"),
            # each image a program of yours ran in, checked against its sidecar before anything started
            "programImages": summary.get("programImages", {}),
            "slurm": {
                "version": slurm_version,
                "jobId": job,
                "node": os.environ.get("SLURMD_NODENAME"),
                "steps": steps,
            },
            "containerRuntime": runtime,
            "stackJob": started,
            "scratch": {"path": str(args.scratch), "from": root_source(args.scratch_root, os.environ)},
            "components": components(events),
        }, 0o644)
        if not args.keep_scratch:
            remove_scratch(args.scratch)
            if args.shared_dir:
                remove_scratch(args.shared_dir / names.EVENTS_DIR)
    except AllocstackError as error:
        return report(error)
    print(f"collect: {len(events)} events merged into {args.events_out}", flush=True)
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(run(main))
