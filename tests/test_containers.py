"""The container runtimes' composition and the image digests, without running a container."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from allocstack.common.errors import AllocstackError
from allocstack.common.jsonio import check_sidecar, sha256_tree
from allocstack.launch.containers import (
    BASE_PATH,
    charliecloud_prefix,
    check_image_format,
    check_mount_points,
    child_pids,
    forked_components,
    forks_component,
    mount_tops,
    mount_tree_dirs,
)
from conftest import ROOT, SCRIPTS, run_script


def make_image(root: Path) -> Path:
    """A small directory tree with what images have: files, an executable, a symlink, an empty directory."""
    (root / "usr/bin").mkdir(parents=True)
    (root / "usr/bin/python3").write_bytes(b"\x7fELF not really")
    (root / "usr/bin/python3").chmod(0o755)
    (root / "bin").symlink_to("usr/bin")
    (root / "etc").mkdir()
    (root / "etc/os-release").write_text('PRETTY_NAME="Debian GNU/Linux 12 (bookworm)"\n')
    (root / "work").mkdir()  # an empty mount point
    return root


def test_a_directory_digest_changes_with_any_content_name_mode_or_link_and_survives_a_copy(tmp_path):
    image = make_image(tmp_path / "image")
    digest = sha256_tree(image)
    copy = tmp_path / "copy"
    subprocess.run(["cp", "-a", str(image), str(copy)], check=True)
    os.utime(copy / "etc/os-release", (0, 0))  # times are not part of it
    assert sha256_tree(copy) == digest
    changes = [
        lambda root: (root / "etc/os-release").write_text('PRETTY_NAME="Debian GNU/Linux 13"\n'),
        lambda root: (root / "usr/bin/python3").chmod(0o644),
        lambda root: ((root / "bin").unlink(), (root / "bin").symlink_to("/usr/bin")),
        lambda root: (root / "scratch").mkdir(),
        lambda root: (root / "etc/os-release").rename(root / "etc/os-releasf"),
        lambda root: (root / "work/.keep").write_bytes(b""),
    ]
    seen = {digest}
    for number, change in enumerate(changes):
        changed = tmp_path / f"changed-{number}"
        shutil.copytree(image, changed, symlinks=True)
        change(changed)
        seen.add(sha256_tree(changed))
    assert len(seen) == len(changes) + 1  # every change gives its own digest


def test_image_digest_writes_a_sidecar_the_workflow_accepts(tmp_path):
    image = make_image(tmp_path / "image")
    done = run_script("image_digest.py", str(image))
    assert done.returncode == 0, done.stderr
    line = (tmp_path / "image.sha256").read_text()
    assert done.stdout == line and line == f"{sha256_tree(image)}  image/\n"
    assert check_sidecar(image, "image") == sha256_tree(image)
    (image / "etc/os-release").write_text("tampered\n")
    with pytest.raises(AllocstackError) as caught:
        check_sidecar(image, "image")
    assert caught.value.diag == "integrity" and "does not match its sidecar" in caught.value.message


def test_a_file_sidecar_is_what_sha256sum_writes(tmp_path):
    sif = tmp_path / "image.sif"
    sif.write_bytes(b"SIF bytes" * 1000)
    assert run_script("image_digest.py", str(sif)).returncode == 0
    assert (tmp_path / "image.sif.sha256").read_text() == f"{hashlib.sha256(sif.read_bytes()).hexdigest()}  image.sif\n"
    assert subprocess.run(["sha256sum", "--check", "--status", "image.sif.sha256"], cwd=tmp_path,
                          check=False).returncode == 0


def test_a_directory_image_without_a_sidecar_names_the_tool(tmp_path):
    image = make_image(tmp_path / "image")
    with pytest.raises(AllocstackError) as caught:
        check_sidecar(image, "image")
    assert caught.value.diag == "integrity" and "python3 workflow/scripts/image_digest.py" in caught.value.message


def test_an_unreadable_file_in_a_directory_image_is_a_prerequisite_error():
    """Root reads every file, so as root the check runs as `nobody` (ch-run runs components as their user)."""
    base = Path(tempfile.mkdtemp(prefix="allocstack-digest-", dir="/tmp"))
    try:
        os.chmod(base, 0o755)  # noqa: S103  (on purpose: `nobody` must reach the image)
        image = make_image(base / "image")
        (image / "etc/os-release").chmod(0)
        code = ("import sys; from allocstack.common.errors import AllocstackError; from allocstack.common.jsonio import sha256_tree\n"
                f"try: sha256_tree({str(image)!r}, 'image')\n"
                "except AllocstackError as e: print(e.diag, e.message); sys.exit(0)\nsys.exit(1)")
        as_user = ["runuser", "-u", "nobody", "--"] if os.geteuid() == 0 else []
        done = subprocess.run([*as_user, "/usr/bin/python3", "-c", code], capture_output=True, text=True,
                              env={"PYTHONPATH": str(SCRIPTS), "PATH": os.environ["PATH"]}, timeout=30, check=False)
        assert done.returncode == 0, done.stdout + done.stderr
        assert done.stdout.startswith("prerequisite image ") and "chmod -R a+rX" in done.stdout
        assert f"cannot read {image}/etc/os-release" in done.stdout
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_charliecloud_runs_directory_and_squashfs_images_but_no_sif(tmp_path):
    sqfs = tmp_path / "allocstack.sqfs"
    sqfs.write_bytes(b"hsqs" + bytes(92))  # SquashFS's magic number opens its superblock
    sif = tmp_path / "allocstack.sif"
    sif.write_bytes(b"#!/usr/bin/env run-singularity\n" + bytes(64))
    check_image_format("charliecloud", str(sqfs))
    check_image_format("charliecloud", str(make_image(tmp_path / "image")))
    with pytest.raises(AllocstackError) as caught:
        check_image_format("charliecloud", str(sif))
    assert caught.value.diag == "config" and f"ch-convert {sif} DIR" in caught.value.message
    check_image_format("apptainer", str(sif))  # Apptainer runs a SIF
    # Only ch-run with a SquashFS image serves the image from its own process and runs the component as its child.
    assert forks_component("charliecloud", str(sqfs))
    assert not forks_component("charliecloud", str(tmp_path / "image"))
    assert not forks_component("apptainer", str(sqfs))


def test_the_forked_component_is_ch_runs_child_and_not_ch_run(tmp_path):
    """The stop signal's target with a SquashFS image: the children of the processes named ch-run, nothing else."""
    ch_run = tmp_path / "ch-run"  # named like the runtime, as /proc/PID/comm shows it
    ch_run.write_text("#!/bin/sh\nsleep 30 &\nsleep 30 &\nwait\n")
    ch_run.chmod(0o755)
    runtime = subprocess.Popen([str(ch_run)])
    other = subprocess.Popen(["sleep", "30"])
    try:
        deadline = time.monotonic() + 10
        while len(child_pids(runtime.pid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        children = child_pids(runtime.pid)
        assert len(children) == 2
        assert sorted(forked_components([runtime.pid, other.pid])) == sorted(children)
        assert forked_components([other.pid]) == []  # not named ch-run: it has no forked component
        assert child_pids(other.pid) == []
    finally:
        for proc in (runtime, other):
            proc.kill()
            proc.wait()
    assert child_pids(runtime.pid) == [] and forked_components([runtime.pid]) == []  # gone


def test_ch_run_gets_a_clean_environment_first_and_the_run_paths_on_a_mount_point_tree(tmp_path):
    image = make_image(tmp_path / "image")
    (image / "ch").mkdir()
    (image / "ch/environment").write_text("LC_ALL=C.UTF-8\n")
    tree = tmp_path / "tree"
    binds = ["/scratch/job/allocstack-1/run", "/work/me/project/workflow/scripts", "/work/me/project/results/run",
             "/project"]
    argv = charliecloud_prefix(str(image), ["--join"], binds, {"USER": "me", "ALLOCSTACK_SCRATCH": "/a b'c"},
                               "/work/me/project", tree)
    assert argv[:3] == ["ch-run", "--unset-env=*", f"--set-env=PATH={BASE_PATH}"]
    assert BASE_PATH == "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    assert argv[3:8] == [f"--set-env={image}/ch/environment", "--join", "--set-env=USER='me'",
                         "--set-env=ALLOCSTACK_SCRATCH='/a b'c'", "--private-tmp"]  # ch-run strips one '' pair
    assert argv[8] == "--cd=/work/me/project"
    assert argv[9:11] == [f"--bind={tree}/scratch:/scratch", f"--bind={tree}/work:/work"]  # /project: whole
    assert argv[11:15] == ["--bind=/project:/project", "--bind=/scratch/job/allocstack-1/run:/scratch/job/allocstack-1/run",
                           "--bind=/work/me/project/results/run:/work/me/project/results/run",
                           "--bind=/work/me/project/workflow/scripts:/work/me/project/workflow/scripts"]
    assert argv[15:] == [str(image), "--"]
    assert sorted(str(d.relative_to(tree)) for d in mount_tree_dirs(binds, "/work/me/project", tree)) == [
        "scratch/job/allocstack-1/run", "work/me/project", "work/me/project/results/run",
        "work/me/project/workflow/scripts"]


@pytest.mark.parametrize("path, message", [
    ("/usr/share/data", "below /usr, which belongs to the image"),
    ("/work/a:b", "contains ':'"),
])
def test_paths_ch_run_cannot_bind_are_refused(path, message):
    with pytest.raises(AllocstackError) as caught:
        mount_tops([path])
    assert caught.value.diag == "prerequisite" and message in caught.value.message


def test_a_value_ch_run_would_expand_is_refused(tmp_path):
    with pytest.raises(AllocstackError) as caught:
        charliecloud_prefix(str(tmp_path), [], [], {"CUDA_VISIBLE_DEVICES": "$HOME:0"}, "/", tmp_path)
    assert caught.value.diag == "prerequisite" and "CUDA_VISIBLE_DEVICES" in caught.value.message


def test_a_directory_image_without_the_mount_point_says_how_to_add_it(tmp_path):
    image = make_image(tmp_path / "image")
    check_mount_points(str(image), {"work"})
    with pytest.raises(AllocstackError) as caught:
        check_mount_points(str(image), {"work", "scratch"})
    assert caught.value.diag == "prerequisite"
    assert f"image {image} has no directory /scratch" in caught.value.message and "mount points" in caught.value.message


def test_the_dockerfile_is_the_same_recipe_as_the_apptainer_definition():
    """Charliecloud builds container/Dockerfile, Apptainer allocstack.def: same base, same requests, h11, msgspec and uvloop
    (pinned as in requirements.txt), same environment."""
    definition = (ROOT / "container/allocstack.def").read_text()
    dockerfile = (ROOT / "container/Dockerfile").read_text()
    assert re.search(r"^From: (\S+)$", definition, re.MULTILINE)[1] == re.search(r"^FROM (\S+)$", dockerfile, re.MULTILINE)[1]
    requirements = (ROOT / "requirements.txt").read_text()
    for package in ("requests", "h11", "msgspec", "uvloop"):
        pins = [re.findall(rf"{package}==([\d.]+)", text) for text in (definition, dockerfile, requirements)]
        assert pins[0][:1] == pins[1] == pins[2] and pins[1], package
    test_definition = (ROOT / "container/test.def").read_text()  # takes h11, msgspec, uvloop from PyPI, digests checked
    for package in ("h11", "msgspec", "uvloop"):
        assert re.findall(rf"'{package}==([\d.]+) --hash=sha256:[0-9a-f]{{64}}", test_definition) == \
            re.findall(rf"^{package}==([\d.]+)$", requirements, re.MULTILINE), package
    exported = dict(re.findall(r"^\s+export (\w+)=(\S+)$", definition, re.MULTILINE))
    env_line = re.search(r"^ENV (.+)$", dockerfile, re.MULTILINE)[1]
    assert dict(item.split("=", 1) for item in env_line.split()) == exported
