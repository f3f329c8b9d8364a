"""Real public Compose stacks that we did not write, run from their Compose files (issues 24 and 25, "How it must be
shown"): each a broker (Redis), daemon workers (Celery) and a producer, imported as `docker compose up --scale
worker=N --exit-code-from tests` takes it, with an override file that holds only what a batch run on an HPC node
demands. The runs on the host run both stacks (:data:`STACKS`); in images each way runs one of them, crossed over
the runtimes and the launchers (:func:`stacks`, below); all through the same functions.

The stacks (tests/third_party/MANIFEST.yaml: what was copied, what is ours and why), each copied with the few
files its programs need into tests/third_party/NAME/, its licence kept as LICENSE:

- testdrivenio/fastapi-celery, docker-compose.yml at commit 191ff138701777838c363772253f73a276c16d68 (MIT): redis:7,
  a FastAPI app (uvicorn), `celery worker` (a daemon: it never ends by itself) and a Flower dashboard;
- testdrivenio/flask-celery, docker-compose.yml at commit 5c66be55b203d5a5f0522c5f535f8af121ee753c (MIT):
  redis:6-alpine, a Flask app (its development server, `image: web` beside `build: .`, a container_name), `celery
  worker` and Flower, which imports the app's code.

The producer is each upstream's own test suite (it queues a Celery task through Redis and waits for a worker's
result), run as the one-shot service `tests` of the override: the upstreams run it with `docker-compose exec web
python -m pytest`, and a batch job has nobody at a terminal to exec it.

On the host every program runs on this machine, no image: redis-server from Debian (`make test` installs it:
tests/cluster/prepare.sh), the stack's Python packages in a venv of its own, made here from the upstream's
requirements.txt and our constraints.txt (the stacks pin old versions that allocstack's own requirements.txt cannot
hold beside its own).

And the same files, unchanged, in per-service images: the import names them (fastapi-celery: ``images/redis-7.sif``
for ``image: redis:7``, ``images/fastapi-celery-project.sif`` for ``build: ./project``; flask-celery:
``images/redis-6-alpine.sif``, ``images/web.sif`` for the web app's ``image: web`` + ``build: .`` and
``images/flask-celery.sif`` for the other ``build: .``; directories for Charliecloud), and they are put there as a
user would after building them: the stack images tests/cluster/prepare.sh builds from Debian packages
(container/stacks/: ``redis``; ``fastapi-celery`` and ``flask-celery``, each app's image as its Dockerfile makes it,
bookworm's python3 and the same pinned packages in /opt/venv, WORKDIR /usr/src/app). Run with ``snakemake --cores 4
--sdm apptainer``, with Charliecloud (the import's ``--runtime charliecloud``) and through the Slurm profile."""

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
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from test_compose_stacks import free_port
from test_serve_mode import submit, up_job, wait_for_file
from test_slurm import TEST_RESOURCES, recorded_steps, submitted_jobs, the_stack_job
from test_stack_images import NO_APPTAINER_PATH, place_image

from conftest import ROOT, pids_of_run, run_script
from real_parts import require_apptainer, require_slurm, unavailable
from workflow_helpers import ask_json, snakemake, tunnel_target


@dataclass(frozen=True)
class PublicStack:
    """A stack of tests/third_party/ and what a run of it must show. Both are Flask or FastAPI + Redis + Celery
    stacks of the same author: the defaults are what they have in common."""

    #: Its folder under tests/third_party/ and the run's name.
    name: str
    #: The upstream's requirements file, in its folder.
    requirements: str
    #: Where the import writes its config (the docs' commands name it: test_cluster_commands finds it here).
    config: str
    #: The ports its Compose files fix: each replaced by a free one, as the node is shared.
    ports: tuple[str, ...]
    workers: int
    #: The producer's test module, as `pytest -v` names its tests.
    producer_module: str
    #: The images as the import names them (images/NAME.sif, images/NAME/) -> the stack image each one is
    #: (container/stacks/NAME.def).
    images: tuple[tuple[str, str], ...]
    #: Its services as result.json names them (the producer, main, apart).
    services: tuple[str, ...] = ("dashboard", "redis", "web")
    #: The tests of the producer's module it must pass.
    producer_tests: tuple[str, ...] = ("test_home", "test_task", "test_mock_task", "test_task_status")
    #: The workers' own log (celery --logfile), in the stack's folder.
    worker_log: str = "project/logs/celery.log"

    @property
    def flags(self) -> tuple[str, ...]:
        """What `docker compose up` takes, as the import takes it."""
        return ("--scale", f"worker={self.workers}", "--exit-code-from", "tests")

    @property
    def summary(self) -> str:
        """The import's summary line (the services in the Compose file's order)."""
        return f"services redis, web, dashboard, tests; {self.workers} workers; 0 gap(s)"

    @property
    def folder(self) -> Path:
        return ROOT / "tests" / "third_party" / self.name


