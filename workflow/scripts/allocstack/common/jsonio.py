"""JSON documents on disk: atomic writes, strict reads, digests."""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import stat
import tempfile
from collections.abc import Iterable, Iterator
from json.encoder import encode_basestring_ascii
from pathlib import Path
from typing import Any

from .errors import AllocstackError
from .storage import write_error


def __getattr__(name: str) -> Any:
    """``jsonio.msgspec``: the msgspec module, or None without it (an image built before msgspec was pinned:
    the standard library alone, the same results, slower). Imported on first use, not with this module: a
    component that never decodes a document with it (launch.py, the readiness gate, collection, the end-of-run
    summary) does not pay its import (~13 ms of CPU each). Tests set ``jsonio.msgspec = None``."""
    if name != "msgspec":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    try:
        import msgspec
    except ImportError:
        msgspec = None
    globals()["msgspec"] = msgspec
    return msgspec


def _msgspec() -> Any:
    """:func:`__getattr__`'s ``msgspec`` from inside this module (a global set by a test wins)."""
    return globals()["msgspec"] if "msgspec" in globals() else __getattr__("msgspec")

PRIVATE_FILE = 0o600


def atomic_write_text(path: str | os.PathLike, text: str, mode: int = PRIVATE_FILE) -> None:
    """Write ``text`` to ``path`` so readers see the old file or the whole new one (see :func:`atomic_write_chunks`)."""
    atomic_write_chunks(path, (text.encode("utf-8"),), mode)


def atomic_write_chunks(path: str | os.PathLike, chunks: Iterable[bytes | memoryview], mode: int = PRIVATE_FILE) -> str:
    """Write the concatenated ``chunks`` to ``path`` so readers see the old file or the whole new one.

    Temp file in the same directory, fsync, chmod, rename, fsync of the directory. The chunks
    are written as they come, so a large document never exists as one string in memory.
    On any failure the temp file is removed and ``path`` is left as it was.

    :returns: the SHA-256 of what was written (hex), computed on the way.
    :raises AllocstackError: ``storage`` when the disk or quota is full, ``io`` for another write error.
    """
    staged = StagedWrite(path, chunks, mode)
    digest = staged.write()
    staged.commit()
    return digest


class StagedWrite:
    """:func:`atomic_write_chunks` in two steps: :meth:`write` writes the temp file (fsync'd, in its mode),
    e.g. in a thread while what it holds is still being checked; then :meth:`commit` renames it into
    place, or :meth:`discard` removes it. Readers of ``path`` see the old file or the whole new one.
    """

    def __init__(self, path: str | os.PathLike, chunks: Iterable[bytes | memoryview], mode: int = PRIVATE_FILE) -> None:
        self.target = Path(path)
        self.chunks = chunks
        self.mode = mode
        self.tmp: str | None = None

    def write(self) -> str:
        """The temp file, written whole; the SHA-256 (hex) of what was written.

        :raises AllocstackError: as :func:`atomic_write_chunks` (the temp file removed).
        """
        target = self.target
        try:
            fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
        except OSError as exc:
            raise write_error("file", target, exc) from exc
        self.tmp = tmp
        digest = hashlib.sha256()
        try:
            with os.fdopen(fd, "wb") as handle:
                for chunk in self.chunks:
                    digest.update(chunk)
                    handle.write(chunk)
                handle.flush()
                os.fsync(handle.fileno())
            os.chmod(tmp, self.mode)
        except BaseException as exc:
            self.discard()
            if isinstance(exc, OSError):
                raise write_error("file", target, exc) from exc
            raise
        return digest.hexdigest()

    def commit(self) -> None:
        """Rename the written temp file into place, and make the rename durable.

        :raises AllocstackError: as :func:`atomic_write_chunks` (the temp file removed).
        """
        try:
            os.replace(self.tmp, self.target)
        except BaseException as exc:
            self.discard()
            if isinstance(exc, OSError):
                raise write_error("file", self.target, exc) from exc
            raise
        self.tmp = None
        fsync_dir(self.target.parent)

    def discard(self) -> None:
        """Remove the temp file, if any (``path`` stays as it was)."""
        if self.tmp is not None:
            try:
                os.unlink(self.tmp)
            except FileNotFoundError:
                pass
            self.tmp = None


