"""Naming a program of yours that listens beyond loopback: reachable by the node's other users and other nodes.

With config ``network.isolation: none`` (the default) the stack runs on the node's own network:
a service that binds ``0.0.0.0``, ``::`` or the node's address, as most images' servers
do, can be reached by anyone on the node and on the cluster's network. Each such socket
(:mod:`allocstack.common.listening`) is named once per program:

* a line in the log of what saw it (:func:`warning_line`, one line, with what to do);
* an event ``listening-exposed`` in the run's event log (``events.jsonl``);
* the end-of-run summary repeats the line (:func:`summary_lines`).

A service's readiness gate looks when it passes (readiness.py: the service is up, and
nothing stops it before its gate's record is written); the supervisor of a program
(app_service.py, replica.py, main.py) keeps looking while it runs (:func:`watch`), with
longer pauses as it runs on.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from ..common import names
from ..common.events import append_event, read_events
from ..common.listening import Found, Scan, listening, process_start

EVENT = "listening-exposed"
#: Seconds before the first look of :func:`watch`, and the longest pause between two.
FIRST_LOOK = 0.25
LONGEST_PAUSE = 30.0


def fix(kind: str, name: str) -> str:
    """What to do, in the words of the program's config."""
    where = f"${names.variable_prefix(name)}HOST, " if kind == "service" else ""
    return f"bind 127.0.0.1 ({where}the loopback address) in its command or config"


def warning_line(event: Mapping[str, Any]) -> str:
    """The one line naming an exposed socket, from its event's fields (``kind``, ``name``, ``proto``, ``shown``)."""
    return (f"warning: {event['kind']} {event['name']} listens on {event['shown']} ({event['proto']}): reachable by "
            f"other users and nodes (the stack runs on the node's own network); {fix(event['kind'], event['name'])}")


def event_fields(kind: str, name: str, found: Found) -> dict[str, Any]:
    listener = found.listener
    return {"kind": kind, "name": name, "proto": listener.proto, "address": listener.address, "port": listener.port,
            "shown": listener.shown, "listenerPid": found.pid}


def key(event: Mapping[str, Any]) -> tuple[Any, ...]:
    """What makes two reports of a socket the same."""
    return event.get("kind"), event.get("name"), event.get("proto"), event.get("address"), event.get("port")


def private_line(kind: str, name: str, found: Found) -> str:
    """The line for a socket that is not exposed: on loopback, or in a network namespace of its own."""
    where = (("in the stack's private network" if names.in_private_network(os.environ) else
              "in a network namespace of its own") if found.own_namespace else "loopback only")
    return f"{kind} {name} listens on {found.listener.shown} ({found.listener.proto}): {where}"


def report(scan: Scan, kind: str, name: str, events: Path | None, log: Callable[[str], None],
           said: set[tuple[Any, ...]]) -> list[dict[str, Any]]:
    """Say each socket of ``scan`` not yet in ``said`` (updated) through ``log``: a warning for each exposed one,
    with an event in ``events`` unless one is there already (a service's gate and its supervisor both look)."""
    new = []
    for found in scan.found:
        fields = event_fields(kind, name, found)
        if key(fields) in said:
            continue
        said.add(key(fields))
        if found.exposed:
            new.append(fields)
        else:
            log(private_line(kind, name, found))
    recorded = {key(event) for event in read_events(events) if event.get("event") == EVENT} if new and events else set()
    for fields in new:
        log(warning_line(fields))
        if key(fields) not in recorded:
            append_event(events, EVENT, **fields)
    return new


def look(root: int, kind: str, name: str, events: Path | None, log: Callable[[str], None],
         said: set[tuple[Any, ...]] | None = None) -> list[dict[str, Any]]:
    """Look once at what ``root``'s process tree listens on and name what is exposed; a process whose sockets
    cannot be read is said once through ``log`` too."""
    scan = listening(root)
    said = set() if said is None else said
    for pid, why in scan.unreadable.items():
        if ("unreadable", pid) not in said:
            said.add(("unreadable", pid))
            log(f"{kind} {name}: cannot see what process {pid} listens on ({why})")
    return report(scan, kind, name, events, log, said)


def look_at(process: tuple[int, int | None], kind: str, name: str, events: Path | None,
            log: Callable[[str], None]) -> list[dict[str, Any]]:
    """:func:`look` at a process another one started, named by its pid and start (as it published them): where
    that pid is another process (this one runs in a PID namespace of its own: Apptainer's ``--pid``,
    ``--containall``), say so rather than name another's sockets."""
    pid, started = process
    if started is None or process_start(pid) != started:
        log(f"{kind} {name}: its process {pid} is not visible from here (a PID namespace of its own?): "
            "what it listens on is not looked at")
        return []
    return look(pid, kind, name, events, log)


def pauses(first: float = FIRST_LOOK, longest: float = LONGEST_PAUSE) -> Iterable[float]:
    """``first``, then twice the pause before, up to ``longest``: a program's ports are mostly opened at its start."""
    pause = first
    while True:
        yield pause
        pause = min(pause * 2, longest)


def watch(root: int, kind: str, name: str, events: Path | None,
          log: Callable[[str], None] | None = None) -> threading.Event:
    """Look at what ``root`` listens on while it runs (a daemon thread, :func:`pauses` apart); set the event
    returned to stop."""
    stop, said = threading.Event(), set()
    say = log or (lambda line: print(line, file=sys.stderr, flush=True))

    def run() -> None:
        for pause in pauses():
            if stop.wait(pause):
                return
            look(root, kind, name, events, say, said)

    threading.Thread(target=run, name="exposure", daemon=True).start()
    return stop


def summary_lines(events: Iterable[Mapping[str, Any]]) -> list[str]:
    """The end-of-run summary's warnings: each exposed socket of the run once."""
    lines: dict[tuple[Any, ...], str] = {}
    for event in events:
        if event.get("event") == EVENT:
            lines.setdefault(key(event), warning_line(event))
    return list(lines.values())
