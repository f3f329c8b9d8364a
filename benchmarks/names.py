#!/usr/bin/env python3
"""What the stack's names cost a program's start (issue 32, point 2): medians of N starts of ``true``.

    .venv/bin/python benchmarks/names.py [--runs 21]      # source tests/cluster/env.sh first for the runtimes

* without an image: started as allocstack starts a program (``run_program``), with the parent-death signal only,
  then in a mount namespace with the stack's hosts file bound at /etc/hosts (as root), then in a user + mount
  namespace (as a user does it; root can make one too);
* in an image: ``apptainer exec`` (the test image) and ``ch-run`` (the directory test image), each without and with
  the hosts file bound at /etc/hosts (the runtime's own part of the start).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "workflow" / "scripts"))

from allocstack.launch.hostsfile import write_hosts
from allocstack.launch.privatenames import entering
from allocstack.launch.program import run_program
from allocstack.launch.supervise import die_with_parent


def medians_ms(runs: int, starts: dict) -> dict[str, float]:
    """Each start's median in milliseconds, the starts taken in turn (one warm-up each first), so that the machine's
    other load falls on all of them alike."""
    times: dict[str, list[float]] = {label: [] for label in starts}
    for round_ in range(runs + 1):
        for label, start in starts.items():
            began = time.perf_counter()
            start()
            if round_:
                times[label].append((time.perf_counter() - began) * 1000)
    return {label: statistics.median(values) for label, values in times.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=21)
    args = parser.parse_args(argv)
    scratch = Path(tempfile.mkdtemp(prefix="allocstack-names-"))
    hosts = write_hosts(scratch, {"redis": ["cache", "queue"]})
    starts = {}
    for label, preexec in (("no image: parent-death signal only", die_with_parent),
                           ("no image: + mount namespace (root)", entering(hosts, "mount", die_with_parent)),
                           ("no image: + user and mount namespace", entering(hosts, "user", die_with_parent))):
        starts[label] = lambda preexec=preexec: run_program(["true"], preexec=preexec)
    env = {**os.environ, "USER": os.environ.get("USER") or "root"}
    sif, chdir = os.environ.get("ALLOCSTACK_TEST_IMAGE"), os.environ.get("ALLOCSTACK_TEST_CHARLIECLOUD_IMAGE")
    if sif and Path(sif).exists():
        base = ["apptainer", "exec", "--cleanenv", "--contain"]
        for label, extra in (("apptainer exec", []), ("apptainer exec + hosts bind", ["--bind", f"{hosts}:/etc/hosts:ro"])):
            starts[label] = lambda extra=extra: subprocess.run([*base, *extra, sif, "true"], check=True, env=env)
    if chdir and Path(chdir).is_dir():
        for label, extra in (("ch-run", []), ("ch-run + hosts bind", [f"--bind={hosts}:/etc/hosts"])):
            starts[label] = lambda extra=extra: subprocess.run(["ch-run", "--unset-env=*", *extra, chdir, "--", "true"],
                                                               check=True, env=env)
    rows = medians_ms(args.runs, starts)
    width = max(map(len, rows))
    print(f"{'start of `true`':<{width}}  median ms ({args.runs} runs)")
    for label, value in rows.items():
        print(f"{label:<{width}}  {value:8.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
