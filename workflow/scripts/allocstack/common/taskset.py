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

import codecs
import hashlib
import json
import os
import re
import sys
from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from itertools import accumulate, islice
from json.encoder import encode_basestring_ascii
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
#: One id in this many (by ascending id) is kept as a string to bisect among (4 % of the ids' memory).
SIGNPOST = 32
#: Tasks read as records at a time (half a megabyte of a generated document: more raises the peak).
TASK_CHUNK = 1 << 12
#: A raw payload this short is within MAX_PAYLOAD_BYTES however the standard library writes it
#: (its compact form of a number is at most 4.5 times as long: 1e15 -> 1000000000000000.0).
_SURELY_SMALL = MAX_PAYLOAD_BYTES // 5


class TaskSet:
    """A validated task document as a few buffers (no object per task, none per field).

    In task order: the ids one a line in one ASCII text (id ``i`` runs from ``id_starts[i]`` to the
    newline before ``id_starts[i + 1]``), and the payloads as compact raw JSON end to end (payload ``i``
    from ``offsets[i]`` to ``offsets[i + 1]``: a pretty-printed document's without its whitespace). When
    the ids do not ascend in the document, also ``order``, the positions by ascending id, and the ids
    once more in that order, one a line (else None: the usual generated set, where the order is the
    identity and the two texts are one). So a task costs its id's and its payload's own bytes and 13
    more (twice its id's and 21 more when the ids do not ascend), whatever their order or their text.
    A position is found by bisection over the sorted ids (a few microseconds, no table of a million
    entries); a claim's tasks and a batch of results' ids are a slice of the task-order text,
    results.json's ids (by ascending id) a slice of the sorted one.

    ``task_id(i)`` is the id at position ``i``, ``payload_bytes(i)`` the i-th payload as written,
    ``payload(i)`` the same decoded, ``task_json(i)`` the task object a worker receives,
    ``position(task_id)`` the task's position.
    """

    __slots__ = ("_id_starts", "_id_text", "_offsets", "_payloads", "_signposts", "_sorted_starts", "_sorted_text",
                 "order")

    def __init__(self, id_text: bytes, id_starts: array, payloads: bytes | bytearray, offsets: array,
                 order: array | None = None, sorted_ids: tuple[bytes, array] | None = None) -> None:
        """``order`` None: the ids ascend (so each is there once); else every position once, by ascending id,
        and ``sorted_ids`` the ids in that order as :func:`id_lines` writes them (gathered here if not given)."""
        self._id_text = id_text
        self._id_starts = id_starts
        self._payloads = payloads
        self._offsets = offsets
        self.order = order
        if order is None:
            sorted_ids = id_text, id_starts
        elif sorted_ids is None:
            sorted_ids = id_lines(self.ids_at(order))
        self._sorted_text, self._sorted_starts = sorted_ids
        #: Every SIGNPOST-th id by ascending id: a position is looked up among a few ids, not among all of them.
        self._signposts = [self._ranked(rank) for rank in range(0, len(self), SIGNPOST)]

    @classmethod
    def from_ids(cls, ids: list[str], payloads: bytes | bytearray, offsets: array,
                 id_text: bytes | None = None) -> TaskSet | None:
        """The task set of ``ids`` (valid ones, in task order; ``id_text``: the same one a line, when at hand)
        and their payloads, or None when an id repeats."""
        sorted_ids = sort_ids(ids)
        if sorted_ids is None:
            return None
        order, ids_by_id = sorted_ids
        id_text, id_starts = id_lines(ids, id_text)
        return cls(id_text, id_starts, payloads, offsets, order, id_lines(ids_by_id) if order is not None else None)

    @classmethod
    def from_text(cls, id_text: bytes, payloads: bytes | bytearray, offsets: array) -> TaskSet | None:
        """:meth:`from_ids` of the ids one a line in ``id_text`` (each line ending in a newline)."""
        return cls.from_ids(id_text[:-1].decode().split("\n") if id_text else [], payloads, offsets, id_text)

    def __len__(self) -> int:
        return len(self._id_starts) - 1

    @property
    def ascending(self) -> bool:
        """The ids ascend in task order (so position order is id order)."""
        return self.order is None

    def _id_bytes(self, position: int) -> bytes:
        starts = self._id_starts
        return self._id_text[starts[position]:starts[position + 1] - 1]

    def _ranked(self, rank: int) -> bytes:
        """The id ranked ``rank`` by ascending id, encoded."""
        starts = self._sorted_starts
        return self._sorted_text[starts[rank]:starts[rank + 1] - 1]

    def task_id(self, position: int) -> str:
        """The id of the task at ``position``."""
        return self._id_bytes(position).decode()

    def ids_at(self, positions: Iterable[int]) -> list[bytes]:
        """The ids of the tasks at ``positions``, encoded."""
        starts, text = self._id_starts, self._id_text
        return [text[starts[position]:starts[position + 1] - 1] for position in positions]

    def id_run(self, start: int, end: int) -> bytes:
        """The ids of the tasks at positions ``start`` to ``end`` (excluded) joined by newlines, encoded."""
        starts = self._id_starts
        return self._id_text[starts[start]:starts[end] - 1] if start < end else b""

    def ranked_ids(self, start: int, end: int) -> list[bytes]:
        """The ids ranked ``start`` to ``end`` (excluded) by ascending id, encoded: one slice of the sorted text."""
        starts = self._sorted_starts
        return self._sorted_text[starts[start]:starts[end] - 1].split(b"\n") if start < end else []

    def id_list(self) -> list[str]:
        """Every id in task order, as a list of strings (made now: about 70 MB a million)."""
        return self._id_text[:-1].decode().split("\n") if len(self) else []

    def ids_in_id_order(self) -> list[str]:
        """Every id by ascending id, as a list of strings (made now)."""
        return self._sorted_text[:-1].decode().split("\n") if len(self) else []

    def ids_sha256(self) -> str:
        """:func:`ids_sha256` of the ids in task order."""
        return hashlib.sha256(memoryview(self._id_text)[:-1] if len(self) else b"").hexdigest()

    def sorted_ids_sha256(self) -> str:
        """:func:`ids_sha256` of the ids by ascending id."""
        return hashlib.sha256(memoryview(self._sorted_text)[:-1] if len(self) else b"").hexdigest()

    def id_bytes(self) -> int:
        """The bytes of all ids together."""
        return len(self._id_text) - len(self)

    def position(self, task_id: str) -> int | None:
        """The position of ``task_id``, or None when it is not a task of the set (or not a string)."""
        if type(task_id) is not str:
            return None
        try:
            key = task_id.encode()
        except UnicodeEncodeError:  # a lone surrogate: no id holds one
            return None
        block = bisect_right(self._signposts, key) - 1  # the ids from this signpost to the next hold it, if any
        if block < 0:
            return None
        count = len(self)
        rank = bisect_left(range(count), key, SIGNPOST * block, min(count, SIGNPOST * block + SIGNPOST),
                           key=self._ranked)
        if rank == count or self._ranked(rank) != key:
            return None
        return rank if self.order is None else self.order[rank]

    def __contains__(self, task_id: str) -> bool:
        return self.position(task_id) is not None

    def in_id_order(self, start: int, end: int) -> range | array:
        """The positions of the tasks ranked ``start`` to ``end`` (excluded) by ascending id."""
        return range(start, end) if self.order is None else self.order[start:end]

    def payload_bytes(self, index: int) -> bytes:
        return bytes(self._payloads[self._offsets[index]:self._offsets[index + 1]])

    def payload(self, index: int) -> Any:
        return json.loads(self.payload_bytes(index))

    def task_json(self, index: int) -> bytes:
        """``{"id": ..., "payload": ...}`` as a worker receives it (ids need no escaping)."""
        offsets = self._offsets
        return b'{"id":"%s","payload":%s}' % (self._id_bytes(index), self._payloads[offsets[index]:offsets[index + 1]])

    def tasks_json(self, positions: list[int] | range) -> bytes:
        """The JSON list of the tasks at ``positions``, each as :meth:`task_json` writes it; consecutive
        positions (a :class:`range`) in one join over them."""
        if type(positions) is not range or positions.step != 1:
            return b"[" + b",".join(map(self.task_json, positions)) + b"]"
        start, end, offsets = positions.start, positions.stop, self._offsets
        if start >= end:
            return b"[]"
        parts = [b'{"id":"', b"", b'","payload":', b"", b"},"] * (end - start)
        parts[1::5] = self.id_run(start, end).split(b"\n")
        parts[3::5] = map(self._payloads.__getitem__, map(slice, offsets[start:end], offsets[start + 1:end + 1]))
        parts[-1] = b"}]"
        return b"[" + b"".join(parts)

    def task(self, index: int) -> dict[str, Any]:
        return {"id": self.task_id(index), "payload": self.payload(index)}

    def payloads_array(self) -> bytes:
        """Every payload in task order as one JSON array (checked all at once, e.g. by input validation)."""
        payloads, ends = self._payloads, self._offsets
        return b"[" + b",".join(map(payloads.__getitem__, map(slice, ends[:-1], ends[1:]))) + b"]"


