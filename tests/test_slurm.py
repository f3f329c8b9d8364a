"""The whole stack in ONE allocation of a real Slurm cluster (tests/cluster/slurm.sh), inside Apptainer."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from conftest import expected_for, make_tasks, pids_of_run, write_json
from real_parts import require_apptainer, require_slurm
from workflow_helpers import SNAKEMAKE, copy_project, snakemake

pytestmark = [pytest.mark.slurm, pytest.mark.apptainer]
# The test cluster's account and partition, layered over the real profile's values.
TEST_RESOURCES = ["--default-resources", "slurm_account=allocstack", "slurm_partition=debug", "mem_mb=300"]


@pytest.fixture
def cluster_project(tmp_path):
    require_slurm()
    image = require_apptainer()
    workdir = copy_project(tmp_path / "project")
    yield workdir, image
    leftovers = pids_of_run(workdir, "Apptainer runtime parent")
    for pid in leftovers:
        os.kill(pid, signal.SIGKILL)
    assert not leftovers, f"processes of the run left on the node: {leftovers}"


def submitted_jobs(output: str) -> list[str]:
    return re.findall(r"submitted with SLURM jobid (\d+)", output)


def the_stack_job(output: str, project) -> str:
    """The run's one sbatch job (the whole stack). More than one means an attempt failed and the profile's
    ``retries`` submitted the stack again: fail with what each earlier attempt's Slurm log says, not a bare count."""
    jobs = submitted_jobs(output)
    if len(jobs) == 1:
        return jobs[0]
    logs = {job: sorted(project.glob(f"logs/slurm/*/{job}.log")) for job in jobs[:-1]}
    tails = "\n".join(f"--- job {job}: {paths[0] if paths else 'no Slurm log'}\n"
                      + ("\n".join(paths[0].read_text(errors="replace").splitlines()[-40:]) if paths else "")
                      for job, paths in logs.items())
    pytest.fail(f"{len(jobs)} sbatch jobs {jobs} for one stack (retried after a failed attempt):\n{tails}\n"
                f"--- Snakemake's output, its end:\n{output[-3000:]}")


def steps(job: str) -> dict[str, str]:
    listing = subprocess.run(["sacct", "-j", job, "--noheader", "--parsable2", "--format=JobID,JobName,State"],
                             capture_output=True, text=True, timeout=30, check=False).stdout
    return {name: state for _, name, state in (line.split("|") for line in listing.splitlines() if line)}


def recorded_steps(job: str, wanted) -> dict[str, str]:
    """The job's steps once accounting lists every one of ``wanted`` (it records a step when the step ends; slurmdbd
    is given up to 10 s), else as they are then."""
    for _ in range(20):
        job_steps = steps(job)
        if set(wanted) <= set(job_steps):
            break
        time.sleep(0.5)
    return job_steps


COMPONENTS = ("coordinator", "readiness", "worker-01", "worker-02", "verify")


def assert_a_completed_step_per_component(job: str, project: Path) -> None:
    """A step per component, each COMPLETED. The coordinator is a service Snakemake stops when its consumers
    are done: its step ends on that signal, which srun passes on as a step signal; whether Slurm then records
    it COMPLETED or CANCELLED depends on which it notes first (the coordinator exits within milliseconds, on a
    loaded machine slurmstepd may see the signal first). Either is an orderly end when the coordinator says
    it stopped on the signal, after draining."""
    job_steps = recorded_steps(job, COMPONENTS)
    for name in COMPONENTS:
        state = job_steps.get(name)
        if name == "coordinator" and state == "CANCELLED":
            log = (project / "logs/serve_coordinator/baseline.log").read_text()
            assert "coordinator: stopped (signal:SIGTERM)" in log, f"step coordinator of job {job}: {log[-2000:]}"
            continue
        assert state == "COMPLETED", f"step {name} of job {job}: {json.dumps(job_steps)}"


def job_state(job: str) -> str:
    return subprocess.run(["sacct", "-j", job, "-X", "--noheader", "--format=State"],
                          capture_output=True, text=True, timeout=30, check=False).stdout.strip()


