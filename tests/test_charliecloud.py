"""Every component inside a real Charliecloud image (ch-run, tests/cluster/charliecloud.sh).

The image is the Apptainer test image's own root filesystem, unpacked (a directory image), and
that directory packed into a SquashFS file: the same Python and files under both runtimes and
both formats. Runs with ``--config runtime=charliecloud image=DIR`` (or ``image=FILE.sqfs``) and
no Snakemake deployment method, and with no apptainer on PATH.
"""

from __future__ import annotations

import json
import os
import pwd
import re
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest
from container_helpers import assert_killed_launcher_leaves_nothing, assert_sigterm_drains, drain_probe
from test_compose_stacks import STACK, check_stack_ran, import_test_stack, place_images
from test_containers import make_image
from test_faults import component_pids, journaled, slow_run, wait_for
from test_slurm import TEST_RESOURCES, assert_a_completed_step_per_component, the_stack_job

from conftest import SCRIPTS, local_user, make_tasks, pids_mentioning, run_script, write_json
from real_parts import require_charliecloud, require_charliecloud_squashfs, require_slurm
from workflow_helpers import (
    SNAKEMAKE,
    SYSTEM_PYTHON,
    project_for_another_user,
    snakemake,
    snakemake_as,
    user_environment,
)

pytestmark = pytest.mark.charliecloud
# Where the venv's snakemake and the system's tools are, without the Apptainer toolbox.
NO_APPTAINER_PATH = os.pathsep.join(p for p in os.environ["PATH"].split(os.pathsep) if "apptainer" not in p)
OTHER_USER = "allocstack-ch"


@pytest.fixture
def image():
    return require_charliecloud()


@pytest.fixture(params=["directory", "squashfs"])
def any_image(request):
    """Each format ch-run takes: the directory image, and the same tree as a SquashFS file (which ch-run mounts)."""
    return require_charliecloud() if request.param == "directory" else require_charliecloud_squashfs()


def charliecloud_run(*extra: str, image: str) -> list[str]:
    return [*extra, "--config", "runtime=charliecloud", f"image={image}"]


def assert_ran_in_the_image(project: Path, run: str, image: str) -> dict:
    assert json.loads((project / f"results/{run}/result.json").read_text())["status"] == "success"
    provenance = json.loads((project / f"results/{run}/provenance.json").read_text())
    assert set(provenance["components"]) >= {"coordinator", "readiness", "worker-01", "worker-02"}
    for name, component in provenance["components"].items():
        # seen from inside: the image's interpreter and OS, not the host venv running Snakemake
        assert component["container"] == image, name
        assert component["python"] == "/usr/bin/python3", name
        assert component["osRelease"].startswith("Debian GNU/Linux 12"), name
    assert provenance["containerRuntime"]["name"] == "charliecloud"
    assert provenance["containerRuntime"]["version"].startswith("0.")  # `ch-run --version`: "0.31"
    assert provenance["imageSha256"] == Path(image + ".sha256").read_text().split()[0]
    return provenance


def test_local_baseline_in_a_charliecloud_image_without_apptainer(project, any_image):
    """The end of every run is SIGTERM to the coordinator: with a SquashFS image it drains and writes its end record."""
    image = any_image
    started = time.monotonic()
    done = snakemake(project, *charliecloud_run("--cores", "4", image=image), env={"PATH": NO_APPTAINER_PATH})
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    elapsed = time.monotonic() - started
    assert_ran_in_the_image(project, "baseline", image)
    log = (project / "logs/serve_coordinator/baseline.log").read_text()
    # in the stack's private network (the default): ch-run entered into it (nsenter, before the runtime)
    assert re.search(r"launch: coordinator: nsenter --target=\d+ (--user --preserve-credentials )?--net -- "
                     r"ch-run '--unset-env=\*'", log), log[-2000:]
    assert "coordinator: stopped (signal:SIGTERM)" in log  # drained to its last line, the image still there
    assert json.loads((project / "results/baseline/coordinator.json").read_text())["status"] == "completed"
    assert not list((project / "tmp").glob("allocstack-*/baseline.*"))  # scratch and mount-point trees removed
    assert not pids_mentioning(str(project))
    print(f"local run with ch-run: {elapsed:.1f} s")


