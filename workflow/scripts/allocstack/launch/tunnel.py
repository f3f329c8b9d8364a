"""Your own service across nodes, encrypted without touching your programs: a pinned TLS tunnel.

Your service (config ``service.command``) listens on the first node's loopback, as with one
node. With more than one node, workers on the other nodes must reach it over the network,
and that traffic must be encrypted like the coordinator's. allocstack cannot give your
protocol TLS, so it carries it:

* on the first node, :func:`serve_tls` listens on the node's network address (the same
  policy as the coordinator's, config ``network.interface``) with the run's own certificate
  (``tls.tls_context``) and relays each connection to your service's loopback port;
* in each worker off the first node, :class:`LocalForward` listens on that node's loopback
  and relays each connection over TLS to the first node, accepting only the certificate
  whose SHA-256 fingerprint was published with the endpoint (no CA), so your worker program
  talks to ``$ALLOCSTACK_APP_ENDPOINT`` = ``http://127.0.0.1:PORT`` exactly as on one node.

The relay lets in only the stack's own tunnels: each opens with :func:`relay_key` (the service's
per-run token, sent inside TLS); a connection that does not is closed before a byte reaches
your service, so a stranger on the cluster network who connects gets nothing, not even with
``network.tls: false``. Your service's own token (``$ALLOCSTACK_APP_TOKEN``) still says who may
use it: the tunnel only moves bytes.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import os
import socket
import ssl
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar
from urllib.parse import urlsplit

from ..common.endpoint import read_endpoint, service_variables
from ..common.errors import AllocstackError
from ..common.jsonio import atomic_write_json
from ..common.names import in_private_network
from ..common.tls import certificate_matches, client_context

CHUNK = 64 * 1024
T = TypeVar("T")
#: How long the relay waits for a connection's key before it closes it.
KEY_SECONDS = 30.0


def relay_key(token: str) -> bytes:
    """What a tunnel's local end sends first to the relay of a service: that service's per-run token."""
    return f"allocstack-relay {token}\n".encode()


async def keyed(reader: asyncio.StreamReader, key: bytes) -> bool:
    """Whether a connection opens with ``key`` (read within :data:`KEY_SECONDS`, compared in constant time)."""
    try:
        said = await asyncio.wait_for(reader.readexactly(len(key)), KEY_SECONDS)
    except (TimeoutError, asyncio.IncompleteReadError, ConnectionError, OSError, ssl.SSLError):
        return False
    return hmac.compare_digest(said, key)


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
    """Copy ``reader`` to ``writer`` until EOF, then half-close where ``writer`` can (plain TCP, a Unix socket: so
    the other direction can finish); whether it did (TLS cannot)."""
    try:
        while data := await reader.read(CHUNK):
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
            return True
    except (ConnectionError, OSError, ssl.SSLError):
        writer.close()
    return False


#: Every relay under way (its task), held: the event loop holds tasks only weakly, the server's protocol lets go of
#: a connection's task once its client closed, and a stream the relay opened holds its reader only weakly, so a
#: relay still draining the other side after its client closed was an unreachable cycle, collected mid-way
#: ("Task was destroyed but it is pending!" in port_sockets.py's log, the other side closed by the collector).
RELAYING: set[asyncio.Task] = set()


async def relay(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 connect: asyncio.Future | asyncio.Task) -> None:
    """Relay one accepted connection to the connection ``connect`` opens; close both at the end (also the
    published ports' sockets of a private network: allocstack/launch/portsockets.py).

    The end: the side ``connect`` opened (toward the service) ends it when it ends; the accepted side's end is
    passed on as a half-close where the other side can take one (then the answer still comes back), and ends it
    where it cannot (TLS): a tunnel's connection is closed as soon as either of its programs is done with it, never
    left open between the nodes until the run ends.
    """
    task = asyncio.current_task()
    if task is not None:
        RELAYING.add(task)
        task.add_done_callback(RELAYING.discard)
    try:
        upstream_reader, upstream_writer = await connect
    except (ConnectionError, OSError, ssl.SSLError):
        writer.close()
        return
    onward = asyncio.ensure_future(_pump(reader, upstream_writer))
    back = asyncio.ensure_future(_pump(upstream_reader, writer))
    try:
        done, _ = await asyncio.wait((onward, back), return_when=asyncio.FIRST_COMPLETED)
        if back not in done and onward.result():  # the client half-closed, passed on: its answer still comes
            await back
    finally:  # no await here: a connection still open when the process ends must not hang it
        onward.cancel()
        back.cancel()
        writer.close()
        upstream_writer.close()


def serve_in_thread(listen: Callable[[], Awaitable[T]], name: str) -> tuple[asyncio.AbstractEventLoop, T]:
    """Start what ``listen()`` (a coroutine function) starts (a server, servers) on an event loop of its own, then
    run that loop in a daemon thread ``name`` for as long as this process runs; return the loop and what it
    started.

    :raises OSError: when it could not listen (in the caller, with its own reason).
    """
    loop = asyncio.new_event_loop()
    try:
        served = loop.run_until_complete(listen())
    except BaseException:
        loop.close()
        raise
    threading.Thread(target=loop.run_forever, name=name, daemon=True).start()
    return loop, served


def in_thread(listen: Callable[[], Awaitable[asyncio.AbstractServer]]) -> tuple[asyncio.AbstractEventLoop, int]:
    """:func:`serve_in_thread` for one server: the loop and the port it got.

    :raises OSError: when it could not listen.
    """
    loop, server = serve_in_thread(listen, "allocstack-tunnel")
    return loop, server.sockets[0].getsockname()[1]


def relay_to_loopback(address: str, context: ssl.SSLContext | None, target_port: int, key: bytes,
                      listen_port: int = 0) -> int:
    """On the first node: listen on ``address`` (at ``listen_port``; 0: any free one; TLS with ``context``, plain
    without) and relay every connection that opens with ``key`` (:func:`relay_key`) to ``127.0.0.1:target_port``;
    close any other. Returns the port it listens on."""

    async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if not await keyed(reader, key):
            writer.close()
            return
        await relay(reader, writer, asyncio.ensure_future(asyncio.open_connection("127.0.0.1", target_port)))

    async def listen() -> asyncio.Server:
        return await asyncio.start_server(accept, address, listen_port, ssl=context,
                                          ssl_handshake_timeout=30 if context else None)

    return in_thread(listen)[1]


def relay_service(interface: str, address: str, plain: bool, private_dir: Path, name: str, port: int, token: str,
                  listen_port: int = 0) -> tuple[str, str | None]:
    """Service ``name`` (``port`` on this namespace's loopback) relayed to the node's network address for the other
    nodes (:func:`relay_to_loopback`, keyed with ``token``; ``listen_port``: the one the stack's gateway carries in,
    0: any): its URL there and its certificate's fingerprint (None in plain text). A service's supervisor relays its
    own (app_service.py); the stack's network job relays the front of a service's replicas (port_sockets.py).

    :raises AllocstackError: ``network`` for a wrong address or one it cannot listen on.
    """
    from ..common.network import plan_listener

    listener = plan_listener(interface, address, plain, private_dir, name)
    try:
        listening = relay_to_loopback(listener.address, listener.tls, port, relay_key(token), listen_port)
    except OSError as exc:
        raise AllocstackError("network", f"cannot relay service {name} to {listener.address}: {exc}") from exc
    return listener.url(listening), listener.fingerprint


async def pinned_connection(host: str, port: int, fingerprint: str,
                            context: ssl.SSLContext) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A TLS connection to ``host:port`` whose certificate has SHA-256 ``fingerprint``.

    :raises ssl.SSLError: when it presents another certificate (nothing has been sent yet).
    """
    reader, writer = await asyncio.open_connection(host, port, ssl=context)
    if not certificate_matches(writer.get_extra_info("ssl_object").getpeercert(binary_form=True), fingerprint):
        writer.close()
        raise ssl.SSLError(f"{host}:{port} presented a certificate that is not this run's")
    return reader, writer


class LocalForward:
    """Off the first node: ``127.0.0.1:port`` here, relayed over pinned TLS to ``host:remote_port`` there (plain
    where ``fingerprint`` is None: ``network.tls: false``); each connection opens with ``key`` where it is given (a
    service's relay: :func:`relay_key`; the coordinator's own listener takes none)."""

    def __init__(self, host: str, remote_port: int, fingerprint: str | None, key: bytes | None = None,
                 port: int = 0) -> None:
        context = client_context()

        async def connect() -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
            if fingerprint is None:
                reader, writer = await asyncio.open_connection(host, remote_port)
            else:
                reader, writer = await pinned_connection(host, remote_port, fingerprint, context)
            if key is not None:
                writer.write(key)
                await writer.drain()
            return reader, writer

        async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await relay(reader, writer, asyncio.ensure_future(connect()))

        async def listen() -> asyncio.Server:
            return await asyncio.start_server(accept, "127.0.0.1", port)

        self.loop, self.port = in_thread(listen)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def forward_record(scratch: Path, name: str, host: str | None = None) -> Path:
    """Where node ``host``'s forwarder of service ``name`` (the stack's private network) says where it listens."""
    return scratch / "forwards" / f"{name}.{host or socket.gethostname()}.json"


def forward(published: Path, name: str, scratch: Path, poll: float = 0.1) -> LocalForward:
    """In the stack's private network on a node other than the first: once service ``name`` is published for the
    other nodes (``published/NAME.json``), its tunnel's local end on the service's own port at this namespace's
    loopback (free there: the namespace is the stack's alone), so ``NAME:PORT`` as written works on this node too;
    then :func:`forward_record` says so."""
    path = published / f"{name}.json"
    while True:
        try:
            endpoint = read_endpoint(path)
            break
        except AllocstackError:
            time.sleep(poll)
    there = urlsplit(endpoint.url)
    local = LocalForward(there.hostname or "", there.port or 0, endpoint.fingerprint, relay_key(endpoint.token),
                         port=endpoint.service_port or 0)
    record = forward_record(scratch, name)
    record.parent.mkdir(mode=0o700, exist_ok=True)
    atomic_write_json(record, {"schemaVersion": 1, "service": name, "url": local.url})
    return local


def await_forward(scratch: Path, name: str, seconds: float = 120.0, poll: float = 0.05) -> str:
    """The URL of this node's forwarder of ``name``, once it listens.

    :raises AllocstackError: ``network`` when it has not said so within ``seconds``.
    """
    record, deadline = forward_record(scratch, name), time.monotonic() + seconds
    while True:
        try:
            return str(json.loads(record.read_bytes())["url"])
        except (OSError, ValueError, KeyError, TypeError):
            if time.monotonic() > deadline:
                raise AllocstackError("network", f"this node's forwarder of service {name} (the stack's private "
                                                 f"network) did not listen within {seconds:.0f} s: the log of its "
                                                 "job node_network says why") from None
            time.sleep(poll)


def remote_services_environment(published: Path, services: list[str], coordinator: Path | None = None,
                                scratch: Path | None = None) -> dict[str, str]:
    """Off the first node: the variables of every service in ``services`` (and of the built-in
    coordinator, from ``coordinator``), each endpoint a local end of its pinned TLS tunnel.

    ``published`` holds what each service published for the other nodes (``NAME.json``).
    Where the center turned TLS off (``network.tls: false``) a service's tunnel is plain (its
    relay still takes only this run's key) and the coordinator's variables name the first
    node's address directly. In the stack's private network (``scratch`` given, ``$ALLOCSTACK_NETWORK``
    private) a service's variables name this node's forwarder, on the service's own port (:func:`forward`).

    :raises AllocstackError: ``prerequisite`` when one has not published its endpoint.
    """
    documents = [(name, published / f"{name}.json", True) for name in services]
    if coordinator is not None:
        documents.append(("coordinator", coordinator, False))
    env: dict[str, str] = {}
    for name, path, service in documents:
        endpoint = read_endpoint(path)
        url = endpoint.url
        if service and scratch is not None and in_private_network(os.environ):
            url = await_forward(scratch, name)
        elif endpoint.fingerprint or service:
            there = urlsplit(url)
            key = relay_key(endpoint.token) if service else None
            url = LocalForward(there.hostname or "", there.port or 0, endpoint.fingerprint or None, key).url
        env.update(service_variables(name, url, endpoint.token))
    return env