def ascending(ids: list[str]) -> bool:
    """Each id sorts after the one before (so none repeats)."""
    return all(map(str.__lt__, ids, islice(ids, 1, None)))


def sort_ids(ids: list[str]) -> tuple[array | None, list[str]] | None:
    """The positions of ``ids`` by ascending id (``array("I")``; None when they ascend already: the identity)
    and the ids in that order; None when an id repeats. A million shuffled ids in about a second."""
    if ascending(ids):
        return None, ids
    order = sorted(range(len(ids)), key=ids.__getitem__)
    ids = list(map(ids.__getitem__, order))
    return (array("I", order), ids) if ascending(ids) else None


def by_id(values: list[Any], order: array | None) -> list[Any]:
    """``values`` (by position) in the order ``order`` (:func:`sort_ids`'s; None: as they are)."""
    return values if order is None else list(map(values.__getitem__, order))


def id_lines(ids: list[str], text: bytes | None = None) -> tuple[bytes, array]:
    """``ids`` one a line (each ending in a newline), encoded (``text``, when at hand); and where each starts
    (and, last, the end)."""
    if text is None:
        text = ("\n".join(ids) + "\n").encode() if ids else b""
    lengths = map(len, ids) if text.isascii() else map(len, map(str.encode, ids))  # valid ids: a character a byte
    return text, array("I", accumulate(map((1).__add__, lengths), initial=0))


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
    del table  # its ids, each once: their order is the task set's business
    return TaskSet.from_ids([task["id"] for task in items], b"".join(payloads), offsets)


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

    class _ResultText(msgspec.Struct, forbid_unknown_fields=True, gc=False):
        """A result of results.json with its output as the JSON text there (not decoded)."""

        taskId: str
        output: msgspec.Raw
        sha256: str
        workerId: str

    class _ResultsText(msgspec.Struct, forbid_unknown_fields=True, gc=False):
        schemaVersion: int
        results: list[_ResultText]

    _TASK_DOCUMENT = msgspec.json.Decoder(_TaskDocument)
    _TASKS = msgspec.json.Decoder(list[_Task])
    _EXPECTED_DOCUMENT = msgspec.json.Decoder(_ExpectedDocument)
    #: results.json as records with output, sha256, taskId, workerId (verify.py)
    RESULTS_DOCUMENT = msgspec.json.Decoder(_ResultsDocument)
    #: the same with each output as its JSON text (a :class:`msgspec.Raw`: no string decoded)
    RESULTS_TEXT = msgspec.json.Decoder(_ResultsText)
