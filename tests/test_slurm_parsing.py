"""The parsers of allocstack.common.slurm, on output captured from the test cluster (Slurm 22.05.8).

Captured with the exact commands allocstack runs, against job 15 (two named steps,
``sbatch -c 2 --time=2 --wrap 'srun --overlap -n1 -c1 --job-name=coordinator sleep 20 & ...'``)
on the one-node cluster of tests/cluster/slurm.sh (node ``vm`` in partitions ``debug`` and
``short``). Like the Slurm executor plugin's own parser tests: no cluster needed.
"""

from __future__ import annotations

import signal
import time

from allocstack.common import slurm

# sinfo --noheader --Node --format=%c   (the node is listed once per partition)
SINFO_NODE_CPUS = "8\n8\n"
# sinfo --version
SINFO_VERSION = "slurm-wlm 22.05.8\n"
# squeue --noheader --jobs 15 --format=%e   (local time)
SQUEUE_END = "2026-12-03T03:43:49\n"
# squeue --steps --jobs 15 --noheader --format=%i %j
SQUEUE_STEPS = "15.0 coordinator\n15.1 worker-01\n15.batch batch\n"
# sacct --jobs 15 --noheader --parsable2 --format=JobID,JobName,State,ExitCode,AllocCPUS,TotalCPU,Elapsed,NodeList
SACCT_RUNNING = """\
15|wrap|RUNNING|0:0|2|00:00:00|00:00:04|vm
15.batch|batch|RUNNING|0:0|2|00:00:00|00:00:04|vm
15.0|coordinator|RUNNING|0:0|1|00:00:00|00:00:04|vm
15.1|worker-01|RUNNING|0:0|1|00:00:00|00:00:04|vm
"""
SACCT_DONE = """\
15|wrap|COMPLETED|0:0|2|00:00.028|00:00:23|vm
15.batch|batch|COMPLETED|0:0|2|00:00.022|00:00:23|vm
15.0|coordinator|COMPLETED|0:0|1|00:00.002|00:00:20|vm
15.1|worker-01|COMPLETED|0:0|1|00:00.002|00:00:20|vm
"""


def test_node_cpus_from_sinfo():
    assert slurm.parse_node_cpus(SINFO_NODE_CPUS) == 8
    assert slurm.parse_node_cpus("4\n64+\n16\n") == 64  # a range of node sizes: "64+"
    assert slurm.parse_node_cpus("") is None
    assert slurm.parse_node_cpus("sinfo: error: Unable to contact slurm controller") is None


def test_end_time_from_squeue_is_local_time():
    expected = int(time.mktime((2026, 12, 3, 3, 43, 49, 0, 0, -1)))
    assert slurm.parse_end_time(SQUEUE_END) == expected
    assert slurm.parse_end_time("N/A\n") is None and slurm.parse_end_time("NONE") is None
    assert slurm.parse_end_time("") is None


def test_the_allocation_end_prefers_the_exported_variable():
    assert slurm.allocation_end({"SLURM_JOB_END_TIME": "1790000000", "SLURM_JOB_ID": "15"}) == 1790000000
    assert slurm.allocation_end({}) is None  # outside a job: unknown, and no squeue is run
    assert slurm.end_time_from_env({"SLURM_JOB_END_TIME": "soon"}) == 0.0


def test_step_ids_by_name_from_squeue():
    assert slurm.parse_step_ids(SQUEUE_STEPS, "coordinator") == ["15.0"]
    assert slurm.parse_step_ids(SQUEUE_STEPS, "worker-01") == ["15.1"]
    assert slurm.parse_step_ids(SQUEUE_STEPS, "worker-02") == []
    assert slurm.parse_step_ids("15.3 coordinator\n15.4 coordinator\n", "coordinator") == ["15.3", "15.4"]
    assert slurm.parse_step_ids("", "coordinator") == []


def test_listpids_gives_every_process_of_a_step_on_this_node():
    listing = ("PID      JOBID    STEPID   LOCALID GLOBALID\n"  # measured: ch-run and its child in step 376.0
               "7700     376      0        0       0       \n"
               "7703     376      0        -       -       \n")
    assert slurm.parse_listpids(listing) == [7700, 7703]
    assert slurm.parse_listpids("") == []


def test_steps_from_sacct():
    steps = slurm.parse_steps(SACCT_DONE)
    assert [step["JobID"] for step in steps] == ["15", "15.batch", "15.0", "15.1"]
    assert steps[2] == {"JobID": "15.0", "JobName": "coordinator", "State": "COMPLETED", "ExitCode": "0:0",
                        "AllocCPUS": "1", "TotalCPU": "00:00.002", "Elapsed": "00:00:20", "NodeList": "vm"}
    assert [step["State"] for step in slurm.parse_steps(SACCT_RUNNING)] == ["RUNNING"] * 4
    assert slurm.parse_steps("") == []


def test_the_calls_parse_what_the_commands_print(monkeypatch, tmp_path):
    """The captured output replayed by stand-in commands: the argv allocstack passes, parsed end to end."""
    calls = tmp_path / "calls"
    replies = {"sinfo": f"[ \"$1\" = --version ] && printf '{SINFO_VERSION}' || printf '{SINFO_NODE_CPUS}'",
               "squeue": f"case \"$*\" in *--steps*) printf '{SQUEUE_STEPS}';; *) printf '{SQUEUE_END}';; esac",
               "sacct": f"printf '{SACCT_DONE}'", "scancel": "true"}
    for name, reply in replies.items():
        program = tmp_path / name
        program.write_text(f'#!/bin/sh\necho "{name} $*" >> {calls}\n{reply}\n')
        program.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert slurm.version() == "slurm-wlm 22.05.8"
    assert slurm.largest_node_cpus() == 8
    assert slurm.allocation_end({"SLURM_JOB_ID": "15"}) == slurm.parse_end_time(SQUEUE_END)
    assert [step["JobName"] for step in slurm.job_steps("15")] == ["wrap", "batch", "coordinator", "worker-01"]
    assert slurm.signal_step("15", "worker-01", signal.SIGTERM) is True
    assert calls.read_text().splitlines() == [
        "sinfo --version",
        "sinfo --noheader --Node --format=%c",
        "squeue --noheader --jobs 15 --format=%e",
        "sacct --jobs 15 --noheader --parsable2 --format=JobID,JobName,State,ExitCode,AllocCPUS,TotalCPU,Elapsed,NodeList",
        "squeue --steps --jobs 15 --noheader --format=%i %j",
        "scancel --signal=TERM 15.1",
    ]


def test_a_missing_slurm_gives_none_not_an_exception(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # no sinfo, squeue, sacct or scancel here
    assert slurm.query(["sinfo", "--version"]) is None
    assert slurm.largest_node_cpus() is None and slurm.version() is None
    assert slurm.job_steps("15") is None and slurm.job_steps(None) is None
    assert slurm.allocation_end({"SLURM_JOB_ID": "15"}) is None
    assert slurm.signal_step("15", "coordinator", signal.SIGTERM) is False