def launch_argv(tmp_path: Path, image: str, script: Path, *args: str, component: str = "probe",
                runtime_args: tuple[str, ...] = (), options: tuple[str, ...] = ()) -> list[str]:
    return [sys.executable, str(SCRIPTS / "launch.py"), f"--component={component}", f"--run={component}",
            f"--scratch-root={tmp_path / 'scratch'}", f"--image={image}", "--runtime=charliecloud",
            *(f"--runtime-arg={arg}" for arg in runtime_args), f"--bind={tmp_path / 'bound'}", *options, "--",
            str(script), *args]


def launch(tmp_path: Path, image: str, script: Path, *args: str, component: str = "probe",
           env: dict | None = None, runtime_args: tuple[str, ...] = ()) -> subprocess.Popen:
    return subprocess.Popen(
        launch_argv(tmp_path, image, script, *args, component=component, runtime_args=runtime_args),
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )


def write_probe(tmp_path: Path, code: str) -> Path:
    probe = tmp_path / "probe" / "probe.py"
    probe.parent.mkdir(exist_ok=True)
    probe.write_text(code)
    return probe


def test_only_the_run_paths_and_allocstacks_variables_are_inside(tmp_path, any_image):
    """A SquashFS image's own /ch/environment comes in with charliecloud.args ["--set-env"] (ch-run reads it inside)."""
    image = any_image
    (tmp_path / "host-only.txt").write_text("secret")
    probe = write_probe(tmp_path, (
        "import json, os, sys\n"
        f"print(json.dumps({{'hostOnly': os.path.exists({str(tmp_path / 'host-only.txt')!r}),\n"
        f"  'venv': os.path.exists({sys.prefix!r}),\n"
        f"  'bound': os.path.isdir({str(tmp_path / 'bound')!r}),\n"
        "  'scratch': os.path.isdir(os.environ['ALLOCSTACK_SCRATCH']),\n"
        "  'tmp': sorted(os.listdir('/tmp')), 'cwd': os.getcwd(),\n"
        "  'env': dict(os.environ), 'python': sys.executable}))\n"
    ))
    host_env = {**os.environ, "ALLOCSTACK_TEST_SECRET": "must-not-pass", "http_proxy": "http://10.0.0.1:3128",
                "PYTHONPATH": "/nowhere", "CUDA_VISIBLE_DEVICES": "0,1"}
    host_env.pop("USER", None)  # ch-run refuses to start without $USER: launch.py supplies it
    proc = launch(tmp_path, image, probe, env=host_env, runtime_args=() if os.path.isdir(image) else ("--set-env",))
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    seen = json.loads(out.strip().splitlines()[-1])
    assert seen["hostOnly"] is False and seen["venv"] is False
    assert seen["bound"] is True and seen["scratch"] is True
    assert seen["python"] == "/usr/bin/python3" and seen["cwd"] == str(tmp_path)
    # /tmp is private: at most the way to the run's own paths, nothing else of the host's /tmp
    assert seen["tmp"] == ([tmp_path.parts[2]] if tmp_path.parts[1] == "tmp" else [])
    expected = {"PATH", "PYTHONNOUSERSITE", "LC_ALL",  # base PATH + the image's ch/environment
                "PYTHONDONTWRITEBYTECODE", "USER", "CUDA_VISIBLE_DEVICES", "ALLOCSTACK_LAUNCHER_PID",
                "ALLOCSTACK_SCRATCH", "ALLOCSTACK_CONTAINER", "CH_RUNNING"}
    assert set(seen["env"]) == expected, set(seen["env"]) ^ expected
    assert seen["env"]["USER"] == pwd.getpwuid(os.getuid()).pw_name
    assert seen["env"]["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert not list((tmp_path / "scratch").glob("allocstack-*/probe.*/.mounts-*"))  # the mount-point tree is gone


def test_sigterm_reaches_the_component_through_ch_run_and_nothing_is_left(tmp_path, any_image):
    """With a SquashFS image the signal goes to ch-run's child alone: the image stays mounted while it drains."""
    marker = tmp_path / "bound" / "drained"
    probe = write_probe(tmp_path, drain_probe(marker))
    assert_sigterm_drains(launch(tmp_path, any_image, probe), marker, str(probe))


@pytest.mark.slurm
def test_sigterm_reaches_the_component_in_a_job_step(tmp_path, any_image):
    """In a job step ``scancel --signal`` would reach ch-run too: with a SquashFS image launch.py signals ch-run's
    child among the step's processes instead, and the component drains with its image still there."""
    require_slurm()
    marker = tmp_path / "bound" / "drained"
    probe = write_probe(tmp_path, drain_probe(marker))
    driver = ("import signal, subprocess, sys\n"  # in the allocation: start the launcher, then SIGTERM it once ready
              "proc = subprocess.Popen(sys.argv[1:], stdout=subprocess.PIPE, text=True)\n"
              "print(proc.stdout.readline().strip(), flush=True)\n"
              "proc.send_signal(signal.SIGTERM)\n"
              "sys.exit(proc.wait(timeout=30))\n")
    steps = ("--job-steps", *(f"--step-arg={arg}" for arg in ("--overlap", "--mem=0", "--exact")))
    done = subprocess.run(
        ["timeout", "-k", "10", "120", "salloc", "--account=allocstack", "--partition=debug", "--nodes=1",
         "--cpus-per-task=1", "--mem=300", "--time=2", sys.executable, "-c", driver,
         *launch_argv(tmp_path, any_image, probe, options=steps)],
        cwd=tmp_path, capture_output=True, text=True, timeout=150, check=False)
    assert done.returncode == 0 and done.stdout.strip() == "ready", done.stdout + done.stderr[-3000:]
    assert "launch: probe: srun --job-name=probe" in done.stderr
    assert marker.read_text() == "drained"
    time.sleep(0.2)
    assert not pids_mentioning(str(probe))


def test_sigkill_of_the_launcher_leaves_no_component_behind(tmp_path, any_image):
    """Snakemake SIGKILLs a failed group's jobs: the real worker inside the image must not outlive launch.py."""
    (tmp_path / "bound").mkdir()
    proc = launch(tmp_path, any_image, SCRIPTS / "worker.py", "--worker-id", "worker-01", "--gate-record",
                  str(tmp_path / "bound/never.json"), "--gate-timeout", "60", component="worker-01")
    assert_killed_launcher_leaves_nothing(proc, str(tmp_path / "bound/never.json"))  # this test's own


def test_sigterm_to_the_stack_drains_and_a_rerun_resumes(project, any_image):
    """Like Slurm's time limit: SIGTERM to every component at once, each through its launcher and ch-run."""
    image = any_image
    config = slow_run(project, "term", tasks=40, seconds=0.3)
    proc = subprocess.Popen(
        ["timeout", "-k", "10", "300", SNAKEMAKE, *charliecloud_run("--cores", "4", "--configfile", str(config),
                                                                    image=image)],
        cwd=project, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "TMPDIR": str(project / "tmp"), "PATH": NO_APPTAINER_PATH},
    )
    wait_for(lambda: journaled(project, "term") >= 4)
    launchers = component_pids(project, "launch.py")
    assert len(launchers) >= 3  # coordinator, two workers (the gate may have ended)
    for pid in launchers:
        os.kill(pid, signal.SIGTERM)
    output, _ = proc.communicate(timeout=200)
    assert proc.returncode != 0, output[-3000:]
    log = (project / "logs/serve_coordinator/term.log").read_text()
    assert "stopping (signal:SIGTERM); draining" in log, log[-2000:]
    [drained] = re.findall(r"incomplete \(signal:SIGTERM\), (\d+)/40 results", log)  # its end record, written
    acknowledged = journaled(project, "term")
    assert 4 <= acknowledged < 40 and int(drained) == acknowledged
    assert not pids_mentioning(str(project))

    (project / "config/term-rerun.yaml").write_text("simulate: {task_seconds: 0}\n")
    rerun = snakemake(project, *charliecloud_run("--cores", "4", "--configfile", str(config),
                                                 "config/term-rerun.yaml", image=image))
    assert rerun.returncode == 0, (rerun.stdout + rerun.stderr)[-3000:]
    assert json.loads((project / "results/term/coordinator.json").read_text())["restored"] == acknowledged
    assert json.loads((project / "results/term/result.json").read_text())["status"] == "success"