else:
    _TASK_DOCUMENT = _TASKS = _EXPECTED_DOCUMENT = RESULTS_DOCUMENT = RESULTS_TEXT = None


def fast_document(raw: bytes, decoder: Any) -> Any:
    """``raw`` read by msgspec's ``decoder`` when msgspec may read it, does, and finds schemaVersion 1; else None.

    msgspec checks what the standard library's reading could refuse wherever the decoder's types reach:
    each string's UTF-8 (a byte above 127 anywhere else is not JSON), and a number too big for an int.
    Only the raw values it passes over unread (a task's payload) are checked apart (:func:`plain_json`).
    """
    if msgspec is None:
        return None
    try:
        document = decoder.decode(raw)
    except msgspec.MsgspecError:
        return None
    return document if document.schemaVersion == SCHEMA_VERSION else None


def plain_json(raw: bytes | bytearray) -> bool:
    """The bytes are UTF-8 and hold no number the standard library would refuse: msgspec may read them.

    Checked a megabyte at a time: never the whole text as one string (four bytes a character, once a
    character outside the BMP is in it).
    """
    if not raw.isascii():
        decoder = codecs.getincrementaldecoder("utf-8")()
        view = memoryview(raw)
        try:
            for start in range(0, len(raw), _SCAN_CHUNK):
                decoder.decode(view[start:start + _SCAN_CHUNK])
            decoder.decode(b"", final=True)
        except UnicodeDecodeError:
            return False
    return not has_huge_number(raw)


