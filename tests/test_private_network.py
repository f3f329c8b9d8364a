"""The stack's own network (config ``network.isolation: private``, issue 32 point 1): a service of yours that binds
``0.0.0.0`` is reached by the stack alone.

Real runs of a small stack of yours (`snakemake --cores 4`, and the Slurm profile with Apptainer and with
Charliecloud): a queue service of two replicas, each listening on every address at the same fixed port in a network
of its own (issue 25 point 4b), two long-running workers that reach it by its name from a URL in a file (the
stack's hosts file) through its front, one worker each replica, and a check. While it runs, probes outside the stack try
that port on every address of the node, as root, as a second real user of the node, and (under Slurm) from a second
node of the test cluster: not one connects, while the workers get their answers. The same stack with
``isolation: none`` is the control: there the probes connect. The queue service also fetches a token from a server
the test runs on the node's own loopback, outside the stack (pasta's way out: the namespace's default gateway is
the node's loopback), and the workers' outputs carry it.
"""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from test_compose_stacks import free_port
from test_multinode import cluster_args
from test_own_service import SERVICE as OWN_SERVICE
from test_serve_mode import PYTHON, WEB, ctrl_c, serve_config, start, status_of, wait_for_up
from test_slurm import TEST_RESOURCES
from test_stack_names import PER_TASK

from conftest import OTHER_USER, local_user, make_tasks, pids_mentioning, wait_for, write_tasks_and_expected
from real_parts import require_apptainer, require_charliecloud_squashfs, require_multinode, require_slurm, unavailable
from workflow_helpers import (
    SNAKEMAKE,
    ask,
    copy_project,
    killed_at_the_end,
    project_for_another_user,
    snakemake,
    snakemake_as,
    user_environment,
)

SLURM_SH = Path(__file__).resolve().parent / "cluster" / "slurm.sh"

#: The queue's port: fixed, so that the probes know it before it listens (in the private network no other
#: program of the node can take it from the stack, nor the stack from them). The control on the node's own network
#: takes a free one instead (CI of fa8d86d: its queue on this port was what another test's probes reached).
PORT = 17431

SERVICE = """\
import os, signal, sys, urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

def default_gateway():
    for line in open("/proc/net/route").read().splitlines()[1:]:
        fields = line.split()
        if fields[1] == "00000000":
            return ".".join(str(int(fields[2][i:i + 2], 16)) for i in (6, 4, 2, 0))
    raise SystemExit("no default route in the stack's network")

# In the private network the node's own loopback is the default gateway's address (pasta); on the node's network
# it is 127.0.0.1
outside = default_gateway() if sys.argv[2] == "private" else "127.0.0.1"
token = urllib.request.urlopen(f"http://{outside}:{sys.argv[1]}/token", timeout=20).read()

class Queue(BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Length", str(len(token)))
        self.end_headers()
        self.wfile.write(token)

    def log_message(self, *args):
        sys.stderr.write(f"queue replica {os.environ['ALLOCSTACK_REPLICA']} answered\\n")

signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # a clean stop, as a queue server's own
ThreadingHTTPServer(("0.0.0.0", int(os.environ["ALLOCSTACK_QUEUE_PORT"])), Queue).serve_forever()
"""

WORKER = """\
import os, sys, time, urllib.request
url = open(sys.argv[1]).read().strip()
body = urllib.request.urlopen(url, timeout=20).read().decode()
with open(os.path.join(sys.argv[2], os.environ["ALLOCSTACK_WORKER_ID"]), "w") as out:
    out.write(f"{time.time()} {body}")
time.sleep(4)  # the service stays up meanwhile: the probes outside try it
"""

CHECK = """\
import pathlib, sys
outputs = sorted(pathlib.Path(sys.argv[1]).iterdir())
assert len(outputs) == 2 and all(path.read_text().endswith(sys.argv[2]) for path in outputs), outputs
"""

CONFIG = """\
run: {run}
tasks: null
expected: null
workers: 2
network:
  isolation: {isolation}
services:
  queue:
    command: [python3, {service}, "{outside}", {isolation}]
    port: {port}
    readiness: {{mode: tcp}}
    replicas: {replicas}
worker:
  mode: long-running
  command: [python3, {worker}, {url_file}, {outputs}]
verify:
  command: [python3, {check}, {outputs}, "{token}"]
"""

