"""The run's event log: one JSON object per line, appended by every component.

Each line is written with a single ``write`` on a file opened with ``O_APPEND``,
so lines from concurrent processes on one node never interleave. ``t`` is the
wall-clock time (seconds since the epoch): comparable across the processes of
one node, which is all the single-node pattern needs. Tokens never go here.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any


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
    """True when every ``gate-passed`` event (the coordinator's, and your own service's) precedes every ``worker-start``.

    :returns: (ok, reason) where reason explains a violation.
    """
    gate_times = [e["t"] for e in events if e.get("event") == "gate-passed"]
    starts = [e for e in events if e.get("event") == "worker-start"]
    if not gate_times:
        return False, "no gate-passed event"
    if not starts:
        return False, "no worker-start event"
    gate = max(gate_times)
    early = [e for e in starts if e["t"] < gate]
    if early:
        return False, f"{early[0].get('worker', '?')} started {gate - early[0]['t']:.3f} s before the gate passed"
    return True, "gate passed before every worker start"
