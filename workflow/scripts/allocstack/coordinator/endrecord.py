"""The coordinator's end record (``results/<run>/coordinator.json``): how it ended, and why.

One module for its writer (the coordinator) and its readers (the readiness gate,
which fails at once when the coordinator, or a service of yours, ended before it
was ready, and
verification, which accepts a run only when the coordinator completed on this
input with exactly this results file).

``status`` is ``completed`` (every task has a durable result), ``failed`` (a
task failed ``max_attempts`` times, or the coordinator could not start) or
``incomplete`` (stopped first: a signal, a time limit, a storage fault).
"""

from __future__ import annotations

import os
from typing import Any

from .. import SCHEMA_VERSION
from ..common.errors import AllocstackError
from ..common.jsonio import atomic_write_json, read_json

COMPLETED, FAILED, INCOMPLETE = "completed", "failed", "incomplete"
WHAT = "coordinator end record"


def write(path: str | os.PathLike, status: str, reason: str, **facts: Any) -> dict[str, Any]:
    """Atomically write the end record ``{"schemaVersion", "status", "reason", **facts}``; return it.

    :raises AllocstackError: ``storage`` or ``io`` when it cannot be written.
    """
    record = {"schemaVersion": SCHEMA_VERSION, "status": status, "reason": reason, **facts}
    atomic_write_json(path, record)
    return record


def write_startup_failure(path: str | os.PathLike, error: AllocstackError, ended_at: float) -> None:
    """The record of a coordinator that never served, so the gate fails at once with the reason."""
    write(path, FAILED, error.line(), endedAt=ended_at)


def read(path: str | os.PathLike) -> Any:
    """The record as written (any JSON); ``coordinator-exit`` when it is missing or not JSON."""
    return read_json(path, WHAT, diag="coordinator-exit")


def ended_before_ready(path: str | os.PathLike | None, service: str | None = None) -> None:
    """For a gate: raise when what it waits for has already ended (it died before serving).

    ``coordinator-exit`` with the reason in the coordinator's end record; for your own
    ``service``, ``service-exit`` with how its supervisor recorded its end
    (``SCRATCH/services/<name>.end.json``, see app_service.py).

    A coordinator that served writes its end record the moment every task has a result and
    goes on serving until it is told to stop: with more than one node, the first node's
    workers can finish a small task set before another node's gate runs, and that gate must
    still pass (its workers then hear "done").
    """
    if path is None or not os.path.exists(path):
        return
    try:
        record = read_json(path, "end record", diag="coordinator-exit")
        reason = (record.get("reason") or record.get("how") or "?") if isinstance(record, dict) else "unreadable end record"
    except AllocstackError:
        record, reason = None, "unreadable end record"
    served = isinstance(record, dict) and record.get("listeningAt") and record.get("status") in (COMPLETED, FAILED)
    if served and not service:
        return  # finished the work, still serving
    if service:
        raise AllocstackError("service-exit", f"service {service} ended before it was ready: {reason}")
    raise AllocstackError("coordinator-exit", f"the coordinator ended before it was ready: {reason}")


def check_completed(record: Any, task_count: int, input_sha256: str, results_sha256: str) -> None:
    """For verification: the coordinator completed, on this input, producing exactly this results file.

    :raises AllocstackError: ``task-failed``, ``coordinator-exit`` or ``verification`` saying what differs.
    """
    if not isinstance(record, dict):
        raise AllocstackError("coordinator-exit", f"{WHAT} is not a JSON object")
    if record.get("status") == FAILED and record.get("failedTasks"):
        failed = record["failedTasks"]
        first = next(iter(failed.items()), ("?", "?"))
        raise AllocstackError("task-failed", f"{len(failed)} task(s) failed for good, e.g. {first[0]}: {first[1][-300:]}")
    if record.get("status") != COMPLETED:
        raise AllocstackError(
            "coordinator-exit", f"coordinator ended {record.get('status')!r} ({record.get('reason')}), not completed"
        )
    if record.get("resultCount") != task_count:
        raise AllocstackError("verification", f"coordinator reports {record.get('resultCount')} results for "
                                              f"{task_count} tasks")
    if record.get("inputSha256") != input_sha256:
        raise AllocstackError("verification", "coordinator ran on a different input (inputSha256 differs)")
    if record.get("resultsSha256") != results_sha256:
        raise AllocstackError("verification",
                              "results file differs from the one the coordinator wrote (resultsSha256 differs)")