#: Tries ``PORT`` on each address given, every 50 ms, until the file ``stop`` exists (at most 600 s); then prints
#: one JSON line per try: the time, the address, whether it connected (kept until then: a pipe nobody reads while
#: the run goes would fill and stop the probing).
PROBE = """\
import json, os, socket, sys, time
stop, port, addresses = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
deadline, tries = time.time() + 600, []
while not os.path.exists(stop) and time.time() < deadline:
    for address in addresses:
        with socket.socket() as probe:
            probe.settimeout(0.2)
            connected = probe.connect_ex((address, port)) == 0
        tries.append({"t": time.time(), "address": address, "connected": connected})
    time.sleep(0.05)
print("\\n".join(json.dumps(one) for one in tries), flush=True)
"""


def node_addresses() -> list[str]:
    """Every IPv4 address of this node (loopback first), as `ip` lists them."""
    listing = subprocess.run(["ip", "-4", "-o", "addr", "show"], capture_output=True, text=True, check=True).stdout
    return sorted({line.split()[3].split("/")[0] for line in listing.splitlines()}, key=lambda a: a != "127.0.0.1")


class Outside:
    """A server on the node's own loopback, outside the stack: it hands out ``token`` at ``/token``."""

    def __init__(self, token: str) -> None:
        self.directory = Path(tempfile.mkdtemp(prefix="allocstack-outside-"))
        (self.directory / "token").write_text(token)
        handler = functools.partial(SimpleHTTPRequestHandler, directory=str(self.directory))
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        shutil.rmtree(self.directory, ignore_errors=True)


def write_stack(project: Path, run: str, isolation: str, outside: Outside, token: str, port: int = PORT) -> Path:
    """The stack; in the private network its queue has two replicas (on the node's own network they would share its
    port: one)."""
    programs = project / "programs"
    programs.mkdir(exist_ok=True)
    for name, text in (("service.py", SERVICE), ("worker.py", WORKER), ("check.py", CHECK)):
        (programs / name).write_text(text)
    outputs = project / "outputs" / run
    outputs.mkdir(parents=True)
    url_file = project / "inputs" / "queue-url.txt"  # a service address in a file, by its name, as written
    url_file.write_text(f"http://queue:{port}/\n")
    config = project / "config" / f"{run}.yaml"
    config.write_text(CONFIG.format(run=run, isolation=isolation, service=programs / "service.py",
                                    outside=outside.port, port=port, worker=programs / "worker.py",
                                    url_file=url_file, outputs=outputs, check=programs / "check.py", token=token,
                                    replicas=2 if isolation == "private" else 1))
    return config


def start_probe(stop: Path, addresses: list[str], as_user: str | None = None, node: str | None = None,
                port: int = PORT):
    argv = [sys.executable if as_user is None and node is None else "/usr/bin/python3", "-c", PROBE, str(stop),
            str(port), *addresses]
    if as_user is not None:
        argv = ["runuser", "-u", as_user, "--", *argv]
    if node is not None:
        argv = ["bash", str(SLURM_SH), "exec", node, *argv]
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd="/")


def probes_of(process: subprocess.Popen) -> list[dict]:
    output, errors = process.communicate(timeout=60)
    tries = [json.loads(line) for line in output.splitlines() if line.startswith("{")]
    assert tries, f"the probe tried nothing: {errors[-2000:]}"
    return tries


def while_up(tries: list[dict], outputs: Path) -> list[dict]:
    """The tries made while the queue was up and the workers at work: after the first worker got its answer and
    before the last one ended (each writes when it got it, then stays 4 s)."""
    got = [float(path.read_text().split()[0]) for path in outputs.iterdir()]
    assert got, "no worker got an answer"
    return [one for one in tries if min(got) <= one["t"] <= max(got) + 3.5]


def run_probed(project: Path, config: Path, run: str, args: tuple[str, ...], probers: dict, env=None, timeout=600,
               runner=None, port: int = PORT):
    """Run the stack while each prober of ``probers`` (name -> (addresses, user, node)) tries the queue's port;
    return the run and each prober's tries while the queue was up."""
    where = Path(tempfile.mkdtemp(prefix="allocstack-probes-", dir="/tmp"))
    os.chmod(where, 0o755)  # noqa: S103  (a probe of another user, or on another node, looks for the stop file)
    stop = where / "stop"
    probes = {name: start_probe(stop, addresses, user, node, port) for name, (addresses, user, node) in probers.items()}
    try:
        done = (runner or snakemake)(project, *args, "--configfile", str(config), env=env, timeout=timeout)
    finally:
        stop.touch()
        tries = {name: probes_of(process) for name, process in probes.items()}
        shutil.rmtree(where, ignore_errors=True)
    outputs = project / "outputs" / run
    return done, {name: while_up(found, outputs) if list(outputs.iterdir()) else found
                  for name, found in tries.items()}


