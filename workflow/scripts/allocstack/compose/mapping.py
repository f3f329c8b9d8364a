"""A Compose file, as allocstack config: the mapping behind ``import_compose.py`` (pure, no I/O but reads of the
files the Compose file names: env_file, and whether a bind source exists).

Roles: the service the check waits for with ``service_completed_successfully`` (or,
without a check, the one replicated service) is the workers (``worker.mode:
long-running``, ``deploy.replicas`` -> ``workers``); the service that waits for it is the
check (``verify.command``); every other service is one of ``services``, gated by its
healthcheck (a command gate, ``interval`` x ``retries`` + ``start_period`` as its deadline) or,
without one, by a TCP connection to its port. Strings are rewritten where the stack
lives now: a mount's target path -> the bind's host path (relative to the project) or
``${ALLOCSTACK_VOLUME_<NAME>}`` (named volumes are job-scoped scratch); a service's name
used as a hostname -> ``${ALLOCSTACK_<NAME>_HOST}`` (loopback on one node); ``0.0.0.0`` in
a service's own command -> its host. What cannot map is refused by name with the reason,
never dropped; what maps with a difference is said in a note.
"""

from __future__ import annotations

import math
import os
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..common.names import SERVICE_NAME_PATTERN, variable_prefix, volume_variable
from ..launch.containers import PROGRAMS
from ..plan.config import completed, defaults, service_defaults
from ..plan.order import DependencyCycle, start_order
from ..plan.shape import allocation

COMPLETED = "service_completed_successfully"

#: Service keys that need what a Slurm allocation without a daemon and root does not have.
REFUSED_KEYS: dict[str, str] = {
    "privileged": "needs root: allocstack runs your program as you, with no privileged container",
    "cap_add": "adds Linux capabilities: needs root; your programs run as you, with none",
    "devices": "maps host devices into a container: needs root (GPUs for the workers: deploy.resources."
               "reservations.devices with capabilities [gpu])",
    "security_opt": "sets seccomp/AppArmor/SELinux profiles: needs root",
    "sysctls": "sets kernel parameters: needs root",
    "pid": "shares a PID namespace: there are no container namespaces here",
    "ipc": "shares an IPC namespace: there are no container namespaces here",
    "userns_mode": "maps user namespaces: needs a container daemon",
    "user": "switches the user: your programs run as you (no root to switch)",
    "group_add": "adds groups: needs root",
    "extra_hosts": "edits /etc/hosts: needs root; use $ALLOCSTACK_<NAME>_HOST for a service's address",
    "dns": "sets the resolver: needs root", "dns_search": "sets the resolver: needs root",
    "dns_opt": "sets the resolver: needs root",
    "external_links": "links to containers outside this file",
    "volumes_from": "mounts another container's volumes: name the volumes instead",
    "secrets": "not imported: mount the file with a bind instead (./secret.txt:/run/secrets/name:ro)",
    "configs": "not imported: mount the file with a bind instead (./app.conf:/etc/app.conf:ro)",
    "working_dir": "not imported: every program starts in the directory you run snakemake from; give "
                   "absolute paths, or paths relative to it",
    "ulimits": "sets resource limits: your center sets them, not each program",
    "extends": "not imported: give the import every Compose file instead, in order (it merges them as Compose does)",
    "network_mode": "shares another network namespace: there are no container namespaces here",
    "runtime": "selects a container runtime: allocstack runs Apptainer (config image)",
    "isolation": "selects container isolation: needs a daemon",
    "cgroup_parent": "sets a cgroup: needs root", "cgroup": "sets a cgroup namespace: needs root",
    "mac_address": "sets a MAC address: there is no container network here",
    "domainname": "sets a domain name: there is no container network here",
    "storage_opt": "sets storage driver options: needs a daemon",
    "oom_kill_disable": "changes the OOM killer: needs root", "oom_score_adj": "changes the OOM killer: needs root",
    "pids_limit": "sets a cgroup limit: your center sets limits", "cpuset": "pins CPUs: Slurm places the job steps",
    "cpu_shares": "sets a cgroup weight: Slurm places the job steps", "cpu_quota": "sets a cgroup quota: use cpus",
    "cpu_period": "sets a cgroup quota: use cpus", "cpu_count": "use cpus", "cpu_percent": "use cpus",
    "cpu_rt_runtime": "real-time scheduling: needs root", "cpu_rt_period": "real-time scheduling: needs root",
    "blkio_config": "sets I/O weights: needs root", "memswap_limit": "sets swap: your center sets memory",
    "mem_swappiness": "sets swap: your center sets memory", "device_cgroup_rules": "device access: needs root",
    "credential_spec": "Windows containers only", "develop": "docker compose watch: needs a daemon",
    "post_start": "lifecycle hooks in the container: not imported; put it in the command",
    "pre_stop": "lifecycle hooks in the container: not imported; put it in the command",
}

#: Service keys that have no effect here: said in a note, never dropped silently.
IGNORED_KEYS: dict[str, str] = {
    "container_name": "the job step is named after the service",
    "labels": "labels have no use without a container daemon",
    "logging": "each component logs to logs/<rule>/<run>*",
    "init": "allocstack passes signals on and reaps the program itself",
    "tty": "programs run without a terminal", "stdin_open": "programs run without a terminal",
    "platform": "the image you build decides the platform",
    "pull_policy": "images are built once, ahead (see what to build)",
    "mem_limit": "memory is the profile's mem_mb (profiles/slurm/config.yaml)",
    "mem_reservation": "memory is the profile's mem_mb (profiles/slurm/config.yaml)",
    "shm_size": "shared memory is the node's",
    "read_only": "an Apptainer image is read-only anyway",
    "cap_drop": "no capabilities to drop: programs run as you",
    "stop_signal": "",  # handled: SIGTERM only
    "annotations": "annotations have no use without a container daemon",
    "attach": "logs go to files anyway",
}