def path_without(program: str, directory: Path) -> str:
    """A PATH like the current one, minus ``program``: the other entries of its directory as symlinks."""
    directory.mkdir()
    found = Path(shutil.which(program)).parent
    for entry in found.iterdir():
        if entry.name != program:
            (directory / entry.name).symlink_to(entry)
    return os.pathsep.join(str(directory) if (Path(p) / program).exists() else p  # /bin is /usr/bin here
                           for p in os.environ["PATH"].split(os.pathsep))


def test_missing_ch_run_is_a_prerequisite_error_naming_the_fix(project, image, tmp_path):
    env = {"PATH": path_without("ch-run", tmp_path / "bin")}
    done = snakemake(project, *charliecloud_run("--dry-run", image=image), env=env)
    output = done.stdout + done.stderr
    assert done.returncode != 0
    assert ("allocstack: error [prerequisite]: image is set and runtime is charliecloud, but ch-run is not on PATH; "
            "load it with `module load charliecloud`") in output
    direct = subprocess.run([sys.executable, str(SCRIPTS / "launch.py"), "--component=t", "--run=t",
                             f"--scratch-root={tmp_path}", f"--image={image}", "--runtime=charliecloud",
                             "--runtime-hint=module load charliecloud/0.31", "--", str(SCRIPTS / "readiness.py")],
                            capture_output=True, text=True, env={**os.environ, **env}, cwd=tmp_path, check=False)
    assert direct.returncode == 69
    assert direct.stderr.strip().endswith("[prerequisite]: ch-run is not on PATH; module load charliecloud/0.31")


