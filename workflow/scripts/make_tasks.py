#!/usr/bin/env python3
"""Make N baseline tasks and their expected results: try allocstack at any scale, one command.

    python workflow/scripts/make_tasks.py 10000               # inputs/tasks-10000.json, expected/results-10000.json
    snakemake --cores 4 --config tasks=inputs/tasks-10000.json expected=expected/results-10000.json run=n10000

Task ``task-NNNNNN`` has the payload ``{"message": "<message>NNNNNN", "repeat": R}``; its
expected output is what the built-in baseline handler makes of it (the message
repeated R times) with that output's SHA-256. Both files are written atomically.

``--shape realistic`` makes a task set as a real one looks instead (the same set for the
same ``--seed``): ids of several forms in shuffled order, messages that mix ASCII with
Greek, CJK, a snowman and characters outside the Basic Multilingual Plane, quotes,
backslashes and characters JSON escapes (newline, tab, control characters, DEL),
repeats 1-9, so outputs of up to a few hundred bytes (about 50 on average, nine in ten
under 120); the task document written as UTF-8 text, the expected document with the
standard library's ``\\uXXXX`` escapes (two documents, two tools' habits).
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path
from typing import Any

from allocstack import SCHEMA_VERSION
from allocstack.common.cli import ArgumentParser, positive_int
from allocstack.common.errors import EXIT_OK, AllocstackError, report
from allocstack.common.jsonio import atomic_write_json, sha256_text
from allocstack.common.taskset import MAX_TASKS
from allocstack.worker.handlers import MAX_REPEAT, baseline, check_baseline_payload


def make_tasks(count: int, message: str = "m", repeat: int = 2) -> dict[str, Any]:
    """A task document of ``count`` baseline tasks (pure)."""
    width = max(6, len(str(count - 1)))
    return {
        "schemaVersion": SCHEMA_VERSION,
        "tasks": [{"id": f"task-{i:0{width}d}", "payload": {"message": f"{message}{i}", "repeat": repeat}}
                  for i in range(count)],
    }


#: What realistic messages are made of: words, and what a fast path that assumes ASCII trips on.
_WORDS = ("alpha", "beta", "sample", "run", "chr1", "reads", "ok", "x", "hello world", "Zürich", "naïve", "façade")
_ODD = ("καλημέρα", "Ωμέγα", "☃", "日本語", "漢字", "€", "🎉", "𝄞", "😀👍", '"', "\\", '\\"', "\n", "\t", "\r\n",
        "\x00", "\x01", "\x1f", "\x7f", "\u2028", "\ufeff", "</script>", "{\"a\": [1]}", "C:\\tmp\\x")
#: Forms of realistic ids (the pattern allows letters, digits, '.', '_', '-').
_ID_FORMS = ("sample-{i:07d}", "run3.chunk_{i}", "IMG_{i:06d}.tif", "s{i}-L001-R1", "job.{i:x}", "{i}")


def realistic_tasks(count: int, seed: int = 31) -> dict[str, Any]:
    """A task document of ``count`` baseline tasks shaped as a real task set is (pure; the same for the same
    ``seed``): ids of several forms in shuffled order; messages of 1-3 parts, about half of them holding
    non-ASCII text (some outside the BMP) or characters JSON escapes; repeats 1-9."""
    rng = random.Random(seed)  # noqa: S311  (a reproducible sample, not a secret)
    ids = [_ID_FORMS[i % len(_ID_FORMS)].format(i=i) for i in range(count)]
    rng.shuffle(ids)
    tasks = []
    for task_id in ids:
        parts = rng.choices(_WORDS, k=rng.randint(1, 2))
        if rng.random() < 0.5:
            parts.insert(rng.randint(0, len(parts)), rng.choice(_ODD))
        tasks.append({"id": task_id, "payload": {"message": " ".join(parts), "repeat": rng.randint(1, 9)}})
    return {"schemaVersion": SCHEMA_VERSION, "tasks": tasks}


def expected_for(tasks: dict[str, Any]) -> dict[str, Any]:
    """The expected results of baseline ``tasks``: the handler's output and its digest (pure)."""
    results = []
    for task in tasks["tasks"]:
        output = baseline(task["payload"])
        results.append({"taskId": task["id"], "output": output, "sha256": sha256_text(output)})
    return {"schemaVersion": SCHEMA_VERSION, "results": results}


def bounded_count(text: str) -> int:
    count = positive_int(text)
    if count > MAX_TASKS:
        raise argparse.ArgumentTypeError(f"at most {MAX_TASKS:,} tasks, got {text}")
    return count


def parse_args(argv: list[str] | None):
    parser = ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("count", type=bounded_count, help="how many tasks")
    parser.add_argument("--tasks", type=Path, help="task document to write (default inputs/tasks-COUNT.json)")
    parser.add_argument("--expected", type=Path, help="expected results to write (default expected/results-COUNT.json)")
    parser.add_argument("--message", default="m", help="message prefix of every payload (its task number follows)")
    parser.add_argument("--repeat", type=positive_int, default=2, help=f"payload repeat, 1..{MAX_REPEAT}")
    parser.add_argument("--shape", choices=("plain", "realistic"), default="plain",
                        help="plain: task-NNNNNN in order, --message and --repeat; realistic: shuffled ids of several "
                             "forms, mixed ASCII and non-ASCII messages with quotes and escapes, repeats 1-9")
    parser.add_argument("--seed", type=int, default=31, help="the realistic shape's random seed (the same set for the same seed)")
    args = parser.parse_args(argv)
    args.tasks = args.tasks or Path("inputs") / f"tasks-{args.count}.json"
    args.expected = args.expected or Path("expected") / f"results-{args.count}.json"
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        if args.shape == "realistic":
            tasks = realistic_tasks(args.count, args.seed)
        else:
            tasks = make_tasks(args.count, args.message, args.repeat)
            check_baseline_payload(tasks["tasks"][-1]["payload"], "--message/--repeat")
        for path in (args.tasks, args.expected):
            path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_json(args.tasks, tasks, 0o644, ensure_ascii=args.shape != "realistic")
        atomic_write_json(args.expected, expected_for(tasks), 0o644)
    except AllocstackError as error:
        return report(error)
    print(f"make_tasks: wrote {args.count:,} tasks to {args.tasks} and their expected results to {args.expected}; "
          f"run them with\n  snakemake --cores 4 --config tasks={args.tasks} expected={args.expected} "
          f"run=n{args.count}", flush=True)
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