TOP_LEVEL = {"services", "volumes", "name", "version", "networks"}
SHELL = "/bin/sh"
#: A healthcheck probes every `interval` (30 s by default) for Compose's status display; the gate holds
#: everything back until it passes, so it probes at least this often (seconds).
PROBE_EVERY = 0.25


@dataclass
class Report:
    """What the import says besides the config."""

    refusals: list[str] = field(default_factory=list)
    gaps: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    build: list[str] = field(default_factory=list)

    def refuse(self, where: str, reason: str) -> None:
        self.refusals.append(f"{where}: {reason}")


# ---------------------------------------------------------------- values and durations

DURATION = re.compile(r"(\d+(?:\.\d+)?)(us|ms|s|m|h)")
UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def seconds(value: Any, where: str, report: Report) -> float | None:
    """A Compose duration (``1m30s``, ``500ms``, a number of seconds) in seconds, or None (refused)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    text = str(value).strip()
    parts = DURATION.findall(text)
    if not parts or "".join(number + unit for number, unit in parts) != text:
        report.refuse(where, f"{value!r} is not a duration like 30s, 1m30s or 500ms")
        return None
    return sum(float(number) * UNITS[unit] for number, unit in parts)


def number(value: float) -> int | float:
    """Seconds as written for a reader: 900, not 900.0."""
    value = round(value, 3)
    return int(value) if float(value).is_integer() else value


def words(value: Any, where: str, report: Report) -> list[str] | None:
    """A command: a list (kept) or a string (split like Compose does, no shell)."""
    if value is None:
        return None
    if isinstance(value, str):
        try:
            return shlex.split(value)
        except ValueError as exc:
            report.refuse(where, f"cannot split {value!r}: {exc}")
            return None
    if isinstance(value, list) and all(isinstance(item, (str, int, float)) for item in value):
        return [str(item) for item in value]
    report.refuse(where, "must be a string or a list of strings")
    return None


def scalar(value: Any) -> str:
    """An environment value as Compose passes it (true -> "true")."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


# ---------------------------------------------------------------- interpolation

TOKEN = re.compile(r"\$\$|\$\{(?P<braced>[^}]*)\}|\$(?P<bare>[A-Za-z_][A-Za-z0-9_]*)")


def unescape(value: Any, where: str, report: Report) -> Any:
    """Compose's variable interpolation, refused; ``$$`` -> ``$``; ``${ALLOCSTACK_...}`` kept (allocstack's own).

    Compose fills ``${X}`` from your shell or ``.env`` when it runs; the import must give the
    same config every time, so it never reads your environment.
    """
    if isinstance(value, dict):
        return {key: unescape(item, f"{where}.{key}" if where else str(key), report) for key, item in value.items()}
    if isinstance(value, list):
        return [unescape(item, f"{where}[{index}]", report) for index, item in enumerate(value)]
    if not isinstance(value, str):
        return value

    def replace(match: re.Match[str]) -> str:
        name = match.group("braced") if match.group("braced") is not None else match.group("bare")
        if match.group(0) == "$$":
            return "$"
        if match.group("braced") is not None and re.fullmatch(r"ALLOCSTACK_[A-Z0-9_]+", name):
            return match.group(0)
        report.refuse(where, f"variable interpolation ${{{name}}}: Compose fills it from your shell or .env when "
                             "it runs; write the value (the import never reads your environment)")
        return match.group(0)

    return TOKEN.sub(replace, value)


# ---------------------------------------------------------------- merging several files


def normalized(service: dict[str, Any]) -> dict[str, Any]:
    """Lists that Compose merges by key, as mappings (environment, depends_on)."""
    service = dict(service)
    environment = service.get("environment")
    if isinstance(environment, list):
        pairs = {}
        for item in environment:
            key, _, value = str(item).partition("=")
            pairs[key] = value if "=" in str(item) else None
        service["environment"] = pairs
    depends = service.get("depends_on")
    if isinstance(depends, list):
        service["depends_on"] = {name: {"condition": "service_started"} for name in depends}
    return service


def mount_target(mount: Any) -> str:
    if isinstance(mount, dict):
        return str(mount.get("target", ""))
    parts = str(mount).split(":")
    return parts[1] if len(parts) > 1 else parts[0]


REPLACED = {"command", "entrypoint", "test"}


def merge(base: Any, override: Any, key: str = "") -> Any:
    """Compose's merge of one file over another (the subset allocstack imports)."""
    if isinstance(base, dict) and isinstance(override, dict):
        merged = dict(base)
        for name, value in override.items():
            merged[name] = merge(base[name], value, name) if name in base else value
        return merged
    if isinstance(base, list) and isinstance(override, list) and key not in REPLACED:
        if key == "volumes":
            targets = {mount_target(mount) for mount in override}
            return [mount for mount in base if mount_target(mount) not in targets] + override
        return base + [item for item in override if item not in base]
    return override


def combine(documents: list[dict[str, Any]]) -> dict[str, Any]:
    combined: dict[str, Any] = {}
    for document in documents:
        document = dict(document)
        if isinstance(document.get("services"), dict):
            document["services"] = {name: normalized(spec) if isinstance(spec, dict) else spec
                                    for name, spec in document["services"].items()}
        combined = merge(combined, document)
    return combined


# ---------------------------------------------------------------- mounts and rewriting