def assert_each_replica_answered(project: Path, run: str) -> None:
    """The queue's two replicas each answered one worker (the front takes them in turn), each in a network of its
    own that the stack's network job made."""
    for name, k in (("queue", 1), ("queue-replica-2", 2)):
        log = (project / f"logs/serve_service/{run}/{name}.log").read_text()
        assert log.count(f"queue replica {k} answered") == 1, log[-2000:]
        assert f"replica {name}: holder" in (project / f"logs/stack_network/{run}.log").read_text()


def assert_verified(done, project: Path, run: str) -> str:
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-5000:]
    assert json.loads((project / f"results/{run}/result.json").read_text())["status"] == "success"
    return output


@pytest.fixture(autouse=True)
def able_node():
    """pasta installed and user namespaces allowed (tests/cluster/prepare.sh installs passt), else skipped with why
    (a failure in CI: ALLOCSTACK_REQUIRE_CLUSTER=1)."""
    from allocstack.common.namespaces import user_namespaces

    if shutil.which("pasta") is None:
        unavailable("no pasta (as root: tests/cluster/prepare.sh installs Debian's passt)")
    possible, why = user_namespaces()
    if not possible:
        unavailable(f"this machine does not let users make user namespaces ({why})")


@pytest.fixture
def outside():
    token = f"from-outside-{os.getpid()}-{time.monotonic_ns()}"
    server = Outside(token)
    yield server, token
    server.close()


@pytest.fixture
def other_user_name() -> str:
    return local_user(OTHER_USER).pw_name


def test_a_service_on_every_address_is_reached_by_the_stack_alone_and_by_no_one_else(project, outside,
                                                                                    other_user_name):
    """Locally (no image, as root): the probes of root and of a second user on every address of the node never
    connect while the workers reach the queue by its name; the stack reaches a server outside it. The control
    (isolation none, the same stack): the probes connect."""
    server, token = outside
    addresses = node_addresses()
    probers = {"root": (addresses, None, None), "another user": (addresses, other_user_name, None)}
    config = write_stack(project, "private", "private", server, token)
    done, tries = run_probed(project, config, "private", ("--cores", "4"), probers)
    output = assert_verified(done, project, "private")
    assert_each_replica_answered(project, "private")
    for name, found in tries.items():
        assert len(found) >= 20, (name, len(found))  # the probes ran while the queue served the workers
        assert not [one for one in found if one["connected"]], (name, [one for one in found if one["connected"]][:3])
    network_log = (project / "logs/stack_network/private.log").read_text()
    assert "the stack's private network is up" in network_log, network_log
    assert "listens on 0.0.0.0" not in output or "in the stack's private network" in output
    assert "warning: service queue listens on" not in output, output[-3000:]

    # On the node's own network the queue's port is the node's: one no other test uses (not PORT, which the
    # private stacks of the tests beside this one use, each in its own network)
    port = free_port()
    control = write_stack(project, "shared", "none", server, token, port)
    done, tries = run_probed(project, control, "shared", ("--cores", "4"), probers, port=port)
    output = assert_verified(done, project, "shared")
    for name, found in tries.items():
        assert [one for one in found if one["connected"]], name  # on the node's own network: everyone gets in
    assert "warning: service queue listens on 0.0.0.0" in output


