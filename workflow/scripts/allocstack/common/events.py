"""The run's event log: one JSON object per line, appended by every component.

Each line is written with a single ``write`` on a file opened with ``O_APPEND``,
so lines from concurrent processes on one node never interleave. ``t`` is the
wall-clock time (seconds since the epoch): comparable across the processes of
one node; events of different nodes are only compared through causality (see
:func:`gate_precedes_workers`). With more than one node, components off the first
node append to their own file in the run's shared state directory, merged at
collection. Tokens never go here.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from .errors import AllocstackError


def append_event(path: str | os.PathLike | None, event: str, **fields: Any) -> dict[str, Any]:
    """Append ``{"t", "event", "pid", **fields}`` to ``path`` (no-op when ``path`` is None)."""
    record = {"t": round(time.time(), 6), "event": event, "pid": os.getpid(), **fields}
    if path is None:
        return record
    line = (json.dumps(record, sort_keys=True, separators=(",", ":")) + "\n").encode("utf-8")
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)
    return record


def ensure_log_dir(path: str | os.PathLike | None) -> None:
    """Create the directory of an event log given explicitly (0700), e.g. the shared one of a multi-node run.

    :raises AllocstackError: ``io`` when it cannot be made.
    """
    if path is not None:
        try:
            Path(path).parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError as exc:
            raise AllocstackError("io", f"cannot make the directory of event log {path}: {exc.strerror}") from exc


def read_events(path: str | os.PathLike) -> list[dict[str, Any]]:
    """Read an event log; a torn last line (a crash mid-write) is skipped."""
    events: list[dict[str, Any]] = []
    text = Path(path).read_text(encoding="utf-8") if Path(path).exists() else ""
    for line in text.splitlines():
        try:
            events.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return events


def gate_precedes_workers(events: list[dict[str, Any]]) -> tuple[bool, str]:
    """True when, on every node, a gate passed there before each worker started there.

    The coordinator's gate (and your own service's) run on the coordinator's node; with more
    than one node, every other node has its own gate (the coordinator reached from there, see
    ``readiness.py --off-node``). Times are compared only between events of the same host, so
    the proof does not depend on the nodes' clocks agreeing.

    :returns: (ok, reason) where reason explains a violation, or names the workers per node.
    """
    gates: dict[Any, float] = {}
    for event in events:
        if event.get("event") == "gate-passed":
            host = event.get("host")
            gates[host] = max(event["t"], gates.get(host, event["t"]))
    starts = [e for e in events if e.get("event") == "worker-start"]
    if not gates:
        return False, "no gate-passed event"
    if not starts:
        return False, "no worker-start event"
    per_node: dict[Any, int] = {}
    for start in sorted(starts, key=lambda e: e["t"]):
        host, worker = start.get("host"), start.get("worker", "?")
        gate = gates.get(host)
        if gate is None:
            return False, f"{worker} started on {host}, where no gate passed"
        if start["t"] < gate:
            return False, f"{worker} started {gate - start['t']:.3f} s before the gate passed on {host}"
        per_node[host] = per_node.get(host, 0) + 1
    nodes = ", ".join(f"{host or 'this node'}: {count}" for host, count in sorted(per_node.items(), key=str))
    return True, f"gate passed before every worker start, on every node ({nodes})"
