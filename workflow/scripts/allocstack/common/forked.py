"""Work done in a forked child while this process goes on: two CPU-bound halves of one step on two CPUs.

The child's answer comes back as JSON through a pipe. A child that fails in any way
(an exception, a signal, memory) answers nothing: :meth:`Forked.result` is then None and
the caller does the work itself, so the child only ever changes the speed, never the
outcome or the message. The child never writes to stdout or stderr (it ends with
``os._exit``: not even the buffers it inherited are flushed), and it never outlives
the ``with`` block.

With ``inbox=True`` the child can also wait for one message from this process, sent
when it has it (:meth:`Forked.send`): the function gets, as its last argument, a
callable that returns that message's bytes (b"" when none is sent: this process
went on without it, or failed).
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Callable
from typing import Any


def _receive(fd: int) -> bytes:
    """The message this process's parent sends through ``fd`` (:meth:`Forked.send`), or b"" when none comes.

    Length first: a message is whole when its bytes are, whoever else still holds the pipe (a second
    child forked later inherits the parent's end).
    """
    with os.fdopen(fd, "rb") as pipe:
        head = pipe.read(8)
        message = pipe.read(int.from_bytes(head, "big")) if len(head) == 8 else b""
    return message if len(head) == 8 and len(message) == int.from_bytes(head, "big") else b""


class Forked:
    """``function(*args)`` in a forked child, started at once; its JSON-able return value from :meth:`result`.

    Fork only from a process without threads (a forked child holds only the forking thread).
    """

    def __init__(self, function: Callable[..., Any], *args: Any, inbox: bool = False) -> None:
        read, write = os.pipe()
        inbox_read, inbox_write = os.pipe() if inbox else (-1, -1)
        pid = os.fork()
        if pid == 0:  # the child: never returns
            code = 1
            try:
                os.close(read)
                if inbox:
                    os.close(inbox_write)
                    args = (*args, lambda: _receive(inbox_read))
                with os.fdopen(write, "wb") as pipe:
                    pipe.write(json.dumps(function(*args)).encode("utf-8"))
                code = 0
            finally:
                os._exit(code)
        os.close(write)
        if inbox:
            os.close(inbox_read)
        self._pid: int | None = pid
        self._read = read
        self._inbox: int | None = inbox_write if inbox else None

    def send(self, message: bytes) -> None:
        """Hand the child its one message (it reads it whole once this returns); a child that ended
        meanwhile misses it, which only costs its answer."""
        if self._inbox is None:
            return
        try:
            with os.fdopen(self._inbox, "wb") as pipe:
                pipe.write(len(message).to_bytes(8, "big") + message)
        except BrokenPipeError:
            pass
        self._inbox = None

    def _close_inbox(self) -> None:
        if self._inbox is not None:
            os.close(self._inbox)
            self._inbox = None

    def result(self) -> Any:
        """The child's return value, once it ended; None when it failed (or returned None)."""
        self._close_inbox()  # a child still waiting for a message gets none
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
        self._close_inbox()
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
