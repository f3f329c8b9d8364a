"""Work done in a forked child while this process goes on: two CPU-bound halves of one step on two CPUs.

The child's answer comes back as JSON through a pipe. A child that fails in any way
(an exception, a signal, memory) answers nothing: :meth:`Forked.result` is then None and
the caller does the work itself, so the child only ever changes the speed, never the
outcome or the message. The child never writes to stdout or stderr (it ends with
``os._exit``: not even the buffers it inherited are flushed), and it never outlives
the ``with`` block.
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Callable
from typing import Any


class Forked:
    """``function(*args)`` in a forked child, started at once; its JSON-able return value from :meth:`result`.

    Fork only from a process without threads (a forked child holds only the forking thread).
    """

    def __init__(self, function: Callable[..., Any], *args: Any) -> None:
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: never returns
            code = 1
            try:
                os.close(read)
                with os.fdopen(write, "wb") as pipe:
                    pipe.write(json.dumps(function(*args)).encode("utf-8"))
                code = 0
            finally:
                os._exit(code)
        os.close(write)
        self._pid: int | None = pid
        self._read = read

    def result(self) -> Any:
        """The child's return value, once it ended; None when it failed (or returned None)."""
        with os.fdopen(self._read, "rb") as pipe:
            data = pipe.read()
        _, status = os.waitpid(self._pid, 0)
        self._pid = None
        if not os.WIFEXITED(status) or os.WEXITSTATUS(status) != 0:
            return None
        try:
            return json.loads(data)
        except ValueError:
            return None

    def cancel(self) -> None:
        """End the child if it still runs (its answer is no longer needed), and reap it."""
        if self._pid is None:
            return
        try:
            os.kill(self._pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        os.waitpid(self._pid, 0)
        self._pid = None
        os.close(self._read)

    def __enter__(self) -> Forked:
        return self

    def __exit__(self, *exc: object) -> None:
        self.cancel()