def has_huge_number(raw: bytes) -> bool:
    """``raw`` holds a run of more than 4300 digits (scanned a megabyte at a time, overlapping)."""
    overlap = len(_HUGE_DIGITS)
    return any(_HUGE_DIGITS in raw[start:start + _SCAN_CHUNK + overlap].translate(_DIGITS_TO_ZERO)
               for start in range(0, len(raw), _SCAN_CHUNK))


def decode_tasks_fast(raw: bytes, validated: bool = False) -> TaskSet | None:
    """The task document in ``raw`` when msgspec accepts all of it as valid; None to ask the standard library
    (see :func:`task_parts_fast`)."""
    parts = task_parts_fast(raw, validated)
    return TaskSet.from_text(*parts) if parts is not None else None  # None for a duplicate id: see above


def task_parts_fast(raw: bytes, validated: bool = False) -> tuple[bytes, bytearray, array] | None:
    """The task document in ``raw`` as its ids one a line, its payloads end to end and their offsets (what
    :meth:`TaskSet.from_text` takes: the ids not yet checked for repeats) when msgspec accepts all of it as
    valid; None to ask the standard library, which names the first problem.

    ``validated``: these bytes passed validation before (validate_inputs' summary holds their digest), so
    the checks that only the standard library's reading could fail are skipped. Those are the payloads'
    (:func:`plain_json`, after the decoding, on the payloads alone): msgspec passes over them unread, and
    checks everything else itself (:func:`fast_document`).

    The list of tasks is read as raw elements first, then :data:`TASK_CHUNK` of them at a time
    as records (one call each, not one a task: three times faster), each chunk's elements freed
    once read, and each chunk's ids kept as text, so the document's million small objects never exist
    at once (a third less peak memory than one pass, and no string object per id).
    """
    document = fast_document(raw, _TASK_DOCUMENT)
    if document is None or not 0 < len(document.tasks) <= MAX_TASKS:
        return None
    elements = document.tasks
    del document
    count = len(elements)
    id_text = bytearray()
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
        ids = [task.id for task in tasks]
        if not (validated or valid_ids(ids)):
            return None
        id_text += "\n".join(ids).encode()
        id_text += b"\n"
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
    if not (validated or plain_json(payloads)):
        return None
    return bytes(id_text), payloads, offsets


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
    parts = task_parts_fast(raw, validated=digest == validated_sha256)
    if parts is None:
        return decode_tasks(raw, what, str(path)), digest  # the standard library's verdict
    del raw  # its room serves the sort of the ids: the peak is the document's or the task set's, not both
    tasks = TaskSet.from_text(*parts)
    if tasks is None:  # an id twice: the standard library names the first, in the document as it is now
        raw = read_bytes(path, what)
        return decode_tasks(raw, what, str(path)), hashlib.sha256(raw).hexdigest()
    return tasks, digest


#: The first line of a compact task set (:func:`write_compact`); the second is its JSON header.
COMPACT_MAGIC = b"allocstack compact task set 2\n"
#: The parts of a compact task set after its header, in the file's order, with their arrays' type codes
#: (None: bytes).
_COMPACT_PARTS = (("ids", None), ("idStarts", "I"), ("order", "I"), ("sortedIds", None), ("sortedStarts", "I"),
                  ("payloads", None), ("offsets", "Q"))


