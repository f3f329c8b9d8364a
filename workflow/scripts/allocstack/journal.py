"""The append-only results journal: acknowledged means durable.

The first line is a header naming the input's SHA-256; every other line is one
accepted result. Results that arrive while an fsync is in progress are written
and synced together (group commit), so the cost of durability is one fsync per
batch, not per result. When fewer appends wait than there are submitters
(``group``: the expected workers), a flush first waits a bounded, tiny window
(``window`` seconds, at most what the last flush took: the hand-off to the journal's
thread and the fsync) for the others, so that workers submitting one result at a
time share an fsync instead of taking turns. The journal's own thread gathers,
writes and fsyncs; the event loop hands it each append in one queue put and is
woken once per fsync. On start the journal is replayed: a torn last line (a
crash mid-write) is cut off; a journal of a different input is set aside.

A write that fails (a full disk, an exhausted quota) is cut back off the file, so
the journal stays a sequence of whole lines; the journal then refuses every later
append with the same ``storage`` (or ``io``) error: nothing is acknowledged that
is not durable, and a rerun resumes from the lines before the fault.
"""

from __future__ import annotations

import asyncio
import json
import os
import queue
import threading
import time
from collections.abc import Callable
from json.encoder import encode_basestring_ascii
from pathlib import Path
from typing import Any

from . import SCHEMA_VERSION
from .errors import AllocstackError
from .jsonio import fsync_dir
from .storage import write_error

#: How long a flush may wait for more appends at most (seconds), whatever the fsync costs.
MAX_WINDOW = 0.002


def _line(record: dict[str, Any]) -> bytes:
    return (json.dumps(record, separators=(",", ":"), sort_keys=True) + "\n").encode("utf-8")


def result_line(task_id: str, worker: str, output: str, sha256: str) -> bytes:
    """A result's journal line: the bytes of ``_line({"kind": "result", ...})`` without a dict (tested).

    Ids and digests need no escaping (their patterns allow none of JSON's special characters).
    """
    return b'{"kind":"result","output":%s,"sha256":"%s","taskId":"%s","workerId":"%s"}\n' % (
        encode_basestring_ascii(output).encode("ascii"), sha256.encode(), task_id.encode(), worker.encode())


def result_lines(task_ids: list[str], worker: str, escaped: list[str], sha256: list[str]) -> bytes:
    """The journal lines of a batch of results by one worker: the bytes of :func:`result_line` for each (tested),
    in one join over the batch (the constant pieces between the values repeat).

    :param escaped: the outputs as JSON text (``encode_basestring_ascii``).
    :raises ValueError: when the three lists differ in length.
    """
    count = len(task_ids)
    if len(escaped) != count or len(sha256) != count:
        raise ValueError(f"{count} task ids, {len(escaped)} outputs, {len(sha256)} digests")
    parts = ['{"kind":"result","output":', "", ',"sha256":"', "", '","taskId":"', "",
             '","workerId":"' + worker + '"}\n'] * count
    parts[1::7], parts[3::7], parts[5::7] = escaped, sha256, task_ids
    return "".join(parts).encode("ascii")


def replay(path: Path, input_sha256: str) -> tuple[list[dict[str, Any]], str]:
    """Read the journal at ``path`` for an input with digest ``input_sha256``.

    :returns: (results, note). A missing journal gives ``([], "new")``; a journal of
        another input is renamed aside (``"stale"``); a torn last line is truncated.
    :raises AllocstackError: ``integrity`` when a line other than the last is corrupt.
    """
    if not path.exists():
        return [], "new"
    raw = path.read_bytes()
    # Every record is written as one line ending in "\n", so bytes after the last
    # newline are a write the crash cut short. It was never acknowledged (the ack
    # follows the fsync), so cutting it loses nothing.
    good_bytes = raw.rfind(b"\n") + 1
    records: list[dict[str, Any]] = []
    for number, line in enumerate(raw[:good_bytes].splitlines(), start=1):
        try:
            records.append(json.loads(line))
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise AllocstackError("integrity", f"journal {path} line {number} is corrupt") from exc
    header = records[0] if records else None
    if not header or header.get("kind") != "header" or header.get("inputSha256") != input_sha256:
        aside = path.with_name(f"{path.name}.stale-{int(time.time())}")
        os.replace(path, aside)
        return [], f"stale (moved to {aside.name})"
    if good_bytes < len(raw):
        with open(path, "r+b") as handle:
            handle.truncate(good_bytes)
            os.fsync(handle.fileno())
    results = [r for r in records[1:] if r.get("kind") == "result"]
    for record in results:
        record.pop("kind", None)
    note = f"resumed {len(results)} results" + (" (torn last line cut)" if good_bytes < len(raw) else "")
    return results, note


