"""A program of yours seen listening beyond loopback is named (issue 32, points 5 and 6): /proc/net/tcp* parsed
from real captured lines, the process tree of a real program read from /proc, and real local stacks (`snakemake
--cores 4`, no image) whose service binds 0.0.0.0 (warned, naming it) or 127.0.0.1 (no warning).

A test whose servers bind 0.0.0.0 runs in a network namespace of its own (:func:`private_network`: only its
loopback, made for the test and left after it): "every address" is then loopback alone, so nothing listens
beyond this machine's loopback even for a moment, while the test, its programs and the gate that looks share
that one namespace as a stack shares the node's. The servers listen and never accept, and live only for their
test."""

from __future__ import annotations

import ctypes
import json
import os
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from allocstack.common import listening, namespaces
from allocstack.common.listening import Found, Listener, Scan, decode_address, descendants, parent_of, parse_table
from allocstack.launch import exposure
from workflow_helpers import snakemake

#: The unspecified address: what a program binds to listen on every address (what these tests look for).
EVERYWHERE = "0.0.0.0"  # noqa: S104

# Captured on the test machine (x86_64, kernel 6.18) from real sockets: python bound these, then /proc/net/* read.
TCP = """\
  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   4: 00000000:18EE 00000000:0000 0A 00000000:00000001 00:00000000 00000000     0        0 215006 2 00000000b19ae699 100 0 0 10 0
  35: 020200C0:1B59 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 215853 1 00000000bc15aace 100 0 0 10 0
   3: 0100007F:A10B 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 174975 1 0000000039a8d911 100 0 0 10 0
1648: 0100007F:D642 0100007F:18EE 01 00000000:00000000 00:00000000 00000000     0        0 215010 2 0000000003f540a0 20 0 0 10 -1
1677: 0100007F:18EE 0100007F:D642 01 00000000:00000000 00:00000000 00000000     0        0 0 1 0000000087a13755 20 0 0 10 -1
1827: 0100007F:A7DA 0100007F:18EB 06 00000000:00000000 03:0000100B 00000000     0        0 0 3 0000000071c2092d
"""
TCP6 = """\
  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0000000000000000FFFF000000000000:18EF 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 215005 1 00000000a5572849 100 0 0 10 0
   1: 00000000000000000000000000000000:18EB 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 215002 1 00000000a87c4aee 100 0 0 10 0
   2: 00000000000000000000000001000000:18EC 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 215003 1 00000000160d730b 100 0 0 10 0
   3: 0000000000000000FFFF00000100007F:18ED 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 215004 1 00000000ce20a24b 100 0 0 10 0
"""
UDP = """\
   sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode ref pointer drops
10189: 00000000:14E9 00000000:0000 07 00000000:00000000 00:00000000 00000000     0        0 215007 2 00000000c2a24e73 0
10190: 0100007F:14EA 00000000:0000 07 00000000:00000000 00:00000000 00000000     0        0 215008 2 000000005f4c9012 0
10191: 0100007F:9C40 0100007F:0035 01 00000000:00000000 00:00000000 00000000     0        0 215011 2 000000005f4c9013 0
"""


def test_listening_tcp_sockets_are_parsed_from_real_lines_established_ones_are_not():
    found = parse_table(TCP, "tcp")
    assert [(f.address, f.port, f.inode) for f in found] == [
        (EVERYWHERE, 6382, 215006), ("192.0.2.2", 7001, 215853), ("127.0.0.1", 41227, 174975)]
    assert [f.beyond_loopback for f in found] == [True, True, False]  # every address, the node's own, loopback
    assert found[0].shown == "0.0.0.0:6382"


def test_ipv6_words_are_decoded_and_ipv4_mapped_loopback_is_loopback():
    found = parse_table(TCP6, "tcp")
    assert [(f.address, f.port) for f in found] == [
        ("::ffff:0.0.0.0", 6383), ("::", 6379), ("::1", 6380), ("::ffff:127.0.0.1", 6381)]
    assert [f.beyond_loopback for f in found] == [True, True, False, False]
    assert found[1].shown == "[::]:6379"


