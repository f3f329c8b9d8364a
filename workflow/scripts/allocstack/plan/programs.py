"""Programs of yours in their own images: which image each runs in, and what its supervisor is told.

A program of yours is a service (``services.<name>``), the long-running workers (``worker``) or your
check (``verify``). With images switched on (``--sdm apptainer``, or runtime charliecloud) each runs in
its own ``image``, else in the top-level ``image``; its supervisor (app_service.py, replica.py,
check.py, verify.py, and a service's command gate) then runs *beside* that image on the node and
starts the program in it (allocstack/launch/program.py), so the image needs nothing of allocstack's.
Per-task workers run allocstack's own worker.py, in ``worker.image`` (else ``image``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .stack import Plan

#: ``${env:NAME}`` in a command or an environment value: read from the environment when the program starts.
ENV_REFERENCE = re.compile(r"\$\{env:([A-Za-z_][A-Za-z0-9_]*)\}")


def images_on(config: Mapping[str, Any], deployment: frozenset[str]) -> bool:
    """Images are switched on: runtime charliecloud, or Apptainer with ``--sdm apptainer``."""
    return config["runtime"] == "charliecloud" or "apptainer" in deployment


def parts_of_yours(config: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any]]]:
    """(config key, config) of every program of yours: each service, the workers, the check. No check where there
    is none: config ``main`` set and ``verify`` without a command, an entrypoint or an image (main's exit code is
    the verdict), so a stack whose every program has its own image needs no ``image`` for a check it has not."""
    check = config["verify"]
    no_check = config["main"] and not (check["command"] or check["entrypoint"] or check["image"])
    return [*((f"services.{name}", spec) for name, spec in config["services"].items()),
            ("worker", config["worker"]), *([] if no_check else [("verify", check)])]


def program_image(config: Mapping[str, Any], on: bool, spec: Mapping[str, Any]) -> str | None:
    """The image a program of yours runs in: its own, else ``image``; None with images off or neither set."""
    if not on:
        return None
    return spec.get("image") or config["image"] or None


def env_references(spec: Mapping[str, Any]) -> list[str]:
    """The variables of the environment a program's command, entrypoint or environment reads (``${env:NAME}``)."""
    texts = [*(spec.get("command") or []), *(spec.get("entrypoint") or [])]
    texts += [value for value in (spec.get("environment") or {}).values() if isinstance(value, str)]
    return sorted({name for text in texts for name in ENV_REFERENCE.findall(text)})


def check_command_set(config: Mapping[str, Any], on: bool) -> bool:
    """verify.command is set, or (your own stack) the check runs its image's own command."""
    check = config["verify"]
    if check["command"] or check["entrypoint"]:
        return True
    return not config["tasks"] and bool(check["image"]) and on


def program_images(config: Mapping[str, Any], on: bool) -> dict[str, str]:
    """Every image a program of yours runs in (with images on): config key -> its path. Per-task workers:
    ``worker.image`` only (their image otherwise is the top-level one, checked as allocstack's own)."""
    long_running = config["worker"]["mode"] == "long-running"
    found = {}
    for key, spec in parts_of_yours(config):
        if key == "worker" and not long_running:
            image = config["worker"]["image"] if on else None
        elif key == "verify" and config["tasks"] and not spec["command"]:
            image = None
        else:
            image = program_image(config, on, spec)
        if image:
            found[key] = image
    return found


def image_checks(plan: Plan) -> list[dict[str, Any]]:
    """validate_inputs' checks of the programs' images before anything starts: each sidecar, and what the run
    takes from an image (its own command, the port it EXPOSEs, its mount points)."""
    config = plan.config
    parts = dict(parts_of_yours(config))
    checks = []
    images = program_images(config, plan.images_on)
    if plan.main_spec is not None and (image := program_image(config, plan.images_on, plan.main_spec)):
        parts[f"services.{plan.main}"] = plan.main_spec  # taken out of services: it runs once (run_main)
        images[f"services.{plan.main}"] = image
    for key, image in images.items():
        spec = parts[key]
        own_command = not (spec["command"] or spec["entrypoint"]) and (key != "worker" or plan.long_running)
        checks.append({"what": key, "image": image, "command": own_command, "port": spec.get("port") == "image",
                       "mounts": spec.get("mounts", [])})
    return checks


def options(plan: Plan, spec: Mapping[str, Any], with_command: bool = True) -> list[tuple[str, Any]]:
    """Where a program of yours runs and what: its command (none: its image's own), and its image, mounts,
    working directory and entrypoint for the supervisor that starts it there."""
    config = plan.config
    pairs: list[tuple[str, Any]] = []
    if with_command and spec["command"]:
        pairs.append(("--command-json", spec["command"]))
    if spec.get("mounts"):
        pairs.append(("--mounts-json", spec["mounts"]))
    if spec.get("working_dir"):
        pairs.append(("--working-dir", spec["working_dir"]))
    if spec.get("entrypoint"):
        pairs.append(("--entrypoint-json", spec["entrypoint"]))
    image = program_image(config, plan.images_on, spec)
    if image:
        runtime = config["runtime"]
        pairs += [("--image", plan.facts.absolute(image)), ("--runtime", runtime)]
        pairs += [("--runtime-arg", arg) for arg in config[runtime]["args"]]
        if spec.get("gpus") and runtime == "apptainer" and "--nv" not in config[runtime]["args"]:
            # its GPUs (its job step's --gpus): the driver in the image (Charliecloud: ch-fromhost --nvidia, once)
            pairs.append(("--runtime-arg", "--nv"))
        pairs += [("--bind", plan.facts.absolute(path)) for path in config[runtime]["binds"]]
    return pairs


def beside(plan: Plan, component: str, service: str = "") -> bool:
    """``component`` supervises a program of yours in an image: it runs beside that image, not in ``image``."""
    config = plan.config
    if component in ("service", "service_gate", "init", "instance", "instance_gate", "replica", "replica_gate"):
        return bool(program_image(config, plan.images_on, config["services"][service]))
    if component == "worker":
        return plan.long_running and bool(program_image(config, plan.images_on, config["worker"]))
    if component == "main":
        return bool(program_image(config, plan.images_on, plan.main_spec or {}))
    if component in ("check", "verify"):
        check = config["verify"]
        return bool(program_image(config, plan.images_on, check)) and (not plan.builtin_coordinator
                                                                         or bool(check["command"]))
    return False


def own_image(plan: Plan, component: str) -> str | None:
    """The image ``component`` runs in instead of ``image``: per-task workers run in ``worker.image`` (a job step
    of several, ``workers``, too: its supervisor and relay with them)."""
    if component in ("worker", "workers") and not plan.long_running and plan.images_on:
        return plan.config["worker"]["image"] or None
    return None
