"""The task document (``inputs/tasks.json``) and the expected document (and the records of results.json).

Both are inert JSON: they are parsed and checked here, never evaluated by a shell.
Every check is linear in the number of tasks and reports the FIRST problem with
the document, the task's position and its id.

Two parsers, one verdict. msgspec decodes a well-formed document in one pass into
compact records: the task ids, and each payload as its raw JSON bytes (never a
dict: a million tasks fit in about 100 MB). Anything msgspec does not accept
outright (a malformed document, a duplicate id, a number the standard library
reads differently, ...) is parsed again with the standard library, which either
accepts it (the same tasks) or names the first problem. So msgspec changes the
speed, never the outcome or the message; without msgspec installed (an image
built before it was pinned) every document takes the standard library's path.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
from array import array
from bisect import bisect_left
from dataclasses import dataclass
from itertools import accumulate, islice
from operator import sub
from pathlib import Path
from typing import Any

from .. import SCHEMA_VERSION
from .errors import AllocstackError
from .jsonio import (
    atomic_write_chunks,
    document_sha256,
    loads_bytes,
    loads_strict,
    msgspec,
    read_bytes,
    sha256_text,
    sha256_texts,
)

TASK_ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
SHA256_PATTERN = re.compile(r"^[0-9a-f]{64}$")
#: Serialized payloads above this size are refused (the coordinator hands them out in memory).
MAX_PAYLOAD_BYTES = 1 << 20
#: A generous ceiling that still keeps the coordinator's memory bounded (~100 bytes a task).
MAX_TASKS = 2_000_000

#: The bytes a task id may hold (see TASK_ID_PATTERN), and those it may not start with.
_ID_BYTES = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-"
_NOT_FIRST = (b"\n.", b"\n_", b"\n-")
#: An integer the standard library refuses to read (over 4300 digits): the fast path leaves it to it.
_HUGE_DIGITS = b"0" * 4300
#: Every digit to "0", every other byte to " ": a run of digits becomes a run of "0" that bytes search finds fast.
_DIGITS_TO_ZERO = bytes(0x30 if 0x30 <= byte <= 0x39 else 0x20 for byte in range(256))
_SCAN_CHUNK = 1 << 20
#: Tasks read as records at a time (half a megabyte of a generated document: more raises the peak).
TASK_CHUNK = 1 << 12
#: A raw payload this short is within MAX_PAYLOAD_BYTES however the standard library writes it
#: (its compact form of a number is at most 4.5 times as long: 1e15 -> 1000000000000000.0).
_SURELY_SMALL = MAX_PAYLOAD_BYTES // 5


class TaskSet:
    """A validated task document: ids in input order, each payload as compact raw JSON bytes.

    ``payload_bytes(i)`` is the i-th payload as written in the document (a pretty-printed one's without
    its whitespace),
    ``payload(i)`` the same decoded, ``task_json(i)`` the task object a worker receives,
    ``position(task_id)`` the task's position. Ids in ascending order (the usual case) are
    found by bisection; others through a table (id -> position: about 60 MB a million).
    """

    __slots__ = ("_index", "_offsets", "_payloads", "ids")

    def __init__(self, ids: list[str], payloads: bytes | bytearray, offsets: array,
                 index: dict[str, int] | None = None) -> None:
        """``index`` None: ``ids`` are strictly ascending (so each is there once)."""
        self.ids = ids
        self._index = index
        self._payloads = payloads
        self._offsets = offsets

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def ascending(self) -> bool:
        """The ids ascend (so positions are found by bisection, and position order is id order)."""
        return self._index is None

    def position(self, task_id: str) -> int | None:
        """The position of ``task_id``, or None when it is not a task of the set (or not a string)."""
        if type(task_id) is not str:
            return None
        if self._index is not None:
            return self._index.get(task_id)
        ids = self.ids
        found = bisect_left(ids, task_id)
        return found if found < len(ids) and ids[found] == task_id else None

    def __contains__(self, task_id: str) -> bool:
        return self.position(task_id) is not None

    def payload_bytes(self, index: int) -> bytes:
        return bytes(self._payloads[self._offsets[index]:self._offsets[index + 1]])

    def payload(self, index: int) -> Any:
        return json.loads(self.payload_bytes(index))

    def task_json(self, index: int) -> bytes:
        """``{"id": ..., "payload": ...}`` as a worker receives it (ids need no escaping)."""
        offsets = self._offsets
        return b'{"id":"%s","payload":%s}' % (self.ids[index].encode(),
                                              self._payloads[offsets[index]:offsets[index + 1]])

    def tasks_json(self, positions: list[int] | range) -> bytes:
        """The JSON list of the tasks at ``positions``, each as :meth:`task_json` writes it; consecutive
        positions (a :class:`range`) in one join over them."""
        if type(positions) is not range or positions.step != 1:
            return b"[" + b",".join(map(self.task_json, positions)) + b"]"
        start, end, offsets = positions.start, positions.stop, self._offsets
        if start >= end:
            return b"[]"
        parts = [b'{"id":"', b"", b'","payload":', b"", b"},"] * (end - start)
        parts[1::5] = map(str.encode, self.ids[start:end])
        parts[3::5] = map(self._payloads.__getitem__, map(slice, offsets[start:end], offsets[start + 1:end + 1]))
        parts[-1] = b"}]"
        return b"[" + b"".join(parts)

    def task(self, index: int) -> dict[str, Any]:
        return {"id": self.ids[index], "payload": self.payload(index)}

    def payloads_array(self) -> bytes:
        """Every payload in task order as one JSON array (checked all at once, e.g. by input validation)."""
        payloads, ends = self._payloads, self._offsets
        return b"[" + b",".join([payloads[ends[i]:ends[i + 1]] for i in range(len(self.ids))]) + b"]"


def ascending(ids: list[str]) -> bool:
    """Each id sorts after the one before (so none repeats)."""
    return all(map(str.__lt__, ids, islice(ids, 1, None)))


def _build(ids: list[str], payloads: bytes | bytearray, offsets: array) -> TaskSet | None:
    """The task set, or None when an id repeats."""
    if ascending(ids):
        return TaskSet(ids, payloads, offsets)
    index = dict(zip(ids, range(len(ids)), strict=True))
    return TaskSet(ids, payloads, offsets, index) if len(index) == len(ids) else None


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


def valid_ids(ids: list[str]) -> bool:
    """Every id matches :data:`TASK_ID_PATTERN`, checked over all ids at once (a million in 0.1 s).

    The ids one a line: none empty, only allowed bytes, no line that starts with '.', '_' or
    '-', none over 64 characters; an id holding a newline would read as two good lines, so the
    count of newlines must be the count of ids. (A regex over the lines would be as fast but
    hold a backtracking state per line: 120 MB for a million.)
    """
    if not ids or max(map(len, ids)) > 64 or min(map(len, ids)) < 1:
        return False
    try:
        lines = ("\n" + "\n".join(ids)).encode("ascii")
    except UnicodeEncodeError:
        return False
    return (lines.count(b"\n") == len(ids) and not lines.translate(None, _ID_BYTES + b"\n")
            and not any(start in lines for start in _NOT_FIRST))


def compact_payload(payload: Any) -> bytes:
    """A payload as the standard library writes it compactly (its size is what MAX_PAYLOAD_BYTES bounds)."""
    return json.dumps(payload, separators=(",", ":")).encode("utf-8")


def parse_tasks(document: Any, what: str = "tasks") -> TaskSet:
    """Validate a task document already decoded by the standard library (the reference parser).

    :raises AllocstackError: ``input`` naming the first malformed task.
    """
    items = _check_top(document, what, "tasks")
    table: dict[str, int] = {}
    payloads: list[bytes] = []
    for index, task in enumerate(items, start=1):
        where = f"{what}: task {index}"
        _need(isinstance(task, dict), where, "must be a JSON object with 'id' and 'payload'")
        unknown = sorted(set(task) - {"id", "payload"})
        _need(not unknown, where, f"unknown key {unknown[0]!r}" if unknown else "")
        task_id = check_task_id(task.get("id"), where)
        _need(task_id not in table, where, f"duplicate task id {task_id!r}")
        table[task_id] = index - 1
        payload = task.get("payload")
        _need(isinstance(payload, dict), f"{where} ({task_id})", "payload must be a JSON object")
        compact = compact_payload(payload)
        _need(len(compact) <= MAX_PAYLOAD_BYTES, f"{where} ({task_id})",
              f"payload is {len(compact)} bytes, over {MAX_PAYLOAD_BYTES}")
        payloads.append(compact)
    offsets = array("Q", [0])
    total = 0
    for payload in payloads:
        total += len(payload)
        offsets.append(total)
    ids = list(table)
    return TaskSet(ids, b"".join(payloads), offsets, None if ascending(ids) else table)


if msgspec is not None:
    class _Task(msgspec.Struct, forbid_unknown_fields=True, gc=False):
        id: str
        payload: msgspec.Raw

    class _TaskDocument(msgspec.Struct, forbid_unknown_fields=True, gc=False):
        schemaVersion: int
        tasks: list[msgspec.Raw]

    class _Expected(msgspec.Struct, forbid_unknown_fields=True, gc=False):
        taskId: str
        output: str
        sha256: str

    class _ExpectedDocument(msgspec.Struct, forbid_unknown_fields=True, gc=False):
        schemaVersion: int
        results: list[_Expected]

    class _Result(_Expected):
        """A result of results.json (the coordinator's): an expected result and the worker that made it."""

        workerId: str

    # Unknown keys refused at the top too (verification ignores them: its one-by-one checks decide),
    # so every number in a document msgspec accepts is schemaVersion: none reads differently in the
    # standard library.
    class _ResultsDocument(msgspec.Struct, forbid_unknown_fields=True, gc=False):
        schemaVersion: int
        results: list[_Result]

    _TASK_DOCUMENT = msgspec.json.Decoder(_TaskDocument)
    _TASKS = msgspec.json.Decoder(list[_Task])
    _EXPECTED_DOCUMENT = msgspec.json.Decoder(_ExpectedDocument)
    #: results.json as records with output, sha256, taskId, workerId (verify.py)
    RESULTS_DOCUMENT = msgspec.json.Decoder(_ResultsDocument)
else:
    _TASK_DOCUMENT = _TASKS = _EXPECTED_DOCUMENT = RESULTS_DOCUMENT = None


def _fast_document(raw: bytes, decoder: Any, validated: bool = False) -> Any:
    """``raw`` read by msgspec's ``decoder`` when msgspec may read it, does, and finds schemaVersion 1; else None.

    :param validated: ``raw`` passed validation (either parser): so it is UTF-8 without a huge number.
    """
    if msgspec is None or not (validated or plain_json(raw)):
        return None
    try:
        document = decoder.decode(raw)
    except msgspec.MsgspecError:
        return None
    return document if document.schemaVersion == SCHEMA_VERSION else None


def plain_json(raw: bytes) -> bool:
    """The bytes are UTF-8 and hold no number the standard library would refuse: msgspec may read them."""
    if not raw.isascii():
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError:
            return False
    return not has_huge_number(raw)


def has_huge_number(raw: bytes) -> bool:
    """``raw`` holds a run of more than 4300 digits (scanned a megabyte at a time, overlapping)."""
    overlap = len(_HUGE_DIGITS)
    return any(_HUGE_DIGITS in raw[start:start + _SCAN_CHUNK + overlap].translate(_DIGITS_TO_ZERO)
               for start in range(0, len(raw), _SCAN_CHUNK))


def decode_tasks_fast(raw: bytes, validated: bool = False) -> TaskSet | None:
    """The task document in ``raw`` when msgspec accepts all of it as valid; None to ask the standard library.

    ``validated``: these bytes passed validation before (validate_inputs' summary holds their digest), so
    the checks that only the standard library's reading could fail are skipped (0.4 s a million).

    The list of tasks is read as raw elements first, then :data:`TASK_CHUNK` of them at a time
    as records (one call each, not one a task: three times faster), each chunk's elements freed
    once read, so the document's million small objects never exist at once (a third less peak
    memory than one pass).
    """
    document = _fast_document(raw, _TASK_DOCUMENT, validated)
    if document is None or not 0 < len(document.tasks) <= MAX_TASKS:
        return None
    elements = document.tasks
    del document
    count = len(elements)
    ids: list[str] = []
    payloads = bytearray()
    offsets = array("Q", [0])
    # A pretty-printed document (make_tasks.py writes one) keeps its payloads without their
    # indentation: half the bytes, for 0.2 s a million.
    pretty = b"\n" in raw[raw.find(b"["):raw.find(b"[") + 4096]
    for first in range(0, count, TASK_CHUNK):
        last = min(first + TASK_CHUNK, count)
        chunk = b"[" + b",".join(elements[first:last]) + b"]"
        elements[first:last] = [None] * (last - first)  # their memory serves the next ids
        try:
            tasks = _TASKS.decode(msgspec.json.format(chunk, indent=-1) if pretty else chunk)
        except msgspec.MsgspecError:
            return None
        del chunk
        ids += [task.id for task in tasks]
        values = [task.payload for task in tasks]
        del tasks
        start = len(payloads)
        payloads += b"".join(values)
        ends = list(accumulate(map(len, values), initial=start))
        del values
        firsts = bytes(map(payloads.__getitem__, ends[:-1]))
        if firsts.count(b"{") != len(firsts) or max(map(sub, ends[1:], ends)) > _SURELY_SMALL:
            return None  # not an object, or maybe too big
        offsets.extend(ends[1:])
    if not (validated or valid_ids(ids)):
        return None
    return _build(ids, payloads, offsets)  # None for a duplicate id: the standard library names the first one


def decode_tasks(raw: bytes, what: str = "tasks", path: str = "", validated: bool = False) -> TaskSet:
    """Validate the task document in ``raw``, read from ``path`` (see the module docstring: fast, then exact;
    ``validated``: see :func:`decode_tasks_fast`).

    :raises AllocstackError: ``input`` naming the first problem.
    """
    fast = decode_tasks_fast(raw, validated)
    if fast is not None:
        return fast
    return parse_tasks(loads_strict(raw, path, what), f"{what} {path}" if path else what)


def load_tasks(path: str, what: str = "tasks") -> TaskSet:
    """Read and validate a task document from ``path``."""
    return decode_tasks(read_bytes(path, what), what, str(path))


def load_tasks_and_digest(path: str, what: str = "tasks", validated_sha256: Any = None,
                          compact: Path | None = None, compact_sha256: Any = None) -> tuple[TaskSet, str]:
    """Read and validate a task document; also the SHA-256 (hex) of exactly the bytes validated.

    One read for both: the digest the summary, the journal and the marker record is of the
    document the tasks came from, even if the file is replaced meanwhile.

    :param validated_sha256: the digest of a document validated before (validate_inputs' summary's):
        if these bytes have it, the checks only another reading could fail are skipped.
    :param compact: validate_inputs' compact copy of the task set it validated (:func:`write_compact`),
        whose SHA-256 its summary holds (``compact_sha256``): taken instead of decoding the document
        again (a million tasks: 0.1 s, not 0.8) when the document's digest is still ``validated_sha256``
        and the copy's is ``compact_sha256``; else the document is read as without it.
    """
    if compact is not None and isinstance(validated_sha256, str) and isinstance(compact_sha256, str):
        digest = document_sha256(path, what)
        tasks = read_compact(compact, compact_sha256, digest) if digest == validated_sha256 else None
        if tasks is not None:
            return tasks, digest
    raw = read_bytes(path, what)
    digest = hashlib.sha256(raw).hexdigest()
    return decode_tasks(raw, what, str(path), validated=digest == validated_sha256), digest


#: The first line of a compact task set (:func:`write_compact`); the second is its JSON header.
COMPACT_MAGIC = b"allocstack compact task set 1\n"


def write_compact(path: str | os.PathLike, tasks: TaskSet, input_sha256: str) -> str:
    """Write ``tasks`` (validated, from the document whose SHA-256 is ``input_sha256``) as a compact task set,
    atomically; its SHA-256 (hex).

    :data:`COMPACT_MAGIC`, one JSON line (the count, whether the ids ascend, the byte length of each
    part, the document's digest, the offsets' byte order), then the ids one a line, the payloads end
    to end, and their offsets (``array("Q")``). :func:`read_compact` reads it back in a tenth of a
    document's decoding.

    :raises AllocstackError: ``storage`` or ``io`` when it cannot be written.
    """
    ids = "\n".join(tasks.ids).encode("ascii")  # valid ids are ASCII
    offsets = tasks._offsets.tobytes()
    header = {"count": len(tasks), "inputSha256": input_sha256, "ascending": tasks.ascending, "idsBytes": len(ids),
              "payloadBytes": len(tasks._payloads), "offsetsBytes": len(offsets), "byteorder": sys.byteorder}
    return atomic_write_chunks(path, (COMPACT_MAGIC, json.dumps(header).encode("ascii") + b"\n", ids,
                                      memoryview(tasks._payloads), offsets), 0o644)


def read_compact(path: str | os.PathLike, sha256: str, input_sha256: str) -> TaskSet | None:
    """The task set :func:`write_compact` wrote to ``path``, when the file's SHA-256 is ``sha256`` and it is
    the set of the document whose digest is ``input_sha256``; None otherwise (unreadable, another file)."""
    try:
        raw = read_bytes(path, "compact task set")
    except AllocstackError:
        return None
    if hashlib.sha256(raw).hexdigest() != sha256 or not raw.startswith(COMPACT_MAGIC):
        return None
    start = len(COMPACT_MAGIC)
    end = raw.find(b"\n", start)
    try:
        header = json.loads(raw[start:end])
        count, ids_bytes, payload_bytes, offsets_bytes = (header["count"], header["idsBytes"],
                                                          header["payloadBytes"], header["offsetsBytes"])
    except (ValueError, TypeError, KeyError):
        return None
    if header.get("inputSha256") != input_sha256 or header.get("byteorder") != sys.byteorder:
        return None
    ids_at = end + 1
    payloads_at = ids_at + ids_bytes
    offsets_at = payloads_at + payload_bytes
    if offsets_at + offsets_bytes != len(raw) or offsets_bytes != 8 * (count + 1):
        return None
    ids = raw[ids_at:payloads_at].decode("ascii").split("\n")
    offsets = array("Q")
    offsets.frombytes(raw[offsets_at:])
    payloads = raw[payloads_at:offsets_at]
    del raw
    if len(ids) != count or offsets[0] != 0 or offsets[-1] != len(payloads):
        return None
    if header.get("ascending") is True:  # as validation found them (the file's digest is the one it recorded)
        return TaskSet(ids, payloads, offsets)
    return _build(ids, payloads, offsets)


@dataclass(frozen=True, slots=True)
class ExpectedResults:
    """The expected results in task order: each task's output and its SHA-256, as two lists
    (``outputs[i]`` is task ``i``'s; no object per result: a million in two lists)."""

    outputs: list[str]
    digests: list[str]

    def __len__(self) -> int:
        return len(self.outputs)


def _expected_fast(raw: bytes, tasks: TaskSet) -> ExpectedResults | None:
    """The expected document when msgspec accepts all of it as valid; None to ask the standard library."""
    document = _fast_document(raw, _EXPECTED_DOCUMENT)
    if document is None or len(document.results) != len(tasks):
        return None
    entries = document.results
    if [entry.taskId for entry in entries] != tasks.ids:  # in task order (make_tasks.py's): each task once
        by_id = {entry.taskId: entry for entry in entries}
        if len(by_id) != len(entries) or by_id.keys() != set(tasks.ids):
            return None  # ids are task ids (so valid ones), each once
        entries = [by_id[task_id] for task_id in tasks.ids]
    outputs = [entry.output for entry in entries]
    digests = [entry.sha256 for entry in entries]
    if sha256_texts(outputs) != digests:  # a digest of an output is 64 lowercase hex digits
        return None
    return ExpectedResults(outputs, digests)


def ids_sha256(ids: list[str]) -> str:
    """The SHA-256 of task ids one a line (valid ids hold no newline: equal digests, equal lists)."""
    return hashlib.sha256("\n".join(ids).encode("utf-8")).hexdigest()


def listing_sha256(ids: list[str], outputs: list[str], digests: list[str]) -> str | None:
    """The SHA-256 of results as ``[ids, outputs, digests]`` in one JSON document (msgspec's encoding: equal
    digests, equal lists), or None without msgspec or for a string it cannot encode (a lone surrogate).

    validate_inputs records it for the expected results in task order; verification compares
    results.json's results with them through it, without reading the expected document again.
    """
    if msgspec is None:
        return None
    try:
        return hashlib.sha256(msgspec.json.encode([ids, outputs, digests])).hexdigest()
    except UnicodeEncodeError:
        return None


def expected_facts(path: str) -> list[Any] | None:
    """The expected document at ``path`` checked on its own, without the task set: when msgspec reads it
    and each digest is its output's, ``[its result count, ids_sha256 of its task ids in its order, the
    SHA-256 of its bytes, the listing_sha256 of its results in its order]``; None otherwise, or when it
    cannot be read.

    The task set then completes :func:`_expected_fast`'s verdict in two comparisons
    (:func:`expected_digests_from_facts`), so this half can run in another process while the task
    document is read (validate_inputs: 1M results in about a second and a half).
    """
    try:
        raw = read_bytes(path, "expected")
    except AllocstackError:
        return None
    document = _fast_document(raw, _EXPECTED_DOCUMENT)
    if document is None:
        return None
    entries = document.results
    ids = [entry.taskId for entry in entries]
    outputs = [entry.output for entry in entries]
    digests = [entry.sha256 for entry in entries]
    del document, entries
    if sha256_texts(outputs) != digests:
        return None
    return [len(ids), ids_sha256(ids), hashlib.sha256(raw).hexdigest(), listing_sha256(ids, outputs, digests)]


def expected_digests_from_facts(facts: Any, tasks: TaskSet) -> tuple[str, str | None] | None:
    """The expected document's SHA-256 and :func:`listing_sha256` when its :func:`expected_facts` prove it
    valid for ``tasks`` (one result per task, in the task order, as :func:`_expected_fast` accepts it);
    None to validate it again (:func:`load_expected_and_digest`, which names any problem)."""
    if (isinstance(facts, list) and len(facts) == 4 and facts[0] == len(tasks)
            and facts[1] == ids_sha256(tasks.ids) and isinstance(facts[2], str)):
        return facts[2], facts[3]
    return None


def parse_expected(document: Any, tasks: TaskSet, what: str = "expected",
                   mismatch_hint: str = "") -> ExpectedResults:
    """Validate an expected-results document (decoded by the standard library) against ``tasks``.

    Each entry is ``{"taskId", "output", "sha256"}``; the digest must be the SHA-256
    of the UTF-8 output, and the ids must be exactly the task ids.

    :param mismatch_hint: appended when the ids differ from the task ids (the document
        probably belongs to another task set).
    :raises AllocstackError: ``input`` naming the first problem.
    """
    items = _check_top(document, what, "results")
    task_ids = tasks
    expected: dict[str, tuple[str, str]] = {}
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
        expected[task_id] = (output, digest)
    missing = [task_id for task_id in tasks.ids if task_id not in expected]
    _need(not missing, what, f"no expected result for task {missing[0]!r}{mismatch_hint}" if missing else "")
    in_order = [expected[task_id] for task_id in tasks.ids]
    return ExpectedResults([output for output, _ in in_order], [digest for _, digest in in_order])


def load_expected(path: str, tasks: TaskSet, what: str = "expected",
                  mismatch_hint: str = "") -> ExpectedResults:
    """Read and validate an expected document from ``path``; the results in task order."""
    return load_expected_and_digest(path, tasks, what, mismatch_hint)[0]


def load_expected_and_digest(path: str, tasks: TaskSet, what: str = "expected",
                             mismatch_hint: str = "") -> tuple[ExpectedResults, str]:
    """:func:`load_expected`, and the SHA-256 (hex) of exactly the bytes validated (one read for both)."""
    raw = read_bytes(path, what)
    fast = _expected_fast(raw, tasks)
    if fast is None:
        fast = parse_expected(loads_strict(raw, path, what), tasks, f"{what} {path}", mismatch_hint)
    return fast, hashlib.sha256(raw).hexdigest()


def validated_summary(summary: Path | None) -> dict[str, Any]:
    """validate_inputs' summary: its inputSha256 and expectedSha256 are the digests of the task and expected
    documents it validated, expectedListingSha256 the expected results' :func:`listing_sha256` in task order
    ({} without a summary, or one that cannot be read: whoever needs the summary names that problem in its turn)."""
    try:
        document = loads_bytes(summary.read_bytes()) if summary is not None else None
    except (OSError, ValueError, RecursionError):
        return {}
    return document if isinstance(document, dict) else {}
