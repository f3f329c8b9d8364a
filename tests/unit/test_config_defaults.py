"""A default is written once, in the schema: config/config.yaml and config/README.md say the same."""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from typing import Any

import yaml

from allocstack.plan.config import defaults, schema, service_defaults

from .plans import ROOT


def leaves(spec: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    """(dotted key, default) of every documented key: objects of plain settings are walked into,
    ``services`` as ``services.<name>.*``."""
    for name, sub in spec["properties"].items():
        key = f"{prefix}{name}"
        if sub.get("type") == "object" and "properties" in sub and "required" not in sub:
            yield from leaves(sub, f"{key}.")
            continue
        yield key, sub["default"]
        if isinstance(sub.get("additionalProperties"), dict) and "properties" in sub["additionalProperties"]:
            yield from leaves(sub["additionalProperties"], f"{key}.<name>.")


def readme_defaults() -> dict[str, str]:
    table = (ROOT / "config" / "README.md").read_text(encoding="utf-8")
    return dict(re.findall(r"^\| `([A-Za-z_.<>]+)` \| (.*?) \| ", table, flags=re.MULTILINE))


def test_every_key_of_the_schema_has_a_default_and_a_description():
    """(An object with required keys, a decision, has its default as a whole.)"""

    def walk(spec: Mapping[str, Any], where: str) -> None:
        for name, sub in spec.get("properties", {}).items():
            assert "default" in sub and "description" in sub, f"{where}{name}"
            if "required" not in sub:
                walk(sub, f"{where}{name}.")
            if isinstance(sub.get("additionalProperties"), dict):
                walk(sub["additionalProperties"], f"{where}{name}.<name>.")

    walk(schema(), "")


def test_config_readme_gives_the_schemas_defaults():
    documented = readme_defaults()
    keys = dict(leaves(schema()))
    assert set(documented) == set(keys), set(documented) ^ set(keys)
    for key, default in keys.items():
        cell = documented[key]
        if cell.startswith("``"):  # a long text, shortened: ``start ...``
            assert default.startswith(cell.strip("`").removesuffix(" ...")), (key, cell)
        elif cell.startswith("`"):
            assert yaml.safe_load(cell.strip("`")) == default, (key, cell, default)
        else:  # a decision: its owner
            assert cell == default["owner"], (key, cell)


def test_config_yaml_gives_the_schemas_defaults():
    """Every key config/config.yaml sets is set to its default (it documents them; a change goes in a file of yours)."""
    written = yaml.safe_load((ROOT / "config" / "config.yaml").read_text(encoding="utf-8"))
    complete = defaults()

    def compare(values: Mapping[str, Any], expected: Mapping[str, Any], where: str) -> None:
        for key, value in values.items():
            if isinstance(value, dict) and value:
                compare(value, expected[key], f"{where}{key}.")
            else:
                assert value == expected[key], f"config/config.yaml {where}{key}: {value!r}, the schema says {expected[key]!r}"

    compare(written, complete, "")


def test_a_service_of_yours_gets_the_schemas_defaults():
    expected: dict[str, Any] = {}
    for key, default in leaves(schema()):
        if key.startswith("services.<name>."):
            *block, leaf = key.split(".", 2)[2].split(".")  # readiness.mode -> {"readiness": {"mode": ...}}
            (expected.setdefault(block[0], {}) if block else expected)[leaf] = default
    assert service_defaults() == expected