def test_udp_counts_bound_unconnected_sockets_only():
    found = parse_table(UDP, "udp")
    assert [(f.proto, f.address, f.port) for f in found] == [("udp", EVERYWHERE, 5353), ("udp", "127.0.0.1", 5354)]


def test_addresses_are_words_in_the_machines_byte_order():
    assert decode_address("0100007F", "little") == "127.0.0.1"
    assert decode_address("7F000001", "big") == "127.0.0.1"
    assert decode_address("00000000000000000000000001000000", "little") == "::1"
    with pytest.raises(ValueError):
        decode_address("0100", "little")


def test_the_parent_is_read_after_a_command_name_with_spaces_and_parentheses():
    assert parent_of("4242 (a (b) c) S 77 4242 4242 0 -1 4194560") == 77
    assert sorted(descendants(1, {2: 1, 3: 2, 4: 1, 5: 9, 9: 8})) == [1, 2, 3, 4]


def test_a_socket_in_a_network_namespace_of_its_own_is_not_exposed():
    bound = Listener("tcp", EVERYWHERE, 80, 1)
    assert Found(bound, 10).exposed and not Found(bound, 10, own_namespace=True).exposed
    lines: list[str] = []
    exposure.report(Scan([Found(bound, 10, own_namespace=True)]), "service", "web", None, lines.append, set())
    assert lines == ["service web listens on 0.0.0.0:80 (tcp): in a network namespace of its own"]


def test_the_warning_names_the_program_the_address_and_the_fix_and_the_summary_says_each_once():
    fields = exposure.event_fields("service", "redis", Found(Listener("tcp", EVERYWHERE, 6379, 7), 99))
    line = exposure.warning_line(fields)
    assert line == ("warning: service redis listens on 0.0.0.0:6379 (tcp): reachable by other users and nodes (the "
                    "stack runs on the node's own network); bind 127.0.0.1 ($ALLOCSTACK_REDIS_HOST, the loopback "
                    "address) in its command or config")
    event = {"event": exposure.EVENT, **fields}
    assert exposure.summary_lines([event, {"event": "service-started"}, dict(event, listenerPid=100)]) == [line]


def test_whether_a_node_could_give_the_stack_a_network_of_its_own_is_read_from_its_kernel_settings():
    def world(**settings: str):
        return lambda name: settings.get(name.replace(".", "_"))

    assert namespaces.user_namespaces(world(user_max_user_namespaces="63432")) == (
        True, "user.max_user_namespaces is 63432")
    assert namespaces.user_namespaces(world(user_max_user_namespaces="0")) == (False, "user.max_user_namespaces is 0")
    assert namespaces.user_namespaces(world(user_max_user_namespaces="63432", kernel_unprivileged_userns_clone="0")) \
        == (False, "kernel.unprivileged_userns_clone is 0")  # Debian's switch, where the kernel has it
    assert namespaces.user_namespaces(world(user_max_user_namespaces="9", kernel_unprivileged_userns_clone="1",
                                            kernel_apparmor_restrict_unprivileged_userns="1"))[0] is False
    assert namespaces.user_namespaces(world()) == (
        False, "this kernel has no user namespaces (no user.max_user_namespaces)")
    line = namespaces.isolation_fact("node7", world(user_max_user_namespaces="0"))
    assert line == ("not possible on node7 (user.max_user_namespaces is 0): network.isolation private is refused "
                    "there, none runs the stack on the node's own network")
    assert namespaces.isolation_fact("node7", world(user_max_user_namespaces="9")) == (
        "possible on node7 (user.max_user_namespaces is 9; unprivileged user namespaces allowed)")
    # this machine's own setting, as the kernel has it
    with open("/proc/sys/user/max_user_namespaces") as handle:
        assert namespaces.read_setting("user.max_user_namespaces") == handle.read().strip()


# -- real processes --------------------------------------------------------------------------------------------

CLONE_NEWNET = 0x40000000