def atomic_write_json(path: str | os.PathLike, document: Any, mode: int = PRIVATE_FILE, *,
                      ensure_ascii: bool = True) -> str:
    """Atomically write ``document`` as stable, human-readable JSON (sorted keys, 2-space indent, final newline).

    Written as it is encoded (see :func:`atomic_write_chunks`); returns the file's SHA-256 (hex).

    :param ensure_ascii: escape every non-ASCII character (the standard library's default); False: UTF-8 text.
    :raises TypeError: for a value JSON cannot hold (nothing is written then).
    """
    encoder = json.JSONEncoder(indent=2, sort_keys=True, ensure_ascii=ensure_ascii)
    chunks = itertools.chain(encoder.iterencode(document), ("\n",))
    return atomic_write_chunks(path, (chunk.encode("utf-8") for chunk in chunks), mode)


def fsync_dir(directory: str | os.PathLike) -> None:
    """Make a rename in ``directory`` durable (best effort where unsupported)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def read_bytes(path: str | os.PathLike, what: str, diag: str = "input") -> bytes:
    """A document's bytes, every failure to read it one clear line.

    :raises AllocstackError: ``diag`` when the file is missing or unreadable.
    """
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except OSError as exc:
        raise _read_error(path, what, diag, exc) from exc


def document_sha256(path: str | os.PathLike, what: str, diag: str = "input") -> str:
    """The SHA-256 (hex) of a document's bytes, streamed (in a thread, beside other work: hashing releases
    the GIL); every failure to read it the line :func:`read_bytes` gives.

    :raises AllocstackError: ``diag`` when the file is missing or unreadable.
    """
    try:
        with open(path, "rb") as handle:
            return hashlib.file_digest(handle, "sha256").hexdigest()
    except OSError as exc:
        raise _read_error(path, what, diag, exc) from exc


def _read_error(path: str | os.PathLike, what: str, diag: str, exc: OSError) -> AllocstackError:
    if isinstance(exc, FileNotFoundError):
        return AllocstackError(diag, f"{what} file {path} does not exist")
    if isinstance(exc, IsADirectoryError):
        return AllocstackError(diag, f"{what} file {path} is a directory")
    return AllocstackError(diag, f"cannot read {what} file {path}: {exc.strerror}")


def loads_strict(raw: bytes, path: str | os.PathLike, what: str, diag: str = "input") -> Any:
    """The standard library's reading of a document's bytes: UTF-8 JSON, no NaN or Infinity.

    :raises AllocstackError: ``diag`` naming ``what`` at ``path`` and the first problem.
    """
    try:
        return json.loads(raw.decode("utf-8"), parse_constant=_reject_constant)
    except UnicodeDecodeError as exc:
        raise AllocstackError(diag, f"{what} file {path} is not UTF-8 text") from exc
    except json.JSONDecodeError as exc:
        raise AllocstackError(
            diag, f"{what} file {path} is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
        ) from exc
    except ValueError as exc:
        raise AllocstackError(diag, f"{what} file {path}: {exc}") from exc


def read_json(path: str | os.PathLike, what: str, diag: str = "input") -> Any:
    """Read a JSON document, turning every failure into one clear line.

    :param what: how to name the document in the message (e.g. ``"tasks"``).
    :raises AllocstackError: ``diag`` when the file is missing, unreadable or not JSON.
    """
    return loads_strict(read_bytes(path, what, diag), path, what, diag)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"non-standard JSON constant {name}")


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_text(text: str) -> str:
    """Hex SHA-256 of the UTF-8 encoding of ``text`` (a result's digest)."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def sha256_texts(texts: Iterable[str]) -> list[str]:
    """:func:`sha256_text` of each of ``texts`` (a million in half a second: twice as fast as a call each)."""
    sha256 = hashlib.sha256
    return [sha256(text.encode()).hexdigest() for text in texts]


def sha256_file(path: str | os.PathLike) -> str:
    """Hex SHA-256 of a file's bytes, streamed."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def sha256_tree(root: str | os.PathLike, what: str = "directory") -> str:
    """Hex SHA-256 over a directory tree: every entry's name, type, permission bits, and a file's
    contents or a symlink's target (never followed); not owners or times, which a copy changes.

    Entries are taken in byte order of their names, depth first, each encoded with length
    prefixes, so two trees have the same digest exactly when they hold the same entries.

    :raises AllocstackError: ``prerequisite`` when a file or directory in the tree cannot be read.
    """
    digest = hashlib.sha256()
    pending = [b""]
    base = os.fsencode(root)
    while pending:
        relative = pending.pop()
        try:
            with os.scandir(os.path.join(base, relative) if relative else base) as listing:
                entries = sorted(listing, key=lambda entry: entry.name)
        except OSError as exc:
            raise _unreadable(root, relative, exc, what) from exc
        children = []
        for entry in entries:
            path = os.path.join(relative, entry.name) if relative else entry.name
            info = entry.stat(follow_symlinks=False)
            if entry.is_symlink():
                kind, payload = b"l", os.readlink(entry.path)
            elif entry.is_dir(follow_symlinks=False):
                kind, payload = b"d", b""
                children.append(path)
            elif entry.is_file(follow_symlinks=False):
                try:
                    with open(entry.path, "rb") as handle:
                        kind, payload = b"f", hashlib.file_digest(handle, "sha256").digest()
                except OSError as exc:
                    raise _unreadable(root, path, exc, what) from exc
            else:
                kind, payload = b"o", b""
            digest.update(b"%s %o %d:%s %d:%s\n" % (kind, stat.S_IMODE(info.st_mode), len(path), path,
                                                    len(payload), payload))
        pending.extend(reversed(children))  # depth first, in name order
    return digest.hexdigest()


def _unreadable(root: str | os.PathLike, relative: bytes, exc: OSError, what: str) -> AllocstackError:
    where = os.path.join(os.fspath(root), os.fsdecode(relative))
    return AllocstackError("prerequisite", f"{what} {root}: cannot read {where}: {exc.strerror}; a directory "
                                           "image must be readable as a whole by whoever runs it (chmod -R a+rX)")


def sha256_path(path: str | os.PathLike, what: str) -> str:
    """:func:`sha256_file` of a file, :func:`sha256_tree` of a directory.

    :raises AllocstackError: ``prerequisite`` when ``path`` is neither, or cannot be read.
    """
    if Path(path).is_dir():
        return sha256_tree(path, what)
    if not Path(path).is_file():
        raise AllocstackError("prerequisite", f"{what} {path} does not exist")
    return sha256_file(path)


def sidecar_line(path: str | os.PathLike, digest: str) -> str:
    """The ``<path>.sha256`` line: ``sha256sum`` format for a file; a directory's name ends in '/'."""
    return f"{digest}  {Path(path).name}{'/' if Path(path).is_dir() else ''}\n"


def check_sidecar(path: str | os.PathLike, what: str) -> str:
    """Check ``<path>.sha256`` against the file (``sha256sum`` format) or directory tree; return the digest.

    :raises AllocstackError: ``integrity`` when the sidecar is missing, malformed or differs;
        ``prerequisite`` when ``path`` does not exist or cannot be read.
    """
    sidecar = Path(f"{os.fspath(path).rstrip('/')}.sha256")
    if not Path(path).exists():
        raise AllocstackError("prerequisite", f"{what} {path} does not exist")
    try:
        fields = sidecar.read_text(encoding="utf-8").split()
    except FileNotFoundError as exc:
        fix = "python3 workflow/scripts/image_digest.py" if Path(path).is_dir() else "sha256sum"
        raise AllocstackError(
            "integrity", f"{what} {path} has no SHA-256 sidecar {sidecar} (create it with {fix})"
        ) from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise AllocstackError("integrity", f"cannot read SHA-256 sidecar {sidecar}: {exc}") from exc
    if not fields or len(fields[0]) != 64 or any(c not in "0123456789abcdef" for c in fields[0].lower()):
        raise AllocstackError("integrity", f"SHA-256 sidecar {sidecar} does not start with a 64-digit hex digest")
    actual = sha256_path(path, what)
    if fields[0].lower() != actual:
        raise AllocstackError(
            "integrity", f"{what} {path} does not match its sidecar: expected {fields[0].lower()}, got {actual}"
        )
    return actual


def loads_bytes(data: bytes) -> Any:
    """``json.loads(data.decode("utf-8"))``, read by msgspec where it reads the bytes the same way.

    msgspec refuses what the standard library reads otherwise (NaN, Infinity, a lone surrogate,
    a number over 4,300 digits, a byte-order mark, invalid UTF-8, deep nesting): those go to the
    standard library, which accepts them or names the problem. A request body or a reply is
    parsed in a third of the time.

    :raises ValueError: (``JSONDecodeError``, ``UnicodeDecodeError``) or ``RecursionError``, as
        the standard library does.
    """
    msgspec = _msgspec()
    if msgspec is not None:
        try:
            return msgspec.json.decode(data)
        except (msgspec.MsgspecError, RecursionError):
            pass
    return json.loads(data.decode("utf-8"))


def dumps_compact(document: Any) -> bytes:
    """``document`` as compact UTF-8 JSON (msgspec's encoding, else the standard library's; both read the same).

    The protocol's bodies hold no NaN or Infinity (msgspec would write null, the standard library refuses them).

    :raises TypeError: for a value JSON cannot hold.
    """
    msgspec = _msgspec()
    if msgspec is not None:
        try:
            return msgspec.json.encode(document)
        except UnicodeEncodeError:  # a lone surrogate: the standard library escapes it
            pass
    return json.dumps(document, separators=(",", ":"), allow_nan=False).encode("utf-8")


#: One result as ``json.dumps(indent=2, sort_keys=True)`` writes it in a top-level "results" list: the
#: output, the digest, the task id and the worker id, each as its JSON text (``encode_basestring_ascii``).
RESULT_ENTRY = b'    {\n      "output": %s,\n      "sha256": %s,\n      "taskId": %s,\n      "workerId": %s\n    }'

_ENTRY_TEXT = RESULT_ENTRY.decode("ascii").replace("{", "{{").replace("}", "}}").replace("%s", "{}").format

Row = tuple[str, str, str, str]


def _around_results(document: dict[str, Any]) -> tuple[str, str]:
    """The text before and after the ``"results": [...]`` of ``document`` as json.dumps(indent=2, sort_keys=True) writes it."""
    head, tail = (json.dumps({**document, "results": []}, indent=2, sort_keys=True) + "\n").split('"results": []', 1)
    return head, tail


def results_document_fast(document: dict[str, Any], results: list[Any]) -> list[bytes] | None:
    """What :func:`results_document` writes, in three pieces by msgspec (a million results in half a second,
    not two; never joined: that would copy them once more), when msgspec writes the same text: ``results``
    (dicts, or msgspec records with the fields output, sha256, taskId, workerId) encode to ASCII without
    DEL (msgspec escapes control characters as the standard library does, and writes other characters as
    they are); None otherwise.
    """
    msgspec = _msgspec()
    if msgspec is None:
        return None
    try:
        array = msgspec.json.format(msgspec.json.encode(results, order="sorted"), indent=2)
    except UnicodeEncodeError:  # a lone surrogate
        return None
    if not array.isascii() or b"\x7f" in array:
        return None
    head, tail = _around_results(document)
    # One level deeper than msgspec put it; a newline is never inside a JSON string.
    return [(head + '"results": ').encode("ascii"), array.replace(b"\n", b"\n  "), tail.encode("ascii")]


def results_listing(raw: bytes, document: dict[str, Any]) -> memoryview | None:
    """The ``[...]`` of a results document's bytes ``raw`` when the text around it is what
    :func:`results_document` writes for ``document`` (the rest of the document), else None."""
    head, tail = _around_results(document)
    head_bytes, tail_bytes = (head + '"results": [').encode("ascii"), tail.encode("ascii")
    if not (raw.startswith(head_bytes) and raw.endswith(b"]" + tail_bytes)):
        return None
    return memoryview(raw)[len(head_bytes) - 1:len(raw) - len(tail_bytes)]


def results_document_listing(document: dict[str, Any], listing: bytes | memoryview) -> list[bytes | memoryview]:
    """``document`` with the ``"results"`` list whose text is ``listing`` (:func:`results_listing`'s), in
    three pieces: :func:`results_document`'s text where ``listing`` is its text for these results."""
    head, tail = _around_results(document)
    return [(head + '"results": ').encode("ascii"), listing, tail.encode("ascii")]


def results_document(document: dict[str, Any], rows: Iterable[list[Row]]) -> Iterator[bytes]:
    """``document`` with a ``"results"`` list, as ``json.dumps(..., indent=2, sort_keys=True) + "\\n"`` writes it
    (the same bytes, tested), in chunks: results.json and the success marker, a million results without a dict each.

    :param rows: chunks of results as (output, sha256, taskId, workerId) strings, in the list's order.
    """
    quote = encode_basestring_ascii
    entries = (",\n".join([_ENTRY_TEXT(quote(o), quote(d), quote(t), quote(w)) for o, d, t, w in chunk]).encode("ascii")
               for chunk in rows)
    return results_document_entries(document, entries)


def results_document_entries(document: dict[str, Any], entries: Iterable[bytes]) -> Iterator[bytes]:
    """:func:`results_document` from its entries already written (:data:`RESULT_ENTRY`), a chunk of them
    joined by ``",\\n"`` at a time (an empty chunk: none)."""
    head, tail = _around_results(document)
    yield (head + '"results": [').encode("ascii")
    separator = b"\n"
    for chunk in entries:
        if chunk:
            yield separator + chunk
            separator = b",\n"
    yield (("]" if separator == b"\n" else "\n  ]") + tail).encode("ascii")
