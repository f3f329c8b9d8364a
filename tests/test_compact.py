"""The compact stores of a million tasks: the fast parser agrees with the standard library's,
results.json and journal lines are the bytes the standard library would write, and group
commit never acknowledges before fsync."""

from __future__ import annotations

import asyncio
import copy
import hashlib
import json
import os

import pytest
from test_inputs import TASK_CASES

from allocstack import journal as journal_module
from allocstack import taskset
from allocstack.errors import AllocstackError
from allocstack.journal import Journal, _line, replay, result_line
from allocstack.taskboard import TaskBoard
from allocstack.taskset import decode_tasks, decode_tasks_fast, load_expected, parse_tasks
from conftest import expected_for, make_tasks

TRICKY_OUTPUTS = ["", "x", 'quote " and \\ backslash', "new\nline\ttab", "ü é 漢字", "emoji 🎉", "\x00\x1f", "\u2028"]


def raw(document) -> bytes:
    return json.dumps(document, indent=1).encode("utf-8")


def same_tasks(a, b) -> None:
    assert a.ids == b.ids and [a.position(task_id) for task_id in a.ids] == list(range(len(a)))
    assert [b.position(task_id) for task_id in b.ids] == list(range(len(b)))
    assert a.position("not-a-task") is None and 5 not in a and [1] not in a
    assert [a.payload(i) for i in range(len(a))] == [b.payload(i) for i in range(len(b))]
    assert [json.loads(a.task_json(i)) for i in range(len(a))] == [a.task(i) for i in range(len(a))]


def test_fast_and_standard_parsers_agree_on_a_good_document():
    document = make_tasks(50)
    document["tasks"][3]["payload"] = {"nested": {"list": [1, 2.5, None, True], "text": "ü\n\"q\""}, "big": 10**30}
    document["tasks"][4]["payload"] = {}
    fast = decode_tasks_fast(raw(document))
    assert fast is not None  # the fast path took it
    same_tasks(fast, parse_tasks(document))
    assert fast.payload(3) == document["tasks"][3]["payload"] and fast.position("task-000004") == 4
    assert fast.payload_bytes(3) == json.dumps(document["tasks"][3]["payload"], separators=(",", ":")).encode()


@pytest.mark.parametrize("order", ["ascending", "shuffled"])
def test_positions_by_bisection_or_by_table(order):
    document = make_tasks(30)
    if order == "shuffled":
        document["tasks"].reverse()
        document["tasks"][0], document["tasks"][7] = document["tasks"][7], document["tasks"][0]
    fast = decode_tasks_fast(raw(document))
    same_tasks(fast, parse_tasks(document))
    assert (fast._index is None) == (order == "ascending")  # a table only where bisection cannot work
    duplicate = copy.deepcopy(document)
    duplicate["tasks"][-1]["id"] = duplicate["tasks"][0]["id"]
    assert decode_tasks_fast(raw(duplicate)) is None  # the standard library names the duplicate
    with pytest.raises(AllocstackError, match="duplicate task id"):
        decode_tasks(raw(duplicate))


def test_without_msgspec_the_standard_library_gives_the_same_tasks(monkeypatch):
    document = make_tasks(20)
    with_msgspec = decode_tasks(raw(document))
    monkeypatch.setattr(taskset, "msgspec", None)
    assert decode_tasks_fast(raw(document)) is None
    same_tasks(decode_tasks(raw(document)), with_msgspec)


@pytest.mark.parametrize("case", sorted(TASK_CASES))
def test_the_fast_path_leaves_every_malformed_document_to_the_standard_library(case):
    document, _ = TASK_CASES[case]
    if case.startswith(("repeat", "message", "unknown payload")):
        return  # the baseline handler's payload rules: validate_inputs checks them, not the task document
    assert decode_tasks_fast(raw(document)) is None
    with pytest.raises(AllocstackError):
        decode_tasks(raw(document))


def test_a_number_the_standard_library_refuses_is_left_to_it(monkeypatch):
    monkeypatch.setattr(taskset, "_SCAN_CHUNK", 1000)  # the run of digits straddles chunks
    document = raw(make_tasks(3)).replace(b'"repeat": 2', b'"repeat": ' + b"7" * 4301, 1)
    assert taskset.has_huge_number(document) and not taskset.has_huge_number(raw(make_tasks(3)))
    assert decode_tasks_fast(document) is None
    with pytest.raises(AllocstackError, match="4300 digits"):
        decode_tasks(document)


