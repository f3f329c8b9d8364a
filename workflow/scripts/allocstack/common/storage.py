"""Disk space: what a full disk or an exhausted quota looks like, and checking for room up front.

A write that fails for lack of space (``ENOSPC``) or quota (``EDQUOT``), the most
common storage fault at centers, becomes ONE ``storage`` diagnostic naming the
path and the space left there; any other write error stays ``io``. Nothing is
retried here: the caller decides (the coordinator stops granting claims).
"""

from __future__ import annotations

import errno
import os
import shutil
from collections.abc import Iterable
from pathlib import Path

from .errors import AllocstackError

#: The errors that mean "no room": the disk is full, or the user's quota is.
NO_ROOM = (errno.ENOSPC, errno.EDQUOT)
#: Bytes of a journal line and of a results.json entry besides the task id and the output.
JOURNAL_LINE_BYTES = 160
RESULTS_ENTRY_BYTES = 200


def human(size: int) -> str:
    """``1536`` -> ``"1.5 KiB"``."""
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def _existing(path: Path) -> Path:
    """``path`` or its nearest existing ancestor (what statvfs can ask about)."""
    path = path.absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def free_bytes(path: str | os.PathLike) -> int | None:
    """Bytes an unprivileged writer may still use on the filesystem of ``path`` (None if unknown)."""
    try:
        return shutil.disk_usage(_existing(Path(path))).free
    except OSError:
        return None


def write_error(what: str, path: str | os.PathLike, exc: OSError) -> AllocstackError:
    """The diagnostic for a failed write of ``what`` at ``path``: ``storage`` when out of room, else ``io``."""
    if exc.errno in NO_ROOM:
        free = free_bytes(Path(path).parent)
        room = f"{human(free)} free there" if free is not None else "free space unknown"
        return AllocstackError("storage", f"cannot write {what} {path}: {exc.strerror} ({room})")
    return AllocstackError("io", f"cannot write {what} {path}: {exc.strerror or exc}")


def id_totals(task_ids: Iterable[str]) -> tuple[int, int]:
    """How many ``task_ids`` there are, and their characters together (:func:`estimate`'s measures of them)."""
    count = total = 0
    for task_id in task_ids:
        count += 1
        total += len(task_id)
    return count, total


def estimate(tasks: tuple[int, int], output_bytes: int, pending: tuple[int, int]) -> tuple[int, int]:
    """Bytes the journal still needs (for the ``pending`` tasks), and the results directory needs.

    The results directory holds every result twice: in results.json and in the success
    marker. ``output_bytes`` is the size of all outputs when known (the baseline handler),
    else 0: the estimate is then a floor, the records without their outputs.

    :param tasks: every task's count and their ids' characters together (:func:`id_totals`).
    :param pending: the same of the tasks that have no result yet.
    """
    (count, id_chars), (pending_count, pending_chars) = tasks, pending
    share = output_bytes * pending_count // max(1, count)
    journal = JOURNAL_LINE_BYTES * pending_count + pending_chars + share
    results = 2 * (RESULTS_ENTRY_BYTES * count + id_chars + output_bytes)
    return journal, results


def check_room(needs: Iterable[tuple[str, Path, int]]) -> None:
    """Refuse early when a filesystem has less room than the run needs there.

    :param needs: ``(what, path, bytes)``; needs on the same filesystem add up.
    :raises AllocstackError: ``storage`` naming the place, the need and the free space.
    """
    by_device: dict[int, list[tuple[str, Path, int]]] = {}
    for what, path, size in needs:
        try:
            device = os.stat(_existing(path)).st_dev
        except OSError:
            continue
        by_device.setdefault(device, []).append((what, path, size))
    for entries in by_device.values():
        total = sum(size for _, _, size in entries)
        free = free_bytes(entries[0][1])
        if free is not None and free < total:
            parts = " and ".join(f"{what} {path} ~{human(size)}" for what, path, size in entries)
            raise AllocstackError("storage", f"not enough room: {parts} need {human(total)}, "
                                             f"{human(free)} free there; free space, then run again")
