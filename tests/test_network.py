"""More than one node, the parts that need no cluster: the bind-address policy, the run's TLS
certificate and its pinning, the off-node gate, per-node proofs, placement and config checks.

The off-node listener binds 127.0.0.1 here (``--address``: nothing may listen elsewhere on
this machine); tests/test_multinode.py runs the real thing across the test cluster's nodes.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import socket
import ssl
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import requests
from launch import killed_by
from test_own_service import SERVICE

from allocstack.common import slurm
from allocstack.common.endpoint import read_endpoint, write_endpoint
from allocstack.common.errors import AllocstackError
from allocstack.common.events import gate_precedes_workers
from allocstack.common.network import bind_address, interface_address, node_for
from allocstack.common.tls import certificate_command, fingerprint, tls_context
from allocstack.coordinator.progress import per_node
from allocstack.launch.tunnel import LocalForward, relay_key, relay_to_loopback, remote_services_environment
from allocstack.worker.client import CoordinatorClient
from allocstack.worker.httpclient import CertificateRefused
from allocstack.worker.sessions import PinnedAdapter, loopback_session
from conftest import SCRIPTS, make_tasks, run_script


@pytest.fixture
def tls_coordinator(start_coordinator, tmp_path):
    """A coordinator that also serves the 'other nodes' endpoint: TLS on 127.0.0.1, published in state/."""
    shared = tmp_path / "state" / "run" / "endpoint.json"
    coordinator = start_coordinator(make_tasks(6), "--network-endpoint-file", str(shared), "--address", "127.0.0.1")
    coordinator.shared = shared
    return coordinator


def dead_port() -> int:
    """A loopback port nothing listens on."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


# -- the bind-address policy ---------------------------------------------------------------
def test_a_missing_interface_is_one_line_naming_the_key_and_what_exists():
    with pytest.raises(AllocstackError) as error:
        bind_address("nope0")
    assert error.value.diag == "network" and "network.interface 'nope0' does not exist" in error.value.message
    assert "lo" in error.value.message  # it names the interfaces there are


def test_loopback_is_refused_whether_named_by_interface_or_by_the_hostname():
    with pytest.raises(AllocstackError, match=r"127.0.0.1, which other nodes cannot reach") as by_interface:
        bind_address("lo")
    with pytest.raises(AllocstackError, match=r"hostname 'localhost' resolves to is 127.0.0.1") as by_hostname:
        bind_address(None, "localhost")
    assert by_interface.value.diag == by_hostname.value.diag == "network"
    assert interface_address("lo") == "127.0.0.1"


def test_an_unresolvable_hostname_is_refused():
    with pytest.raises(AllocstackError, match="does not resolve"):
        bind_address(None, "no-such-host.invalid")


# -- the run's certificate -----------------------------------------------------------------
def test_the_certificate_is_for_the_address_and_the_key_leaves_no_trace(tmp_path):
    context, pin = tls_context("10.254.1.11", "allocstack-test", tmp_path)
    assert isinstance(context, ssl.SSLContext) and re.fullmatch(r"[0-9a-f]{64}", pin)
    assert list(tmp_path.iterdir()) == []  # the key touched the disk only to be loaded
    assert tls_context("10.254.1.11", "allocstack-test", tmp_path)[1] != pin  # a fresh key per run
    made = tmp_path / "made"
    made.mkdir()
    done = subprocess.run(certificate_command("10.254.1.11", "x", made / "k.pem", made / "c.pem"), capture_output=True, check=False)
    assert done.returncode == 0, done.stderr
    text = subprocess.run(["openssl", "x509", "-in", made / "c.pem", "-noout", "-text"], capture_output=True,
                          text=True, check=False).stdout
    assert "IP Address:10.254.1.11" in text and "CA:FALSE" in text and "P-256" in text
    assert oct((made / "k.pem").stat().st_mode & 0o777) == "0o600"
    assert fingerprint((made / "c.pem").read_text()) == hashlib.sha256(
        ssl.PEM_cert_to_DER_cert((made / "c.pem").read_text())).hexdigest()


