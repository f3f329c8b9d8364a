#!/usr/bin/env python3
"""Validate the run's inputs before anything starts; write a summary with their digests.

Checks the task document (schema, ids, payload bounds), the baseline payloads,
the expected document (coverage, digests), and, when an image is used, that the
runtime can run it and the image's SHA-256 sidecar (a file's digest, or a directory
image's tree digest); the same for each image a program of yours runs in
(``--program-images-json``), and what the run takes from one: its own command where the
config gives none, the port it EXPOSEs where the config says ``port: image``. The summary also
holds the run's identity: what produces its results (the task set, your program and the files it
names, its settings, the image it runs in; :mod:`allocstack.common.identity`). Exit 0, a summary
and (``--decision-record``) the run's decision record (render_decisions.py), or one line, a
non-zero exit and neither.
"""

from __future__ import annotations

import json
import socket
import sys
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from pathlib import Path
from typing import Any

from render_decisions import render as render_decisions

from allocstack import SCHEMA_VERSION
from allocstack.common import identity as identities
from allocstack.common.cli import ArgumentParser, argv_list, json_object, run
from allocstack.common.errors import EXIT_OK, AllocstackError, report
from allocstack.common.forked import Forked
from allocstack.common.jsonio import atomic_write_json, atomic_write_text, check_sidecar
from allocstack.common.namespaces import isolation_fact
from allocstack.common.taskset import (
    TaskSet,
    expected_digests_from_facts,
    expected_facts,
    expected_listing_sha256,
    load_expected_and_digest,
    load_tasks_and_digest,
    task_order_message,
    write_compact,
)
from allocstack.launch.containers import PROGRAMS, Bind, check_image_format, check_mount_targets
from allocstack.launch.privatenames import mode, names_fact
from allocstack.worker.handlers import check_baseline_tasks

#: An expected document this large is checked in a second process while this one reads the task document,
#: and a task document this large has its payloads checked in a third while this one completes the expected
#: results' verdict (all CPU-bound, and nothing else runs yet: 1M tasks ~2 s sooner); smaller ones here.
FORK_BYTES = 4 << 20


def mismatch_hint(tasks: Path, expected: Path) -> str:
    """What to do when the expected results belong to another task set (e.g. a new ``tasks=`` with the
    baseline's ``expected``, which still applies unless the config says otherwise)."""
    return (f"; {expected} (config key 'expected') is not the expected results of {tasks}: give yours with "
            "--config expected=PATH (workflow/scripts/make_tasks.py writes both), or expected=null "
            "with a verify.command")


def parse_args(argv: list[str] | None):
    parser = ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=Path, help="task document (none: your own stack, no built-in coordinator)")
    parser.add_argument("--expected", type=Path, help="expected results document (optional with verify.command)")
    parser.add_argument("--workers", required=True, type=int, help="worker count of the run (0: a serving stack)")
    parser.add_argument("--handler", default="baseline", choices=["baseline", "command", "long-running"],
                        help="baseline: check the built-in handler's payloads; otherwise the user's program does")
    parser.add_argument("--command-json", type=argv_list, default=None,
                        help="config worker.command as a JSON argv list (the run's identity)")
    parser.add_argument("--environment-json", type=json_object, default={},
                        help="config worker.environment as JSON (its digest is part of the run's identity)")
    parser.add_argument("--program-file", action="append", default=[],
                        help="a file under the project that worker.command names: its digest is part of the run's "
                             "identity (repeatable)")
    parser.add_argument("--image", type=Path, help="container image whose .sha256 sidecar must match")
    parser.add_argument("--runtime", choices=sorted(PROGRAMS), default="apptainer", help="container runtime of --image")
    parser.add_argument("--output", required=True, type=Path, help="where to write the summary")
    parser.add_argument("--compact-tasks", type=Path,
                        help="also write the validated task set here, for the coordinator to load (with --tasks)")
    parser.add_argument("--decision-record", type=Path, help="then write the run's decision record here (Markdown)")
    parser.add_argument("--run", default="", help="run name, in the decision record's title")
    parser.add_argument("--decisions-json", type=json.loads, default={}, help="config `decisions` as JSON")
    parser.add_argument("--facts-json", type=json.loads, default={}, help="run facts to list under its table")
    parser.add_argument("--program-images-json", type=json.loads, default=[],
                        help="the images your programs run in: [{what, image, command, port}] (command: it runs "
                             "the image's own; port: it listens on the port the image EXPOSEs)")
    args = parser.parse_args(argv)
    if args.decision_record and not args.decisions_json:
        parser.error("--decision-record needs --decisions-json")
    if args.compact_tasks and not args.tasks:
        parser.error("--compact-tasks needs --tasks")
    return args


