#!/usr/bin/env python3
"""Verify a run's results and, only then, write the success marker.

With the built-in coordinator (``--input``), checks in linear time: the results
document's schema; every result belongs to a task, appears once, carries the
digest of its output and matches the expected output and digest; every task has
a result; the coordinator's end record says it completed with exactly these
results; with ``--command-json`` (``verify.command``) the application's own check
must exit 0. With your own services (``--services-record``): each was stopped by
allocstack and ended cleanly (Snakemake never checks a service's exit status).
Without the built-in coordinator, your check ran while the services were up
(``--check-record``) and must have passed. Always: the event log shows every
readiness gate passed before every worker started. Then writes ``result.json``
atomically (mode 0600): ``{"schemaVersion": 1, "status": "success", "taskCount",
"inputSha256", "resultsSha256", "results"}`` (your own stack: ``{"schemaVersion",
"status", "services", "check"}``). On any failure the marker is removed, one line
says why, and the exit code is non-zero.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from json.encoder import encode_basestring_ascii
from pathlib import Path
from typing import Any

from allocstack import SCHEMA_VERSION
from allocstack.common import identity as identities
from allocstack.common.cli import ArgumentParser, add_placement_arguments, argv_list, json_object, run
from allocstack.common.errors import EXIT_OK, AllocstackError, report
from allocstack.common.events import gate_precedes_workers, read_events
from allocstack.common.jsonio import (
    StagedWrite,
    atomic_write_chunks,
    atomic_write_json,
    document_sha256,
    loads_bytes,
    msgspec,
    read_bytes,
    read_json,
    results_document,
    results_document_fast,
    results_document_listing,
    results_listing,
    sha256_bytes,
    sha256_text,
    sha256_texts,
)
from allocstack.common.scratch import remove_scratch
from allocstack.common.taskset import (
    RESULTS_DOCUMENT,
    RESULTS_TEXT,
    ExpectedResults,
    TaskSet,
    ascending,
    by_id,
    fast_document,
    ids_sha256,
    listing_sha256_of_chunks,
    load_expected,
    load_tasks_and_digest,
    validated_summary,
)
from allocstack.coordinator import endrecord
from allocstack.launch.program import Placement, prepare, program_environment, run_check, service_problem

_RESULT_KEYS = {"taskId", "workerId", "output", "sha256"}
#: Results written to the success marker per chunk.
MARKER_CHUNK = 4096


def fail(message: str) -> AllocstackError:
    return AllocstackError("verification", message)


def check_results_fast(raw: bytes, tasks: TaskSet, expected: ExpectedResults | None) -> list[Any] | None:
    """The results sorted by task id (records with output, sha256, taskId, workerId), when msgspec reads
    ``raw`` (results.json) and every check of :func:`check_results` passes; None to run those checks
    one by one, which name the first problem.

    The usual case, checked list against list: one result per task by ascending task id (results.json's
    order, whatever the task document's), each output (and digest) the expected one, whose digest
    load_expected checked, or without expected results each digest that of its output.
    """
    if expected is not None:
        expected = ExpectedResults(by_id(expected.outputs, tasks.order), by_id(expected.digests, tasks.order))
    return results_in_order(raw, tasks.ids_in_id_order(), expected)


def results_in_order(raw: bytes, ids: list[str], expected: ExpectedResults | None) -> list[Any] | None:
    """The results of ``raw`` (records) when msgspec reads them, they are for ``ids`` in this order, and
    each output and digest is the expected one (without ``expected``: each digest that of its output);
    else None."""
    document = decode_results_fast(raw)
    if document is None:
        return None
    results = document.results
    if [result.taskId for result in results] != ids:
        return None
    outputs = [result.output for result in results]
    digests = [result.sha256 for result in results]
    if expected is not None:
        if outputs != expected.outputs or digests != expected.digests:
            return None
    elif sha256_texts(outputs) != digests:
        return None
    return results


def verify_validated(args) -> tuple[dict[str, Any], list[Any] | StagedMarker] | None:
    """:func:`verify_tasks` when validate_inputs' summary proves the task and expected documents are the
    bytes it validated (their SHA-256 is the summary's): they are not read again, only hashed (each in a
    thread, while results.json is read and hashed here), and the results are compared with the expected
    ones through the listing digest the summary holds (:func:`listing_sha256` of the expected results by
    ascending task id, results.json's order, whatever the task document's). The same verdict, the same marker, the same first error where one is certain (a document
    that cannot be read, the coordinator's end record); None for every other case (e.g. a swapped file,
    results out of order), which :func:`verify_tasks` then checks one by one.
    With the end record, results.json's list is copied into the marker, which is written ahead, in a
    thread, while results.json is decoded and compared (:class:`StagedMarker`; see :func:`write_marker`):
    the record's digest says the coordinator wrote it, in the marker's own text.
    """
    summary = validated_summary(args.inputs_summary)
    input_digest, expected_digest = summary.get("inputSha256"), summary.get("expectedSha256")
    listing, count = summary.get("expectedListingSha256"), summary.get("taskCount")
    if (args.expected is None or not isinstance(input_digest, str) or not isinstance(expected_digest, str)
            or not isinstance(listing, str) or type(count) is not int):
        return None
    with ThreadPoolExecutor(2) as pool:
        input_hash = pool.submit(document_sha256, args.input, "tasks")
        expected_hash = pool.submit(document_sha256, args.expected, "expected")
        raw: bytes | AllocstackError
        try:
            raw = read_bytes(args.results, "results", diag="verification")
        except AllocstackError as error:  # named after the documents read before it (the order of the checks)
            raw = error
        else:
            results_sha256 = sha256_bytes(raw)
        input_sha256 = input_hash.result()
        if input_sha256 != input_digest or expected_hash.result() != expected_digest:
            return None
    if isinstance(raw, AllocstackError):
        raise raw
    record = endrecord.read(args.end_record) if args.end_record else None
    facts = {"taskCount": count, "inputSha256": input_sha256, "resultsSha256": results_sha256, **produced_by(record)}
    # The coordinator's results.json (its end record has their digest) in task id order: its list is
    # the marker's list, as the marker's writer would write it (the same writer, json.dumps' text).
    listing_text = results_listing(raw, {"schemaVersion": SCHEMA_VERSION}) if args.end_record else None
    staged = StagedMarker(args.output, marker_fields(facts), listing_text) if listing_text is not None else None
    try:
        if args.end_record:  # validation passed on these bytes: this check comes next, with the same facts
            endrecord.check_completed(record, count, input_sha256, results_sha256, this_run(summary))
        # The marker written ahead needs no result decoded: the outputs are compared as their JSON text.
        document = decode_results_fast(raw, RESULTS_TEXT if staged is not None else RESULTS_DOCUMENT)
        results = document.results if document is not None else []
        ids = [result.taskId for result in results]
        same = (document is not None and len(results) == count and ascending(ids)  # in order: so sorted by task id
                and results_listing_sha256(ids, results, staged is not None) == listing)
    except BaseException:
        discard(staged)
        raise
    if not same:
        discard(staged)
        return None
    return facts, results if staged is None else staged


def results_listing_sha256(ids: list[str], results: list[Any], raw_outputs: bool) -> str:
    """:func:`listing_sha256` of results.json's ``results`` (records, whose ids are ``ids``), a chunk of
    :data:`MARKER_CHUNK` at a time (no text of all the outputs or digests at once).

    :param raw_outputs: each output is its JSON text (:data:`RESULTS_TEXT`'s records), else a string.
    """
    bounds = [(start, start + MARKER_CHUNK) for start in range(0, len(results), MARKER_CHUNK)]

    def outputs(start: int, end: int) -> bytes:
        chunk = [result.output for result in results[start:end]]
        return b"".join(chunk) if raw_outputs else "".join(map(encode_basestring_ascii, chunk)).encode("ascii")

    return listing_sha256_of_chunks(ids_sha256(ids), (outputs(*bound) for bound in bounds),
                                    ("\n".join([result.sha256 for result in results[slice(*bound)]])
                                     for bound in bounds))


class StagedMarker:
    """The success marker for ``fields`` with the results list whose text is ``listing``, written ahead:
    in a thread, started at once, to a temp file beside ``path`` (:class:`StagedWrite`), while the
    results are still being checked. :func:`write_marker` renames it into place when the marker has
    exactly these fields; any failure removes it (:meth:`discard`)."""

    def __init__(self, path: Path, fields: dict[str, Any], listing: memoryview) -> None:
        self.fields = fields
        self.listing = listing
        self.staged = StagedWrite(path, results_document_listing(fields, listing))
        pool = ThreadPoolExecutor(1)
        self.written = pool.submit(self.staged.write)
        pool.shutdown(wait=False)  # its thread ends with the write

    def commit(self) -> None:
        """Rename the marker into place (its write's failure, if any, raised as it was)."""
        self.written.result()
        self.staged.commit()

    def discard(self) -> None:
        """Once its write ended, remove the temp file (the marker stays as it was: absent)."""
        try:
            self.written.result()
        except AllocstackError:
            pass  # the write removed its temp file
        self.staged.discard()


def discard(results: Any) -> None:
    """A :class:`StagedMarker` among the results checked so far is removed (the check failed after it)."""
    if isinstance(results, StagedMarker):
        results.discard()


def marker_fields(facts: dict[str, Any]) -> dict[str, Any]:
    """The success marker's fields for the built-in coordinator's run (its ``results`` aside)."""
    return {"schemaVersion": SCHEMA_VERSION, "status": "success", **facts}


def decode_results_fast(raw: bytes, decoder: Any = RESULTS_DOCUMENT) -> Any:
    """results.json's bytes as records (output, sha256, taskId, workerId) when msgspec reads them as a
    schemaVersion 1 document (``decoder``: RESULTS_DOCUMENT, or RESULTS_TEXT for the outputs' JSON text);
    else None (the checks one by one then name the problem)."""
    return fast_document(raw, decoder)


def check_results(document: Any, tasks: TaskSet, expected: ExpectedResults | None) -> list[dict[str, Any]]:
    """Return the results sorted by task id, or raise ``verification`` naming the first problem."""
    if not isinstance(document, dict) or document.get("schemaVersion") != SCHEMA_VERSION:
        raise fail("results document is not a schemaVersion 1 object")
    results = document.get("results")
    if not isinstance(results, list):
        raise fail("results document has no 'results' list")
    task_ids = tasks
    seen: set[str] = set()
    for index, result in enumerate(results, start=1):
        if not isinstance(result, dict) or result.keys() != _RESULT_KEYS or not isinstance(result["workerId"], str):
            raise fail(f"result {index} must have exactly taskId, workerId (a string), output, sha256")
        task_id = result["taskId"]
        if task_id not in task_ids:
            raise fail(f"result {index}: unexpected task id {str(task_id)[:80]!r}")
        if task_id in seen:
            raise fail(f"result {index}: duplicate task id {task_id!r}")
        seen.add(task_id)
        if not isinstance(result["output"], str) or result["sha256"] != sha256_text(result["output"]):
            raise fail(f"result for {task_id}: sha256 is not the digest of its output")
        if expected is not None:  # None: verify.command decides
            position = tasks.position(task_id)
            if result["output"] != expected.outputs[position] or result["sha256"] != expected.digests[position]:
                raise fail(f"result for {task_id}: {got_and_expected(result['output'], expected.outputs[position])}")
    if len(seen) != len(tasks):
        missing = next(task_id for task_id in tasks.id_list() if task_id not in seen)
        raise fail(f"results do not cover each task exactly once: no result for {missing!r} "
                   f"({len(seen)} of {len(task_ids)})")
    return sorted(results, key=lambda r: r["taskId"])


#: Characters of an output (and of the expected one) a verification error quotes.
QUOTED = 60


def quoted(text: str, start: int) -> str:
    """``text`` from ``start`` (with ``...`` where it was cut), at most :data:`QUOTED` characters, as a repr."""
    part = text[start:start + QUOTED]
    return ("..." if start else "") + repr(part) + ("..." if start + QUOTED < len(text) else "")


def got_and_expected(got: str, expected: str) -> str:
    r"""``output '0\n' differs from the expected '0'``: both quoted (cut where long, from a little before where they
    first differ), and what a newline at the end usually means."""
    first = next((i for i, (a, b) in enumerate(zip(got, expected, strict=False)) if a != b), min(len(got), len(expected)))
    start = max(0, first - QUOTED // 3) if first > QUOTED // 2 else 0
    line = f"output {quoted(got, start)} differs from the expected {quoted(expected, start)}"
    if got.rstrip("\r\n") == expected and got != expected:
        line += (" (the output ends with a newline the expected output does not have: print() adds one; "
                 "stdout is kept byte for byte, so write sys.stdout.write(...), or add the newline to the expected outputs)")
    return line


def decode_results(raw: bytes, path: Path) -> Any:
    """results.json's bytes ``raw``, decoded (by msgspec where it reads the same).

    :raises AllocstackError: ``verification`` when they are not JSON (the standard library names the problem).
    """
    try:
        return loads_bytes(raw)
    except (ValueError, RecursionError):
        return read_json(path, "results", diag="verification")


def write_marker(path: Path, marker: dict[str, Any],
                 results: list[Any] | memoryview | StagedMarker | None = None) -> None:
    """The success marker, its results written in one pass or in chunks (the same text as
    :func:`atomic_write_json`'s).

    :param results: the marker's results (default ``marker["results"]``, if it has results): dicts,
        records with their attributes (:func:`check_results_fast`), their list's text as the marker
        holds it (copied, not written again), or the marker already written with it for the marker's
        fields (:func:`verify_validated`'s :class:`StagedMarker`: renamed into place).
    """
    if results is None:
        results = marker.get("results")
    if results is None:
        atomic_write_json(path, marker)
        return
    fields = {key: value for key, value in marker.items() if key != "results"}
    if isinstance(results, StagedMarker):
        if results.fields == fields:
            results.commit()
            return
        results.discard()
        results = results.listing
    if isinstance(results, memoryview):
        atomic_write_chunks(path, results_document_listing(fields, results))
        return
    chunks = results_document_fast(fields, results)
    if chunks is not None:
        atomic_write_chunks(path, chunks)
        return
    if msgspec is not None:
        results = msgspec.to_builtins(results)  # records -> dicts
    rows = [(r["output"], r["sha256"], r["taskId"], r["workerId"]) for r in results]
    chunks = (rows[start:start + MARKER_CHUNK] for start in range(0, len(rows), MARKER_CHUNK))
    atomic_write_chunks(path, results_document(fields, chunks))


def user_check_environment(tasks_path: Path, results_path: Path, expected_path: Path | None) -> dict[str, str]:
    """What ``verify.command`` is told here: ``$ALLOCSTACK_TASKS``, ``$ALLOCSTACK_RESULTS`` (and ``$ALLOCSTACK_EXPECTED``)."""
    env = {**os.environ, "ALLOCSTACK_TASKS": str(tasks_path), "ALLOCSTACK_RESULTS": str(results_path)}
    if expected_path is not None:
        env["ALLOCSTACK_EXPECTED"] = str(expected_path)
    return env


def check_services(document: Any) -> list[str]:
    """Every service of yours was stopped by allocstack and ended cleanly; return their names.

    Snakemake does not check a service job that exits 0 on its own, nor one that fails
    while it is being stopped: this does, from the records collect_results gathered
    (``services.json``).

    :raises AllocstackError: ``service-exit`` naming the first service that ended otherwise.
    """
    services = document.get("services") if isinstance(document, dict) else None
    if not isinstance(services, dict):
        raise AllocstackError("service-exit", "services record has no 'services' object")
    for name, record in services.items():
        problem = service_problem(name, record)
        if problem:
            raise AllocstackError("service-exit", problem)
    return sorted(services)


def check_check_record(record: Any) -> None:
    if not isinstance(record, dict) or record.get("status") != "passed":
        raise fail("the check (verify.command) did not pass")


def check_served(record: Any) -> dict[str, Any]:
    """Serve mode: the stack was up, then ended (main's exit 0 here: an end by a signal writes its marker itself)."""
    if not isinstance(record, dict) or record.get("status") != "served" or not isinstance(record.get("ended"), str):
        raise fail("the serving stack's record does not say it was up and ended")
    return {"mode": "serve", **{key: record[key] for key in ("ended", "endedBy", "upSeconds", "upAfter")
                                  if key in record}}


def parse_args(argv: list[str] | None):
    parser = ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--input", type=Path, help="task document (config tasks; none: your own stack)")
    parser.add_argument("--results", type=Path, help="results.json written by the coordinator (with --input)")
    parser.add_argument("--expected", type=Path, help="expected results document (compared output by output)")
    parser.add_argument("--command-json", type=argv_list, default=None,
                        help="the application's own check as a JSON argv list (verify.command)")
    parser.add_argument("--output", required=True, type=Path, help="success marker to write (result.json)")
    parser.add_argument("--end-record", type=Path, help="the coordinator's end record to check")
    parser.add_argument("--inputs-summary", type=Path,
                        help="validate_inputs' summary: documents with its digests are not validated again")
    parser.add_argument("--events", type=Path, help="event log whose gate/worker order to check")
    parser.add_argument("--services-record", type=Path,
                        help="how each of your services ended (services.json from collect_results)")
    parser.add_argument("--check-record", type=Path,
                        help="the record of verify.command run while the services were up (no --input)")
    parser.add_argument("--environment-json", type=json_object, default={},
                        help="more variables for --command-json (config verify.environment)")
    parser.add_argument("--served-record", type=Path,
                        help="serve mode: serve.py's record of how the stack served and ended (no --input)")
    parser.add_argument("--serve-verified", type=Path, help="serve mode: this record too, once verified")
    add_placement_arguments(parser)
    parser.add_argument("--remove-scratch", action="store_true",
                        help="remove the job-scoped scratch ($ALLOCSTACK_SCRATCH) at the end: its volumes were needed here")
    parser.add_argument("--retire-journal", type=Path, help="delete this journal once the run is verified")
    args = parser.parse_args(argv)
    if (args.input is None) != (args.results is None):
        parser.error("--input and --results go together")
    if args.input is not None and args.expected is None and args.command_json is None and not args.image:
        parser.error("give --expected, --command-json (or --image with a command of its own), or both")
    if args.input is None and args.check_record is None and args.served_record is None:
        parser.error("without --input, give --check-record: nothing else says the results are correct")
    return args


def verify_tasks(args) -> tuple[dict[str, Any], list[Any] | memoryview]:
    """With the built-in coordinator: its results, checked task by task; the success marker's content
    and its results (see :func:`write_marker`)."""
    checked = verify_validated(args)
    if checked is None:
        checked = verify_one_by_one(args)
    if args.command_json or args.image:
        env = program_environment(user_check_environment(args.input, args.results, args.expected), {},
                                  args.environment_json, "verify")
        placement = Placement.from_args(args)
        # in its own image it sees the documents it is told about where they are
        documents = [str(Path(path).absolute().parent) for path in (args.input, args.results, args.expected) if path]
        placement = Placement(**{**placement.__dict__, "binds": (*placement.binds, *documents)})
        try:
            with tempfile.TemporaryDirectory(prefix="verify-", dir=os.environ.get("ALLOCSTACK_SCRATCH")) as private:
                how = prepare(placement, args.command_json, env, set(args.environment_json), Path(private), "verify")
                run_check(how.argv, how.env, how.cwd, how.shown, how.preexec)
        except BaseException:
            discard(checked[1])
            raise
    return checked


def verify_one_by_one(args) -> tuple[dict[str, Any], list[Any]]:
    """Every document read and checked again (see :func:`verify_tasks`), the first problem named."""
    tasks, input_sha256 = load_tasks_and_digest(str(args.input))
    expected = load_expected(str(args.expected), tasks) if args.expected else None
    raw = read_bytes(args.results, "results", diag="verification")
    results_sha256 = sha256_bytes(raw)  # of exactly the bytes checked
    produced: dict[str, Any] = {}
    if args.end_record:  # first: "the coordinator did not complete" explains a short results file
        record = endrecord.read(args.end_record)
        endrecord.check_completed(record, len(tasks), input_sha256, results_sha256,
                                  this_run(validated_summary(args.inputs_summary)))
        produced = produced_by(record)
    results = check_results_fast(raw, tasks, expected)
    if results is None:
        results = check_results(decode_results(raw, args.results), tasks, expected)
    del raw
    return {"taskCount": len(tasks), "inputSha256": input_sha256, "resultsSha256": results_sha256, **produced}, results


def this_run(summary: dict[str, Any]) -> str | None:
    """The digest of this run's identity (validate_inputs' summary), None when the summary names none."""
    return identities.digest_of(summary.get(identities.KEY))


def produced_by(record: Any) -> dict[str, Any]:
    """The marker's ``identity``: the digest of what produced the results, as the coordinator's end record names it
    (:func:`endrecord.check_completed` checked it is this run's)."""
    digest = record.get(identities.KEY) if isinstance(record, dict) else None
    return {identities.KEY: digest} if isinstance(digest, str) else {}


def verify(args) -> tuple[dict[str, Any], list[Any] | memoryview | None]:
    """Every check, in order; the success marker's content (and with the built-in coordinator its
    results, see :func:`write_marker`).

    :raises AllocstackError: naming the first check that failed.
    """
    marker: dict[str, Any] = {"schemaVersion": SCHEMA_VERSION, "status": "success"}
    results = None
    if args.input is not None:
        facts, results = verify_tasks(args)
        marker.update(facts)
    try:
        check_the_rest(args, marker)
    except BaseException:
        discard(results)
        raise
    return marker, results


def check_the_rest(args, marker: dict[str, Any]) -> None:
    """:func:`verify`'s checks after the results': your services, your check, the gate's order (the marker
    gets their facts)."""
    if args.services_record:
        services = check_services(read_json(args.services_record, "services record", diag="service-exit"))
        if args.input is None:
            marker["services"] = services
    if args.check_record:
        check_check_record(read_json(args.check_record, "check record", diag="verification"))
        marker["check"] = "passed"
    if args.served_record:
        marker.update(check_served(read_json(args.served_record, "served record", diag="verification")))
    if args.events:
        ok, reason = gate_precedes_workers(read_events(args.events))
        if not ok:
            raise fail(f"event log {args.events}: {reason}")
        print(f"verify: {reason}", flush=True)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.monotonic()
    args.output.unlink(missing_ok=True)
    try:
        marker, results = verify(args)
        write_marker(args.output, marker, results)
        if args.serve_verified:
            atomic_write_json(args.serve_verified, marker)
    except AllocstackError as error:
        args.output.unlink(missing_ok=True)
        code = report(error)
    else:
        code = EXIT_OK
        if args.retire_journal:
            args.retire_journal.unlink(missing_ok=True)
        what = (f"{marker['taskCount']} results" if "taskCount" in marker else
                f"a serving stack, {marker['ended']}," if "ended" in marker else "the check and every service's end")
        print(f"verify: {what} verified in {time.monotonic() - started:.3f} s; wrote {args.output}", flush=True)
    if args.remove_scratch and os.environ.get("ALLOCSTACK_SCRATCH"):
        try:
            remove_scratch(Path(os.environ["ALLOCSTACK_SCRATCH"]))
        except AllocstackError as error:
            return report(error)
    return code


if __name__ == "__main__":
    sys.exit(run(main))
