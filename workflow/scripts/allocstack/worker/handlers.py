"""Task handlers: the built-in baseline, or the user's own program (``worker.command``).

A handler turns one task payload into an output string, or raises
:class:`TaskFailure`. The baseline's payload is ``{"message": str, "repeat": int}``;
:func:`check_baseline_payload` is what input validation runs before anything
starts, so a bad payload never reaches a worker.

A command handler runs an argv list (never a shell string) once per task: the
payload arrives as JSON on stdin (and, above 64 KiB, in a file named by
``$ALLOCSTACK_PAYLOAD_FILE`` with empty stdin), ``$ALLOCSTACK_TASK_ID`` names the
task, stdout is the output; a non-zero exit or a timeout fails the task with the
tail of its stderr. A program that cannot be started at all (no such file, not
executable) fails no task: the first attempt ends the run with one ``config`` line
naming ``worker.command``.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from itertools import repeat
from json.encoder import encode_basestring_ascii
from operator import mul, sub
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..common import names
from ..common.errors import AllocstackError
from ..common.jsonio import msgspec
from ..launch.program import CannotStart, ProgramError, run_program, why_not_started

if TYPE_CHECKING:
    from ..common.taskset import TaskSet

MAX_MESSAGE_CHARS = 4096
MAX_REPEAT = 10_000
MAX_OUTPUT_CHARS = 1 << 20


def check_baseline_payload(payload: dict[str, Any], where: str) -> None:
    """Raise ``input`` unless ``payload`` is a valid baseline payload."""
    unknown = sorted(set(payload) - {"message", "repeat"})
    if unknown:
        raise AllocstackError("input", f"{where}: unknown payload key {unknown[0]!r}")
    message, repeat = payload.get("message"), payload.get("repeat")
    if not isinstance(message, str) or not 1 <= len(message) <= MAX_MESSAGE_CHARS:
        raise AllocstackError("input", f"{where}: payload.message must be a string of 1..{MAX_MESSAGE_CHARS} characters")
    if type(repeat) is not int or not 1 <= repeat <= MAX_REPEAT:
        raise AllocstackError("input", f"{where}: payload.repeat must be an integer in 1..{MAX_REPEAT}")
    if len(message) * repeat > MAX_OUTPUT_CHARS:
        raise AllocstackError("input", f"{where}: output would be {len(message) * repeat} characters, over {MAX_OUTPUT_CHARS}")


def baseline(payload: dict[str, Any]) -> str:
    """The seed's task: the message repeated ``repeat`` times."""
    return payload["message"] * payload["repeat"]


def baseline_output_bytes(payload: dict[str, Any]) -> int:
    """Bytes the baseline's output of ``payload`` takes in a JSON document (the disk space check)."""
    return (len(json.dumps(payload["message"])) - 2) * payload["repeat"]


if msgspec is not None:
    class _BaselinePayload(msgspec.Struct, forbid_unknown_fields=True, gc=False):
        message: str
        repeat: int

    _BASELINE_PAYLOADS = msgspec.json.Decoder(list[_BaselinePayload])


def written_as_is(text: str) -> bool:
    """JSON writes ``text`` (as json.dumps does: ASCII only) as it is, between its quotes: no character is escaped.

    A text with a character outside ASCII is escaped for sure, and ``str.isascii`` says so without reading
    it (a flag of the string): only an ASCII text is escaped to find out (a realistic million's messages,
    half of them non-ASCII, were escaped all at once for nothing: 0.09 s).
    """
    return text.isascii() and len(encode_basestring_ascii(text)) - 2 == len(text)