FASTAPI_CELERY = PublicStack(
    name="fastapi-celery", requirements="project/requirements.txt", config="config/fastapi-celery.yaml",
    ports=("8000", "6379", "5555"), workers=4,
    producer_module="tests/test_tasks.py", images=(("fastapi-celery-project", "fastapi-celery"), ("redis-7", "redis")))
# `build: .` with `image: web` (the web service) is tagged web, the others' builds flask-celery: one recipe.
FLASK_CELERY = PublicStack(
    name="flask-celery", requirements="requirements.txt", config="config/flask-celery.yaml",
    ports=("5000", "6379", "5555"), workers=2,
    producer_module="project/tests/test_tasks.py",
    images=(("flask-celery", "flask-celery"), ("web", "flask-celery"), ("redis-6-alpine", "redis")))
STACKS = (FASTAPI_CELERY, FLASK_CELERY)


def stacks(*chosen: PublicStack) -> pytest.MarkDecorator:
    """The test runs once for each of ``chosen``."""
    return pytest.mark.parametrize("stack", chosen, ids=[stack.name for stack in chosen])


#: The checks that read no run, and the run with the programs on the host (the issue's "locally"): both stacks.
each_stack = stacks(*STACKS)
# In images, each way of running them runs one stack, the two crossed over the runtimes and the launchers: each
# stack runs once in each runtime and once with each launcher, each runtime once with each launcher (Apptainer:
# flask-celery by `snakemake --cores 4`, fastapi-celery through the Slurm profile, and served; Charliecloud: the
# other way round). What differs between the stacks is the import's (image names, build contexts, a container_name,
# the binds); between the ways, the launch: a fault of one pair shows in the other pairs that share its stack and
# runtime or runtime and launcher. Both stacks in all four ways were four more runs of 30-45 CPU-seconds each, the
# suite's largest file (issue 29).
APPTAINER_LOCALLY, CHARLIECLOUD_LOCALLY = stacks(FLASK_CELERY), stacks(FASTAPI_CELERY)
APPTAINER_UNDER_SLURM, CHARLIECLOUD_UNDER_SLURM = stacks(FASTAPI_CELERY), stacks(FLASK_CELERY)


@pytest.fixture(scope="session")
def stack_python(tmp_path_factory) -> Callable[[PublicStack], Path]:
    """For a stack, a venv with its own Python packages (celery, its web framework, flower, pytest as it pins them),
    made once per session; its bin/ goes first on PATH, as the stack's image would have them."""
    made: dict[str, Path] = {}

    def venv_of(stack: PublicStack) -> Path:
        if stack.name not in made:
            venv = tmp_path_factory.mktemp(f"{stack.name}-venv")
            subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
            install = subprocess.run(
                [str(venv / "bin" / "pip"), "install", "--quiet", "--disable-pip-version-check",
                 "-r", str(stack.folder / stack.requirements), "-c", str(stack.folder / "constraints.txt")],
                capture_output=True, text=True, timeout=600, check=False)
            assert install.returncode == 0, f"installing {stack.name}'s Python packages failed:\n{install.stderr[-3000:]}"
            made[stack.name] = venv / "bin"
        return made[stack.name]

    return venv_of


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


def place_stack(project: Path, stack: PublicStack) -> tuple[Path, dict[str, int]]:
    """Copy the stack into the project as a user would clone it, its fixed ports moved to free ones."""
    folder = project / "stacks" / stack.name
    shutil.copytree(stack.folder, folder)
    ports = {port: free_port() for port in stack.ports}
    for path in [folder / "docker-compose.yml", *sorted(folder.glob("compose.*.yaml"))]:
        text = path.read_text()
        for port, free in ports.items():
            text = text.replace(port, str(free))
        path.write_text(text)
    return folder, ports


