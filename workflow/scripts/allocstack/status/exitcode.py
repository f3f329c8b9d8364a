"""The exit code of the Snakemake command that ran a stack, where it is not Snakemake's own 0 or 1.

* A serving stack (config ``mode: serve``) that ended after it was up (Ctrl-C, scancel, the time limit): 0, as a
  serving stack always ends (:func:`allocstack.status.interrupt.exits_served`).
* A stack whose main program (config ``main``, Compose's ``--exit-code-from SERVICE``) exited non-zero: that code,
  as ``docker compose up --exit-code-from SERVICE`` exits. main.py's ``[main-exit]`` line in its log names it.
* Ctrl-C: 130 (:mod:`allocstack.status.interrupt`).

The command's ``sys.exit`` is replaced, as Snakemake calls it with its own code after ``onerror``. Standard
library only.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Callable

from .interrupt import exits_served

#: main.py's one line when your main program failed (allocstack/common/errors.py ``main-exit``).
MAIN_EXIT = re.compile(r"^allocstack: error \[main-exit\]: .* its exit code (\d+) fails the run$", re.MULTILINE)
#: Bytes at the end of main's log that hold its last lines.
TAIL_BYTES = 64 << 10


def main_exit_code(log: str | os.PathLike[str], since: float) -> int | None:
    """The exit code of this command's main program when it failed: from the last ``[main-exit]`` line of its log
    (written since ``since``, this command's start); None when it did not fail, or this command did not run it."""
    try:
        if os.stat(log).st_mtime < since - 2:
            return None
        with open(log, "rb") as handle:
            handle.seek(max(0, handle.seek(0, os.SEEK_END) - TAIL_BYTES))
            text = handle.read().decode("utf-8", errors="replace")
    except OSError:
        return None
    codes = MAIN_EXIT.findall(text)
    return int(codes[-1]) if codes else None


def settle(outcome: str, marker: str | os.PathLike[str], main_log: str | os.PathLike[str], since: float,
           original: Callable[..., object] = sys.exit) -> int | None:
    """Replace ``sys.exit`` where this command's exit code is not Snakemake's (see the module's docstring);
    return the code it now exits with, or None where Snakemake's stands."""
    if exits_served(marker, since, original):
        return 0
    code = main_exit_code(main_log, since) if outcome == "error" else None
    if code is not None:
        sys.exit = lambda _code=None: original(code)
    return code