class Journal:
    """Durable, group-committed appends to the journal file (one writer: the coordinator).

    ``write`` is :func:`os.write` (a test passes one that fails like a full disk). ``group`` and
    ``window``: see the module's docstring (``window=0``: flush at once).

    :raises AllocstackError: ``storage`` or ``io`` when a fresh journal's header cannot be written.
    """

    def __init__(self, path: Path, input_sha256: str, write: Callable[[int, bytes], int] = os.write,
                 *, group: int = 1, window: float = MAX_WINDOW) -> None:
        self.path = path
        self._write = write
        self.group = group
        self.window = min(window, MAX_WINDOW)
        #: What the last flush took as its appenders saw it (the hand-off to this thread and the fsync), and
        #: the current flush's hand-off: a window never waits longer than that for more appends.
        self._last_sync = window
        self._handoff = 0.0
        fresh = not path.exists()
        try:
            self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        except OSError as exc:
            raise write_error("journal", path, exc) from exc
        self._size = os.fstat(self._fd).st_size
        self.failed: AllocstackError | None = None
        if fresh:
            header = {"kind": "header", "schemaVersion": SCHEMA_VERSION, "inputSha256": input_sha256}
            try:
                self._write_and_sync(_line(header))
                fsync_dir(path.parent)
            except OSError as exc:
                os.close(self._fd)
                path.unlink(missing_ok=True)
                raise write_error("journal", path, exc) from exc
        #: Appends handed to the journal's thread, and appends it has written (or failed): see :attr:`busy`.
        self._handed = self._finished = 0
        #: The thread that gathers, writes and syncs (started at the first append) and what it is handed
        #: (see :func:`_sync_forever`); None stops it.
        self._syncer: threading.Thread | None = None
        self._to_sync: queue.SimpleQueue[_Append | None] = queue.SimpleQueue()
        self.fsyncs = 0
        self.records = 0

    async def append(self, results: list[dict[str, Any]]) -> None:
        """Append ``results`` (records without ``kind``); return once they are on disk (fsync'd).

        :raises AllocstackError: see :meth:`append_lines`.
        """
        await self.append_lines([_line({"kind": "result", **r}) for r in results])

    async def append_lines(self, lines: list[bytes], records: int | None = None) -> None:
        """Append whole journal lines (see :func:`result_line`; an item may hold several lines, ``records``
        in all); return once they are on disk (fsync'd).

        The lines go to the journal's own thread in one queue put; the thread gathers what the other
        submitters append meanwhile (the window), writes and fsyncs it all at once, and wakes this
        loop once per fsync. The window is timed there, not by the loop: a loop whose timers count
        whole milliseconds (uvloop's) would otherwise end a window of a fraction of one at once.

        :raises AllocstackError: ``storage`` (no room) or ``io``: then none of ``lines`` is durable,
            and every later append raises the same error.
        """
        if not lines:
            return
        if self.failed is not None:
            raise self.failed
        if self._syncer is None:
            self._syncer = threading.Thread(target=_sync_forever, args=(self._to_sync,), name="journal-sync",
                                            daemon=True)
            self._syncer.start()
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()
        self._handed += 1
        self._to_sync.put((self, lines[0] if len(lines) == 1 else b"".join(lines),
                           len(lines) if records is None else records, loop, done, time.monotonic()))
        await done

    def _gathered(self, first: _Append, items: queue.SimpleQueue[_Append | None]) -> tuple[list[_Append], Any]:
        """On the journal's thread: ``first`` and whatever else is queued; when that is fewer appends than
        ``group``, also those that arrive within the window (no longer than the last flush took).

        :returns: (the appends to write together, the next item taken from the queue that is not one of
            them: None to stop, or ``_NOTHING``).
        """
        batch = [first]
        self._handoff = time.monotonic() - first[5]
        window = min(self.window, self._last_sync)
        deadline = None
        while True:
            try:
                item = items.get_nowait()
            except queue.Empty:
                if len(batch) >= self.group or window <= 0:
                    return batch, _NOTHING
                now = time.monotonic()
                if deadline is None:
                    deadline = now + window
                if now >= deadline:
                    return batch, _NOTHING
                try:
                    item = items.get(timeout=deadline - now)
                except queue.Empty:
                    return batch, _NOTHING
            if item is None or item[0] is not self:
                return batch, item
            batch.append(item)

    def _flush(self, batch: list[_Append]) -> AllocstackError | None:
        """On the journal's thread: write and fsync ``batch``; None when it is durable, else the journal's
        error (then, and from then on, nothing is written)."""
        try:
            if self.failed is None:
                started = time.monotonic()
                self._write_and_sync(batch[0][1] if len(batch) == 1 else b"".join(item[1] for item in batch))
                self._last_sync = time.monotonic() - started + self._handoff
                self.records += sum(item[2] for item in batch)
                self.fsyncs += 1
        except OSError as exc:
            self.failed = write_error("journal", self.path, exc)
        finally:
            self._finished += len(batch)
        return self.failed

    def _write_and_sync(self, data: bytes) -> None:
        """Write and fsync ``data``; on failure cut the file back to its last whole line and re-raise."""
        try:
            view = memoryview(data)
            while view:
                written = self._write(self._fd, view)
                view = view[written:]
            os.fsync(self._fd)
        except OSError:
            try:
                os.ftruncate(self._fd, self._size)
                os.fsync(self._fd)
            except OSError:
                pass  # replay cuts a torn last line anyway
            raise
        self._size += len(data)

    @property
    def busy(self) -> bool:
        """True while appended results are still being written and synced."""
        return self._finished != self._handed

    async def drain(self) -> None:
        """Wait until everything appended so far is durable."""
        while self.busy:
            await asyncio.sleep(0.005)

    def close(self) -> None:
        if self._syncer is not None:
            self._to_sync.put(None)
            self._syncer.join()
            self._syncer = None
        os.close(self._fd)