def import_stack(project: Path, stack: PublicStack, *extra: str) -> tuple[Path, dict[str, int], float]:
    """Place the stack and import it as `docker compose up` takes it (its :attr:`PublicStack.flags`), with ``extra``
    import flags (``--runtime charliecloud``); the stack's folder, its ports and the import's seconds."""
    folder, ports = place_stack(project, stack)
    started = time.monotonic()
    imported = run_script("import_compose.py", f"stacks/{stack.name}/docker-compose.yml",
                          f"stacks/{stack.name}/compose.hpc.yaml", *stack.flags, *extra, "--output", stack.config,
                          cwd=project)
    import_seconds = time.monotonic() - started
    assert imported.returncode == 0, imported.stdout + imported.stderr
    assert stack.summary in imported.stdout, imported.stdout
    config = (project / stack.config).read_text()
    assert "main: tests" in config and f"workers: {stack.workers}" in config
    return folder, ports, import_seconds


def new_lines(stack: PublicStack, folder: Path, name: str) -> list[str]:
    """The lines of the stack's file ``name`` written by the run: after those the upstream's copy holds (the
    upstream flask-celery ships its worker log with 20 tasks of its own in it)."""
    before = (stack.folder / name).read_text().splitlines() if (stack.folder / name).exists() else []
    after = (folder / name).read_text().splitlines()
    assert after[:len(before)] == before, f"{name}: the upstream's lines were changed"
    return after[len(before):]


def allocstack_lines(project: Path) -> list[str]:
    """Every `allocstack:` line of the run's logs (Slurm's job logs included), for a failure's message: with the
    profile's retries an attempt's failure is seen only there."""
    found = []
    for log in sorted((project / "logs").rglob("*.log")):
        found += [f"{log.relative_to(project)}: {line}" for line in log.read_text(errors="replace").splitlines()
                  if "allocstack:" in line]
    return found


def check_stack_ran(project: Path, stack: PublicStack, folder: Path, ports: dict[str, int]) -> None:
    """The producer's own output, the workers' log, the daemons stopped once it ended, nothing left listening."""
    run = stack.name
    marker = json.loads((project / f"results/{run}/result.json").read_text())
    assert marker["status"] == "success" and marker["services"] == list(stack.services)
    # The producer's own output: the upstream's tests, among them a task queued through Redis and answered by a
    # Celery worker (PENDING, then SUCCESS with result True).
    produced = (project / f"logs/run_main/{run}.log").read_text()
    for test in stack.producer_tests:
        assert f"{stack.producer_module}::{test} PASSED" in produced, produced[-3000:]
    assert f" {len(stack.producer_tests)} passed" in produced
    # The workers' own log (celery's --logfile, in the bind-mounted project as in Docker): the task of each attempt.
    # One attempt, unless the upstream's own race failed one: test_task_status asserts PENDING on its first GET
    # after queueing a task that sleeps 0 s, so an idle worker that is quicker than the test client fails it (seen in
    # CI under load, ci-60 and ci-62: the task succeeded 20 ms after it was queued, the producer failed 3 s later);
    # then the profile's retries run the stack again, and the last attempt's producer (above) must have passed.
    written = new_lines(stack, folder, stack.worker_log)
    succeeded = [line for line in written if "Task create_task[" in line and "succeeded in" in line]
    assert 1 <= len(succeeded) <= 4 and all(line.endswith(": True") for line in succeeded), \
        "\n".join(written)[-2000:] + "\n--- allocstack lines of the run's logs (an attempt before the last?):\n" + \
        "\n".join(allocstack_lines(project))[-2000:]
    # The daemons were stopped once the producer ended (celery's warm shutdown on SIGTERM: exit 0), and nothing
    # of the stack is left listening.
    records = [json.loads((project / f"results/{run}/workers/worker-{i:02d}.json").read_text())
               for i in range(1, stack.workers + 1)]
    assert [(r["status"], r["exitCode"]) for r in records] == [("stopped", 0)] * stack.workers
    events = [json.loads(line) for line in (project / f"results/{run}/events.jsonl").read_text().splitlines()]
    main_end = next(e["t"] for e in events if e["event"] == "main-end")
    assert all(e["t"] >= main_end for e in events if e["event"] == "worker-end")
    assert not any(listening(port) for port in ports.values()), ports
    # With the override's binds nothing of the stack listened beyond loopback (allocstack looked at each).
    assert not [e for e in events if e["event"] == "listening-exposed"], "listening beyond loopback"