def test_baseline_is_one_sbatch_job_with_a_step_per_component(cluster_project):
    project, image = cluster_project
    started = time.monotonic()
    done = snakemake(project, "--profile", "profiles/slurm", *TEST_RESOURCES, "runtime=10",
                     "--config", f"image={image}", timeout=600)
    elapsed = time.monotonic() - started
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    marker = json.loads((project / "results/baseline/result.json").read_text())
    assert marker["status"] == "success" and marker["taskCount"] == 4
    job = the_stack_job(output, project)  # exactly one sbatch job for the whole stack
    assert_a_completed_step_per_component(job, project)
    provenance = json.loads((project / "results/baseline/provenance.json").read_text())
    assert provenance["slurm"]["jobId"] == job and provenance["slurm"]["node"]
    assert provenance["slurm"]["version"].startswith("slurm")
    assert {s["JobName"] for s in provenance["slurm"]["steps"]} >= {"coordinator", "worker-01", "worker-02"}
    for component in provenance["components"].values():
        assert component["container"] == image and component["python"] == "/usr/bin/python3"
        assert component["slurmJobId"] == job
    # Every step is pinned to the node of the group job: loopback only reaches that node.
    node = provenance["slurm"]["node"]
    for log in ("serve_coordinator/baseline.log", "await_readiness/baseline.log", "run_worker/baseline/worker-01.log"):
        assert "srun --job-name=" in (project / "logs" / log).read_text()
        assert f"--nodes=1 --nodelist={node} " in (project / "logs" / log).read_text(), log
    events = [json.loads(line) for line in (project / "results/baseline/events.jsonl").read_text().splitlines()]
    gate = next(e["t"] for e in events if e["event"] == "gate-passed")
    assert all(gate <= e["t"] for e in events if e["event"] == "worker-start")
    print(f"submission to success: {elapsed:.1f} s, sbatch jobs: 1")


def test_time_limit_is_reported_nothing_is_left_and_a_rerun_succeeds(cluster_project):
    project, image = cluster_project
    tasks = make_tasks(240)  # 240 s of work for 2 workers: far beyond a 1-minute limit, even enforced late
    write_json(project / "inputs/long.json", tasks)
    write_json(project / "expected/long.json", expected_for(tasks))
    (project / "config/long.yaml").write_text(
        "tasks: inputs/long.json\nexpected: expected/long.json\nrun: long\n"
        "simulate: {task_seconds: 2}\ncoordinator: {lease_seconds: 10, stop_claims_before_end: false}\n")
    (project / "config/long-rerun.yaml").write_text("workers: 4\nsimulate: {task_seconds: 0}\n")
    started = time.monotonic()
    # --retries 0: this test is about Slurm's limit ending the job and a rerun by hand.
    done = snakemake(project, "--profile", "profiles/slurm", *TEST_RESOURCES, "runtime=1", "--retries", "0",
                     "--configfile", "config/long.yaml", "--config", f"image={image}", timeout=400)
    elapsed = time.monotonic() - started
    output = done.stdout + done.stderr
    assert done.returncode != 0
    assert elapsed < 300, f"Snakemake took {elapsed:.0f} s to report the time limit"
    assert not (project / "results/long/result.json").exists()
    job = the_stack_job(output, project)
    state = job_state(job)
    assert state == "TIMEOUT", state
    slurm_logs = "".join(p.read_text() for p in (project / "logs/slurm").rglob("*.log"))
    assert "DUE TO TIME LIMIT" in slurm_logs
    coordinator_log = (project / "logs/serve_coordinator/long.log").read_text()
    # Slurm's SIGTERM reached the coordinator through srun and Apptainer: it drained and said why.
    assert "stopping (signal:SIGTERM)" in coordinator_log and "incomplete (signal:SIGTERM)" in coordinator_log
    acknowledged = (project / "state/long/journal.jsonl").read_text().count('"kind":"result"')
    assert 0 < acknowledged < 240
    squeue = subprocess.run(["squeue", "--noheader", "-j", job], capture_output=True, text=True, timeout=30, check=False)
    assert job not in squeue.stdout

    rerun = snakemake(project, "--profile", "profiles/slurm", *TEST_RESOURCES, "runtime=10",
                      "--configfile", "config/long.yaml", "config/long-rerun.yaml", "--config", f"image={image}",
                      timeout=600)
    assert rerun.returncode == 0, (rerun.stdout + rerun.stderr)[-4000:]
    assert json.loads((project / "results/long/result.json").read_text())["status"] == "success"
    assert json.loads((project / "results/long/coordinator.json").read_text())["restored"] == acknowledged
    print(f"time limit reported after {elapsed:.0f} s; {acknowledged} results kept and resumed")