@pytest.fixture
def private_network():
    """This test (its thread, and every process it starts) in a new network namespace with only its loopback up;
    the namespace it was in again afterwards. Needs root (CAP_SYS_ADMIN): elsewhere the test skips, saying why."""
    if os.geteuid() != 0:
        pytest.skip("a server bound to every address is only started inside a network namespace of its own, "
                    "which this test makes as root (CI runs as root)")
    libc = ctypes.CDLL(None, use_errno=True)
    before, node = os.open("/proc/thread-self/ns/net", os.O_RDONLY), os.readlink("/proc/thread-self/ns/net")
    try:
        if libc.unshare(CLONE_NEWNET) != 0:
            pytest.fail(f"unshare(CLONE_NEWNET): {os.strerror(ctypes.get_errno())}")
        subprocess.run(["ip", "link", "set", "lo", "up"], check=True, timeout=30)
        shown = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=True, timeout=30).stdout
        assert os.readlink("/proc/thread-self/ns/net") != node and shown.count("\n") == 1, shown  # loopback alone
        yield
    finally:
        if libc.setns(before, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), "setns back to the test's own network namespace")
        os.close(before)


#: A parent whose child listens on every address (TCP), on loopback (TCP) and on every address (UDP), never accepting.
TREE = textwrap.dedent("""
    import os, socket, sys, time
    if len(sys.argv) > 2:
        time.sleep(float(sys.argv[2]))
        bound = []
        for kind, host in ((socket.SOCK_STREAM, "0.0.0.0"), (socket.SOCK_STREAM, "127.0.0.1"),
                           (socket.SOCK_DGRAM, "0.0.0.0")):
            s = socket.socket(socket.AF_INET, kind); s.bind((host, 0)); bound.append(s)
            kind == socket.SOCK_STREAM and s.listen(1)
        print(" ".join(str(s.getsockname()[1]) for s in bound), flush=True)
        time.sleep(600)
    else:
        child = __import__("subprocess").Popen([sys.executable, sys.argv[0], "child", sys.argv[1]])
        child.wait()
""")


@pytest.fixture
def tree(tmp_path, private_network):
    """Start the program: (the parent process, a function returning the child's three ports once bound)."""
    script = tmp_path / "tree.py"
    script.write_text(TREE)
    started = []

    def start(delay: float) -> subprocess.Popen:
        process = subprocess.Popen([sys.executable, str(script), str(delay)], stdout=subprocess.PIPE, text=True)
        started.append(process)
        return process

    yield start
    for process in started:
        for pid in descendants(process.pid, listening.read_parents())[::-1]:
            subprocess.run(["kill", "-9", str(pid)], check=False)
        process.wait()


def ports_of(process: subprocess.Popen) -> list[int]:
    return [int(port) for port in process.stdout.readline().split()]


def test_the_sockets_of_a_real_programs_child_are_found_in_its_process_tree(tree):
    program = tree(0)
    every, loopback, udp = ports_of(program)
    scan = listening.listening(program.pid)
    seen = {(f.listener.proto, f.listener.address, f.listener.port): f for f in scan.found}
    assert set(seen) == {("tcp", EVERYWHERE, every), ("tcp", "127.0.0.1", loopback), ("udp", EVERYWHERE, udp)}
    assert seen[("tcp", EVERYWHERE, every)].pid != program.pid  # held by the child, found through the tree
    assert {(f.listener.proto, f.listener.port) for f in scan.exposed} == {("tcp", every), ("udp", udp)}
    assert scan.unreadable == {}
    # named by pid and start, as a service publishes itself for its gate: another process under that pid is not it
    lines: list[str] = []
    started = listening.process_start(program.pid)
    assert started == listening.started_at(Path(f"/proc/{program.pid}/stat").read_text()) and started > 0
    assert exposure.look_at((program.pid, started + 1), "service", "kv", None, lines.append) == []
    assert lines == [(f"service kv: its process {program.pid} is not visible from here (a PID namespace of its "
                      "own?): what it listens on is not looked at")]
    assert len(exposure.look_at((program.pid, started), "service", "kv", None, lines.append)) == 2
    quiet = subprocess.Popen(["sleep", "60"])
    try:
        assert listening.listening(quiet.pid).found == []  # another process, listening on nothing
    finally:
        quiet.kill()
        quiet.wait()