@each_stack
def test_public_stack_runs_from_its_compose_file_the_producer_ends_it_and_its_output_is_checked(
        project, stack_python, stack):
    if shutil.which("redis-server") is None:
        unavailable("redis-server is not on PATH (as root: apt-get install redis-server; tests/cluster/prepare.sh "
                    "installs it)")
    folder, ports, import_seconds = import_stack(project, stack)
    try:
        path = f"{stack_python(stack)}{os.pathsep}{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
        started = time.monotonic()
        done = run_stack(project, stack, "--cores", "4", timeout=400, env={"PATH": path})
        run_seconds = time.monotonic() - started
        assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
        print(f"{stack.name}: import {import_seconds:.2f} s, snakemake --cores 4 {run_seconds:.1f} s")
        check_stack_ran(project, stack, folder, ports)
    finally:
        left = kill_processes_in(project)
    # Nothing of the stack is left running (its programs' own children included).
    assert not left, f"processes of the stack left running: {left}"


#: One pinned package: NAME==VERSION.
PIN = re.compile(r"[A-Za-z0-9_.-]+==[A-Za-z0-9_.+!-]+")


def pins(text: str) -> set[str]:
    """The NAME==VERSION lines of a requirements file."""
    return {line.strip() for line in text.splitlines() if "==" in line and not line.lstrip().startswith("#")}


@each_stack
def test_every_file_the_manifest_copied_is_in_git(stack):
    """What MANIFEST.yaml says was copied is in the repository, not only in the tree it was copied into: the project's
    .gitignore leaves out logs/, and flask-celery's worker log (project/logs/celery.log, which its celery worker opens
    for appending) once existed only in the developer's tree; every run from a clone then failed at the workers'
    start (FileNotFoundError). A folder counts when git tracks every file under it."""
    manifest = yaml.safe_load((ROOT / "tests/third_party/MANIFEST.yaml").read_text(encoding="utf-8"))["stacks"]
    entry = next(entry for entry in manifest if entry["name"] == stack.name)
    listed = subprocess.run(["git", "ls-files", "-z", "--", "."], cwd=stack.folder, capture_output=True, check=False)
    if listed.returncode != 0:
        pytest.skip(f"not a git checkout: {listed.stderr.decode(errors='replace').strip()}")
    tracked = set(listed.stdout.decode().split("\0")) - {""}
    for copied in entry["copied"]:
        on_disk = [path.relative_to(stack.folder).as_posix() for path in (stack.folder / copied).rglob("*")
                   if path.is_file() and "__pycache__" not in path.parts] if copied.endswith("/") else [copied]
        assert on_disk, f"{stack.name}: {copied} is empty"
        untracked = [path for path in on_disk if path not in tracked]
        assert not untracked, f"{stack.name}: copied but not in git (git add -f if .gitignore leaves it out): {untracked}"


@each_stack
def test_the_app_image_installs_the_packages_the_stack_pins(stack):
    """container/stacks/NAME.def installs exactly what the stack's constraints.txt pins, which holds every pin of the
    upstream's requirements.txt: the app's image and the venv of the test above run the same packages."""
    definition = (ROOT / "container" / "stacks" / f"{stack.name}.def").read_text()
    in_image = {pin for pin in (line.strip("' \\") for line in pins(definition)) if PIN.fullmatch(pin)}
    constraints = pins((stack.folder / "constraints.txt").read_text())
    assert in_image == constraints, in_image ^ constraints
    assert pins((stack.folder / stack.requirements).read_text()) <= constraints


