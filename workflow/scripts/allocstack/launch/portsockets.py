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
import os
import stat
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit

from ..common import names
from .tunnel import relay

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
                inbound: dict[str, tuple[str, int]] | None = None) -> None:
    """A socket for each of ``published`` (0600 in a 0700 directory), carried to its port, and one for each
    listener of ``inbound`` (name -> its address and port), carried there, until cancelled."""
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
