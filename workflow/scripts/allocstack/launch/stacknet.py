"""The stack's own network on its node (config ``network.isolation: private``, issue 32): what Compose gives every
stack, made without privileges.

One holder per node (workflow/scripts/stack_network.py, a service job every component consumes) makes a user and
network namespace (:func:`make_namespace`: the user's own uid and gid mapped to themselves, so every program keeps
its identity; only loopback, brought up), attaches Debian's ``pasta`` to it from outside (:func:`pasta_argv`: the
namespace's way out, as Compose's bridge is) and publishes :class:`Held` in ``SCRATCH/network.json``. Every other
component of the stack on the node is started through ``nsenter`` into it (:func:`join_prefix`, by launch.py inside
its job step, before the container runtime): whatever a program binds there, ``0.0.0.0`` included, is reachable by
the stack alone, neither by another user of the node nor by another node.

A service of more than one replica that listens (config ``services.<name>.replicas`` and ``port``) gets one
namespace more per replica, made the same way by the same holder job beside the stack's (a sibling, published as
``SCRATCH/network-HOST.NAME-replica-K.json``, its own pasta as its way out): each replica listens on the service's
own port in its own namespace, as each Compose replica does in its own container, and the stack reaches them all
through one front on that port in the stack's namespace (allocstack/launch/portsockets.py ``serve_front``).

pasta forwards no port either way (``--tcp-ports none`` ...: its default, ``auto``, would publish every port a
program binds, which is what the namespace is there to prevent); a program reaches servers outside the stack
through it as the user's own connections (the default gateway's address is the node's own loopback, pasta's
``--map-gw``). pasta rather than slirp4netns: it needs no helper to configure the namespace (``--config-net``
copies the node's address and routes), and it attaches to a namespace by its holder's pid.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import struct
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..common import jsonio
from ..common.errors import AllocstackError
from ..common.namespaces import CLONE_NEWNET, CLONE_NEWUSER, unshare_mapped_to_self

SIOCGIFFLAGS = 0x8913
SIOCSIFFLAGS = 0x8914
IFF_UP = 0x1
#: The holder's component (and job step) name.
HOLDER = "stack-network"
#: How long a component waits for its node's namespace to be held (the holder starts with the stack's first jobs).
WAIT_SECONDS = 60.0


@dataclass(frozen=True)
class Held:
    """A node's namespace: its holder's pid and start time (``/proc/PID/stat``'s, so a reused pid is told apart),
    whether components join its user namespace too (everyone but root: root joins the network alone), and (the
    first node, with more than one) the port on the node's address that carries in each listener the other nodes use
    (stack_network.py's gateway)."""

    pid: int
    started_at: int
    user: bool
    inbound: dict[str, int] = field(default_factory=dict)

    def document(self) -> dict:
        return {"schemaVersion": 1, "pid": self.pid, "startedAt": self.started_at, "user": self.user,
                "inbound": self.inbound}


def started_at(pid: int) -> int | None:
    """``pid``'s start time in clock ticks since boot (``/proc/PID/stat`` field 22), None if it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text(encoding="ascii", errors="replace")
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])


def join_prefix(held: Held, nsenter: str = "nsenter") -> list[str]:
    """The command that runs the rest of an argv in ``held``'s namespace (nsenter execs it: same pid)."""
    argv = [nsenter, f"--target={held.pid}"]
    if held.user:
        argv += ["--user", "--preserve-credentials"]
    return [*argv, "--net", "--"]


def pasta_argv(pasta: str, pid: int, uid: int, pid_file: Path, template: tuple[str, str] | None = None) -> list[str]:
    """pasta attached to ``pid``'s namespace from outside: the way out, no port forwarded in either direction.
    ``template``: on a node without a default route (compute nodes often have none), the interface whose address
    and routes the namespace copies, and a gateway for it (that address itself: every packet goes to pasta)."""
    # root: pasta would drop to nobody, who cannot enter the holder's namespaces; anyone else stays who they are
    runas = ["--runas", "0"] if uid == 0 else []
    routes = ["--interface", template[0], "--gateway", template[1]] if template else []
    return [pasta, "--foreground", "--quiet", "--config-net", *runas, *routes, "--tcp-ports", "none", "--udp-ports",
            "none", "--tcp-ns", "none", "--udp-ns", "none", "--pid", str(pid_file), str(pid)]


def default_route_interface(routes: str | None = None) -> str | None:
    """The interface of the first IPv4 default route in ``/proc/net/route`` (``routes``: its text; None: this
    node's), None where there is none."""
    routes = Path("/proc/net/route").read_text(encoding="ascii") if routes is None else routes
    return next((line.split()[0] for line in routes.splitlines()[1:] if line.split()[1:2] == ["00000000"]), None)


def template_interface(address: str) -> tuple[str, str] | None:
    """For :func:`pasta_argv`: the interface that holds ``address``, and that address as the gateway (None where no
    interface holds it)."""
    from ..common.network import interface_address

    for _, name in socket.if_nameindex():
        try:
            if interface_address(name) == address:
                return name, address
        except AllocstackError:
            continue
    return None


def make_namespace() -> None:
    """In this (single-threaded) process: a user namespace mapping its uid and gid to themselves and a network
    namespace in it, its loopback up. The process keeps its capabilities there until it execs (it must not)."""
    unshare_mapped_to_self(CLONE_NEWUSER | CLONE_NEWNET)
    with socket.socket() as probe:
        request = struct.pack("16sh", b"lo", 0)
        flags = struct.unpack("16sh", fcntl.ioctl(probe, SIOCGIFFLAGS, request))[1]
        fcntl.ioctl(probe, SIOCSIFFLAGS, struct.pack("16sh", b"lo", flags | IFF_UP))


def record_path(scratch: Path, host: str | None = None, space: str = "") -> Path:
    """Where node ``host``'s holder (None: this node's) is published in the run's scratch: one file a node, as the
    scratch may be on a filesystem the nodes share. ``space``: the namespace of a replica of a service that listens
    (its own, beside the stack's: the module's docstring), not the stack's."""
    from ..common.names import NETWORK

    return scratch / f"{NETWORK}-{host or socket.gethostname()}{f'.{space}' if space else ''}.json"


def holder_name(node_index: int) -> str:
    """The holder's component (and job step) name on node ``node_index`` (0 = the first)."""
    return HOLDER if node_index == 0 else f"{HOLDER}-node-{node_index + 1}"


def publish(scratch: Path, held: Held, space: str = "") -> None:
    jsonio.atomic_write_json(record_path(scratch, space=space), held.document())


def read_held(scratch: Path, space: str = "") -> Held | None:
    """The node's namespace (``space``: a replica's) as its record says, if its holder still runs (an earlier
    attempt's is not)."""
    try:
        document = json.loads(record_path(scratch, space=space).read_bytes())
        held = Held(int(document["pid"]), int(document["startedAt"]), bool(document["user"]),
                    {str(name): int(port) for name, port in document.get("inbound", {}).items()})
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return held if started_at(held.pid) == held.started_at else None


def await_held(scratch: Path, component: str, holder: str = HOLDER, seconds: float = WAIT_SECONDS,
               poll: float = 0.05, space: str = "") -> Held:
    """This node's namespace (``space``: a replica's), once its holder (the component ``holder``) published it; one
    [network] line after ``seconds``."""
    from ..common.names import component_ended

    deadline = time.monotonic() + seconds
    while (held := read_held(scratch, space)) is None:
        if (scratch / component_ended(holder)).exists():  # its launcher's note: it ended, it will not publish
            raise AllocstackError("network", f"{component}: the stack's private network on this node could not be "
                                             "made (the log of the job stack_network says why)")
        if time.monotonic() > deadline:
            raise AllocstackError("network", f"{component}: the stack's private network on this node was not made "
                                             f"within {seconds:.0f} s (config network.isolation: private; the log of "
                                             "the job stack_network says why)")
        time.sleep(poll)
    return held


def inbound_port(scratch: Path, name: str) -> int:
    """The port ``name`` (``coordinator``, or a service of yours) listens on for the other nodes: in the stack's
    private network (``$ALLOCSTACK_NETWORK``) the one the holder's gateway carries in from the same port on the
    node's address, else 0 (any free one)."""
    from ..common.names import in_private_network

    if not in_private_network(os.environ):
        return 0
    held = read_held(scratch)
    return held.inbound.get(name, 0) if held else 0
