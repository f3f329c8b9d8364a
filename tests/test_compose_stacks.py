"""Whole Compose stacks, imported and run end to end: the seed's (filled in with this project's own programs) and
two written for the tests (tests/stacks/), locally and through the Slurm profile inside Apptainer; and how a
failing replica or a service that dies is reported."""

from __future__ import annotations

import hashlib
import itertools
import json
import shutil
import sys
import textwrap
from pathlib import Path

import pytest
from app_service import take_port
from test_slurm import TEST_RESOURCES, cluster_project, recorded_steps, the_stack_job  # noqa: F401 (a fixture)

from conftest import ROOT, run_script
from workflow_helpers import assert_run_failed, snakemake

STACKS = ROOT / "tests" / "stacks"
#: Each test stack: its run name, the ports its Compose file fixes (replaced by free ones: the node is shared),
#: its services in start order and what its check prints.
STACK = {
    "kv": ("kvstack", [8080], ["kv"], "check: 30 jobs answered by 3 workers, all correct"),
    "api": ("api", [9090, 9091], ["store", "api"], "check: 24 answers from"),
}


def free_port() -> int:
    """A port on loopback that nothing holds now, where allocstack itself gives a service one
    (``app_service.port_choices``: below the kernel's ephemeral range, so no connection another test opens meanwhile
    takes the port between this choice and the service's bind)."""
    return take_port(0)


def import_test_stack(project, name: str, *extra: str) -> str:
    """Copy tests/stacks/NAME into the project, give it free ports, import it; return the config's path."""
    shutil.copytree(STACKS / name, project / "stacks" / name)
    compose = project / "stacks" / name / "compose.yaml"
    text = compose.read_text()
    for port in STACK[name][1]:
        text = text.replace(str(port), str(free_port()))
    compose.write_text(text)
    done = run_script("import_compose.py", f"stacks/{name}/compose.yaml", "--output", f"config/{name}.yaml", *extra,
                      cwd=project)
    assert done.returncode == 0 and "0 gap(s)" in done.stdout, done.stdout + done.stderr
    return f"config/{name}.yaml"


def place_images(project, config: str, image: str) -> list[str]:
    """Put ``image`` (the test image: python3, no ENTRYPOINT, as python:3.11-slim) where the imported config
    expects each service's image, as a user would after building or pulling them; the config's image paths."""
    import yaml

    written = yaml.safe_load((project / config).read_text())
    paths = {spec["image"] for spec in [*written["services"].values(), written["worker"], written["verify"]]
             if spec["image"]}
    digest = Path(f"{image}.sha256").read_text().split()[0]
    for path in paths:
        target = project / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.symlink_to(image, target_is_directory=Path(image).is_dir())
        Path(f"{target}.sha256").write_text(f"{digest}  {target.name}{'/' if Path(image).is_dir() else ''}\n")
    return sorted(paths)


def events_of(project, run: str) -> list[dict]:
    return [json.loads(line) for line in (project / f"results/{run}/events.jsonl").read_text().splitlines()]


def first(events: list[dict], event: str, **fields) -> float:
    return next(e["t"] for e in events if e["event"] == event and all(e.get(k) == v for k, v in fields.items()))


def check_stack_ran(project, name: str) -> None:
    """The success marker, every service stopped cleanly, and the Compose order kept."""
    run, _, services, printed = STACK[name]
    marker = json.loads((project / f"results/{run}/result.json").read_text())
    assert marker == {"schemaVersion": 1, "status": "success", "services": sorted(services), "check": "passed"}
    ends = json.loads((project / f"results/{run}/services.json").read_text())["services"]
    assert {service: end["status"] for service, end in ends.items()} == dict.fromkeys(services, "stopped")
    events = events_of(project, run)
    for before, after in itertools.pairwise(services):  # depends_on: started after the other's gate passed
        assert first(events, "gate-passed", service=before) <= first(events, "service-started", service=after)
    last_gate = max(e["t"] for e in events if e["event"] == "gate-passed")
    worker_starts = [e["t"] for e in events if e["event"] == "worker-start"]
    assert worker_starts and min(worker_starts) >= last_gate
    # the check ran after every worker ended, while the services were up
    assert first(events, "check-start") >= max(e["t"] for e in events if e["event"] == "worker-end")
    assert first(events, "check-end", status="passed") <= min(e["t"] for e in events if e["event"] == "service-end")
    assert printed in (project / f"logs/run_check/{run}.log").read_text()


