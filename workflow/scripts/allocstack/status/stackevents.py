"""What happened to the stack's programs while it runs: restarts, exposed sockets, failed gates.

Each component appends its events to its own log (``events/<component>.jsonl`` in the run's
scratch; with more than one node, the same name in the run's state directory). The coordinator
reads those logs as they grow (:class:`EventTail`, a few bytes per look: only what was appended
since) and puts the notable ones in its ``/status`` document, which the status command and the
live page show: a service that was restarted by its policy is seen while the run goes on, not only
in the end-of-run summary.
"""

from __future__ import annotations

import json
import os
from collections import deque
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from ..launch.exposure import EVENT as EXPOSED
from ..launch.exposure import warning_line

#: Events worth a line while the run goes on (the others are the timeline's).
NOTABLE = ("service-restart", "worker-restart", EXPOSED, "gate-failed")
#: Notable events kept for /status (the newest).
KEPT = 20


def describe(event: Mapping[str, Any]) -> str | None:
    """One line for a notable event (pure), None for any other."""
    kind = event.get("event")
    if kind in ("service-restart", "worker-restart"):
        program = f"service {event.get('service')}" if kind == "service-restart" else f"worker {event.get('worker')}"
        how = event.get("how") or f"exited {event.get('exitCode')}"
        return f"{program} restarted by its restart policy (attempt {event.get('attempt')}): it {how}"
    if kind == EXPOSED:
        try:
            return warning_line(event)
        except KeyError:
            return None
    if kind == "gate-failed":
        return f"gate failed: {event.get('reason', '?')}"
    return None


def notable(events: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """``{"t", "event", "line"}`` for each notable event, in the order given (pure)."""
    found = []
    for event in events:
        line = describe(event)
        if line is not None:
            found.append({"t": event.get("t"), "event": event.get("event"), "line": line})
    return found


class EventTail:
    """The notable events of the logs in ``directories`` (``*.jsonl``), read as they grow.

    A log is read from where the last look stopped, up to its last complete line (a line being
    written is read at the next look); a log that shrank (a new attempt) is read from its start.
    """

    def __init__(self, directories: Iterable[Path], kept: int = KEPT) -> None:
        self.directories = [Path(directory) for directory in directories]
        self.offsets: dict[Path, int] = {}
        self.kept: deque[dict[str, Any]] = deque(maxlen=kept)

    def poll(self) -> list[dict[str, Any]]:
        """Read what was appended since the last look; the newest notable events, oldest first."""
        new: list[dict[str, Any]] = []
        for log in self.logs():
            new.extend(self.read_new(log))
        self.kept.extend(notable(sorted(new, key=lambda event: event.get("t") or 0)))
        return list(self.kept)

    def logs(self) -> list[Path]:
        found = []
        for directory in self.directories:
            try:
                found.extend(sorted(directory.glob("*.jsonl")))
            except OSError:
                continue
        return found

    def read_new(self, log: Path) -> list[dict[str, Any]]:
        offset = self.offsets.get(log, 0)
        try:
            if os.stat(log).st_size < offset:
                offset = 0
            with open(log, "rb") as stream:
                stream.seek(offset)
                data = stream.read()
        except OSError:
            return []
        complete = data.rfind(b"\n") + 1
        self.offsets[log] = offset + complete
        events = []
        for line in data[:complete].splitlines():
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if isinstance(event, dict):
                events.append(event)
        return events
