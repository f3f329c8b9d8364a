"""What produced a run's results: its identity, carried by the journal and every record of the run.

A task's result depends on three things, and so does a run's journal of acknowledged results:

* the task set: the SHA-256 of the task document (validate_inputs' ``inputSha256``);
* the program: the built-in baseline handler, or ``worker.command``: its argv and the SHA-256 of
  every file under the project it names (:func:`named_files`: ``apps/sq.py`` in
  ``["python3", "apps/sq.py"]``), and the image's SHA-256 when the components run in one (a
  program inside the image is the image's);
* the handler's settings: ``worker.mode`` and ``worker.environment`` (as a digest: its values may
  be secrets).

validate_inputs writes it into ``inputs.json`` (:func:`identity`); the coordinator writes its
digest into the journal's header and its end record, and a journal of another identity is set
aside (:func:`set_aside`) instead of resumed: a fixed program is run again, not restored.
Verification, the success marker and ``provenance.json`` carry the digest too.

What the identity does not see: a file the program reads or imports that its argv does not name
(``python3 -m pkg``, a module next to the script). Then start over with ``--forcerun
serve_coordinator`` (docs/failures.md). Standard library only.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

#: The key of the identity in inputs.json, and of its digest in the journal's header and the run's records.
KEY = "identity"
#: Reasons a journal is set aside, by the part of the identity that differs (in the order they are checked).
PARTS = (
    ("taskSetSha256", "the task set changed"),
    ("handler", "the handler changed (worker.command set or unset, or worker.mode)"),
    ("command", "worker.command changed"),
    ("files", "the worker program changed"),
    ("environmentSha256", "worker.environment changed"),
    ("imageSha256", "the image changed"),
    ("runtime", "the container runtime changed"),
)


def named_files(argv: Sequence[str] | None, root: str) -> list[str]:
    """The files under ``root`` (the project: where snakemake runs) that the words of ``argv`` name.

    A word names a file when it is a path (relative to ``root``, or absolute below it) of an existing
    regular file; in an ``--option=PATH`` word, the part after ``=``. A word with ``${...}`` (a
    variable allocstack fills in at start) names none. Paths come back as written below ``root``,
    normalised, each once, in argv order.
    """
    found: dict[str, None] = {}
    top = os.path.realpath(root)
    for word in argv or ():
        for candidate in (word, word.partition("=")[2]):
            if not candidate or "${" in candidate:
                continue
            path = os.path.normpath(os.path.join(root, candidate))
            real = os.path.realpath(path)
            if real != top and real.startswith(top + os.sep) and os.path.isfile(real):
                found.setdefault(os.path.relpath(path, root), None)
    return list(found)


def file_digests(paths: Sequence[str]) -> dict[str, str]:
    """``{path: SHA-256 of its bytes}`` for each of ``paths``.

    :raises OSError: when one cannot be read.
    """
    digests = {}
    for path in paths:
        digest = hashlib.sha256()
        with open(path, "rb") as handle:
            for block in iter(lambda handle=handle: handle.read(1 << 20), b""):
                digest.update(block)
        digests[path] = digest.hexdigest()
    return digests


def canonical_sha256(value: Any) -> str:
    """The SHA-256 of ``value`` as canonical JSON (sorted keys, no spaces)."""
    return hashlib.sha256(json.dumps(value, sort_keys=True, separators=(",", ":")).encode("utf-8")).hexdigest()


def identity(task_set_sha256: str | None, handler: str, command: Sequence[str] | None, files: Mapping[str, str],
             environment: Mapping[str, str], image_sha256: str | None, runtime: str | None) -> dict[str, Any]:
    """The identity of a run's results: its parts and their digest (``sha256``).

    :param handler: ``baseline`` (the built-in one), ``command`` (worker.command per task) or ``long-running``.
    :param files: :func:`file_digests` of :func:`named_files` of ``command``.
    """
    parts = {"taskSetSha256": task_set_sha256, "handler": handler, "command": list(command) if command else None,
             "files": dict(sorted(files.items())), "environmentSha256": canonical_sha256(dict(environment)),
             "imageSha256": image_sha256, "runtime": runtime if image_sha256 else None}
    return {"sha256": canonical_sha256(parts), **parts}


def digest_of(value: Any) -> str | None:
    """The digest of an identity (a mapping with ``sha256``), or None when ``value`` is none."""
    return value.get("sha256") if isinstance(value, Mapping) and isinstance(value.get("sha256"), str) else None


def what_changed(before: Any, now: Mapping[str, Any]) -> str:
    """Why a journal made under identity ``before`` is not resumed under ``now``: one phrase, naming the files
    that changed (``the worker program changed: apps/sq.py``)."""
    if not isinstance(before, Mapping) or digest_of(before) is None:
        return "it does not say which program produced it (an earlier allocstack wrote it)"
    for key, why in PARTS:
        if before.get(key) != now.get(key):
            if key == "files":
                old, new = before.get(key) or {}, now.get(key) or {}
                changed = [path for path in sorted(set(old) | set(new)) if old.get(path) != new.get(path)]
                return f"{why}: {', '.join(changed[:5])}"
            return why
    return "what produced it differs"


def set_aside(journal: Path) -> Path | None:
    """Rename ``journal`` aside (``journal.jsonl.stale-<epoch seconds>``, beside it) and return the new path;
    None when there is none. The results it holds stay readable there; no rerun resumes from them."""
    if not journal.exists():
        return None
    aside = journal.with_name(f"{journal.name}.stale-{int(time.time())}")
    n = 1
    while aside.exists():
        aside = journal.with_name(f"{journal.name}.stale-{int(time.time())}-{n}")
        n += 1
    os.replace(journal, aside)
    return aside
