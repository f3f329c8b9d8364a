"""The coordinator's end record (``results/<run>/coordinator.json``): how it ended, and why.

One module for its writer (the coordinator) and its readers (the readiness gate,
which fails at once when the coordinator, or a service of yours, ended before it
was ready, and
verification, which accepts a run only when the coordinator completed on this
input with exactly this results file).

``status`` is ``completed`` (every task has a durable result), ``failed`` (a
task failed ``max_attempts`` times, or the coordinator could not start) or
``incomplete`` (stopped first: a signal, a time limit, a storage fault).

A process that dies writes no record (a crash, ``kill -9``, a container runtime that
fails before the program starts: ``ch-run: error: too many FUSE errors``). Its launcher
(launch.py) sees it end and writes a note in scratch, ``ended/<component>.json``
(:func:`write_ended`): the exit code and the last line the program wrote. The gate of
that program reads it too (:func:`ended_before_ready`), so it stops waiting at once with
that line instead of at its deadline.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .. import SCHEMA_VERSION
from ..common import names
from ..common.attempts import COMMAND_ENV
from ..common.errors import AllocstackError
from ..common.identity import KEY
from ..common.jsonio import atomic_write_json, read_json
from ..common.scratch import make_private

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


def ended_before_ready(path: str | os.PathLike | None, service: str | None = None,
                       scratch: Path | None = None) -> None:
    """For a gate: raise when what it waits for has already ended (it died before serving).

    ``coordinator-exit`` with the reason in the coordinator's end record; for your own
    ``service``, ``service-exit`` with how its supervisor recorded its end
    (``SCRATCH/services/<name>.end.json``, see app_service.py). With ``scratch``, also when
    its launcher saw its process end (:func:`write_ended`), with its last line.

    A coordinator that served writes its end record the moment every task has a result and
    goes on serving until it is told to stop: with more than one node, the first node's
    workers can finish a small task set before another node's gate runs, and that gate must
    still pass (its workers then hear "done").
    """
    # A service's supervisor that wrote its end record says how its program ended (the launcher's note would
    # quote only the supervisor's last line, which is its own error line about that end).
    supervisor_said = service is not None and path is not None and os.path.exists(path)
    if scratch is not None and not supervisor_said:
        ended = launcher_saw_end(scratch, service or "coordinator", os.environ)
        if ended is not None:
            how = f"(exit {ended.get('exitCode')})" + (f": {ended['line']}" if ended.get("line") else ", no line written")
            if service:
                raise AllocstackError("service-exit", f"service {service} ended before it was ready {how}")
            raise AllocstackError("coordinator-exit", f"the coordinator ended before it was ready {how}")
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


def attempt_of(environ: Mapping[str, str]) -> dict[str, str | None]:
    """Which attempt a process is part of: its command (allocstack/common/attempts.py) and Slurm job."""
    return {"command": environ.get(COMMAND_ENV) or None, "job": environ.get("SLURM_JOB_ID") or None}


def write_ended(scratch: Path, component: str, code: int, line: str | None, environ: Mapping[str, str]) -> None:
    """The launcher's note: ``component``'s process ended with ``code``, its last line ``line``.

    :raises AllocstackError: ``io``, ``storage`` or ``scratch`` when it cannot be written.
    """
    make_private(scratch / names.ENDED_DIR)
    atomic_write_json(scratch / names.component_ended(component), {
        "schemaVersion": SCHEMA_VERSION, "component": component, "exitCode": code, "line": line,
        "endedAt": time.time(), **attempt_of(environ)})


def clear_ended(scratch: Path, component: str) -> None:
    """Remove what an earlier attempt's launcher of ``component`` noted here (before it starts anew)."""
    try:
        (scratch / names.component_ended(component)).unlink(missing_ok=True)
    except OSError:
        return  # a read-only scratch: the launcher says so on its own


def launcher_saw_end(scratch: Path, component: str, environ: Mapping[str, str]) -> dict[str, Any] | None:
    """The launcher's note that ``component`` ended, when it is of this attempt (same command and job); else None.

    A note of another attempt (a run's scratch outside Slurm is reused by the next command) is not this one's.
    """
    path = scratch / names.component_ended(component)
    try:
        note = read_json(path, "launcher note", diag="coordinator-exit") if path.exists() else None
    except AllocstackError:
        return None  # being written
    if not isinstance(note, dict) or {key: note.get(key) for key in ("command", "job")} != attempt_of(environ):
        return None
    return note


def failed_count(record: Mapping[str, Any]) -> int:
    """How many tasks failed for good (``failedTasks`` lists the first 100 only)."""
    count = record.get("failedCount")
    return count if type(count) is int else len(record.get("failedTasks") or {})


def check_completed(record: Any, task_count: int, input_sha256: str, results_sha256: str,
                    identity: str | None = None) -> None:
    """For verification: the coordinator completed, on this input, producing exactly this results file (and, with
    ``identity``, with the program of this run: :mod:`allocstack.common.identity`).

    :raises AllocstackError: ``task-failed``, ``coordinator-exit`` or ``verification`` saying what differs.
    """
    if not isinstance(record, dict):
        raise AllocstackError("coordinator-exit", f"{WHAT} is not a JSON object")
    if record.get("status") == FAILED and record.get("failedTasks"):
        first = next(iter(record["failedTasks"].items()), ("?", "?"))
        raise AllocstackError("task-failed", f"{failed_count(record)} of {task_count} task(s) failed for good, e.g. "
                                             f"{first[0]}: {first[1][-300:]}")
    if record.get("status") != COMPLETED:
        raise AllocstackError(
            "coordinator-exit", f"coordinator ended {record.get('status')!r} ({record.get('reason')}), not completed"
        )
    if record.get("resultCount") != task_count:
        raise AllocstackError("verification", f"coordinator reports {record.get('resultCount')} results for "
                                              f"{task_count} tasks")
    if record.get("inputSha256") != input_sha256:
        raise AllocstackError("verification", "coordinator ran on a different input (inputSha256 differs)")
    if identity is not None and record.get(KEY) not in (None, identity):
        raise AllocstackError("verification", "the coordinator's results were produced by another program than this "
                                              "run's (its identity differs): start the run over, --forcerun "
                                              "serve_coordinator (docs/failures.md)")
    if record.get("resultsSha256") != results_sha256:
        raise AllocstackError("verification",
                              "results file differs from the one the coordinator wrote (resultsSha256 differs)")
