"""A Compose file, as allocstack config: the mapping behind ``import_compose.py`` (pure, no I/O but reads of the
files the Compose file names: ``.env``, ``env_file``, whether a bind source exists, and an image's metadata
through the function the caller passes).

Roles: the service the check waits for with ``service_completed_successfully`` (or, without a check, the one
replicated service that publishes no port) is the workers (``worker.mode: long-running``, ``deploy.replicas`` ->
``workers``); the service that waits for it is the check (``verify.command``); every other service is one of
``services`` (another replicated one with ``replicas``: :func:`service_replicas`; one with a port runs each replica
in a network of its own), gated
by its healthcheck (a command gate, ``interval`` x ``retries`` + ``start_period`` as its deadline), else by a TCP
connection to its port (from ``ports``, ``expose``, ``name:PORT`` where others use it, or its image's EXPOSE),
else, when nothing waits for it, by its start. Values are interpolated as Compose does
(allocstack/compose/interpolation.py). Each service keeps its own image (``services.<name>.image``, ``worker.image``,
``verify.image``: the file the import names, with how to get it), its mounts at the paths the Compose file
writes (``mounts``), its ``working_dir``, and its ``entrypoint`` and ``command`` as written (none: the image's
own); commands are left as written. Service names used as hostnames are rewritten to
``${ALLOCSTACK_<NAME>_HOST}`` (allocstack/compose/hostnames.py, which the caller can switch off). What cannot map is
refused by name with the reason, never dropped; what maps with a difference is said in a note; what is missing
is a gap, written into the config so that the run stops with one line until it is filled.
"""

from __future__ import annotations

import math
import os
import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..common.images import ImageMeta, parse_reference
from ..common.names import SERVICE_NAME_PATTERN, variable_prefix, volume_variable
from ..plan.config import completed, defaults, service_defaults
from ..plan.depends import COMPLETED, CONDITIONS, HEALTHY, STARTED
from ..plan.order import DependencyCycle, start_order
from ..plan.refusals import replicas_refusal, reserved
from ..plan.shape import allocation
from .hostnames import HostRewriter, named_hosts
from .interpolation import Interpolator, Use, Variables, as_references, markers, read_env_file

#: Service keys that need what a Slurm allocation without a daemon and root does not have, and whether that
#: is truly impossible here (root, host devices, the host's namespaces) or only not imported.
REFUSED_KEYS: dict[str, tuple[str, bool]] = {
    "privileged": ("needs root: allocstack runs your program as you, with no privileged container", True),
    "cap_add": ("adds Linux capabilities: needs root; your programs run as you, with none", True),
    "devices": (("maps host devices into a container: needs root (GPUs for the workers: deploy.resources."
                 "reservations.devices with capabilities [gpu])"), True),
    "device_cgroup_rules": ("device access: needs root", True),
    "security_opt": ("sets seccomp/AppArmor/SELinux profiles: needs root", True),
    "sysctls": ("sets kernel parameters: needs root", True),
    "userns_mode": ("maps user namespaces: needs a container daemon", True),
    "cgroup_parent": ("sets a cgroup: needs root", True),
    "oom_kill_disable": ("changes the OOM killer: needs root", True),
    "external_links": ("links to containers outside this file", False),
    "volumes_from": ("mounts another container's volumes: name the volumes instead", False),
    "extends": (("not imported: give the import every Compose file instead, in order (it merges them as Compose "
                 "does)"), False),
    "runtime": ("selects a container runtime of the daemon: allocstack runs Apptainer or Charliecloud", False),
    "isolation": ("selects container isolation: needs a daemon", True),
    "credential_spec": ("Windows containers only", True),
    "post_start": ("lifecycle hooks in the container: not imported; put it in the command", False),
    "pre_stop": ("lifecycle hooks in the container: not imported; put it in the command", False),
}

#: Service keys that change nothing here: said in a note, never dropped silently.
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
    "memswap_limit": "memory is the profile's mem_mb", "mem_swappiness": "swap is the node's",
    "shm_size": "shared memory is the node's",
    "read_only": "the image is mounted read-only anyway",
    "cap_drop": "no capabilities to drop: programs run as you",
    "annotations": "annotations have no use without a container daemon",
    "attach": "logs go to files anyway",
    "user": "your programs run as you (no root to switch users); a program that insists on its own user may fail",
    "group_add": "your programs run with your groups",
    "ulimits": "the limits are those of your allocation (your center sets them)",
    "pids_limit": "the limits are those of your allocation", "cpuset": "Slurm places the job steps",
    "cpu_shares": "Slurm places the job steps", "cpu_quota": "CPUs are cpus (the job step's)",
    "cpu_period": "CPUs are cpus (the job step's)", "cpu_count": "CPUs are cpus", "cpu_percent": "CPUs are cpus",
    "cpu_rt_runtime": "no real-time scheduling", "cpu_rt_period": "no real-time scheduling",
    "blkio_config": "I/O weights are the node's", "storage_opt": "there is no storage driver",
    "oom_score_adj": "the OOM killer is the node's", "cgroup": "Slurm's cgroup applies",
    "mac_address": "the node's network is used", "domainname": "the node's network is used",
    "dns": "the node's resolver is used", "dns_search": "the node's resolver is used",
    "dns_opt": "the node's resolver is used",
    "extra_hosts": "the node's own /etc/hosts applies (services are reached through $ALLOCSTACK_<NAME>_HOST)",
    "develop": "docker compose watch is for a developer's machine",
    "restart": "",  # mapped: config restart (restart_policy)
}

TOP_LEVEL = {"services", "volumes", "name", "version", "networks", "secrets", "configs"}
SERVICE_KEYS = {"command", "entrypoint", "environment", "env_file", "healthcheck", "ports", "expose", "depends_on",
                "volumes", "tmpfs", "image", "build", "deploy", "scale", "cpus", "hostname", "networks", "profiles",
                "stop_grace_period", "links", "gpus", "stop_signal", "network_mode", "working_dir", "secrets",
                "configs", "pid", "ipc"}
DEPLOY_KEYS = {"replicas", "resources", "restart_policy", "mode", "labels", "update_config", "rollback_config"}
#: Daemon sockets: a bind of one asks a container daemon to act for the program (root on the node).
DAEMON_SOCKETS = re.compile(r"(?:^|/)(?:docker|podman|containerd|crio|dockershim|cri-dockerd)\.sock$|"
                            r"^/(?:var/)?run/(?:docker|podman|containerd|crio)(?:/|$)")
SHELL = "/bin/sh"
#: A healthcheck probes every `interval` (30 s by default) for Compose's status display; the gate holds
#: everything back until it passes, so it probes at least this often (seconds).
PROBE_EVERY = 0.25
#: What each container runtime's image is, as a file name's ending (config ``runtime``).
IMAGE_SUFFIX = {"apptainer": ".sif", "charliecloud": ""}


@dataclass
class Report:
    """What the import says besides the config."""

    refusals: list[str] = field(default_factory=list)
    impossible: list[str] = field(default_factory=list)  # the refusals of what cannot run here at all
    gaps: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    build: list[str] = field(default_factory=list)
    _where: list[str] = field(default_factory=list, repr=False)

    def refuse(self, where: str, reason: str, impossible: bool = False) -> None:
        """Refuse what is at ``where``, once: a place (or a part of it) refused already is not refused again."""
        if any(where == done or where.startswith((f"{done}.", f"{done}[")) for done in self._where):
            return
        self._where.append(where)
        self.refusals.append(f"{where}: {reason}")
        if impossible:
            self.impossible.append(f"{where}: {reason}")


# ---------------------------------------------------------------- values and durations

DURATION = re.compile(r"(\d+(?:\.\d+)?)(us|ms|s|m|h)")
UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def seconds(value: Any, where: str, report: Report) -> float | None:
    """A Compose duration (``1m30s``, ``500ms``, a number of seconds) in seconds, or None (refused)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 0:
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


def count(value: Any) -> int | None:
    """A whole number written as a number or a string of digits, or None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.strip().isdigit():
        return int(value.strip())
    return None


def words(value: Any, where: str, report: Report) -> list[str] | None:
    """A command: a list (kept, empty words too) or a string (split like Compose does, no shell)."""
    if value is None:
        return None
    if isinstance(value, str):
        try:
            return shlex.split(value)
        except ValueError as exc:
            report.refuse(where, f"cannot split {value!r}: {exc}")
            return None
    if isinstance(value, list) and all(isinstance(item, (str, int, float)) and not isinstance(item, bool)
                                       for item in value):
        return [str(item) for item in value]
    report.refuse(where, "must be a string or a list of strings")
    return None