def run_in_images(project: Path, stack: PublicStack, runtime: str, *args: str, env: dict[str, str] | None = None,
                  ) -> tuple[Path, dict[str, int], str]:
    """Import the stack for ``runtime``, put its images where the config expects them, run snakemake with ``args``;
    the stack's folder, its ports and what snakemake printed. Nothing of the run is left running."""
    folder, ports, import_seconds = import_stack(project, stack,
                                                 *(["--runtime", runtime] if runtime != "apptainer" else []))
    for name, source in stack.images:
        place_image(project, runtime, source, name)
    try:
        started = time.monotonic()
        done = run_stack(project, stack, *args, timeout=900, env=env)  # 3 attempts (the profile allows 4)
        run_seconds = time.monotonic() - started
        output = done.stdout + done.stderr
        assert done.returncode == 0, output[-4000:]
        print(f"{stack.name} in its images ({runtime}, {' '.join(args)}): import {import_seconds:.2f} s, "
              f"run {run_seconds:.1f} s")
    finally:
        left = pids_of_run(project, "Apptainer runtime parent", "squashfuse")
        for pid in left:
            os.kill(pid, signal.SIGKILL)
        left = [*map(str, left), *kill_processes_in(project)]
    assert not left, f"processes of the stack left running: {left}"
    return folder, ports, output


def upstream_race(project: Path, stack: PublicStack) -> bool:
    """Whether the run failed by the upstream's own race alone: flask-celery's test_task_status asserts PENDING right
    after it queued a task that sleeps ``0 * 10`` s, which a worker may have ended by then: SUCCESS, or (the app reads
    the status, then the result) PENDING with the result already True (ci-74). Its stack as it is: not ours to change;
    the Slurm profile's retries run it again, and a local run is run again by hand."""
    log = project / f"logs/run_main/{stack.name}.log"
    text = log.read_text(errors="replace") if log.exists() else ""
    ended = "'SUCCESS'" in text or "{'task_result': True} != {'task_result': None}" in text
    return "test_task_status FAILED" in text and ended and " 1 failed, " in text


def run_stack(project: Path, stack: PublicStack, *args: str, timeout: float, env: dict[str, str] | None = None):
    """snakemake with ``args`` and the stack's config; once more where the first run failed by the upstream's own race
    alone (:func:`upstream_race`; ci-74: the programs on the host lost it too), as the Slurm profile's retries do."""
    done = snakemake(project, *args, "--configfile", stack.config, timeout=timeout, env=env)
    if done.returncode != 0 and upstream_race(project, stack):
        print(f"{stack.name}: the upstream's own test_task_status raced (its task ended before its first GET): "
              "run again, as the Slurm profile's retries do")
        done = snakemake(project, *args, "--configfile", stack.config, timeout=timeout, env=env)
    return done


def earlier_attempts_failed_by_main_alone(output: str, project: Path) -> list[str]:
    """The stack's sbatch jobs before its last (the profile's retries), each checked to have failed in the main
    program (the upstream's own test suite, ``tests``) and nowhere else: a failure of ours is never retried away."""
    jobs = submitted_jobs(output)
    for job in jobs[:-1]:
        log = "".join(path.read_text(errors="replace") for path in project.glob(f"logs/slurm/*/{job}.log"))
        failed = re.findall(r'CalledProcessError in file "[^"]*/workflow/rules/(\w+)\.smk"', log)
        assert failed == ["main"] and "--component=tests " in log, (job, failed, log[-3000:])
    return jobs


def check_images_ran(project: Path, stack: PublicStack, runtime: str) -> None:
    """Each program in its own image, as provenance records it: Redis in the redis image, every other one in an
    image the import named for the app (each of them used); Redis' log says so too."""
    provenance = json.loads((project / f"results/{stack.name}/provenance.json").read_text())
    assert provenance["containerRuntime"]["name"] == runtime
    images = {component: Path(facts["image"]).name.removesuffix(".sif")
              for component, facts in provenance["programImages"].items()}
    broker = next(name for name, source in stack.images if source == "redis")
    assert images.pop("services.redis") == broker, provenance["programImages"]
    assert set(images.values()) == {name for name, source in stack.images if source != "redis"}, images
    redis_log = (project / f"logs/serve_service/{stack.name}/redis.log").read_text()
    assert "redis: in its image:" in redis_log and f"images/{broker}" in redis_log, redis_log[-2000:]


@pytest.mark.apptainer
@APPTAINER_LOCALLY
def test_public_stack_runs_unchanged_in_its_images_with_apptainer(project, stack):
    folder, ports, _ = run_in_images(project, stack, "apptainer", "--cores", "4", "--sdm", "apptainer")
    check_stack_ran(project, stack, folder, ports)
    check_images_ran(project, stack, "apptainer")


