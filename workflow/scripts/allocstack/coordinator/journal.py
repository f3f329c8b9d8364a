"""The append-only results journal: acknowledged means durable.

The first line is a header naming the input's SHA-256; every other line is one
accepted result. Results that arrive while an fsync is in progress are written
and synced together (group commit), so the cost of durability is one fsync per
batch, not per result. When fewer appends wait than there are submitters
(``group``: the expected workers), a flush first waits a bounded, tiny window
(``window`` seconds, at most the last fsync's duration) for the others, so that
workers submitting one result at a time share an fsync instead of taking turns.
On uvloop's event loop, whose timers count whole milliseconds, the window is
rounded up to the next one (a shorter timer would end at once, sharing nothing).
On start the journal is replayed: a torn last line (a crash mid-write) is cut
off; a journal of a different input, or one another program produced (its header's
identity, :mod:`allocstack.common.identity`), is set aside (:func:`produced_otherwise`).

A write that fails (a full disk, an exhausted quota) is cut back off the file, so
the journal stays a sequence of whole lines; the journal then refuses every later
append with the same ``storage`` (or ``io``) error: nothing is acknowledged that
is not durable, and a rerun resumes from the lines before the fault.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import queue
import threading
import time
from collections.abc import Callable, Mapping
from json.encoder import encode_basestring_ascii
from pathlib import Path
from typing import Any

from .. import SCHEMA_VERSION
from ..common import identity as identities
from ..common.errors import AllocstackError
from ..common.jsonio import fsync_dir
from ..common.storage import write_error
from . import eventloop

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


def header_of(path: Path) -> dict[str, Any] | None:
    """The journal's first line (its header) as written, or None when there is no readable one."""
    try:
        with open(path, "rb") as handle:
            first = handle.readline()
    except OSError:
        return None
    try:
        header = json.loads(first)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    return header if isinstance(header, dict) and header.get("kind") == "header" else None


def produced_otherwise(path: Path, input_sha256: str, identity: Mapping[str, Any] | None) -> str | None:
    """Why the journal at ``path`` must not be resumed by a run of ``identity`` (None: it may be, or there is none).

    Only its header is read (its first line): a million results cost nothing here.
    """
    if identity is None or not path.exists():
        return None
    header = header_of(path)
    if header is None or header.get("inputSha256") != input_sha256:
        return None  # replay sets it aside as another input's, or names a corrupt line
    before = header.get(identities.KEY)
    if identities.digest_of(before) == identities.digest_of(identity):
        return None
    return identities.what_changed(before, identity)