def test_the_seeds_stack_filled_in_with_this_projects_programs_runs(project):
    done = snakemake(project, "--cores", "4", "--configfile", "config/examples/seed/config.yaml")
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    marker = json.loads((project / "results/seed/result.json").read_text())
    assert marker["status"] == "success" and marker["services"] == ["coordinator"]
    # the check is the project's own verify.py, run as the seed's `verify` service
    assert "verify: 4 results verified" in (project / "logs/run_check/seed.log").read_text()
    assert "coordinator: completed (all tasks done), 4/4 results" in (
        project / "logs/serve_service/seed/coordinator.log").read_text()


@pytest.mark.parametrize("name", sorted(STACK))
def test_an_imported_stack_runs_locally(project, name):
    config = import_test_stack(project, name)
    done = snakemake(project, "--cores", "4", "--configfile", config)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    check_stack_ran(project, name)
    run, _, services, _ = STACK[name]  # the end-of-run summary says what was verified
    assert f"allocstack: run {run} VERIFIED: your check passed, {len(services)} service(s) stopped cleanly" in \
        done.stdout + done.stderr


@pytest.mark.slurm
@pytest.mark.apptainer
@pytest.mark.parametrize("name", sorted(STACK))
def test_an_imported_stack_runs_on_the_cluster(cluster_project, name):  # noqa: F811
    project, image = cluster_project
    config = import_test_stack(project, name)
    images = place_images(project, config, image)  # each service in its image: here all the test image
    done = snakemake(project, "--profile", "profiles/slurm", *TEST_RESOURCES, "runtime=10", "--configfile", config,
                     "--config", f"image={image}", timeout=600)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    check_stack_ran(project, name)
    job = the_stack_job(output, project)  # the whole stack is one sbatch job
    wanted = {*STACK[name][2], *(f"{s}-readiness" for s in STACK[name][2]), "worker-01", "worker-02", "check"}
    job_steps = recorded_steps(job, wanted)
    assert all(job_steps.get(step) == "COMPLETED" for step in wanted), job_steps
    provenance = json.loads((project / f"results/{STACK[name][0]}/provenance.json").read_text())
    assert all(component["container"] in {str(project / path) for path in images}
               for component in provenance["components"].values()), provenance["components"]
    assert {facts["image"] for facts in provenance["programImages"].values()} == set(images)


#: A task that arrives in the named volume `meet` and waits (at most 60 s, then fails) until MET tasks have: with one
#: task per worker, a worker that never starts keeps every other from ending.
MET = 5
MEETING = ("import os, pathlib, time; here = pathlib.Path(os.environ['ALLOCSTACK_VOLUME_MEET']); "
           "(here / os.environ['ALLOCSTACK_TASK_ID']).touch(); end = time.time() + 60\n"
           f"while len(list(here.iterdir())) < {MET}:\n"
           "    assert time.time() < end, 'not every task arrived'; time.sleep(0.1)\n"
           "print('met')")


