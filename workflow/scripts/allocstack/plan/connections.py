"""How many connections the coordinator must take at once: every worker the config allows, and room besides.

A worker of its own job step (the seed's shape) holds up to two: its claims and, while a long
batch runs, its heartbeats. A job step of several workers shares :data:`PER_STEP` (its relay,
``allocstack/worker/relay.py``, on the step's node), whatever its worker count. The coordinator
takes :func:`coordinator_cap` at once: a connection past it, or a body past its byte budget,
is answered 503 (strangers and overload only), and the refused client backs off with jitter.
"""

from __future__ import annotations

#: Connections a job step of several workers keeps to the coordinator (its relay's pool).
PER_STEP = 4
#: Connections a worker of its own step may hold: its claims, and its heartbeats during a long batch.
PER_WORKER = 2
#: Room for everything else: the gates, the status command and page, reconnects, a stranger's few.
MARGIN = 512


def coordinator_cap(own_steps: int, shared_steps: int) -> int:
    """Connections the coordinator serves at once for ``own_steps`` workers of their own step and
    ``shared_steps`` steps of several workers."""
    return MARGIN + PER_WORKER * own_steps + PER_STEP * shared_steps
