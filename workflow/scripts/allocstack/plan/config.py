"""The config, as the plan reads it: the schema, nulls from the command line, defaults, the older ``service:``.

``workflow/schemas/config.schema.yaml`` is the one place a default is written: validation
fills it in for every key left out (:func:`validate`), and :func:`defaults` is the whole
config they make (what ``import_compose.py`` starts from). The single ``service:`` block is
migrated here, once, into the service ``app`` of ``services`` (:func:`migrate_service_block`):
nothing after it reads ``service:``.

PyYAML and jsonschema are imported where they are used: the rest of the package (its layout,
its placement) is read by components that run with the standard library alone.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Mapping
from functools import cache
from pathlib import Path
from typing import Any

from .refusals import PlanError

#: workflow/schemas/config.schema.yaml, from workflow/scripts/allocstack/plan/.
SCHEMA = Path(__file__).resolve().parents[3] / "schemas" / "config.schema.yaml"


@cache
def schema() -> dict[str, Any]:
    """The config schema, read once (libyaml's loader where PyYAML has it: a tenth of the pure-Python one's time)."""
    import yaml

    with open(SCHEMA, encoding="utf-8") as handle:
        return yaml.load(handle, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))  # noqa: S506 (a safe loader)


def nulls_from_command_line(values: dict[str, Any], spec: Mapping[str, Any]) -> None:
    """``--config expected=null`` arrives as the string "null" (Snakemake parses it as text):
    where the schema allows null, it means null."""
    for key, sub in spec.get("properties", {}).items():
        if key not in values:
            continue
        kinds = sub.get("type", [])
        if values[key] == "null" and "null" in ([kinds] if isinstance(kinds, str) else kinds):
            values[key] = None
        elif isinstance(values[key], dict) and "properties" in sub:
            nulls_from_command_line(values[key], sub)


def _filling_validator(spec: Mapping[str, Any]) -> Any:
    """A Draft 2020-12 validator of ``spec`` whose ``properties`` keyword also sets each missing
    property's ``default`` (as snakemake.utils.validate does), then checks the properties as usual."""
    import jsonschema

    def fill_defaults(validator: Any, properties: Mapping[str, Any], instance: Any,
                      schema: Mapping[str, Any]) -> Iterator[Any]:
        if validator.is_type(instance, "object"):  # else "type" names the problem
            for name, subschema in properties.items():
                if "default" in subschema:
                    instance.setdefault(name, copy.deepcopy(subschema["default"]))
        yield from jsonschema.Draft202012Validator.VALIDATORS["properties"](validator, properties, instance, schema)

    filling = jsonschema.validators.extend(jsonschema.Draft202012Validator, {"properties": fill_defaults})
    return filling(spec)


def validate(config: dict[str, Any], spec: Mapping[str, Any] | None = None) -> None:
    """Validate ``config`` in place against ``spec`` (the config schema), filling in defaults.

    :raises PlanError: ``config``, ONE line naming the key.
    """
    import jsonschema

    error = jsonschema.exceptions.best_match(_filling_validator(spec or schema()).iter_errors(config))
    if error is not None:
        key = ".".join(str(part) for part in error.absolute_path) or "config"
        raise PlanError("config", f"{key}: {error.message}")


def completed(config: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of ``config`` with the schema's defaults for every key it leaves out.

    :raises PlanError: ``config`` for a value the schema refuses.
    """
    complete = copy.deepcopy(dict(config))
    validate(complete)
    return complete


def defaults() -> dict[str, Any]:
    """The config of every default (``run``, ``tasks`` and ``workers`` as the schema gives them)."""
    return completed({})


def service_defaults() -> dict[str, Any]:
    """A service of ``services`` with every default (its command null)."""
    service: dict[str, Any] = {}
    validate(service, schema()["properties"]["services"]["additionalProperties"])
    return service


def migrate_service_block(config: dict[str, Any]) -> dict[str, str]:
    """The older single ``service:`` block becomes the service ``app`` of ``services`` (so its variables
    stay ALLOCSTACK_APP_*), with the schema's defaults for a service; ``service`` is then gone.

    :returns: how the config spells a service that is not ``services.<name>`` (``{"app": "service"}``).
    :raises PlanError: ``config`` when ``service.command`` and ``services.app`` are both set.
    """
    block = config.pop("service", None) or {}
    if not block.get("command"):
        return {}
    if "app" in config["services"]:
        raise PlanError("config", "service.command and services.app are both set: `service:` is the older "
                                  "spelling of services.app; keep one")
    app = {**service_defaults(), "command": block["command"]}
    app["readiness"] = {**app["readiness"], **block.get("readiness", {})}
    config["services"] = {**config["services"], "app": app}
    return {"app": "service"}