@dataclass
class Mount:
    target: str
    replacement: str  # host path (relative to the project) or ${ALLOCSTACK_VOLUME_<NAME>}
    kind: str  # bind, volume, anonymous, tmpfs
    read_only: bool = False


def host_path(source: str, compose_dir: Path, project_dir: Path) -> str:
    """A bind's source, resolved against the Compose file's directory, relative to the project when inside it."""
    path = Path(os.path.expanduser(source))
    path = Path(os.path.normpath(compose_dir / path if not path.is_absolute() else path))
    try:
        relative = path.relative_to(project_dir)
    except ValueError:
        return str(path)
    return str(relative) if str(relative) != "." else "."


def slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", text).strip("-").lower() or "root"


def parse_mount(mount: Any, where: str, declared: dict[str, Any], owner: str, context: Context) -> Mount | None:
    """One entry of a service's ``volumes``."""
    report = context.report
    if isinstance(mount, dict):
        kind, source, target = mount.get("type", "volume"), mount.get("source"), mount.get("target")
        read_only = bool(mount.get("read_only"))
    else:
        parts = str(mount).split(":")
        if len(parts) == 1:
            kind, source, target, read_only = "volume", None, parts[0], False
        else:
            source, target = parts[0], parts[1]
            read_only = len(parts) > 2 and "ro" in parts[2].split(",")
            kind = "bind" if source.startswith((".", "/", "~")) else "volume"
    if not isinstance(target, str) or not target.startswith("/"):
        report.refuse(where, f"mount target {target!r} must be an absolute path")
        return None
    target = target.rstrip("/") or "/"
    if kind == "bind":
        path = host_path(str(source), context.compose_dir, context.project_dir)
        if not (context.project_dir / path).exists():
            report.gaps.append(f"{owner}: bind source {source} ({path}) does not exist: Compose would create an "
                               "empty directory; create it (or fix the path)")
        return Mount(target, path, "bind", read_only)
    if kind == "volume" and source:
        if source not in declared:
            report.refuse(where, f"volume {source!r} is not declared under the top-level volumes")
            return None
        context.volumes.add(source)
        return Mount(target, f"${{{volume_variable(source)}}}", "volume", read_only)
    if kind in ("volume", "tmpfs"):
        name = f"{owner}-{slug(target)}"
        context.volumes.add(name)
        report.notes.append(f"{owner}: {kind} {target} -> job-scoped scratch volume {name}")
        return Mount(target, f"${{{volume_variable(name)}}}", "anonymous" if kind == "volume" else "tmpfs")
    report.refuse(where, f"mount type {kind!r} cannot map (bind, volume and tmpfs can)")
    return None


def mount_pattern(mounts: list[Mount]) -> re.Pattern[str] | None:
    """One regex for every mount target, longest first, matched on path boundaries."""
    if not mounts:
        return None
    targets = sorted({m.target for m in mounts}, key=len, reverse=True)
    alternatives = "|".join(re.escape(target) for target in targets)
    return re.compile(rf"(?<![A-Za-z0-9_.~/-])(?:{alternatives})(?=/|$|[^A-Za-z0-9_.-])")


HOST_FLAGS = {"-h", "--host", "--hostname", "--server"}


class Rewriter:
    """Rewrites one service's strings: mount targets, other services' hostnames, its own 0.0.0.0."""

    def __init__(self, mounts: list[Mount], hostnames: dict[str, str], own_host: str | None) -> None:
        self.by_target = {m.target: m.replacement for m in mounts}
        self.mounts = mount_pattern(mounts)
        self.hostnames = hostnames  # hostname (a service name or alias) -> ${ALLOCSTACK_<NAME>_HOST}
        names = "|".join(re.escape(name) for name in sorted(hostnames, key=len, reverse=True))
        self.urls = re.compile(rf"(?:(?<=://)|(?<=@))(?:{names})(?![A-Za-z0-9_.-])") if hostnames else None
        self.host_ports = re.compile(rf"(?:^|(?<=[\s=,'\"(\[]))(?:{names})(?=:\d)") if hostnames else None
        self.own_host = own_host
        self.done: set[str] = set()

    def text(self, value: str, whole_is_host: bool = False) -> str:
        if whole_is_host and value in self.hostnames:
            self.done.add(f"{value} -> {self.hostnames[value]}")
            return self.hostnames[value]
        if self.mounts is not None:
            value = self.mounts.sub(self._mount, value)
        for pattern in (self.urls, self.host_ports):
            if pattern is not None:
                value = pattern.sub(self._host, value)
        if self.own_host and re.search(r"(?<![\d.])0\.0\.0\.0(?![\d.])", value):
            self.done.add(f"0.0.0.0 -> {self.own_host}")
            value = re.sub(r"(?<![\d.])0\.0\.0\.0(?![\d.])", self.own_host, value)
        return value

    def _mount(self, match: re.Match[str]) -> str:
        replacement = self.by_target[match.group(0)]
        self.done.add(f"{match.group(0)} -> {replacement}")
        return replacement

    def _host(self, match: re.Match[str]) -> str:
        self.done.add(f"{match.group(0)} (hostname) -> {self.hostnames[match.group(0)]}")
        return self.hostnames[match.group(0)]

    def argv(self, argv: list[str]) -> list[str]:
        return [self.text(arg, index > 0 and argv[index - 1] in HOST_FLAGS) for index, arg in enumerate(argv)]

    def environment(self, env: dict[str, str]) -> dict[str, str]:
        return {key: self.text(value, whole_is_host=True) for key, value in env.items()}


# ---------------------------------------------------------------- the whole stack


@dataclass
class Context:
    compose_dir: Path
    project_dir: Path
    report: Report
    volumes: set[str] = field(default_factory=set)
    binds: set[str] = field(default_factory=set)
    images: dict[str, list[str]] = field(default_factory=dict)
    read_only: list[str] = field(default_factory=list)