#: What an append hands the journal's thread: (the journal, its bytes, its records, its loop, its future, when).
_Append = tuple[Journal, bytes, int, asyncio.AbstractEventLoop, "asyncio.Future[None]", float]
#: No item in hand (None stops the thread).
_NOTHING: Any = object()


def _sync_forever(items: queue.SimpleQueue[_Append | None]) -> None:
    """A journal's thread: take the appends it is handed, gather (:meth:`Journal._gathered`), write and fsync
    them (:meth:`Journal._flush`) and settle their futures on their loops, one wake-up of each loop per
    fsync, until None. It holds no journal between items (an unclosed journal can still be collected)."""
    item = items.get()
    while item is not None:
        journal = item[0]
        batch, item = journal._gathered(item, items)
        try:
            error: BaseException | None = journal._flush(batch)
        except Exception as exc:  # noqa: BLE001  (a bug: the appenders must hear of it, the thread must go on)
            error = exc
        by_loop: dict[asyncio.AbstractEventLoop, list[asyncio.Future[None]]] = {}
        for _, _, _, loop, done, _ in batch:
            by_loop.setdefault(loop, []).append(done)
        del batch, journal
        for loop, futures in by_loop.items():
            try:
                loop.call_soon_threadsafe(_settle, futures, error)
            except RuntimeError:  # the loop was closed meanwhile: nobody waits for this flush any more
                pass
        del by_loop
        if item is _NOTHING:
            item = items.get()


def _settle(futures: list[asyncio.Future[None]], error: BaseException | None) -> None:
    """Give each of ``futures`` its outcome (on the loop's thread), unless it was cancelled meanwhile."""
    for future in futures:
        if future.done():
            continue
        if error is None:
            future.set_result(None)
        else:
            future.set_exception(error)