def test_without_openssl_the_coordinator_stops_with_one_line_before_serving(tmp_path):
    tasks = tmp_path / "tasks.json"
    tasks.write_text(json.dumps(make_tasks(1)))
    done = run_script("coordinator.py", "--input", tasks, "--results", tmp_path / "results.json", "--scratch",
                      tmp_path / "scratch", "--end-record", tmp_path / "end.json", "--network-endpoint-file",
                      tmp_path / "state" / "endpoint.json", "--address", "127.0.0.1",
                      env={"PATH": os.path.dirname(sys.executable)})
    assert done.returncode == 69 and "[prerequisite]: TLS between nodes needs the openssl command" in done.stderr
    assert json.loads((tmp_path / "end.json").read_text())["status"] == "failed"  # the gate fails fast on it
    assert not (tmp_path / "scratch" / "endpoint.json").exists()


def test_the_network_endpoint_is_published_0600_with_the_fingerprint(tls_coordinator):
    document = json.loads(tls_coordinator.shared.read_text())
    assert document["endpoint"].startswith("https://127.0.0.1:") and document["tls"] is True
    assert re.fullmatch(r"[0-9a-f]{64}", document["tlsFingerprint"])
    assert document["token"] == tls_coordinator.token  # one token for both listeners
    assert oct(tls_coordinator.shared.stat().st_mode & 0o777) == "0o600"
    assert oct(tls_coordinator.shared.parent.stat().st_mode & 0o777) == "0o700"
    # What the server presents is what the document names.
    host, port = document["endpoint"][len("https://"):].split(":")
    presented = ssl.get_server_certificate((host, int(port)))
    assert hashlib.sha256(ssl.PEM_cert_to_DER_cert(presented)).hexdigest() == document["tlsFingerprint"]


def test_a_worker_completes_through_the_pinned_tls_endpoint(tls_coordinator, tmp_path):
    gate = tmp_path / "gate.json"
    gate.write_text('{"status": "ready"}')
    events = tmp_path / "shared-events" / "worker-01.jsonl"
    done = run_script("worker.py", "--worker-id", "worker-01", "--endpoint-file", tls_coordinator.shared,
                      "--events", events, "--gate-record", gate, "--batch", "2", env={"SLURMD_NODENAME": "mn2"})
    assert done.returncode == 0, done.stderr
    assert tls_coordinator.stop() == 0
    assert len(json.loads(tls_coordinator.results.read_text())["results"]) == 6
    end = json.loads(tls_coordinator.end_record.read_text())
    assert end["workers"]["worker-01"]["node"] == "mn2"
    start = next(e for e in map(json.loads, events.read_text().splitlines()) if e["event"] == "worker-start")
    assert start["node"] == "mn2" and start["host"] == socket.gethostname()
    assert not tls_coordinator.shared.exists()  # removed at shutdown with the token in it


def test_a_certificate_that_is_not_the_runs_gets_no_request(tls_coordinator):
    endpoint = read_endpoint(tls_coordinator.shared)
    wrong = CoordinatorClient(endpoint.url, endpoint.token, fingerprint="0" * 64)
    with pytest.raises(CertificateRefused, match=r"(?i)fingerprint"):
        wrong.status()
    with pytest.raises(requests.exceptions.SSLError, match=r"(?i)fingerprint"):  # the gate's session pins alike
        loopback_session("0" * 64).get(endpoint.url + "/health", timeout=5)
    with pytest.raises(requests.exceptions.SSLError):  # https without a pin: refused before connecting
        loopback_session().get(endpoint.url + "/health", timeout=5)
    right = CoordinatorClient(endpoint.url, endpoint.token, fingerprint=endpoint.fingerprint)
    assert right.status()["workers"] == {}  # the refused client never claimed anything


def test_plain_http_is_refused_by_the_tls_listener_and_a_stranger_gets_401(tls_coordinator):
    endpoint = read_endpoint(tls_coordinator.shared)
    with pytest.raises(requests.exceptions.ConnectionError):
        requests.get(endpoint.url.replace("https://", "http://") + "/health", timeout=5)
    stranger = loopback_session(endpoint.fingerprint)
    assert stranger.get(endpoint.url + "/health", timeout=5).json()["status"] == "ready"
    for method, path in (("post", "/claim"), ("post", "/results"), ("get", "/status")):
        answer = getattr(stranger, method)(endpoint.url + path, json={"workerId": "intruder"}, timeout=5,
                                           headers={"Authorization": "Bearer guess"})
        assert answer.status_code == 401, path


