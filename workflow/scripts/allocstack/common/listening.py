"""What a program listens on, read from ``/proc`` as ``ss -tlnup`` does: its sockets, their addresses.

A program's process tree (it and its descendants, found by their parent pids in
``/proc/*/stat``) owns the sockets its ``/proc/PID/fd`` links name (``socket:[INODE]``);
the kernel's tables of its network namespace (``/proc/PID/net/tcp``, ``tcp6``, ``udp``,
``udp6``) say which of them listen, on which address. A container that shares the
node's network (Apptainer and Charliecloud by default) and its PID namespace is read
the same way: its processes are the descendants of its runtime's process.

A socket bound beyond loopback (``0.0.0.0``, ``::``, a node address) in the node's
own network namespace is reachable by the node's other users and by other nodes.
One in a network namespace of its own (not the reader's) is not the node's, and is
reported as such.
"""

from __future__ import annotations

import ipaddress
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

from . import names

PROC = Path("/proc")
#: The kernel's tables of a network namespace's sockets (``proto`` and ``proto6``).
TABLES = ("tcp", "tcp6", "udp", "udp6")
#: ``st`` of a listening TCP socket (TCP_LISTEN).
TCP_LISTEN = "0A"
#: ``st`` of a UDP socket that is bound but not connected (TCP_CLOSE): it takes datagrams from anyone.
UDP_UNCONNECTED = "07"


@dataclass(frozen=True, order=True)
class Listener:
    """A socket that takes connections (TCP) or datagrams (UDP) on ``address``:``port``.

    :param proto: ``tcp`` or ``udp``.
    :param address: as the kernel has it (an IPv4-mapped IPv6 address as written, ``::ffff:127.0.0.1``).
    """

    proto: str
    address: str
    port: int
    inode: int

    @property
    def shown(self) -> str:
        """``0.0.0.0:6379``, ``[::]:6379``."""
        return f"[{self.address}]:{self.port}" if ":" in self.address else f"{self.address}:{self.port}"

    @property
    def beyond_loopback(self) -> bool:
        """Bound to an address other than loopback (the unspecified address included)."""
        return not is_loopback(self.address)


def is_loopback(address: str) -> bool:
    """``127.0.0.0/8``, ``::1``, and the IPv4-mapped form of a loopback address (``::ffff:127.0.0.1``)."""
    ip = ipaddress.ip_address(address)
    mapped = getattr(ip, "ipv4_mapped", None)
    return ip.is_loopback or (mapped is not None and mapped.is_loopback)


def decode_address(text: str, byteorder: str = sys.byteorder) -> str:
    """An address as ``/proc/net/tcp*`` prints it: the hex of each 32-bit word of the address in network
    order, printed as a native integer (so on a little-endian machine each word's bytes are reversed).

    ``0100007F`` -> ``127.0.0.1``; ``0000000000000000FFFF00000100007F`` -> ``::ffff:127.0.0.1``.

    :raises ValueError: for text that is not 8 or 32 hex digits.
    """
    raw = bytes.fromhex(text)
    if len(raw) not in (4, 16):
        raise ValueError(f"not an IPv4 or IPv6 address: {text!r}")
    if byteorder == "little":
        raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    ip = ipaddress.ip_address(raw)
    mapped = getattr(ip, "ipv4_mapped", None)
    return f"::ffff:{mapped}" if mapped is not None else str(ip)  # (as Python 3.13 writes it, whatever the version)


def parse_table(text: str, proto: str) -> list[Listener]:
    """The listening sockets of one ``/proc/net/{tcp,tcp6,udp,udp6}`` table (``proto``: ``tcp`` or ``udp``).

    TCP: state LISTEN. UDP: bound to a port and connected to no one. Lines that are not a socket's
    (the header) are skipped.
    """
    wanted = TCP_LISTEN if proto == "tcp" else UDP_UNCONNECTED
    found = []
    for line in text.splitlines():
        fields = line.split()
        if len(fields) < 10 or not fields[0].endswith(":") or fields[3] != wanted:
            continue
        local, remote = fields[1].rsplit(":", 1), fields[2].rsplit(":", 1)
        port, inode = int(local[1], 16), int(fields[9])
        if port == 0 or inode == 0 or (proto == "udp" and int(remote[1], 16) != 0):
            continue
        found.append(Listener(proto, decode_address(local[0]), port, inode))
    return found


def parent_of(stat: str) -> int:
    """The parent pid in a ``/proc/PID/stat`` line (after the command name, which may hold spaces and parentheses)."""
    return int(stat[stat.rindex(")") + 2:].split()[1])