@dataclass
class Roles:
    workers: str | None
    check: str | None
    services: list[str]


def check_depends_on(name: str, spec: dict[str, Any], report: Report) -> None:
    """What a depends_on entry says besides its condition."""
    for dependency, options in (spec.get("depends_on") or {}).items():
        options = options or {}
        if options.get("restart"):
            report.refuse(f"services.{name}.depends_on.{dependency}.restart", "restarts this service when "
                                                                             f"{dependency} restarts: needs a daemon")
        if options.get("required") is False:
            report.notes.append(f"{name}: depends_on {dependency} required: false: allocstack starts {dependency} "
                                "anyway and waits for its gate")
        condition = options.get("condition", "service_started")
        if condition not in ("service_started", "service_healthy", COMPLETED):
            report.refuse(f"services.{name}.depends_on.{dependency}.condition", f"{condition!r} is not a Compose "
                                                                                "condition")


def conditions(spec: dict[str, Any]) -> dict[str, str]:
    depends = spec.get("depends_on") or {}
    return {name: (value or {}).get("condition", "service_started") for name, value in depends.items()}


def replicas(spec: dict[str, Any], where: str, report: Report) -> int:
    count = (spec.get("deploy") or {}).get("replicas", spec.get("scale", 1))
    if not isinstance(count, int) or isinstance(count, bool) or count < 1:
        report.refuse(f"{where}.deploy.replicas", f"{count!r}: at least one replica must run")
        return 1
    return count


def assign_roles(services: dict[str, dict[str, Any]], counts: dict[str, int], report: Report) -> Roles:
    """Which service is the workers, which the check, which are long-running services."""
    for name, spec in services.items():
        for dependency in conditions(spec):
            if dependency not in services:
                report.refuse(f"services.{name}.depends_on", f"{dependency!r} is not a service here")
    waits = {name: [d for d, c in conditions(spec).items() if c == COMPLETED] for name, spec in services.items()}
    checks = [name for name, waited in waits.items() if waited]
    replicated = [name for name in services if counts[name] > 1]
    check = checks[0] if checks else None
    for extra in checks[1:]:
        report.refuse(f"services.{extra}.depends_on", f"a second service waits for another to complete ({checks[0]} "
                                                      "already does): allocstack runs one check, after the workers")
    workers = None
    if check:
        waited = waits[check]
        if len(waited) > 1:
            report.refuse(f"services.{check}.depends_on", f"waits for {', '.join(waited)} to complete: allocstack runs "
                                                          "one set of workers")
        workers = waited[0]
    elif len(replicated) == 1:
        workers = replicated[0]
    if workers is None and not report.refusals:
        report.refuse("services", "no workers: allocstack runs a stack until its workers end; mark them with "
                                  "deploy.replicas, or add a check that waits for them (condition: "
                                  f"{COMPLETED})")
    for name in replicated:
        if name != workers:
            report.refuse(f"services.{name}.deploy.replicas", f"a second replicated service ({workers} are the "
                                                               "workers): allocstack replicates only the workers")
    rest = [name for name in services if name not in (workers, check)]
    for name in rest:
        for dependency in conditions(services[name]):
            if dependency in (workers, check):
                report.refuse(f"services.{name}.depends_on", f"a long-running service that waits for the "
                                                             f"{'workers' if dependency == workers else 'check'}")
    if workers and check and check in conditions(services[workers]):
        report.refuse(f"services.{workers}.depends_on", "the workers wait for the check: it runs after them")
    return Roles(workers, check, rest)


def port_of(name: str, spec: dict[str, Any], uses: dict[str, list[int]], report: Report) -> int | None:
    """The port a service listens on: its ``ports`` (target), ``expose``, or ``name:PORT`` where others use it."""
    candidates: list[int] = []
    for index, entry in enumerate(spec.get("ports") or []):
        where = f"services.{name}.ports[{index}]"
        if isinstance(entry, dict):
            target, published, protocol = entry.get("target"), entry.get("published"), entry.get("protocol", "tcp")
        else:
            text, _, protocol = str(entry).partition("/")
            fields = text.split(":")
            target, published = fields[-1], fields[-2] if len(fields) > 1 else None
            protocol = protocol or "tcp"
        if protocol != "tcp" or "-" in str(target):
            report.refuse(where, f"{entry!r}: only single TCP ports map (a UDP port or a range cannot be gated or "
                                 "tunnelled)")
            continue
        candidates.append(int(target))
        outside = published or target
        report.notes.append(f"{name}: ports {entry!r} -> listens on loopback {target} on the node only (no port "
                            f"publishing without a daemon); from your laptop: ssh -N -L {outside}:127.0.0.1:{target} "
                            "NODE (through the login node, if your center allows it)")
    candidates += [int(str(port).partition("/")[0]) for port in spec.get("expose") or []]
    candidates += uses.get(name, [])
    if not candidates:
        return None
    port = candidates[0]
    if len(set(candidates)) > 1:
        report.notes.append(f"{name}: listens on {sorted(set(candidates))}; its gate and "
                            f"$ALLOCSTACK_{variable_prefix(name)[11:]}PORT use {port}")
    if port < 1024:
        report.refuse(f"services.{name}", f"port {port} is privileged: listening on it needs root; make the "
                                          "service listen on 1024 or above")
        return None
    return port


