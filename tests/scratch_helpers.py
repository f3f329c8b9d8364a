"""Scratch roots as centers give them, for the tests: read-only or full filesystems, real mounts (root only)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest


def require_root(what: str) -> None:
    if os.geteuid() != 0:
        pytest.skip(f"{what} needs root (CI runs the suite as root)")


def mount_tmpfs(path: Path, *options: str, size: str = "4m") -> Path:
    """A tmpfs of ``size`` at ``path`` (made), with ``options`` (``ro``): a filesystem of its own."""
    require_root("mounting a filesystem")
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", ",".join([f"size={size}", "mode=1777", *options]), "tmpfs", str(path)],
                   check=True, timeout=30)
    return path


def fill(path: Path) -> None:
    """Fill the filesystem of ``path`` to its last byte (a file that takes what is left)."""
    with open(path / "filler", "wb") as handle:
        try:
            while True:
                handle.write(b"\0" * (64 << 10))
                handle.flush()
        except OSError:
            pass
    assert os.statvfs(path).f_bavail == 0


def unmount(path: Path) -> None:
    subprocess.run(["umount", "-l", str(path)], check=False, timeout=30)


def read_only_root(path: Path) -> Path:
    """A read-only filesystem at ``path``: as a read-only node-local disk, or a prolog's directory mounted so."""
    return mount_tmpfs(path, "ro")


def full_root(path: Path) -> Path:
    """A filesystem at ``path`` with no byte left (a full node-local disk)."""
    mount_tmpfs(path, size="1m")
    fill(path)
    return path


ROOTS: dict[str, Callable[[Path], Path]] = {"read-only": read_only_root, "full": full_root}
