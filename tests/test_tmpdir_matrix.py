"""Where centers put a job's temporary storage, each with every runtime and on three nodes: real runs.

Rows (point 4 of issue 30): $TMPDIR under /tmp, under /var/tmp, elsewhere (a node-local directory like
/local/<jobid>, made by the test), a per-job directory made by the test cluster's Slurm prolog and removed
at the job's end (tests/cluster/job-tmpdir.sh), a read-only or full one (one clear line), and
$SLURM_TMPDIR set. Each row runs once without an image, once in Apptainer and once in Charliecloud, and
once under the Slurm profile on the test cluster's three namespaced nodes (not the full cross-product). A stack
of your own (a service, long-running workers writing into a named volume, a check reading it: tests/stacks/kv)
runs with $TMPDIR elsewhere under each runtime too: every caller of the scratch, not only the built-in stack's.
Every successful run must be VERIFIED with its scratch under that root (provenance.json says which and
where it came from) and removed afterwards; every refused one must say so in one line naming the root.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from scratch_helpers import fill, mount_tmpfs, require_root, unmount
from test_compose_stacks import STACK, check_stack_ran, import_test_stack, place_images
from test_multinode import cluster_args, multinode_project  # noqa: F401  (a fixture)

from conftest import local_user, pids_mentioning, pids_of_run
from real_parts import require_apptainer, require_charliecloud, require_job_tmpdir_prolog
from workflow_helpers import (
    SYSTEM_PYTHON,
    copy_project,
    project_for_another_user,
    snakemake,
    snakemake_as,
    user_environment,
)

pytestmark = [pytest.mark.slurm, pytest.mark.apptainer, pytest.mark.charliecloud]

RUNTIMES = ("none", "apptainer", "charliecloud")
NO_APPTAINER_PATH = os.pathsep.join(p for p in os.environ["PATH"].split(os.pathsep) if "apptainer" not in p)
#: The test cluster's per-job directory (tests/cluster/job-tmpdir.sh) on every node, for jobs that ask for it.
NODE_SCRATCH = Path("/tmp/allocstack-node-scratch")
JOB_TMPDIR_ENV = "ALLOCSTACK_TEST_JOB_TMPDIR"
#: The runtimes' own processes, told from others' by the run's paths in their environment (conftest.pids_of_run).
RUNTIME_HELPERS = ("Apptainer runtime parent", "squashfuse")


def runtime_args(runtime: str, *config: str) -> tuple[list[str], dict[str, str]]:
    """Snakemake arguments (and environment) that run the stack without an image, in Apptainer or in Charliecloud."""
    if runtime == "apptainer":
        return ["--sdm", "apptainer", "--config", f"image={require_apptainer()}", *config], {}
    if runtime == "charliecloud":
        return (["--config", "runtime=charliecloud", f"image={require_charliecloud()}", *config],
                {"PATH": NO_APPTAINER_PATH, "USER": os.environ.get("USER") or "root"})
    return (["--config", *config] if config else []), {}


def elsewhere(runtime: str, token: str) -> Path:
    """A node-local directory outside /tmp and /var/tmp. Charliecloud binds the run's paths onto directories its
    image has: the test image has /mnt (Debian's, empty) but no /local, as a center adds its own filesystems'
    mount points to the image (container/README.md); tests below check the one line for a missing one."""
    return Path("/mnt/local" if runtime == "charliecloud" else "/local") / f"job{token}"


@pytest.fixture
def roots():
    """Directories the test makes for a row (removed after it); mounts unmounted first."""
    made: list[Path] = []
    mounted: list[Path] = []

    def make(path: Path, mount: str | None = None) -> Path:
        made.append(path)
        if mount == "read-only":
            mounted.append(mount_tmpfs(path, "ro"))
        elif mount == "full":
            mounted.append(mount_tmpfs(path, size="1m"))
            fill(path)
        else:
            path.mkdir(parents=True, mode=0o755)
        return path

    yield make
    for path in reversed(mounted):
        unmount(path)
    for path in reversed(made):
        shutil.rmtree(path, ignore_errors=True)


def run(project: Path, runtime: str, env: dict[str, str], *config: str, timeout: float = 300,
        configfile: str | None = None):
    args, runtime_env = runtime_args(runtime, *config)
    files = ["--configfile", configfile] if configfile else []
    return snakemake(project, "--cores", "4", *files, *args, env={**runtime_env, **env}, timeout=timeout)


def assert_verified_in(project: Path, output: str, root: Path, source: str, runtime: str, run: str = "baseline",
                       verdict: str = "4 of 4 tasks correct") -> dict:
    """VERIFIED, its scratch under ``root`` (from ``source``), run in the image, and removed afterwards."""
    assert f"allocstack: run {run} VERIFIED: {verdict}" in output, output[-4000:]
    provenance = json.loads((project / f"results/{run}/provenance.json").read_text())
    scratch = Path(provenance["scratch"]["path"])
    assert scratch.parent == root / f"allocstack-{os.getuid()}", provenance["scratch"]
    assert provenance["scratch"]["from"] == source
    assert not scratch.exists()  # job-scoped: removed
    images = {c["container"] for c in provenance["components"].values()}
    assert (images == {None}) == (runtime == "none"), images
    return provenance


def assert_one_line(output: str, *words: str) -> str:
    """Every allocstack error line of the run is the same one, naming what is wrong; no traceback."""
    lines = {line[line.index("allocstack: error ["):] for line in output.splitlines() if "allocstack: error [" in line}
    assert len(lines) == 1, lines
    [line] = lines
    assert all(word in line for word in words), line
    assert "Traceback" not in output
    return line


# -- each row, once without an image, once in Apptainer, once in Charliecloud ----------------------------

@pytest.mark.parametrize("runtime", RUNTIMES)
@pytest.mark.parametrize("row", ["tmp", "var-tmp", "elsewhere", "slurm-tmpdir"])
def test_a_run_uses_its_own_scratch_wherever_the_center_puts_tmpdir(project, roots, runtime, row):
    token = secrets.token_hex(4)
    if row == "tmp":
        root, env, source = project / "tmp", {}, "$TMPDIR"  # project: under pytest's /tmp
    elif row == "var-tmp":
        root, env, source = roots(Path("/var/tmp") / f"allocstack-test-{token}"), {}, "$TMPDIR"
    elif row == "elsewhere":
        require_root("a directory outside /tmp and /var/tmp")
        root, env, source = roots(elsewhere(runtime, token)), {}, "$TMPDIR"
    else:  # $SLURM_TMPDIR wins over $TMPDIR (outside Slurm too: a center's allocation shell exports it)
        root, source = roots(Path("/var/tmp") / f"allocstack-slurm-tmpdir-{token}"), "$SLURM_TMPDIR"
        env = {"SLURM_TMPDIR": str(root)}
    done = run(project, runtime, {"TMPDIR": str(root), **env} if row != "slurm-tmpdir" else env)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    assert_verified_in(project, done.stdout + done.stderr, root, source, runtime)


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_your_own_stack_uses_its_scratch_with_tmpdir_outside_tmp(project, roots, runtime):
    """Every caller of the scratch, not only the built-in stack's: tests/stacks/kv imported as a user would (a
    service, app_service.py, with its gate; three long-running workers, replica.py, writing their notes into the
    named volume; the check, check.py, reading them back while the service is up), $TMPDIR node-local-like."""
    require_root("a directory outside /tmp and /var/tmp")
    root = roots(elsewhere(runtime, secrets.token_hex(4)))
    config = import_test_stack(project, "kv", *(["--runtime", "charliecloud"] if runtime == "charliecloud" else []))
    if runtime != "none":  # each program in its image: here the test image (python3, as the Compose file's)
        place_images(project, config, require_apptainer() if runtime == "apptainer" else require_charliecloud())
    started = time.monotonic()
    done = run(project, runtime, {"TMPDIR": str(root)}, configfile=config)
    took = time.monotonic() - started
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    check_stack_ran(project, "kv")  # result.json success, the service stopped cleanly, the check's own line
    run_name = STACK["kv"][0]
    provenance = assert_verified_in(project, output, root, "$TMPDIR", runtime, run=run_name,
                                    verdict="your check passed, 1 service(s) stopped cleanly")
    assert {"kv", "kv-readiness", "worker-01", "worker-02", "worker-03"} <= set(provenance["components"])
    assert list(root.iterdir()) == [root / f"allocstack-{os.getuid()}"]
    assert not list((root / f"allocstack-{os.getuid()}").iterdir())  # nothing of the run is left in the root
    deadline = time.monotonic() + 10
    while pids_of_run(root, *RUNTIME_HELPERS) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not pids_of_run(root, *RUNTIME_HELPERS)
    print(f"{runtime}: your own stack with $TMPDIR {root}: VERIFIED in {took:.1f} s")


@pytest.mark.parametrize("runtime, kind, variable", [
    ("none", "read-only", "TMPDIR"),  # Snakemake would hand the jobs /tmp instead: refused before anything runs
    ("apptainer", "full", "SLURM_TMPDIR"),  # the launcher refuses on the host, before the image starts
    ("charliecloud", "read-only", "scratch"),  # config scratch: the same, before ch-run starts
])
def test_a_read_only_or_full_scratch_root_is_one_clear_line(project, roots, runtime, kind, variable):
    root = roots(Path(tempfile.mkdtemp(prefix=f"allocstack-{kind}-", dir="/var/tmp")), kind)
    env = {"TMPDIR": str(root)} if variable == "TMPDIR" else {}
    env.update({"SLURM_TMPDIR": str(root)} if variable == "SLURM_TMPDIR" else {})
    config = [f"scratch={root}"] if variable == "scratch" else []
    started = time.monotonic()
    done = run(project, runtime, env, *config)
    output = done.stdout + done.stderr
    assert done.returncode != 0
    words = {"read-only": "is read-only", "full": "is full"}[kind]
    said = {"TMPDIR": f"$TMPDIR {root} (the run's scratch root) {words}",
            "SLURM_TMPDIR": f"scratch root {root} ($SLURM_TMPDIR) {words}",
            "scratch": f"scratch root {root} (config scratch) {words}"}[variable]
    line = assert_one_line(output, f"allocstack: error [scratch]: {said}")
    if variable == "TMPDIR":  # refused as a bad configuration is: before Snakemake plans anything
        assert "allocstack: run baseline" not in output and not (project / "logs").exists()
    else:  # refused by the launchers on the host: the verdict says it
        assert line in output.split("allocstack: run baseline FAILED", 1)[1]
        assert "launch: coordinator: " not in (project / "logs/serve_coordinator/baseline.log").read_text()
    print(f"{runtime}, {kind} {variable}: refused after {time.monotonic() - started:.1f} s: {line}")


def test_charliecloud_says_in_one_line_which_mount_point_the_image_lacks(project, roots):
    """/local is not in the test image (a center adds its filesystems' mount points, container/README.md)."""
    require_root("a directory in /local")
    root = roots(Path("/local") / f"job{secrets.token_hex(4)}")
    done = run(project, "charliecloud", {"TMPDIR": str(root)})
    assert done.returncode != 0
    assert_one_line(done.stdout + done.stderr, "allocstack: error [prerequisite]: image ", "has no directory /local")


# -- an unprivileged user ------------------------------------------------------------------------------------

OTHER_USER = "allocstack-ch"  # the Charliecloud tests' second user (conftest.local_user makes it once)


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_an_unprivileged_user_with_tmpdir_elsewhere(tmp_path, roots, runtime):
    """As a plain user: $TMPDIR a directory of theirs outside /tmp. Apptainer needs root in this sandbox
    (shared/notes/apptainer.md: it fails on /dev/fuse as a normal user): said, not run."""
    user = local_user(OTHER_USER)
    probe = subprocess.run([SYSTEM_PYTHON, "-c", "import sys; print(sys.version_info[:2])"], capture_output=True,
                           text=True, check=False)
    if probe.stdout.strip() != str(sys.version_info[:2]):
        pytest.skip(f"{SYSTEM_PYTHON} is not Python {sys.version_info[0]}.{sys.version_info[1]} like the venv")
    if runtime == "apptainer":  # (not a missing part: the sandbox, CI's too, does not allow it)
        pytest.skip("Apptainer runs only as root in this sandbox (it fails on /dev/fuse as a normal user)")
    base, project, home = project_for_another_user("allocstack-user-")
    try:
        root = roots(elsewhere(runtime, secrets.token_hex(4)))
        for path in (project, home, root):
            subprocess.run(["chown", "-R", f"{user.pw_uid}:{user.pw_gid}", str(path)], check=True)
        args, _ = runtime_args(runtime)
        done = snakemake_as(OTHER_USER, project, "--cores", "4", *args,
                            env=user_environment(OTHER_USER, home, root, NO_APPTAINER_PATH))
        output = done.stdout + done.stderr
        assert done.returncode == 0, output[-4000:]
        provenance = json.loads((project / "results/baseline/provenance.json").read_text())
        assert Path(provenance["scratch"]["path"]).parent == root / f"allocstack-{user.pw_uid}"
        owned = root / f"allocstack-{user.pw_uid}"
        assert (owned.stat().st_uid, owned.stat().st_mode & 0o777) == (user.pw_uid, 0o700)
        assert not pids_mentioning(str(project))
    finally:
        shutil.rmtree(base, ignore_errors=True)


# -- the Slurm test cluster: the per-job directory of a prolog, and every row on three nodes -----------------

SINGLE_NODE = ["--default-resources", "slurm_account=allocstack", "slurm_partition=debug", "mem_mb=300",
               "runtime=10", "--retries", "0"]


def job_dirs_left(layout: dict | None, job: str) -> list[str]:
    """The prolog's directory of ``job`` wherever it may be left: the default node's, each namespaced node's."""
    places = [NODE_SCRATCH] + [Path(d) for d in (layout or {}).get("scratchDirs", {}).values()]
    return [str(place / f"job-{job}") for place in places if (place / f"job-{job}").exists()]


def the_job(output: str) -> str:
    [job] = re.findall(r"submitted with SLURM jobid (\d+)", output)
    return job


@pytest.mark.parametrize("runtime", ["none", "apptainer"])
def test_a_per_job_directory_made_by_the_prolog_on_one_node(tmp_path, runtime):
    require_job_tmpdir_prolog()
    project = copy_project(tmp_path / "project")
    args, env = runtime_args(runtime, "image=null" if runtime == "none" else "nodes=1")
    done = snakemake(project, "--profile", "profiles/slurm", *SINGLE_NODE, *args, timeout=600,
                     env={**env, JOB_TMPDIR_ENV: "TMPDIR"})
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    job = the_job(output)
    assert_verified_in(project, output, NODE_SCRATCH / f"job-{job}", "$TMPDIR", runtime)
    deadline = time.monotonic() + 30  # the epilog runs once the job ended
    while job_dirs_left(None, job) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not job_dirs_left(None, job)


def mount_on_nodes(layout: dict, path: Path, kind: str) -> None:
    """A read-only or full filesystem at ``path`` on every namespaced node (each node's own mount namespace)."""
    slurm_sh = Path(__file__).resolve().parent / "cluster" / "slurm.sh"
    options = "ro,size=1m" if kind == "read-only" else "size=1m"
    for node in layout["nodes"]:
        subprocess.run(["bash", str(slurm_sh), "exec", node, "sh", "-c",
                        f"mount -t tmpfs -o {options},mode=1777 tmpfs {path} && "
                        + ("true" if kind == "read-only" else f"(cat /dev/zero > {path}/filler 2>/dev/null; true)")],
                       check=True, timeout=60)


def unmount_on_nodes(layout: dict, path: Path) -> None:
    slurm_sh = Path(__file__).resolve().parent / "cluster" / "slurm.sh"
    for node in layout["nodes"]:
        subprocess.run(["bash", str(slurm_sh), "exec", node, "umount", "-l", str(path)], check=False, timeout=60)


@pytest.mark.multinode
@pytest.mark.parametrize("row, runtime", [
    ("tmp", "apptainer"),
    ("var-tmp", "charliecloud"),
    ("elsewhere", "none"),
    ("prolog", "charliecloud"),
    ("slurm-tmpdir", "apptainer"),
    ("full", "apptainer"),
])
def test_every_row_under_the_slurm_profile_on_the_three_multinode_nodes(multinode_project, roots, row, runtime):  # noqa: F811
    project, apptainer_image, layout = multinode_project
    token = secrets.token_hex(4)
    config = ["image=null"] if runtime == "none" else []
    if runtime == "charliecloud":
        config = ["runtime=charliecloud", f"image={require_charliecloud()}"]
    env: dict[str, str] = {"USER": os.environ.get("USER") or "root"}
    source, node_local = "$TMPDIR", False
    if row == "tmp":
        root = project / "tmp"  # under /tmp (the nodes share it here: the prolog's row is node-local)
    elif row == "var-tmp":
        root = roots(Path("/var/tmp") / f"allocstack-test-{token}")
    elif row == "elsewhere":
        root = roots(Path("/local") / f"job{token}")
    elif row in ("prolog", "slurm-tmpdir"):  # the prolog's per-job directory on each node, as $TMPDIR or as
        require_job_tmpdir_prolog()        # $SLURM_TMPDIR (centers name it either way; Slurm sets neither)
        root, node_local = None, True
        env[JOB_TMPDIR_ENV] = "TMPDIR" if row == "prolog" else "SLURM_TMPDIR"
        source = "$TMPDIR" if row == "prolog" else "$SLURM_TMPDIR"
    else:  # full, on every node (each node's own mount): the Snakemake in the job refuses it in one line
        root = roots(Path("/local") / f"full{token}")
        mount_on_nodes(layout, root, "full")
    if root is not None:
        env["TMPDIR"] = str(root)
    if runtime == "charliecloud":
        env["PATH"] = NO_APPTAINER_PATH
    args = cluster_args(layout, apptainer_image, *config)  # a later image= (or image=null) wins
    try:
        done = snakemake(project, *args, timeout=600, env=env)
    finally:
        if row == "full":
            unmount_on_nodes(layout, root)
    output = done.stdout + done.stderr
    if row == "full":
        assert done.returncode != 0
        assert_one_line(output, "allocstack: error [scratch]: $TMPDIR ", str(root), "is full")
        return
    assert done.returncode == 0, output[-4000:]
    job = the_job(output)
    if node_local:
        root = NODE_SCRATCH / f"job-{job}"
    assert_verified_in(project, output, root, source, runtime)
    provenance = json.loads((project / "results/baseline/provenance.json").read_text())
    assert {c["host"] for name, c in provenance["components"].items() if name.startswith("worker")} == \
        set(layout["nodes"])
    if node_local:  # each node's own directory, made by its prolog: the epilog removes it at the job's end
        deadline = time.monotonic() + 30
        while job_dirs_left(layout, job) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not job_dirs_left(layout, job), "the epilog removes the job's directory on every node"
