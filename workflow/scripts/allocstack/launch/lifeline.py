"""Ending with the launcher: no component outlives the job that started it.

``launch.py`` exports its PID as ``ALLOCSTACK_LAUNCHER_PID``. If launch.py is
SIGKILLed (Snakemake kills a failed group's jobs that way), its signal forwarding
dies with it, and a process inside Apptainer is not reached by the kernel's
parent-death signal either (Apptainer's runtime parent survives). So each
long-running component checks twice a second that the launcher still exists and
stops when it does not.

The other half: a supervisor (launch.py, app_service.py) passes the signals that
end a job on to its child, so the child can drain (:func:`forward_signals`).

A stop request (:func:`watch_stop_request`): a service's supervisor in a job step is asked to stop through a file
launch.py creates, not through a signal to its step. Slurm delivers a step's signal to every process of the step
(its process group; with proctrack/cgroup, its cgroup), so a program in an image would get it twice, straight and
through Apptainer's runtime, where Compose sends SIGTERM once, to the container's main process. Some programs do
not survive the second one: uvicorn 0.21's ``--reload`` supervisor hangs in 3 of 15 such stops, measured (its
signal handler waits for a lock the interrupted thread holds), and is then killed after its stop_grace_period.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable

from ..common.cli import ENDING_SIGNALS

ENV = "ALLOCSTACK_LAUNCHER_PID"
#: The file whose creation asks the supervisor to stop its program (set by launch.py for a service in a job step).
STOP_ENV = "ALLOCSTACK_STOP_REQUEST"
#: Seconds between two looks for that file: a stat of a node-local path.
STOP_REQUEST_CHECK = 0.1
#: Passed on to the supervised child.
FORWARDED_SIGNALS = ENDING_SIGNALS


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


def watch_stop_request(on_request: Callable[[], None], period: float = STOP_REQUEST_CHECK) -> threading.Thread | None:
    """Call ``on_request`` (once, from a daemon thread) when the file ``$ALLOCSTACK_STOP_REQUEST`` names exists.
    None when no file is named."""
    path = os.environ.get(STOP_ENV, "")
    if not path:
        return None

    def watch() -> None:
        while not os.path.exists(path):
            time.sleep(period)
        on_request()

    thread = threading.Thread(target=watch, name="stop-request", daemon=True)
    thread.start()
    return thread


def forward_signals(handler: Callable[[int, object], None]) -> None:
    """Install ``handler`` for every signal in :data:`FORWARDED_SIGNALS`."""
    for signum in FORWARDED_SIGNALS:
        signal.signal(signum, handler)