@pytest.mark.charliecloud
@CHARLIECLOUD_LOCALLY
def test_public_stack_runs_unchanged_in_its_images_with_charliecloud_and_no_apptainer(project, stack):
    folder, ports, _ = run_in_images(project, stack, "charliecloud", "--cores", "4", env={"PATH": NO_APPTAINER_PATH})
    check_stack_ran(project, stack, folder, ports)
    check_images_ran(project, stack, "charliecloud")


def check_job_steps(output: str, project: Path, stack: PublicStack) -> dict[str, str]:
    """The whole stack was one sbatch job, each of its programs a job step that completed; its steps. An attempt
    before it may have failed by the upstream's own test race alone (:func:`upstream_race`): the profile retried."""
    jobs = earlier_attempts_failed_by_main_alone(output, project)
    job = jobs[-1] if len(jobs) > 1 else the_stack_job(output, project)
    wanted = {*stack.services, *(f"{service}-readiness" for service in stack.services), "tests",
              *(f"worker-{i:02d}" for i in range(1, stack.workers + 1))}
    job_steps = recorded_steps(job, wanted)
    assert all(job_steps.get(step) == "COMPLETED" for step in wanted), job_steps
    return job_steps


@pytest.mark.slurm
@pytest.mark.apptainer
@APPTAINER_UNDER_SLURM
def test_public_stack_runs_unchanged_in_its_images_through_the_slurm_profile_with_apptainer(project, stack):
    """As the docs show it: ``snakemake --profile profiles/slurm --configfile config/NAME.yaml`` (the test
    cluster's resources added)."""
    require_slurm()
    folder, ports, output = run_in_images(project, stack, "apptainer", "--profile", "profiles/slurm",
                                          *TEST_RESOURCES, "runtime=10")
    check_stack_ran(project, stack, folder, ports)
    check_images_ran(project, stack, "apptainer")
    check_job_steps(output, project, stack)


@pytest.mark.slurm
@pytest.mark.charliecloud
@CHARLIECLOUD_UNDER_SLURM
def test_public_stack_runs_unchanged_in_its_images_through_the_slurm_profile_with_charliecloud(project, stack):
    require_slurm()
    folder, ports, output = run_in_images(project, stack, "charliecloud", "--profile", "profiles/slurm",
                                          *TEST_RESOURCES, "runtime=10", env={"PATH": NO_APPTAINER_PATH})
    check_stack_ran(project, stack, folder, ports)
    check_images_ran(project, stack, "charliecloud")
    check_job_steps(output, project, stack)


# -- served as it is: `docker compose up`, no producer (config mode: serve) -------------------------------------


def images_in_logs(project: Path, run: str) -> dict[str, str]:
    """Each service -> the image its log says it ran in (``NAME: in its image: apptainer exec ... images/X.sif``)."""
    found = {}
    for log in (project / f"logs/serve_service/{run}").glob("*.log"):
        said = re.search(rf"^{re.escape(log.stem)}: in its image: .* \S*/images/([^/\s]+)\.sif ", log.read_text(),
                         re.MULTILINE)
        if said:
            found[log.stem] = said.group(1)
    return found


def task_result(target: str, task: dict, timeout: float = 180) -> dict:
    """Queue ``task`` through the API at ``target`` (a tunnel line's: its socket, or HOST:PORT) (POST /tasks, as the
    upstream's test_task_status does) and poll GET /tasks/ID until a Celery worker finished it (SUCCESS or
    FAILURE); its last status."""
    task_id = ask_json(target, "/tasks", task)["task_id"]
    deadline = time.monotonic() + timeout
    while True:
        status = ask_json(target, f"/tasks/{task_id}")
        if status["task_status"] in ("SUCCESS", "FAILURE") or time.monotonic() > deadline:
            return status
        time.sleep(0.5)


