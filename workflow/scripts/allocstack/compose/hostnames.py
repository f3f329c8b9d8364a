"""Service names used as hostnames, rewritten to where each service runs: ``${ALLOCSTACK_<NAME>_HOST}``.

Compose gives every stack a network on which service names resolve; allocstack runs the services
on the node's own network, so the import rewrites the values that name a service as a host. Only
those: a value is a hostname when it is

* the host of a URL (``postgresql://user:pw@db:5432/x``: ``db``; never the URL's user name),
* a ``host:port`` token (``redis:6379``, ``kafka1:9092,kafka2:9092``),
* the whole value of an environment variable whose name says it holds a host (``DB_HOST``,
  ``REDIS_SERVER``, ``BROKER_ADDRESS``; never ``POSTGRES_USER`` or ``POSTGRES_DB``), or
* the word after a host option of a command (``-h db``, ``--host db``);

and ``0.0.0.0`` in a service's own command becomes its own host. Image references, volume sources and
paths are never looked at. This module is the whole of it, and the import can leave it out
(``--no-hostnames``): every program of the stack resolves the services' names anyway, through the stack's
hosts file at /etc/hosts (allocstack/launch/hostsfile.py), which also reaches names in code and config files;
the rewriting stays on by default for where names cannot resolve (a node that allows no namespace to a run
without an image).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

#: Environment variable names whose whole value is a host.
HOST_KEY = re.compile(r"(?:^|_)(?:HOST|HOSTNAME|HOSTS|SERVER|SERVERS|ADDR|ADDRESS|BROKER|BROKERS)$", re.IGNORECASE)
#: Command options whose next word is a host.
HOST_FLAGS = {"-h", "--host", "--hostname", "--server"}
LISTEN_ALL = re.compile(r"(?<![\d.])0\.0\.0\.0(?![\d.])")
#: Characters of a hostname (and of a service name), which a name must not run on into.
NAME_CHARS = "A-Za-z0-9_.-"


class HostRewriter:
    """Rewrites the hostnames in one program's strings.

    :param hostnames: a hostname (a service's name or alias) -> what it becomes (``${ALLOCSTACK_<NAME>_HOST}``).
    :param own_host: the program's own host, for ``0.0.0.0`` in a service's own command (None: left alone).
    """

    def __init__(self, hostnames: dict[str, str], own_host: str | None = None) -> None:
        self.hostnames = {str(name): value for name, value in hostnames.items() if str(name)}
        self.own_host = own_host
        self.done: set[str] = set()
        names = "|".join(re.escape(name) for name in sorted(self.hostnames, key=len, reverse=True))
        self.url = re.compile(rf"(?P<prefix>[A-Za-z][A-Za-z0-9+.-]*://(?:[^@/\s?#]*@)?)(?P<host>{names})"
                              rf"(?![{NAME_CHARS}])") if names else None
        self.host_port = re.compile(rf"(?:^|(?<=[\s=,;'\"(\[]))(?P<host>{names})(?=:\d)") if names else None

    def text(self, value: str, whole_is_host: bool = False) -> str:
        if whole_is_host and self.hostnames:
            hosts = [part.strip() for part in value.split(",")]
            if hosts and all(host.partition(":")[0] in self.hostnames for host in hosts):
                return ",".join(self._replace(host.partition(":")[0]) + host[len(host.partition(":")[0]):]
                                for host in hosts)
        if self.url is not None:
            value = self.url.sub(lambda m: m.group("prefix") + self._replace(m.group("host")), value)
        if self.host_port is not None:
            value = self.host_port.sub(lambda m: self._replace(m.group("host")), value)
        if self.own_host and LISTEN_ALL.search(value):
            self.done.add(f"0.0.0.0 -> {self.own_host}")
            value = LISTEN_ALL.sub(self.own_host, value)
        return value

    def _replace(self, host: str) -> str:
        self.done.add(f"{host} (hostname) -> {self.hostnames[host]}")
        return self.hostnames[host]

    def argv(self, argv: list[str]) -> list[str]:
        return [self.text(arg, index > 0 and argv[index - 1] in HOST_FLAGS) for index, arg in enumerate(argv)]

    def environment(self, env: dict[str, str]) -> dict[str, str]:
        return {key: self.text(value, whole_is_host=bool(HOST_KEY.search(key))) for key, value in env.items()}


def named_hosts(names: Iterable[str], argv: list[str] | None, env: dict[str, str]) -> dict[str, list[int]]:
    """The services in ``names`` that a program names as a host (in its command or environment, where
    :class:`HostRewriter` would rewrite them), each with the ports it names with it (``redis:6379``)."""
    probe = HostRewriter({name: f"\x01{name}\x01" for name in names})
    found: dict[str, list[int]] = {}
    texts = [probe.text(arg, index > 0 and argv[index - 1] in HOST_FLAGS) for index, arg in enumerate(argv or [])]
    texts += [probe.text(value, bool(HOST_KEY.search(key))) for key, value in env.items()]
    for text in texts:
        for host, port in re.findall(r"\x01([^\x01]+)\x01(?::(\d{1,5})(?!\d))?", text):
            ports = found.setdefault(host, [])
            if port and int(port) not in ports:
                ports.append(int(port))
    return found