def hostname_ports(document_text: str, names: list[str]) -> dict[str, list[int]]:
    """``name:PORT`` wherever a service name is used as a hostname with a port (URLs, host:port)."""
    found: dict[str, list[int]] = {}
    for name in names:
        for match in re.finditer(rf"(?:://|@|^|(?<=[\s=,'\"(\[])){re.escape(name)}:(\d+)", document_text, re.MULTILINE):
            found.setdefault(name, []).append(int(match.group(1)))
    return found


def strings(value: Any) -> list[str]:
    if isinstance(value, dict):
        return [text for item in value.values() for text in strings(item)]
    if isinstance(value, list):
        return [text for item in value for text in strings(item)]
    return [value] if isinstance(value, str) else []


def environment(name: str, spec: dict[str, Any], context: Context) -> dict[str, str]:
    """``env_file`` (resolved against the Compose file's directory) and then ``environment``."""
    env: dict[str, str] = {}
    files = spec.get("env_file") or []
    for entry in [files] if isinstance(files, (str, dict)) else files:
        path = entry.get("path") if isinstance(entry, dict) else entry
        required = entry.get("required", True) if isinstance(entry, dict) else True
        where = context.compose_dir / str(path)
        if not where.is_file():
            if required:
                context.report.refuse(f"services.{name}.env_file", f"{path} does not exist")
            continue
        for line in where.read_text(encoding="utf-8").splitlines():
            line = line.strip()
            if not line or line.startswith("#") or "=" not in line:
                continue
            key, _, value = line.removeprefix("export ").partition("=")
            value = value.strip()
            if len(value) > 1 and value[0] == value[-1] and value[0] in "'\"":
                value = value[1:-1]
            env[key.strip()] = value
    for key, value in (spec.get("environment") or {}).items():
        if value is None:
            context.report.refuse(f"services.{name}.environment.{key}", "has no value: Compose takes it from the "
                                                                        "shell that runs it; write the value")
            continue
        env[str(key)] = scalar(value)
    return env


def gate(name: str, spec: dict[str, Any], port: int | None, report: Report) -> dict[str, Any] | None:
    """A service's readiness gate: its healthcheck as a command gate, else a TCP connection to its port."""
    check = spec.get("healthcheck") or {}
    test = check.get("test")
    disabled = check.get("disable") is True or (isinstance(test, list) and test[:1] == ["NONE"])
    where = f"services.{name}.healthcheck"
    if test and not disabled:
        if isinstance(test, str):
            argv = [SHELL, "-c", test]
        elif isinstance(test, list) and test[:1] == ["CMD"] and len(test) > 1:
            argv = [str(word) for word in test[1:]]
        elif isinstance(test, list) and test[:1] == ["CMD-SHELL"] and len(test) == 2:
            argv = [SHELL, "-c", str(test[1])]
        else:
            report.refuse(f"{where}.test", f"{test!r} is not CMD, CMD-SHELL or a string")
            return None
        interval = seconds(check.get("interval", "30s"), f"{where}.interval", report) or 30.0
        retries = check.get("retries", 3)
        start = seconds(check.get("start_period", 0), f"{where}.start_period", report) or 0.0
        probe = seconds(check.get("timeout", "30s"), f"{where}.timeout", report) or 30.0
        if "start_interval" in check:
            report.notes.append(f"{name}: healthcheck.start_interval: the gate probes every "
                                f"{min(interval, PROBE_EVERY):g} s from the start anyway")
        timeout = number(start + interval * retries)
        report.notes.append(f"{name}: healthcheck -> command gate, deadline {timeout:g} s (start_period {start:g} s + "
                            f"interval {interval:g} s x retries {retries}), probing every {min(interval, PROBE_EVERY):g} s")
        return {"mode": "command", "command": argv, "timeout": timeout, "interval": number(min(interval, PROBE_EVERY)),
                "probe_timeout": number(probe)}
    if port is not None:
        report.notes.append(f"{name}: no healthcheck -> ready when port {port} accepts a connection (tcp gate)")
        return {"mode": "tcp"}
    report.refuse(f"services.{name}", "has no healthcheck and no port: allocstack gates every service before "
                                      "what depends on it starts; add a healthcheck (or its port)")
    return None


def dependencies(name: str, spec: dict[str, Any], roles: Roles, hostnames: dict[str, str], uses: list[Any],
                 report: Report) -> list[str]:
    """Its depends_on, plus every service it names as a hostname (it needs that one's address to start)."""
    listed = [d for d in conditions(spec) if d in roles.services]
    text = "\n".join(strings(uses))
    named = [other for other in roles.services if other != name and f"${{{variable_prefix(other)}HOST}}" in text]
    for other in named:
        if other not in listed:
            report.notes.append(f"{name}: uses {other} as a hostname: starts after {other}'s gate (added to depends_on)")
            listed.append(other)
    return listed


def program(name: str, spec: dict[str, Any], report: Report) -> list[str] | None:
    argv = (words(spec.get("entrypoint"), f"services.{name}.entrypoint", report) or []) + \
        (words(spec.get("command"), f"services.{name}.command", report) or [])
    return argv or None


def image_source(spec: dict[str, Any]) -> str | None:
    """What a service's image is made from: ``build: CONTEXT`` or ``image: NAME``."""
    build = spec.get("build")
    if build is not None:
        if isinstance(build, str):
            return f"build: {build}"
        details = [f"{key} {build[key]}" for key in sorted(build) if key != "context"]
        return f"build: {build.get('context', '.')}" + (f" ({'; '.join(details)})" if details else "")
    return f"image: {spec['image']}" if spec.get("image") else None


