"""Ending with the launcher: no component outlives the job that started it.

``launch.py`` exports its PID as ``ALLOCSTACK_LAUNCHER_PID``. If launch.py is
SIGKILLed (Snakemake kills a failed group's jobs that way), its signal forwarding
dies with it, and a process inside Apptainer is not reached by the kernel's
parent-death signal either (Apptainer's runtime parent survives). So each
long-running component checks twice a second that the launcher still exists and
stops when it does not.

The other half: a supervisor (launch.py, app_service.py) passes the signals that
end a job on to its child, so the child can drain (:func:`forward_signals`).
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable

ENV = "ALLOCSTACK_LAUNCHER_PID"
#: What Slurm, Snakemake or a user sends to end a job: passed on to the supervised child.
FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def launcher_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def launcher_pid() -> int | None:
    value = os.environ.get(ENV, "")
    return int(value) if value.isdigit() else None


def watch_launcher(on_lost: Callable[[], None], period: float = 0.5) -> threading.Thread | None:
    """Call ``on_lost`` (once, from a daemon thread) when the launcher is gone. None without a launcher."""
    pid = launcher_pid()
    if pid is None:
        return None

    def watch() -> None:
        while launcher_alive(pid):
            time.sleep(period)
        on_lost()

    thread = threading.Thread(target=watch, name="lifeline", daemon=True)
    thread.start()
    return thread


def forward_signals(handler: Callable[[int, object], None]) -> None:
    """Install ``handler`` for every signal in :data:`FORWARDED_SIGNALS`."""
    for signum in FORWARDED_SIGNALS:
        signal.signal(signum, handler)