def scalar(value: Any) -> str:
    """An environment value as Compose passes it (true -> "true")."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def mapping(value: Any, where: str, report: Report) -> dict[str, Any]:
    """``value`` when it is a mapping (None: empty); anything else is refused."""
    if value is None:
        return {}
    if isinstance(value, dict):
        return value
    report.refuse(where, f"must be a mapping, not {type(value).__name__}")
    return {}


def listing(value: Any, where: str, report: Report) -> list[Any]:
    """``value`` when it is a list (None: empty; a string: one item); anything else is refused."""
    if value is None:
        return []
    if isinstance(value, list):
        return value
    if isinstance(value, (str, int)) and not isinstance(value, bool):
        return [value]
    report.refuse(where, f"must be a list, not {type(value).__name__}")
    return []


# ---------------------------------------------------------------- merging several files: Compose's merge, !reset, !override


class Reset:
    """``!reset``: the key is removed from what earlier files said (Compose's merge)."""

    def __repr__(self) -> str:
        return "!reset"


RESET = Reset()


@dataclass
class Override:
    """``!override VALUE``: VALUE replaces what earlier files said, not merged with it."""

    value: Any


def normalized(service: dict[str, Any]) -> dict[str, Any]:
    """Lists that Compose merges by key, as mappings (environment, depends_on)."""
    service = dict(service)
    environment = service.get("environment")
    if isinstance(environment, list):
        pairs: dict[str, Any] = {}
        for item in environment:
            key, sep, value = str(item).partition("=")
            pairs[key] = value if sep else None
        service["environment"] = pairs
    depends = service.get("depends_on")
    if isinstance(depends, list) and all(isinstance(name, str) for name in depends):
        service["depends_on"] = {name: {"condition": "service_started"} for name in depends}
    return service


def mount_target(mount: Any) -> str:
    if isinstance(mount, dict):
        return str(mount.get("target", ""))
    parts = str(mount).split(":")
    return parts[1] if len(parts) > 1 else parts[0]


REPLACED = {"command", "entrypoint", "test"}


def merge(base: Any, override: Any, key: str = "") -> Any:
    """Compose's merge of one file over another (the subset allocstack imports), with ``!reset`` and ``!override``."""
    if isinstance(override, Override):
        return strip_tags(override.value)
    if isinstance(base, dict) and isinstance(override, dict):
        merged = dict(base)
        for name, value in override.items():
            if value is RESET:
                merged.pop(name, None)
            else:
                merged[name] = merge(base[name], value, str(name)) if name in base else strip_tags(value)
        return merged
    if isinstance(base, list) and isinstance(override, list) and key not in REPLACED:
        override = strip_tags(override)
        if key == "volumes":
            targets = {mount_target(mount) for mount in override}
            return [mount for mount in base if mount_target(mount) not in targets] + override
        return base + [item for item in override if item not in base]
    return strip_tags(override)


def strip_tags(value: Any) -> Any:
    """``value`` with ``!override`` unwrapped and ``!reset`` keys removed (a file with no earlier one to act on)."""
    if isinstance(value, Override):
        return strip_tags(value.value)
    if isinstance(value, dict):
        return {key: strip_tags(item) for key, item in value.items() if item is not RESET}
    if isinstance(value, list):
        return [strip_tags(item) for item in value if item is not RESET]
    return None if value is RESET else value


def combine(documents: list[dict[str, Any]]) -> dict[str, Any]:
    combined: dict[str, Any] = {}
    for document in documents:
        document = dict(document)
        if isinstance(document.get("services"), dict):
            document["services"] = {name: normalized(spec) if isinstance(spec, dict) else spec
                                    for name, spec in document["services"].items()}
        combined = merge(combined, document)
    return strip_tags(combined)


# ---------------------------------------------------------------- mounts


@dataclass
class Mount:
    """A path a program sees in its container: a host path (relative to the project) or a named volume."""

    target: str
    source: str | None = None  # a host path, for a bind, a secret or a config
    volume: str | None = None  # a named volume (job-scoped scratch)
    read_only: bool = False

    def as_config(self) -> dict[str, Any]:
        entry: dict[str, Any] = {"target": self.target}
        if self.volume:
            entry["volume"] = self.volume
        else:
            entry["source"] = self.source
        if self.read_only:
            entry["read_only"] = True
        return entry


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


def split_mount(text: str) -> tuple[str | None, str, str]:
    """A short-syntax volume ``[SOURCE:]TARGET[:MODE]`` as (source, target, mode)."""
    parts = text.split(":")
    if len(parts) == 1:
        return None, parts[0], ""
    if len(parts) == 2:
        return (None, parts[0], parts[1]) if parts[0].startswith("/") and not parts[1].startswith("/") \
            else (parts[0], parts[1], "")
    return parts[0], parts[1], ":".join(parts[2:])


def parse_mount(mount: Any, where: str, owner: str, context: Context) -> Mount | None:
    """One entry of a service's ``volumes``."""
    report = context.report
    if isinstance(mount, dict):
        kind, source, target = mount.get("type", "volume"), mount.get("source"), mount.get("target")
        read_only = mount.get("read_only") is True
        if kind == "bind" and isinstance(mount.get("bind"), dict) and mount["bind"].get("create_host_path") is False:
            context.report.notes.append(f"{owner}: {target}: bind.create_host_path false: the source must exist")
    elif isinstance(mount, str):
        source, target, mode = split_mount(mount)
        read_only = "ro" in mode.split(",")
        kind = "volume" if source is None or not source.startswith((".", "/", "~")) else "bind"
    else:
        report.refuse(where, f"{mount!r} is not a volume (a string SOURCE:TARGET[:MODE] or a mapping)")
        return None
    if not isinstance(target, str) or not target.startswith("/"):
        report.refuse(where, f"mount target {target!r} must be an absolute path")
        return None
    target = os.path.normpath(target)
    if kind == "bind":
        if not isinstance(source, str) or not source:
            report.refuse(where, "a bind needs a source path")
            return None
        if DAEMON_SOCKETS.search(os.path.normpath(source)):
            report.refuse(where, f"{source} is a container daemon's socket: there is no daemon in an allocation, and "
                                 "access to one would be root on the node", impossible=True)
            return None
        path = host_path(source, context.compose_dir, context.project_dir)
        if not (context.project_dir / path).exists():
            report.gaps.append(f"{owner}: bind source {source} ({path}) does not exist: Compose would create an "
                               "empty directory; create it (or fix the path)")
        return Mount(target, source=path, read_only=read_only)
    if kind == "volume" and source:
        if not isinstance(source, str) or source not in context.declared:
            report.refuse(where, f"volume {source!r} is not declared under the top-level volumes")
            return None
        context.volumes.add(source)
        return Mount(target, volume=source, read_only=read_only)
    if kind in ("volume", "tmpfs"):
        name = f"{owner}-{slug(target)}"
        context.volumes.add(name)
        report.notes.append(f"{owner}: {'anonymous volume' if kind == 'volume' else 'tmpfs'} {target} -> job-scoped "
                            f"scratch volume {name}")
        return Mount(target, volume=name)
    report.refuse(where, f"mount type {kind!r} cannot map (bind, volume and tmpfs can)")
    return None


def secret_mounts(name: str, spec: dict[str, Any], kind: str, context: Context) -> list[Mount]:
    """``secrets:`` / ``configs:`` of a service: each file bound read-only where Compose puts it
    (a secret at ``/run/secrets/<name>``, a config at its ``target``, default ``/<name>``)."""
    report = context.report
    declared = context.secrets if kind == "secrets" else context.configs
    mounts = []
    for index, entry in enumerate(listing(spec.get(kind), f"services.{name}.{kind}", report)):
        where = f"services.{name}.{kind}[{index}]"
        if isinstance(entry, dict):
            source, target = entry.get("source"), entry.get("target")
            for key in ("uid", "gid", "mode"):
                if key in entry:
                    report.notes.append(f"{name}: {kind} {source} {key} ignored: the file is yours, read-only")
        else:
            source, target = entry, None
        if not isinstance(source, str) or source not in declared:
            report.refuse(where, f"{source!r} is not declared under the top-level {kind}")
            continue
        path = declared[source]
        if path is None:
            continue  # refused where it is declared
        if target is None:
            target = f"/run/secrets/{source}" if kind == "secrets" else f"/{source}"
        elif kind == "secrets" and not str(target).startswith("/"):
            target = f"/run/secrets/{target}"
        if not isinstance(target, str) or not target.startswith("/"):
            report.refuse(where, f"target {target!r} must be an absolute path")
            continue
        mounts.append(Mount(os.path.normpath(target), source=path, read_only=True))
    return mounts


def declared_files(document: dict[str, Any], kind: str, context: Context) -> dict[str, str | None]:
    """Top-level ``secrets:`` or ``configs:``: name -> the file's host path (None: refused)."""
    report = context.report
    files: dict[str, str | None] = {}
    for name, options in mapping(document.get(kind), kind, report).items():
        where = f"{kind}.{name}"
        options = mapping(options, where, report)
        if isinstance(options.get("file"), str):
            path = host_path(options["file"], context.compose_dir, context.project_dir)
            if not (context.project_dir / path).is_file():
                report.gaps.append(f"{where}: file {options['file']} ({path}) does not exist: create it")
            files[str(name)] = path
            continue
        files[str(name)] = None
        if options.get("external"):
            report.refuse(where, "external: made outside this file (a swarm's): give its file with file:")
        elif "environment" in options:
            report.refuse(where, "environment: a secret from a variable is not imported: give its file with file: "
                                 "(or pass the variable in the service's environment)")
        elif "content" in options:
            report.refuse(where, "content: written inline: put it in a file and give it with file:")
        else:
            report.refuse(where, "has no file: to bind")
    return files


# ---------------------------------------------------------------- the whole stack


@dataclass
class Context:
    compose_dir: Path
    project_dir: Path
    report: Report
    declared: dict[str, Any] = field(default_factory=dict)
    secrets: dict[str, str | None] = field(default_factory=dict)
    configs: dict[str, str | None] = field(default_factory=dict)
    volumes: set[str] = field(default_factory=set)
    interpolator: Interpolator = field(default_factory=lambda: Interpolator(Variables({}, [])))
    images: dict[str, tuple[str, list[str]]] = field(default_factory=dict)  # file -> (what it is made from, users)


@dataclass
class Roles:
    workers: str | None
    check: str | None
    services: list[str]
    main: str | None = None  # --exit-code-from: one of services, config main
    init: list[str] = field(default_factory=list)  # init jobs: among services, config init_jobs


def conditions(spec: dict[str, Any]) -> dict[str, str]:
    depends = spec.get("depends_on")
    if not isinstance(depends, dict):
        return {}
    found = {}
    for name, value in depends.items():
        condition = value.get("condition", "service_started") if isinstance(value, dict) else "service_started"
        found[str(name)] = condition if isinstance(condition, str) else "service_started"
    return found


def check_depends_on(name: str, spec: dict[str, Any], report: Report) -> None:
    """What a depends_on entry says besides its condition."""
    depends = spec.get("depends_on")
    if depends is not None and not isinstance(depends, (dict, list)):
        report.refuse(f"services.{name}.depends_on", "must be a list of service names or a mapping")
        return
    if isinstance(spec.get("depends_on"), list):  # (normalized turns a list of names into a mapping)
        report.refuse(f"services.{name}.depends_on", "a list may hold only service names")
        return
    for dependency, options in (depends or {}).items():
        if options is not None and not isinstance(options, dict):
            report.refuse(f"services.{name}.depends_on.{dependency}", "must be a mapping (condition, restart, required)")
            continue
        options = options or {}
        if options.get("restart"):
            report.notes.append(f"{name}: depends_on {dependency} restart: true: not applied ({name} is not started "
                                f"again when {dependency} restarts; {dependency} keeps its port and token)")
        if options.get("required") is False:
            report.notes.append(f"{name}: depends_on {dependency} required: false: allocstack starts {dependency} "
                                "anyway and waits for its gate")
        condition = options.get("condition", "service_started")
        if condition not in CONDITIONS:
            report.refuse(f"services.{name}.depends_on.{dependency}.condition",
                          f"{condition!r} is not a Compose condition")


def replicas(spec: dict[str, Any], where: str, report: Report) -> int:
    deploy = spec.get("deploy") if isinstance(spec.get("deploy"), dict) else {}
    value = deploy.get("replicas", spec.get("scale", 1))
    replicas_count = count(value)
    if replicas_count is None or replicas_count < 1:
        report.refuse(f"{where}.deploy.replicas", f"{value!r}: at least one replica must run")
        return 1
    return replicas_count


def consumers(services: dict[str, dict[str, Any]], counts: dict[str, int]) -> list[str]:
    """The replicated services that may be the workers: those that publish no port (``ports``, ``expose``). A
    replicated web server or API is a service of replicas, each in a network of its own (:func:`service_replicas`),
    as `docker compose up --scale web=3` runs three of it behind one name."""
    return [name for name in services if counts[name] > 1
            and not (services[name].get("ports") or services[name].get("expose"))]


def producer_of(services: dict[str, dict[str, Any]], counts: dict[str, int], report: Report) -> str | None:
    """Without ``--exit-code-from``, the shape that says it where it is unambiguous: one replicated service (that
    publishes no port), no service that waits for anything to complete (no check), and exactly one service that
    waits for the replicas to start (``service_started``) and that nothing waits for: the producer beside the
    workers, config ``main``."""
    replicated = consumers(services, counts)
    if len(replicated) != 1 or any(conditions(spec).get(replicated[0]) == COMPLETED for spec in services.values()):
        return None
    beside = [name for name, spec in services.items() if conditions(spec).get(replicated[0]) == "service_started"]
    if len(beside) != 1 or any(beside[0] in conditions(spec) for spec in services.values()):
        return None
    report.notes.append(f"{beside[0]}: it waits for the workers ({replicated[0]}) to start and nothing waits for it: "
                        "the stack's main program (config main, as with --exit-code-from "
                        f"{beside[0]}): the stack ends when it ends")
    return beside[0]


def workers_of(services: dict[str, dict[str, Any]], counts: dict[str, int], waits: dict[str, list[str]]
               ) -> str | None:
    """The workers: the replicated service waited for to complete, else the first replicated one that publishes no
    port (:func:`consumers`); without one, the service that only a service nothing depends on (the check) waits for to
    complete, where that is one service."""
    waited = [d for name in services for d in waits[name]]
    replicated = [name for name in services if counts[name] > 1 and name in waited] + consumers(services, counts)
    if replicated:
        return replicated[0]
    depended = {d for spec in services.values() for d in conditions(spec)}
    only_by_leaves = [d for d in dict.fromkeys(waited)
                      if all(name not in depended and not long_running(services[name])
                             for name in services if d in waits[name])]
    return only_by_leaves[0] if len(only_by_leaves) == 1 else None


def long_running(spec: dict[str, Any]) -> bool:
    """A service shaped to serve, not to check and end: it publishes ports, has a healthcheck or runs a known daemon
    (what it waits for to complete is then an init job, such as a migration before an API)."""
    command = spec.get("command")
    argv = command.split() if isinstance(command, str) else command if isinstance(command, list) else None
    return bool(spec.get("ports") or spec.get("healthcheck") or daemon_of(argv))


def assign_roles(services: dict[str, dict[str, Any]], counts: dict[str, int], report: Report,
                 main: str | None = None) -> Roles:
    """Which service is the workers, which the check, which are init jobs, which are long-running services (``main``,
    the one ``--exit-code-from`` names, among them: it may wait for the workers to start).

    ``service_completed_successfully`` says two things in Compose files: a check that waits for the workers to
    complete (the service that waits so for the replicated service, the workers), and an init job that must finish
    before its dependents start (every other service waited for so: a migration, a bucket's creation)."""
    for name, spec in services.items():
        for dependency in conditions(spec):
            if dependency not in services:
                report.refuse(f"services.{name}.depends_on", f"{dependency!r} is not a service here (or it is left "
                                                             "out by its profiles)")
    waits = {name: [d for d, c in conditions(spec).items() if c == COMPLETED and d in services]
             for name, spec in services.items()}
    replicated = consumers(services, counts)
    workers = workers_of(services, counts, waits)
    checks = [name for name, waited in waits.items() if workers is not None and workers in waited]
    check = checks[0] if checks else None
    if len(checks) > 1:
        report.refuse(f"services.{checks[1]}.depends_on", f"{', '.join(checks)} each wait for the workers ({workers}) "
                                                          "to complete: allocstack runs one check, after the workers")
        return Roles(None, None, list(services))
    init = [name for name in services if name != workers and any(name in waited for waited in waits.values())]
    ambiguous = [name for name in init if any(name in waits[other] and not long_running(services[other])
                                              for other in services)]
    if not replicated and workers is None and ambiguous:
        report.refuse(f"services.{ambiguous[0]}", f"{', '.join(ambiguous)} are waited for to complete ({COMPLETED}), and none "
                                             "of them is the workers plainly: mark the workers with deploy.replicas "
                                             "(or --scale), the others are then init jobs")
        return Roles(None, None, list(services))
    for name in init:
        report.notes.append(f"{name}: an init job (others wait for it with {COMPLETED}): it runs once, before "
                            f"{', '.join(other for other in services if name in waits[other])}, and must exit 0 "
                            "(config init_jobs)")
    if workers is None and not replicated and not checks:
        report.notes.append("no workers and no check: a serving stack (mode: serve): your services run until the "
                            "allocation's time limit, scancel or Ctrl-C" + (f", or until {main} ends" if main else "")
                            + "; once every gate passed it is UP, with each service's SSH tunnel line")
    elif workers is None and not replicated:
        report.gaps.append("no workers: nothing here runs to an end (no replicated service, no service the check "
                           f"waits for with {COMPLETED}); allocstack runs a stack until its workers end: give the "
                           "program that uses the services as worker.command (in a config file of yours given after "
                           "this one), or mark the service that does the work with deploy.replicas (a stack that "
                           "only serves until it is stopped has no check: without one it imports as mode: serve)")
    for name in replicated:  # another replicated service is one of services, with replicas (service_replicas)
        if name == check:
            report.refuse(f"services.{name}.deploy.replicas", f"{name} is the check (it waits for the workers, "
                                                               f"{workers}, to complete): it runs once")
    rest = [name for name in services if name not in (workers, check)]
    for name in rest:
        for dependency, condition in conditions(services[name]).items():
            if name == main and dependency == workers and condition == "service_started":
                continue  # the producer runs beside the workers, as Compose starts it once they started
            if dependency == workers and dependency is not None and condition == "service_started":
                # Compose's start order alone (started is not ready): a service's program that needs the workers
                # retries there as it must here. The workers wait for every service's gate, so it starts first.
                report.notes.append(f"{name}: depends_on {workers} (service_started) is Compose's start order only; "
                                    f"allocstack starts your services before the workers (they wait for every "
                                    f"service's gate), so {name} starts before them and waits for nothing of theirs")
                continue
            if dependency in (workers, check) and dependency is not None:
                report.refuse(f"services.{name}.depends_on", f"a long-running service that waits for {dependency}, "
                                                             f"which allocstack reads as the "
                                                             f"{'workers' if dependency == workers else 'check'} "
                                                             f"({check or 'the check'} waits for {workers} to "
                                                             "complete): it would start after them")
    if workers and check and check in conditions(services[workers]):
        report.refuse(f"services.{workers}.depends_on", "the workers wait for the check: it runs after them")
    return Roles(workers, check, rest, main, init)


# ---------------------------------------------------------------- ports


@dataclass
class Ports:
    """The ports a service listens on, as its Compose entries say; ``refused`` when one of them cannot map."""

    listed: list[int] = field(default_factory=list)
    refused: bool = False


def port_number(value: Any) -> int | None:
    text = str(value).strip() if isinstance(value, (str, int)) and not isinstance(value, bool) else ""
    return int(text) if text.isdigit() and 0 < int(text) <= 65535 else None


def listed_ports(name: str, spec: dict[str, Any], report: Report) -> Ports:
    """``ports`` (the container's side) and ``expose``, as Compose parses them; each refused one named once."""
    found = Ports()
    for index, entry in enumerate(listing(spec.get("ports"), f"services.{name}.ports", report)):
        where = f"services.{name}.ports[{index}]"
        if isinstance(entry, dict):
            target, published, protocol = entry.get("target"), entry.get("published"), entry.get("protocol", "tcp")
        elif isinstance(entry, (str, int)) and not isinstance(entry, bool):
            text, _, protocol = str(entry).partition("/")
            text = re.sub(r"^\[[0-9A-Fa-f:]*\]:", "", text)  # an IPv6 host address
            fields = text.split(":")
            target, published = fields[-1], fields[-2] if len(fields) > 1 else None
            protocol = protocol or "tcp"
        else:
            report.refuse(where, f"{entry!r} is not a port")
            found.refused = True
            continue
        port = port_number(target)
        if protocol != "tcp" or port is None:
            report.refuse(where, f"{entry!r}: only single TCP ports map (a UDP port, a range or a missing target "
                                 "cannot be gated or tunnelled)")
            found.refused = True
            continue
        found.listed.append(port)
        outside = published if port_number(published) else port
        report.notes.append(f"{name}: ports {entry!r} -> listens on loopback {port} on the node only (no port "
                            f"publishing without a daemon); from your laptop: ssh -N -L {outside}:127.0.0.1:{port} "
                            "NODE (through the login node, if your center allows it)")
    for entry in listing(spec.get("expose"), f"services.{name}.expose", report):
        port = port_number(str(entry).partition("/")[0]) if isinstance(entry, (str, int)) else None
        if port is None or str(entry).partition("/")[2] not in ("", "tcp"):
            report.notes.append(f"{name}: expose {entry!r} ignored: not a single TCP port")
        else:
            found.listed.append(port)
    return found


# ---------------------------------------------------------------- environment


def environment(name: str, spec: dict[str, Any], context: Context) -> dict[str, str]:
    """``env_file`` (resolved against the Compose file's directory) and then ``environment``; a name without a
    value takes it from the variables (the environment, .env), or is left out as Compose leaves it."""
    report = context.report
    env: dict[str, str] = {}
    files = spec.get("env_file")
    for entry in [files] if isinstance(files, (str, dict)) else listing(files, f"services.{name}.env_file", report):
        path = entry.get("path") if isinstance(entry, dict) else entry
        required = entry.get("required", True) is not False if isinstance(entry, dict) else True
        if not isinstance(path, str):
            report.refuse(f"services.{name}.env_file", f"{path!r} is not a file name")
            continue
        where = context.compose_dir / path
        if not where.is_file():
            if required:
                report.gaps.append(f"{name}: env_file {path} does not exist: Compose stops there; create it and import "
                                   "again (its variables are not in this config)")
            continue
        try:
            env.update(read_env_file(where, context.interpolator.variables, path))
        except (OSError, ValueError) as exc:
            report.refuse(f"services.{name}.env_file", f"{path}: {exc}")
    for key, value in mapping(spec.get("environment"), f"services.{name}.environment", report).items():
        if value is None:
            found = context.interpolator.variables.lookup(str(key))
            if found is None:
                report.notes.append(f"{name}: environment {key} has no value and is not set: left out (as Compose "
                                    "leaves it unset)")
                continue
            value = context.interpolator.value_of(str(key), f"services.{name}.environment.{key}", found)
        if isinstance(value, (dict, list)):
            report.refuse(f"services.{name}.environment.{key}", "must be a string, a number or a boolean")
            continue
        env[str(key)] = scalar(value)
    return env


# ---------------------------------------------------------------- gates


def gate(name: str, spec: dict[str, Any], port: int | str | None, waited: dict[str, str], report: Report
         ) -> dict[str, Any] | None:
    """A service's readiness gate: its healthcheck as a command gate, else a TCP connection to its port, else
    (when nothing waits for it to be healthy) its start, as Compose's service_started. ``waited``: who waits for
    it, and with what condition."""
    check = spec.get("healthcheck")
    where = f"services.{name}.healthcheck"
    if check is not None and not isinstance(check, dict):
        report.refuse(where, "must be a mapping")
        return None
    check = check or {}
    test = check.get("test")
    disabled = check.get("disable") is True or (isinstance(test, list) and test[:1] == ["NONE"])
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
        retries = count(check.get("retries", 3))
        if retries is None:
            report.refuse(f"{where}.retries", f"{check.get('retries')!r} is not a number of retries")
            return None
        start = seconds(check.get("start_period", 0), f"{where}.start_period", report) or 0.0
        probe = seconds(check.get("timeout", "30s"), f"{where}.timeout", report) or 30.0
        if "start_interval" in check:
            report.notes.append(f"{name}: healthcheck.start_interval: the gate probes every "
                                f"{min(interval, PROBE_EVERY):g} s from the start anyway")
        timeout = number(start + interval * max(retries, 1))
        report.notes.append(f"{name}: healthcheck -> command gate (in its image), deadline {timeout:g} s (start_period "
                            f"{start:g} s + interval {interval:g} s x retries {retries}), probing every "
                            f"{min(interval, PROBE_EVERY):g} s")
        return {"mode": "command", "command": argv, "timeout": timeout, "interval": number(min(interval, PROBE_EVERY)),
                "probe_timeout": number(probe or 30.0)}
    if port is not None:
        said = "its image's EXPOSE, read when the stack starts" if port == "image" else f"port {port}"
        report.notes.append(f"{name}: no healthcheck -> ready when {said} accepts a connection (tcp gate)")
        return {"mode": "tcp"}
    healthy = [other for other, condition in waited.items() if condition == "service_healthy"]
    if healthy:
        report.refuse(f"services.{name}", f"has no healthcheck and no port, but {', '.join(healthy)} wait(s) for it to "
                                          "be healthy: add a healthcheck (or expose: its port)")
        return None
    if waited:
        # Only service_started waits (the short form of depends_on): Compose starts the dependents once it has started.
        report.notes.append(f"{name}: no healthcheck, no port and no image that EXPOSEs one; {', '.join(waited)} "
                            "wait(s) for it to start (Compose's service_started): ready once started, as in Compose; "
                            "a healthcheck (or expose: its port) would make them wait until it serves")
        return {"mode": "started"}
    report.notes.append(f"{name}: no healthcheck and no port, and nothing waits for it: ready once started "
                        "(Compose's service_started)")
    return {"mode": "started"}


# ---------------------------------------------------------------- images


def image_source(name: str, spec: dict[str, Any], project: str, report: Report) -> tuple[str, str] | None:
    """(what the image is made from, its file's stem): ``image: REF`` or ``build: CONTEXT`` (None: refused)."""
    image, build = spec.get("image"), spec.get("build")
    ref = None
    if image is not None:
        ref = parse_reference(str(image)) if isinstance(image, str) else None
        if ref is None:
            if not any(f"{image!r} is not an image reference" in line for line in report.refusals):
                report.refuse(f"services.{name}.image", f"{image!r} is not an image reference")
            return None
    if build is not None:
        if isinstance(build, str):
            context, details = build, ""
        elif isinstance(build, dict):
            context = str(build.get("context", "."))
            details = "; ".join(f"{key} {build[key]}" for key in sorted(build) if key != "context")
        else:
            report.refuse(f"services.{name}.build", "must be a context path or a mapping")
            return None
        # services built from the same context share one image: named after the project and the context
        stem = ref.slug if ref else slug(project if os.path.normpath(context) == "." else f"{project}-{context}")
        if details and not ref:
            stem = f"{stem}-{slug(details)[:40]}"
        return f"build: {context}" + (f" ({details})" if details else ""), stem
    if ref is None:
        report.refuse(f"services.{name}", "has neither image: nor build: (Compose needs one of them)")
        return None
    return f"image: {image}", ref.slug


def what_to_build(images: dict[str, tuple[str, list[str]]], runtime: str) -> list[str]:
    """How to get each image where the config expects it, with its SHA-256 sidecar."""
    lines = []
    for path, (source, users) in sorted(images.items()):
        kind, _, value = source.partition(": ")
        if kind == "image":
            if runtime == "charliecloud":
                how = (f"ch-image pull {value} && ch-convert {value} {path} (ch-image keeps the image's ENTRYPOINT, "
                       f"CMD and EXPOSE in /ch/config.pulled.json; or where Docker runs: ch-convert -i docker {value} "
                       f"{path}, which keeps none of them)")
            else:
                how = (f"apptainer build {path} docker://{value} (or where Docker runs: docker save {value} -o x.tar, "
                       f"then apptainer build {path} docker-archive://x.tar; from an OCI archive that Podman, Buildah "
                       f"or skopeo wrote: apptainer build {path} oci-archive://x.oci.tar)")
        else:
            context = value.split(" ")[0]
            tag = Path(path).name.removesuffix(".sif")
            if runtime == "charliecloud":
                how = f"ch-image build -t {tag} {context} && ch-convert {tag} {path}"
            else:
                how = (f"where Docker or Podman runs: docker build -t {tag} {context} && docker save {tag} -o "
                       f"{tag}.tar, then apptainer build {path} docker-archive://{tag}.tar (with Podman or Buildah: "
                       f"podman save --format oci-archive {tag} -o {tag}.oci.tar, then apptainer build {path} "
                       f"oci-archive://{tag}.oci.tar; or an Apptainer definition file: container/README.md)")
        sidecar = (f"python3 workflow/scripts/image_digest.py {path}" if runtime == "charliecloud"
                   else f"sha256sum {path} > {path}.sha256")
        lines.append(f"{source} ({', '.join(users)}) -> {path}: {how}; then {sidecar}")
    return lines


# ---------------------------------------------------------------- the stack


@dataclass
class Imported:
    config: dict[str, Any]
    report: Report
    order: list[str]
    variables: dict[str, Use] = field(default_factory=dict)


def grouped(pairs: list[tuple[str, str]]) -> dict[str, list[str]]:
    """(where, why) pairs as why -> every where, in order: one refusal per cause."""
    found: dict[str, list[str]] = {}
    for where, why in pairs:
        found.setdefault(why, []).append(where)
    return found


def aliases(name: str, spec: dict[str, Any], report: Report) -> list[str]:
    """Other hostnames of a service: ``hostname``, network aliases, links."""
    names = [str(spec["hostname"])] if isinstance(spec.get("hostname"), (str, int)) and spec.get("hostname") else []
    networks = spec.get("networks")
    if isinstance(networks, dict):
        for network, options in networks.items():
            options = options if isinstance(options, dict) else {}
            names += [str(alias) for alias in listing(options.get("aliases"), f"services.{name}.networks", report)
                      if isinstance(alias, (str, int))]
            for fixed in ("ipv4_address", "ipv6_address", "mac_address", "link_local_ips"):
                if fixed in options:
                    report.refuse(f"services.{name}.networks.{network}.{fixed}", "a fixed address: every service "
                                                                                 "is on the node's loopback")
    if networks:
        report.notes.append(f"{name}: networks: every service shares the node's loopback (networks do not isolate)")
    for link in listing(spec.get("links"), f"services.{name}.links", report):
        alias = str(link).partition(":")[2]
        names += [alias] if alias else []
    return [alias for alias in dict.fromkeys(names)  # each once, in the order Compose gives them
            if alias != name and re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", alias)]


MetaReader = Callable[[str], "ImageMeta | None"]


@dataclass(frozen=True)
class Up:
    """``docker compose up``'s own flags: ``--exit-code-from NAME`` (config ``main``), ``--scale SERVICE=N``,
    ``--profile NAME``."""

    exit_code_from: str | None = None
    scale: tuple[tuple[str, int], ...] = ()
    profiles: frozenset[str] = frozenset()


def import_stack(compose: dict[str, Any], compose_dir: Path, project_dir: Path, run: str,
                 variables: Variables | None = None, images_dir: str = "images", runtime: str = "apptainer",
                 image_meta: MetaReader | None = None, hostnames: bool = True, up: Up = Up()) -> Imported:
    """Map a (merged) Compose document to an allocstack config; refusals, gaps and notes in the report.

    :param variables: what ``${VAR}`` reads (None: the ``.env`` beside the Compose file alone).
    :param images_dir: where the config expects the images (relative to the project).
    :param runtime: the container runtime the images are for (config ``runtime``): their files' kind.
    :param image_meta: reads an image file's metadata (its EXPOSE ports) when it exists; None: never.
    :param hostnames: rewrite service names used as hostnames (allocstack/compose/hostnames.py).
    :param up: ``docker compose up``'s flags, as given to the import.
    """
    report = Report()
    if variables is None:
        dotenv = compose_dir / ".env"
        try:
            variables = Variables({}, [(".env", read_env_file(dotenv))] if dotenv.is_file() else [])
        except (OSError, ValueError) as exc:
            report.refuse(".env", str(exc))
            variables = Variables({}, [])
    interpolator = Interpolator(variables)
    compose = interpolator.document(compose)
    for problem, places in grouped(interpolator.problems).items():
        more = f" (and {len(places) - 1} more: {', '.join(places[1:4])}{', ...' if len(places) > 4 else ''})"
        report.refuse(places[0] or "(top level)", problem + (more if len(places) > 1 else ""))
    context = Context(compose_dir, project_dir, report, interpolator=interpolator)
    for key in compose:
        if key not in TOP_LEVEL and not str(key).startswith("x-"):
            reason = "not imported: give the import every Compose file instead" if key == "include" else \
                "not a top-level Compose key allocstack knows"
            report.refuse(str(key), reason)
    if "version" in compose:
        report.notes.append("version ignored (obsolete: Compose ignores it too)")
    for network, options in mapping(compose.get("networks"), "networks", report).items():
        if isinstance(options, dict) and options.get("external"):
            report.refuse(f"networks.{network}", "external: a network made outside this file, to reach containers "
                                                 "that are not in this stack")
        else:
            report.notes.append(f"networks.{network}: every service shares the node's loopback instead")
    context.declared = mapping(compose.get("volumes"), "volumes", report)
    for volume, options in context.declared.items():
        options = options if isinstance(options, dict) else {}
        if options.get("external"):
            report.refuse(f"volumes.{volume}", "external: a volume made outside this file; bind its data instead")
        elif options.get("driver", "local") != "local" or options.get("driver_opts"):
            report.refuse(f"volumes.{volume}", "driver options: bind the directory instead")
    context.secrets = declared_files(compose, "secrets", context)
    context.configs = declared_files(compose, "configs", context)
    services = compose.get("services")
    if not isinstance(services, dict) or not services:
        report.refuse("services", "the Compose file has no services (a mapping of them)")
        return Imported({}, report, [], interpolator.uses)
    active: dict[str, dict[str, Any]] = {}
    for name, spec in services.items():
        if not SERVICE_NAME_PATTERN.match(str(name)):
            report.refuse(f"services.{name}", "the name must be letters, digits, '.', '_' or '-'")
        elif spec is not None and not isinstance(spec, dict):
            report.refuse(f"services.{name}", "must be a mapping")
        elif spec and spec.get("profiles") and not up.profiles & set(map(str, listing(spec["profiles"], name, report))):
            report.notes.append(f"{name}: left out: it has profiles {spec['profiles']}, and `docker compose up` "
                                "starts it only with --profile")
        else:
            active[str(name)] = normalized(spec or {})
    for name, spec in active.items():
        service_keys(name, spec, report)
        check_depends_on(name, spec, report)
    counts = {name: replicas(spec, f"services.{name}", report) for name, spec in active.items()}
    for name, number in up.scale:
        if name not in active:
            report.refuse(f"--scale {name}={number}", f"{name} is not a service here (or it is left out by its "
                                                      "profiles)")
        elif number < 1:
            report.refuse(f"--scale {name}={number}", "at least one replica must run")
        else:
            counts[name] = number
    main = up.exit_code_from
    if main is not None and main not in active:
        report.refuse(f"--exit-code-from {main}", f"{main} is not a service here (or it is left out by its profiles)")
        main = None
    main = main or producer_of(active, counts, report)
    roles = assign_roles(active, counts, report, main)
    programs = {name: Program.read(name, spec, context, run, f"{images_dir.rstrip('/')}/", IMAGE_SUFFIX[runtime])
                for name, spec in active.items()}
    names = {name: [name, *aliases(name, spec, report)] for name, spec in active.items()}
    waited: dict[str, dict[str, str]] = {name: {} for name in active}
    for name, spec in active.items():
        for dependency, condition in conditions(spec).items():
            if dependency in waited:
                waited[dependency][name] = condition
    allowed = host_edges(programs, active, roles, names, report) if hostnames else {}
    ports = choose_ports(programs, roles, active, names, waited, image_meta, report)
    config = assemble(active, programs, roles, counts, ports, allowed, names, waited, context, runtime, hostnames)
    if roles.services:
        report.notes.append(names_note(hostnames))
    config["run"] = run
    if roles.main:
        config["main"] = roles.main
    if roles.init:
        config["init_jobs"] = roles.init
    start_only(config["services"], active, roles.init, report)
    service_replicas(config, counts, {name for name, _ in up.scale}, report)
    rename_reserved(config, report)
    secrets_by_name(config, report)
    services = config["services"]
    try:
        order = start_order({name: [d for d in spec["depends_on"] if d in services] for name, spec in services.items()})
    except DependencyCycle as cycle:
        report.refuse("services", str(cycle))
        order = list(services)
    return Imported(config, report, order, interpolator.uses)


def service_replicas(config: dict[str, Any], counts: dict[str, int], scaled: set[str], report: Report) -> None:
    """A replicated service other than the workers (``deploy.replicas``, ``scale:``, ``--scale NAME=N``): its
    ``replicas`` where the plan allows copies of it (not main, an init job or global; with a port, each in a network
    of its own: the stack's private network), else the plan's own refusal (allocstack/plan/refusals.py), at the key that asked for them."""
    services, base = config["services"], service_defaults()
    view = {"main": config.get("main"), "init_jobs": config.get("init_jobs", []),
            "network": {"isolation": (config.get("network") or {}).get("isolation", "private")},
            "services": {name: {**base, **spec, "readiness": {**base["readiness"], **(spec.get("readiness") or {})}}
                         for name, spec in services.items()}}
    for name, spec in services.items():
        if counts.get(name, 1) < 2:
            continue
        key = f"--scale {name}={counts[name]}" if name in scaled else f"services.{name}.deploy.replicas"
        why = replicas_refusal(name, view)
        if why:
            report.refuse(key, f"{name}: {why}")
            continue
        spec["replicas"] = counts[name]
        listens = "" if spec.get("port") is None else (f", each on port {spec['port']} in a network of its own, reached "
                                                        f"in turn through {name}:{spec['port']}")
        report.notes.append(f"{name}: {counts[name]} replicas ({key}): each its own job step on the first node{listens}, "
                            "supervised as a service is, told $ALLOCSTACK_REPLICA (1..N) and $ALLOCSTACK_REPLICAS "
                            "(config services.<name>.replicas)")


@dataclass
class Program:
    """One service's program as Compose describes it, before the roles place it."""

    entrypoint: list[str] | None
    command: list[str] | None
    env: dict[str, str]
    mounts: list[Mount]
    working_dir: str | None
    image: tuple[str, str] | None  # (what it is made from, the image file the config expects)

    @classmethod
    def read(cls, name: str, spec: dict[str, Any], context: Context, project: str, prefix: str,
             suffix: str) -> Program:
        report = context.report
        mounts = [m for index, mount in enumerate(listing(spec.get("volumes"), f"services.{name}.volumes", report))
                  if (m := parse_mount(mount, f"services.{name}.volumes[{index}]", name, context))]
        for entry in listing(spec.get("tmpfs"), f"services.{name}.tmpfs", report):
            mount = parse_mount({"type": "tmpfs", "target": str(entry).split(":")[0]}, f"services.{name}.tmpfs", name,
                                context)
            mounts += [mount] if mount else []
        mounts += secret_mounts(name, spec, "secrets", context) + secret_mounts(name, spec, "configs", context)
        targets: dict[str, Mount] = {}
        for mount in mounts:
            if mount.target in targets:
                report.refuse(f"services.{name}.volumes", f"two mounts at {mount.target}")
            targets[mount.target] = mount
        working_dir = spec.get("working_dir")
        if working_dir is not None and (not isinstance(working_dir, str) or not working_dir.startswith("/")):
            report.refuse(f"services.{name}.working_dir", f"{working_dir!r} must be an absolute path in the container")
            working_dir = None
        image = image_source(name, spec, project, report)
        return cls(words(spec.get("entrypoint"), f"services.{name}.entrypoint", report),
                   words(spec.get("command"), f"services.{name}.command", report),
                   environment(name, spec, context), mounts, working_dir,
                   (image[0], f"{prefix}{image[1]}{suffix}") if image else None)



def reaches(graph: dict[str, list[str]], start: str, goal: str) -> bool:
    seen, stack = set(), [start]
    while stack:
        node = stack.pop()
        if node == goal:
            return True
        if node not in seen:
            seen.add(node)
            stack += graph.get(node, [])
    return False


def host_edges(programs: dict[str, Program], active: dict[str, dict[str, Any]], roles: Roles,
               names: dict[str, list[str]], report: Report) -> dict[str, set[str]]:
    """Which services each program may name as hosts (rewritten, and for a service: started after them).

    A service that names another one as a host needs that one's address before it starts, so it starts after
    its gate; where that would close a cycle Compose does not have (the other one waits for this one), the
    name is left as written and the import says so."""
    graph = {name: [d for d in conditions(active[name]) if d in roles.services] for name in roles.services}
    owner = {alias: name for name, aliases_ in names.items() for alias in aliases_ if name in roles.services}
    allowed: dict[str, set[str]] = {}
    for name, program in programs.items():
        named = named_hosts(owner, [*(program.entrypoint or []), *(program.command or [])], program.env)
        allowed[name] = set(names[name]) if name in roles.services else set()  # its own names (its healthcheck)
        for alias in named:
            other = owner[alias]
            if other == name:
                continue
            if name in roles.services and other not in graph[name]:
                if reaches(graph, other, name):
                    report.notes.append(f"{name}: {alias} left as written (naming it as a host would make {name} "
                                        f"wait for {other}, which waits for {name}); it resolves through the "
                                        "stack's hosts file")
                    continue
                graph[name].append(other)
            allowed[name].add(alias)
    return allowed


def choose_ports(programs: dict[str, Program], roles: Roles, active: dict[str, dict[str, Any]],
                 names: dict[str, list[str]], waited: dict[str, dict[str, str]], image_meta: MetaReader | None,
                 report: Report) -> dict[str, Any]:
    """Each service's port: its ``ports``/``expose``, else ``name:PORT`` where others use it, else its image's
    EXPOSE (``image`` when the image is not there yet: read when the stack starts). Two services on one port are
    refused naming both."""
    owner = {alias: name for name, aliases_ in names.items() for alias in aliases_}
    used: dict[str, list[int]] = {}
    for program in programs.values():
        for alias, numbers in named_hosts(owner, [*(program.entrypoint or []), *(program.command or [])],
                                          program.env).items():
            used.setdefault(owner[alias], []).extend(numbers)
    chosen: dict[str, Any] = {}
    for name in roles.services:
        listed = listed_ports(name, active[name], report)
        candidates = listed.listed + [port for port in used.get(name, []) if port not in listed.listed]
        if listed.refused and not listed.listed:
            chosen[name] = "refused"
            continue
        port: Any = candidates[0] if candidates else None
        if len(set(candidates)) > 1:
            report.notes.append(f"{name}: listens on {sorted(set(candidates))}; its gate and "
                                f"${variable_prefix(name)}PORT use {port}")
        image = programs[name].image
        if port is None and not has_healthcheck(active[name]) and image and waited[name] and name not in roles.init:
            meta = image_meta(image[1]) if image_meta else None
            if meta is not None and meta.exposed:
                port = meta.exposed[0]
                report.notes.append(f"{name}: port {port} from its image's EXPOSE ({meta.source})")
            elif meta is None:
                port = "image"  # the image is not there yet: its EXPOSE is read when the stack starts
        if isinstance(port, int) and port < 1024:
            report.refuse(f"services.{name}", f"port {port} is privileged: listening on it needs root; make the "
                                              "service listen on 1024 or above", impossible=True)
            port = "refused"
        chosen[name] = port
    sharing: dict[int, list[str]] = {}
    for name, port in chosen.items():
        if isinstance(port, int):
            sharing.setdefault(port, []).append(name)
    for port, users in sharing.items():
        if len(users) > 1:
            report.refuse(f"services.{users[1]}", f"services {', '.join(users)} all listen on port {port}: on one "
                                                  "node two services cannot share a port (and one's tcp gate could "
                                                  "pass on the other's listener); give each its own port")
    return chosen


def has_healthcheck(spec: dict[str, Any]) -> bool:
    check = spec.get("healthcheck")
    return isinstance(check, dict) and bool(check.get("test")) and check.get("disable") is not True and \
        not (isinstance(check.get("test"), list) and check["test"][:1] == ["NONE"])


def assemble(active: dict[str, dict[str, Any]], programs: dict[str, Program], roles: Roles, counts: dict[str, int],
             ports: dict[str, Any], allowed: dict[str, set[str]], names: dict[str, list[str]],
             waited: dict[str, dict[str, str]], context: Context, runtime: str, hostnames: bool) -> dict[str, Any]:
    report = context.report
    host_of = {alias: f"${{{variable_prefix(name)}HOST}}" for name in roles.services for alias in names[name]}
    services: dict[str, Any] = {}
    parts: dict[str, Any] = {}
    for name, spec in active.items():
        program = programs[name]
        role = "workers" if name == roles.workers else "check" if name == roles.check else "service"
        rewriter = HostRewriter({alias: host_of[alias] for alias in allowed.get(name, set())},
                                f"${{{variable_prefix(name)}HOST}}" if role == "service" and hostnames else None)
        entrypoint = rewriter.argv(program.entrypoint) if program.entrypoint is not None else None
        command = rewriter.argv(program.command) if program.command is not None else None
        env = rewriter.environment(program.env)
        cpus, gpus = resources(name, spec, role, report)
        image = program.image[1] if program.image else None
        if program.image:
            context.images.setdefault(image, (program.image[0], []))[1].append(name)
        own = {"image": image, "entrypoint": entrypoint, "command": command, "working_dir": program.working_dir,
               "mounts": [mount.as_config() for mount in program.mounts], "environment": env}
        image_paths(name, [*(program.entrypoint or []), *(program.command or [])], program.mounts, report)
        if not entrypoint and not command:
            report.notes.append(f"{name}: no command: in its image it runs the image's own (ENTRYPOINT + CMD, or its "
                                "runscript); a run without an image needs its command (set it in a config of yours)")
        if role == "service":
            port = ports.get(name)
            if name in roles.init:  # its exit 0 is its dependents' gate
                readiness = {}
            else:
                readiness = None if port == "refused" else gate(name, spec, port, waited[name], report)
            if readiness and readiness["mode"] == "command":
                readiness["command"] = rewriter.argv(readiness["command"])
            grace = seconds(spec.get("stop_grace_period", "10s"), f"services.{name}.stop_grace_period", report)
            depends = [d for d in conditions(spec) if d in roles.services]
            for added in sorted({service_of(alias, names) for alias in allowed.get(name, set())} - {name, *depends}):
                report.notes.append(f"{name}: uses {added} as a hostname: starts after {added}'s gate (added to "
                                    "depends_on)")
                depends.append(added)
            more = [alias for alias in names[name] if alias != name]
            per_node = isinstance(spec.get("deploy"), dict) and spec["deploy"].get("mode") == "global"
            services[name] = {**own, "port": None if port == "refused" else port, "readiness": readiness or {},
                              "depends_on": depends, "cpus": cpus, **({"gpus": gpus} if gpus else {}),
                              **({"hostnames": more} if more else {}), **({"mode": "global"} if per_node else {}),
                              "stop_grace_period": number(grace if grace is not None else 10)}
            restart = restart_of(name, spec, role, roles.main, report)
            if restart:
                services[name]["restart"] = restart
        else:
            for key in ("healthcheck", "ports", "expose", "stop_grace_period"):
                if key in spec:
                    report.notes.append(f"{name}: {key} ignored: the {role} are tracked as job steps, not gated")
            parts[role] = {**own, "cpus": cpus, "gpus": gpus, "replicas": counts[name],
                           "restart": restart_of(name, spec, role, roles.main, report)}
        if rewriter.done:
            report.notes.append(f"{name}: rewritten: {'; '.join(sorted(rewriter.done))}")
    return layout(services, parts, roles, context, runtime)


def names_note(hostnames: bool) -> str:
    """What the import says about service names: they resolve as in Compose, and whether values are rewritten."""
    how = ("names in commands and environment values are also rewritten to ${ALLOCSTACK_<NAME>_HOST} (--no-hostnames "
           "leaves them as written)" if hostnames else "values are left as written (--no-hostnames)")
    return ("names: each service's name, hostname and aliases resolve to 127.0.0.1 in every program, in its code and "
            "config files too, through the stack's hosts file at /etc/hosts (in its image; without one, in a mount "
            f"namespace of its own where the node allows one); {how}")


def service_of(alias: str, names: dict[str, list[str]]) -> str:
    return next(name for name, aliases_ in names.items() if alias in aliases_)


#: Where a program's own files are not: paths of the operating system (in the image and on the node alike).
SYSTEM_PATHS = ("/bin/", "/usr/", "/etc/", "/dev/", "/proc/", "/sys/", "/tmp/", "/lib", "/sbin/", "/run/")  # noqa: S108


def image_paths(name: str, argv: list[str], mounts: list[Mount], report: Report) -> None:
    """Absolute paths no mount holds, in the first words of a command: they exist only in the image."""
    targets = [mount.target for mount in mounts]
    found = [arg for arg in argv[:3] if arg.startswith("/") and not arg.startswith(SYSTEM_PATHS)
             and not any(arg == target or arg.startswith(target.rstrip("/") + "/") for target in targets)]
    if found:
        report.notes.append(f"{name}: {', '.join(found)} is inside the image (no mount holds it): with the image it "
                            "runs as is; without (a local run) it must exist on this machine")


#: Programs that never end by themselves (a task queue's worker, a server): (the words that name it, the words that
#: make it end by itself after all).
DAEMONS = (
    (("celery", "worker"), ()),
    (("rq", "worker"), ("--burst", "-b")),
    (("rqworker",), ("--burst", "-b")),
    (("dramatiq",), ()),
    (("huey_consumer",), ()),
    (("arq",), ("--burst",)),
    (("gunicorn",), ()),
    (("uvicorn",), ()),
    (("redis-server",), ()),
    (("nginx",), ()),
)


def daemon_of(argv: list[str] | None) -> str | None:
    """The known daemon a command runs (``celery worker``, ``rq worker``, ...), or None: a program that never ends
    by itself unless told (``rq worker --burst`` ends once the queue is empty)."""
    words = [os.path.basename(word) for word in argv or []]
    for name, ending in DAEMONS:
        if all(word in words for word in name) and not any(word in words for word in ending):
            return " ".join(name)
    return None


def layout(services: dict[str, Any], parts: dict[str, Any], roles: Roles, context: Context,
           runtime: str) -> dict[str, Any]:
    """The config, in the order a reader wants it."""
    default = defaults()
    empty = {key: default["verify"][key] for key in ("image", "entrypoint", "command", "working_dir", "mounts",
                                                     "environment")}
    workers = parts.get("workers") or {**empty, "cpus": default["worker"]["cpus"], "gpus": default["worker"]["gpus"],
                                       "replicas": 1}
    check = parts.get("check") or empty
    serving = not parts.get("workers") and roles.check is None and roles.workers is None
    daemon = daemon_of(workers["command"])
    if daemon and parts.get("workers") and not roles.main:
        context.report.gaps.append(
            f"{roles.workers}: the workers run `{daemon}`, a daemon that never ends by itself, and nothing ends the "
            "stack: the check waits for the workers to end, so the run would wait until its time limit; give it a way "
            "to end (`rq worker --burst` ends once the queue is empty), end the stack from your producer "
            "(--exit-code-from) or bound the workers (worker.max_lifetime: SECONDS)")
    if roles.check is None and roles.main:
        context.report.notes.append(f"no check: {roles.main}'s exit code is the verdict (as with --exit-code-from); "
                                    "set verify.command to check the results too")
    elif roles.check is None and not serving:
        context.report.gaps.append("no check: nothing says whether the results are correct; add a service that "
                                   f"waits for the workers (condition: {COMPLETED}) with a command, or set "
                                   "verify.command")
    context.report.build = what_to_build(context.images, runtime)
    if any(m.get("source") and not m.get("volume") for program in [*services.values(), workers, check]
           for m in program["mounts"]):
        context.report.notes.append("mounts: with an image each is mounted at its path in the container (read-only "
                                    "where the Compose file says :ro); a run without an image rewrites those paths in "
                                    "commands, environment values and working_dir to where the sources are here")
    volumes = sorted(context.volumes)
    spellings: dict[str, str] = {}
    for volume in volumes:
        other = spellings.setdefault(volume_variable(volume), volume)
        if other != volume:
            context.report.refuse(f"volumes.{volume}", f"{other} and {volume} would both be ${{{volume_variable(volume)}}}")
    program = lambda part: {key: part[key] for key in empty}  # noqa: E731
    config: dict[str, Any] = {
        "run": "",
        "tasks": None,
        "expected": None,
        "workers": max(1, workers["replicas"]),
        "worker": {"mode": "long-running", **program(workers), "cpus": workers["cpus"], "gpus": workers["gpus"],
                   **({"restart": workers["restart"]} if workers.get("restart") else {})},
        "services": services,
        "volumes": volumes,
        "verify": program(check),
    }
    if serving:  # no workers, no check: config mode serve (its worker and verify blocks are not used)
        config = {"run": "", "mode": "serve", **{key: value for key, value in config.items() if key != "run"}}
    kept = [volume for volume in volumes if kept_volume(context.declared.get(volume))]
    if kept:
        config["keep_volumes"] = kept
    if runtime != "apptainer":
        config["runtime"] = runtime
    return config


def kept_volume(options: Any) -> bool:
    """A top-level volume marked ``x-allocstack: {keep: true}``: its data is carried from one attempt to the next
    (every other named volume is fresh in each attempt)."""
    extension = options.get("x-allocstack") if isinstance(options, dict) else None
    return isinstance(extension, dict) and extension.get("keep") is True


def start_only(services: dict[str, Any], active: dict[str, Any], init: list[str], report: Report) -> None:
    """Compose's ``service_started`` (depends_on's short form) on a service with a gate of its own (a healthcheck, a
    port) waits for its start alone: that service's ``depends_on`` is written in the mapping form, each edge with its
    condition (``service_healthy`` where it waits for the gate: Compose said so, or the import added the edge for a
    hostname; an init job's ``service_completed_successfully``). Everything else keeps the list form."""
    for name, spec in services.items():
        said = conditions(active[name])
        early = [d for d in spec["depends_on"] if said.get(d) == STARTED and d not in init
                 and services[d]["readiness"].get("mode", "started") != "started"]
        if not early:
            continue
        spec["depends_on"] = {d: COMPLETED if d in init else STARTED if said.get(d) == STARTED else HEALTHY
                              for d in spec["depends_on"]}
        report.notes.append(f"{name}: depends_on {', '.join(early)} (service_started, Compose's short form): starts "
                            f"once {'they have' if len(early) > 1 else 'it has'} started, not when "
                            f"{'their gates pass' if len(early) > 1 else 'its gate passes'}, as Compose does "
                            "(condition: service_healthy would wait for the gate)")


def rename_reserved(config: dict[str, Any], report: Report) -> None:
    """A service whose name is allocstack's own (``worker``, ``check``, ...: its job steps') is
    ``<name>-service`` in the config: its key, the ``depends_on`` that name it, and its variables
    (``${ALLOCSTACK_<NAME>_HOST}``, ...) wherever the import wrote them."""
    services = config.get("services") or {}
    renamed = {}
    for name in list(services):
        if reserved(name):
            new = f"{name}-service"
            while new in services or reserved(new):
                new += "-service"
            renamed[name] = new
    if not renamed:
        return
    variables = {variable_prefix(old): variable_prefix(new) for old, new in renamed.items()}
    pattern = re.compile(r"\$\{(" + "|".join(map(re.escape, variables)) + r")(HOST|PORT|ENDPOINT|TOKEN)\}")

    def walk(node: Any) -> Any:
        if isinstance(node, dict):
            return {key: walk(value) for key, value in node.items()}
        if isinstance(node, list):
            return [walk(item) for item in node]
        if isinstance(node, str):
            return pattern.sub(lambda match: f"${{{variables[match.group(1)]}{match.group(2)}}}", node)
        return node

    config["services"] = {renamed.get(name, name): walk(spec) for name, spec in services.items()}
    for old, new in renamed.items():  # still reached by its Compose name, through the stack's hosts file
        spec = config["services"][new]
        spec["hostnames"] = [old, *(alias for alias in spec.get("hostnames", []) if alias != old)]
    for spec in config["services"].values():
        depends = spec["depends_on"]
        spec["depends_on"] = ({renamed.get(name, name): condition for name, condition in depends.items()}
                              if isinstance(depends, dict) else [renamed.get(name, name) for name in depends])
    if "init_jobs" in config:
        config["init_jobs"] = [renamed.get(name, name) for name in config["init_jobs"]]
    for key in ("worker", "verify"):
        config[key] = walk(config[key])
    report.notes[:] = [pattern.sub(lambda match: f"${{{variables[match.group(1)]}{match.group(2)}}}", note)
                       for note in report.notes]
    for old, new in renamed.items():
        report.notes.append(f"{old}: services.{new} in the config ({old} is the name of allocstack's own steps); its "
                            f"variables are ${{{variable_prefix(new)}HOST}}, ...")


def secrets_by_name(config: dict[str, Any], report: Report) -> None:
    """Secrets from the environment (interpolation markers) become ``${env:NAME}`` in commands and environment
    values, read when the program starts; anywhere else they cannot be (they would be written out): refused."""

    def walk(node: Any, path: str, allowed: bool) -> Any:
        if isinstance(node, dict):
            return {key: walk(value, f"{path}.{key}" if path else str(key),
                              allowed or key in ("command", "entrypoint", "environment")) for key, value in node.items()}
        if isinstance(node, list):
            return [walk(item, f"{path}[{index}]", allowed) for index, item in enumerate(node)]
        if isinstance(node, str) and markers(node):
            if allowed:
                return as_references(node)
            report.refuse(path, f"uses ${', $'.join(markers(node))} from your environment, whose name looks secret: "
                                "allocstack reads such a value only in commands and environment values, when the "
                                "program starts (never writing it in a file); give it in .env or an --env-file "
                                "to have it written here")
            return as_references(node)
        return node

    config.update(walk(config, "", False))


def service_keys(name: str, spec: dict[str, Any], report: Report) -> None:
    for key in spec:
        if key == "network_mode":
            mode = spec[key]
            if mode in ("bridge", "default", "none") or (isinstance(mode, str) and mode.startswith("bridge")):
                report.notes.append(f"{name}: network_mode {mode}: every service shares the node's loopback")
            else:
                report.refuse(f"services.{name}.network_mode", f"{mode}: shares the host's or another container's "
                                                               "network namespace: there are no container namespaces "
                                                               "here, and the host's real interfaces are not for a "
                                                               "stack", impossible=True)
        elif key in ("pid", "ipc"):
            report.refuse(f"services.{name}.{key}", f"{spec[key]}: shares a {key.upper()} namespace: there are no "
                                                    "container namespaces here", impossible=True)
        elif key in REFUSED_KEYS:
            reason, impossible = REFUSED_KEYS[key]
            report.refuse(f"services.{name}.{key}", reason, impossible)
        elif key in IGNORED_KEYS:
            if IGNORED_KEYS[key]:
                report.notes.append(f"{name}: {key} ignored: {IGNORED_KEYS[key]}")
        elif key not in SERVICE_KEYS and not str(key).startswith("x-"):
            report.refuse(f"services.{name}.{key}", "not a Compose service key allocstack knows")
    signal_name = spec.get("stop_signal", "SIGTERM")
    if signal_name not in ("SIGTERM", "TERM", 15):
        report.notes.append(f"{name}: stop_signal {signal_name}: allocstack stops it with SIGTERM (then SIGKILL after "
                            "its stop_grace_period): a program that ignores SIGTERM fails the run as not stopped cleanly")


def resources(name: str, spec: dict[str, Any], role: str, report: Report) -> tuple[int, int]:
    """(cpus, gpus) from ``cpus``, ``deploy.resources`` and ``gpus``; refusals for what cannot map."""
    where = f"services.{name}.deploy"
    deploy = mapping(spec.get("deploy"), where, report)
    for key in deploy:
        if key not in DEPLOY_KEYS:
            reason = {"placement": "placement constraints: nothing to match in an allocation (the plan places each program)",
                      "endpoint_mode": "swarm service discovery: services are on loopback"}.get(key, "not imported")
            report.refuse(f"{where}.{key}", reason)
    mode = deploy.get("mode", "replicated")
    if mode == "global" and role == "service":
        report.notes.append(f"{name}: deploy.mode global -> services.{name}.mode: global: one instance on every node "
                            "of the allocation (config nodes), each gated on its node; a node's programs use their own")
    elif mode != "replicated":
        report.refuse(f"{where}.mode", f"{mode}: only a service (not the {role}) runs once per node"
                      if mode == "global" else f"{mode}: not a Compose deploy mode")
    for key in ("update_config", "rollback_config", "labels"):
        if key in deploy:
            report.notes.append(f"{name}: deploy.{key} ignored: it only affects swarm updates")
    reserved = mapping(mapping(deploy.get("resources"), f"{where}.resources", report).get("reservations"),
                       f"{where}.resources.reservations", report)
    limits = mapping(mapping(deploy.get("resources"), f"{where}.resources", report).get("limits"),
                     f"{where}.resources.limits", report)
    if "memory" in limits:
        report.notes.append(f"{name}: memory limit {limits['memory']} -> set mem_mb in profiles/slurm/config.yaml")
    gpus = 0
    devices = listing(reserved.get("devices"), f"{where}.resources.reservations.devices", report)
    for device in devices:
        device = device if isinstance(device, dict) else {}
        device_count = count(device.get("count", 1))
        capabilities = device.get("capabilities") if isinstance(device.get("capabilities"), list) else []
        if "gpu" not in capabilities:
            report.refuse(f"{where}.resources.reservations.devices", "only GPUs map (capabilities: [gpu])")
        elif device.get("count") == "all":
            all_gpus(name, role, f"{where}.resources.reservations.devices", report)
        elif device_count is None:
            report.refuse(f"{where}.resources.reservations.devices", f"count {device.get('count')!r}: say how many "
                                                                     "GPUs each replica needs")
        else:
            gpus += device_count
    if "gpus" in spec:
        gpus += gpus_key(name, role, spec["gpus"], report)
    if gpus and role == "check":
        report.gaps.append(f"{name}: asks for GPUs, which the check does not get (only the services and the workers "
                           "do): as imported it runs without one")
        gpus = 0
    return cpus_of(name, spec, limits, report), gpus


def gpus_key(name: str, role: str, value: Any, report: Report) -> int:
    """Compose's ``gpus:`` (``all``, or device requests ``[{count: N, ...}]``) as a number of GPUs."""
    where = f"services.{name}.gpus"
    requests = value if isinstance(value, list) else None
    if value == "all" or (requests and any(isinstance(r, dict) and r.get("count") == "all" for r in requests)):
        all_gpus(name, role, where, report)
        return 0
    counts = [count(request.get("count", 1)) if isinstance(request, dict) else None for request in requests or []]
    if requests is None or None in counts:
        report.refuse(where, f"{value!r}: say how many GPUs it needs: gpus: [{{count: N}}] (or "
                             "deploy.resources.reservations.devices with count and capabilities: [gpu])")
        return 0
    return sum(counts)


def all_gpus(name: str, role: str, where: str, report: Report) -> None:
    """``all`` GPUs (Docker's: whatever the host has): a Slurm job asks for a number, so it is a gap to fill."""
    key = "worker.gpus" if role == "workers" else f"services.{name}.gpus"
    report.gaps.append(f"{name}: asks for all the GPUs ({where}: all), but a Slurm job asks for a number: set {key} "
                       "in the written config (as imported it gets none)")


#: Compose's ``restart:`` values, as a restart policy's condition (config ``restart``).
RESTART_VALUES = {"always": "any", "unless-stopped": "any", "on-failure": "on-failure"}
#: Seconds before a restart for ``restart:``: the pause Docker's daemon makes before its first (it has no ``delay``).
RESTART_DELAY = 0.1


def restart_policy(name: str, spec: dict[str, Any], report: Report) -> dict[str, Any] | None:
    """Compose's ``deploy.restart_policy`` (which replaces ``restart:``), else ``restart:`` (``no``, ``always``,
    ``unless-stopped``, ``on-failure[:N]``), as config ``restart`` (allocstack/launch/restart.py); None: none."""
    deploy = spec.get("deploy") if isinstance(spec.get("deploy"), dict) else {}
    if deploy.get("restart_policy") is not None:
        where = f"services.{name}.deploy.restart_policy"
        policy = mapping(deploy["restart_policy"], where, report)
        condition = policy.get("condition", "any")
        if condition not in ("none", "on-failure", "any"):
            report.refuse(f"{where}.condition", f"{condition!r} is not none, on-failure or any")
            return None
        delay = seconds(policy.get("delay", 0), f"{where}.delay", report)
        window = seconds(policy.get("window", 0), f"{where}.window", report)
        attempts = count(policy.get("max_attempts", 0))
        if attempts is None:
            report.refuse(f"{where}.max_attempts", f"{policy.get('max_attempts')!r} is not a whole number")
        if condition == "none" or delay is None or window is None or attempts is None:
            return None
        if window and not attempts:
            report.notes.append(f"{name}: deploy.restart_policy window ignored: it bounds max_attempts, which is not "
                                "set (no limit)")
            window = 0
        return {"condition": condition, "delay": number(delay), "max_attempts": attempts or None,
                "window": number(window)}
    restart = spec.get("restart", "no")
    if restart in ("no", False, None):
        return None
    base, _, limit = str(restart).partition(":")
    if base not in RESTART_VALUES or (limit and (base != "on-failure" or not limit.isdigit())):
        report.refuse(f"services.{name}.restart", f"{restart!r} is not no, always, unless-stopped or on-failure[:N]")
        return None
    attempts = int(limit) if limit else 0  # on-failure:0, as Docker reads it: no limit
    return {"condition": RESTART_VALUES[base], "delay": RESTART_DELAY, "max_attempts": attempts or None, "window": 0}


def restart_of(name: str, spec: dict[str, Any], role: str, main: str | None, report: Report) -> dict[str, Any] | None:
    """The restart policy of a service in its role: none for the main program and the check (each runs once and
    its end decides the run); for the workers without ``main``, ``any`` becomes ``on-failure`` (the stack ends when
    every worker ended, which a worker started again after exit 0 never does)."""
    policy = restart_policy(name, spec, report)
    if policy is None:
        return None
    if name == main or role == "check":
        what = "the main program" if name == main else "the check"
        report.notes.append(f"{name}: restart {policy['condition']} not applied: {what} runs once and its end decides "
                            "the run")
        return None
    if role == "workers" and policy["condition"] == "any" and not main:
        report.notes.append(f"{name}: restart any as on-failure: the stack ends when every worker ended, so a worker "
                            "that exits 0 is not started again (one that fails or is killed is)")
        return {**policy, "condition": "on-failure"}
    return policy


def cpus_of(name: str, spec: dict[str, Any], limits: dict[str, Any], report: Report) -> int:
    """``cpus`` (or ``deploy.resources.limits.cpus``), rounded up to whole CPUs of a job step."""
    cpus = spec.get("cpus", limits.get("cpus", service_defaults()["cpus"]))
    try:
        return max(1, math.ceil(float(cpus)))
    except (TypeError, ValueError, OverflowError):
        report.refuse(f"services.{name}.cpus", f"{cpus!r} is not a number of CPUs")
        return 1


def draft_decisions(config: dict[str, Any], order: list[str], sources: str) -> dict[str, dict[str, str]]:
    """The seed's decision record, drafted from what the import did: review it, then keep or edit it."""
    full = completed(config)  # every key the schema gives a default
    services, worker = full["services"], full["worker"]
    if full["mode"] == "serve":
        full["workers"] = 0  # as the plan has it: a serving stack has no workers
    cpus = allocation(full).cpus
    gate_of = {"command": "its healthcheck", "tcp": "its port", "started": "its start"}
    gated = [f"{name} ({gate_of.get(spec['readiness'].get('mode'), 'its gate')})" for name, spec in services.items()]
    start = ", then ".join(gated) if gated else "no services"
    volumes = ", ".join(config["volumes"]) or "none"
    programs = [*services.values(), worker, full["verify"]]
    binds = sorted({m["source"] for program in programs for m in program["mounts"] if m.get("source")}) or ["none"]
    images = sorted({program["image"] for program in programs if program["image"]}) or ["none"]
    ports = ", ".join(f"{name} on {spec['port']}" for name, spec in services.items() if spec["port"]) or "free ports"
    gpus = worker["gpus"]
    asked = [f"{gpus} GPU(s) per worker"] if gpus else []
    asked += [f"{spec['gpus']} for {name}" for name, spec in services.items() if spec["gpus"]]
    if full["mode"] == "serve":
        shape = f"{cpus} CPUs (each service's)"
        then = ("then it serves (UP, with each service's SSH tunnel line) until the allocation's time limit, scancel "
                "or Ctrl-C")
    else:
        shape = f"{cpus} CPUs ({config['workers']} workers x {worker['cpus']}, plus each service's)"
        then = (f"then {config['workers']} long-running workers; the check once every worker ended, while the services "
                "are up")
    return {
        "allocation": {"owner": "scheduler policy", "how": (
            f"One node for a bounded time: {shape}, runtime and memory from profiles/slurm/config.yaml; one sbatch job "
            "for the whole stack.")},
        "startup_order": {"owner": "launch script", "how": (
            f"Imported from {sources}: {start}, each after the services it depends on passed their gates; {then}.")},
        "runtime_state": {"owner": "launch script", "how": (
            f"Named volumes ({volumes}) are job-scoped scratch (0700, $SLURM_TMPDIR or $TMPDIR), removed after the "
            f"run, mounted where the Compose file says; binds ({', '.join(binds)}) are paths of the project; each "
            f"program runs in its own image ({', '.join(images)}), checked against its SHA-256 sidecar first.")},
        "service_access": {"owner": "center configuration", "how": (
            f"Loopback only ({ports}, each with a per-run token in $ALLOCSTACK_<NAME>_TOKEN); published ports reach "
            "a laptop only through an SSH tunnel the center allows.")},
        "accelerators": {"owner": "center configuration", "how": (
            f"{', '.join(asked)}: summed into sbatch --gpus, srun --gpus for each step, Apptainer --nv." if asked
            else "None: the Compose file asks for no GPUs.")},
    }


def variable_sources(uses: dict[str, Use]) -> str:
    """Each variable the Compose file used and where its value came from, for the decision record."""
    parts = []
    for name, use in sorted(uses.items()):
        source = (f"the environment, kept out of the config: ${{env:{name}}} is read when the program starts"
                  if use.secret else use.source)
        parts.append(f"{name} ({source})")
    return "; ".join(parts) or "none"


def unique(lines: list[str]) -> list[str]:
    return list(dict.fromkeys(lines))
