"""Unit tests: in-process, no Snakemake, no processes (a test that starts one fails), the whole directory in seconds.

The plans are made as the adapter makes them (``plans.py``).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
from typing import Any

import pytest


class ProcessStarted(BaseException):
    """A unit test started a process (BaseException: no ``except OSError`` on the way swallows it)."""


@pytest.fixture(autouse=True)
def no_processes(monkeypatch):
    """Fail any test that starts a process: subprocess, os.system/spawn/exec/fork, asyncio subprocesses."""
    started: list[str] = []

    def refuse(what: str, method: bool = False):
        def starting(*args: Any, **kwargs: Any):
            started.append(f"{what}{args[method:method + 2]!r}")
            raise ProcessStarted(f"a unit test started a process: {started[-1]} (tests/unit runs in-process)")
        return starting

    monkeypatch.setattr(subprocess.Popen, "__init__", refuse("subprocess.Popen", method=True))
    for name in ("system", "fork", "forkpty", "posix_spawn", "posix_spawnp", "execv", "execve", "execvp", "execvpe",
                 "spawnv", "spawnve", "spawnvp", "spawnvpe", "popen"):
        if hasattr(os, name):
            monkeypatch.setattr(os, name, refuse(f"os.{name}"))
    monkeypatch.setattr(asyncio, "create_subprocess_exec", refuse("asyncio.create_subprocess_exec"))
    monkeypatch.setattr(asyncio, "create_subprocess_shell", refuse("asyncio.create_subprocess_shell"))
    yield started
    assert not started, f"processes started: {started}"