def test_a_user_without_privileges_gets_the_same_private_network(outside, other_user_name):
    """As a plain user (the uid and gid mapped to themselves in a user namespace: what runs is still that user),
    while root probes every address: nothing connects, the files written are the user's."""
    server, token = outside
    user = local_user(other_user_name)
    base, project, home = project_for_another_user("allocstack-private-")
    try:
        config = write_stack(project, "mine", "private", server, token)
        for path in (project, home):
            subprocess.run(["chown", "-R", f"{user.pw_uid}:{user.pw_gid}", str(path)], check=True)
        env = user_environment(user.pw_name, home, project / "tmp", "/usr/local/bin:/usr/bin:/bin")

        def as_user(project: Path, *args: str, env=None, timeout=300):
            return snakemake_as(user.pw_name, project, *args, env=env, timeout=timeout)

        done, tries = run_probed(project, config, "mine", ("--cores", "4"), {"root": (node_addresses(), None, None)},
                                 env=env, runner=as_user)
        assert_verified(done, project, "mine")
        assert_each_replica_answered(project, "mine")
        assert len(tries["root"]) >= 20 and not [one for one in tries["root"] if one["connected"]]
        assert (project / "results/mine/result.json").stat().st_uid == user.pw_uid
        outputs = list((project / "outputs/mine").iterdir())
        assert outputs and all(path.stat().st_uid == user.pw_uid for path in outputs)
        assert not pids_mentioning(str(project))
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.mark.slurm
@pytest.mark.multinode
@pytest.mark.parametrize("runtime", ["apptainer", "charliecloud"])
def test_under_the_slurm_profile_in_images_no_user_or_multinode_node_gets_in(project, outside, other_user_name,
                                                                              runtime):
    """The same stack under the Slurm profile, every component a job step in the image (Apptainer, or ch-run)
    entered into the stack's namespace: root, a second user and a second node of the cluster (its probes to this
    node's address on the cluster's bridge) never connect. With the multi-node tests (its probe runs on the first node
    of their set, where their checks for leftovers look: CI of 753db33)."""
    require_slurm()
    layout = require_multinode(1)
    image = require_apptainer() if runtime == "apptainer" else require_charliecloud_squashfs()
    server, token = outside
    config = write_stack(project, "jobs", "private", server, token)
    with config.open("a") as handle:
        handle.write(f"image: {image}\nruntime: {runtime}\n")
    addresses = node_addresses()
    node = min(layout["nodes"])
    probers = {"root": (addresses, None, None), "another user": (addresses, other_user_name, None),
               "another node": ([layout["controller"]["address"]], None, node)}
    done, tries = run_probed(project, config, "jobs", ("--profile", "profiles/slurm", *TEST_RESOURCES), probers)
    assert_verified(done, project, "jobs")
    assert_each_replica_answered(project, "jobs")
    for name, found in tries.items():
        assert len(found) >= 10, (name, len(found))
        assert not [one for one in found if one["connected"]], name
    coordinator_free = (project / "logs/serve_service/jobs/queue.log").read_text()
    assert "srun --job-name=queue" in coordinator_free and "nsenter --target=" in coordinator_free


#: A web service on every address of its namespace (as most images' servers listen), with a health page.
EVERY_ADDRESS_WEB = WEB.replace("http.server.HTTPServer(('127.0.0.1', port), H)", "http.server.HTTPServer(('0.0.0.0', port), H)")


def test_a_serving_stack_is_reached_through_its_owner_only_socket_and_by_no_one_else(project, other_user_name):
    """Serve mode in the stack's private network: the UP line names each service's socket in the run's 0700
    scratch and the SSH line that forwards a port to it; through it the owner gets the page; a second user cannot
    open it; no probe of the service's port on any address connects; status.py (run outside, as the owner) enters
    the stack's network to ask; Ctrl-C ends it as a success."""
    assert "0.0.0.0" in EVERY_ADDRESS_WEB  # noqa: S104 - on purpose: what the namespace keeps to the stack
    config = serve_config(project, "srvpriv", f"""
web:
  command: [{PYTHON}, -c, {json.dumps(EVERY_ADDRESS_WEB)}]
  readiness: {{mode: http, path: /health, expect: {{status: ok}}}}
""", "network: {isolation: private}")
    seen: list[str] = []
    with killed_at_the_end(start(project, config)) as run:
        line = wait_for_up(run, seen, then="allocstack:   web: ")
        sock = re.search(r"web: (\S+\.sock) \(only you can use it", line).group(1)
        # SCRATCH/ports/web.sock, or (this test's scratch path is too long for a socket) a 0700 directory in /tmp
        assert Path(sock).name == "web.sock" and Path(sock).stat().st_mode & 0o777 == 0o600, line
        assert Path(sock).parent.stat().st_mode & 0o777 == 0o700 and Path(sock).parent.stat().st_uid == os.getuid()
        assert "-L " in line and f":{sock} " in line, line  # ssh -N -L PORT:SOCKET NODE
        assert ask(sock, "/hello") == (200, b'{"status": "ok", "served": "hello"}')
        port = int(json.loads((project / "results/srvpriv/up.json").read_text())["services"]["web"]["url"]
                   .rsplit(":", 1)[1])
        for address in node_addresses():
            with socket.socket() as probe:
                probe.settimeout(1)
                assert probe.connect_ex((address, port)) != 0, address
        stranger = subprocess.run(
            ["runuser", "-u", other_user_name, "--", "/usr/bin/python3", "-c",
             ("import socket, sys\ns = socket.socket(socket.AF_UNIX)\n"
              "try:\n    s.connect(sys.argv[1]); print('connected')\nexcept OSError as e: print(type(e).__name__)"),
             sock], capture_output=True, text=True, timeout=30, check=False)
        assert stranger.stdout.strip() == "PermissionError", stranger
        status = status_of(project, "srvpriv")
        assert "allocstack: run srvpriv is UP since" in status.stdout, status
        output = ctrl_c(run, seen)
    assert run.returncode == 0, output[-3000:]
    marker = json.loads((project / "results/srvpriv/result.json").read_text())
    assert marker["status"] == "success" and marker["endedBy"] == "interrupt"


