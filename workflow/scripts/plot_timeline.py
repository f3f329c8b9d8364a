#!/usr/bin/env python3
"""Draw the run's timeline from events.jsonl as a self-contained SVG (no plotting library).

One lane per worker from its start to its end, labelled with its completed
tasks; vertical marks for the coordinator listening, the gate passing and the
coordinator's end. Shown in ``snakemake --report``.
"""

from __future__ import annotations

import html
import sys
from pathlib import Path
from typing import Any

from allocstack.cli import ArgumentParser
from allocstack.errors import EXIT_OK
from allocstack.events import read_events
from allocstack.jsonio import atomic_write_text

WIDTH, LANE, LEFT, TOP = 900, 26, 110, 40
MARKS = {"coordinator-listening": ("listening", "#718096"), "gate-passed": ("gate passed", "#2b6cb0"),
         "coordinator-end": ("coordinator end", "#c05621")}


def lanes(events: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    found: dict[str, dict[str, Any]] = {}
    for event in events:
        worker = event.get("worker")
        if event.get("event") == "worker-start":
            found.setdefault(worker, {})["start"] = event["t"]
        elif event.get("event") == "worker-end":
            found.setdefault(worker, {}).update(end=event["t"], completed=event.get("completed", 0),
                                               status=event.get("status", "?"))
    return found


def render(events: list[dict[str, Any]]) -> str:
    """The SVG document (pure)."""
    times = [e["t"] for e in events if "t" in e] or [0.0]
    t0, t1 = min(times), max(max(times), min(times) + 1e-3)
    x = lambda t: LEFT + (t - t0) / (t1 - t0) * (WIDTH - LEFT - 20)  # noqa: E731
    workers = lanes(events)
    height = TOP + LANE * max(1, len(workers)) + 40
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" font-family="sans-serif" '
             'font-size="12">', f'<text x="10" y="20" font-size="14">Run timeline ({t1 - t0:.2f} s)</text>']
    for row, (worker, lane) in enumerate(sorted(workers.items())):
        y = TOP + row * LANE
        start, end = lane.get("start", t0), lane.get("end", t1)
        parts.append(f'<text x="10" y="{y + 15}">{html.escape(str(worker))}</text>')
        parts.append(f'<rect x="{x(start):.1f}" y="{y + 4}" width="{max(2.0, x(end) - x(start)):.1f}" height="16" '
                     f'fill="{"#38a169" if lane.get("status") == "done" else "#d69e2e"}"/>')
        parts.append(f'<text x="{x(end) + 4:.1f}" y="{y + 16}" fill="#4a5568">{lane.get("completed", 0)} tasks</text>')
    for event in events:
        if event.get("event") in MARKS:
            label, colour = MARKS[event["event"]]
            parts.append(f'<line x1="{x(event["t"]):.1f}" x2="{x(event["t"]):.1f}" y1="{TOP - 6}" y2="{height - 24}" '
                         f'stroke="{colour}" stroke-dasharray="4 3"/>')
            parts.append(f'<text x="{x(event["t"]) + 3:.1f}" y="{height - 8}" fill="{colour}">{label}</text>')
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def parse_args(argv: list[str] | None):
    parser = ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=Path, required=True)
    parser.add_argument("--output", type=Path, required=True)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    atomic_write_text(args.output, render(read_events(args.events)), 0o644)
    print(f"plot_timeline: wrote {args.output}", flush=True)
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