def large(path: Path | None) -> bool:
    """``path`` is a file of at least :data:`FORK_BYTES`."""
    try:
        return path is not None and path.stat().st_size >= FORK_BYTES
    except OSError:
        return False


def baseline_output_bytes(tasks: TaskSet) -> int | None:
    """:func:`check_baseline_tasks`' answer when the payloads are valid; None when they are not (whoever
    asked checks them again, which names the first problem)."""
    try:
        return check_baseline_tasks(tasks, "tasks")
    except AllocstackError:
        return None


def check_baseline_tasks_of(tasks: TaskSet, path: Path) -> int:
    """:func:`check_baseline_tasks`, saying in its line that the built-in handler is the one in use (worker.command is
    not set): a task set of your own then fits no handler of yours, and that is what to change."""
    try:
        return check_baseline_tasks(tasks, f"tasks {path}")
    except AllocstackError as error:
        raise AllocstackError(error.diag, f"{error.message} (worker.command is not set, so the built-in baseline "
                                          'handler runs the tasks, and it takes {"message": TEXT, "repeat": N}; set '
                                          "worker.command to your program to run tasks of your own)") from error


def check_tasks(args) -> dict[str, Any]:
    """The task document (and its expected results): the summary's task facts.

    A large expected document is checked on its own (decoded, each output's digest) in a forked
    child while this process reads the task document, which tells the child the tasks' sorted order
    once it has it (:func:`task_order_message`); the task set then completes the verdict.
    A large task document's baseline payloads are checked in a second child, forked once the task set
    is read, while this process completes the expected results' verdict. When a child does not prove
    its part valid, it is checked here, which names the first problem (the payloads' before the
    expected results', as one process would).
    With ``--compact-tasks`` the task set is written there for the coordinator (a thread, while the
    payloads and the expected results are checked; removed by :func:`main` if a check fails).
    """
    if args.tasks is None:
        return {"taskCount": None, "inputSha256": None, "expectedSha256": None, "expectedListingSha256": None,
                "compactTasksSha256": None, "outputBytes": None}
    # The child first: a process with a thread must not fork.
    with (Forked(expected_facts, str(args.expected), inbox=True) if large(args.expected) else nullcontext() as child,
          ThreadPoolExecutor(1) as writer):
        tasks, tasks_sha256 = load_tasks_and_digest(str(args.tasks))
        if child:  # (before the next fork: a message is whole once sent, whoever holds the pipe)
            child.send(task_order_message(tasks))
        baseline = args.handler == "baseline"
        with Forked(baseline_output_bytes, tasks) if baseline and large(args.tasks) else nullcontext() as payloads:
            compact = (writer.submit(write_compact, args.compact_tasks, tasks, tasks_sha256) if args.compact_tasks
                       else None)
            # The digest of exactly the bytes validated: verification trusts what it names (verify.py).
            digests = expected_digests_from_facts(child.result(), tasks) if child else None
            output_bytes = None  # unknown: the user's program decides
            if baseline:
                output_bytes = payloads.result() if payloads else None
                if output_bytes is None:
                    output_bytes = check_baseline_tasks_of(tasks, args.tasks)
        if args.expected and digests is None:
            expected, expected_sha256 = load_expected_and_digest(
                str(args.expected), tasks, mismatch_hint=mismatch_hint(args.tasks, args.expected))
            digests = expected_sha256, expected_listing_sha256(tasks, expected)
        digests = digests or (None, None)
        compact_sha256 = compact.result() if compact else None
    return {"taskCount": len(tasks), "inputSha256": tasks_sha256, "expectedSha256": digests[0],
            "expectedListingSha256": digests[1], "compactTasksSha256": compact_sha256, "outputBytes": output_bytes}