def test_endpoint_documents_say_which_network_endpoints_they_may_name(tmp_path):
    path = tmp_path / "endpoint.json"
    write_endpoint(path, "https://10.254.1.11:4443", "t", "v", tls=True, fingerprint="ab" * 32)
    assert read_endpoint(path).fingerprint == "ab" * 32
    write_endpoint(path, "http://10.254.1.11:4443", "t", "v", tls=False)
    assert read_endpoint(path).url == "http://10.254.1.11:4443"  # plain only where the document says so
    write_endpoint(path, "https://10.254.1.11:4443", "t", "v", tls=True, fingerprint=None)
    with pytest.raises(AllocstackError, match="tlsFingerprint"):
        read_endpoint(path)
    write_endpoint(path, "http://10.254.1.11:4443", "t", "v")
    with pytest.raises(AllocstackError, match="not a loopback address"):
        read_endpoint(path)
    adapter = PinnedAdapter("ab" * 32)
    assert adapter.poolmanager.connection_pool_kw["assert_fingerprint"] == "ab" * 32


# -- the gate of another node ----------------------------------------------------------------
def test_the_off_node_gate_passes_over_tls(tls_coordinator, tmp_path):
    record = tmp_path / "gates" / "node-2.json"
    record.parent.mkdir()  # Snakemake creates an output's directory
    done = run_script("readiness.py", "--off-node", "--endpoint-file", tls_coordinator.shared, "--task-count", 6,
                      "--timeout", 10, "--record", record, "--events", tmp_path / "events" / "gate-node-2.jsonl")
    assert done.returncode == 0, done.stderr
    gate = json.loads(record.read_text())
    assert gate["status"] == "ready" and gate["endpoint"].startswith("https://") and gate["host"]


def test_an_unreachable_coordinator_fails_the_off_node_gate_with_one_network_line(tmp_path):
    port = dead_port()
    shared = tmp_path / "endpoint.json"
    write_endpoint(shared, f"https://127.0.0.1:{port}", "t", "v", tls=True, fingerprint="ab" * 32)
    done = run_script("readiness.py", "--off-node", "--endpoint-file", shared, "--task-count", 1, "--timeout", 1)
    assert done.returncode == 69
    [line] = done.stderr.strip().splitlines()
    assert line.startswith("allocstack: error [network]: ") and "cannot reach the coordinator" in line
    assert "network.interface" in line


def test_a_wrong_certificate_fails_the_off_node_gate_at_once(tls_coordinator, tmp_path):
    document = json.loads(tls_coordinator.shared.read_text())
    forged = tmp_path / "forged.json"
    write_endpoint(forged, document["endpoint"], document["token"], "", tls=True, fingerprint="cd" * 32)
    done = run_script("readiness.py", "--off-node", "--endpoint-file", forged, "--task-count", 6, "--timeout", 20)
    assert done.returncode == 69 and "does not present this run's certificate" in done.stderr


def test_the_off_node_gate_moves_to_a_newer_runs_endpoint_and_pins_its_certificate(tls_coordinator, tmp_path):
    """An earlier run's document (a dead port, another certificate) is read first; the gate follows the file to
    the new one and pins the new certificate (pinning the old one would fail it with [network])."""
    dead = dead_port()
    shared = tmp_path / "endpoint.json"
    write_endpoint(shared, f"https://127.0.0.1:{dead}", "old", "", tls=True, fingerprint="ab" * 32)
    record = tmp_path / "node-2.json"
    gate = subprocess.Popen([sys.executable, str(SCRIPTS / "readiness.py"), "--off-node", "--endpoint-file",
                             str(shared), "--task-count", "6", "--timeout", "20", "--record", str(record)],
                            stderr=subprocess.PIPE, text=True)
    time.sleep(0.5)
    current = json.loads(tls_coordinator.shared.read_text())
    write_endpoint(shared, current["endpoint"], current["token"], "", tls=True, fingerprint=current["tlsFingerprint"])
    _, stderr = gate.communicate(timeout=30)
    assert gate.returncode == 0, stderr
    assert json.loads(record.read_text())["endpoint"] == current["endpoint"]


# -- per-node proofs, placement, kills ------------------------------------------------------
def ev(event: str, t: float, host: str, **extra) -> dict:
    return {"event": event, "t": t, "host": host, **extra}