def what_to_build(sources: dict[str, list[str]]) -> list[str]:
    """How to get an Apptainer image for each image source, and that one image must hold every program."""
    lines = []
    for source, names in sources.items():
        kind, _, value = source.partition(": ")
        tag = slug(names[0])
        if kind == "build":
            how = (f"Apptainer does not read Dockerfiles: build where Docker or Podman runs (docker build -t {tag} "
                   f"{value.split(' ')[0]}), then apptainer build {tag}.sif docker-daemon://{tag}:latest; or write "
                   "an Apptainer definition file (container/README.md)")
        else:
            how = f"apptainer build {slug(value)}.sif docker://{value}"
        lines.append(f"{source} ({', '.join(names)}): {how}")
    if len(sources) > 1:
        lines.append("allocstack runs every component in one image (config image): build one that holds every "
                     "program above")
    return lines


#: Where a program's own files are not: paths of the operating system (in the image and on the node alike).
SYSTEM_PATHS = ("/bin/", "/usr/", "/etc/", "/dev/", "/proc/", "/sys/", "/tmp/", "/lib", "/sbin/", "/run/")  # noqa: S108


def image_paths(name: str, before: list[str], after: list[str], report: Report) -> None:
    """Absolute paths no mount maps, in the first words of a command: they exist only in the image."""
    found = [arg for arg, mapped in zip(before[:3], after[:3], strict=True)
             if arg == mapped and arg.startswith("/") and not arg.startswith(SYSTEM_PATHS)]
    if found:
        report.notes.append(f"{name}: {', '.join(found)} is inside the image (no mount maps it): with the image it "
                            "runs as is; without (a local run) it must exist on this machine")


def ignored_keys(name: str, spec: dict[str, Any], report: Report) -> None:
    for key in spec:
        if key == "network_mode" and spec[key] in ("bridge", "default"):
            report.notes.append(f"{name}: network_mode {spec[key]}: every service shares the node's loopback")
        elif key in REFUSED_KEYS:
            reason = REFUSED_KEYS[key]
            if key == "network_mode" and spec[key] == "host":
                reason = ("network_mode: host: the service would listen on the node's real interfaces; allocstack "
                          "keeps every service on loopback")
            report.refuse(f"services.{name}.{key}", reason)
        elif IGNORED_KEYS.get(key):
            report.notes.append(f"{name}: {key} ignored: {IGNORED_KEYS[key]}")
        elif key not in KNOWN_KEYS and key not in IGNORED_KEYS and not key.startswith("x-"):
            report.refuse(f"services.{name}.{key}", "not a Compose service key allocstack knows")
    restart = spec.get("restart", "no")
    if restart not in ("no", False):
        report.refuse(f"services.{name}.restart", f"{restart!r} needs a daemon that restarts the program: allocstack "
                                                  "runs each once, and a failure fails the run (a rerun resumes)")
    signal_name = spec.get("stop_signal", "SIGTERM")
    if signal_name not in ("SIGTERM", "TERM", 15):
        report.refuse(f"services.{name}.stop_signal", f"{signal_name}: allocstack stops programs with SIGTERM")


KNOWN_KEYS = {"command", "entrypoint", "environment", "env_file", "healthcheck", "ports", "expose", "depends_on",
              "volumes", "tmpfs", "image", "build", "deploy", "scale", "cpus", "hostname", "networks", "profiles",
              "restart", "stop_grace_period", "links", "gpus", "stop_signal", "network_mode"}
DEPLOY_KEYS = {"replicas", "resources", "restart_policy", "mode", "labels", "update_config", "rollback_config"}


def resources(name: str, spec: dict[str, Any], role: str, report: Report) -> tuple[int, int]:
    """(cpus, gpus) from ``cpus``, ``deploy.resources`` and ``gpus``; refusals for what cannot map."""
    deploy = spec.get("deploy") or {}
    where = f"services.{name}.deploy"
    for key in deploy:
        if key not in DEPLOY_KEYS:
            reason = {"placement": "placement constraints: the stack runs on one node",
                      "endpoint_mode": "swarm service discovery: services are on loopback"}.get(key, "not imported")
            report.refuse(f"{where}.{key}", reason)
    if deploy.get("mode", "replicated") != "replicated":
        report.refuse(f"{where}.mode", f"{deploy['mode']}: one copy per node of a swarm; the stack runs on one node")
    policy = (deploy.get("restart_policy") or {}).get("condition", "none")
    if policy != "none":
        report.refuse(f"{where}.restart_policy", f"condition {policy} needs a daemon that restarts the program")
    for key in ("update_config", "rollback_config", "labels"):
        if key in deploy:
            report.notes.append(f"{name}: deploy.{key} ignored: it only affects swarm updates")
    limits = (deploy.get("resources") or {}).get("limits") or {}
    cpus = spec.get("cpus", limits.get("cpus", service_defaults()["cpus"]))
    if "memory" in limits:
        report.notes.append(f"{name}: memory limit {limits['memory']} -> set mem_mb in profiles/slurm/config.yaml")
    devices = ((deploy.get("resources") or {}).get("reservations") or {}).get("devices") or []
    gpus = 0
    for device in devices:
        count = device.get("count", 1)
        if "gpu" not in (device.get("capabilities") or []):
            report.refuse(f"{where}.resources.reservations.devices", "only GPUs map (capabilities: [gpu])")
        elif not isinstance(count, int) or isinstance(count, bool):
            report.refuse(f"{where}.resources.reservations.devices", f"count {count!r}: say how many GPUs each "
                                                                     "replica needs")
        else:
            gpus += count
    if "gpus" in spec:
        report.refuse(f"services.{name}.gpus", "say how many GPUs each replica needs with "
                                               "deploy.resources.reservations.devices (count, capabilities: [gpu])")
    if gpus and role != "workers":
        report.refuse(f"services.{name}", "asks for GPUs: only the workers get GPUs (worker.gpus)")
    try:
        return max(1, math.ceil(float(cpus))), gpus
    except (TypeError, ValueError):
        report.refuse(f"services.{name}.cpus", f"{cpus!r} is not a number of CPUs")
        return 1, gpus