@pytest.mark.parametrize("task_id", ["a" * 64, "A.b_c-9", "0"])
def test_valid_ids_accepts_what_the_pattern_accepts(task_id):
    assert taskset.valid_ids(["first", task_id, "last"]) and taskset.TASK_ID_PATTERN.match(task_id)


@pytest.mark.parametrize("task_id", ["a" * 65, "", ".a", "_a", "-a", "a b", "a/b", "ü", "a\nb", "a\n", "\na", "a$"])
def test_valid_ids_refuses_what_the_pattern_refuses(task_id):
    assert not taskset.valid_ids(["first", task_id, "last"]) and not taskset.valid_ids([task_id])
    assert not (taskset.TASK_ID_PATTERN.match(task_id) and "\n" not in task_id)


def test_an_id_holding_a_newline_is_refused_by_both_paths():
    document = make_tasks(2)
    document["tasks"][0]["id"] = "good\nalso-good"
    assert decode_tasks_fast(raw(document)) is None
    with pytest.raises(AllocstackError, match="must match"):
        decode_tasks(raw(document))


def test_expected_fast_path_agrees(tmp_path, monkeypatch):
    tasks = parse_tasks(make_tasks(5))
    path = tmp_path / "expected.json"
    path.write_text(json.dumps(expected_for(make_tasks(5))))
    fast = load_expected(str(path), tasks)
    monkeypatch.setattr(taskset, "msgspec", None)
    assert load_expected(str(path), tasks) == fast and len(fast) == 5


def finished_board(outputs: list[str], shuffled: bool = False) -> TaskBoard:
    document = {"schemaVersion": 1, "tasks": [{"id": f"t{i:03d}", "payload": {}} for i in range(len(outputs))]}
    if shuffled:  # ids out of order: results.json still lists them sorted
        document["tasks"] = document["tasks"][1::2] + document["tasks"][::2]
    board = TaskBoard(parse_tasks(document), lease_seconds=60, expected_workers=1)
    claim = board.claim("worker-1", len(outputs), now=0)
    results = [{"taskId": board.tasks.ids[p], "output": outputs[p],
                "sha256": hashlib.sha256(outputs[p].encode()).hexdigest()} for p in reversed(claim.positions)]
    staged, rejected = board.stage("worker-1", results, now=1)
    assert not rejected
    board.commit(staged, now=1)
    return board


def test_results_json_is_the_standard_librarys_text():
    board = finished_board(TRICKY_OUTPUTS)
    expected = {"schemaVersion": 1, "results": [board.result(task_id) for task_id in sorted(board.tasks.ids)]}
    assert b"".join(board.results_json()).decode("ascii") == json.dumps(expected, indent=2, sort_keys=True) + "\n"
    assert board.result("t002")["output"] == TRICKY_OUTPUTS[2] and board.result("t002")["workerId"] == "worker-1"
    empty = TaskBoard(parse_tasks(make_tasks(1)), lease_seconds=60)
    assert b"".join(empty.results_json()).decode() == json.dumps({"schemaVersion": 1, "results": []}, indent=2,
                                                                   sort_keys=True) + "\n"


@pytest.mark.parametrize("shuffled", [False, True])
def test_results_json_in_several_chunks(monkeypatch, shuffled):
    monkeypatch.setattr("allocstack.taskboard.RESULTS_CHUNK", 3)
    board = finished_board([f"out-{i}" for i in range(10)], shuffled)
    assert board.tasks.ascending is not shuffled
    document = json.loads(b"".join(board.results_json()))
    assert [r["taskId"] for r in document["results"]] == sorted(board.tasks.ids)
    assert {r["taskId"]: r["output"] for r in document["results"]} == {
        task_id: f"out-{position}" for position, task_id in enumerate(board.tasks.ids)}
    assert json.dumps(document, indent=2, sort_keys=True) + "\n" == b"".join(board.results_json()).decode()


@pytest.mark.parametrize("output", TRICKY_OUTPUTS)
def test_result_line_is_the_journal_line(output):
    digest = hashlib.sha256(output.encode()).hexdigest()
    record = {"taskId": "t-1", "workerId": "w.2", "output": output, "sha256": digest}
    assert result_line("t-1", "w.2", output, digest) == _line({"kind": "result", **record})