def test_the_gate_order_is_proven_per_node_without_comparing_clocks_across_nodes():
    ok, reason = gate_precedes_workers([
        ev("gate-passed", 100.0, "mn1"), ev("worker-start", 100.1, "mn1", worker="worker-01"),
        # mn2's clock is a second behind mn1's: only mn2's own events are compared.
        ev("gate-passed", 99.2, "mn2"), ev("worker-start", 99.3, "mn2", worker="worker-02"),
    ])
    assert ok and "mn1: 1" in reason and "mn2: 1" in reason
    ok, reason = gate_precedes_workers([ev("gate-passed", 100.0, "mn1"),
                                        ev("worker-start", 101.0, "mn2", worker="worker-02")])
    assert not ok and reason == "worker-02 started on mn2, where no gate passed"
    ok, reason = gate_precedes_workers([ev("gate-passed", 100.0, "mn1"), ev("gate-passed", 100.5, "mn2"),
                                        ev("worker-start", 100.2, "mn2", worker="worker-03")])
    assert not ok and "worker-03 started 0.300 s before the gate passed on mn2" in reason


def test_workers_per_node_in_the_status():
    workers = {"worker-01": {"node": "mn1", "claimed": 3, "completed": 2, "lastSeenSecondsAgo": 0.5},
               "worker-02": {"node": "mn2", "claimed": 4, "completed": 4, "lastSeenSecondsAgo": 2.0},
               "worker-03": {"node": "mn2", "claimed": 1, "completed": 1, "lastSeenSecondsAgo": 1.0}}
    assert per_node(workers) == {
        "mn1": {"workers": ["worker-01"], "claimed": 3, "completed": 2, "lastSeenSecondsAgo": 0.5},
        "mn2": {"workers": ["worker-02", "worker-03"], "claimed": 5, "completed": 5, "lastSeenSecondsAgo": 1.0},
    }


def test_a_step_killed_from_outside_is_told_apart_from_an_exit():
    assert killed_by(137, in_step=True) == 9  # srun: the step's task got SIGKILL (scancel, OOM, kill -9)
    assert killed_by(143, in_step=True) == 15
    assert killed_by(137, in_step=False) is None  # a plain process exiting 137 exited
    assert killed_by(-9, in_step=False) == 9
    assert killed_by(75, in_step=True) is None


def test_a_node_gate_that_comes_late_still_passes_while_the_coordinator_serves(tls_coordinator, tmp_path):
    """The first node's workers may finish everything before another node's gate runs: the
    coordinator's "completed" end record then exists, yet it still serves, so that gate passes."""
    end = tmp_path / "end.json"
    end.write_text(json.dumps({"status": "completed", "reason": "all tasks done", "listeningAt": 1.0}))
    done = run_script("readiness.py", "--off-node", "--endpoint-file", tls_coordinator.shared, "--task-count", 6,
                      "--timeout", 10, "--coordinator-record", end)
    assert done.returncode == 0, done.stderr
    end.write_text(json.dumps({"status": "failed", "reason": "allocstack: error [network]: no such interface"}))
    done = run_script("readiness.py", "--off-node", "--endpoint-file", tls_coordinator.shared, "--task-count", 6,
                      "--timeout", 10, "--coordinator-record", end)
    assert done.returncode == 70 and "ended before it was ready: allocstack: error [network]" in done.stderr


def test_a_components_node_is_asked_of_slurm_with_the_coordinators_first():
    asked = []

    def slurm(argv):
        asked.append(argv[0])
        return {"squeue": "mn[1-3]\n", "scontrol": "mn1\nmn2\nmn3\n"}[argv[0]]

    assert [node_for(index, "mn2", "7", slurm) for index in range(3)] == ["mn2", "mn1", "mn3"]
    assert asked[:2] == ["squeue", "scontrol"]  # the job's nodes, not the group step's $SLURM_JOB_NODELIST
    with pytest.raises(AllocstackError, match="placed on node 4 but the allocation has 3") as error:
        node_for(3, "mn2", "7", slurm)
    assert error.value.diag == "config"
    with pytest.raises(AllocstackError, match="did not tell the nodes of job 7"):
        node_for(1, "mn1", "7", lambda argv: None)


