"""Finding the real Slurm test cluster, Apptainer and Charliecloud; skip (or, in CI, fail) when they are missing."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

REQUIRED = os.environ.get("ALLOCSTACK_REQUIRE_CLUSTER") == "1"


def unavailable(reason: str):
    """Skip with ``reason``; in CI (ALLOCSTACK_REQUIRE_CLUSTER=1) a missing real part is a failure."""
    if REQUIRED:
        pytest.fail(f"required real part missing: {reason}")
    pytest.skip(reason)


def _answers(argv: list[str], env: dict[str, str] | None = None) -> bool:
    try:
        return subprocess.run(argv, capture_output=True, timeout=20, check=False, env=env).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def require_slurm() -> None:
    if shutil.which("sinfo") is None:
        unavailable("no Slurm client (start the test cluster as root: tests/cluster/slurm.sh start)")
    if not _answers(["sinfo"]):
        unavailable("no Slurm controller answers (tests/cluster/slurm.sh start, as root)")
    if not _answers(["sacct", "--noheader", "-X", "--starttime=now-1minutes"]):
        unavailable("Slurm accounting (sacct) does not answer")


def require_apptainer() -> str:
    """Return the test image path."""
    image = os.environ.get("ALLOCSTACK_TEST_IMAGE", "")
    if shutil.which("apptainer") is None:
        unavailable("apptainer is not on PATH (as root: tests/cluster/apptainer.sh install; source tests/cluster/env.sh)")
    if not image or not os.path.exists(image) or not os.path.exists(image + ".sha256"):
        unavailable(f"no test image at {image!r} (tests/cluster/prepare.sh builds it)")
    if not _answers(["apptainer", "--version"]):
        unavailable("apptainer does not run here (it needs root in this sandbox)")
    return image


def require_charliecloud() -> str:
    """Return the directory test image for ch-run."""
    image = os.environ.get("ALLOCSTACK_TEST_CHARLIECLOUD_IMAGE", "")
    if shutil.which("ch-run") is None:
        unavailable("ch-run is not on PATH (as root: tests/cluster/prepare.sh installs Debian's charliecloud-runtime)")
    if not image or not os.path.isdir(image) or not os.path.exists(image + ".sha256"):
        unavailable(f"no Charliecloud test image at {image!r} (tests/cluster/prepare.sh makes it)")
    if not _answers(["ch-run", "--version"], env={**os.environ, "USER": os.environ.get("USER") or "root"}):
        unavailable("ch-run does not run here")
    return image
