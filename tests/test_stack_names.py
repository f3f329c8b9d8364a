"""Service names as in Compose (issue 32, point 2): a stack whose programs find their service by its Compose name,
its ``hostname:`` and a network alias written in a CONFIG FILE (tests/stacks/names), imported with ``--no-hostnames``
(every value as written), verifies without an image, in Apptainer, in Charliecloud and through the Slurm profile:
each name resolves through the stack's hosts file (allocstack/launch/hostsfile.py), bound at /etc/hosts in each
image and, without one, in a mount namespace of the program's own (allocstack/launch/privatenames.py). The node's
own /etc/hosts is the same byte for byte afterwards, and none of the names resolves outside the stack's programs.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from test_compose_stacks import free_port
from test_multinode import cluster_args
from test_own_service import SERVICE
from test_slurm import TEST_RESOURCES, the_stack_job

from allocstack.common.namespaces import user_namespaces
from allocstack.launch.hostsfile import write_hosts
from allocstack.launch.program import names_preexec, run_program
from conftest import ensure_other_user, make_tasks, pids_of_run, run_script, write_json, write_tasks_and_expected
from real_parts import require_apptainer, require_charliecloud, require_multinode, require_slurm
from workflow_helpers import ROOT, copy_project, snakemake

NAMES = ("kv", "keyvalue", "queue")
RESOLVED = "names resolved: keyvalue -> 127.0.0.1, kv -> 127.0.0.1, queue -> 127.0.0.1"


@pytest.fixture
def project(tmp_path):
    workdir = copy_project(tmp_path / "project")
    before = Path("/etc/hosts").read_bytes()
    yield workdir
    assert Path("/etc/hosts").read_bytes() == before  # the node's own file, untouched
    leftovers = pids_of_run(workdir, "Apptainer runtime parent", "squashfuse")
    for pid in leftovers:
        os.kill(pid, signal.SIGKILL)
    assert not leftovers, f"processes of the run left on the node: {leftovers}"


def resolves_here(name: str) -> bool:
    try:
        socket.gethostbyname(name)
    except OSError:
        return False
    return True


def import_names(project: Path, runtime: str = "apptainer", run: str = "names") -> str:
    """Copy tests/stacks/names (and tests/stacks/kv: its service's and workers' programs) with a free port in the Compose file and in the
    settings file, import it with ``--no-hostnames``; the config's path."""
    for stack in ("names", "kv"):
        shutil.copytree(ROOT / "tests" / "stacks" / stack, project / "stacks" / stack)
    port = str(free_port())
    for path in (project / "stacks/names/compose.yaml", project / "stacks/names/app/settings.ini"):
        path.write_text(path.read_text().replace("8080", port))
    extra = ["--runtime", "charliecloud"] if runtime == "charliecloud" else []
    done = run_script("import_compose.py", "stacks/names/compose.yaml", "--no-hostnames", "--output",
                      f"config/{run}.yaml", "--run", run, *extra, cwd=project)
    assert done.returncode == 0 and "0 gap(s)" in done.stdout, done.stdout + done.stderr
    assert "values are left as written (--no-hostnames)" in done.stdout
    config = (project / f"config/{run}.yaml").read_text()
    assert "ALLOCSTACK_KV_HOST" not in config and "hostnames: [keyvalue, queue]" in config
    return f"config/{run}.yaml"


def place_test_image(project: Path, runtime: str, run: str) -> None:
    """The test image (python3 on Debian) where the import expects ``build: ./app``'s image, with its sidecar."""
    (project / "images").mkdir(exist_ok=True)
    if runtime == "apptainer":
        image = require_apptainer()
        (project / f"images/{run}-app.sif").symlink_to(image)
        digest = Path(f"{image}.sha256").read_text().split()[0]
        (project / f"images/{run}-app.sif.sha256").write_text(f"{digest}  {run}-app.sif\n")
    else:
        target = project / f"images/{run}-app"
        shutil.copytree(require_charliecloud(), target, symlinks=True)
        assert run_script("image_digest.py", target).returncode == 0


def check_names_resolved(project: Path, run: str, output: str, how: str = "bound at /etc/hosts in each image") -> None:
    assert json.loads((project / f"results/{run}/result.json").read_text())["status"] == "success", output[-4000:]
    record = (project / f"results/{run}/decision-record.md").read_text()
    assert "service names (Compose's names, hostnames and aliases)" in record and how in record, record
    assert RESOLVED in (project / f"logs/run_check/{run}.log").read_text()
    assert "jobs through http://queue:" in (project / f"logs/run_worker/{run}/worker-01.log").read_text()
    assert not any(resolves_here(name) for name in NAMES)


