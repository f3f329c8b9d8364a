"""Every bound the plan derives from the config: gates, service starts, stopping.

A service starts once its dependencies' gates passed; its own gate then has its
``readiness.timeout`` (else the stack's) from its start. Workers wait for every gate.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from . import depends

#: Seconds a service may take to publish its endpoint once its dependencies are ready
#: (srun + Apptainer + the supervisor's start).
SERVICE_START_SECONDS = 30
#: Seconds added to the slowest gate for a worker's wait on every gate.
GATES_MARGIN = 30
#: Seconds collection waits for your services' end records beyond the longest stop_grace_period.
STOP_MARGIN = 15


#: Seconds an init job (config init_jobs) may run when its readiness.timeout is not set: its end is its gate.
INIT_SECONDS = 3600


def gate_timeout(config: Mapping[str, Any], name: str) -> float:
    """Seconds from service ``name``'s start to ready: its own readiness.timeout, else the stack's (an init job: else
    :data:`INIT_SECONDS`, for its end is its readiness)."""
    own = config["services"][name]["readiness"]["timeout"]
    return own or (INIT_SECONDS if name in config["init_jobs"] else config["readiness"]["timeout"])


def gate_interval(config: Mapping[str, Any], name: str) -> float:
    """Seconds between probes of service ``name``: its own readiness.interval, else the stack's."""
    return config["services"][name]["readiness"]["interval"] or config["readiness"]["interval"]


def start_bound(config: Mapping[str, Any], name: str) -> float:
    """Seconds until ``name`` has published its endpoint at the latest: its dependencies' gates (or, for those it
    waits for with ``service_started``, their starts), then its start."""
    dependencies = config["services"][name]["depends_on"]
    gated = depends.gate_waits(dependencies)
    return SERVICE_START_SECONDS + max(
        (start_bound(config, d) + (gate_timeout(config, d) if d in gated else 0) for d in dependencies), default=0)


def gates_timeout(config: Mapping[str, Any]) -> float:
    """Bound on a worker's wait for every gate: the slowest gate, plus a margin."""
    bounds = [start_bound(config, name) + gate_timeout(config, name) for name in config["services"]]
    if config["tasks"]:
        bounds.append(config["readiness"]["timeout"])
    return max(bounds, default=0) + GATES_MARGIN


def stop_timeout(config: Mapping[str, Any]) -> float:
    """Bound on collection's wait for your services' end records: the longest stop_grace_period, plus a margin."""
    grace = max((spec["stop_grace_period"] for spec in config["services"].values()), default=0)
    return grace + STOP_MARGIN