def _baseline_tasks_fast(tasks: TaskSet) -> int | None:
    """What :func:`check_baseline_tasks` returns when msgspec reads every payload and all are valid; None to
    check them one by one (which names the first problem)."""
    if msgspec is None:
        return None
    try:
        payloads = _BASELINE_PAYLOADS.decode(tasks.payloads_array())
    except msgspec.MsgspecError:  # a key missing or unknown, a value of another type, ...
        return None
    messages = [payload.message for payload in payloads]
    repeats = [payload.repeat for payload in payloads]
    lengths = list(map(len, messages))
    if not (min(lengths) >= 1 and max(lengths) <= MAX_MESSAGE_CHARS and min(repeats) >= 1
            and max(repeats) <= MAX_REPEAT and max(map(mul, lengths, repeats)) <= MAX_OUTPUT_CHARS):
        return None
    if written_as_is("".join(messages)):  # a character is a byte of the output as written
        return sum(map(mul, lengths, repeats))
    # As json.dumps writes each message (every character it escapes, non-ASCII too), a C call each.
    written = map(sub, map(len, map(encode_basestring_ascii, messages)), repeat(2))
    return sum(map(mul, written, repeats))


def check_baseline_tasks(tasks: TaskSet, what: str) -> int:
    """Every task's payload is a valid baseline payload (:func:`check_baseline_payload`); returns the bytes
    their outputs take in a JSON document (:func:`baseline_output_bytes`, summed).

    All payloads are read at once by msgspec (a million in a second); if anything is off, one by
    one, so the first problem is named as :func:`check_baseline_payload` names it.

    :raises AllocstackError: ``input`` naming the first bad payload, its task's position and id.
    """
    fast = _baseline_tasks_fast(tasks)
    if fast is not None:
        return fast
    total = 0
    for index, task_id in enumerate(tasks.id_list()):
        payload = tasks.payload(index)
        check_baseline_payload(payload, f"{what}: task {index + 1} ({task_id})")
        total += baseline_output_bytes(payload)
    return total


class TaskFailure(Exception):
    """A task's handler failed; the message says why (it is reported to the coordinator)."""


def cannot_start(argv: list[str], error: CannotStart) -> AllocstackError:
    """``worker.command`` cannot be started at all: the run ends at once with this ONE line (``config``: no other
    task, worker or attempt would start it either), instead of every task failing ``max_attempts`` times."""
    where = os.environ.get("ALLOCSTACK_CONTAINER")
    inside = f" inside the image {where}" if where else ""
    return AllocstackError("config", f"worker.command {json.dumps(argv)} cannot be started{inside}: "
                                     f"{why_not_started(argv, error.errno)}; fix worker.command in your config")


INLINE_PAYLOAD_BYTES = 64 * 1024
STDERR_TAIL = 2000


def command_handler(argv: list[str], timeout: float | None, scratch: str | None) -> Callable[[str, dict[str, Any]], str]:
    """A handler running ``argv`` per task (see the module docstring); without an image, each in a mount namespace
    that sees the stack's hosts file at /etc/hosts (allocstack/launch/privatenames.py)."""
    from ..launch.hostsfile import existing_hosts
    from ..launch.program import names_preexec

    preexec = names_preexec(existing_hosts(Path(scratch) if scratch else None), "worker.command")

    def run(task_id: str, payload: dict[str, Any]) -> str:
        data = json.dumps(payload).encode("utf-8")
        env = {**os.environ, "ALLOCSTACK_TASK_ID": task_id}
        payload_file = None
        if len(data) > INLINE_PAYLOAD_BYTES:
            handle, payload_file = tempfile.mkstemp(prefix=f"{names.PAYLOAD_PREFIX}{task_id}-", suffix=".json",
                                                    dir=scratch)
            with os.fdopen(handle, "wb") as out:
                out.write(data)
            env["ALLOCSTACK_PAYLOAD_FILE"], data = payload_file, b""
        try:
            done = run_program(argv, env, stdin=data, timeout=timeout, preexec=preexec)
        except CannotStart as exc:
            raise cannot_start(argv, exc) from exc
        except ProgramError as exc:
            raise TaskFailure(str(exc)) from exc
        finally:
            if payload_file:
                os.unlink(payload_file)
        if done.returncode != 0:
            raise TaskFailure(f"exit {done.returncode}: {done.stderr.decode('utf-8', errors='replace')[-STDERR_TAIL:].strip()}")
        try:
            return done.stdout.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise TaskFailure(f"output is not UTF-8 text (byte {exc.start}): write text, or encode binary output, "
                              f"e.g. base64") from exc

    return run