def test_names_in_a_config_file_resolve_without_an_image(project):
    config = import_names(project)
    done = snakemake(project, "--cores", "4", "--configfile", config)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    check_names_resolved(project, "names", output, "a mount namespace of its own")


@pytest.mark.apptainer
def test_names_in_a_config_file_resolve_in_apptainer(project):
    config = import_names(project)
    place_test_image(project, "apptainer", "names")
    done = snakemake(project, "--cores", "4", "--sdm", "apptainer", "--configfile", config)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    check_names_resolved(project, "names", output)
    assert "/hosts:/etc/hosts:ro" in (project / "logs/serve_service/names/kv.log").read_text()


@pytest.mark.charliecloud
def test_names_in_a_config_file_resolve_in_charliecloud(project):
    config = import_names(project, "charliecloud", "names-ch")
    place_test_image(project, "charliecloud", "names-ch")
    done = snakemake(project, "--cores", "4", "--configfile", config)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    check_names_resolved(project, "names-ch", output)
    assert "/hosts:/etc/hosts" in (project / "logs/serve_service/names-ch/kv.log").read_text()


@pytest.mark.slurm
@pytest.mark.apptainer
def test_names_in_a_config_file_resolve_through_the_slurm_profile(project):
    require_slurm()
    config = import_names(project)
    place_test_image(project, "apptainer", "names")
    done = snakemake(project, "--profile", "profiles/slurm", *TEST_RESOURCES, "runtime=10", "--configfile", config,
                     timeout=600)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    the_stack_job(output, project)
    check_names_resolved(project, "names", output)


def test_a_name_resolves_only_inside_the_program(tmp_path):
    """Without an image: the program sees the stack's hosts file at /etc/hosts; this process, before and after, and
    the node's /etc/hosts do not change."""
    before = Path("/etc/hosts").read_bytes()
    hosts = write_hosts(tmp_path, {"kv": ["keyvalue", "queue"]})
    done = run_program(["getent", "hosts", "queue"], preexec=names_preexec(hosts, "test"))
    assert done.returncode == 0 and done.stdout.split()[:2] == [b"127.0.0.1", b"kv"], done.text()
    assert subprocess.run(["getent", "hosts", "queue"], capture_output=True, check=False).returncode != 0
    assert not resolves_here("queue")
    assert Path("/etc/hosts").read_bytes() == before


#: A per-task program that finds the service by a name in a settings file (not its variables), and says how it
#: resolved that name.
PER_TASK = """
import configparser, json, os, socket, sys, urllib.request
settings = configparser.ConfigParser()
settings.read(sys.argv[1])
url = settings["app"]["url"]
word = json.load(sys.stdin)["message"]
request = urllib.request.Request(url + "/word/" + word,
                                 headers={"Authorization": "Bearer " + os.environ["ALLOCSTACK_APP_TOKEN"]})
value = json.load(urllib.request.urlopen(request, timeout=5))["value"]
sys.stdout.write(value + " " + socket.gethostbyname("shouter"))
"""


def test_per_task_programs_find_a_service_by_a_name_in_their_settings(project):
    """Per-task programs without an image (worker.py runs each one): the service's alias in a settings file."""
    write_tasks_and_expected(project, "names", make_tasks(6, message="w"),
                             lambda payload: payload["message"].upper() + " 127.0.0.1")
    (project / "apps").mkdir()
    (project / "apps/service.py").write_text(SERVICE)
    (project / "apps/client.py").write_text(PER_TASK)
    port = free_port()
    (project / "apps/settings.ini").write_text(f"[app]\nurl = http://shouter:{port}\n")
    python = json.dumps(sys.executable)
    (project / "config/names.yaml").write_text(
        f"run: names\ntasks: inputs/names.json\nexpected: expected/names.json\n"
        f"services:\n  app:\n    command: [{python}, apps/service.py]\n    port: {port}\n    hostnames: [shouter]\n"
        f"    readiness: {{mode: http, path: /health, expect: {{status: ok}}}}\n"
        f"worker: {{command: [{python}, apps/client.py, apps/settings.ini]}}\n")
    done = snakemake(project, "--cores", "4", "--configfile", "config/names.yaml")
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    assert json.loads((project / "results/names/result.json").read_text())["status"] == "success"
    assert not resolves_here("shouter")


