"""Finding the real Slurm test cluster, Apptainer and Charliecloud; skip (or, in CI, fail) when they are missing."""

from __future__ import annotations

import json
import os
import re
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


def _require_runtime(program: str, install: str, image_var: str, image_ok, version_env: dict | None = None,
                     why: str = "") -> str:
    """Return the test image named by ``image_var`` once ``program`` is on PATH and answers."""
    image = os.environ.get(image_var, "")
    if shutil.which(program) is None:
        unavailable(f"{program} is not on PATH ({install})")
    if not image or not image_ok(image) or not os.path.exists(image + ".sha256"):
        unavailable(f"no test image at {image!r} (tests/cluster/prepare.sh makes it)")
    if not _answers([program, "--version"], env=version_env):
        unavailable(f"{program} does not run here{why}")
    return image


def require_apptainer() -> str:
    """Return the test image path (a SIF); apptainer needs root in this sandbox."""
    return _require_runtime("apptainer", "as root: tests/cluster/apptainer.sh install; source tests/cluster/env.sh",
                            "ALLOCSTACK_TEST_IMAGE", os.path.exists, why=" (it needs root in this sandbox)")


def require_charliecloud() -> str:
    """Return the directory test image for ch-run (which refuses to start without $USER)."""
    return _require_runtime("ch-run", "as root: tests/cluster/prepare.sh installs Debian's charliecloud-runtime",
                            "ALLOCSTACK_TEST_CHARLIECLOUD_IMAGE", os.path.isdir,
                            {**os.environ, "USER": os.environ.get("USER") or "root"})


SLURM_STATE = os.environ.get("ALLOCSTACK_SLURM_STATE", "/var/lib/allocstack-slurm")
#: How tests/cluster/prepare.sh starts the namespaced nodes: two sets of three (:func:`multinode_set`).
MULTINODE_START = ("--nodes", "6", "--sets", "2")


def multinode_set(nodeid: str) -> int:
    """Which set of namespaced nodes (a partition of its own) a multi-node test runs on: 1 for the tests of
    test_multinode.py, 2 for the others (pure; the split of the suite's longest chain in two about equal halves, each
    one after another on one process, the two side by side: tests/conftest.py)."""
    return 1 if nodeid.split("::", 1)[0].endswith("test_multinode.py") else 2


def require_multinode(nodes: int = 3) -> dict:
    """The namespaced nodes of ``tests/cluster/slurm.sh start --nodes N --sets S`` (its layout file) of the running
    test's set (:func:`multinode_set`), all usable: the layout with that set's partition, nodes and scratch."""
    require_slurm()
    try:
        with open(os.path.join(SLURM_STATE, "multi", "layout.json"), encoding="utf-8") as handle:
            layout = json.load(handle)
    except (OSError, ValueError):
        unavailable(f"no multi-node test cluster (as root: tests/cluster/slurm.sh start {' '.join(MULTINODE_START)})")
    test = os.environ.get("PYTEST_CURRENT_TEST", "").rsplit(" ", 1)[0]
    wanted = multinode_set(test)
    sets = layout.get("sets", [layout])
    if len(sets) < wanted:
        unavailable(f"the test cluster has {len(sets)} set(s) of namespaced nodes, this test runs on set {wanted} "
                    f"(as root: tests/cluster/slurm.sh start {' '.join(MULTINODE_START)})")
    layout = {**layout, **sets[wanted - 1]}
    if len(layout["nodes"]) < nodes:
        unavailable(f"the test cluster's node set {wanted} has {len(layout['nodes'])} namespaced nodes, not {nodes} "
                    f"(as root: tests/cluster/slurm.sh start {' '.join(MULTINODE_START)})")
    states = subprocess.run(["sinfo", "--noheader", "--Node", f"--partition={layout['partition']}", "--format=%N %T"],
                            capture_output=True, text=True, timeout=20, check=False).stdout.split("\n")
    usable = {line.split()[0] for line in states if line.split()[1:2] and line.split()[1] in ("idle", "mixed", "allocated")}
    if not set(layout["nodes"]) <= usable:
        unavailable(f"nodes of partition {layout['partition']} are not all usable: {states}")
    return layout


def require_charliecloud_squashfs() -> str:
    """Return the SquashFS test image for ch-run (the directory image packed by tests/cluster/charliecloud.sh)."""
    return _require_runtime("ch-run", "as root: tests/cluster/prepare.sh installs Debian's charliecloud-runtime",
                            "ALLOCSTACK_TEST_CHARLIECLOUD_SQUASHFS", os.path.isfile,
                            {**os.environ, "USER": os.environ.get("USER") or "root"})


def require_job_tmpdir_prolog() -> None:
    """The test cluster's prolog that makes each job a directory on each node (tests/cluster/job-tmpdir.sh)."""
    require_slurm()
    config = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True, timeout=20,
                            check=False).stdout
    prolog = re.search(r"^Prolog\s*=\s*(\S+)", config, flags=re.MULTILINE)
    if not prolog or os.path.basename(prolog[1]) != "prolog" or not os.path.exists(prolog[1]):
        unavailable("the test cluster has no per-job directory prolog (tests/cluster/slurm.sh start installs it)")
