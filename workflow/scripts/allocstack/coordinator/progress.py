"""Progress and metrics of a run: the rate, the history, the status document, the progress lines.

The clocks are injected (``clock`` monotonic, ``wall`` epoch seconds), so a test
can drive time; the coordinator samples once per housekeeping tick.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import Any

from .. import SCHEMA_VERSION
from .taskboard import TaskBoard

Clock = Callable[[], float]
#: The rate is measured over this many seconds of samples.
RATE_WINDOW = 30.0
#: One history point a second, for the status page's chart (30 minutes).
HISTORY_POINTS = 1800


class Progress:
    def __init__(self, clock: Clock = time.monotonic, wall: Clock = time.time) -> None:
        self.clock = clock
        self.wall = wall
        self.started_at = wall()
        self.started_mono = clock()
        self.listening_at = 0.0
        self.samples: deque[tuple[float, int]] = deque()
        self.history: deque[tuple[float, int]] = deque(maxlen=HISTORY_POINTS)

    def listening(self) -> None:
        self.listening_at = self.wall()

    def sample(self, done: int) -> None:
        """Record that ``done`` tasks have a result now."""
        now = self.clock()
        self.samples.append((now, done))
        while now - self.samples[0][0] > RATE_WINDOW:
            self.samples.popleft()
        since_start = now - self.started_mono
        if not self.history or since_start - self.history[-1][0] >= 1.0:
            self.history.append((round(since_start, 2), done))

    def rate(self) -> float:
        """Results per second over the last :data:`RATE_WINDOW` seconds of samples."""
        if len(self.samples) < 2:
            return 0.0
        (t0, d0), (t1, d1) = self.samples[0], self.samples[-1]
        return (d1 - d0) / (t1 - t0) if t1 > t0 else 0.0

    def summary(self, board: TaskBoard) -> dict[str, Any]:
        """The status document of ``GET /status``, the progress line and the end record."""
        now = self.clock()
        counts = board.counts()
        rate = self.rate()
        remaining = counts["total"] - counts["done"]
        workers = {
            worker: {
                "node": stats.node,
                "claimed": stats.claimed,
                "completed": stats.completed,
                "rejected": stats.rejected,
                "lastSeenSecondsAgo": round(now - stats.last_seen, 3),
            }
            for worker, stats in sorted(board.workers.items())
        }
        return {
            "schemaVersion": SCHEMA_VERSION,
            **counts,
            "restored": board.restored,
            "expiredLeases": board.expired_leases,
            "rejected": sum(stats.rejected for stats in board.workers.values()),
            "complete": board.complete,
            "ratePerSecond": round(rate, 2),
            "etaSeconds": round(remaining / rate, 1) if rate > 0 else None,
            "elapsedSeconds": round(self.wall() - self.started_at, 3),
            "readySeconds": round(self.listening_at - self.started_at, 3) if self.listening_at else None,
            "draining": bool(board.closed),
            "workers": workers,
            "nodes": per_node(workers),
        }


def per_node(workers: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Workers per node, from the per-worker status (pure): counts, what they did, who was seen last."""
    nodes: dict[str, dict[str, Any]] = {}
    for worker, stats in workers.items():
        node = nodes.setdefault(stats.get("node") or "?", {"workers": [], "claimed": 0, "completed": 0,
                                                             "lastSeenSecondsAgo": None})
        node["workers"].append(worker)
        node["claimed"] += stats["claimed"]
        node["completed"] += stats["completed"]
        seen = stats["lastSeenSecondsAgo"]
        node["lastSeenSecondsAgo"] = seen if node["lastSeenSecondsAgo"] is None else min(seen, node["lastSeenSecondsAgo"])
    return dict(sorted(nodes.items()))


def progress_line(summary: dict[str, Any]) -> str:
    eta = f"{summary['etaSeconds']:.0f} s" if summary["etaSeconds"] is not None else "-"
    return (f"coordinator: progress {summary['done']}/{summary['total']} done, {summary['leased']} leased, "
            f"{summary['ratePerSecond']:.0f} tasks/s, eta {eta}")


def live_line(summary: dict[str, Any], workers: int) -> str:
    """``allocstack: 3,016/10,000 tasks done (30%), 16 leased, 327 tasks/s, 21 s left, 2/2 workers`` (pure).

    The last count: workers that have asked for work, of those the run starts.
    """
    s = summary
    percent = 100 * s["done"] // s["total"] if s["total"] else 100
    eta = f"{s['etaSeconds']:,.0f} s left" if s["etaSeconds"] is not None else "time left -"
    active = len(s["workers"])
    failed = f", {s['failed']:,} failed" if s.get("failed") else ""
    return (f"allocstack: {s['done']:,}/{s['total']:,} tasks done ({percent}%){failed}, {s['leased']:,} leased, "
            f"{s['ratePerSecond']:,.0f} tasks/s, {eta}, {active}/{workers} workers")
