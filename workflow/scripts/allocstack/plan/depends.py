"""What each edge of a ``depends_on`` waits for: the ONE reading of its two forms, for every reader.

``depends_on`` is a list of names (each edge waits for the dependency's gate: its readiness, an init job's
exit 0) or Compose's mapping ``{NAME: CONDITION}``: ``service_started`` waits only until NAME's program has
started (its endpoint file in the run's scratch exists), ``service_healthy`` for its gate, as the list form,
and ``service_completed_successfully`` for an init job's exit 0 (its record). Iterating either form gives the
names; the edges' conditions are asked here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

STARTED = "service_started"
HEALTHY = "service_healthy"
COMPLETED = "service_completed_successfully"
#: Compose's conditions, as config ``services.<name>.depends_on`` takes them.
CONDITIONS = (STARTED, HEALTHY, COMPLETED)


def conditions(depends_on: Sequence[str] | Mapping[str, str] | None, init_jobs: Sequence[str] = ()) -> dict[str, str]:
    """Each dependency's condition: the mapping form as written; the list form's edges each wait for the gate
    (``service_healthy``, an init job's ``service_completed_successfully``)."""
    if isinstance(depends_on, Mapping):
        return dict(depends_on)
    return {name: COMPLETED if name in init_jobs else HEALTHY for name in depends_on or ()}


def gate_waits(depends_on: Sequence[str] | Mapping[str, str] | None) -> list[str]:
    """The dependencies whose gate (readiness, an init job's record) the dependent waits for: every one but those
    it waits for with ``service_started``."""
    return [name for name, condition in conditions(depends_on).items() if condition != STARTED]


def start_waits(depends_on: Sequence[str] | Mapping[str, str] | None) -> list[str]:
    """The dependencies the dependent waits for only until they have started (``service_started``)."""
    return [name for name, condition in conditions(depends_on).items() if condition == STARTED]


def refusal(key: str, depends_on: Any, init_jobs: Sequence[str]) -> str | None:
    """Why ``key`` (``services.<name>.depends_on``) is refused, or None: ``service_completed_successfully`` is for
    an init job alone, and an init job is waited for only to complete (it has no gate, and its start says nothing)."""
    for name, condition in conditions(depends_on, init_jobs).items():
        if condition == COMPLETED and name not in init_jobs:
            return (f"{key}.{name} is {COMPLETED}, but {name} is not an init job: list it in init_jobs (it then runs "
                    f"once, before what depends on it), or wait for it with {STARTED} or {HEALTHY}")
        if condition != COMPLETED and name in init_jobs:
            return (f"{key}.{name} is {condition}, but {name} is an init job: what depends on it waits for its exit 0; "
                    f"write {COMPLETED} (or list it in the list form)")
    return None
