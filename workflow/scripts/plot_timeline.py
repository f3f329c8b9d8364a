#!/usr/bin/env python3
"""Draw the run's timeline from events.jsonl as a self-contained SVG (no plotting library).

One lane per worker from its start to its end, labelled with its completed
tasks; vertical marks for the coordinator listening, the gate passing, the
coordinator's end and each restart of a program by its restart policy. Shown in ``snakemake --report``.
"""

from __future__ import annotations

import html
import sys
from pathlib import Path
from typing import Any

from allocstack.common.cli import ArgumentParser, run
from allocstack.common.errors import EXIT_OK
from allocstack.common.events import read_events
from allocstack.common.jsonio import atomic_write_text

WIDTH, LANE, LEFT, TOP, FONT = 900, 26, 110, 40, 12
#: A generous width of one character at FONT px in a sans-serif font: labels are laid out with it
#: (no font metrics without a renderer), so real text is never wider than the room it gets.
CHAR_WIDTH = 0.62 * FONT
MARK_ROW = 16
MARKS = {"coordinator-listening": ("listening", "#718096"), "gate-passed": ("gate passed", "#2b6cb0"),
         "coordinator-end": ("coordinator end", "#c05621")}
RESTARTS, RESTART_COLOUR = ("service-restart", "worker-restart"), "#c53030"


def mark_of(event: dict[str, Any]) -> tuple[str, str] | None:
    """The label and colour of ``event``'s vertical mark (None: it has none): one of :data:`MARKS`, or a restart
    (``restart kv (1)``: the program and its restart's number)."""
    if event.get("event") in RESTARTS:
        name = event.get("service") or event.get("worker") or "?"
        return html.escape(f"restart {name} ({event.get('attempt', '?')})"), RESTART_COLOUR
    return MARKS.get(event.get("event", ""))


def text_width(text: str) -> float:
    return len(text) * CHAR_WIDTH


def lanes(events: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    found: dict[str, dict[str, Any]] = {}
    for event in events:
        role = event.get("event", "").split("-")[0]
        worker = event.get("worker") or (f"{role} {event.get('service')}" if role in ("main", "init") else None)
        if event.get("event") in ("worker-start", "main-start", "init-start"):
            found.setdefault(worker, {})["start"] = event["t"]
        elif event.get("event") in ("worker-end", "main-end", "init-end"):
            # a long-running worker (your program) completes no tasks of the coordinator's: its status is its label
            label = f"{event['completed']} tasks" if "completed" in event else event.get("status", "?")
            found.setdefault(worker, {}).update(end=event["t"], label=label, status=event.get("status", "?"))
    return found


def place_labels(marks: list[tuple[float, str]], right: float) -> list[tuple[float, int, str]]:
    """Put each mark's label at its line, on the first row where it overlaps no other label (pure).

    A label that would run past ``right`` ends at its line instead (``anchor`` "end").
    :returns: (x where the text starts, row, label) in the order given.
    """
    rows: list[list[tuple[float, float]]] = []
    placed = []
    for x, label in marks:
        width = text_width(label)
        start = x + 3 if x + 3 + width <= right else x - 3 - width
        row = next((i for i, taken in enumerate(rows)
                    if all(start + width + 6 <= a or b + 6 <= start for a, b in taken)), len(rows))
        if row == len(rows):
            rows.append([])
        rows[row].append((start, start + width))
        placed.append((start, row, label))
    return placed


def render(events: list[dict[str, Any]]) -> str:
    """The SVG document (pure): no label overlaps another or runs past the edge."""
    times = [e["t"] for e in events if "t" in e] or [0.0]
    t0, t1 = min(times), max(max(times), min(times) + 1e-3)
    workers = lanes(events)
    counts = {worker: html.escape(lane.get("label", "0 tasks")) for worker, lane in workers.items()}
    right = WIDTH - 10 - max((text_width(label) + 4 for label in counts.values()), default=0)  # room for counts
    x = lambda t: LEFT + (t - t0) / (t1 - t0) * (right - LEFT)  # noqa: E731
    marked = [(e["t"], mark) for e in events if (mark := mark_of(e)) is not None]
    marks = place_labels([(x(t), label) for t, (label, _) in marked], WIDTH - 5)
    rows = 1 + max((row for _, row, _ in marks), default=0)
    lanes_end = TOP + LANE * max(1, len(workers))
    height = lanes_end + 16 + MARK_ROW * rows
    parts = [(f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" font-family="sans-serif" '
              f'font-size="{FONT}">'), f'<text x="10" y="20" font-size="14">Run timeline ({t1 - t0:.2f} s)</text>']
    for row, (worker, lane) in enumerate(sorted(workers.items())):
        y = TOP + row * LANE
        start, end = lane.get("start", t0), lane.get("end", t1)
        parts.append(f'<text x="10" y="{y + 15}">{html.escape(str(worker))}</text>')
        parts.append(f'<rect x="{x(start):.1f}" y="{y + 4}" width="{max(2.0, x(end) - x(start)):.1f}" height="16" '
                     f'fill="{"#38a169" if lane.get("status") == "done" else "#d69e2e"}"/>')
        parts.append(f'<text x="{max(x(end), x(start) + 2) + 4:.1f}" y="{y + 16}" fill="#4a5568">{counts[worker]}</text>')
    colours = [colour for _, (_, colour) in marked]
    lines = [x(t) for t, _ in marked]
    for line_x, colour, (start, row, label) in zip(lines, colours, marks, strict=True):
        label_y = lanes_end + 16 + MARK_ROW * row
        parts.append(f'<line x1="{line_x:.1f}" x2="{line_x:.1f}" y1="{TOP - 6}" y2="{label_y - FONT}" '
                     f'stroke="{colour}" stroke-dasharray="4 3"/>')
        parts.append(f'<text x="{start:.1f}" y="{label_y}" fill="{colour}">{label}</text>')
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
    sys.exit(run(main))
