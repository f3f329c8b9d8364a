"""A real public Compose stack that we did not write, run from its Compose file (issues 24 and 25, "How it must be
shown"): a broker (Redis), daemon workers (Celery) and a producer, imported as `docker compose up --scale worker=4
--exit-code-from tests` takes it, with an override file that holds only what a batch run on an HPC node demands.

The stack: testdrivenio/fastapi-celery, docker-compose.yml at commit 191ff138701777838c363772253f73a276c16d68
(MIT licence, kept as LICENSE), copied with the few files its programs need into tests/public_stacks/fastapi-celery/
(tests/public_stacks/MANIFEST.yaml: what was copied, what is ours and why). Its services: redis:7, a FastAPI app
(uvicorn), `celery worker` (a daemon: it never ends by itself) and a Flower dashboard. The producer is the
upstream's own test suite (project/tests/: it queues a Celery task through Redis and waits for a worker's result),
run as the one-shot service `tests` of the override: the upstream runs it with `docker-compose exec web python -m
pytest`, and a batch job has nobody at a terminal to exec it.

Here every program runs on this machine, no image: redis-server from Debian (`make test` installs it:
tests/cluster/prepare.sh), the stack's Python packages in a venv of its own, made here from the upstream's
project/requirements.txt and our constraints.txt (the stack pins old versions that allocstack's own requirements.txt
cannot hold beside its own: requests 2.28.2, pydantic 1).

And the same files, unchanged, in per-service images: the import names two (``images/redis-7.sif`` for ``image:
redis:7``, ``images/fastapi-celery-project.sif`` for ``build: ./project``; directories for Charliecloud), and they are
put there as a user would after building them: the stack images tests/cluster/prepare.sh builds from Debian packages
(container/stacks/: ``redis``; ``fastapi-celery``, the app's image as its project/Dockerfile makes it, bookworm's
python3 and the same pinned packages in /opt/venv, WORKDIR /usr/src/app). Run with ``snakemake --cores 4 --sdm
apptainer``, with Charliecloud (the import's ``--runtime charliecloud``) and through the Slurm profile."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_slurm import TEST_RESOURCES, recorded_steps, the_stack_job
from test_stack_images import NO_APPTAINER_PATH, place_image

from conftest import ROOT, pids_of_run, run_script
from real_parts import require_slurm, unavailable
from workflow_helpers import snakemake

STACK = ROOT / "tests" / "public_stacks" / "fastapi-celery"
#: The ports its Compose files fix (web, redis, dashboard): each replaced by a free one, as the node is shared.
PORTS = ("8000", "6379", "5555")
#: What `docker compose up --scale worker=4 --exit-code-from tests` takes, as the import takes it.
FLAGS = ("--scale", "worker=4", "--exit-code-from", "tests")


@pytest.fixture(scope="session")
def stack_python(tmp_path_factory) -> Path:
    """A venv with the stack's own Python packages (celery, fastapi, uvicorn, flower, pytest as it pins them);
    its bin/ goes first on PATH, as the stack's image would have them."""
    venv = tmp_path_factory.mktemp("fastapi-celery-venv")
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    install = subprocess.run(
        [str(venv / "bin" / "pip"), "install", "--quiet", "--disable-pip-version-check",
         "-r", str(STACK / "project" / "requirements.txt"), "-c", str(STACK / "constraints.txt")],
        capture_output=True, text=True, timeout=600, check=False)
    assert install.returncode == 0, f"installing the stack's Python packages failed:\n{install.stderr[-3000:]}"
    return venv / "bin"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def listening(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0


def kill_processes_in(folder: Path) -> list[str]:
    """SIGKILL every process whose working directory is in ``folder`` (the stack's programs run in its project);
    return what each one was. Its command line need not name the folder: uvicorn --reload's server process does not."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            if not Path(os.readlink(proc / "cwd")).is_relative_to(folder):
                continue
            command = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            found.append(f"{proc.name}: {command[:120]}")
            os.kill(int(proc.name), signal.SIGKILL)
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
    return found


def place_stack(project: Path) -> tuple[Path, dict[str, int]]:
    """Copy the stack into the project as a user would clone it, its fixed ports moved to free ones."""
    stack = project / "stacks" / "fastapi-celery"
    shutil.copytree(STACK, stack)
    ports = {port: free_port() for port in PORTS}
    for name in ("docker-compose.yml", "compose.hpc.yaml"):
        text = (stack / name).read_text()
        for port, free in ports.items():
            text = text.replace(port, str(free))
        (stack / name).write_text(text)
    return stack, ports


def import_stack(project: Path, *extra: str) -> tuple[Path, dict[str, int], float]:
    """Place the stack and import it as `docker compose up --scale worker=4 --exit-code-from tests` takes it, with
    ``extra`` import flags (``--runtime charliecloud``); the stack's folder, its ports and the import's seconds."""
    stack, ports = place_stack(project)
    started = time.monotonic()
    imported = run_script("import_compose.py", "stacks/fastapi-celery/docker-compose.yml",
                          "stacks/fastapi-celery/compose.hpc.yaml", *FLAGS, *extra, "--output",
                          "config/fastapi-celery.yaml", cwd=project)
    import_seconds = time.monotonic() - started
    assert imported.returncode == 0, imported.stdout + imported.stderr
    assert "services redis, web, dashboard, tests; 4 workers; 0 gap(s)" in imported.stdout, imported.stdout
    config = (project / "config/fastapi-celery.yaml").read_text()
    assert "main: tests" in config and "workers: 4" in config
    return stack, ports, import_seconds


def check_stack_ran(project: Path, stack: Path, ports: dict[str, int]) -> None:
    """The producer's own output, the workers' log, the daemons stopped once it ended, nothing left listening."""
    marker = json.loads((project / "results/fastapi-celery/result.json").read_text())
    assert marker["status"] == "success" and marker["services"] == ["dashboard", "redis", "web"]
    # The producer's own output: the upstream's four tests, among them the task queued through Redis and
    # answered by a Celery worker (PENDING, then SUCCESS with result True).
    produced = (project / "logs/run_main/fastapi-celery.log").read_text()
    for test in ("test_home", "test_task", "test_mock_task", "test_task_status"):
        assert f"tests/test_tasks.py::{test} PASSED" in produced, produced[-3000:]
    assert " 4 passed" in produced
    # The workers' own log (celery's --logfile, in the bind-mounted project as in Docker): the task it ran.
    worker_log = (stack / "project/logs/celery.log").read_text()
    succeeded = [line for line in worker_log.splitlines() if "Task create_task[" in line and "succeeded in" in line]
    assert len(succeeded) == 1 and succeeded[0].endswith(": True"), worker_log[-3000:]
    # The daemons were stopped once the producer ended (celery's warm shutdown on SIGTERM: exit 0), and nothing
    # of the stack is left listening.
    records = [json.loads((project / f"results/fastapi-celery/workers/worker-0{i}.json").read_text())
               for i in range(1, 5)]
    assert [(r["status"], r["exitCode"]) for r in records] == [("stopped", 0)] * 4
    events = [json.loads(line) for line in (project / "results/fastapi-celery/events.jsonl").read_text().splitlines()]
    main_end = next(e["t"] for e in events if e["event"] == "main-end")
    assert all(e["t"] >= main_end for e in events if e["event"] == "worker-end")
    assert not any(listening(port) for port in ports.values()), ports
    # With the override's binds nothing of the stack listened beyond loopback (allocstack looked at each).
    assert not [e for e in events if e["event"] == "listening-exposed"], "listening beyond loopback"


def test_fastapi_celery_runs_from_its_compose_file_the_producer_ends_it_and_its_output_is_checked(project,
                                                                                                 stack_python):
    if shutil.which("redis-server") is None:
        unavailable("redis-server is not on PATH (as root: apt-get install redis-server; tests/cluster/prepare.sh "
                    "installs it)")
    stack, ports, import_seconds = import_stack(project)
    try:
        path = f"{stack_python}{os.pathsep}{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
        started = time.monotonic()
        done = snakemake(project, "--cores", "4", "--configfile", "config/fastapi-celery.yaml", timeout=400,
                         env={"PATH": path})
        run_seconds = time.monotonic() - started
        assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
        print(f"fastapi-celery: import {import_seconds:.2f} s, snakemake --cores 4 {run_seconds:.1f} s")
        check_stack_ran(project, stack, ports)
    finally:
        left = kill_processes_in(project)
    # Nothing of the stack is left running (its programs' own children included).
    assert not left, f"processes of the stack left running: {left}"


#: One pinned package: NAME==VERSION.
PIN = re.compile(r"[A-Za-z0-9_.-]+==[A-Za-z0-9_.+!-]+")


def pins(text: str) -> set[str]:
    """The NAME==VERSION lines of a requirements file."""
    return {line.strip() for line in text.splitlines() if "==" in line and not line.lstrip().startswith("#")}


def test_the_app_image_installs_the_packages_the_stack_pins():
    """container/stacks/fastapi-celery.def installs exactly what constraints.txt pins, which holds every pin of the
    upstream's requirements.txt: the app's image and the venv of the test above run the same packages."""
    definition = (ROOT / "container" / "stacks" / "fastapi-celery.def").read_text()
    in_image = {pin for pin in (line.strip("' \\") for line in pins(definition)) if PIN.fullmatch(pin)}
    constraints = pins((STACK / "constraints.txt").read_text())
    assert in_image == constraints, in_image ^ constraints
    assert pins((STACK / "project" / "requirements.txt").read_text()) <= constraints


#: The stack's images as the import names them (images/NAME.sif for Apptainer, images/NAME/ for Charliecloud) ->
#: the stack image each one is (container/stacks/: the app's image from its pinned packages; Redis from Debian).
IMAGES = {"fastapi-celery-project": "fastapi-celery", "redis-7": "redis"}


def run_in_images(project: Path, runtime: str, *args: str, env: dict[str, str] | None = None,
                  ) -> tuple[Path, dict[str, int], str]:
    """Import the stack for ``runtime``, put its two images where the config expects them, run snakemake with
    ``args``; the stack's folder, its ports and what snakemake printed. Nothing of the run is left running."""
    stack, ports, import_seconds = import_stack(project, *(["--runtime", runtime] if runtime != "apptainer" else []))
    for name, source in IMAGES.items():
        place_image(project, runtime, source, name)
    try:
        started = time.monotonic()
        done = snakemake(project, *args, "--configfile", "config/fastapi-celery.yaml", timeout=600, env=env)
        run_seconds = time.monotonic() - started
        output = done.stdout + done.stderr
        assert done.returncode == 0, output[-4000:]
        print(f"fastapi-celery in its images ({runtime}, {' '.join(args)}): import {import_seconds:.2f} s, "
              f"run {run_seconds:.1f} s")
    finally:
        left = pids_of_run(project, "Apptainer runtime parent", "squashfuse")
        for pid in left:
            os.kill(pid, signal.SIGKILL)
        left = [*map(str, left), *kill_processes_in(project)]
    assert not left, f"processes of the stack left running: {left}"
    return stack, ports, output


def check_images_ran(project: Path, runtime: str) -> None:
    """Each program in its own image, as provenance records it; Redis in the redis image."""
    provenance = json.loads((project / "results/fastapi-celery/provenance.json").read_text())
    assert provenance["containerRuntime"]["name"] == runtime
    images = {component: facts["image"] for component, facts in provenance["programImages"].items()}
    assert images.pop("services.redis").startswith("images/redis-7"), provenance["programImages"]
    assert images and all(image.startswith("images/fastapi-celery-project") for image in images.values()), images
    redis_log = (project / "logs/serve_service/fastapi-celery/redis.log").read_text()
    assert "redis: in its image:" in redis_log and "images/redis-7" in redis_log, redis_log[-2000:]


@pytest.mark.apptainer
def test_fastapi_celery_runs_unchanged_in_its_images_with_apptainer(project):
    stack, ports, _ = run_in_images(project, "apptainer", "--cores", "4", "--sdm", "apptainer")
    check_stack_ran(project, stack, ports)
    check_images_ran(project, "apptainer")


@pytest.mark.charliecloud
def test_fastapi_celery_runs_unchanged_in_its_images_with_charliecloud_and_no_apptainer(project):
    stack, ports, _ = run_in_images(project, "charliecloud", "--cores", "4", env={"PATH": NO_APPTAINER_PATH})
    check_stack_ran(project, stack, ports)
    check_images_ran(project, "charliecloud")


def check_job_steps(output: str, project: Path) -> dict[str, str]:
    """The whole stack was one sbatch job, each of its programs a job step that completed; its steps."""
    job = the_stack_job(output, project)
    services = ("redis", "web", "dashboard")
    wanted = {*services, *(f"{service}-readiness" for service in services), "tests",
              *(f"worker-0{i}" for i in range(1, 5))}
    job_steps = recorded_steps(job, wanted)
    assert all(job_steps.get(step) == "COMPLETED" for step in wanted), job_steps
    return job_steps


@pytest.mark.slurm
@pytest.mark.apptainer
def test_fastapi_celery_runs_unchanged_in_its_images_through_the_slurm_profile_with_apptainer(project):
    require_slurm()
    stack, ports, output = run_in_images(project, "apptainer", "--profile", "profiles/slurm", *TEST_RESOURCES,
                                         "runtime=10")
    check_stack_ran(project, stack, ports)
    check_images_ran(project, "apptainer")
    check_job_steps(output, project)


@pytest.mark.slurm
@pytest.mark.charliecloud
def test_fastapi_celery_runs_unchanged_in_its_images_through_the_slurm_profile_with_charliecloud(project):
    require_slurm()
    stack, ports, output = run_in_images(project, "charliecloud", "--profile", "profiles/slurm", *TEST_RESOURCES,
                                         "runtime=10", env={"PATH": NO_APPTAINER_PATH})
    check_stack_ran(project, stack, ports)
    check_images_ran(project, "charliecloud")
    check_job_steps(output, project)