#: A per-task program that reaches the service by its alias: the address from the stack's hosts file, the port from
#: its variables (off the first node, the tunnel's local end listens on a port of its own).
BY_ALIAS = """
import json, os, socket, sys, urllib.request
from urllib.parse import urlsplit
port = urlsplit(os.environ["ALLOCSTACK_APP_ENDPOINT"]).port
word = json.load(sys.stdin)["message"]
request = urllib.request.Request(f"http://shouter:{port}/word/{word}",
                                 headers={"Authorization": "Bearer " + os.environ["ALLOCSTACK_APP_TOKEN"]})
sys.stdout.write(json.load(urllib.request.urlopen(request, timeout=5))["value"] + " " + socket.gethostbyname("shouter"))
"""


@pytest.mark.multinode
@pytest.mark.slurm
@pytest.mark.apptainer
def test_multinode_workers_on_three_nodes_reach_the_service_by_its_alias(tmp_path):
    """Workers on each of three nodes (per-task, in Apptainer) find the service by its alias: the hosts file is
    written on every node (node_scratch.py) and bound in each image; off the first node the name is the local end
    of the service's TLS tunnel."""
    layout, image = require_multinode(), require_apptainer()
    project = copy_project(tmp_path / "project")
    document = {"schemaVersion": 1, "tasks": [{"id": f"task-{i:04d}", "payload": {"message": f"w{i}"}}
                                              for i in range(24)]}
    outputs = [(task["id"], task["payload"]["message"].upper() + " 127.0.0.1") for task in document["tasks"]]
    write_json(project / "inputs/names.json", document)
    write_json(project / "expected/names.json", {"schemaVersion": 1, "results": [
        {"taskId": task, "output": output, "sha256": hashlib.sha256(output.encode()).hexdigest()}
        for task, output in outputs]})
    (project / "apps").mkdir()
    (project / "apps/service.py").write_text(SERVICE)
    (project / "apps/client.py").write_text(BY_ALIAS)
    (project / "config/names.yaml").write_text(
        "run: names\ntasks: inputs/names.json\nexpected: expected/names.json\nsimulate: {task_seconds: 0.5}\n"
        "worker: {batch: 2, command: [python3, apps/client.py]}\n"
        "services: {app: {command: [python3, apps/service.py], hostnames: [shouter], "
        "readiness: {mode: http, path: /health, expect: {status: ok}}}}\n"
        f"apptainer: {{binds: [{project / 'apps'}]}}\n")
    done = snakemake(project, "--configfile", "config/names.yaml", *cluster_args(layout, image), timeout=600)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    assert json.loads((project / "results/names/result.json").read_text())["status"] == "success"
    events = [json.loads(line) for line in (project / "results/names/events.jsonl").read_text().splitlines()]
    assert len({event["node"] for event in events if event["event"] == "worker-start"}) == 3


#: Run by another, unprivileged user: a program started as allocstack starts one without an image.
AS_A_USER = """
import sys
sys.path.insert(0, sys.argv[1])
from pathlib import Path
from allocstack.launch.program import names_preexec, run_program
done = run_program(["getent", "hosts", "queue"], preexec=names_preexec(Path(sys.argv[2]), "test"))
sys.stdout.write(done.text())
sys.exit(done.returncode)
"""


def test_a_user_without_privileges_gets_the_names_in_a_user_namespace_of_the_same_ids():
    """Not root: the program's own user namespace (mapping the user's uid and gid to themselves) and mount
    namespace, where the kernel allows unprivileged user namespaces (this machine's does)."""
    user = ensure_other_user()
    if not user_namespaces()[0]:
        pytest.skip(f"this kernel allows no unprivileged user namespaces ({user_namespaces()[1]})")
    holder = Path(tempfile.mkdtemp(prefix="allocstack-names-"))  # the other user reads the script and the file
    try:
        holder.chmod(0o755)
        hosts = write_hosts(holder, {"kv": ["keyvalue", "queue"]})
        (holder / "as_a_user.py").write_text(AS_A_USER)
        done = subprocess.run(["runuser", "-u", user, "--", "/usr/bin/python3", str(holder / "as_a_user.py"),
                               str(ROOT / "workflow/scripts"), str(hosts)], capture_output=True, text=True,
                              timeout=60, cwd="/", check=False)
    finally:
        shutil.rmtree(holder)
    assert done.returncode == 0 and done.stdout.split()[:2] == ["127.0.0.1", "kv"], done.stdout + done.stderr
    assert not resolves_here("queue")
