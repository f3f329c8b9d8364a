"""What a service publishes: its endpoint file, its Snakemake service file, how to reach it.

The endpoint file is ``{"schemaVersion": 1, "endpoint": "http://127.0.0.1:PORT",
"token": "...", "viewToken": "..."}``, written atomically with mode 0600 inside the
0700 job-scoped scratch. The coordinator and your own service (``app_service.py``)
publish the same way; your service's also names its process (``"pid"``, ``"pidStartedAt"``), at which
its gate looks.

With more than one node the coordinator publishes a second document for the other nodes'
workers, in the run's state directory (``<state_dir>/<run>/endpoint.json``, 0600 in a 0700
directory on the filesystem the nodes already share): the same fields with the network
address, plus ``"tls": true`` and the ``"tlsFingerprint"`` of the run's certificate that
clients pin, or ``"tls": false`` where the center's config turned encryption off. A document
without ``"tls"`` may only name a loopback address.
"""

from __future__ import annotations

import ipaddress
import os
import pwd
import re
import secrets
import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from .. import SCHEMA_VERSION
from . import names
from .errors import AllocstackError
from .jsonio import atomic_write_json, read_json

LOOPBACK_NAMES = {"localhost"}


def require_loopback(url: str) -> str:
    """Return ``url`` when it is an http URL on a loopback address, else raise ``usage``.

    The single-node pattern publishes nothing beyond the node: a coordinator URL
    that is not loopback is a configuration mistake, not something to probe.
    """
    parts = urlsplit(url)
    if parts.scheme != "http" or not parts.hostname or parts.port is None:
        raise AllocstackError("usage", f"endpoint {url!r} must look like http://127.0.0.1:PORT")
    host = parts.hostname
    if host not in LOOPBACK_NAMES:
        try:
            if not ipaddress.ip_address(host).is_loopback:
                raise AllocstackError("usage", f"endpoint {url!r} is not a loopback address")
        except ValueError as exc:
            raise AllocstackError("usage", f"endpoint {url!r} is not a loopback address") from exc
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        raise AllocstackError("usage", f"endpoint {url!r} must not have a path, query or fragment")
    return url.rstrip("/")


def write_endpoint(path: str | os.PathLike, url: str, token: str, view_token: str,
                   tls: bool | None = None, fingerprint: str | None = None,
                   process: tuple[int, int | None] | None = None, service_port: int | None = None) -> None:
    """``token`` may claim and post; ``view_token`` may only read /status and the /ui page.

    ``tls`` is None for a loopback endpoint; for a network endpoint True (with the certificate's
    ``fingerprint``) or False (plain text, where the center's config says so). ``process``: the pid of your
    service's process and when it started (its gate looks at what it listens on, allocstack/launch/exposure.py).
    ``service_port``: for the other nodes, the port your service listens on at its node's loopback (in the stack's
    private network each other node's forwarder listens on it too, so an address written as ``NAME:PORT`` works
    there unchanged).
    """
    document: dict[str, Any] = {"schemaVersion": SCHEMA_VERSION, "endpoint": url, "token": token,
                                "viewToken": view_token}
    if process is not None:
        document["pid"], document["pidStartedAt"] = process
    if service_port is not None:
        document["servicePort"] = service_port
    if tls is not None:
        document.update(tls=tls, tlsFingerprint=fingerprint)
    atomic_write_json(path, document)


def write_service_file(path: str | os.PathLike) -> None:
    """The Snakemake ``service()`` output: written first thing, it tells Snakemake the process is up.

    Consumers then start; the readiness gate does the real wait, with its own deadline.
    """
    atomic_write_json(path, {"schemaVersion": SCHEMA_VERSION, "pid": os.getpid(), "startedAt": time.time()}, 0o644)


#: Where every service runs on one node. With several nodes it becomes the service's node address:
#: programs read it from ``$ALLOCSTACK_<NAME>_HOST``, never from a literal.
LOOPBACK = "127.0.0.1"