def test_a_supervisor_watching_its_program_names_a_port_opened_after_its_start_once(tree, tmp_path):
    program = tree(0.6)  # binds after the watcher's first look
    events, lines = tmp_path / "events.jsonl", []
    stop = exposure.watch(program.pid, "worker", "worker-01", events, lines.append)
    try:
        every, loopback, udp = ports_of(program)
        while len([line for line in lines if line.startswith("warning:")]) < 2:  # the test's own timeout bounds it
            time.sleep(0.05)
        exposure.look(program.pid, "worker", "worker-01", events, lines.append)  # a gate looking too
    finally:
        stop.set()
    warned = sorted(line for line in lines if line.startswith("warning:"))
    assert len(warned) == 4 and warned[0::2] == warned[1::2]  # the second looker says each in its own log
    assert {line.split(":", 1)[1].split(" (")[0] for line in warned} == {
        f" worker worker-01 listens on 0.0.0.0:{every}", f" worker worker-01 listens on 0.0.0.0:{udp}"}
    assert all(line.endswith("bind 127.0.0.1 (the loopback address) in its command or config") for line in warned)
    assert f"worker worker-01 listens on 127.0.0.1:{loopback} (tcp): loopback only" in lines
    recorded = [json.loads(line) for line in events.read_text().splitlines()]
    assert sorted((e["proto"], e["port"]) for e in recorded) == [("tcp", every), ("udp", udp)]  # once each
    assert all(e["event"] == "listening-exposed" and e["address"] == EVERYWHERE for e in recorded)


# -- real stacks ---------------------------------------------------------------------------------------------------

PYTHON = json.dumps(sys.executable)
#: The service: listens on argv[1] at its port, never accepts (a tcp gate's connection completes in the backlog).
SERVER = ("import os, socket, sys, time; s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1);"
          " s.bind((sys.argv[1], int(os.environ['ALLOCSTACK_KV_PORT']))); s.listen(8)\nwhile True: time.sleep(1)")


def run_stack(project, run: str, host: str):
    """The stack on the node's own network (network.isolation none, where a center turns user namespaces off): what
    its programs bind beyond loopback is named; in the stack's private network (the default) nothing is exposed."""
    (project / f"config/{run}.yaml").write_text(textwrap.dedent(f"""
        run: {run}
        tasks: null
        expected: null
        workers: 1
        worker: {{mode: long-running, command: [{PYTHON}, -c, pass]}}
        services:
          kv: {{command: [{PYTHON}, -c, {json.dumps(SERVER)}, "{host}"], readiness: {{mode: tcp}}}}
        verify: {{command: [{PYTHON}, -c, pass]}}
        network: {{isolation: none}}
    """))
    done = snakemake(project, "--cores", "4", "--configfile", f"config/{run}.yaml")
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]  # a warning, not a failure
    events = [json.loads(line) for line in (project / f"results/{run}/events.jsonl").read_text().splitlines()]
    port = int(next(e for e in events if e["event"] == "service-started")["endpoint"].rsplit(":", 1)[1])
    return done, events, port


