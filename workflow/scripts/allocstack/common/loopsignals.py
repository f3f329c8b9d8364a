"""The end of a component whose event loop handles signals (``loop.add_signal_handler``): quiet, whatever comes last.

asyncio's loop, closing, closes the file descriptor its signal handlers wake it through before it removes those
handlers. A signal in between (a second SIGTERM: a component gets one from its process group and one passed on by
its launcher) then prints ``Exception ignored when trying to write to the signal wakeup fd ... OSError: [Errno 9] Bad
file descriptor`` into the component's log: a traceback in the log of a run that did nothing wrong (seen in CI:
port_sockets.py, stopped by an interrupt). :func:`ending_quietly` removes the handlers while the loop still runs and
ignores those signals from then on: the component is ending, and a repeated signal changes nothing.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Awaitable, Iterable
from typing import TypeVar

T = TypeVar("T")


def stop_taking(signums: Iterable[int]) -> None:
    """The running loop's handlers of ``signums`` removed, those signals ignored from now on (SIGCHLD back to its
    default instead: ignoring it would reap children nobody waited for)."""
    loop = asyncio.get_running_loop()
    for signum in signums:
        loop.remove_signal_handler(signum)
        signal.signal(signum, signal.SIG_DFL if signum == signal.SIGCHLD else signal.SIG_IGN)


async def ending_quietly(main: Awaitable[T], signums: Iterable[int]) -> T:
    """``main``'s result, the loop's handlers of ``signums`` removed once it ended, however it ended
    (:func:`stop_taking`): run it as ``asyncio.run(ending_quietly(main, signums))``."""
    try:
        return await main
    finally:
        stop_taking(signums)