def test_the_status_page_and_status_of_a_private_stack_are_its_owners(project):
    """The built-in coordinator in the stack's private network: its status page line is the SSH line to its
    socket, `status.py` asks it from inside the stack's network while it runs, `status.py --url` prints the same
    way in."""
    (project / "config/page.yaml").write_text("run: page\nnetwork: {isolation: private}\nsimulate: {task_seconds: 1}\n")
    with killed_at_the_end(subprocess.Popen([SNAKEMAKE, "--cores", "4", "--configfile", "config/page.yaml"], cwd=project, text=True,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
                           env={**os.environ, "TMPDIR": str(project / "tmp")})) as run:
        log = project / "logs/serve_coordinator/page.log"
        deadline = time.monotonic() + 60
        while "status page:" not in (log.read_text() if log.exists() else ""):
            assert time.monotonic() < deadline and run.poll() is None, "no status page line"
            time.sleep(0.05)
        page = next(line for line in log.read_text().splitlines() if "status page:" in line)
        assert re.search(r"ssh (-J \S+ )?-N -L \d+:/\S+/coordinator\.sock ", page), page
        status, url = status_of(project, "page"), status_of(project, "page", "--url")
        output, _ = run.communicate(timeout=300)
    assert run.returncode == 0, output[-3000:]
    assert status.returncode == 0 and ": running" in status.stdout and "leased" in status.stdout, status
    assert "/coordinator.sock " in url.stdout, url


def test_a_failed_run_leaves_nothing_of_its_private_network_running(project):
    """Snakemake SIGKILLs the jobs of a failed run, the network's holder among them: its pasta and the helper that
    keeps the published ports' sockets end with it (before, every failed private run left both running: 20 of the
    suite's failing runs did so when `private` was tried as the default)."""
    (project / "config/broken.yaml").write_text("run: broken\nnetwork: {isolation: private}\n"
                                                "worker: {command: [/nonexistent/program]}\n")
    done = snakemake(project, "--cores", "4", "--configfile", "config/broken.yaml")
    assert done.returncode != 0 and "worker.command" in done.stdout + done.stderr, (done.stdout + done.stderr)[-3000:]
    holder = (project / "logs/stack_network/broken.log").read_text()
    assert "the stack's private network is up" in holder, holder
    pasta_pid_file = re.search(r"--pid (\S+)", holder).group(1)
    assert pasta_pid_file.startswith(str(project / "tmp")), pasta_pid_file  # so the fixture's own check sees it too
    wait_for(lambda: not pids_mentioning(pasta_pid_file) and not pids_mentioning(str(project)), timeout=10,
             what=f"the failed run's processes to end: {pids_mentioning(str(project))}")