def test_a_sif_a_changed_squashfs_and_a_changed_directory_image_stop_before_anything_starts(project, image,
                                                                                           tmp_path):
    sif = project / "image.sif"  # ch-run 0.31 cannot open a SIF
    sif.write_bytes(b"#!/usr/bin/env run-singularity\n")
    done = snakemake(project, *charliecloud_run("--cores", "4", image=str(sif)))
    assert done.returncode != 0
    assert f"allocstack: error [config]: image {sif} is neither a directory nor a SquashFS file" \
        in done.stdout + done.stderr
    squashfs = tmp_path / "image.sqfs"  # the real SquashFS image, under a name whose sidecar we write
    squashfs.symlink_to(require_charliecloud_squashfs())
    done = snakemake(project, *charliecloud_run("--cores", "4", image=str(squashfs)))
    assert done.returncode != 0
    missing = f"allocstack: error [integrity]: image {squashfs} has no SHA-256 sidecar {squashfs}.sha256"
    assert f"{missing} (create it with sha256sum)" in done.stdout + done.stderr
    (tmp_path / "image.sqfs.sha256").write_text("0" * 64 + "  image.sqfs\n")  # the digest of another file
    done = snakemake(project, *charliecloud_run("--cores", "4", image=str(squashfs)))
    assert done.returncode != 0
    assert f"allocstack: error [integrity]: image {squashfs} does not match its sidecar: expected {'0' * 64}" \
        in done.stdout + done.stderr
    copy = make_image(tmp_path / "copy")  # a small stand-in: the check never starts it
    assert run_script("image_digest.py", str(copy)).returncode == 0
    (copy / "usr/bin/python3").write_bytes(b"tampered")  # one file changed after the sidecar was written
    done = snakemake(project, *charliecloud_run("--cores", "4", image=str(copy)))
    output = done.stdout + done.stderr
    assert done.returncode != 0
    assert f"allocstack: error [integrity]: image {copy} does not match its sidecar" in output
    assert not (project / "logs/serve_coordinator").exists()


def test_gpus_per_worker_reach_the_steps_but_no_nv_flag(project, image):
    (project / "config/gpu.yaml").write_text("worker: {gpus: 1}\n")
    done = snakemake(project, *charliecloud_run("--dry-run", "--printshellcmds", "--configfile", "config/gpu.yaml",
                                                image=image))
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("--step-arg=--gpus=1") == 2  # the two workers
    # validate_inputs (the image's sidecar), and launch.py for the coordinator, the gate, 2 workers, verify
    assert done.stdout.count("--runtime=charliecloud") == 6
    assert "--runtime-arg=--nv" not in done.stdout  # Charliecloud: the driver comes from ch-fromhost --nvidia


@pytest.fixture
def other_user():
    probe = subprocess.run([SYSTEM_PYTHON, "-c", "import sys; print(sys.version_info[:2])"], capture_output=True,
                           text=True, check=False)
    if probe.stdout.strip() != str(sys.version_info[:2]):
        pytest.skip(f"{SYSTEM_PYTHON} is not Python {sys.version_info[0]}.{sys.version_info[1]} like the venv")
    return local_user(OTHER_USER)