def service_variables(service: str, url: str, token: str) -> dict[str, str]:
    """The variables that tell a program where ``service`` listens: ``ALLOCSTACK_<NAME>_HOST``, ``_PORT``,
    ``_ENDPOINT`` and ``_TOKEN`` (the service ``app``, the older ``service:`` block, gives ``ALLOCSTACK_APP_*``)."""
    parts = urlsplit(url)
    prefix = names.variable_prefix(service)
    return {f"{prefix}HOST": parts.hostname or "", f"{prefix}PORT": str(parts.port), f"{prefix}ENDPOINT": url,
            f"{prefix}TOKEN": token}


def service_endpoint_path(scratch: Path, service: str) -> Path:
    """Where your own service ``service`` publishes its endpoint in job-scoped scratch."""
    return scratch / names.service_endpoint(service)


def service_end_path(scratch: Path, service: str) -> Path:
    """Where the supervisor of ``service`` records how it ended (read by collect_results)."""
    return scratch / names.service_end(service)


def local_instances(pairs: list[str]) -> dict[str, str]:
    """``NAME=INSTANCE`` options (a global service and its instance on this node) as a mapping."""
    return dict(pair.split("=", 1) for pair in pairs)


def instances_environment(scratch: Path, instances: dict[str, str]) -> dict[str, str]:
    """The variables of each global service (``NAME``) from its instance on this node (``INSTANCE``'s endpoint file):
    ``ALLOCSTACK_<NAME>_HOST`` = 127.0.0.1 of this node, as on the first node.

    :raises AllocstackError: ``prerequisite`` when an instance has not published its endpoint.
    """
    env: dict[str, str] = {}
    for name, instance in instances.items():
        endpoint = read_endpoint(service_endpoint_path(scratch, instance))
        env.update(service_variables(name, endpoint.url, endpoint.token))
    return env


def shared_token(directory: Path, name: str) -> str:
    """The token every replica of service ``name`` publishes (in ``directory``, the run's services): made by the first
    to ask (a replica, or the front that relays them to the other nodes: port_sockets.py), a file linked into place
    so that two asking at once agree, read by the others."""
    path = directory / f"{name}.token"
    token = secrets.token_urlsafe(32)
    made = directory / f".{name}.token.{os.getpid()}"
    made.write_text(token, encoding="ascii")
    os.chmod(made, 0o600)
    try:
        os.link(made, path)
    except FileExistsError:
        token = path.read_text(encoding="ascii").strip()
    finally:
        made.unlink()
    return token


def services_environment(scratch: Path, services: list[str], coordinator: bool = False) -> dict[str, str]:
    """The variables of every service in ``services`` (and of the built-in coordinator) from their endpoint files.

    :raises AllocstackError: ``prerequisite`` when one has not published its endpoint (it is not up).
    """
    env: dict[str, str] = {}
    published = [(name, service_endpoint_path(scratch, name)) for name in services]
    if coordinator:
        published.append(("coordinator", scratch / names.ENDPOINT))
    for name, path in published:
        endpoint = read_endpoint(path)
        env.update(service_variables(name, endpoint.url, endpoint.token))
    return env


#: The laptop-side port of the SSH tunnel the hints suggest.
TUNNEL_PORT = 8787


def login_name() -> str:
    """This process's user name from the password database (``$USER`` is not always set)."""
    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return "$USER"


def needs_tunnel(environ: Mapping[str, str]) -> bool:
    """A page on this node's loopback needs an SSH tunnel from a laptop: the stack runs in a Slurm allocation
    (on a compute node). Outside Slurm it runs where you are: its loopback URL opens as it is."""
    return bool(environ.get("SLURM_JOB_ID"))


def published_socket(name: str, environ: Mapping[str, str]) -> str | None:
    """In the stack's private network (config network.isolation: private): the owner-only socket that publishes
    ``name``'s port (allocstack/launch/portsockets.py), else None (its loopback port is reached as it is)."""
    scratch = environ.get("ALLOCSTACK_SCRATCH")
    if not names.in_private_network(environ) or not scratch:
        return None
    from ..launch.portsockets import socket_path

    return str(socket_path(Path(scratch), name))