def acknowledged(path: Path) -> int | None:
    """How many results the journal at ``path`` holds (its whole lines after the header); None without one.

    Read in blocks, nothing decoded: what an interrupted run's summary says was done.
    """
    lines = 0
    try:
        with open(path, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                lines += block.count(b"\n")
    except OSError:
        return None
    return max(0, lines - 1)


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
    ``window``: see the module's docstring (``window=0``: flush at once). ``identity``: what produces the
    results (:func:`allocstack.common.identity.identity`), written into a fresh journal's header.

    :raises AllocstackError: ``storage`` or ``io`` when a fresh journal's header cannot be written.
    """

    def __init__(self, path: Path, input_sha256: str, write: Callable[[int, bytes], int] = os.write,
                 *, group: int = 1, window: float = MAX_WINDOW, identity: Mapping[str, Any] | None = None) -> None:
        self.path = path
        self._write = write
        self.group = group
        self.window = min(window, MAX_WINDOW)
        self._last_sync = window
        fresh = not path.exists()
        try:
            self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        except OSError as exc:
            raise write_error("journal", path, exc) from exc
        self._size = os.fstat(self._fd).st_size
        self.failed: AllocstackError | None = None
        if fresh:
            header = {"kind": "header", "schemaVersion": SCHEMA_VERSION, "inputSha256": input_sha256}
            if identity is not None:  # what produces its results (a rerun of another program starts afresh)
                header[identities.KEY] = dict(identity)
            try:
                self._write_and_sync(_line(header))
                fsync_dir(path.parent)
            except OSError as exc:
                os.close(self._fd)
                path.unlink(missing_ok=True)
                raise write_error("journal", path, exc) from exc
        self._buffer: list[bytes] = []
        self._pending_records = 0
        self._waiters: list[asyncio.Future[None]] = []
        self._flushing = False
        self._flusher: asyncio.Task[None] | None = None  # held: the loop keeps only weak references to tasks
        self._gathering: asyncio.Future[None] | None = None  # set while a flush waits for more appends
        #: The thread that writes and syncs (started at the first flush) and what it is handed (see
        #: :func:`_sync_forever`); None stops it.
        self._syncer: threading.Thread | None = None
        self._to_sync: queue.SimpleQueue[_SyncItem | None] = queue.SimpleQueue()
        self.fsyncs = 0
        self.records = 0

    async def append(self, results: list[dict[str, Any]]) -> None:
        """Append ``results`` (records without ``kind``); return once they are on disk (fsync'd).

        :raises AllocstackError: see :meth:`append_lines`.
        """
        await self.append_lines([_line({"kind": "result", **r}) for r in results])

    async def append_lines(self, lines: list[bytes], records: int | None = None) -> None:
        """Append whole journal lines (see :func:`result_line`; an item may hold several lines, ``records``
        in all); return once they are on disk (fsync'd). The journal takes the items: ``lines`` is emptied, so
        they are held once (joined for the write), not also by each caller while it waits for the fsync.

        :raises AllocstackError: ``storage`` (no room) or ``io``: then none of ``lines`` is durable,
            and every later append raises the same error.
        """
        if not lines:
            return
        if self.failed is not None:
            raise self.failed
        loop = asyncio.get_running_loop()
        self._buffer.extend(lines)
        lines.clear()
        self._pending_records += len(lines) if records is None else records
        waiter: asyncio.Future[None] = loop.create_future()
        self._waiters.append(waiter)
        gathering = self._gathering
        if gathering is not None and len(self._waiters) >= self.group and not gathering.done():
            gathering.set_result(None)  # everyone expected is in: flush now
        if not self._flushing:
            self._flushing = True
            self._flusher = loop.create_task(self._flush_loop())
        await waiter

    async def _gather(self, loop: asyncio.AbstractEventLoop) -> None:
        """Wait up to the window (and no longer than the last fsync took) for ``group`` appends."""
        window = min(self.window, self._last_sync)
        if len(self._waiters) >= self.group or window <= 0:
            return
        if eventloop.loop_name() == "uvloop":  # its timers count whole milliseconds: 0.3 ms would be none
            window = math.ceil(window * 1000) / 1000
        self._gathering = gathering = loop.create_future()
        timer = loop.call_later(window, lambda: gathering.done() or gathering.set_result(None))
        try:
            await gathering
        finally:
            timer.cancel()
            self._gathering = None

    async def _flush_loop(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while self._buffer:
                await self._gather(loop)
                data, waiters = b"".join(self._buffer), self._waiters
                count = self._pending_records
                self._buffer, self._waiters, self._pending_records = [], [], 0
                try:
                    if self.failed is not None:
                        raise self.failed
                    started = time.monotonic()
                    await self._sync(loop, data)
                    self._last_sync = time.monotonic() - started
                except OSError as exc:
                    self.failed = write_error("journal", self.path, exc)
                except AllocstackError:
                    pass
                if self.failed is not None:
                    for waiter in waiters:
                        if not waiter.done():
                            waiter.set_exception(self.failed)
                    continue
                self.fsyncs += 1
                self.records += count
                for waiter in waiters:
                    if not waiter.done():
                        waiter.set_result(None)
        finally:
            self._flushing = False

    def _sync(self, loop: asyncio.AbstractEventLoop, data: bytes) -> asyncio.Future[None]:
        """:meth:`_write_and_sync` ``data`` on the journal's own thread; the future settles when it is done.

        One queue put and one wake-up of the loop per flush: ``run_in_executor`` costs twice the CPU
        (a ``concurrent.futures`` future, its condition and callbacks), once per flush: at batch 1, per result.
        """
        if self._syncer is None:
            self._syncer = threading.Thread(target=_sync_forever, args=(self._to_sync,), name="journal-sync",
                                            daemon=True)
            self._syncer.start()
        done: asyncio.Future[None] = loop.create_future()
        self._to_sync.put((self._write_and_sync, data, loop, done))
        return done

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
        return self._flushing or bool(self._buffer)

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


_SyncItem = tuple[Callable[[bytes], None], bytes, asyncio.AbstractEventLoop, "asyncio.Future[None]"]


def _sync_forever(items: queue.SimpleQueue[_SyncItem | None]) -> None:
    """A journal's thread: run each ``(write_and_sync, data, loop, future)`` it is handed and settle the future on
    its loop, until None. It holds no journal between items (an unclosed journal can still be collected)."""
    while (item := items.get()) is not None:
        write_and_sync, data, loop, done = item
        error: Exception | None = None
        try:
            write_and_sync(data)
        except Exception as exc:  # noqa: BLE001  (an OSError, or a bug: either way the flush must hear of it)
            error = exc
        del item, write_and_sync, data
        try:
            loop.call_soon_threadsafe(_settle, done, error)
        except RuntimeError:  # the loop was closed meanwhile: nobody waits for this flush any more
            pass


def _settle(future: asyncio.Future[None], error: BaseException | None) -> None:
    """Give ``future`` its outcome (on the loop's thread), unless it was cancelled meanwhile."""
    if future.done():
        return
    if error is None:
        future.set_result(None)
    else:
        future.set_exception(error)
