"""Replicas of a service other than the workers (issue 25: ``services.<name>.replicas``, Compose ``deploy.replicas``,
``--scale``): a consumer of three replicas, each its own supervised program told ``ALLOCSTACK_REPLICA`` and
``ALLOCSTACK_REPLICAS``, each writing a file named by its number into a named volume; the check finds all three;
replica 2 killed from outside is started again by its own restart policy, the others not; the stack's end stops
every replica (nothing left running). A real Snakemake run, real processes.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from real_parts import require_slurm
from workflow_helpers import snakemake

PYTHON = json.dumps(sys.executable)
#: A replica: its number and how many run, written into the volume as replica-K; its pid beside the project; then
#: it consumes forever (it listens on nothing).
CONSUMER = ("import os, sys, time; k, n = os.environ['ALLOCSTACK_REPLICA'], os.environ['ALLOCSTACK_REPLICAS'];"
            " open(os.path.join(sys.argv[1], f'pid-{k}'), 'w').write(str(os.getpid()));"
            " open(os.path.join(os.environ['ALLOCSTACK_VOLUME_DATA'], f'replica-{k}'), 'w').write(f'{k} of {n}')\n"
            "while True: time.sleep(0.1)")
#: The worker: waits (bounded) until every replica wrote its file, as a producer would see its consumers at work;
#: then kills replica 2's program (kill -9) and waits until its supervisor started it again (a new pid).
WORKER = ("import os, signal, sys, time; d = os.environ['ALLOCSTACK_VOLUME_DATA']; end = time.monotonic() + 60\n"
          "while len([f for f in os.listdir(d) if f.startswith('replica-')]) < 3 and time.monotonic() < end:"
          " time.sleep(0.05)\n"
          "pid = lambda: open(os.path.join(sys.argv[1], 'pid-2')).read(); first = pid();"
          " os.kill(int(first), signal.SIGKILL)\n"
          "while pid() == first and time.monotonic() < end: time.sleep(0.05)")
#: The check: replica-1..3 in the volume, each saying "K of 3".
CHECK = ("import os, sys; d = os.environ['ALLOCSTACK_VOLUME_DATA'];"
         " found = {f: open(os.path.join(d, f)).read() for f in os.listdir(d)}; print('check:', sorted(found.items()));"
         " sys.exit(found != {f'replica-{k}': f'{k} of 3' for k in (1, 2, 3)})")


def stack(pids: Path, run: str) -> str:
    return textwrap.dedent(f"""
        run: {run}
        tasks: null
        expected: null
        workers: 1
        volumes: [data]
        worker: {{mode: long-running, command: [{PYTHON}, -c, {json.dumps(WORKER)}, {json.dumps(str(pids))}]}}
        services:
          consumer:
            command: [{PYTHON}, -c, {json.dumps(CONSUMER)}, {json.dumps(str(pids))}]
            readiness: {{mode: started}}
            replicas: 3
            restart: {{condition: on-failure}}
        verify:
          command: [{PYTHON}, -c, {json.dumps(CHECK)}]
    """)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def assert_replicas_ran_and_stopped(project: Path, pids: Path, run: str) -> None:
    assert json.loads((project / f"results/{run}/result.json").read_text())["status"] == "success"
    assert "check: [('replica-1', '1 of 3'), ('replica-2', '2 of 3'), ('replica-3', '3 of 3')]" in (
        project / f"logs/run_check/{run}.log").read_text()
    ends = json.loads((project / f"results/{run}/services.json").read_text())["services"]
    names = ["consumer", "consumer-replica-2", "consumer-replica-3"]
    assert {name: ends[name]["status"] for name in names} == dict.fromkeys(names, "stopped")
    # its own restart policy: replica 2, killed from outside, was started again; the others never
    assert {name: ends[name]["restarts"] for name in names} == {"consumer": 0, "consumer-replica-2": 1,
                                                                 "consumer-replica-3": 0}
    for name in names:  # each replica supervised as a service is: its own log
        assert "started on http://127.0.0.1:" in (project / f"logs/serve_service/{run}/{name}.log").read_text()
    events = [json.loads(line) for line in (project / f"results/{run}/events.jsonl").read_text().splitlines()]
    assert [(e["service"], e["exitCode"]) for e in events if e["event"] == "service-restart"] == [
        ("consumer-replica-2", -9)]
    starts = sorted(event["t"] for event in events if event.get("event") == "service-started")
    assert len(starts) == 3
    print(f"three replicas started within {starts[-1] - starts[0]:.2f} s of each other")
    programs = [int((pids / f"pid-{k}").read_text()) for k in (1, 2, 3)]
    assert len(set(programs)) == 3 and not [pid for pid in programs if alive(pid)]  # the stack stopped them all


def test_three_replicas_each_write_their_file_and_the_stack_stops_them_all(project):
    pids = project / "pids"
    pids.mkdir()
    (project / "config/replicas.yaml").write_text(stack(pids, "replicas"))
    done = snakemake(project, "--cores", "4", "--configfile", "config/replicas.yaml")
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-3000:]
    assert_replicas_ran_and_stopped(project, pids, "replicas")


SLURM = ["--profile", "profiles/slurm", "--default-resources", "slurm_account=allocstack", "slurm_partition=debug",
         "mem_mb=300", "runtime=10", "--config", "image=null"]


@pytest.mark.slurm
def test_under_slurm_each_replica_is_a_job_step_of_the_one_allocation(project):
    """The same stack under the Slurm profile: one sbatch job; each replica its own job step (consumer,
    consumer-replica-2, consumer-replica-3 in sacct, COMPLETED: stopped as a service is); nothing left running."""
    require_slurm()
    pids = project / "pids"
    pids.mkdir()
    (project / "config/replicas.yaml").write_text(stack(pids, "slurmreplicas"))
    done = snakemake(project, "--cores", "4", "--configfile", "config/replicas.yaml", *SLURM)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    jobs = re.findall(r"submitted with SLURM jobid (\d+)", output)
    assert len(jobs) == 1, output[-4000:]
    assert_replicas_ran_and_stopped(project, pids, "slurmreplicas")
    names = ["consumer", "consumer-replica-2", "consumer-replica-3"]
    for _ in range(20):  # accounting records a step when it ends
        steps = subprocess.run(["sacct", "-j", jobs[0], "--noheader", "--parsable2", "--format=JobName,State"],
                               capture_output=True, text=True, timeout=30, check=False).stdout.split()
        replicas = sorted(line for line in steps if line.split("|")[0] in names)
        if len(replicas) == 3:
            break
        time.sleep(0.5)
    assert replicas == sorted(f"{name}|COMPLETED" for name in names), steps