def tunnel_command(port: int | str, environ: Mapping[str, str], local: int | str = TUNNEL_PORT,
                   name: str | None = None) -> str:
    """The ``ssh -L`` command that reaches ``127.0.0.1:port`` on this node from a laptop (its port ``local``); in
    the stack's private network, ``name``'s owner-only socket instead (OpenSSH forwards a port to a socket).

    Through the submit (login) host as a jump host when Slurm names it.
    """
    node = environ.get("SLURMD_NODENAME") or socket.gethostname()
    login = environ.get("SLURM_SUBMIT_HOST")
    user = environ.get("USER") or login_name()
    hop = f"-J {user}@{login} " if login else ""
    remote = (published_socket(name, environ) if name else None) or f"127.0.0.1:{port}"
    return f"ssh {hop}-N -L {local}:{remote} {user}@{node}"


def read_view_token(path: str | os.PathLike) -> str:
    document = read_json(path, "endpoint", diag="prerequisite")
    return str(document.get("viewToken", "")) if isinstance(document, dict) else ""


@dataclass(frozen=True)
class Endpoint:
    """Where a service listens: ``url``, the bearer ``token``, and for a TLS endpoint the
    SHA-256 ``fingerprint`` of the one certificate to accept; ``process``, the pid of a service of yours on this
    node and when it started (:func:`allocstack.common.listening.process_start`; None: not published)."""

    url: str
    token: str
    fingerprint: str | None = None
    process: tuple[int, int | None] | None = None
    service_port: int | None = None


FINGERPRINT = re.compile(r"^[0-9a-f]{64}$")


def network_url(url: str, tls: bool, fingerprint: Any, path: str | os.PathLike) -> str:
    """Check a network endpoint: https with a SHA-256 fingerprint to pin, or http where ``tls`` is False.

    :raises AllocstackError: ``prerequisite`` when the document is inconsistent.
    """
    parts = urlsplit(url)
    scheme = "https" if tls else "http"
    if parts.scheme != scheme or not parts.hostname or parts.port is None or parts.path not in ("", "/"):
        raise AllocstackError("prerequisite", f"endpoint file {path}: {url!r} must look like {scheme}://ADDRESS:PORT")
    if tls and not (isinstance(fingerprint, str) and FINGERPRINT.match(fingerprint)):
        raise AllocstackError("prerequisite", f"endpoint file {path}: an https endpoint needs the certificate's "
                                              "SHA-256 tlsFingerprint to pin")
    return url.rstrip("/")


def read_endpoint(path: str | os.PathLike) -> Endpoint:
    """The endpoint published in ``path``.

    :raises AllocstackError: ``prerequisite`` when missing/malformed, ``usage`` when a document
        without ``"tls"`` names an address that is not loopback.
    """
    document: Any = read_json(path, "endpoint", diag="prerequisite")
    if not isinstance(document, dict) or document.get("schemaVersion") != SCHEMA_VERSION:
        raise AllocstackError("prerequisite", f"endpoint file {path} is not a schemaVersion 1 endpoint document")
    url, token, tls = document.get("endpoint"), document.get("token"), document.get("tls")
    if not isinstance(url, str) or not isinstance(token, str) or not token:
        raise AllocstackError("prerequisite", f"endpoint file {path} lacks 'endpoint' or 'token'")
    if tls is None:
        pid, started = document.get("pid"), document.get("pidStartedAt")
        process = (pid, started if type(started) is int else None) if type(pid) is int and pid > 0 else None
        return Endpoint(require_loopback(url), token, process=process)
    if not isinstance(tls, bool):
        raise AllocstackError("prerequisite", f"endpoint file {path}: 'tls' must be true or false")
    fingerprint, service_port = document.get("tlsFingerprint"), document.get("servicePort")
    return Endpoint(network_url(url, tls, fingerprint, path), token, fingerprint if tls else None,
                    service_port=service_port if type(service_port) is int and 0 < service_port < 65536 else None)
