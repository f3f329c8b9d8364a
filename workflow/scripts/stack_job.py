#!/usr/bin/env python3
"""Record the job the stack started in: its node, its Slurm job, the CPUs Snakemake sees there, when.

Run by rule open_stack (workflow/rules/stack_job.smk) as the stack's group of jobs starts::

    python3 stack_job.py --out results/RUN/stack-job.json

It ends at once, and that is its second purpose: Snakemake runs a group of jobs that start together
(the stack: your services, their gates, the workers, the check...) on a pool of threads of the CPUs it
sees + 5 threads, grown to the number of jobs when the group is larger, while the group's own runner
holds one of those threads. A group as large as that pool is one thread short: its last job waits
for a thread until another job ends, and when that last job is the gate the workers wait for, nothing
ends (the stack hangs until the workers' gate timeout). This job ending at once gives that thread
back. collect.py copies the record into provenance.json.

Exit codes: 0 written; 74 the record cannot be written.
"""

from __future__ import annotations

import os
import socket
import sys
import time
from pathlib import Path

from allocstack import SCHEMA_VERSION
from allocstack.common.cli import ArgumentParser, run
from allocstack.common.errors import EXIT_OK, AllocstackError, report
from allocstack.common.jsonio import atomic_write_json


def stack_job(environ: dict[str, str], cpus: int, node: str, now: float) -> dict:
    """The record: where the stack's group of jobs started and what Snakemake sees there."""
    return {
        "schemaVersion": SCHEMA_VERSION,
        "startedAt": now,
        "node": environ.get("SLURMD_NODENAME") or node,
        "slurmJob": environ.get("SLURM_JOB_ID"),
        # what Snakemake's "--cores all" inside the job counts (its group's threads are this + 5)
        "cpusSeen": cpus,
    }


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="the record to write (results/RUN/stack-job.json)")
    args = parser.parse_args(argv)
    record = stack_job(dict(os.environ), len(os.sched_getaffinity(0)), socket.gethostname(), time.time())
    try:
        atomic_write_json(args.out, record, 0o644)
    except OSError as exc:
        return report(AllocstackError("io", f"cannot write {args.out}: {exc.strerror}"))
    print(f"stack_job: the stack started on {record['node']} (Slurm job {record['slurmJob'] or 'none'}, "
          f"{record['cpusSeen']} CPU(s) seen)", flush=True)
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(run(main))
