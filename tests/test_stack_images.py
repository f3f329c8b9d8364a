"""A Compose stack as a user brings it, each service in its own image, run from its import unchanged: locally
(``snakemake --cores 4 --sdm apptainer``, or Charliecloud's ``runtime: charliecloud``) and through the Slurm
profile, with Apptainer and with Charliecloud.

The stack is tests/stacks/jobs (Redis from ``redis:7`` with ``--save ""``; three workers running the app image's
own command, writing ``/work/item-NNNN.out`` on the named volume; a check replacing only the CMD, reading the
volume ``:ro``). Its images are the stack images tests/cluster/prepare.sh builds from Debian packages as Docker
Hub gives them (container/stacks/): ``redis`` has no python3, ``python-app`` has ENTRYPOINT python3, CMD app.py,
WORKDIR /code. They are put where the import says the config expects them (``images/redis-7.sif``, ...) with
their sidecars, as a user would after `apptainer build` or `ch-image pull` + `ch-convert`.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
from pathlib import Path

import pytest
from test_compose_stacks import free_port
from test_program_images import stack_image
from test_slurm import TEST_RESOURCES, steps, the_stack_job

from conftest import pids_of_run, run_script
from real_parts import require_apptainer, require_charliecloud, require_slurm
from workflow_helpers import ROOT, copy_project, snakemake

#: The stack's images: the config's name for each -> the stack image it is (container/stacks/NAME).
IMAGES = {"redis-7": "redis", "{run}-app": "python-app"}
NO_APPTAINER_PATH = os.pathsep.join(p for p in os.environ["PATH"].split(os.pathsep) if "apptainer" not in p)


@pytest.fixture
def project(tmp_path):
    workdir = copy_project(tmp_path / "project")
    yield workdir
    leftovers = pids_of_run(workdir, "Apptainer runtime parent", "squashfuse")
    for pid in leftovers:
        os.kill(pid, signal.SIGKILL)
    assert not leftovers, f"processes of the run left on the node: {leftovers}"


def import_jobs(project: Path, runtime: str, run: str, items: int = 30) -> str:
    """Copy tests/stacks/jobs into the project with a free port for Redis, import it for ``runtime`` (ITEMS from
    the environment, as Compose takes it), and put its images where the config expects them; the config's path."""
    shutil.copytree(ROOT / "tests" / "stacks" / "jobs", project / "stacks" / "jobs")
    compose = project / "stacks" / "jobs" / "compose.yaml"
    compose.write_text(compose.read_text().replace("6379", str(free_port())))
    extra = ["--runtime", "charliecloud"] if runtime == "charliecloud" else []
    done = run_script("import_compose.py", "stacks/jobs/compose.yaml", "--output", f"config/{run}.yaml", "--run", run,
                      *extra, cwd=project, env={"ITEMS": str(items)})
    assert done.returncode == 0 and "0 gap(s)" in done.stdout, done.stdout + done.stderr
    for name, source in IMAGES.items():
        place_image(project, runtime, source, name.format(run=run))
    return f"config/{run}.yaml"


def place_image(project: Path, runtime: str, source: str, name: str) -> Path:
    """Put the stack image ``source`` (container/stacks/SOURCE) where an imported config expects the image NAME
    (``images/NAME.sif`` for Apptainer, ``images/NAME/`` for Charliecloud) with its sidecar, as a user would after
    `apptainer build` or `ch-image pull` + `ch-convert`; skip (in CI: fail) when prepare.sh has not built it."""
    image = Path(stack_image(runtime, source))
    (project / "images").mkdir(exist_ok=True)
    target = project / "images" / (name + (".sif" if runtime == "apptainer" else ""))
    if runtime == "apptainer":
        shutil.copy(image, target)
        digest = Path(f"{image}.sha256").read_text().split()[0]
        (project / "images" / f"{target.name}.sha256").write_text(f"{digest}  {target.name}\n")
    else:
        shutil.copytree(image, target, symlinks=True)
        assert run_script("image_digest.py", target).returncode == 0
    return target


