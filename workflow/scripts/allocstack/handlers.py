"""The built-in baseline handler: ``output = message * repeat``.

A handler turns one task payload into an output string. The baseline's payload is
``{"message": str, "repeat": int}``; :func:`check_baseline_payload` is what input
validation runs before anything starts, so a bad payload never reaches a worker.
"""

from __future__ import annotations

from typing import Any

from .errors import AllocstackError

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