@dataclass
class Imported:
    config: dict[str, Any]
    report: Report
    order: list[str]


def aliases(name: str, spec: dict[str, Any], report: Report) -> list[str]:
    """Other hostnames of a service: ``hostname``, network aliases."""
    names = [spec["hostname"]] if spec.get("hostname") else []
    networks = spec.get("networks") or []
    if isinstance(networks, dict):
        for network, options in networks.items():
            options = options or {}
            names += options.get("aliases") or []
            for fixed in ("ipv4_address", "ipv6_address", "mac_address", "link_local_ips"):
                if fixed in options:
                    report.refuse(f"services.{name}.networks.{network}.{fixed}", "a fixed address: every service "
                                                                                 "is on loopback")
    if networks:
        report.notes.append(f"{name}: networks: every service shares the node's loopback (networks do not isolate)")
    for link in spec.get("links") or []:
        alias = str(link).partition(":")[2]
        names += [alias] if alias else []
    return names


def import_stack(compose: dict[str, Any], compose_dir: Path, project_dir: Path, run: str) -> Imported:
    """Map a (merged) Compose document to an allocstack config; refusals, gaps and notes in the report."""
    report = Report()
    context = Context(compose_dir, project_dir, report)
    compose = unescape(compose, "", report)
    for key in compose:
        if key not in TOP_LEVEL and not str(key).startswith("x-"):
            reason = {"secrets": REFUSED_KEYS["secrets"], "configs": REFUSED_KEYS["configs"],
                      "include": "not imported: give the import every Compose file instead"}
            report.refuse(str(key), reason.get(key, "not a top-level Compose key allocstack knows"))
    if "version" in compose:
        report.notes.append("version ignored (obsolete: Compose ignores it too)")
    for network, options in (compose.get("networks") or {}).items():
        if (options or {}).get("external"):
            report.refuse(f"networks.{network}", "external: a network made outside this file, to reach containers "
                                                 "that are not in this stack")
        else:
            report.notes.append(f"networks.{network}: every service shares the node's loopback instead")
    declared = compose.get("volumes") or {}
    for volume, options in declared.items():
        options = options or {}
        if options.get("external"):
            report.refuse(f"volumes.{volume}", "external: a volume made outside this file; bind its data instead")
        elif options.get("driver", "local") != "local" or options.get("driver_opts"):
            report.refuse(f"volumes.{volume}", "driver options: bind the directory instead")
    services = compose.get("services")
    if not isinstance(services, dict) or not services:
        report.refuse("services", "the Compose file has no services")
        return Imported({}, report, [])
    active: dict[str, dict[str, Any]] = {}
    for name, spec in services.items():
        if not SERVICE_NAME_PATTERN.match(str(name)):
            report.refuse(f"services.{name}", "the name must be letters, digits, '.', '_' or '-'")
        elif spec and spec.get("profiles"):
            report.notes.append(f"{name}: left out: it has profiles {spec['profiles']}, and `docker compose up` "
                                "starts it only with --profile")
        else:
            active[str(name)] = spec or {}
    for name, spec in active.items():
        ignored_keys(name, spec, report)
        check_depends_on(name, spec, report)
    counts = {name: replicas(spec, f"services.{name}", report) for name, spec in active.items()}
    roles = assign_roles(active, counts, report)
    text = "\n".join(strings(active))
    uses = hostname_ports(text, roles.services)
    ports = {name: port_of(name, active[name], uses, report) for name in roles.services}
    hostnames: dict[str, str] = {}
    for name in roles.services:
        for host in [name, *aliases(name, active[name], report)]:
            hostnames[host] = f"${{{variable_prefix(name)}HOST}}"
    config = assemble(active, roles, counts, ports, hostnames, declared, context)
    config["run"] = run
    try:
        order = start_order({name: spec["depends_on"] for name, spec in config["services"].items()})
    except DependencyCycle as cycle:
        report.refuse("services", str(cycle))
        order = list(config["services"])
    return Imported(config, report, order)