COUNTING_PROGRAM = """import json, os, sys, time
payload = json.load(sys.stdin)
time.sleep(1)
with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "computed.log"), "a") as log:
    log.write(os.environ["ALLOCSTACK_TASK_ID"] + "\\n")
sys.stdout.write(payload["message"] * payload["repeat"])
"""


def test_work_longer_than_one_allocation_finishes_in_one_command(cluster_project):
    """runtime 1 minute, 2.75 minutes of work (165 one-second tasks, 3 workers): one snakemake command.

    One lease before each allocation ends the coordinator stops handing out work; the workers
    finish what they hold; the job fails as incomplete and the profile's retries submit the stack
    again, which resumes from the journal. The worker program logs every task it computes.
    """
    project, image = cluster_project
    tasks = make_tasks(165)  # at most ~150 fit in the first allocation
    write_json(project / "inputs/multi.json", tasks)
    write_json(project / "expected/multi.json", expected_for(tasks))
    program_dir = project / "program"
    program_dir.mkdir()
    (program_dir / "count.py").write_text(COUNTING_PROGRAM)
    (project / "config/multi.yaml").write_text(
        "tasks: inputs/multi.json\nexpected: expected/multi.json\nrun: multi\nworkers: 3\n"
        f"worker: {{command: [python3, {program_dir / 'count.py'}]}}\n"
        f"apptainer: {{binds: [{program_dir}]}}\ncoordinator: {{lease_seconds: 10}}\n")
    done = snakemake(project, "--profile", "profiles/slurm", *TEST_RESOURCES, "runtime=1",
                     "--configfile", "config/multi.yaml", "--config", f"image={image}", timeout=900)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    assert json.loads((project / "results/multi/result.json").read_text())["status"] == "success"
    jobs = submitted_jobs(output)
    assert len(jobs) >= 2, jobs
    end = json.loads((project / "results/multi/coordinator.json").read_text())
    computed = sum(json.loads(p.read_text())["tasksCompleted"] for p in (project / "results/multi/workers").glob("*.json"))
    assert end["restored"] > 0 and end["restored"] + computed == 165, (end["restored"], computed)
    log = (program_dir / "computed.log").read_text().split()
    assert sorted(log) == sorted(task["id"] for task in tasks["tasks"])  # each task computed exactly once
    states = {job: job_state(job) for job in jobs}
    print(f"{len(jobs)} allocations: {states}; restored {end['restored']}, computed last {computed}")


def test_more_workers_than_the_node_has_cpus_is_refused_up_front(cluster_project):
    project, image = cluster_project
    done = snakemake(project, "--profile", "profiles/slurm", *TEST_RESOURCES, "--config", "workers=40",
                     f"image={image}", timeout=120)
    output = done.stdout + done.stderr
    assert done.returncode != 0
    assert "allocstack: error [config]: workers=40 needs 41 CPUs" in output
    assert not submitted_jobs(output)


@pytest.mark.parametrize("settings, words", [
    (["slurm_account=allocstack-no-such"], "slurm_account=allocstack-no-such: there is no such account"),
    (["slurm_account=allocstack-other"], "slurm_account=allocstack-other: the account exists but user"),
    (["slurm_partition=allocstack-no-such"], "slurm_partition=allocstack-no-such: there is no such partition"),
    (["slurm_partition=short", "runtime=10"], "runtime=10: above the 5-minute MaxTime of partition short"),
    (["mem_mb=5000"], "mem_mb=5000 x 4 components running at once = 20000 MB in one allocation, above the 16000 MB"),
])
def test_wrong_cluster_settings_are_refused_before_anything_is_submitted(cluster_project, settings, words):
    """The test cluster has account allocstack-other (root has no association) and partition short (5 minutes)."""
    project, image = cluster_project
    done = snakemake(project, "--profile", "profiles/slurm", *TEST_RESOURCES, "runtime=5", *settings,
                     "--config", f"image={image}", timeout=120)
    output = done.stdout + done.stderr
    assert done.returncode != 0
    lines = [line for line in output.splitlines() if "allocstack: error" in line]
    assert len(lines) == 1 and f"allocstack: error [config]: default-resources {words}" in lines[0], output[-3000:]
    assert not submitted_jobs(output) and not (project / "results").exists()


