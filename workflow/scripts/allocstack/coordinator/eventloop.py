"""The coordinator's event loop: uvloop's when it can be imported, else the standard library's.

uvloop runs asyncio's API on libuv, its transports and loop in C: the coordinator's HTTP layer
(HttpServer alone, one keep-alive client) costs about a third less CPU per request with it
(measured on 2 CPUs: 204-217 -> 133-153 µs for a small request, 274-290 -> 136-160 µs for a 40 KB
batch); the whole coordinator 6-9 % less per batch-1 request, where its CPU bounds the rate.
``requirements.txt`` and both image recipes pin it. A Python without it (an image of your own) runs the coordinator
on the standard library's loop, with the same behaviour (tested: tests/test_coordinator_http.py
runs the protocol on both). Which loop served a run is in its ``coordinator-listening`` event.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def uvloop_module() -> Any:
    """The uvloop module, or None when it cannot be imported here."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop


def run(main: Coroutine[Any, Any, T]) -> T:
    """Run ``main`` to its end on a new loop (uvloop's when importable), as :func:`asyncio.run` does."""
    uvloop = uvloop_module()
    return asyncio.run(main) if uvloop is None else uvloop.run(main)


def loop_name() -> str:
    """``"uvloop"`` or ``"asyncio"``: the kind of the running loop."""
    return "uvloop" if type(asyncio.get_running_loop()).__module__.startswith("uvloop") else "asyncio"