def started_at(stat: str) -> int:
    """When the process of a ``/proc/PID/stat`` line started (clock ticks since boot): with its pid, which process
    it is (a pid is used again once its process ended; the same pid in another PID namespace is another process)."""
    return int(stat[stat.rindex(")") + 2:].split()[19])


def process_start(pid: int, proc: Path = PROC) -> int | None:
    """:func:`started_at` of ``pid``, or None when there is no such process here."""
    try:
        return started_at((proc / str(pid) / "stat").read_text(errors="replace"))
    except (OSError, ValueError, IndexError):
        return None


def descendants(root: int, parents: dict[int, int]) -> list[int]:
    """``root`` and every process below it, given each process's parent (pure)."""
    children: dict[int, list[int]] = {}
    for pid, parent in parents.items():
        children.setdefault(parent, []).append(pid)
    tree, todo = [], [root]
    while todo:
        pid = todo.pop()
        tree.append(pid)
        todo.extend(children.get(pid, ()))
    return tree


def read_parents(proc: Path = PROC) -> dict[int, int]:
    """Every process's parent, from ``/proc/*/stat`` (a process that ends meanwhile is left out).

    ``/proc/PID/task/*/children`` would be shorter, but kernels without CONFIG_PROC_CHILDREN lack it.
    """
    parents = {}
    for entry in os.scandir(proc):
        if entry.name.isdigit():
            try:
                parents[int(entry.name)] = parent_of((proc / entry.name / "stat").read_text(errors="replace"))
            except (OSError, ValueError, IndexError):
                continue
    return parents


def socket_inodes(pid: int, proc: Path = PROC) -> set[int]:
    """The sockets ``pid`` holds open (``socket:[INODE]`` links in ``/proc/PID/fd``).

    :raises OSError: ``PermissionError`` when its fds cannot be read (another user's), ``FileNotFoundError``
        when it ended.
    """
    inodes = set()
    directory = proc / str(pid) / "fd"
    for name in os.listdir(directory):
        try:
            target = os.readlink(directory / name)
        except OSError:
            continue  # closed meanwhile
        if target.startswith("socket:["):
            inodes.add(int(target[8:-1]))
    return inodes


@dataclass(frozen=True)
class Found:
    """A listening socket of the program: which process holds it, and whether it is in the node's network."""

    listener: Listener
    pid: int
    own_namespace: bool = False  # in a network namespace of its own, not the node's (the reader's)

    @property
    def exposed(self) -> bool:
        """Reachable by the node's other users and by other nodes."""
        return self.listener.beyond_loopback and not self.own_namespace


@dataclass
class Scan:
    """What :func:`listening` saw: the sockets, and the processes it could not look into."""

    found: list[Found] = field(default_factory=list)
    unreadable: dict[int, str] = field(default_factory=dict)

    @property
    def exposed(self) -> list[Found]:
        return [found for found in self.found if found.exposed]


def read_tables(pid: int, proc: Path = PROC) -> dict[int, Listener]:
    """The listening sockets of ``pid``'s network namespace, by inode."""
    listeners = {}
    for table in TABLES:
        try:
            text = (proc / str(pid) / "net" / table).read_text()
        except FileNotFoundError:
            continue  # no IPv6 on this node
        listeners.update((found.inode, found) for found in parse_table(text, table.rstrip("6")))
    return listeners


def listening(root: int, proc: Path = PROC) -> Scan:
    """The sockets that ``root``'s process tree listens on (each once, with one process holding it)."""
    scan = Scan()
    reader = _namespace("self", proc)
    # In the stack's private network (config network.isolation: private) the reader shares its programs' namespace,
    # which is the stack's alone: nothing there is the node's.
    private = names.in_private_network(os.environ)
    tables: dict[str, dict[int, Listener]] = {}
    for pid in descendants(root, read_parents(proc)):
        try:
            inodes = socket_inodes(pid, proc)
            if not inodes:
                continue
            namespace = _namespace(str(pid), proc)
            if namespace not in tables:
                tables[namespace] = read_tables(pid, proc)
        except FileNotFoundError:
            continue  # it ended
        except OSError as exc:
            scan.unreadable[pid] = exc.strerror or str(exc)
            continue
        seen = {found.listener.inode for found in scan.found}
        scan.found += [Found(tables[namespace][inode], pid, namespace != reader or private)
                       for inode in sorted(inodes) if inode in tables[namespace] and inode not in seen]
    return scan


def _namespace(pid: str, proc: Path) -> str:
    return os.readlink(proc / pid / "ns" / "net")