@pytest.mark.slurm
@pytest.mark.apptainer
def test_fastapi_celery_served_under_the_slurm_profile_runs_a_task_through_its_tunnel_target_and_scancel_ends_it(
        project):
    """testdrivenio/fastapi-celery as `docker compose up` runs it (Redis, the API, a Celery worker, Flower; no
    producer, so the import gives mode: serve) in its images through the Slurm profile, its API scaled to two
    replicas (`--scale web=2`: each uvicorn on the same port in a network of its own, reached in turn through the
    one published port): UP, a task POSTed to the API at the printed tunnel line's target on the node is run by the
    Celery worker through Redis, and both replicas answered the task's polls (each reaching Redis by its name from
    its own network); then `scancel` ends it as a success; nothing is left running."""
    require_slurm()
    stack, config = FASTAPI_CELERY, "config/fastapi-celery-serve.yaml"
    folder, ports = place_stack(project, stack)
    imported = run_script("import_compose.py", f"stacks/{stack.name}/docker-compose.yml",
                          f"stacks/{stack.name}/compose.serve.yaml", "--scale", "web=2", "--output", config,
                          cwd=project)
    assert imported.returncode == 0, imported.stdout + imported.stderr
    assert "services redis, web, worker-service, dashboard; no (mode: serve) workers; 0 gap(s)" in imported.stdout
    assert (f"web: 2 replicas (--scale web=2): each its own job step on the first node, each on port {ports['8000']} "
            "in a network of its own") in imported.stdout
    assert "\nmode: serve\n" in (project / config).read_text()
    for name, source in stack.images:
        place_image(project, "apptainer", source, name)
    started = time.monotonic()
    run = submit(project, config, 10, "--config", f"image={require_apptainer()}")  # allocstack's own steps' image
    try:
        up = wait_for_file(project / f"results/{stack.name}/up.json", run)
        up_after = time.monotonic() - started
        assert sorted(up["services"]) == ["dashboard", "redis", "web"], up  # the worker publishes nothing
        target, _ = tunnel_target(up["services"]["web"]["tunnel"])  # its owner-only socket (the private network)
        assert target.startswith("/") and target.endswith("/web.sock"), target
        assert up["services"]["web"]["url"].endswith(f":{ports['8000']}"), up
        queued = time.monotonic()
        status = task_result(target, {"type": 1})
        task_seconds = time.monotonic() - queued
        assert (status["task_status"], status["task_result"]) == ("SUCCESS", True), status
        job = up_job(project)
        cancelled = time.monotonic()
        subprocess.run(["scancel", job], check=True, timeout=30)
        marker = wait_for_file(project / f"results/{stack.name}/result.json", run, timeout=60)
        marker_after = time.monotonic() - cancelled
        output, _ = run.communicate(timeout=300)
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
        left = pids_of_run(project, "Apptainer runtime parent", "squashfuse")
        for pid in left:
            os.kill(pid, signal.SIGKILL)
        left = [*map(str, left), *kill_processes_in(project)]
    assert not left, f"processes of the stack left running: {left}"
    assert marker["status"] == "success" and marker["endedBy"] == "scancel", marker
    assert re.fullmatch(r"ended by scancel after \d+ s up", marker["ended"]), marker
    assert run.returncode == 0, output[-3000:]
    # The task went the real way: the Celery worker's own log has it, run once, its result True.
    written = [line for line in new_lines(stack, folder, stack.worker_log)
               if f"Task create_task[{status['task_id']}] succeeded in" in line]
    assert len(written) == 1 and written[0].endswith(": True"), written
    # Both replicas of the API answered (uvicorn's access lines in each one's log): the front takes them in turn.
    for replica in ("web", "web-replica-2"):
        answered = (project / f"logs/serve_service/{stack.name}/{replica}.log").read_text()
        assert re.search(r'"(POST|GET) /tasks\S* HTTP/1.1" 20[01]', answered), f"{replica} answered nothing"
    # Each program in its image, as its log says (a run ended by scancel collects no provenance).
    assert images_in_logs(project, stack.name) == {"redis": "redis-7", "web": "fastapi-celery-project",
                                                   "web-replica-2": "fastapi-celery-project",
                                                   "worker-service": "fastapi-celery-project",
                                                   "dashboard": "fastapi-celery-project"}
    assert not any(listening(port) for port in ports.values()), ports
    print(f"fastapi-celery served under Slurm: UP {up_after:.1f} s after the command started, the task's result "
          f"{task_seconds:.1f} s after it was POSTed; the marker {marker_after:.2f} s after scancel")