def test_an_unprivileged_user_runs_the_baseline(image, other_user):
    """ch-run needs no privilege: a plain user (no sudo, no setuid helper) runs the whole stack in the image."""
    base, project, home = project_for_another_user("allocstack-ch-user-")
    try:
        for path in (project, home):
            subprocess.run(["chown", "-R", f"{other_user.pw_uid}:{other_user.pw_gid}", str(path)], check=True)
        # The system's python3 with the venv's packages: the venv's own interpreter may live where only
        # its owner can reach it (a pyenv under /root).
        done = snakemake_as(OTHER_USER, project, *charliecloud_run("--cores", "4", image=image),
                            env=user_environment(OTHER_USER, home, project / "tmp", NO_APPTAINER_PATH))
        assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
        assert_ran_in_the_image(project, "baseline", image)
        assert (project / "results/baseline/result.json").stat().st_uid == other_user.pw_uid
        assert not pids_mentioning(str(project))
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.mark.slurm
def test_baseline_through_the_slurm_profile_without_apptainer(project, any_image):
    require_slurm()
    image = any_image
    done = snakemake(project, "--profile", "profiles/slurm", *TEST_RESOURCES, "runtime=10",
                     *charliecloud_run(image=image), timeout=600, env={"PATH": NO_APPTAINER_PATH})
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    job = the_stack_job(output, project)  # one sbatch job for the whole stack
    provenance = assert_ran_in_the_image(project, "baseline", image)
    assert provenance["slurm"]["jobId"] == job
    for name, component in provenance["components"].items():
        assert component["slurmJobId"] == job, name
    assert_a_completed_step_per_component(job, project)
    coordinator_log = (project / "logs/serve_coordinator/baseline.log").read_text()
    assert "srun --job-name=coordinator" in coordinator_log and " ch-run '--unset-env=*'" in coordinator_log
    # The end of every run: scancel --signal=TERM to the coordinator's step, through srun and ch-run (with a
    # SquashFS image: to ch-run's child in that step, found with scontrol listpids); it drains and ends.
    assert "coordinator: stopped (signal:SIGTERM)" in coordinator_log


def start_cost(tmp_path: Path, extra: list[str], repetitions: int = 5) -> float:
    """Median seconds for launch.py to start a component that does nothing (readiness.py --help)."""
    samples = []
    for _ in range(repetitions):
        started = time.monotonic()
        subprocess.run([sys.executable, str(SCRIPTS / "launch.py"), "--component=t", "--run=t",
                        f"--scratch-root={tmp_path}", *extra, "--", str(SCRIPTS / "readiness.py"), "--help"],
                       capture_output=True, check=True, cwd=tmp_path)
        samples.append(time.monotonic() - started)
    return statistics.median(samples)


def test_component_start_cost_against_apptainer_and_the_host(tmp_path, image):
    """Measure (not assert) the per-component start cost, the way test_apptainer measures Apptainer's."""
    write_json(tmp_path / "t.json", make_tasks(1))
    timings = {"host": start_cost(tmp_path, []),
               "ch-run": start_cost(tmp_path, [f"--image={image}", "--runtime=charliecloud"])}
    squashfs = os.environ.get("ALLOCSTACK_TEST_CHARLIECLOUD_SQUASHFS", "")
    if os.path.isfile(squashfs):  # ch-run mounts it for each component
        timings["ch-run SquashFS"] = start_cost(tmp_path, [f"--image={squashfs}", "--runtime=charliecloud"])
    sif = os.environ.get("ALLOCSTACK_TEST_IMAGE", "")
    if shutil.which("apptainer") and os.path.exists(sif):
        timings["apptainer exec"] = start_cost(tmp_path, [f"--image={sif}", "--runtime-arg=--cleanenv",
                                                          "--runtime-arg=--contain"])
    print("component start (median of 5): " + ", ".join(
        f"{name} {seconds * 1000:.0f} ms (+{(seconds - timings['host']) * 1000:.0f})" for name, seconds in timings.items()))
    assert timings["ch-run"] > 0


def test_an_imported_compose_stack_runs_in_the_charliecloud_image(project, image):
    """Your own Compose stack (its services, long-running workers, its check, a named volume) under ch-run."""
    config = import_test_stack(project, "api", "--runtime", "charliecloud")
    images = place_images(project, config, image)  # python:3.11-slim: here the test image's directory
    done = snakemake(project, *charliecloud_run("--cores", "4", "--configfile", config, image=image))
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    check_stack_ran(project, "api")
    provenance = json.loads((project / f"results/{STACK['api'][0]}/provenance.json").read_text())
    assert provenance["containerRuntime"]["name"] == "charliecloud"
    assert all(component["container"] == str(project / images[0]) for component in provenance["components"].values())
