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
import difflib
import json
import shlex
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

    :raises PlanError: ``config``, ONE line naming the key (:func:`explain`).
    """
    import jsonschema

    error = jsonschema.exceptions.best_match(_filling_validator(spec or schema()).iter_errors(config))
    if error is not None:
        raise PlanError("config", explain(error, [str(part) for part in error.absolute_path]))


def close_to(word: str, choices: list[str]) -> str:
    """``; did you mean 'workers'?`` when ``word`` is close to one of ``choices`` (difflib), else ''."""
    match = difflib.get_close_matches(word, choices, n=1, cutoff=0.6)
    return f"; did you mean {match[0]!r}?" if match else ""


#: JSON Schema's type names, as a config file writes a value of that type.
TYPE_WORDS = {"array": "a list", "object": "a mapping", "string": "text", "integer": "a whole number",
              "number": "a number", "boolean": "true or false", "null": "null"}


def shown(value: Any) -> str:
    """``value`` as a config file writes it (JSON, which YAML reads too), cut at 80 characters."""
    try:
        text = json.dumps(value)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def nested(path: list[str], value: str) -> str:
    """``worker: {command: VALUE}`` for the path ``worker.command``: the key as a config file nests it."""
    text = f"{path[-1]}: {value}"
    for part in reversed(path[:-1]):
        text = f"{part}: {{{text}}}"
    return text


def how_to_write(path: list[str], value: Any, expected: list[str]) -> str:
    """How to write the key at ``path`` with a value of the ``expected`` types (from ``value`` where it can be)."""
    if "array" in expected and isinstance(value, str):
        argv = shlex.split(value) if value.strip() else ["program"]
        return f"write an argv list, one word per item, in a file given with --configfile: {nested(path, json.dumps(argv))}"
    if ("integer" in expected or "number" in expected) and isinstance(value, str):
        return f"write a number, without quotes: {nested(path, '3')}"
    if "boolean" in expected:
        return f"write {nested(path, 'true')} or {nested(path, 'false')}"
    if "object" in expected:
        return f"write a mapping, in a file given with --configfile: {nested(path, '{NAME: VALUE}')}"
    if "array" in expected:
        return f"write a list: {nested(path, '[' + shown(value) + ']')}"
    if "string" in expected:
        return f"write text: {nested(path, json.dumps(str(value)))}"
    return f"write {' or '.join(TYPE_WORDS.get(kind, kind) for kind in expected)}"


def explain(error: Any, path: list[str]) -> str:
    """A schema error as ONE line naming the key: an unknown key with the one it is close to (did you mean), a
    value of the wrong type with how to write it, a value not allowed with the one it is close to; otherwise
    jsonschema's words."""
    key = ".".join(path) or "config"
    instance = error.instance
    if error.validator == "additionalProperties" and isinstance(instance, dict):
        known = [str(name) for name in error.schema.get("properties", {})]
        unknown = [str(name) for name in instance if name not in known]
        if unknown and known:
            full = ".".join([*path, unknown[0]])
            where = f"{key} has no key {unknown[0]!r}" if path else f"there is no key {unknown[0]!r}"
            return f"{full}: {where}{close_to(unknown[0], known)} (every key: config/README.md)"
    if error.validator == "type":
        expected = error.validator_value if isinstance(error.validator_value, list) else [error.validator_value]
        kind = next((name for name, types in PYTHON_TYPES.items() if isinstance(instance, types)), "a value")
        wanted = " or ".join(TYPE_WORDS.get(name, name) for name in expected if name != "null" or len(expected) == 1)
        return f"{key}: {shown(instance)} is {kind}, not {wanted}: {how_to_write(path or [key], instance, expected)}"
    if error.validator == "enum" and isinstance(instance, str):
        choices = [str(choice) for choice in error.validator_value]
        return f"{key}: {instance!r} is not one of {', '.join(map(repr, choices))}{close_to(instance, choices)}"
    return f"{key}: {error.message}"


#: Python's types of a parsed config value, by the schema's words for them (bool before int: a bool is an int).
PYTHON_TYPES = {"true or false": bool, "a whole number": int, "a number": float, "text": str, "a list": list,
                "a mapping": dict, "null": type(None)}


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
