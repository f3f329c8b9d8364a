#!/usr/bin/env python3
"""Verify a run's results and, only then, write the success marker.

Checks, in linear time: the results document's schema; every result belongs to
a task, appears once, carries the digest of its output and matches the expected
output and digest; every task has a result; the coordinator's end record says it
completed with exactly these results; the event log shows the readiness gate
passed before every worker started; with ``--command-json`` (``verify.command``)
the application's own check must exit 0. Then writes ``result.json`` atomically
(mode 0600): ``{"schemaVersion": 1, "status": "success", "taskCount",
"inputSha256", "resultsSha256", "results"}``. On any failure the marker is
removed, one line says why, and the exit code is 65.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from allocstack import SCHEMA_VERSION
from allocstack.cli import ArgumentParser, argv_list, run
from allocstack.errors import EXIT_OK, AllocstackError, report
from allocstack.events import gate_precedes_workers, read_events
from allocstack.jsonio import atomic_write_json, read_json, sha256_file, sha256_text
from allocstack.taskset import TaskSet, load_expected, load_tasks


def fail(message: str) -> AllocstackError:
    return AllocstackError("verification", message)


def check_results(document: Any, tasks: TaskSet, expected: dict[str, dict[str, Any]] | None) -> list[dict[str, Any]]:
    """Return the results sorted by task id, or raise ``verification`` naming the first problem."""
    if not isinstance(document, dict) or document.get("schemaVersion") != SCHEMA_VERSION:
        raise fail("results document is not a schemaVersion 1 object")
    results = document.get("results")
    if not isinstance(results, list):
        raise fail("results document has no 'results' list")
    task_ids = set(tasks.ids)
    seen: set[str] = set()
    for index, result in enumerate(results, start=1):
        if not isinstance(result, dict) or set(result) != {"taskId", "workerId", "output", "sha256"}:
            raise fail(f"result {index} must have exactly taskId, workerId, output, sha256")
        task_id = result["taskId"]
        if task_id not in task_ids:
            raise fail(f"result {index}: unexpected task id {str(task_id)[:80]!r}")
        if task_id in seen:
            raise fail(f"result {index}: duplicate task id {task_id!r}")
        seen.add(task_id)
        if not isinstance(result["output"], str) or result["sha256"] != sha256_text(result["output"]):
            raise fail(f"result for {task_id}: sha256 is not the digest of its output")
        want = expected[task_id] if expected is not None else None  # None: verify.command decides
        if want is not None and (result["output"] != want["output"] or result["sha256"] != want["sha256"]):
            raise fail(f"result for {task_id}: output differs from the expected output")
    if len(seen) != len(task_ids):
        missing = next(task_id for task_id in tasks.ids if task_id not in seen)
        raise fail(f"results do not cover each task exactly once: no result for {missing!r} "
                   f"({len(seen)} of {len(task_ids)})")
    return sorted(results, key=lambda r: r["taskId"])


def run_user_check(argv: list[str], tasks_path: Path, results_path: Path, expected_path: Path | None) -> None:
    """``verify.command``: the application's own correctness check ("only your application can say").

    Runs ``argv`` (no shell) with ``$ALLOCSTACK_TASKS``, ``$ALLOCSTACK_RESULTS`` (and
    ``$ALLOCSTACK_EXPECTED`` when configured) naming the documents; exit 0 means correct.

    :raises AllocstackError: ``verification`` with the tail of its output otherwise.
    """
    env = {**os.environ, "ALLOCSTACK_TASKS": str(tasks_path), "ALLOCSTACK_RESULTS": str(results_path)}
    if expected_path is not None:
        env["ALLOCSTACK_EXPECTED"] = str(expected_path)
    try:
        done = subprocess.run(argv, capture_output=True, encoding="utf-8", errors="replace", env=env, timeout=3600, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise fail(f"verify.command {argv[0]} could not run: {exc}") from exc
    for line in (done.stdout + done.stderr).strip().splitlines()[-20:]:
        print(f"verify.command: {line}", file=sys.stderr, flush=True)
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        raise fail(f"verify.command exited {done.returncode}: {tail[0][-300:]}")


def check_end_record(record: Any, task_count: int, input_sha256: str, results_sha256: str) -> None:
    """The coordinator must have completed, on this input, producing exactly this results file."""
    if not isinstance(record, dict):
        raise AllocstackError("coordinator-exit", "coordinator end record is not a JSON object")
    if record.get("status") == "failed":
        failed = record.get("failedTasks") or {}
        first = next(iter(failed.items()), ("?", "?"))
        raise AllocstackError("task-failed", f"{len(failed)} task(s) failed for good, e.g. {first[0]}: {first[1][-300:]}")
    if record.get("status") != "completed":
        raise AllocstackError(
            "coordinator-exit", f"coordinator ended {record.get('status')!r} ({record.get('reason')}), not completed"
        )
    if record.get("resultCount") != task_count:
        raise fail(f"coordinator reports {record.get('resultCount')} results for {task_count} tasks")
    if record.get("inputSha256") != input_sha256:
        raise fail("coordinator ran on a different input (inputSha256 differs)")
    if record.get("resultsSha256") != results_sha256:
        raise fail("results file differs from the one the coordinator wrote (resultsSha256 differs)")


def parse_args(argv: list[str] | None):
    parser = ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--input", required=True, type=Path, help="task document")
    parser.add_argument("--results", required=True, type=Path, help="results.json written by the coordinator")
    parser.add_argument("--expected", type=Path, help="expected results document (compared output by output)")
    parser.add_argument("--command-json", type=argv_list, default=None,
                        help="the application's own check as a JSON argv list (verify.command)")
    parser.add_argument("--output", required=True, type=Path, help="success marker to write (result.json)")
    parser.add_argument("--end-record", type=Path, help="the coordinator's end record to check")
    parser.add_argument("--events", type=Path, help="event log whose gate/worker order to check")
    parser.add_argument("--retire-journal", type=Path, help="delete this journal once the run is verified")
    args = parser.parse_args(argv)
    if args.expected is None and args.command_json is None:
        parser.error("give --expected, --command-json, or both")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.monotonic()
    try:
        args.output.unlink(missing_ok=True)
        tasks = load_tasks(str(args.input))
        expected = load_expected(str(args.expected), tasks) if args.expected else None
        document = read_json(args.results, "results", diag="verification")
        input_sha256, results_sha256 = sha256_file(args.input), sha256_file(args.results)
        if args.end_record:  # first: "the coordinator did not complete" explains a short results file
            record = read_json(args.end_record, "coordinator end record", diag="coordinator-exit")
            check_end_record(record, len(tasks), input_sha256, results_sha256)
        results = check_results(document, tasks, expected)
        if args.command_json:
            run_user_check(args.command_json, args.input, args.results, args.expected)
        if args.events:
            ok, reason = gate_precedes_workers(read_events(args.events))
            if not ok:
                raise fail(f"event log {args.events}: {reason}")
        atomic_write_json(args.output, {
            "schemaVersion": SCHEMA_VERSION,
            "status": "success",
            "taskCount": len(tasks),
            "inputSha256": input_sha256,
            "resultsSha256": results_sha256,
            "results": results,
        })
    except AllocstackError as error:
        args.output.unlink(missing_ok=True)
        return report(error)
    if args.retire_journal:
        args.retire_journal.unlink(missing_ok=True)
    print(f"verify: {len(tasks)} results verified in {time.monotonic() - started:.3f} s; wrote {args.output}", flush=True)
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(run(main))