@pytest.mark.parametrize("configfile, run", [
    ("config/examples/baseline.yaml", "example-baseline"),
    ("config/examples/wordcount/config.yaml", "wordcount"),
])
def test_examples_run_on_the_cluster(cluster_project, configfile, run):
    project, image = cluster_project
    done = snakemake(project, "--profile", "profiles/slurm", *TEST_RESOURCES, "runtime=10",
                     "--configfile", configfile, "--config", f"image={image}", timeout=600)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    the_stack_job(output, project)
    assert json.loads((project / f"results/{run}/result.json").read_text())["status"] == "success"
    if run == "wordcount":
        assert "words in 8 chunks agree" in (project / "logs/verify_results/wordcount.log").read_text()


@pytest.mark.parametrize(("config", "total"), [
    ("worker: {gpus: 1}\n", "--gpus=2"),  # 2 workers x 1 GPU; the coordinator, gate and verifier get none
    # a service's GPUs are summed in: it runs beside the workers (a model server and its clients)
    ("worker: {gpus: 1}\nservices: {model: {command: [python3, -c, pass], gpus: 3, readiness: {mode: started}}}\n",
     "--gpus=5"),
], ids=["workers", "workers and a service"])
def test_gpus_requested_reach_the_sbatch_line(cluster_project, config, total):
    """The test cluster has no GPU, so sbatch refuses the job; the generated call is what we inspect."""
    project, image = cluster_project
    (project / "config/gpu.yaml").write_text(config)
    done = snakemake(project, "--profile", "profiles/slurm", *TEST_RESOURCES, "runtime=5", "--verbose",
                     "--configfile", "config/gpu.yaml", "--config", f"image={image}", timeout=300)
    output = done.stdout + done.stderr
    assert done.returncode != 0
    call = next(line for line in output.splitlines() if line.startswith("sbatch call:"))
    assert total in call, call
    assert not submitted_jobs(output)


def test_inside_an_allocation_you_hold_the_stack_runs_as_job_steps(cluster_project):
    """`salloc`, then `snakemake --cores N --sdm apptainer`: no sbatch, no status polling; each
    component is a job step of the allocation, as under the profile."""
    project, image = cluster_project
    command = ["timeout", "-k", "10", "300", "salloc", "--account=allocstack", "--partition=debug", "--nodes=1",
               "--cpus-per-task=4", "--mem=2000", "--time=5", SNAKEMAKE, "--cores", "4", "--sdm", "apptainer",
               "--config", f"image={image}"]
    done = subprocess.run(command, cwd=project, capture_output=True, text=True, check=False,
                          env={**os.environ, "TMPDIR": str(project / "tmp")})
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    [job] = re.findall(r"Granted job allocation (\d+)", output)
    assert not submitted_jobs(output) and "SLURM run ID" not in output  # the Slurm executor plugin is not used
    assert json.loads((project / "results/baseline/result.json").read_text())["status"] == "success"
    assert_a_completed_step_per_component(job, project)
    provenance = json.loads((project / "results/baseline/provenance.json").read_text())
    assert provenance["slurm"]["jobId"] == job
    assert all(component["slurmJobId"] == job for component in provenance["components"].values())


def test_inside_an_allocation_snakemake_must_run_on_its_node(cluster_project):
    """An allocation held from another host (say salloc on a login node): refused in one line."""
    project, image = cluster_project
    done = snakemake(project, "--cores", "4", "--dry-run", "--sdm", "apptainer", "--config", f"image={image}",
                     env={"SLURM_JOB_ID": "424242", "SLURM_JOB_NODELIST": "elsewhere[01-02]"}, timeout=120)
    output = done.stdout + done.stderr
    assert done.returncode != 0
    assert ("allocstack: error [prerequisite]: inside allocation 424242 (node(s) elsewhere01, elsewhere02) but on "
            "host") in output, output[-2000:]
    assert "srun --jobid 424242 --overlap --pty bash" in output