@pytest.mark.slurm
@pytest.mark.apptainer
def test_a_stack_of_as_many_jobs_as_snakemakes_threads_runs_on_the_cluster(cluster_project):  # noqa: F811
    """Snakemake runs the stack's group (the coordinator, its gate, 5 workers) on a pool of the CPUs it sees in the
    job + 5 threads, grown to the group's size, while the group's runner holds one: the last job submitted waited for
    a thread until another job ended, and here none ends before all have started (each worker's task waits for the
    others'; the workers wait for the gate). rule open_stack ends at once and gives the thread back; its record says
    what Snakemake saw there."""
    project, image = cluster_project
    tasks = [{"id": f"t{k}", "payload": {}} for k in range(1, MET + 1)]
    (project / "inputs/meet.json").write_text(json.dumps({"schemaVersion": 1, "tasks": tasks}))
    digest = hashlib.sha256(b"met\n").hexdigest()
    (project / "expected/meet.json").write_text(json.dumps({"schemaVersion": 1, "results": [
        {"taskId": task["id"], "output": "met\n", "sha256": digest} for task in tasks]}))
    (project / "config/meet.yaml").write_text(textwrap.dedent(f"""
        run: meet
        tasks: inputs/meet.json
        expected: expected/meet.json
        workers: {MET}
        volumes: [meet]
        worker: {{command: [python3, -c, {json.dumps(MEETING)}]}}
    """))
    done = snakemake(project, "--profile", "profiles/slurm", *TEST_RESOURCES, "runtime=10", "--configfile",
                     "config/meet.yaml", "--config", f"image={image}", timeout=600)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    started = json.loads((project / "results/meet/stack-job.json").read_text())
    assert started["slurmJob"] == the_stack_job(output, project) and started["node"] == "vm", started
    assert json.loads((project / "results/meet/provenance.json").read_text())["stackJob"] == started
    group = 2 + MET  # the coordinator and its gate, the workers (open_stack aside)
    if started["cpusSeen"] + 5 > group:
        pytest.skip(f"Snakemake saw {started['cpusSeen']} CPUs in the job: its {started['cpusSeen'] + 5} threads for "
                    f"a group were enough for {group} jobs, so this run did not need open_stack's thread")


PYTHON = json.dumps(sys.executable)


def run_own_stack(project, run: str, workers: int, worker: str, service: str, code: str, *args: str,
                  python: str = sys.executable, readiness: dict | None = None):
    """Snakemake on a stack without a Compose file: one service NAME (a tcp gate, with ``readiness`` added to its
    settings) and long-running workers, each a snippet of Python run by ``python`` (``python3``: the image's, in
    one); the check passes; ``args`` go to Snakemake. Returns the run."""
    python, gate = json.dumps(python), json.dumps({"mode": "tcp", **(readiness or {})})
    (project / f"config/{run}.yaml").write_text(textwrap.dedent(f"""
        run: {run}
        tasks: null
        expected: null
        workers: {workers}
        worker: {{mode: long-running, command: [{python}, -c, {json.dumps(worker)}]}}
        services:
          {service}: {{command: [{python}, -c, {json.dumps(code)}], readiness: {gate}}}
        verify: {{command: [{python}, -c, pass]}}
    """))
    return snakemake(project, "--cores", "4", "--configfile", f"config/{run}.yaml", *args)


def test_a_failing_replica_fails_the_run_naming_it(project):
    """Each replica is told its index, the worker count and every service's endpoint and token."""
    replica = textwrap.dedent("""
        import os, sys
        e = os.environ
        assert e["ALLOCSTACK_ECHO_ENDPOINT"] == "http://127.0.0.1:" + e["ALLOCSTACK_ECHO_PORT"] and e["ALLOCSTACK_ECHO_TOKEN"]
        if e["ALLOCSTACK_REPLICA_INDEX"] == "1":
            sys.exit(f"replica 1 of {e['ALLOCSTACK_WORKERS']} ({e['ALLOCSTACK_WORKER_ID']}) fails on purpose")
    """)
    listen = "import os, socket, time; s = socket.create_server(('127.0.0.1', int(os.environ['ALLOCSTACK_ECHO_PORT']))); time.sleep(120)"
    done = run_own_stack(project, "replicas", 3, replica, "echo", listen)
    line = (f"allocstack: error [worker-exit]: worker-02 ({sys.executable} -c) exited 1: replica 1 of 3 (worker-02) "
            "fails on purpose")
    assert_run_failed(project, "replicas", done, line)


@pytest.mark.parametrize("code", [0, 3])
def test_a_service_that_ends_by_itself_fails_the_run(project, code):
    """A service job that exits 0 on its own passes in Snakemake's eyes: allocstack checks how each one ended."""
    dies = ("import os, socket, sys, time; s = socket.create_server(('127.0.0.1', int(os.environ['ALLOCSTACK_FLAKY_PORT'])));"
            f" time.sleep(1); print('flaky: out of memory (on purpose)', file=sys.stderr); sys.exit({code})")
    done = run_own_stack(project, "flaky", 1, "import time; time.sleep(3)", "flaky", dies)
    output = done.stdout + done.stderr
    assert done.returncode != 0
    line = ("allocstack: error [service-exit]: service flaky ended by itself before the stack was done "
            f"(exited {code}: flaky: out of memory (on purpose))")
    assert line in output, output[-3000:]
    assert not (project / "results/flaky/result.json").exists()


