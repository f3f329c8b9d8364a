"""The container runtimes' composition and the image digests, without running a container."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import stat
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from allocstack.common.errors import AllocstackError
from allocstack.common.jsonio import check_sidecar, sha256_tree
from allocstack.launch.containers import (
    BASE_PATH,
    Bind,
    PrivateDir,
    charliecloud_prefix,
    check_image_format,
    check_mount_points,
    check_mount_targets,
    child_pids,
    forked_components,
    forks_component,
    make_mount_points,
    mount_tops,
    mount_tree_dirs,
    program_prefix,
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


def secrets_image(root: Path) -> Path:
    """An image as Debian's and Docker Hub's are laid out where Compose mounts secrets and configs: /run holding
    only runtime state (an empty /run/lock, sticky, and a stale pid file), an empty /srv with an empty directory, /etc
    and /opt holding files, /var/run a symlink to /run."""
    make_image(root)
    (root / "run/lock").mkdir(parents=True)
    (root / "run/lock").chmod(0o1777)
    (root / "run/stale.pid").write_text("1\n")
    (root / "srv/www").mkdir(parents=True)
    (root / "opt/app").mkdir(parents=True)
    (root / "opt/app/main.py").write_text("print()\n")
    (root / "var").mkdir()
    (root / "var/run").symlink_to("/run")
    return root


def test_a_secret_below_run_gets_a_private_run_and_a_config_an_empty_directory_of_the_image(tmp_path):
    """ch-run binds only onto paths the image has: /run/secrets/<name> gets a private /run (the image's directories
    there made again, its runtime files not), a config in an empty directory of the image a private one in its
    place; a target the image has is bound as it is, and one below a directory already private needs nothing."""
    image, token, settings = secrets_image(tmp_path / "image"), tmp_path / "token.txt", tmp_path / "settings.ini"
    token.write_text("s3cret\n")
    settings.write_text("[app]\n")
    secret, config = Bind(str(token), "/run/secrets/token", True), Bind(str(settings), "/srv/app/settings.ini", True)
    assert check_mount_targets(str(image), [secret, config]) == [
        PrivateDir("/run", 0o755, (("lock", 0o1777),)), PrivateDir("/srv", 0o755, (("www", 0o755),))]
    assert check_mount_targets(str(image), [Bind(str(tmp_path), "/srv/www"), Bind(str(token), "/etc/os-release")]) == []
    assert check_mount_targets(str(image), [Bind(str(token), "/tmp/x/token")], covered=["/tmp"]) == []
    # the deepest directory the image has: /srv/www for the first, /srv for the second, which holds the first
    nested = [Bind(str(tmp_path), "/srv/www/data"), Bind(str(settings), "/srv/settings.ini")]
    assert [entry.path for entry in check_mount_targets(str(image), nested)] == ["/srv"]
    # a SquashFS image cannot be looked into: /run is made private all the same, the rest left to ch-run
    squashfs = tmp_path / "image.sqfs"
    squashfs.write_bytes(b"hsqs" + bytes(60))
    assert check_mount_targets(str(squashfs), [secret, config]) == [PrivateDir("/run")]


@pytest.mark.parametrize("target, source, said", [
    ("/etc/app.ini", "file", ("has no file /etc/app.ini to mount {source} onto: ch-run binds only onto paths the image "
                             "has, and a private /etc would hide what the image keeps there (/etc/os-release): create "
                             "it in the image (a Dockerfile's RUN mkdir -p /etc && touch /etc/app.ini), mount it below "
                             "/run, or run with Apptainer")),
    ("/opt/app/settings.ini", "file", "a private /opt/app would hide what the image keeps there (/opt/app/main.py)"),
    ("/in", "directory", ("has no directory /in to mount {source} onto: ch-run binds only onto paths the image has, "
                         "and cannot make one at its top level: create it in the image (a Dockerfile's VOLUME /in or "
                         "RUN mkdir -p /in)")),
    ("/var/run/secrets/token", "file", ("(/var/run is a symlink in the image (to /run), which ch-run follows on the "
                                       "host's side: mount at the path it names)")),
    ("/srv/www", "file", ("has no file /srv/www to mount {source} onto: ch-run binds only onto paths the image has "
                         "(/srv/www is a directory in the image)")),
    ("/etc/os-release/x", "file", "(/etc/os-release is a file in the image)"),
])
def test_a_mount_target_nothing_can_make_is_refused_in_one_line_naming_it(tmp_path, target, source, said):
    image = secrets_image(tmp_path / "image")
    host = tmp_path / source
    host.mkdir() if source == "directory" else host.write_text("x\n")
    with pytest.raises(AllocstackError) as caught:
        check_mount_targets(str(image), [Bind(str(host), target, True)])
    assert caught.value.diag == "prerequisite" and "\n" not in caught.value.message
    assert caught.value.message.startswith(f"image {image} has no ")
    assert said.format(source=host) in caught.value.message


def test_an_image_without_run_cannot_hold_a_secret(tmp_path):
    image = make_image(tmp_path / "image")
    (tmp_path / "token.txt").write_text("x\n")
    with pytest.raises(AllocstackError) as caught:
        check_mount_targets(str(image), [Bind(str(tmp_path / "token.txt"), "/run/secrets/token", True)])
    assert "has no file /run/secrets/token to mount" in caught.value.message
    assert "and no directory /run to hold it: create it in the image" in caught.value.message


def test_a_directory_whose_contents_cannot_be_seen_is_not_taken_for_an_empty_one(tmp_path, monkeypatch):
    """Another owner's 0700 directory in an image (an image unpacked by root, run by a user): what it holds is
    unknown, so no private directory takes its place; below /run it is made again, empty."""
    image, token = secrets_image(tmp_path / "image"), tmp_path / "token.txt"
    token.write_text("x\n")
    (image / "srv/www/private").mkdir()
    (image / "run/sshd").mkdir()
    scandir = os.scandir

    def unreadable(path):
        if Path(path).name in ("private", "sshd"):
            raise PermissionError(13, "Permission denied", str(path))
        return scandir(path)

    monkeypatch.setattr("allocstack.launch.containers.os.scandir", unreadable)
    with pytest.raises(AllocstackError) as caught:
        check_mount_targets(str(image), [Bind(str(token), "/srv/app.ini")])
    assert "a private /srv would hide what the image keeps there (/srv/www/private)" in caught.value.message
    assert check_mount_targets(str(image), [Bind(str(token), "/run/secrets/token")])[0].skeleton == (
        ("lock", 0o1777), ("sshd", 0o755))


def test_the_mount_points_are_made_in_the_tree_with_the_images_modes_and_the_owners_own(tmp_path):
    tree, token, data = tmp_path / "tree", tmp_path / "token.txt", tmp_path / "data"
    token.write_text("x\n")
    data.mkdir()
    private = [PrivateDir("/run", 0o555, (("lock", 0o1777),)), PrivateDir("/srv")]
    make_mount_points(tree, private, [Bind(str(token), "/run/secrets/token", True), Bind(str(data), "/srv/out"),
                                      Bind(str(token), "/tmp/x/settings.ini"), Bind(str(token), "/etc/hosts")],
                      covered=["/tmp"])
    made = sorted(str(path.relative_to(tree)) + ("/" if path.is_dir() else "") for path in tree.rglob("*"))
    assert made == ["run/", "run/lock/", "run/secrets/", "run/secrets/token", "srv/", "srv/out/", "tmp/", "tmp/x/",
                    "tmp/x/settings.ini"]  # /etc/hosts: the image has it, bound there
    assert (tree / "run/secrets/token").stat().st_size == 0
    assert stat.S_IMODE((tree / "run").stat().st_mode) == 0o755  # 0o555 + the owner's own, to remove it after
    assert stat.S_IMODE((tree / "run/lock").stat().st_mode) == 0o1777
    make_mount_points(tree, private, [Bind(str(token), "/run/secrets/token", True)], covered=[])  # a restart: again


def test_ch_run_binds_the_private_directories_before_the_mounts_inside_them(tmp_path):
    image = secrets_image(tmp_path / "image")
    token, private = tmp_path / "token.txt", tmp_path / "program"
    token.write_text("x\n")
    argv, _ = program_prefix("charliecloud", str(image), [], ["/work/me/project"],
                             [Bind(str(token), "/run/secrets/token")], {}, "/code", private)
    binds = [arg.removeprefix("--bind=") for arg in argv if arg.startswith("--bind=")]
    tree = private / "mounts"
    assert binds == [f"{tree}/work:/work", f"{tree}/run:/run", "/work/me/project:/work/me/project",
                     f"{token}:/run/secrets/token"]
    assert (tree / "run/lock").is_dir() and (tree / "run/secrets/token").is_file()
    assert not (tree / "run/stale.pid").exists()


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