def test_more_nodes_than_the_partition_has_are_refused_before_submission():
    nodes = {name: slurm.Node(name, 8000, 8, ("multi",)) for name in ("mn1", "mn2")}
    facts = slurm.ClusterFacts(partitions={"multi": slurm.Partition("multi", None, None)}, nodes=nodes)
    fits = slurm.Submission(account=None, partition="multi", runtime=None, memory=None, nodes=2)
    assert slurm.submission_problem(fits, facts) is None
    key, why = slurm.submission_problem(dataclasses.replace(fits, nodes=3), facts)
    assert key == "nodes" and why.startswith("nodes=3 but partition multi has 2 node(s)")


# -- your own service, relayed to the other nodes -------------------------------------------
def stranger_reply(host: str, port: int) -> bytes:
    """What a stranger on the network reads from a service's relay: a TLS connection that accepts any certificate
    and sends an HTTP request longer than a key, as a client of the service would."""
    context = ssl.create_default_context()
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    with socket.create_connection((host, port), timeout=10) as raw, context.wrap_socket(raw) as tls:
        tls.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"a" * 120 + b"\r\n\r\n")
        try:
            return tls.recv(1024)
        except (ConnectionError, ssl.SSLError):
            return b""


def relayed_service(tmp_path, *flags: str) -> tuple[subprocess.Popen, Path]:
    """app_service.py with the test service, relayed for the other nodes on 127.0.0.1; once it published that."""
    service = tmp_path / "service.py"
    service.write_text(SERVICE)
    shared = tmp_path / "state" / "app.json"
    proc = subprocess.Popen([sys.executable, str(SCRIPTS / "app_service.py"), "--command-json",
                             json.dumps([sys.executable, str(service)]), "--scratch", str(tmp_path / "scratch"),
                             "--network-endpoint-file", str(shared), "--address", "127.0.0.1", *flags],
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 20
    while not shared.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(proc.stderr.read())
        time.sleep(0.05)
    return proc, shared


def answer_through(url: str, token: str) -> requests.Response:
    deadline = time.monotonic() + 20  # the service starts slowly on purpose
    while True:
        try:
            return requests.get(f"{url}/word/tunnel", headers={"Authorization": f"Bearer {token}"}, timeout=5)
        except requests.ConnectionError:
            assert time.monotonic() < deadline
            time.sleep(0.1)


def test_your_service_reaches_other_nodes_through_a_pinned_tls_tunnel(tmp_path):
    """app_service.py relays the service to the network address over TLS (here 127.0.0.1);
    a worker off the first node gets a plain loopback endpoint that tunnels there."""
    proc, shared = relayed_service(tmp_path)
    try:
        endpoint = read_endpoint(shared)
        assert endpoint.url.startswith("https://127.0.0.1:") and endpoint.fingerprint
        assert endpoint.token == read_endpoint(tmp_path / "scratch" / "services" / "app.json").token
        host, port = endpoint.url.removeprefix("https://").rsplit(":", 1)
        forward = LocalForward(host, int(port), endpoint.fingerprint, relay_key(endpoint.token))
        assert answer_through(forward.url, endpoint.token).json() == {"value": "TUNNEL"}
        assert requests.get(f"{forward.url}/word/x", timeout=5).status_code == 401  # the service's own token
        forged = LocalForward(host, int(port), "ab" * 32, relay_key(endpoint.token))  # not this run's certificate
        with pytest.raises(requests.ConnectionError):
            requests.get(f"{forged.url}/health", timeout=5)
        # A stranger who trusts any certificate gets nothing without the key: not the right one, not none at all
        for stranger in (LocalForward(host, int(port), endpoint.fingerprint, relay_key("not-the-token")),
                         LocalForward(host, int(port), endpoint.fingerprint)):
            with pytest.raises(requests.ConnectionError):
                requests.get(f"{stranger.url}/health", timeout=5)
        assert stranger_reply(host, int(port)) == b""  # closed before a byte reached the service
        with pytest.raises(requests.ConnectionError):  # the relay speaks TLS only
            requests.get(f"http://127.0.0.1:{port}/health", timeout=5)
    finally:
        proc.terminate()
        proc.wait(timeout=15)
    assert not shared.exists()  # unpublished when the service ends


def test_with_tls_turned_off_the_relay_still_takes_only_this_runs_key(tmp_path):
    """network.tls: false (a center's choice): the relay speaks plain TCP, the worker's variables name a plain
    tunnel that opens with the key, and a stranger's request is closed unanswered."""
    proc, shared = relayed_service(tmp_path, "--no-tls")
    try:
        endpoint = read_endpoint(shared)
        assert endpoint.url.startswith("http://127.0.0.1:") and endpoint.fingerprint is None
        env = remote_services_environment(shared.parent, ["app"])
        local = env["ALLOCSTACK_APP_ENDPOINT"]
        assert local.startswith("http://127.0.0.1:") and local != endpoint.url
        assert answer_through(local, endpoint.token).json() == {"value": "TUNNEL"}
        with socket.create_connection(("127.0.0.1", int(endpoint.url.rsplit(":", 1)[1])), timeout=10) as stranger:
            stranger.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"a" * 120 + b"\r\n\r\n")
            assert stranger.recv(1024) == b""
    finally:
        proc.terminate()
        proc.wait(timeout=15)