def test_a_service_bound_to_every_address_is_named_in_its_gates_log_the_events_and_the_summary(project,
                                                                                              private_network):
    done, events, port = run_stack(project, "open", EVERYWHERE)
    line = (f"warning: service kv listens on 0.0.0.0:{port} (tcp): reachable by other users and nodes (the stack "
            "runs on the node's own network); bind 127.0.0.1 ($ALLOCSTACK_KV_HOST, the loopback address) in its "
            "command or config")
    assert line in (project / "logs/await_service/open/kv.log").read_text().splitlines()
    exposed = [e for e in events if e["event"] == "listening-exposed"]
    assert exposed and {(e["name"], e["address"], e["port"]) for e in exposed} == {("kv", EVERYWHERE, port)}
    gate = next(e for e in events if e["event"] == "gate-passed" and e.get("service") == "kv")
    assert exposed[0]["t"] >= gate["t"]
    assert f"  {line}" in done.stdout.splitlines()  # the end-of-run summary on the terminal
    record = (project / "results/open/decision-record.md").read_text()
    assert "- your programs' network: `the node's own: what a service, long-running worker" in record
    possible, why = namespaces.user_namespaces()
    could = "possible" if possible else "not possible"
    wanted = f"- a private network for the stack (unprivileged user namespaces): `{could} on {socket.gethostname()} ({why}"
    assert wanted in record


def test_a_service_bound_to_loopback_is_not_warned_about(project):
    done, events, port = run_stack(project, "closed", "127.0.0.1")
    gate_log = (project / "logs/await_service/closed/kv.log").read_text()
    assert f"service kv listens on 127.0.0.1:{port} (tcp): loopback only" in gate_log  # it did look
    assert "warning:" not in gate_log + (project / "logs/serve_service/closed/kv.log").read_text()
    assert not [e for e in events if e["event"] == "listening-exposed"]
    assert "warning:" not in done.stdout + done.stderr


#: A program (a long-running worker, or main) that listens on every address (UDP) and ends once its supervisor has
#: named it: it waits for the event in its own event log (argv[1].jsonl, beside the named volume in the run's
#: scratch), as the test cannot wait from outside.
NAMED_PROGRAM = (
    "import os, pathlib, socket, sys, time; s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind(('0.0.0.0', 0))\n"
    "log = pathlib.Path(os.environ['ALLOCSTACK_VOLUME_SCRATCHPAD']).parents[1] / 'events' / (sys.argv[1] + '.jsonl')\n"
    "for _ in range(1200):\n"
    "    if log.exists() and 'listening-exposed' in log.read_text(): sys.exit(0)\n"
    "    time.sleep(0.05)\n"
    "sys.exit('never named')")
PASS = f"[{PYTHON}, -c, pass]"


def named_program(name: str) -> str:
    return f"[{PYTHON}, -c, {json.dumps(NAMED_PROGRAM)}, {name}]"


@pytest.mark.parametrize(("kind", "name"), [("worker", "worker-01"), ("main", "producer")])
def test_a_long_running_worker_or_main_listening_on_every_address_is_named_by_its_supervisor(project, kind, name,
                                                                                            private_network):
    if kind == "worker":
        stack = f"worker: {{mode: long-running, command: {named_program(name)}}}"
    else:  # a long-running worker that ends at once beside it
        stack = (f"worker: {{mode: long-running, command: {PASS}}}\n"
                 f"services: {{{name}: {{command: {named_program(name)}}}}}\nmain: {name}")
    (project / "config/program.yaml").write_text("\n".join([
        "run: program", "tasks: null", "expected: null", "workers: 1", "volumes: [scratchpad]", stack,
        f"verify: {{command: {PASS}}}", "network: {isolation: none}", ""]))
    done = snakemake(project, "--cores", "4", "--configfile", "config/program.yaml")
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    events = [json.loads(line) for line in (project / "results/program/events.jsonl").read_text().splitlines()]
    exposed = [e for e in events if e["event"] == "listening-exposed"]
    assert [(e["kind"], e["name"], e["proto"], e["address"]) for e in exposed] == [(kind, name, "udp", EVERYWHERE)]
    line = exposure.warning_line(exposed[0])
    assert line.endswith("bind 127.0.0.1 (the loopback address) in its command or config")
    log = "logs/run_worker/program/worker-01.log" if kind == "worker" else "logs/run_main/program.log"
    assert line in (project / log).read_text().splitlines()
    assert f"  {line}" in done.stdout.splitlines()
    record = (project / "results/program/decision-record.md").read_text()
    assert "- your programs' network: `the node's own" in record