def write_compact(path: str | os.PathLike, tasks: TaskSet, input_sha256: str) -> str:
    """Write ``tasks`` (validated, from the document whose SHA-256 is ``input_sha256``) as a compact task set,
    atomically; its SHA-256 (hex).

    :data:`COMPACT_MAGIC`, one JSON line (the count, the document's digest, the byte order and the byte
    length of each part), then the task set's buffers as they are in memory (:class:`TaskSet`): the ids
    one a line, where each starts (``array("I")``), the positions by ascending id and the ids in that
    order, where each starts (none of these three when the ids ascend), the payloads end to end and their
    offsets (``array("Q")``).
    :func:`read_compact` reads them back as they are: no decoding, no sorting (a million tasks in a tenth
    of a second).

    :raises AllocstackError: ``storage`` or ``io`` when it cannot be written.
    """
    unsorted = tasks.order is not None
    none = array("I")
    parts = [memoryview(part).cast("B") for part in (
        tasks._id_text, tasks._id_starts, tasks.order or none, tasks._sorted_text if unsorted else b"",
        tasks._sorted_starts if unsorted else none, tasks._payloads, tasks._offsets)]
    header = {"count": len(tasks), "inputSha256": input_sha256, "byteorder": sys.byteorder,
              **{f"{name}Bytes": part.nbytes for (name, _), part in zip(_COMPACT_PARTS, parts, strict=True)},
              "itemBytes": {code: array(code).itemsize for _, code in _COMPACT_PARTS if code}}
    return atomic_write_chunks(path, (COMPACT_MAGIC, json.dumps(header).encode("ascii") + b"\n", *parts), 0o644)


def read_compact(path: str | os.PathLike, sha256: str, input_sha256: str) -> TaskSet | None:
    """The task set :func:`write_compact` wrote to ``path``, when the file's SHA-256 is ``sha256`` and it is
    the set of the document whose digest is ``input_sha256``; None otherwise (unreadable, another file).

    Read a part at a time into its own buffer (never the whole file at once, then copied), hashed on the way.
    """
    try:
        with open(path, "rb") as handle:
            digest = hashlib.sha256(magic := handle.read(len(COMPACT_MAGIC)))
            line = handle.readline(1 << 16)
            digest.update(line)
            header = json.loads(line) if magic == COMPACT_MAGIC else None
            if not (isinstance(header, dict) and header.get("inputSha256") == input_sha256
                    and header.get("byteorder") == sys.byteorder
                    and header.get("itemBytes") == {code: array(code).itemsize for _, code in _COMPACT_PARTS if code}):
                return None
            parts = []
            for name, code in _COMPACT_PARTS:
                size = header[f"{name}Bytes"]
                data = handle.read(size) if type(size) is int and size >= 0 else b""
                if len(data) != size:
                    return None
                digest.update(data)
                if code is not None:
                    data, items = array(code), data
                    data.frombytes(items)
                    del items
                parts.append(data)
            if handle.read(1) or digest.hexdigest() != sha256:
                return None
    except (OSError, ValueError, KeyError):
        return None
    id_text, id_starts, order, sorted_text, sorted_starts, payloads, offsets = parts
    count = header["count"]
    if (len(id_starts) != count + 1 or len(offsets) != count + 1 or len(order) not in (0, count)
            or len(sorted_starts) != (len(order) and count + 1) or id_starts[-1] != len(id_text)
            or offsets[-1] != len(payloads) or (order and sorted_starts[-1] != len(sorted_text))):
        return None
    # As validation wrote them (the file's digest is the one it recorded): taken as they are.
    return TaskSet(id_text, id_starts, payloads, offsets, order or None, (sorted_text, sorted_starts) if order else None)


@dataclass(frozen=True, slots=True)
class ExpectedResults:
    """The expected results in task order: each task's output and its SHA-256, as two lists
    (``outputs[i]`` is task ``i``'s; no object per result: a million in two lists)."""

    outputs: list[str]
    digests: list[str]

    def __len__(self) -> int:
        return len(self.outputs)