def test_group_commit_never_acknowledges_before_fsync(tmp_path, monkeypatch):
    """Each append returns only once an fsync covered its line; two submitters share an fsync."""
    path = tmp_path / "journal.jsonl"
    synced: list[int] = []  # the file's size at each fsync
    real_fsync = os.fsync

    def recording_fsync(fd):
        real_fsync(fd)
        synced.append(os.fstat(fd).st_size)

    monkeypatch.setattr(journal_module.os, "fsync", recording_fsync)

    async def submitter(journal, name, count):
        for i in range(count):
            line = result_line(f"{name}-{i}", name, "x", "0" * 64)
            await journal.append_lines([line])
            durable = path.read_bytes()[:synced[-1]]
            assert line in durable  # acknowledged: on disk before the fsync that returned

    async def run() -> None:
        journal = Journal(path, "abc", group=2)
        await asyncio.gather(submitter(journal, "a", 30), submitter(journal, "b", 30))
        journal.close()

    asyncio.run(run())
    results, _ = replay(path, "abc")
    assert len(results) == 60


def test_the_window_gathers_a_late_submitter_and_is_bounded(tmp_path, monkeypatch):
    """With group 2, a result arriving within the window shares the first one's fsync; a lone one is
    acknowledged once the window ends; without a window each takes its own fsync."""
    monkeypatch.setattr(journal_module, "MAX_WINDOW", 5.0)

    async def pair(window: float, second: bool = True) -> int:
        path = tmp_path / f"journal-{window}-{second}.jsonl"
        journal = Journal(path, "abc", group=2, window=window)

        async def late():
            await asyncio.sleep(0.05)
            await journal.append_lines([result_line("b", "w", "x", "0" * 64)])

        await asyncio.gather(journal.append_lines([result_line("a", "w", "x", "0" * 64)]),
                             *([late()] if second else []))
        journal.close()
        assert len(replay(path, "abc")[0]) == 1 + second
        return journal.fsyncs

    assert asyncio.run(pair(window=2.0)) == 1  # b came 50 ms later and still shared a's fsync
    assert asyncio.run(pair(window=0.0)) == 2
    assert asyncio.run(pair(window=0.2, second=False)) == 1  # alone: written when the window ended


@pytest.mark.parametrize("body", [
    b'{"workerId":"w","max":256,"results":[{"taskId":"t","output":"\xc3\xa9\\n","sha256":"0"}]}',
    b'{"a":1,"a":2}', b' [1.5, -0, 1e5, null, true] ', b'{"n":123456789012345678901234567890}',
    b'{"a":NaN}', b'{"a":1e400}', b'{"a":"\\ud800"}',  # msgspec refuses these; the standard library reads them
])
def test_loads_bytes_reads_as_the_standard_library_does(body, monkeypatch):
    from allocstack import jsonio

    want = json.loads(body.decode("utf-8"))
    got = jsonio.loads_bytes(body)
    assert json.dumps(got) == json.dumps(want)  # (NaN != NaN: compare the text)
    monkeypatch.setattr(jsonio, "msgspec", None)
    assert json.dumps(jsonio.loads_bytes(body)) == json.dumps(want)


@pytest.mark.parametrize("body", [b"\xef\xbb\xbf{}", b'{"a":' + b"9" * 5000 + b"}", b"[" * 100_000, b'{"a":"\xff"}', b"{"])
def test_loads_bytes_refuses_what_the_standard_library_refuses(body):
    from allocstack import jsonio

    with pytest.raises((ValueError, RecursionError)):
        jsonio.loads_bytes(body)


@pytest.mark.parametrize("document", [{"workerId": "w", "results": [{"output": "é\n\x00\ud800", "n": 1}]}, [1, None]])
def test_dumps_compact_reads_back_the_same(document, monkeypatch):
    from allocstack import jsonio

    assert json.loads(jsonio.dumps_compact(document)) == document
    monkeypatch.setattr(jsonio, "msgspec", None)
    assert jsonio.dumps_compact(document) == json.dumps(document, separators=(",", ":")).encode()
    with pytest.raises(ValueError):
        jsonio.dumps_compact({"x": float("nan")})


def test_the_success_marker_is_the_standard_librarys_text(tmp_path):
    import verify

    results = [{"output": output, "sha256": hashlib.sha256(output.encode()).hexdigest(), "taskId": f"t{i}",
                "workerId": "worker-01"} for i, output in enumerate(TRICKY_OUTPUTS)]
    fields = {"schemaVersion": 1, "status": "success", "taskCount": len(results), "inputSha256": "a" * 64,
              "resultsSha256": "b" * 64}
    for document in ({**fields, "results": results}, {**fields, "results": []}, {"schemaVersion": 1, "check": "passed"}):
        verify.write_marker(tmp_path / "result.json", document)
        assert (tmp_path / "result.json").read_text() == json.dumps(document, indent=2, sort_keys=True) + "\n"
        assert oct((tmp_path / "result.json").stat().st_mode & 0o777) == "0o600"
