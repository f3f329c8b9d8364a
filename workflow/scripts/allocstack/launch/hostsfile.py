"""The stack's names as Compose gives them: a hosts file in the run's scratch, bound at ``/etc/hosts``.

Compose's network resolves every service name, each service's ``hostname:`` and its network aliases; real
stacks name their services in their code and config files (``Redis(host='redis')``, a URL in an ini file),
which no rewriting of commands sees. Every service of a stack is reached at 127.0.0.1 on every node (on the
first node it listens there; on another, a worker reaches it through its tunnel's local end, see
:mod:`allocstack.launch.tunnel`), so one file says it all::

    127.0.0.1   localhost
    127.0.0.1   redis cache          # each service's names: its name, its Compose hostname and aliases
    ::1         localhost ip6-localhost ip6-loopback
    ...                              # then the node's own /etc/hosts (its hostname line, the cluster's names),
                                     # without the stack's names, which the stack's own lines answer

Its launcher writes it once per node and attempt (:func:`write_once`, after the attempt's first launcher emptied
the scratch; off the first node, node_scratch.py does, or finds the first node's where the nodes share the scratch,
and its node lines are then the first node's); each program of yours sees it at ``/etc/hosts``: bound there in its image (Apptainer
``--bind``, ch-run ``--bind``), or without an image in a mount namespace of its own
(:mod:`allocstack.launch.privatenames`). The node's ``/etc/hosts`` is never changed.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path

from ..common.errors import AllocstackError
from ..common.names import HOSTS

#: The node's own hosts file, read (never written).
NODE_HOSTS = Path("/etc/hosts")
#: A name the hosts file can hold (a service name, a Compose ``hostname:``, an alias).
HOSTNAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
#: What Docker writes for IPv6 in every container's /etc/hosts.
IPV6 = ("::1\tlocalhost ip6-localhost ip6-loopback", "fe00::0\tip6-localnet", "ff00::0\tip6-mcastprefix",
        "ff02::1\tip6-allnodes", "ff02::2\tip6-allrouters")


def stack_names(services: Mapping[str, Iterable[str]]) -> list[tuple[str, list[str]]]:
    """Each service with the names it answers to (its own first, then its ``hostnames``), each name once.

    :raises ValueError: naming a name a hosts file cannot hold.
    """
    seen: set[str] = set()
    lines = []
    for service, more in services.items():
        names = []
        for name in [service, *more]:
            if not HOSTNAME.fullmatch(name):
                raise ValueError(f"services.{service}: {name!r} cannot be a hostname (letters, digits, '_', '.', '-')")
            if name.lower() not in seen:
                seen.add(name.lower())
                names.append(name)
        if names:
            lines.append((service, names))
    return lines


def hosts_text(services: Mapping[str, Iterable[str]], node_hosts: str) -> str:
    """The stack's hosts file: localhost and every service's names at 127.0.0.1, IPv6's usual lines, then
    ``node_hosts`` (the node's ``/etc/hosts``) without the stack's names (pure).

    :raises ValueError: naming a name a hosts file cannot hold.
    """
    listed = stack_names(services)
    ours = {name.lower() for _, names in listed for name in names}
    lines = ["# allocstack: the stack's names (a service's address is 127.0.0.1 on every node)",
             "127.0.0.1\tlocalhost"]
    lines += [f"127.0.0.1\t{' '.join(names)}" for _, names in listed]
    lines += list(IPV6)
    lines.append("# the node's /etc/hosts")
    for raw in node_hosts.splitlines():
        words = raw.split("#", 1)[0].split()
        if len(words) < 2:
            continue
        kept = [name for name in words[1:] if name.lower() not in ours]
        if kept:
            lines.append("\t".join([words[0], " ".join(kept)]))
    return "\n".join(lines) + "\n"


def hosts_path(scratch: Path) -> Path:
    return scratch / HOSTS


def write_once(path: Path, text: str) -> bool:
    """Write ``text`` at ``path`` unless it is there: written whole to a temporary file, then linked into place
    (``link`` fails when the name exists, so of launchers starting at once exactly one writes it, and none sees
    it half written). Returns whether this call wrote it.

    :raises OSError: when it cannot be written.
    """
    if path.exists():
        return False
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(temporary, "w", encoding="utf-8") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.chmod(temporary, 0o644)  # the program may run as another user inside its image's namespace
    try:
        os.link(temporary, path)
    except FileExistsError:
        return False
    finally:
        temporary.unlink()
    return True


def write_hosts(scratch: Path, services: Mapping[str, Iterable[str]], node_hosts: Path = NODE_HOSTS) -> Path:
    """The run's hosts file on this node (``SCRATCH/hosts``), written once (:func:`write_once`).

    :raises OSError: when the node's ``/etc/hosts`` cannot be read or the file cannot be written.
    :raises ValueError: naming a name a hosts file cannot hold.
    """
    path = hosts_path(scratch)
    write_once(path, hosts_text(services, node_hosts.read_text(encoding="utf-8", errors="replace")))
    return path


def existing_hosts(scratch: Path | None) -> Path | None:
    """The run's hosts file on this node, None when its launcher wrote none (a stack without services)."""
    if scratch is None:
        return None
    path = hosts_path(scratch)
    return path if path.is_file() else None


def parse_names(values: Iterable[str]) -> dict[str, list[str]]:
    """``--hosts-name SERVICE=NAME,NAME`` options (launch.py, node_scratch.py) as a mapping."""
    services: dict[str, list[str]] = {}
    for value in values:
        service, _, more = value.partition("=")
        services.setdefault(service, []).extend(name for name in more.split(",") if name)
    return services


def write_named(scratch: Path, options: Iterable[str]) -> Path:
    """:func:`write_hosts` for launch.py's and node_scratch.py's ``--hosts-name`` options.

    :raises AllocstackError: ``scratch`` when it cannot be written, ``config`` for a name it cannot hold.
    """
    try:
        return write_hosts(scratch, parse_names(options))
    except OSError as exc:
        raise AllocstackError("scratch", f"cannot write the stack's hosts file in {scratch}: {exc.strerror}") from exc
    except ValueError as exc:
        raise AllocstackError("config", str(exc)) from exc