def test_a_tunnel_connection_ends_at_both_nodes_as_soon_as_the_client_is_done(tmp_path):
    """TLS cannot half-close: when a program off the first node closes its connection to the tunnel's local end, the
    relay's connection to the service ends too (before, it stayed open, one for each request, until the run ended)."""
    ended = threading.Event()
    listener = socket.create_server(("127.0.0.1", 0))

    def serve_one() -> None:
        conn, _ = listener.accept()
        with conn:
            conn.recv(100)
            conn.sendall(b"+PONG\r\n")
            conn.settimeout(20)
            if conn.recv(100) == b"":  # EOF: the tunnel closed its side
                ended.set()

    threading.Thread(target=serve_one, daemon=True).start()
    context, fingerprint = tls_context("127.0.0.1", "allocstack-test", tmp_path)
    relay_port = relay_to_loopback("127.0.0.1", context, listener.getsockname()[1], relay_key("t"))
    local = LocalForward("127.0.0.1", relay_port, fingerprint, relay_key("t"))
    with socket.create_connection(("127.0.0.1", local.port), timeout=10) as client:
        client.sendall(b"PING\r\n")
        assert client.recv(100) == b"+PONG\r\n"
    assert ended.wait(10), "the service's connection stayed open after the client closed its own"
    listener.close()


def test_a_long_running_worker_off_the_first_node_reaches_your_service_through_the_tunnel(tmp_path):
    """replica.py with --remote-services: the variables name the local end of the service's tunnel."""
    service = tmp_path / "service.py"
    service.write_text(SERVICE)
    client = tmp_path / "client.py"
    client.write_text("import os, urllib.request\n"
                      "request = urllib.request.Request(os.environ['ALLOCSTACK_APP_ENDPOINT'] + '/word/replica',\n"
                      "    headers={'Authorization': 'Bearer ' + os.environ['ALLOCSTACK_APP_TOKEN']})\n"
                      "print(os.environ['ALLOCSTACK_APP_HOST'], urllib.request.urlopen(request, timeout=5).read().decode())\n")
    shared = tmp_path / "state" / "services" / "app.json"
    proc = subprocess.Popen([sys.executable, str(SCRIPTS / "app_service.py"), "--command-json",
                             json.dumps([sys.executable, str(service)]), "--scratch", str(tmp_path / "scratch"),
                             "--network-endpoint-file", str(shared), "--address", "127.0.0.1"])
    try:
        ready = time.monotonic() + 20
        while not shared.exists():
            assert time.monotonic() < ready
            time.sleep(0.05)
        time.sleep(1)  # the service starts slowly on purpose
        gate = tmp_path / "gate.json"
        gate.write_text('{"status": "ready"}')
        done = run_script("replica.py", "--worker-id", "worker-03", "--index", 2, "--workers", 3, "--command-json",
                          json.dumps([sys.executable, str(client)]), "--scratch", tmp_path / "other-node",
                          "--uses", "app", "--gate-record", gate, "--remote-services", shared.parent,
                          "--record", tmp_path / "worker-03.json", env={"ALLOCSTACK_SCRATCH": ""})
    finally:
        proc.terminate()
        proc.wait(timeout=15)
    assert done.returncode == 0, done.stderr
    assert '127.0.0.1 {"value": "REPLICA"}' in done.stdout  # a loopback endpoint here, the service there
    assert json.loads((tmp_path / "worker-03.json").read_text())["status"] == "done"