def test_a_service_that_fails_to_start_fails_its_gate_at_once(tmp_path):
    scratch = tmp_path / "scratch"
    (scratch / "services").mkdir(parents=True)
    (scratch / "services/db.end.json").write_text(json.dumps(
        {"schemaVersion": 1, "service": "db", "status": "failed", "how": "port 5432 is already in use"}))
    done = run_script("readiness.py", "--scratch", scratch, "--service", "db", "--mode", "tcp", "--timeout", 60,
                      "--start-timeout", 60)
    assert done.returncode == 70  # [service-exit] with the record's reason, not a timeout after 60 s
    assert "allocstack: error [service-exit]: service db ended before it was ready: port 5432 is already in use" \
        in done.stderr


def test_expand_names_what_is_not_set():
    from allocstack.common.errors import AllocstackError
    from allocstack.launch.program import expand

    assert expand("http://${ALLOCSTACK_KV_HOST}:80/${HOME}", {"ALLOCSTACK_KV_HOST": "127.0.0.1"}, "w") == \
        "http://127.0.0.1:80/${HOME}"  # only allocstack's own names are expanded
    with pytest.raises(AllocstackError) as error:
        expand("${ALLOCSTACK_DB_HOST}", {}, "services.api: environment DB")
    assert error.value.diag == "config" and "services.api: environment DB: ${ALLOCSTACK_DB_HOST} is not set" in error.value.message


def test_long_running_workers_against_the_built_in_coordinator(project):
    """tasks set and worker.mode long-running: the built-in worker, run as your program, finds the coordinator
    in ALLOCSTACK_COORDINATOR_*; verification checks every result as for the baseline, then your check, which
    still sees the named volume (removed after it)."""
    sees = "import os, sys; sys.exit(not os.path.isdir(sys.argv[1]))"
    (project / "config/own-workers.yaml").write_text(textwrap.dedent(f"""
        run: own-workers
        worker: {{mode: long-running, command: [python3, workflow/scripts/worker.py]}}
        volumes: [notes]
        verify: {{command: [{PYTHON}, -c, {json.dumps(sees)}, "${{ALLOCSTACK_VOLUME_NOTES}}"]}}
    """))
    done = snakemake(project, "--cores", "4", "--configfile", "config/own-workers.yaml")
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    marker = json.loads((project / "results/own-workers/result.json").read_text())
    assert marker["status"] == "success" and marker["taskCount"] == 4
    records = [json.loads((project / f"results/own-workers/workers/worker-0{i}.json").read_text()) for i in (1, 2)]
    assert all(record["mode"] == "long-running" and record["exitCode"] == 0 for record in records)
    assert not list((project / "tmp").glob("allocstack-*/own-workers.*"))  # scratch, volume and all, removed


def test_workers_and_a_check_alone_share_a_named_volume(project):
    """No services and no coordinator: replicas write into a named volume, the check reads it."""
    write = "import os; open(os.path.join(os.environ['ALLOCSTACK_VOLUME_OUT'], os.environ['ALLOCSTACK_WORKER_ID']), 'w')"
    check = "import os, sys; sys.exit(sorted(os.listdir(os.environ['ALLOCSTACK_VOLUME_OUT'])) != ['worker-01', 'worker-02'])"
    (project / "config/volume.yaml").write_text(textwrap.dedent(f"""
        run: volume
        tasks: null
        expected: null
        worker: {{mode: long-running, command: [{PYTHON}, -c, {json.dumps(write)}]}}
        volumes: [out]
        verify: {{command: [{PYTHON}, -c, {json.dumps(check)}]}}
    """))
    done = snakemake(project, "--cores", "4", "--configfile", "config/volume.yaml")
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    assert json.loads((project / "results/volume/result.json").read_text()) == {
        "schemaVersion": 1, "status": "success", "services": [], "check": "passed"}

