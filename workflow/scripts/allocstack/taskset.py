"""The task document (``inputs/tasks.json``) and the expected document.

Both are inert JSON: they are parsed and checked here, never evaluated by a shell.
Every check is linear in the number of tasks and reports the FIRST problem with
the document, the task's position and its id.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from . import SCHEMA_VERSION
from .errors import AllocstackError
from .jsonio import read_json

TASK_ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
SHA256_PATTERN = re.compile(r"^[0-9a-f]{64}$")
#: Serialized payloads above this size are refused (the coordinator hands them out in memory).
MAX_PAYLOAD_BYTES = 1 << 20
#: A generous ceiling that still keeps the coordinator's memory bounded (~1 KiB a task).
MAX_TASKS = 2_000_000


@dataclass(frozen=True)
class TaskSet:
    """A validated task document: tasks in input order, addressable by id."""

    tasks: list[dict[str, Any]]

    @property
    def ids(self) -> list[str]:
        return [task["id"] for task in self.tasks]

    def __len__(self) -> int:
        return len(self.tasks)


def _need(condition: bool, what: str, message: str) -> None:
    if not condition:
        raise AllocstackError("input", f"{what}: {message}")


def _check_top(document: Any, what: str, list_key: str) -> list[Any]:
    _need(isinstance(document, dict), what, "the top level must be a JSON object")
    version = document.get("schemaVersion")
    _need(
        type(version) is int and version == SCHEMA_VERSION,
        what,
        f"schemaVersion must be {SCHEMA_VERSION}, got {json.dumps(version)}",
    )
    unknown = sorted(set(document) - {"schemaVersion", list_key})
    _need(not unknown, what, f"unknown top-level key {unknown[0]!r}" if unknown else "")
    items = document.get(list_key)
    _need(isinstance(items, list), what, f"{list_key!r} must be a list")
    _need(len(items) > 0, what, f"{list_key!r} is empty: there is nothing to run")
    _need(len(items) <= MAX_TASKS, what, f"{len(items)} entries exceed the limit of {MAX_TASKS}")
    return items


def check_task_id(value: Any, where: str) -> str:
    """Return ``value`` if it is a valid task id, else raise ``input``."""
    _need(isinstance(value, str), where, f"id must be a string, got {json.dumps(value)[:40]}")
    _need(
        bool(TASK_ID_PATTERN.match(value)),
        where,
        f"id {value[:80]!r} must match {TASK_ID_PATTERN.pattern} (letters, digits, '.', '_', '-'; at most 64)",
    )
    return value


def parse_tasks(document: Any, what: str = "tasks") -> TaskSet:
    """Validate a task document.

    :raises AllocstackError: ``input`` naming the first malformed task.
    """
    items = _check_top(document, what, "tasks")
    seen: set[str] = set()
    for index, task in enumerate(items, start=1):
        where = f"{what}: task {index}"
        _need(isinstance(task, dict), where, "must be a JSON object with 'id' and 'payload'")
        unknown = sorted(set(task) - {"id", "payload"})
        _need(not unknown, where, f"unknown key {unknown[0]!r}" if unknown else "")
        task_id = check_task_id(task.get("id"), where)
        _need(task_id not in seen, where, f"duplicate task id {task_id!r}")
        seen.add(task_id)
        payload = task.get("payload")
        _need(isinstance(payload, dict), f"{where} ({task_id})", "payload must be a JSON object")
        size = len(json.dumps(payload, separators=(",", ":")).encode("utf-8"))
        _need(size <= MAX_PAYLOAD_BYTES, f"{where} ({task_id})", f"payload is {size} bytes, over {MAX_PAYLOAD_BYTES}")
    return TaskSet(list(items))


def load_tasks(path: str, what: str = "tasks") -> TaskSet:
    """Read and validate a task document from ``path``."""
    return parse_tasks(read_json(path, what), f"{what} {path}")


def parse_expected(document: Any, tasks: TaskSet, what: str = "expected",
                   mismatch_hint: str = "") -> dict[str, dict[str, Any]]:
    """Validate an expected-results document against ``tasks``; return results by task id.

    Each entry is ``{"taskId", "output", "sha256"}``; the digest must be the SHA-256
    of the UTF-8 output, and the ids must be exactly the task ids.

    :param mismatch_hint: appended when the ids differ from the task ids (the document
        probably belongs to another task set).
    :raises AllocstackError: ``input`` naming the first problem.
    """
    from .jsonio import sha256_text

    items = _check_top(document, what, "results")
    task_ids = set(tasks.ids)
    expected: dict[str, dict[str, Any]] = {}
    for index, entry in enumerate(items, start=1):
        where = f"{what}: result {index}"
        _need(isinstance(entry, dict), where, "must be a JSON object with taskId, output, sha256")
        unknown = sorted(set(entry) - {"taskId", "output", "sha256"})
        _need(not unknown, where, f"unknown key {unknown[0]!r}" if unknown else "")
        task_id = check_task_id(entry.get("taskId"), where)
        _need(task_id not in expected, where, f"duplicate taskId {task_id!r}")
        _need(task_id in task_ids, where, f"taskId {task_id!r} is not a task of the input{mismatch_hint}")
        output, digest = entry.get("output"), entry.get("sha256")
        _need(isinstance(output, str), f"{where} ({task_id})", "output must be a string")
        _need(
            isinstance(digest, str) and bool(SHA256_PATTERN.match(digest)),
            f"{where} ({task_id})",
            "sha256 must be 64 lowercase hex digits",
        )
        _need(digest == sha256_text(output), f"{where} ({task_id})", "sha256 is not the digest of output")
        expected[task_id] = entry
    missing = [task_id for task_id in tasks.ids if task_id not in expected]
    _need(not missing, what, f"no expected result for task {missing[0]!r}{mismatch_hint}" if missing else "")
    return expected


def load_expected(path: str, tasks: TaskSet, what: str = "expected",
                  mismatch_hint: str = "") -> dict[str, dict[str, Any]]:
    """Read and validate an expected document from ``path``."""
    return parse_expected(read_json(path, what), tasks, f"{what} {path}", mismatch_hint)
