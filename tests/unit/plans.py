"""Plans made as the adapter makes them (``workflow/rules/common.smk``): the project's
``config/config.yaml`` with a test's YAML merged over it (as ``--configfile`` merges), in a
world the test describes (:class:`allocstack.plan.Facts`)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "workflow" / "scripts"
if str(SCRIPTS) not in sys.path:
    sys.path.insert(0, str(SCRIPTS))

from allocstack import plan  # noqa: E402


def merged(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """``override`` over ``base``, mappings key by key (as Snakemake merges a --configfile over config.yaml)."""
    result = dict(base)
    for key, value in override.items():
        result[key] = merged(result[key], value) if isinstance(value, dict) and isinstance(result.get(key), dict) \
            else value
    return result


def configured(text: str = "") -> dict[str, Any]:
    """config/config.yaml with the YAML ``text`` merged over it."""
    base = yaml.safe_load((ROOT / "config" / "config.yaml").read_text(encoding="utf-8"))
    return merged(base, yaml.safe_load(text) or {})


#: What a node that can give the stack its own network (the default, config network.isolation: private) has:
#: unprivileged user namespaces and pasta on PATH.
NAMESPACES = {"user.max_user_namespaces": "96553"}.get
PASTA = {"pasta": "/usr/bin/pasta"}


def world(**facts: Any) -> plan.Facts:
    """The empty world (no Slurm, nothing on PATH but pasta, user namespaces allowed) in the project's directory,
    with ``facts`` changed."""
    facts.setdefault("cwd", str(ROOT))
    facts.setdefault("is_file", lambda path: (ROOT / path).is_file())
    facts.setdefault("sysctl", NAMESPACES)
    facts.setdefault("which", PASTA.get)
    return plan.Facts(**facts)


def plan_of(text: str = "", **facts: Any) -> plan.Plan:
    """The plan of config/config.yaml with ``text`` merged over it, in :func:`world` (``facts``)."""
    return plan.load(configured(text), world(**facts))


def refusal(text: str = "", **facts: Any) -> plan.PlanError:
    """The refusal of that plan (the test fails if there is none)."""
    with pytest.raises(plan.PlanError) as raised:
        plan_of(text, **facts)
    return raised.value

