"""What Linux's ``/proc`` says about a process: its children, its start time. Standard library only, and light:
the watchdog (allocstack/launch/watchdog.py) runs beside every supervised program with little more than this.
"""

from __future__ import annotations

import os


def child_pids(pid: int) -> list[int]:
    """The children of process ``pid`` (Linux ``/proc/PID/task/*/children``); [] when it is gone."""
    found: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/children", encoding="ascii") as handle:
                found += [int(child) for child in handle.read().split()]
        except OSError:
            continue
    return found


def running_start(pid: int) -> int | None:
    """When process ``pid`` started (``/proc/PID/stat`` field 22, clock ticks since boot: with the pid it tells a
    process from a later one that got the same pid); None when it is gone or a zombie (dead: only its parent's
    wait is missing)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
        return None if fields[0] in ("Z", "X") else int(fields[19])
    except (OSError, IndexError, ValueError):
        return None
