"""Every component inside a real Apptainer image (tests/cluster/apptainer.sh), run locally with --sdm apptainer."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from container_helpers import assert_killed_launcher_leaves_nothing, assert_sigterm_drains, drain_probe

from conftest import SCRIPTS, make_tasks, pids_of_run, write_json
from real_parts import require_apptainer
from workflow_helpers import copy_project, snakemake

pytestmark = pytest.mark.apptainer


@pytest.fixture
def image():
    return require_apptainer()


@pytest.fixture
def project(tmp_path, image):
    workdir = copy_project(tmp_path / "project")
    yield workdir
    leftovers = pids_of_run(workdir, "Apptainer runtime parent", "starter-suid", "squashfuse")
    for pid in leftovers:
        os.kill(pid, signal.SIGKILL)
    assert not leftovers, f"processes left running: {leftovers}"


def test_local_run_inside_the_image(project, image):
    started = time.monotonic()
    done = snakemake(project, "--cores", "4", "--sdm", "apptainer", "--config", f"image={image}")
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    elapsed = time.monotonic() - started
    assert json.loads((project / "results/baseline/result.json").read_text())["status"] == "success"
    provenance = json.loads((project / "results/baseline/provenance.json").read_text())
    assert set(provenance["components"]) == {"coordinator", "readiness", "worker-01", "worker-02"}
    for name, component in provenance["components"].items():
        # seen from inside: the image's interpreter, not the host venv running Snakemake
        assert component["container"] == image, name
        assert component["python"] == "/usr/bin/python3" and component["pythonVersion"] != sys.version.split()[0]
        assert component["osRelease"].startswith("Debian GNU/Linux 12")
    assert provenance["imageSha256"] == Path(image + ".sha256").read_text().split()[0]
    assert provenance["containerRuntime"]["name"] == "apptainer"
    assert provenance["containerRuntime"]["version"].startswith("apptainer version")
    print(f"local run with the image: {elapsed:.1f} s")


def launch_probe(tmp_path: Path, image: str, probe: str, *extra: str) -> subprocess.Popen:
    probe_dir = tmp_path / "probe"
    probe_dir.mkdir(exist_ok=True)
    (probe_dir / "probe.py").write_text(probe)
    return subprocess.Popen(
        [sys.executable, str(SCRIPTS / "launch.py"), "--component=probe", "--run=probe",
         f"--scratch-root={tmp_path / 'scratch'}", f"--image={image}", "--runtime-arg=--cleanenv",
         "--runtime-arg=--contain", f"--bind={tmp_path / 'bound'}", *extra, "--", str(probe_dir / "probe.py")],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


def test_only_the_run_paths_are_visible_inside(tmp_path, image):
    (tmp_path / "host-only.txt").write_text("secret")
    probe = (
        "import json, os, sys\n"
        f"print(json.dumps({{'hostOnly': os.path.exists({str(tmp_path / 'host-only.txt')!r}),\n"
        f"  'venv': os.path.exists({sys.prefix!r}),\n"
        f"  'bound': os.path.isdir({str(tmp_path / 'bound')!r}),\n"
        "  'scratch': os.path.isdir(os.environ['ALLOCSTACK_SCRATCH']),\n"
        "  'home': os.environ.get('HOME'), 'python': sys.executable}))\n"
    )
    proc = launch_probe(tmp_path, image, probe)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    seen = json.loads(out.strip().splitlines()[-1])
    assert seen["hostOnly"] is False and seen["venv"] is False
    assert seen["bound"] is True and seen["scratch"] is True
    assert seen["python"] == "/usr/bin/python3"


def test_sigterm_reaches_the_component_through_apptainer_and_nothing_is_left(tmp_path, image):
    marker = tmp_path / "bound" / "drained"
    proc = launch_probe(tmp_path, image, drain_probe(marker))
    assert_sigterm_drains(proc, marker, str(tmp_path / "probe"))


def test_sigkill_of_the_launcher_leaves_no_container_behind(tmp_path, image):
    """Snakemake SIGKILLs a failed group's jobs: the real worker inside the image must not outlive launch.py."""
    (tmp_path / "bound").mkdir()
    proc = subprocess.Popen(
        [sys.executable, str(SCRIPTS / "launch.py"), "--component=worker-01", "--run=orphan",
         f"--scratch-root={tmp_path / 'scratch'}", f"--image={image}", "--runtime-arg=--cleanenv",
         "--runtime-arg=--contain", f"--bind={tmp_path / 'bound'}", "--", str(SCRIPTS / "worker.py"),
         "--worker-id", "worker-01", "--gate-record", str(tmp_path / "bound/never.json"), "--gate-timeout", "60"],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    assert_killed_launcher_leaves_nothing(proc, str(tmp_path / "bound/never.json"))  # this test's own


def test_missing_apptainer_is_a_prerequisite_error_naming_the_fix(project, image):
    env = {"PATH": os.pathsep.join(p for p in os.environ["PATH"].split(os.pathsep) if "apptainer" not in p)}
    done = snakemake(project, "--dry-run", "--sdm", "apptainer", "--config", f"image={image}", env=env)
    output = done.stdout + done.stderr
    assert done.returncode != 0
    assert "allocstack: error [prerequisite]: image is set and --sdm apptainer is on, but apptainer is not on PATH" in output
    assert "module load apptainer" in output


def test_image_digest_mismatch_stops_before_anything_starts(project, image):
    fake = project / "fake.sif"
    fake.write_bytes(b"not the image you built")
    (project / "fake.sif.sha256").write_text("0" * 64 + "  fake.sif\n")
    done = snakemake(project, "--cores", "4", "--sdm", "apptainer", "--config", "image=fake.sif")
    output = done.stdout + done.stderr
    assert done.returncode != 0
    assert "allocstack: error [integrity]: image fake.sif does not match its sidecar" in output
    assert not (project / "logs/serve_coordinator").exists()


def test_container_start_overhead(tmp_path, image):
    """Measure (not assert) the per-component start overhead of the container; printed for the record."""
    write_json(tmp_path / "t.json", make_tasks(1))
    timings = {}
    for label, extra in (("host", []), ("apptainer", [f"--image={image}", "--runtime-arg=--cleanenv",
                                                       "--runtime-arg=--contain"])):
        samples = []
        for _ in range(5):
            started = time.monotonic()
            subprocess.run([sys.executable, str(SCRIPTS / "launch.py"), "--component=t", "--run=t",
                            f"--scratch-root={tmp_path}", *extra, "--", str(SCRIPTS / "readiness.py"), "--help"],
                           capture_output=True, check=True, cwd=tmp_path)
            samples.append(time.monotonic() - started)
        timings[label] = sorted(samples)[2]
    print(f"component start (median of 5): host {timings['host']*1000:.0f} ms, "
          f"apptainer {timings['apptainer']*1000:.0f} ms, overhead {(timings['apptainer']-timings['host'])*1000:.0f} ms")
    assert timings["apptainer"] > 0


def test_a_checkout_outside_the_usual_places_is_bound_into_the_image(tmp_path, image):
    """CI clones to /check/...: scripts from any directory must reach the image (found by CI, exit 255)."""
    elsewhere = Path("/srv/allocstack-checkout-test")  # outside /tmp, /work, /home: nothing makes it visible by default
    shutil.rmtree(elsewhere, ignore_errors=True)
    try:
        shutil.copytree(SCRIPTS, elsewhere / "scripts", ignore=shutil.ignore_patterns("__pycache__"))
    except OSError as exc:
        pytest.skip(f"cannot write {elsewhere}: {exc.strerror}")
    try:
        done = subprocess.run([sys.executable, str(elsewhere / "scripts/launch.py"), "--component=t", "--run=t",
                               f"--scratch-root={tmp_path}", f"--image={image}", "--runtime-arg=--cleanenv",
                               "--runtime-arg=--contain", "--", str(elsewhere / "scripts/readiness.py"), "--help"],
                              capture_output=True, text=True, cwd=tmp_path, timeout=120, check=False)
        assert done.returncode == 0, done.stderr[-2000:]
        assert "usage: readiness.py" in done.stdout
    finally:
        shutil.rmtree(elsewhere, ignore_errors=True)


def test_gpus_per_worker_add_nv_and_a_gpu_step_to_each_worker(project, image):
    (project / "config/gpu.yaml").write_text("worker: {gpus: 1}\n")
    with_gpu = snakemake(project, "--dry-run", "--printshellcmds", "--sdm", "apptainer", "--config", f"image={image}",
                         "--configfile", "config/gpu.yaml")
    without = snakemake(project, "--dry-run", "--printshellcmds", "--sdm", "apptainer", "--config", f"image={image}")
    assert with_gpu.returncode == 0 and without.returncode == 0, with_gpu.stderr
    assert with_gpu.stdout.count("--runtime-arg=--nv") == 2  # the two workers, nothing else
    assert with_gpu.stdout.count("--step-arg=--gpus=1") == 2
    assert "--runtime-arg=--nv" not in without.stdout