def in_task_order(tasks: TaskSet, ids: list[str], values: list[list[Any]]) -> list[list[Any]] | None:
    """``values`` (lists by the positions of ``ids``) rearranged into the tasks' order, when ``ids`` are
    the task ids, each once, in any order; else None."""
    if ids == tasks.id_list():
        return values  # in task order already (make_tasks.py's): each task once
    sorted_ids = sort_ids(ids)
    if sorted_ids is None or len(ids) != len(tasks) or sorted_ids[1] != tasks.ids_in_id_order():
        return None  # ids are task ids (so valid ones), each once
    order = sorted_ids[0]
    ranks = range(len(ids)) if order is None else order  # the index in ids of the r-th id by id
    task_positions = range(len(ids)) if tasks.order is None else tasks.order
    arranged = []
    for column in values:
        placed: list[Any] = [None] * len(column)
        for position, index in zip(task_positions, ranks, strict=True):
            placed[position] = column[index]
        arranged.append(placed)
    return arranged


def _expected_fast(raw: bytes, tasks: TaskSet) -> ExpectedResults | None:
    """The expected document when msgspec accepts all of it as valid; None to ask the standard library."""
    document = fast_document(raw, _EXPECTED_DOCUMENT)
    if document is None or len(document.results) != len(tasks):
        return None
    entries = document.results
    arranged = in_task_order(tasks, [entry.taskId for entry in entries],
                             [[entry.output for entry in entries], [entry.sha256 for entry in entries]])
    del document, entries
    if arranged is None:
        return None
    outputs, digests = arranged
    if sha256_texts(outputs) != digests:  # a digest of an output is 64 lowercase hex digits
        return None
    return ExpectedResults(outputs, digests)


def ids_sha256(ids: list[str]) -> str:
    """The SHA-256 of task ids one a line (valid ids hold no newline: equal digests, equal lists)."""
    return hashlib.sha256("\n".join(ids).encode("utf-8")).hexdigest()


def listing_sha256(ids_digest: str, outputs: bytes, digests: str) -> str:
    """The SHA-256 of a list of results: their task ids' :func:`ids_sha256` (hex), the SHA-256 of their outputs'
    JSON text as results.json writes them (``encode_basestring_ascii``) end to end, then their digests one a line.
    Equal digests, equal lists (a JSON string ends where it ends, and no digest holds a newline).

    validate_inputs records it for the expected results by ascending task id (results.json's order:
    :func:`expected_listing_sha256`); verification compares results.json's results with them through it,
    without reading the expected document again, and without decoding an output (results.json holds their
    JSON text).
    """
    text = f"{ids_digest}\n{hashlib.sha256(outputs).hexdigest()}\n{digests}"
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def listing_sha256_of_chunks(ids_digest: str, outputs: Iterable[bytes], digests: Iterable[str]) -> str:
    """:func:`listing_sha256` of its parts a chunk at a time: ``outputs`` (their JSON text end to end, in
    chunks), then ``digests`` (chunks of the digests one a line: each chunk without a newline at its ends),
    each hashed as it comes (no text of all the outputs or digests at once: at a million results that was
    300 MB of memory made and dropped, a third of validation's page faults)."""
    text = hashlib.sha256()
    for chunk in outputs:
        text.update(chunk)
    listing = hashlib.sha256(f"{ids_digest}\n{text.hexdigest()}\n".encode("ascii"))
    separator = b""
    for chunk in digests:
        if chunk:
            listing.update(separator)
            listing.update(chunk.encode("utf-8"))
            separator = b"\n"
    return listing.hexdigest()


#: Results hashed at a time by :func:`_listing_of`.
LISTING_CHUNK = 1 << 14


def _listing_of(ids_digest: str, outputs: list[str], digests: list[str], order: array | None) -> str:
    """:func:`listing_sha256` of results at positions (``outputs``, ``digests``) in the order ``order``,
    :data:`LISTING_CHUNK` of them at a time (:func:`listing_sha256_of_chunks`)."""
    bounds = [(start, min(start + LISTING_CHUNK, len(outputs))) for start in range(0, len(outputs), LISTING_CHUNK)]

    def ranked(values: list[str], start: int, end: int) -> list[str]:
        return values[start:end] if order is None else list(map(values.__getitem__, order[start:end]))

    return listing_sha256_of_chunks(
        ids_digest, ("".join(map(encode_basestring_ascii, ranked(outputs, *bound))).encode("ascii") for bound in bounds),
        ("\n".join(ranked(digests, *bound)) for bound in bounds))


