"""Checks that every container runtime must pass the same way (Apptainer and Charliecloud tests share them)."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

from conftest import pids_mentioning


def drain_probe(marker: Path) -> str:
    """A component that prints 'ready', and on SIGTERM reads the image (a module not loaded before) while it
    drains, writes ``marker`` and exits 0: the image must still be there after the signal.

    It waits in short sleeps, as allocstack's components do: Python runs a signal's handler between two
    bytecodes, so a signal that lands after the interpreter's last look and before a blocking call starts
    waits for that call to end. A single ``time.sleep(60)`` missed the SIGTERM that way 11 times in 30 with a
    SquashFS image (each page fault on the image is a FUSE request to ch-run, which widens that window to
    milliseconds) and then drained 60 s later.
    """
    return (
        "import signal, sys, time, pathlib\n"
        "def stop(*_):\n    time.sleep(0.3)\n    import xml.dom.minidom\n"
        f"    pathlib.Path({str(marker)!r}).write_text('drained')\n    sys.exit(0)\n"
        "signal.signal(signal.SIGTERM, stop)\nprint('ready', flush=True)\n"
        "for _ in range(600):\n    time.sleep(0.1)\n"
    )


def assert_sigterm_drains(proc: subprocess.Popen, marker: Path, needle: str) -> None:
    """SIGTERM to the launcher reaches the component inside the image, which drains; nothing is left."""
    assert proc.stdout.readline().strip() == "ready"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=20) == 0
    assert marker.read_text() == "drained"
    time.sleep(0.2)
    assert not pids_mentioning(needle)


def assert_killed_launcher_leaves_nothing(proc: subprocess.Popen, needle: str) -> None:
    """SIGKILL of the launcher (as Snakemake ends a failed group's jobs): the component must not outlive it.
    ``needle``: text in the component's command line that no other test's process has (a path of its tmp_path:
    the tests run side by side, and one machine-wide search once found another test's component)."""
    deadline = time.monotonic() + 30
    while not [p for p in pids_mentioning(needle) if p != proc.pid] and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(0.5)
    proc.kill()
    proc.wait(timeout=10)
    # A bound, not a speed: the component looks for its launcher twice a second once its Python runs, which in the
    # first seconds of a loaded suite (CPUs 94 % busy, ci-72) took over 10 s inside the image.
    deadline = time.monotonic() + 60
    while pids_mentioning(needle) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not pids_mentioning(needle)
