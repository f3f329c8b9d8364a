"""One allocation, three nodes: the stack across the namespaced nodes of the test cluster.

`tests/cluster/slurm.sh start --nodes 6 --sets 2` gives two sets of three real slurmd, each in its own network
and UTS namespace (hostname mnK, address on a bridge): a worker on mn2 cannot reach mn1's
loopback, so what works here works over the allocation's network. Each test is one real
`snakemake --profile profiles/slurm` run in partition `multi` (this file's set, real_parts.multinode_set), inside
Apptainer.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import shutil
import signal
import struct
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
from test_own_service import CLIENT, SERVICE

from allocstack.common.events import gate_precedes_workers, read_events
from conftest import ensure_other_user, expected_for, pids_mentioning, write_json
from conftest import wait_for as poll
from real_parts import SLURM_STATE, require_apptainer, require_charliecloud, require_multinode
from workflow_helpers import SNAKEMAKE, copy_project, snakemake

pytestmark = [pytest.mark.multinode, pytest.mark.slurm, pytest.mark.apptainer]
SLURM_SH = Path(__file__).resolve().parent / "cluster" / "slurm.sh"


def cluster_args(layout: dict, image: str, *config: str, runtime: int = 10) -> list[str]:
    """The Slurm profile on the test cluster's multi-node partition, three nodes, two workers each, in ONE
    allocation (no retries: what is tested here must hold without a second one)."""
    return ["--profile", "profiles/slurm", "--retries", "0", "--default-resources", "slurm_account=allocstack",
            f"slurm_partition={layout['partition']}", "mem_mb=300", f"runtime={runtime}",
            "--config", f"image={image}", "nodes=3", "workers=6", *config]


DAEMONS = {"tini", "slurmd"}  # a namespaced node's own: slurmd under tini


def node_processes(layout: dict) -> list[str]:
    """Processes on the namespaced nodes besides their slurmd (only multi-node tests use those nodes)."""
    found = []
    for node in layout["nodes"]:
        try:
            slurmd = int(Path(SLURM_STATE, "run", f"slurmd-{node}.pid").read_text())
            namespace = os.readlink(f"/proc/{slurmd}/ns/uts")  # the node's (its stack's network is a namespace apart)
        except (OSError, ValueError):
            continue  # a crashed node has nothing left
        for entry in Path("/proc").iterdir():
            try:
                if entry.name.isdigit() and os.readlink(entry / "ns/uts") == namespace:
                    argv = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
                    if Path(argv[0]).name not in DAEMONS:
                        found.append(f"{node}: {' '.join(argv)[:100]}")
            except OSError:
                continue
    return found


@pytest.fixture
def multinode_project():
    """A project copy under a directory other users may traverse (so only the run's own modes keep them out)."""
    layout, image = require_multinode(), require_apptainer()
    holder = Path(tempfile.mkdtemp(prefix="allocstack-multinode-"))
    os.chmod(holder, 0o755)  # noqa: S103 - other users may traverse it: only the run's own modes keep them out
    project = copy_project(holder / "project")
    yield project, image, layout
    deadline = time.monotonic() + 15  # job steps take a moment to end after the job
    while node_processes(layout) and time.monotonic() < deadline:
        time.sleep(0.5)
    leftovers, here = node_processes(layout), pids_mentioning(str(project))
    for pid in here:
        os.kill(pid, signal.SIGKILL)
    shutil.rmtree(holder, ignore_errors=True)
    assert not leftovers and not here, f"processes of the run left on the nodes: {leftovers} {here}"


def submitted_job(output: str) -> str:
    [job] = re.findall(r"submitted with SLURM jobid (\d+)", output)  # ONE sbatch job, however many nodes
    return job


def job_steps(job: str, wanted: set[str]) -> dict[str, dict[str, str]]:
    """The job's steps by name (JobName, State, NodeList), once accounting lists every wanted one."""
    for _ in range(40):
        listing = subprocess.run(["sacct", "-j", job, "--noheader", "--parsable2",
                                  "--format=JobID,JobName,State,NodeList"], capture_output=True, text=True,
                                 timeout=30, check=False).stdout
        found = {name: {"id": step, "state": state, "node": node}
                 for step, name, state, node in (line.split("|") for line in listing.splitlines() if line)}
        if wanted <= set(found):
            return found
        time.sleep(0.5)
    return found


def slow_tasks(project: Path, run: str, count: int, seconds: float, message: str = "m") -> Path:
    """A task set taking ``count x seconds`` of work, and its config (lease short enough to see expiry)."""
    document = {"schemaVersion": 1, "tasks": [{"id": f"task-{i:04d}", "payload": {"message": f"{message}{i}", "repeat": 2}}
                                              for i in range(count)]}
    write_json(project / f"inputs/{run}.json", document)
    write_json(project / f"expected/{run}.json", expected_for(document))
    config = project / f"config/{run}.yaml"
    config.write_text(f"run: {run}\ntasks: inputs/{run}.json\nexpected: expected/{run}.json\n"
                      f"simulate: {{task_seconds: {seconds}}}\ncoordinator: {{lease_seconds: 3}}\n"
                      "worker: {batch: 4, connect_timeout: 10}\n")
    return config


def start_run(project: Path, args: list[str]) -> subprocess.Popen:
    return subprocess.Popen(["timeout", "-k", "10", "600", SNAKEMAKE, *args], cwd=project, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            env={**os.environ, "TMPDIR": str(project / "tmp")})


def wait_for(predicate, timeout: float = 180, what: str = "the run"):
    return poll(predicate, timeout, what, interval=0.1)


def job_of(run: subprocess.Popen, project: Path) -> str:
    """The stack's job once it runs; fails at once with Snakemake's output if Snakemake ended first."""

    def started() -> str | None:
        if run.poll() is not None:
            pytest.fail(f"snakemake ended before its job ran: {run.communicate()[0][-3000:]}")
        return running_job(project)

    return wait_for(started, what="the stack's job")


def running_job(project: Path) -> str | None:
    """The id of the stack's running sbatch job (the one whose working directory is ``project``)."""
    listing = subprocess.run(["squeue", "--noheader", "--states=RUNNING", "--format=%A %Z"], capture_output=True,
                             text=True, timeout=30, check=False).stdout
    jobs = [line.split()[0] for line in listing.splitlines() if line.split()[1:] == [str(project)]]
    return jobs[0] if jobs else None


def run_baseline(project: Path, *args: str) -> subprocess.CompletedProcess:
    """Run the baseline (4 tasks) with ``args`` and assert it succeeded."""
    done = snakemake(project, *args, timeout=600)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    marker = json.loads((project / "results/baseline/result.json").read_text())
    assert marker["status"] == "success" and marker["taskCount"] == 4
    return done


# -- 1. the baseline across three nodes -----------------------------------------------------
def test_baseline_runs_as_one_job_with_workers_on_all_three_nodes(multinode_project):
    project, image, layout = multinode_project
    done = run_baseline(project, *cluster_args(layout, image))
    output = done.stdout + done.stderr
    job = submitted_job(output)
    nodes = sorted(layout["nodes"])  # mn1 mn2 mn3
    workers = {f"worker-{i:02d}" for i in range(1, 7)}
    steps = job_steps(job, workers | {"coordinator", "readiness", "gate-node-2", "gate-node-3", "verify"})
    placement = {name: steps[name]["node"] for name in sorted(workers)}
    assert placement == {"worker-01": nodes[0], "worker-02": nodes[0], "worker-03": nodes[1],
                         "worker-04": nodes[1], "worker-05": nodes[2], "worker-06": nodes[2]}, steps
    assert all(steps[name]["state"] == "COMPLETED" for name in workers), steps
    assert steps["coordinator"]["node"] == steps["readiness"]["node"] == nodes[0]  # the gate runs with it
    assert (steps["gate-node-2"]["node"], steps["gate-node-3"]["node"]) == (nodes[1], nodes[2])
    # events.jsonl proves the order on every node, each with its own clock.
    events = read_events(project / "results/baseline/events.jsonl")
    ok, reason = gate_precedes_workers(events)
    assert ok and all(f"{node}: 2" in reason for node in nodes), reason
    assert {e["host"] for e in events if e["event"] == "gate-passed"} == set(nodes)
    assert f"on every node ({nodes[0]}: 2, {nodes[1]}: 2, {nodes[2]}: 2)" in \
        (project / "logs/verify_results/baseline.log").read_text()
    # The coordinator listened for the other nodes on mn1's address, TLS; workers reported their nodes.
    log = (project / "logs/serve_coordinator/baseline.log").read_text()
    assert f"listening for the other nodes on https://{layout['nodes'][nodes[0]]}:" in log and "(TLS, " in log
    end = json.loads((project / "results/baseline/coordinator.json").read_text())
    assert all(stats["node"] == placement[worker] for worker, stats in end["workers"].items()), end["workers"]
    record = (project / "results/baseline/decision-record.md").read_text()
    assert "the address the first node's hostname resolves to" in record and "pin its SHA-256" in record
    assert not (project / "state/baseline/events").exists() and not (project / "state/baseline/endpoint.json").exists()


# -- 1b. node-local scratch with an image ----------------------------------------------------
@pytest.mark.parametrize("runtime", ["apptainer", "charliecloud"])
def test_node_local_scratch_with_an_image_is_made_and_removed_on_each_node(multinode_project, runtime):
    """Scratch at a path every node has but none shares (the test cluster's nodes each bind their own
    directory there, as a center's node-local $TMPDIR): a worker on another node starts in the image
    because its step makes the run's scratch (and ch-run's mount-point tree) on its own node, and the
    node's last step of the run removes it there."""
    project, image, layout = multinode_project
    if "scratch" not in layout:
        from real_parts import MULTINODE_START, unavailable
        unavailable("the multi-node test cluster has no node-local scratch (tests/cluster/slurm.sh start "
                    f"{' '.join(MULTINODE_START)})")
    config = [f"scratch={layout['scratch']}"]
    if runtime == "charliecloud":
        image = require_charliecloud()
        config += ["runtime=charliecloud"]
    nodes = sorted(layout["nodes"])
    here = Path(layout["scratch"])  # the host's own directory at that path: no node of the multi partition writes there
    before = {node: sorted(os.listdir(layout["scratchDirs"][node])) for node in nodes}
    done = run_baseline(project, *cluster_args(layout, image, *config))
    output = done.stdout + done.stderr
    workers = {f"worker-{i:02d}" for i in range(1, 7)}
    steps = job_steps(submitted_job(output), workers)
    assert {steps[name]["node"] for name in workers} == set(nodes), steps
    assert all(steps[name]["state"] == "COMPLETED" for name in workers), steps
    # Each off-node worker had the run's scratch on its own node, private (a mount-point tree
    # too, for ch-run), and saw it in the image.
    provenance = json.loads((project / "results/baseline/provenance.json").read_text())
    assert {provenance["components"][w]["host"] for w in workers} == set(nodes)
    for worker in ("worker-03", "worker-06"):
        log = (project / f"logs/run_worker/baseline/{worker}.log").read_text()
        assert f"{worker}: done:" in log, log[-2000:]
    # Job-scoped on every node: nothing of the run is left in any node's scratch (nor on the host's).
    for node in nodes:
        assert not left_in_scratch(layout, node, "baseline")
        owned = Path(layout["scratchDirs"][node], f"allocstack-{os.getuid()}")
        assert owned.stat().st_mode & 0o777 == 0o700  # made by the run's steps there, private
        assert listing_settles(layout["scratchDirs"][node], (before[node], sorted({*before[node], owned.name})))
    # (The host's own jobs, other tests' beside this one, each get a job-N directory there from its prolog.)
    assert not here.exists() or not [p.name for p in here.iterdir() if not re.fullmatch(r"job-\d+", p.name)]


def listing_settles(directory: str, expected: tuple[list[str], ...], seconds: float = 30) -> list[str]:
    """The directory's listing once it is one of ``expected``: the job's own directory there (job-N, made by the
    test cluster's prolog) goes with its epilog, which Slurm runs after the job ended, maybe after Snakemake did.
    Fails naming what stayed."""
    deadline = time.monotonic() + seconds
    while (listing := sorted(os.listdir(directory))) not in expected and time.monotonic() < deadline:
        time.sleep(0.5)
    assert listing in expected, f"{directory} still holds {listing}, expected one of {expected}"
    return listing


def left_in_scratch(layout: dict, node: str, run: str) -> list[str]:
    """What a run left in the node-local scratch of ``node`` (its directory and its lock file)."""
    owned = Path(layout["scratchDirs"][node], f"allocstack-{os.getuid()}")
    return [str(path) for path in owned.glob(f"{run}*")] if owned.is_dir() else []


# -- 2. a whole node's workers lost mid-run ---------------------------------------------------
@pytest.mark.parametrize("how", ["cancelled", "crashed"])
def test_a_node_lost_mid_run_loses_nothing_and_does_nothing_twice(multinode_project, how):
    """Its two worker steps cancelled (scancel), or the whole node crashed (every process on it
    killed, slurmd too: Slurm finds it DOWN after SlurmdTimeout and, with --no-kill, goes on)."""
    project, image, layout = multinode_project
    run_name = f"lost-{how}"
    count = 120
    config = slow_tasks(project, run_name, count=count, seconds=0.5)
    # Cancelled steps with node-local scratch: their task epilog still removes it on their node.
    local = [f"scratch={layout['scratch']}"] if how == "cancelled" and "scratch" in layout else []
    run = start_run(project, ["--configfile", str(config), *cluster_args(layout, image, *local)])
    lost = sorted(layout["nodes"])[2]
    journal = project / f"state/{run_name}/journal.jsonl"
    job = job_of(run, project)

    def lost_steps() -> list[str]:
        listing = subprocess.run(["squeue", "--steps", "--jobs", job, "--noheader", "--format=%i %j %N"],
                                 capture_output=True, text=True, timeout=30, check=False).stdout.split("\n")
        return [line.split()[0] for line in listing if line.split()[1:2] and line.split()[1].startswith("worker-")
                and line.split()[2] == lost]

    def at_work(text: str) -> bool:
        """Mid-run: a result from each of the lost node's workers (so each has claimed, and holds a lease now)."""
        return all(f'"workerId":"{worker}"' in text for worker in ("worker-05", "worker-06"))

    gate = project / f"results/{run_name}/gates/node-3.json"
    victims = wait_for(lambda: gate.exists() and len(lost_steps()) == 2 and journal.exists() and
                       at_work(journal.read_text()) and lost_steps(), what="mid-run")
    try:
        if how == "cancelled":
            subprocess.run(["scancel", *victims], check=True, timeout=30)
        else:
            subprocess.run(["bash", str(SLURM_SH), "crash", lost], check=True, timeout=30)
        output, _ = run.communicate(timeout=600)
    finally:
        if how == "crashed":  # bring the node back for the other tests
            subprocess.run(["bash", str(SLURM_SH), "start", *layout["start"]],
                           capture_output=True, timeout=300, check=True)
    assert run.returncode == 0, output[-4000:]
    marker = json.loads((project / f"results/{run_name}/result.json").read_text())  # verified: each task once
    assert marker["status"] == "success" and marker["taskCount"] == count
    records = {p.stem: json.loads(p.read_text()) for p in (project / f"results/{run_name}/workers").glob("*.json")}
    assert sorted(w for w, r in records.items() if r["status"] == "killed") == ["worker-05", "worker-06"], records
    end = json.loads((project / f"results/{run_name}/coordinator.json").read_text())
    assert end["expiredLeases"] >= 1  # what the lost node held went back to the queue
    assert sum(w["completed"] for w in end["workers"].values()) == count  # every acknowledged result once
    assert all(end["workers"][w]["node"] == lost for w in ("worker-05", "worker-06"))
    results = json.loads((project / f"results/{run_name}/results.json").read_text())["results"]
    assert len({r["taskId"] for r in results}) == len(results) == count
    if local:
        assert not any(left_in_scratch(layout, node, run_name) for node in layout["nodes"])
    survivors = [r for r in results if r["workerId"] not in ("worker-05", "worker-06")]
    print(f"{how}: {len(results) - len(survivors)} results came from {lost} before it was lost, "
          f"{end['expiredLeases']} leases expired")


# -- 3 and 4. the wire, and another user on another node -------------------------------------
INTRUDER = r"""
import http.client, json, os, socket, ssl, sys
url, endpoint_file, canary, service_url = sys.argv[1:5]
host, port = url[len("https://"):].split(":")
seen = {"uid": os.getuid(), "host": socket.gethostname()}
for what, call in (("read", lambda: open(endpoint_file).read()),
                   ("list", lambda: os.listdir(os.path.dirname(endpoint_file)))):
    try:
        call(); seen[what] = "allowed"
    except PermissionError:
        seen[what] = "PermissionError"
context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
context.check_hostname, context.verify_mode = False, ssl.CERT_NONE  # a stranger does not care whose certificate
codes = {}
for method, path, token in (("POST", "/claim", None), ("POST", "/claim", "guess"), ("POST", "/result", "guess"),
                            ("POST", "/results", "guess"), ("POST", "/heartbeat", "guess"), ("GET", "/status", None),
                            ("GET", "/status?token=guess", None), ("GET", "/ui?token=guess", None),
                            ("GET", "/health", None)):
    connection = http.client.HTTPSConnection(host, int(port), context=context, timeout=10)
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = "Bearer " + token
    body = json.dumps({"workerId": "intruder", "taskId": "task-0000", "output": "x", "sha256": "0" * 64,
                       "results": [], "taskIds": []}) if method == "POST" else None
    connection.request(method, path, body=body, headers=headers)
    codes[method + " " + path + (" token" if token else "")] = connection.getresponse().status
    connection.close()
seen["codes"] = codes
# Your own service, relayed to the other nodes over TLS: the relay closes a connection that does not open with
# the run's key for it (allocstack/launch/tunnel.py) before a byte reaches your service, whose own token would
# keep strangers out too.
service_host, service_port = service_url[len("https://"):].split(":")
connection = http.client.HTTPSConnection(service_host, int(service_port), context=context, timeout=10)
try:
    connection.request("GET", "/word/x", headers={"Authorization": "Bearer guess"})
    seen["service"] = connection.getresponse().status
except (OSError, http.client.HTTPException) as exc:
    seen["service"] = type(exc).__name__
# A plain-text request to the TLS port: refused there, but its bytes cross the bridge in clear,
# which is what shows the capture sees this traffic at all.
with socket.create_connection((host, int(port)), timeout=10) as raw:
    raw.sendall(("GET /" + canary + " HTTP/1.1\r\nHost: x\r\n\r\n").encode())
    try:
        raw.recv(100)
    except OSError:
        pass
print(json.dumps(seen))
"""


def pcap_packets(data: bytes):
    """(source, destination, source port, destination port, TCP payload) of each IPv4/TCP packet in a pcap file."""
    offset = 24
    while offset + 16 <= len(data):
        length = struct.unpack("<I", data[offset + 8:offset + 12])[0]
        frame = data[offset + 16:offset + 16 + length]
        offset += 16 + length
        if len(frame) < 34 or frame[12:14] != b"\x08\x00" or frame[23] != 6:
            continue
        ip = 14
        tcp = ip + (frame[ip] & 0x0F) * 4
        sport, dport = struct.unpack("!HH", frame[tcp:tcp + 4])
        payload = frame[tcp + (frame[tcp + 12] >> 4) * 4:]
        yield ".".join(map(str, frame[ip + 12:ip + 16])), ".".join(map(str, frame[ip + 16:ip + 20])), sport, dport, payload


def upper_case_tasks(project: Path, run: str, count: int, message: str) -> None:
    """``count`` tasks whose expected output is their message upper-cased (``{message}{i}``), written as
    ``inputs/<run>.json`` and ``expected/<run>.json``; and ``apps/`` made for the programs that answer them."""
    document = {"schemaVersion": 1, "tasks": [{"id": f"task-{i:04d}", "payload": {"message": f"{message}{i}"}}
                                              for i in range(count)]}
    expected = [{"taskId": t["id"], "output": o, "sha256": hashlib.sha256(o.encode()).hexdigest()}
                for t in document["tasks"] for o in [t["payload"]["message"].upper()]]
    write_json(project / f"inputs/{run}.json", document)
    write_json(project / f"expected/{run}.json", {"schemaVersion": 1, "results": expected})
    (project / "apps").mkdir(exist_ok=True)


def service_tasks(project: Path, run: str, count: int, seconds: float, message: str) -> Path:
    """Tasks answered by your own service on the first node (tests/test_own_service.py's shouter: it
    upper-cases a word), asked by a worker program on every node; and the config that runs them."""
    upper_case_tasks(project, run, count, message)
    (project / "apps/service.py").write_text(SERVICE)
    (project / "apps/client.py").write_text(CLIENT)
    config = project / f"config/{run}.yaml"
    config.write_text(f"run: {run}\ntasks: inputs/{run}.json\nexpected: expected/{run}.json\n"
                      f"simulate: {{task_seconds: {seconds}}}\ncoordinator: {{lease_seconds: 3}}\n"
                      "worker: {batch: 4, command: [python3, apps/client.py]}\n"
                      "service: {command: [python3, apps/service.py], readiness: {mode: http, path: /health, "
                      "expect: {status: ok}}}\n"
                      f"apptainer: {{binds: [{project / 'apps'}]}}\n")
    return config


@pytest.fixture(scope="module")
def observed_run():
    """One run, captured on the bridge (tcpdump) while another user on mn2 tries to get in. Its tasks go
    through the coordinator AND your own service (relayed to the other nodes through the TLS tunnel)."""
    layout, image = require_multinode(), require_apptainer()
    user = ensure_other_user()
    if shutil.which("tcpdump") is None:
        from real_parts import unavailable
        unavailable("no tcpdump (as root: apt-get install tcpdump; tests/cluster/prepare.sh does it)")
    holder = Path(tempfile.mkdtemp(prefix="allocstack-multinode-"))
    os.chmod(holder, 0o755)  # noqa: S103 - other users may traverse it: only the run's own modes keep them out
    project = copy_project(holder / "project")
    secret = f"secret{secrets.token_hex(8)}"
    config = service_tasks(project, "wire", count=48, seconds=1.0, message=f"{secret}-payload-")
    pcap = holder / "bridge.pcap"
    capture = subprocess.Popen(["tcpdump", "-i", layout["bridge"], "-U", "-s", "0", "-w", str(pcap)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    assert "listening on" in capture.stderr.readline()
    run = start_run(project, ["--configfile", str(config), *cluster_args(layout, image)])
    shared, service = project / "state/wire/endpoint.json", project / "state/wire/services/app.json"
    ready = project / "results/wire/services/app-readiness.json"  # your service answers (its own gate passed)
    document = wait_for(lambda: shared.exists() and service.exists() and ready.exists() and
                        json.loads(shared.read_text()), what="the endpoints for other nodes")
    service_document = json.loads(service.read_text())
    canary = f"PLAINTEXT{secrets.token_hex(8)}"
    intruder = subprocess.run(["bash", str(SLURM_SH), "exec", sorted(layout["nodes"])[1], "runuser", "-u", user, "--",
                               "/usr/bin/python3", "-c", INTRUDER, document["endpoint"], str(shared), canary,
                               service_document["endpoint"]],
                              capture_output=True, text=True, timeout=120, cwd="/", check=False)
    output, _ = run.communicate(timeout=600)
    capture.send_signal(signal.SIGINT)
    capture.wait(timeout=30)
    yield {"project": project, "returncode": run.returncode, "output": output, "document": document,
           "service": service_document, "secret": secret, "canary": canary, "intruder": intruder,
           "pcap": pcap.read_bytes(), "layout": layout}
    for pid in pids_mentioning(str(project)):
        os.kill(pid, signal.SIGKILL)
    shutil.rmtree(holder, ignore_errors=True)


def test_the_run_under_observation_succeeds(observed_run):
    assert observed_run["returncode"] == 0, observed_run["output"][-4000:]
    project = observed_run["project"]
    assert json.loads((project / "results/wire/result.json").read_text())["status"] == "success"


def test_a_capture_on_the_bridge_holds_no_token_payload_or_output_in_clear_text(observed_run):
    data, document = observed_run["pcap"], observed_run["document"]
    address, port = document["endpoint"][len("https://"):].split(":")
    to_coordinator = [payload for _, dst, _, dport, payload in pcap_packets(data)
                      if (dst, dport) == (address, int(port)) and payload]
    from_coordinator = [payload for src, _, sport, _, payload in pcap_packets(data)
                        if (src, sport) == (address, int(port)) and payload]
    # The capture saw the stack's traffic: TLS records both ways, and the control sent in clear.
    assert sum(map(len, to_coordinator)) > 10_000 and sum(map(len, from_coordinator)) > 10_000
    assert any(p[:1] == b"\x16" for p in to_coordinator) and any(p[:1] == b"\x17" for p in from_coordinator)
    assert observed_run["canary"].encode() in data
    # ... and nothing of what must stay private: tokens, payloads (which carry the secret), outputs (likewise).
    service_address, service_port = observed_run["service"]["endpoint"][len("https://"):].split(":")
    to_service = [payload for _, dst, _, dport, payload in pcap_packets(data)
                  if (dst, dport) == (service_address, int(service_port)) and payload]
    assert sum(map(len, to_service)) > 1_000 and any(p[:1] == b"\x16" for p in to_service)  # TLS, tunnelled
    # ... and nothing of what must stay private: tokens, payloads (which carry the secret), outputs
    # (the secret upper-cased by your service), what the workers asked your service.
    secret = observed_run["secret"]
    for private in (document["token"], document["viewToken"], observed_run["service"]["token"], secret,
                    secret.upper(), "Bearer ", '"payload"', '"output"', "/word/"):
        assert private.encode() not in data, private
    results = json.loads((observed_run["project"] / "results/wire/results.json").read_text())["results"]
    assert results[0]["output"].startswith(secret.upper())  # the outputs did carry it
    workers = json.loads((observed_run["project"] / "results/wire/coordinator.json").read_text())["workers"]
    assert {stats["node"] for worker, stats in workers.items() if stats["completed"]} == set(observed_run["layout"]["nodes"])
    # Off-node workers' own output goes to their log through the shared filesystem, not through
    # srun, whose I/O forwarding between nodes is not encrypted.
    log = (observed_run["project"] / "logs/run_worker/wire/worker-05.log").read_text()
    assert "worker-05: done:" in log and b"worker-05: done:" not in data


def test_another_user_on_another_node_cannot_read_the_endpoint_claim_post_or_see_the_status(observed_run):
    intruder = observed_run["intruder"]
    assert intruder.returncode == 0, intruder.stderr[-2000:]
    seen = json.loads(intruder.stdout)
    assert seen["uid"] != 0 and seen["host"] == sorted(observed_run["layout"]["nodes"])[1]
    assert seen["read"] == seen["list"] == "PermissionError"
    health = seen["codes"].pop("GET /health")
    assert health == 200  # the seed's public contract: status and task count, nothing else
    assert set(seen["codes"].values()) == {401}, seen["codes"]
    assert seen["service"] == "RemoteDisconnected"  # the relay let nothing through without the run's key
    project = observed_run["project"]
    end = json.loads((project / "results/wire/coordinator.json").read_text())
    assert "intruder" not in end["workers"]
    results = json.loads((project / "results/wire/results.json").read_text())["results"]
    assert {r["workerId"] for r in results} <= {f"worker-{i:02d}" for i in range(1, 7)}


# -- a wrong bind address: one clear error before any worker starts ---------------------------
def test_a_wrong_interface_is_one_network_line_before_any_worker_starts(multinode_project):
    project, image, layout = multinode_project
    (project / "config/wrong.yaml").write_text("network: {interface: nope0}\n")
    done = snakemake(project, "--configfile", "config/wrong.yaml", *cluster_args(layout, image), timeout=600)
    output = done.stdout + done.stderr
    assert done.returncode != 0
    first = min(layout["nodes"])
    assert f"allocstack: error [network]: network.interface 'nope0' does not exist on {first}" in output, output[-3000:]
    assert not list((project / "state/baseline").glob("events/worker-*.jsonl"))  # no worker-start anywhere
    assert not (project / "results/baseline/result.json").exists()


def test_more_nodes_than_the_partition_has_is_refused_before_submission(multinode_project):
    project, image, layout = multinode_project
    args = cluster_args(layout, image)
    args[args.index(f"slurm_partition={layout['partition']}")] = "slurm_partition=debug"  # one node
    done = snakemake(project, "--dry-run", *args, timeout=120)
    output = done.stdout + done.stderr
    assert done.returncode != 0
    assert "allocstack: error [config]: nodes=3 but partition debug has 1 node(s)" in output, output[-2000:]


# -- 5. many workers: one job step per node ------------------------------------------------------
#: Eight workers a node (the namespaced test nodes announce 16 CPUs; the first also holds the coordinator's).
PER_NODE = 8


def grouped_args(layout: dict, image: str, *config: str) -> list[str]:
    """cluster_args with 24 workers on the 3 nodes: above 16, so one job step of 8 workers per node (the default)."""
    args = cluster_args(layout, image, *config)
    args[args.index("workers=6")] = f"workers={3 * PER_NODE}"
    return args


def worker_process(layout: dict, node: str, worker: str) -> int | None:
    """The pid of ``worker``'s process (worker.py) on namespaced node ``node``, if it runs: a process in that node's
    UTS namespace (its hostname; the stack's own network on the node is a network namespace of its own)."""
    slurmd = int(Path(SLURM_STATE, "run", f"slurmd-{node}.pid").read_text())
    namespace = os.readlink(f"/proc/{slurmd}/ns/uts")
    for entry in Path("/proc").iterdir():
        try:
            if not entry.name.isdigit() or os.readlink(entry / "ns/uts") != namespace:
                continue
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(arg.endswith(b"worker.py") for arg in argv) and f"--worker-id={worker}".encode() in argv:
            return int(entry.name)
    return None


def test_eight_workers_a_node_run_as_three_worker_steps_each_keeping_its_identity(multinode_project):
    project, image, layout = multinode_project
    done = run_baseline(project, *grouped_args(layout, image))
    output = done.stdout + done.stderr
    nodes = sorted(layout["nodes"])
    steps = job_steps(submitted_job(output), {"workers-01", "workers-02", "workers-03", "coordinator"})
    assert {name: steps[name]["node"] for name in ("workers-01", "workers-02", "workers-03")} == \
        {"workers-01": nodes[0], "workers-02": nodes[1], "workers-03": nodes[2]}, steps
    assert all(steps[name]["state"] == "COMPLETED" for name in ("workers-01", "workers-02", "workers-03")), steps
    assert not [name for name in steps if name.startswith("worker-")]  # no step per worker: 3, not 24
    for number in range(1, len(nodes) + 1):  # each worker its own record, in its step's directory
        ids = [f"worker-{i:02d}" for i in range(PER_NODE * (number - 1) + 1, PER_NODE * number + 1)]
        records = project / f"results/baseline/workers/workers-{number:02d}"
        assert sorted(path.stem for path in records.glob("*.json")) == ids
        assert all(json.loads((records / f"{w}.json").read_text())["status"] == "done" for w in ids)
        assert all((project / f"logs/run_workers/baseline/{w}.log").exists() for w in ids)  # and its own log
    events = read_events(project / "results/baseline/events.jsonl")
    ok, reason = gate_precedes_workers(events)
    assert ok and all(f"{node}: {PER_NODE}" in reason for node in nodes), reason
    starts = {e["worker"]: e["host"] for e in events if e["event"] == "worker-start"}
    assert len(starts) == 3 * PER_NODE and starts["worker-09"] == nodes[1] and starts["worker-24"] == nodes[2]
    # Off the first node each worker reached the coordinator through its step's relay, over TLS.
    log = (project / "logs/run_workers/baseline/workers-02.log").read_text()
    assert f"workers-02: {PER_NODE} workers started (worker-09 .. worker-16), relayed to https://" in log, log[-2000:]
    assert f"workers-02: ended: {PER_NODE} done" in log
    assert "workers     24 in 3 job steps: 24 ended" in done.stdout


def start_grouped(project: Path, layout: dict, image: str, run: str, count: int) -> tuple[subprocess.Popen, Path]:
    """A run of ``count`` tasks of 0.5 s in grouped worker steps, started and its job submitted: the run's process
    and its journal."""
    config = slow_tasks(project, run, count=count, seconds=0.5)
    started = start_run(project, ["--configfile", str(config), *grouped_args(layout, image)])
    job_of(started, project)
    return started, project / f"state/{run}/journal.jsonl"


def test_a_worker_process_killed_inside_a_step_is_started_again_and_nothing_is_lost(multinode_project):
    project, image, layout = multinode_project
    # 20 tasks of 0.5 s per worker (5 claims of 4): killed after its first result, worker-10 holds a lease that
    # must expire. With 6 per worker (126 tasks) it was killed at times with its share done and nothing leased.
    count = 420
    run, journal = start_grouped(project, layout, image, "restart", count)
    node = sorted(layout["nodes"])[1]
    victim = wait_for(lambda: journal.exists() and '"workerId":"worker-10"' in journal.read_text() and
                      worker_process(layout, node, "worker-10"), what="worker-10 at work on its node")
    os.kill(victim, signal.SIGKILL)
    output, _ = run.communicate(timeout=600)
    assert run.returncode == 0, output[-4000:]
    marker = json.loads((project / "results/restart/result.json").read_text())
    assert marker["status"] == "success" and marker["taskCount"] == count
    results = json.loads((project / "results/restart/results.json").read_text())["results"]
    assert len({r["taskId"] for r in results}) == len(results) == count  # each task exactly once
    end = json.loads((project / "results/restart/coordinator.json").read_text())
    assert end["expiredLeases"] >= 1 and end["workers"]["worker-10"]["node"] == node  # its leases came back
    record = json.loads((project / "results/restart/workers/workers-02/worker-10.json").read_text())
    assert record["status"] == "done"  # the process started again did its share and wrote its record
    step_log = (project / "logs/run_workers/restart/workers-02.log").read_text()
    assert "worker-10 was killed by SIGKILL from outside; started again (1 of at most 3)" in step_log
    assert "workers-02: worker-10 was killed from outside; started again" in \
        (project / "logs/run_workers/restart/worker-10.log").read_text()
    starts = [e for e in read_events(project / "results/restart/events.jsonl")
              if e["event"] == "worker-start" and e["worker"] == "worker-10"]
    assert len(starts) == 2 and {e["host"] for e in starts} == {node}


def test_a_node_of_a_step_lost_mid_run_records_its_workers_killed_and_loses_nothing(multinode_project):
    """The third node crashes (every process on it, slurmd too) while its step's 8 workers hold leases."""
    project, image, layout = multinode_project
    # 21 tasks of 0.5 s a worker: the node is lost with its share unfinished (with 126 tasks, under load, the node's
    # workers could end theirs before the crash came, and none was killed)
    count = 504
    run, journal = start_grouped(project, layout, image, "lost-step", count)
    lost = sorted(layout["nodes"])[2]
    wait_for(lambda: journal.exists() and journal.read_text().count('"kind":"result"') >= 14 and
             worker_process(layout, lost, "worker-24"), what="the third node's workers at work")
    try:
        subprocess.run(["bash", str(SLURM_SH), "crash", lost], check=True, timeout=30)
        output, _ = run.communicate(timeout=600)
    finally:  # bring the node back for the other tests
        subprocess.run(["bash", str(SLURM_SH), "start", *layout["start"]],
                       capture_output=True, timeout=300, check=True)
    assert run.returncode == 0, output[-4000:]
    marker = json.loads((project / "results/lost-step/result.json").read_text())
    assert marker["status"] == "success" and marker["taskCount"] == count
    records = {p.stem: json.loads(p.read_text()) for p in (project / "results/lost-step/workers").glob("*/*.json")}
    third_node = [f"worker-{i}" for i in range(2 * PER_NODE + 1, 3 * PER_NODE + 1)]
    assert sorted(w for w, r in records.items() if r["status"] == "killed") == third_node, \
        {w: records.get(w) for w in third_node}
    assert all(records[f"worker-{i:02d}"]["status"] == "done" for i in range(1, 2 * PER_NODE + 1))
    end = json.loads((project / "results/lost-step/coordinator.json").read_text())
    assert end["expiredLeases"] >= 1 and sum(w["completed"] for w in end["workers"].values()) == count
    results = json.loads((project / "results/lost-step/results.json").read_text())["results"]
    assert len({r["taskId"] for r in results}) == len(results) == count
