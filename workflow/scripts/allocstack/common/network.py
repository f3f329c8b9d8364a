"""More than one node: which address the coordinator binds, and which nodes the allocation has.

With ``nodes: 1`` (the default) everything stays on loopback. With more, workers on the
other nodes reach the coordinator over the allocation's network, and which address that is
is the center's network policy (config ``network.interface``): the IPv4 address of a named
interface (``ib0`` for IP over InfiniBand, say), or by default the address the node's own
hostname resolves to, which is what a cluster's nodes use to reach each other. An address
other nodes could never reach (loopback, link-local, unspecified, or an interface that is
missing or down) is refused with one line naming the key, before anything listens.
"""

from __future__ import annotations

import fcntl
import ipaddress
import socket
import ssl
import struct
from dataclasses import dataclass
from pathlib import Path

from .errors import AllocstackError
from .slurm import Query, query
from .slurm import allocation_nodes as expand_nodes

SIOCGIFADDR = 0x8915  # Linux: the IPv4 address of an interface
SIOCGIFFLAGS = 0x8913
IFF_UP = 0x1
POLICY_HINT = ("the bind address is config network.interface (an interface name; null = the address the "
               "node's hostname resolves to)")


def _ifreq(name: str) -> bytes:
    return struct.pack("256s", name.encode("ascii")[:15])


def interface_address(name: str) -> str:
    """The IPv4 address of interface ``name`` on this node.

    :raises AllocstackError: ``network`` when there is no such interface, it is down, or it has no IPv4 address.
    """
    names = sorted(entry[1] for entry in socket.if_nameindex())
    if name not in names:
        raise AllocstackError("network", f"network.interface {name!r} does not exist on {socket.gethostname()} "
                                         f"(it has: {', '.join(names)})")
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        flags = struct.unpack("16sH", fcntl.ioctl(probe.fileno(), SIOCGIFFLAGS, _ifreq(name))[:18])[1]
        if not flags & IFF_UP:
            raise AllocstackError("network", f"network.interface {name!r} is down on {socket.gethostname()}")
        try:
            packed = fcntl.ioctl(probe.fileno(), SIOCGIFADDR, _ifreq(name))[20:24]
        except OSError as exc:
            raise AllocstackError("network", f"network.interface {name!r} has no IPv4 address on "
                                             f"{socket.gethostname()}") from exc
    return socket.inet_ntoa(packed)


def hostname_address(hostname: str) -> str:
    """The first IPv4 address ``hostname`` resolves to.

    :raises AllocstackError: ``network`` when it does not resolve.
    """
    try:
        infos = socket.getaddrinfo(hostname, None, socket.AF_INET, socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise AllocstackError("network", f"this node's hostname {hostname!r} does not resolve ({exc.strerror}); "
                                         f"{POLICY_HINT}") from exc
    return str(infos[0][4][0])


def reachable_address(address: str, source: str) -> str:
    """``address`` when other nodes could reach it, else raise ``network`` naming ``source``."""
    ip = ipaddress.ip_address(address)
    if ip.is_loopback or ip.is_unspecified or ip.is_link_local or ip.is_multicast:
        raise AllocstackError("network", f"{source} is {address}, which other nodes cannot reach; {POLICY_HINT}")
    return address


def bind_address(interface: str | None, hostname: str | None = None) -> str:
    """The address the coordinator binds for the other nodes: config ``network.interface``, or the hostname's.

    :raises AllocstackError: ``network`` for a wrong or unreachable address.
    """
    if interface:
        return reachable_address(interface_address(interface), f"network.interface {interface!r}'s address")
    hostname = hostname or socket.gethostname()
    return reachable_address(hostname_address(hostname), f"the address this node's hostname {hostname!r} resolves to")


def allocation_nodes(here: str, job: str, ask: Query = query) -> list[str]:
    """The allocation's nodes, ``here`` (where the coordinator runs) first, then the others in Slurm's order.

    Asked of Slurm (``squeue``): inside the group job's own step ``$SLURM_JOB_NODELIST`` names
    only that step's node.

    :raises AllocstackError: ``prerequisite`` outside a Slurm allocation or when Slurm cannot tell.
    """
    if not here or not job:
        raise AllocstackError("prerequisite", "more than one node needs a Slurm allocation ($SLURM_JOB_ID)")
    listing = ask(["squeue", "--noheader", "--jobs", job, "--format=%N"])
    names = expand_nodes(listing.strip(), ask) if listing else None
    if not names:
        raise AllocstackError("prerequisite", f"Slurm did not tell the nodes of job {job} (squeue, scontrol)")
    return [here, *(name for name in names if name != here)]


def node_for(index: int, here: str, job: str, ask: Query = query) -> str:
    """The name of the allocation's node number ``index`` (0 = ``here``, the coordinator's).

    :raises AllocstackError: ``config`` when the allocation has fewer nodes (the job did not get config ``nodes``).
    """
    nodes = allocation_nodes(here, job, ask)
    if index >= len(nodes):
        raise AllocstackError("config", f"this component is placed on node {index + 1} but the allocation has "
                                        f"{len(nodes)} ({', '.join(nodes)}): config nodes is larger than what the "
                                        "job got")
    return nodes[index]


@dataclass
class NetworkListener:
    """Where workers on other nodes reach a service of the first node: the address, and TLS
    (None = plain text, where the center's config says so) with the fingerprint clients pin."""

    address: str
    tls: ssl.SSLContext | None
    fingerprint: str | None

    def url(self, port: int) -> str:
        return f"{'https' if self.tls else 'http'}://{self.address}:{port}"


def plan_listener(interface: str, address: str, plain: bool, private_dir: Path, name: str) -> NetworkListener:
    """The bind address (``address`` as given, else config ``network.interface``'s, else the
    hostname's) and, unless ``plain``, a TLS context with a new certificate for it.

    :raises AllocstackError: ``network`` for a wrong or unreachable address, ``prerequisite``
        when the certificate cannot be made.
    """
    from .tls import tls_context

    address = address or bind_address(interface or None, socket.gethostname())
    if plain:
        return NetworkListener(address, None, None)
    context, fingerprint = tls_context(address, f"allocstack-{name}-{socket.gethostname()}", private_dir)
    return NetworkListener(address, context, fingerprint)
