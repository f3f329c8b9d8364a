"""The front of a service whose replicas listen in networks of their own (allocstack/launch/portsockets.py), with
real sockets in one process: each replica's carrier on its owner-only Unix socket, the front on a loopback port.
In a run each replica's program listens on the SAME port in its own namespace; here they share one, so each gets a
port of its own, which is all the carriers see of it.
"""

from __future__ import annotations

import asyncio
import stat
from pathlib import Path

from allocstack.common.endpoint import write_endpoint
from allocstack.launch import portsockets, tunnel


async def answering(word: bytes) -> asyncio.AbstractServer:
    """A program: answers ``word`` to every connection, then closes it."""

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(word)
        await writer.drain()
        writer.close()

    return await asyncio.start_server(answer, "127.0.0.1", 0)


async def ask(port: int) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        return await asyncio.wait_for(reader.read(), 10)
    finally:
        writer.close()


def test_the_front_takes_the_replicas_in_turn_and_skips_those_not_listening(tmp_path: Path):
    """Three replicas: the first two listening, the third's carrier not there yet; connections go to 1, 2, 1, 1 (the
    third skipped: its turn goes to the next in line, the first). Replica 2's program stops: its carrier answers no byte, so it is skipped too; with no replica
    listening a connection is closed without a byte."""

    async def scenario() -> list[bytes]:
        one, two = await answering(b"one"), await answering(b"two")
        carriers = [await portsockets.serve_carrier(tmp_path, "web", one.sockets[0].getsockname()[1]),
                    await portsockets.serve_carrier(tmp_path, "web-replica-2", two.sockets[0].getsockname()[1])]
        front = await portsockets.serve_front(tmp_path, 0, ["web", "web-replica-2", "web-replica-3"])
        port = front.sockets[0].getsockname()[1]
        answers = [await ask(port) for _ in range(4)]
        two.close()
        await two.wait_closed()
        answers += [await ask(port) for _ in range(3)]
        one.close()
        await one.wait_closed()
        answers.append(await ask(port))
        for server in (front, *carriers):
            server.close()
        return answers

    assert asyncio.run(scenario()) == [b"one", b"two", b"one", b"one", b"one", b"one", b"one", b""]
    carrier = portsockets.socket_path(tmp_path, portsockets.replica_socket("web-replica-2"))
    assert carrier.name == "replica-web-replica-2.sock" and stat.S_IMODE(carrier.stat().st_mode) == 0o600
    assert stat.S_IMODE(carrier.parent.stat().st_mode) == 0o700  # the owner's alone


def test_in_a_replicas_network_a_service_of_the_stack_is_on_its_own_port(tmp_path: Path):
    """serve_forward: a connection to the service's port is carried through the service's published socket
    (portsockets.serve, as the stack's network makes it) to where the service listens."""

    async def scenario() -> bytes:
        store = await answering(b"stored")
        (tmp_path / "services").mkdir()
        write_endpoint(tmp_path / "services/store.json", f"http://127.0.0.1:{store.sockets[0].getsockname()[1]}", "t",
                       "v")
        ready = asyncio.Event()
        published = asyncio.ensure_future(portsockets.serve(tmp_path, ["store"], ready.set))
        await ready.wait()
        forward = await portsockets.serve_forward(tmp_path, "store", 0)
        answer = await ask(forward.sockets[0].getsockname()[1])
        published.cancel()
        for server in (forward, store):
            server.close()
        return answer

    assert asyncio.run(scenario()) == b"stored"


def test_a_relay_whose_client_closed_is_not_collected_while_the_other_side_is_still_open(tmp_path: Path, caplog):
    """The client has its answer and closes; the program keeps its side open a moment longer. The relays (the
    front's and the carrier's) still wait for it: held, they finish and close it; unheld (tunnel.RELAYING), the
    garbage collector took them mid-way, each one an error line in the log ("Task was destroyed but it is pending!":
    CI of this change, in port_sockets.py's log)."""
    import gc

    async def scenario() -> bytes:
        closed = asyncio.Event()

        async def program(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.readline()
            writer.write(b"+PONG\r\n")
            await writer.drain()
            await asyncio.sleep(0.5)  # its side still open after the client closed
            writer.close()
            closed.set()

        served = await asyncio.start_server(program, "127.0.0.1", 0)
        carrier = await portsockets.serve_carrier(tmp_path, "web", served.sockets[0].getsockname()[1])
        front = await portsockets.serve_front(tmp_path, 0, ["web"])
        reader, writer = await asyncio.open_connection("127.0.0.1", front.sockets[0].getsockname()[1])
        writer.write(b"PING\r\n")
        answer = await reader.readline()
        writer.close()
        await asyncio.sleep(0.1)
        gc.collect()
        await asyncio.wait_for(closed.wait(), 5)
        await asyncio.sleep(0.1)
        for server in (front, carrier, served):
            server.close()
        return answer

    with caplog.at_level("ERROR", logger="asyncio"):
        answer = asyncio.run(scenario())
    assert answer == b"+PONG\r\n"
    assert not [record.getMessage() for record in caplog.records if record.name == "asyncio"]
    assert not tunnel.RELAYING  # each relay let go of once it ended


def test_the_front_relayed_to_the_other_nodes_takes_the_replicas_shared_token_as_its_key(tmp_path: Path):
    """port_sockets.py's relay of a front (more than one node): published where the other nodes look, with the token
    the replicas share (made here first, taken by a replica after), letting in only connections that open with that
    token's key; plain text here (network.tls: false), its TLS is the tunnel's own (tests/test_multinode.py)."""
    import socket
    import threading

    import port_sockets

    from allocstack.common.endpoint import read_endpoint, shared_token

    with socket.create_server(("127.0.0.1", 0)) as program:
        def answer() -> None:
            conn, _ = program.accept()
            with conn:
                conn.sendall(b"+PONG\r\n" if conn.recv(64) == b"PING\r\n" else b"-ERR\r\n")

        threading.Thread(target=answer, daemon=True).start()
        published = tmp_path / "state" / "services" / "web.json"
        published.parent.mkdir(parents=True, mode=0o700)
        (tmp_path / "state").chmod(0o700)
        port_sockets.relay_front(tmp_path, "web", published, ("127.0.0.1", 0), program.getsockname()[1], plain=True)
        endpoint = read_endpoint(published)
        token = shared_token(tmp_path / "services", "web")  # a replica starting after the relay: the same token
        assert endpoint.token == token and endpoint.service_port == program.getsockname()[1]
        port = int(endpoint.url.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port), timeout=10) as stranger:  # no key: closed unanswered
            stranger.sendall(b"PING\r\n" + b"x" * 100)
            assert stranger.recv(64) == b""
        with socket.create_connection(("127.0.0.1", port), timeout=10) as keyed:
            keyed.sendall(tunnel.relay_key(token) + b"PING\r\n")
            assert keyed.recv(64) == b"+PONG\r\n"