def assemble(active: dict[str, dict[str, Any]], roles: Roles, counts: dict[str, int], ports: dict[str, int | None],
             hostnames: dict[str, str], declared: dict[str, Any], context: Context) -> dict[str, Any]:
    report = context.report
    services: dict[str, Any] = {}
    parts: dict[str, Any] = {}
    for name, spec in active.items():
        role = "workers" if name == roles.workers else "check" if name == roles.check else "service"
        mounts = [m for index, mount in enumerate(spec.get("volumes") or [])
                  if (m := parse_mount(mount, f"services.{name}.volumes[{index}]", declared, name, context))]
        tmpfs = spec.get("tmpfs") or []
        mounts.extend(parse_mount({"type": "tmpfs", "target": str(target).split(":")[0]}, f"services.{name}.tmpfs",
                                  declared, name, context) for target in ([tmpfs] if isinstance(tmpfs, str) else tmpfs))
        mounts = [m for m in mounts if m]
        context.binds.update(m.replacement for m in mounts if m.kind == "bind")
        if any(m.read_only for m in mounts):
            context.read_only.append(f"{name} {', '.join(m.target for m in mounts if m.read_only)}")
        rewriter = Rewriter(mounts, hostnames, hostnames.get(name) if role == "service" else None)
        argv = program(name, spec, report)
        cpus, gpus = resources(name, spec, role, report)
        env = rewriter.environment(environment(name, spec, context))
        if argv:
            argv, before = rewriter.argv(argv), argv
            image_paths(name, before, argv, report)
        source = image_source(spec)
        if source:
            context.images.setdefault(source, []).append(name)
        if role == "service":
            readiness = gate(name, spec, ports[name], report)
            if readiness and readiness["mode"] == "command":
                readiness["command"] = rewriter.argv(readiness["command"])
            grace = seconds(spec.get("stop_grace_period", "10s"), f"services.{name}.stop_grace_period", report)
            services[name] = {"command": argv, "port": ports[name], "readiness": readiness or {},
                              "depends_on": dependencies(name, spec, roles, hostnames,
                                                         [argv, env, readiness], report),
                              "cpus": cpus, "environment": env,
                              "stop_grace_period": number(grace if grace is not None else 10)}
            if not argv:
                report.gaps.append(f"{name}: no command: Compose runs the image's own (its CMD); write it out as "
                                   f"`command:` in the Compose file and import again, or set services.{name}.command")
        else:
            for key in ("healthcheck", "ports", "expose", "stop_grace_period"):
                if key in spec:
                    report.notes.append(f"{name}: {key} ignored: the {role} are tracked as job steps, not gated")
            parts[role] = {"command": argv, "environment": env, "cpus": cpus, "gpus": gpus, "replicas": counts[name]}
            if not argv:
                key = "worker.command" if role == "workers" else "verify.command"
                report.gaps.append(f"{name}: no command: the {role} ({key}); Compose would run the image's own "
                                   f"(its CMD); add `command:` to {name} in the Compose file and import again, or set "
                                   f"{key} in a config file of yours given after this one")
        if rewriter.done:
            report.notes.append(f"{name}: rewritten: {'; '.join(sorted(rewriter.done))}")
    return layout(services, parts, roles, context)


def layout(services: dict[str, Any], parts: dict[str, Any], roles: Roles, context: Context) -> dict[str, Any]:
    """The config, in the order a reader wants it."""
    default = defaults()
    workers = parts.get("workers") or {**{key: default["worker"][key] for key in ("command", "environment", "cpus",
                                                                                 "gpus")}, "replicas": 1}
    check = parts.get("check") or {key: default["verify"][key] for key in ("command", "environment")}
    if roles.check is None:
        context.report.gaps.append("no check: nothing says whether the results are correct; add a service that "
                                   f"waits for the workers (condition: {COMPLETED}) with a command, or set "
                                   "verify.command")
    context.report.build = what_to_build(context.images)
    if context.read_only:
        context.report.notes.append(f"read-only mounts ({'; '.join(context.read_only)}) are bound read-write: keep "
                                    "them unchanged yourself")
    volumes = sorted(context.volumes)
    spellings: dict[str, str] = {}
    for volume in volumes:
        other = spellings.setdefault(volume_variable(volume), volume)
        if other != volume:
            context.report.refuse(f"volumes.{volume}", f"{other} and {volume} would both be ${{{volume_variable(volume)}}}")
    return {
        "run": "",
        "tasks": None,
        "expected": None,
        "workers": max(1, workers["replicas"]),
        "worker": {"mode": "long-running", "command": workers["command"], "environment": workers["environment"],
                   "cpus": workers["cpus"], "gpus": workers["gpus"]},
        "services": services,
        "volumes": volumes,
        "verify": {"command": check["command"], "environment": check["environment"]},
        # The host paths your commands need, for whichever runtime the center has.
        **{runtime: {"binds": sorted(context.binds)} for runtime in PROGRAMS},
    }


def draft_decisions(config: dict[str, Any], order: list[str], sources: str) -> dict[str, dict[str, str]]:
    """The seed's decision record, drafted from what the import did: review it, then keep or edit it."""
    services, worker = config["services"], config["worker"]
    cpus = allocation(completed(config)).cpus
    gated = [f"{name} ({'its healthcheck' if spec['readiness'].get('mode') == 'command' else 'its port'})"
             for name, spec in services.items()]
    start = ", then ".join(gated) if gated else "no services"
    volumes = ", ".join(config["volumes"]) or "none"
    binds = ", ".join(config["apptainer"]["binds"]) or "none"
    ports = ", ".join(f"{name} on {spec['port']}" for name, spec in services.items() if spec["port"]) or "free ports"
    gpus = worker["gpus"]
    return {
        "allocation": {"owner": "scheduler policy", "how": (
            f"One node for a bounded time: {cpus} CPUs ({config['workers']} workers x {worker['cpus']}, plus each "
            "service's), runtime and memory from profiles/slurm/config.yaml; one sbatch job for the whole stack.")},
        "startup_order": {"owner": "launch script", "how": (
            f"Imported from {sources}: {start}, each after the services it depends on passed their gates; then "
            f"{config['workers']} long-running workers; the check once every worker ended, while the services are "
            "up.")},
        "runtime_state": {"owner": "launch script", "how": (
            f"Named volumes ({volumes}) are job-scoped scratch (0700, $SLURM_TMPDIR or $TMPDIR), removed after the "
            f"run; binds ({binds}) are directories of the project.")},
        "service_access": {"owner": "center configuration", "how": (
            f"Loopback only ({ports}, each with a per-run token in $ALLOCSTACK_<NAME>_TOKEN); published ports reach "
            "a laptop only through an SSH tunnel the center allows.")},
        "accelerators": {"owner": "center configuration", "how": (
            f"{gpus} GPU(s) per worker: sbatch --gpus, srun --gpus per worker step, Apptainer --nv." if gpus else
            "None: the Compose file asks for no GPUs.")},
    }


def unique(lines: list[str]) -> list[str]:
    return list(dict.fromkeys(lines))