def expected_listing_sha256(tasks: TaskSet, expected: ExpectedResults) -> str:
    """:func:`listing_sha256` of ``expected`` (the results of ``tasks``) by ascending task id."""
    return _listing_of(tasks.sorted_ids_sha256(), expected.outputs, expected.digests, tasks.order)


def task_order_message(tasks: TaskSet) -> bytes:
    """What :func:`expected_facts` may be told of the task set (validate_inputs sends it to its child): the
    :func:`ids_sha256` of the ids in task order and by ascending id, then the positions by ascending id
    (none when the ids ascend)."""
    return (tasks.ids_sha256() + tasks.sorted_ids_sha256()).encode("ascii") + (tasks.order or b"")


def expected_facts(path: str, task_order: Callable[[], bytes] | None = None) -> list[Any] | None:
    """The expected document at ``path`` checked on its own, without the task set: when msgspec reads it, no
    task id repeats and each digest is its output's, ``[its result count, the ids_sha256 of its task ids by
    ascending id, the SHA-256 of its bytes, the listing_sha256 of its results by ascending id]``; None
    otherwise, or when it cannot be read.

    The task set then completes :func:`_expected_fast`'s verdict in two comparisons, whatever the order of
    either document (:func:`expected_digests_from_facts`), so this half can run in another process while
    the task document is read (validate_inputs: 1M results in about three seconds).

    :param task_order: returns :func:`task_order_message` (or b"": none): when this document lists its
        results in the task order, the tasks' sorted order is theirs and need not be found again here.
    """
    try:
        raw = read_bytes(path, "expected")
    except AllocstackError:
        return None
    document = fast_document(raw, _EXPECTED_DOCUMENT)
    if document is None:
        return None
    entries = document.results
    ids = [entry.taskId for entry in entries]
    outputs = [entry.output for entry in entries]
    digests = [entry.sha256 for entry in entries]
    del document, entries
    if sha256_texts(outputs) != digests:
        return None
    message = task_order() if task_order is not None else b""
    if message[:64] == ids_sha256(ids).encode("ascii"):  # the tasks' order: their sorted order is this one's
        ids_digest, order = message[64:128].decode("ascii"), array("I")
        order.frombytes(message[128:])
        order = order or None
    else:
        sorted_ids = sort_ids(ids)
        if sorted_ids is None:
            return None  # a task id twice
        order, ids_digest = sorted_ids[0], ids_sha256(sorted_ids[1])
    return [len(ids), ids_digest, hashlib.sha256(raw).hexdigest(), _listing_of(ids_digest, outputs, digests, order)]


def expected_digests_from_facts(facts: Any, tasks: TaskSet) -> tuple[str, str] | None:
    """The expected document's SHA-256 and :func:`expected_listing_sha256` when its :func:`expected_facts`
    prove it valid for ``tasks`` (one result per task, in any order, as :func:`_expected_fast` accepts it);
    None to validate it again (:func:`load_expected_and_digest`, which names any problem)."""
    if (isinstance(facts, list) and len(facts) == 4 and facts[0] == len(tasks)
            and facts[1] == tasks.sorted_ids_sha256() and isinstance(facts[2], str) and isinstance(facts[3], str)):
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
    ids = tasks.id_list()
    missing = [task_id for task_id in ids if task_id not in expected]
    _need(not missing, what, f"no expected result for task {missing[0]!r}{mismatch_hint}" if missing else "")
    in_order = [expected[task_id] for task_id in ids]
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
    documents it validated, expectedListingSha256 the expected results' :func:`listing_sha256` by ascending task id
    ({} without a summary, or one that cannot be read: whoever needs the summary names that problem in its turn)."""
    try:
        document = loads_bytes(summary.read_bytes()) if summary is not None else None
    except (OSError, ValueError, RecursionError):
        return {}
    return document if isinstance(document, dict) else {}