def test_a_stack_without_services_and_a_check_after_collection_run_in_the_private_network(project):
    """Two shapes whose jobs the private network alone puts in one group: your workers, an init job and a check with no
    service (the workers wait for the init job's record, the check for theirs, each itself), and the built-in coordinator's verify.command with volumes,
    which runs after collection, once the network has ended (on the node's own network: it reads files)."""
    here = os.readlink("/proc/self/ns/net")  # the workers and the check are in one network, not this one
    (project / "config/bare.yaml").write_text(
        "run: bare\ntasks: null\nexpected: null\nworkers: 2\nnetwork: {isolation: private}\nvolumes: [out]\n"
        "init_jobs: [setup]\nservices: {setup: {command: [sh, -c, 'touch $ALLOCSTACK_VOLUME_OUT/set-up']}}\n"
        "worker: {mode: long-running, command: [sh, -c, 'readlink /proc/self/ns/net > $ALLOCSTACK_VOLUME_OUT/$ALLOCSTACK_WORKER_ID']}\n"
        "verify: {command: [sh, -c, 'test $(sort -u $ALLOCSTACK_VOLUME_OUT/worker-0[12]) = $(readlink /proc/self/ns/net) && test -e $ALLOCSTACK_VOLUME_OUT/set-up"
        f" && test $(readlink /proc/self/ns/net) != {here}']}}\n")
    assert_verified(snakemake(project, "--cores", "4", "--configfile", "config/bare.yaml"), project, "bare")
    (project / "config/late.yaml").write_text(
        "run: late\nnetwork: {isolation: private}\nvolumes: [cache]\nsimulate: {task_seconds: 0}\n"
        "verify: {command: [sh, -c, 'test -d \"$ALLOCSTACK_VOLUME_CACHE\" && test -s \"$ALLOCSTACK_RESULTS\"']}\n")
    assert_verified(snakemake(project, "--cores", "4", "--configfile", "config/late.yaml"), project, "late")


def in_a_node_without_user_namespaces(*argv: str) -> list[str]:
    """``argv`` as on a center that disables user namespaces: in a user and network namespace of its own (this user
    as root in it, its loopback alone, up) whose ``user.max_user_namespaces`` is 0, so neither root nor anyone else
    can make one inside it (unshare(2): ENOSPC)."""
    script = 'ip link set lo up && echo 0 > /proc/sys/user/max_user_namespaces && exec "$@"'
    return ["unshare", "--user", "--map-root-user", "--net", "sh", "-c", script, "sh", *argv]


def test_where_user_namespaces_are_off_private_is_refused_up_front_and_none_names_what_listens(project):
    """Point 5: the default, ``network.isolation: private``, is one line before anything runs; with ``none`` (set by
    the user) the stack runs on the node's network, and the service it finds listening on every address is named in a
    warning and in the decision record (the server binds 0.0.0.0 inside the test's own network namespace: nothing of
    it is open here)."""
    from test_exposure import EVERYWHERE, SERVER

    stack = (f"run: nons\ntasks: null\nexpected: null\nworkers: 1\n"
             f"worker: {{mode: long-running, command: [{PYTHON}, -c, pass]}}\n"
             f"services:\n  kv: {{command: [{PYTHON}, -c, {json.dumps(SERVER)}, \"{EVERYWHERE}\"], "
             "readiness: {mode: tcp}}\n"
             f"verify: {{command: [{PYTHON}, -c, pass]}}\n")
    (project / "config/off.yaml").write_text(stack)  # the default: private
    (project / "config/on-the-node.yaml").write_text(stack + "network: {isolation: none}\n")

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(in_a_node_without_user_namespaces(SNAKEMAKE, *args), cwd=project, capture_output=True,
                              text=True, timeout=300, check=False)

    refused = run("--dry-run", "--configfile", "config/off.yaml")
    output = refused.stdout + refused.stderr
    errors = [line for line in output.splitlines() if line.startswith("allocstack: error")]
    assert refused.returncode != 0 and errors == [(
        f"allocstack: error [config]: network.isolation is private but {socket.gethostname()} does not let users make "
        "user namespaces (user.max_user_namespaces is 0): set network.isolation: none (the stack then runs on the "
        "node's own network)")], output[-3000:]
    assert not (project / "results").exists()
    done = run("--cores", "4", "--configfile", "config/on-the-node.yaml")
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    warning = re.compile(r"  warning: service kv listens on 0\.0\.0\.0:\d+ \(tcp\): reachable by other users and nodes "
                         r"\(the stack runs on the node's own network\)")
    assert any(warning.match(line) for line in done.stdout.splitlines()), done.stdout[-3000:]
    record = (project / "results/nons/decision-record.md").read_text()
    assert (f"a private network for the stack (unprivileged user namespaces): `not possible on {socket.gethostname()} "
            "(user.max_user_namespaces is 0)") in record, record
    assert json.loads((project / "results/nons/result.json").read_text())["status"] == "success"
    seen = record.split("Seen listening beyond loopback while the stack ran", 1)[-1].splitlines()
    assert [line for line in seen if warning.match(" " + line[1:])], record  # "- warning: service kv listens ..."