def run_identity(args, summary: dict[str, Any]) -> dict[str, Any]:
    """What produces this run's results (:func:`allocstack.common.identity.identity`).

    :raises AllocstackError: ``prerequisite`` when a file worker.command names cannot be read.
    """
    try:
        files = identities.file_digests(args.program_file)
    except OSError as exc:
        raise AllocstackError("prerequisite", f"worker.command names {exc.filename}, which cannot be read: "
                                              f"{exc.strerror}") from exc
    # per-task workers run in worker.image when it is set, else in image
    worker_image = summary.get("programImages", {}).get("worker", {}).get("sha256") or summary.get("imageSha256")
    return identities.identity(summary.get("inputSha256"), args.handler, args.command_json, files,
                               args.environment_json, worker_image, summary.get("runtime") if worker_image else None)


def check_program_images(checks: list[dict[str, Any]], runtime: str) -> dict[str, dict[str, str]]:
    """Each image a program of yours runs in: its format, its sidecar; its own command and its EXPOSE where the
    run takes them from it. Returns config key -> {image, sha256} for the provenance.

    :raises AllocstackError: ``integrity`` for a sidecar that does not match, ``prerequisite`` for an image that
        is not there, ``config`` for an image that has no command of its own or EXPOSEs no port where one is needed.
    """
    from allocstack.common.images import program_argv
    from allocstack.launch.program import Placement, image_meta

    digests: dict[str, str] = {}
    found = {}
    for check in checks:
        image = check["image"]
        if image not in digests:
            check_image_format(runtime, image)
            digests[image] = check_sidecar(image, f"the image of {check['what']}")
        found[check["what"]] = {"image": image, "sha256": digests[image]}
        if runtime == "charliecloud":  # a mount target ch-run cannot bind onto, nor a private directory make: say it now
            check_mount_targets(image, [Bind(mount.get("source") or "/", mount["target"])
                                        for mount in check.get("mounts", [])])
        if not (check["command"] or check["port"]):
            continue
        meta = image_meta(Placement(image, runtime))
        if check["command"] and not program_argv(meta, None, None):
            raise AllocstackError("config", f"{check['what']}.command is not set and its image {image} has no "
                                            f"command of its own ({meta.describe()}): set {check['what']}.command")
        if check["port"] and not meta.exposed:
            raise AllocstackError("config", f"{check['what']}.port is image but its image {image} EXPOSEs no TCP "
                                            f"port: set {check['what']}.port")
    return found


#: The decision record's line on whether this node could give the stack a network of its own (issue 32).
ISOLATION = "a private network for the stack (unprivileged user namespaces)"
NAMES = "service names (Compose's names, hostnames and aliases)"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        summary = {"schemaVersion": SCHEMA_VERSION, **check_tasks(args), "workers": args.workers,
                   "handler": args.handler}
        if args.image:
            check_image_format(args.runtime, str(args.image))
            summary["image"], summary["runtime"] = str(args.image), args.runtime
            summary["imageSha256"] = check_sidecar(args.image, "image")
        if args.program_images_json:
            summary["programImages"] = check_program_images(args.program_images_json, args.runtime)
            summary["runtime"] = args.runtime
        summary[identities.KEY] = run_identity(args, summary)
        atomic_write_json(args.output, summary, 0o644)
        if args.decision_record:
            # read where Snakemake runs: before anything is submitted
            facts = {**args.facts_json, ISOLATION: isolation_fact(socket.gethostname())}
            if args.facts_json.get("services", "none") != "none":
                facts[NAMES] = names_fact(socket.gethostname(), bool(args.program_images_json), mode())
            atomic_write_text(args.decision_record, render_decisions(args.run, args.decisions_json, facts), 0o644)
    except AllocstackError as error:
        if args.compact_tasks:
            args.compact_tasks.unlink(missing_ok=True)  # bad inputs leave nothing behind
        return report(error)
    if args.tasks is None:
        print("validate_inputs: no task document (your own stack)" + (", image digest matches" if args.image else ""),
              flush=True)
    else:
        print(f"validate_inputs: {summary['taskCount']} tasks"
              f"{' and their expected results' if args.expected else ''} are valid", flush=True)
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(run(main))