def check_jobs_ran(project: Path, run: str, runtime: str, items: int = 30) -> dict:
    """The check's verdict on the results in the volume, each program in its image, the images in provenance."""
    assert json.loads((project / f"results/{run}/result.json").read_text()) == {
        "schemaVersion": 1, "status": "success", "services": ["redis"], "check": "passed"}
    assert f"check: {items} jobs, each result in /work and correct" in (project / f"logs/run_check/{run}.log").read_text()
    provenance = json.loads((project / f"results/{run}/provenance.json").read_text())
    images = provenance["programImages"]
    assert set(images) == {"services.redis", "worker", "verify"}
    assert images["services.redis"]["image"].startswith("images/redis-7")
    assert images["worker"]["image"] == images["verify"]["image"]
    for component, facts in provenance["components"].items():
        assert facts["container"], component  # the redis gate probes in redis' image too
    assert provenance["containerRuntime"]["name"] == runtime
    worker_log = (project / f"logs/run_worker/{run}/worker-01.log").read_text()
    # no command in the config: the image's own ran (ENTRYPOINT python3 + CMD app.py, in its WORKDIR /code)
    assert "--command-json" not in worker_log and "worker-01: python3 app.py exited 0" in worker_log
    return provenance


@pytest.mark.apptainer
def test_the_stack_in_its_images_with_apptainer(project):
    config = import_jobs(project, "apptainer", "jobs")
    done = snakemake(project, "--cores", "4", "--sdm", "apptainer", "--configfile", config, env={"ITEMS": "30"})
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    check_jobs_ran(project, "jobs", "apptainer")
    redis_log = (project / "logs/serve_service/jobs/redis.log").read_text()
    assert "redis: in its image: apptainer exec" in redis_log and "images/redis-7.sif redis-server" in redis_log


@pytest.mark.charliecloud
def test_the_stack_in_its_images_with_charliecloud_and_no_apptainer(project):
    config = import_jobs(project, "charliecloud", "jobs-ch")
    done = snakemake(project, "--cores", "4", "--configfile", config, env={"PATH": NO_APPTAINER_PATH})
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    check_jobs_ran(project, "jobs-ch", "charliecloud")
    # the check's :ro mount of the volume is a read-only view (ch-run binds read-write only)
    assert "check: in its image: unshare --user --map-root-user" in (project / "logs/run_check/jobs-ch.log").read_text()


@pytest.mark.apptainer
def test_an_image_whose_digest_is_wrong_is_refused_before_anything_starts(project):
    config = import_jobs(project, "apptainer", "jobs")
    sidecar = project / "images" / "redis-7.sif.sha256"
    sidecar.write_text("0" * 64 + "  redis-7.sif\n")
    done = snakemake(project, "--cores", "4", "--sdm", "apptainer", "--configfile", config)
    output = done.stdout + done.stderr
    assert done.returncode != 0
    assert "allocstack: error [integrity]:" in output and "redis-7.sif" in output, output[-3000:]
    assert not (project / "logs/serve_service").exists()  # nothing started
    assert not (project / "results/jobs/services").exists()


@pytest.mark.slurm
@pytest.mark.apptainer
def test_the_stack_in_its_images_through_the_slurm_profile_with_apptainer(project):
    require_slurm()
    config = import_jobs(project, "apptainer", "jobs")
    started = time.monotonic()
    # the profile's `image` (allocstack's own components: none run in it here) as every cluster test gives it
    done = snakemake(project, "--profile", "profiles/slurm", *TEST_RESOURCES, "runtime=10", "--configfile", config,
                     "--config", f"image={require_apptainer()}", timeout=600)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    check_jobs_ran(project, "jobs", "apptainer")
    job = the_stack_job(output, project)
    wanted = {"redis", "redis-readiness", "worker-01", "worker-02", "worker-03", "check"}
    for _ in range(20):
        job_steps = steps(job)
        if wanted <= set(job_steps):
            break
        time.sleep(0.5)
    assert all(job_steps.get(step) == "COMPLETED" for step in wanted), job_steps
    print(f"jobs stack through the Slurm profile with Apptainer: {time.monotonic() - started:.1f} s")


@pytest.mark.slurm
@pytest.mark.charliecloud
def test_the_stack_in_its_images_through_the_slurm_profile_with_charliecloud(project):
    require_slurm()
    config = import_jobs(project, "charliecloud", "jobs-ch")
    done = snakemake(project, "--profile", "profiles/slurm", *TEST_RESOURCES, "runtime=10", "--configfile", config,
                     "--config", "runtime=charliecloud", f"image={require_charliecloud()}", timeout=600,
                     env={"PATH": NO_APPTAINER_PATH})
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    check_jobs_ran(project, "jobs-ch", "charliecloud")
    the_stack_job(output, project)
