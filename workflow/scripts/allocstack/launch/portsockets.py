"""Published ports that reach their owner only (config ``network.isolation: private``, issue 32 point 4).

In the stack's private network (allocstack/launch/stacknet.py) nothing outside the stack reaches a port, its owner
included. Each published port (each of your services, and the built-in coordinator's status page) becomes a Unix
socket ``SCRATCH/ports/NAME.sock`` (:func:`socket_path`: in a 0700 directory in /tmp where that path is too long
for a socket) bound inside the namespace (a socket on a path is reached through the filesystem, not the network),
in the run's 0700 scratch, so the owner alone can use it; each connection to it is
carried to the service's loopback port in the namespace, read from the endpoint the service published when the
connection comes (so a socket can be made before its service started, and follows a restarted service).

From a laptop, OpenSSH forwards a local port to it: ``ssh -N -L 8888:SCRATCH/ports/NAME.sock NODE`` (OpenSSH 6.7
and later); on the node itself, ``curl --unix-socket SCRATCH/ports/NAME.sock http://localhost/``.

A service of more than one replica that listens runs each replica in a namespace of its own, on the service's own
port there (allocstack/launch/stacknet.py). :func:`serve_front` is its port in the stack's namespace: each
connection goes to the next replica in turn, through that replica's socket (``ports/replica-NAME.sock``,
``ports/replica-NAME-replica-K.sock``), which :func:`serve_carrier` (its supervisor, in the replica's namespace) carries to
the port there. The carrier first connects to the replica's program and answers one byte (:data:`ACCEPTED`) once
it has: a replica that is not listening (starting, restarting, ended) is then skipped for the next one, as a Unix
socket would accept the connection whatever the program behind it does. Compose's own replicas are reached the same
way, by one name, in turn (its DNS round-robin). In the replica's namespace, :func:`serve_replica_network` also puts
each service of the stack the replica may use on its own port there, carried through that service's published
socket to the stack's namespace: ``NAME:PORT`` works in a replica as it does in the stack.

With more than one node the same way in carries the other nodes' connections (:func:`inbound_name`): the first
node's listeners for them (the coordinator's TLS listener, each service's keyed TLS relay) each get a socket too,
carried to that listener's address and port in the namespace; stack_network.py's gateway, outside the namespace,
carries each connection to the same port on the node's address into it.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import itertools
import os
import stat
from collections.abc import Awaitable, Callable
from pathlib import Path
from urllib.parse import urlsplit

from ..common import names
from ..common.endpoint import LOOPBACK
from .tunnel import relay, serve_in_thread

PORTS_DIR = names.PORTS
COORDINATOR = names.COORDINATOR_PORT


#: A socket's path must fit ``sun_path`` (108 bytes with its NUL): the kernel refuses a longer one, to bind and to
#: connect, and a center's scratch paths are often longer.
SUN_PATH = 107


def socket_path(scratch: Path, name: str) -> Path:
    """Where ``name``'s published port is: in the run's scratch (``SCRATCH/ports/NAME.sock``) where that path fits
    the kernel's limit, else in a private directory of the user's in /tmp named after the run's scratch
    (``/tmp/allocstack-UID-ports-DIGEST/NAME.sock``, 0700 like the scratch)."""
    inside = scratch / PORTS_DIR / f"{name}.sock"
    if len(os.fsencode(inside)) <= SUN_PATH:
        return inside
    digest = hashlib.sha256(os.fsencode(scratch)).hexdigest()[:16]
    # /tmp by name, not $TMPDIR (often the long scratch itself); made and checked private: private_directory
    return Path("/tmp") / f"allocstack-{os.getuid()}-ports-{digest}" / f"{name}.sock"  # noqa: S108


def private_directory(path: Path) -> None:
    """Make ``path`` 0700, or take it where it is already the user's own 0700 directory (not a link).

    :raises AllocstackError: ``network`` for anything else there (another user's, a link, open to others).
    """
    from ..common.errors import AllocstackError

    with contextlib.suppress(FileExistsError):
        path.mkdir(mode=0o700)
    found = path.lstat()
    if not stat.S_ISDIR(found.st_mode) or found.st_uid != os.getuid() or stat.S_IMODE(found.st_mode) != 0o700:
        raise AllocstackError("network", f"{path} is not a private directory of yours (it is where the stack's "
                                         "published ports' sockets go): remove it")


def endpoint_file(scratch: Path, name: str) -> Path:
    """The endpoint ``name`` publishes (the coordinator's, or a service's) in the run's scratch."""
    return scratch / (names.ENDPOINT if name == COORDINATOR else names.service_endpoint(name))


def target(scratch: Path, name: str) -> tuple[str, int] | None:
    """The loopback address and port ``name`` listens on now, None before it published one."""
    from ..common.endpoint import read_endpoint

    try:
        url = read_endpoint(endpoint_file(scratch, name)).url
    except Exception:  # noqa: BLE001 - not published yet (or being replaced): the connection is refused
        return None
    parts = urlsplit(url)
    if parts.hostname is None or parts.port is None:
        return None
    return parts.hostname, parts.port


async def _carry(where: Callable[[], tuple[str, int] | None], reader: asyncio.StreamReader,
                 writer: asyncio.StreamWriter) -> None:
    """One connection to a socket, carried to where its service listens now (closed if it has not published)."""
    found = where()
    if found is None:
        writer.close()
        return
    await relay(reader, writer, asyncio.ensure_future(asyncio.open_connection(*found)))


def inbound_name(name: str) -> str:
    """The socket name of ``name``'s listener for the other nodes (``in-coordinator``, ``in-NAME``)."""
    return f"in-{name}"


def _always(where: tuple[str, int]) -> Callable[[], tuple[str, int]]:
    """A target that does not move: a listener for the other nodes, at its fixed address."""
    return lambda: where


async def serve(scratch: Path, published: list[str], ready: Callable[[], None] = lambda: None,
                inbound: dict[str, tuple[str, int]] | None = None, fronts: dict[int, list[str]] | None = None) -> None:
    """A socket for each of ``published`` (0600 in a 0700 directory), carried to its port, one for each
    listener of ``inbound`` (name -> its address and port), carried there, and the front of each service whose
    replicas listen in namespaces of their own (``fronts``: its port -> its replicas), until cancelled."""
    targets: dict[str, Callable[[], tuple[str, int] | None]] = {
        name: functools.partial(target, scratch, name) for name in published}
    targets.update({inbound_name(name): _always(where) for name, where in (inbound or {}).items()})
    published = list(targets)
    servers = []
    for name, where in targets.items():
        path = socket_path(scratch, name)
        private_directory(path.parent)
        path.unlink(missing_ok=True)
        old = os.umask(0o177)
        try:
            servers.append(await asyncio.start_unix_server(functools.partial(_carry, where), path=str(path)))
        finally:
            os.umask(old)
    for port, instances in (fronts or {}).items():
        servers.append(await serve_front(scratch, port, instances))
    ready()
    try:
        await asyncio.Event().wait()
    finally:
        for server in servers:
            server.close()
        for name in published:
            with contextlib.suppress(OSError):
                socket_path(scratch, name).unlink()
            with contextlib.suppress(OSError):  # the directory in /tmp once empty (the scratch's goes with it)
                socket_path(scratch, name).parent.rmdir()


#: The byte a replica's carrier answers once its program took the connection (:func:`serve_carrier`).
ACCEPTED = b"\x01"
#: Seconds the front waits for that byte before it tries the next replica.
ACCEPT_SECONDS = 10.0


async def _to_program(port: int, writer: asyncio.StreamWriter) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A connection to the program at ``port`` on this namespace's loopback, :data:`ACCEPTED` said to the front."""
    connection = await asyncio.open_connection(LOOPBACK, port)
    writer.write(ACCEPTED)
    return connection


def replica_socket(instance: str) -> str:
    """The socket name of replica ``instance``'s way in from its front (``replica-NAME``, ``replica-NAME-replica-2``:
    ``NAME`` is the service's published port's)."""
    return f"replica-{instance}"


async def serve_carrier(scratch: Path, instance: str, port: int) -> asyncio.AbstractServer:
    """A replica's way in from the front: the owner-only socket ``ports/replica-INSTANCE.sock``, each connection
    carried to ``port`` on this namespace's loopback once the program accepted it (closed unanswered when it does
    not)."""
    path = socket_path(scratch, replica_socket(instance))
    private_directory(path.parent)
    path.unlink(missing_ok=True)

    async def carry(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await relay(reader, writer, asyncio.ensure_future(_to_program(port, writer)))

    old = os.umask(0o177)
    try:
        return await asyncio.start_unix_server(carry, path=str(path))
    finally:
        os.umask(old)


async def _accepting(paths: list[Path], first: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A connection to the first replica, from ``first`` on in turn, whose carrier says its program accepted it.

    :raises ConnectionRefusedError: when none does.
    """
    for offset in range(len(paths)):
        try:
            reader, writer = await asyncio.open_unix_connection(str(paths[(first + offset) % len(paths)]))
        except OSError:
            continue
        try:
            if await asyncio.wait_for(reader.readexactly(1), ACCEPT_SECONDS) == ACCEPTED:
                return reader, writer
        except (OSError, asyncio.IncompleteReadError):  # TimeoutError is an OSError
            pass
        writer.close()
    raise ConnectionRefusedError(f"no replica accepts ({', '.join(path.name for path in paths)})")


async def serve_front(scratch: Path, port: int, instances: list[str]) -> asyncio.AbstractServer:
    """The port of a service whose replicas each listen in a namespace of their own: ``port`` on this namespace's
    loopback, each connection carried to the next of ``instances`` (its replicas, by name) that accepts it."""
    paths = [socket_path(scratch, replica_socket(instance)) for instance in instances]
    turns = itertools.count()

    async def carry(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await relay(reader, writer, asyncio.ensure_future(_accepting(paths, next(turns) % len(paths))))

    return await asyncio.start_server(carry, LOOPBACK, port)


def to_socket(path: Path) -> Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]:
    """A server's handler: each connection carried to the Unix socket ``path`` (a published port's, a way in's)."""

    async def carry(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await relay(reader, writer, asyncio.ensure_future(asyncio.open_unix_connection(str(path))))

    return carry


async def serve_forward(scratch: Path, name: str, port: int) -> asyncio.AbstractServer:
    """Service ``name`` in a replica's namespace: ``port`` on its loopback, each connection carried through the
    service's published socket (``ports/NAME.sock``) to where it listens in the stack's namespace."""
    return await asyncio.start_server(to_socket(socket_path(scratch, name)), LOOPBACK, port)


def serve_replica_network(scratch: Path, instance: str, port: int, forwards: dict[str, int]) -> None:
    """In replica ``instance``'s own namespace, for as long as this process runs (a thread of its own): its way in
    from the front (:func:`serve_carrier`, to ``port``) and each of ``forwards`` (a service of the stack -> its port)
    on its own port (:func:`serve_forward`).

    :raises OSError: when one of them cannot listen.
    """

    async def listen() -> list[asyncio.AbstractServer]:
        servers = [await serve_carrier(scratch, instance, port)]
        for name, at in forwards.items():
            servers.append(await serve_forward(scratch, name, at))
        return servers

    serve_in_thread(listen, f"allocstack-replica-{instance}")