#: The word service (tests/test_own_service.py) on every address of its namespace, at its fixed port.
EVERY_ADDRESS_WORDS = OWN_SERVICE.replace('serve("127.0.0.1", int(os.environ["ALLOCSTACK_APP_PORT"])',
                                          'serve("0.0.0.0", int(os.environ["ALLOCSTACK_APP_PORT"])')


@pytest.mark.slurm
@pytest.mark.multinode
@pytest.mark.apptainer
def test_multinode_each_node_has_the_stacks_network_workers_reach_the_service_and_no_one_else_does(
        tmp_path, other_user_name):
    """Point 3: nodes: 3 under the Slurm profile, every component a job step in its image, each node's in a network
    of the stack's own on that node. The service, of two replicas (each in a network of its own: issue 25 point 4b),
    binds 0.0.0.0 at a fixed port on the first node; per-task workers on all three nodes reach it at the address a
    settings file names, its alias and that port as written (off the first node: that node's forwarder on the same
    port, through the run's keyed TLS tunnel and the first node's one way in, to the replicas' front, relayed by the
    stack's network job with the token both replicas share). Meanwhile a second user on the first node, and root on another node outside the stack, try that port on
    every address of the first node throughout the run: no try connects."""
    layout, image = require_multinode(), require_apptainer()
    assert EVERY_ADDRESS_WORDS != OWN_SERVICE
    project = copy_project(tmp_path / "project")
    write_tasks_and_expected(project, "mesh", make_tasks(24, message="w"),
                             lambda payload: payload["message"].upper() + " 127.0.0.1")
    (project / "apps").mkdir()
    (project / "apps/service.py").write_text(EVERY_ADDRESS_WORDS)
    (project / "apps/client.py").write_text(PER_TASK)
    (project / "apps/settings.ini").write_text(f"[app]\nurl = http://shouter:{PORT}\n")  # as written, every node
    config = project / "config/mesh.yaml"
    config.write_text(
        "run: mesh\ntasks: inputs/mesh.json\nexpected: expected/mesh.json\nsimulate: {task_seconds: 0.5}\n"
        "network: {isolation: private}\n"
        f"worker: {{batch: 2, command: [python3, apps/client.py, {project / 'apps/settings.ini'}]}}\n"
        f"services: {{app: {{command: [python3, apps/service.py], port: {PORT}, hostnames: [shouter], replicas: 2, "
        "readiness: {mode: http, path: /health, expect: {status: ok}}}}\n"
        f"apptainer: {{binds: [{project / 'apps'}]}}\n")
    (project / "outputs/mesh").mkdir(parents=True)  # run_probed's (its workers write no outputs of their own)
    first, other = sorted(layout["nodes"])[:2]
    address = layout["nodes"][first]
    probers = {"another user on the first node": (["127.0.0.1", address], other_user_name, first),
               "another node": ([address], None, other)}
    done, tries = run_probed(project, config, "mesh", tuple(cluster_args(layout, image)), probers)
    output = assert_verified(done, project, "mesh")
    events = [json.loads(line) for line in (project / "results/mesh/events.jsonl").read_text().splitlines()]
    assert len({event["node"] for event in events if event["event"] == "worker-start"}) == 3, output[-3000:]
    started = next(e["t"] for e in events if e["event"] == "service-started")
    ended = max(e["t"] for e in events if e["event"] == "worker-end")
    for name, found in tries.items():
        during = [one for one in found if started <= one["t"] <= ended]
        assert len(during) >= 10, (name, len(during))
        assert not [one for one in during if one["connected"]], name
    holder = (project / "logs/stack_network/mesh.log").read_text()
    assert re.search(rf"app reached by the other nodes at {re.escape(address)}:\d+", holder), holder
    assert "port_sockets: the front of app relayed to the other nodes on https://" in holder, holder
    ends = json.loads((project / "results/mesh/services.json").read_text())["services"]
    assert {name: ends[name]["status"] for name in ("app", "app-replica-2")} == {"app": "stopped",
                                                                                "app-replica-2": "stopped"}
    for node in (2, 3):
        log = "".join(path.read_text() for path in (project / "logs/stack_network/mesh").glob(f"node-{node}*.log"))
        assert "the stack's private network is up" in log and f"node_forwards: app on http://127.0.0.1:{PORT}" in log
