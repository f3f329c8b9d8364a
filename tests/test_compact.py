"""The compact stores of a million tasks: the fast parser agrees with the standard library's,
results.json and journal lines are the bytes the standard library would write, and group
commit never acknowledges before fsync."""

from __future__ import annotations

import asyncio
import copy
import hashlib
import json
import os
import threading

import pytest
import uvloop
from test_inputs import TASK_CASES

from allocstack.common import taskset
from allocstack.common.errors import AllocstackError
from allocstack.common.taskset import decode_tasks, decode_tasks_fast, load_expected, parse_tasks
from allocstack.coordinator import journal as journal_module
from allocstack.coordinator.journal import Journal, _line, replay, result_line
from allocstack.coordinator.taskboard import TaskBoard
from conftest import expected_for, make_tasks

TRICKY_OUTPUTS = ["", "x", 'quote " and \\ backslash', "new\nline\ttab", "ü é 漢字", "emoji 🎉", "\x00\x1f", "\u2028"]


def raw(document) -> bytes:
    return json.dumps(document, indent=1).encode("utf-8")


def same_tasks(a, b) -> None:
    ids = a.id_list()
    assert ids == b.id_list() and [a.position(task_id) for task_id in ids] == list(range(len(a)))
    assert [b.position(task_id) for task_id in ids] == list(range(len(b)))
    assert [a.task_id(i) for i in range(len(a))] == ids and a.ids_in_id_order() == sorted(ids)
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


@pytest.mark.parametrize("indent", [1, None])
def test_tasks_read_in_chunks_are_the_tasks_read_at_once(indent, monkeypatch):
    """Chunks of 7 tasks (the last one shorter): the same tasks and payload bytes as the standard library's,
    a pretty-printed document's payloads compact, a compact one's as written; a bad task in any chunk
    leaves the document to the standard library."""
    document = make_tasks(50)
    document["tasks"][20]["payload"] = {"nested": {"list": [1, 2.5, None, True], "text": "ü\n\"q\""}, "big": 10**30}
    text = json.dumps(document, indent=indent).encode()
    monkeypatch.setattr(taskset, "TASK_CHUNK", 7)
    fast = decode_tasks_fast(text)
    same_tasks(fast, parse_tasks(document))
    written = (", ", ": ") if indent is None else (",", ":")
    assert [fast.payload_bytes(i) for i in range(50)] == [
        json.dumps(task["payload"], separators=written).encode() for task in document["tasks"]]
    for bad in ([], {"payload": {}}, {"id": 3, "payload": {}}, {"id": "x", "payload": 5}, {"id": "x", "payload": {},
                                                                                          "more": 1}):
        broken = copy.deepcopy(document)
        broken["tasks"][45] = bad
        assert decode_tasks_fast(json.dumps(broken, indent=indent).encode()) is None


@pytest.mark.parametrize("signpost", [1, 3, 32])
@pytest.mark.parametrize("order", ["ascending", "shuffled"])
def test_positions_by_bisection_over_the_sorted_order(order, signpost, tmp_path, monkeypatch):
    """Every id is found at its position, and nothing else is, whatever the ids' order and however many ids
    lie between two signposts (the first bisection's)."""
    monkeypatch.setattr(taskset, "SIGNPOST", signpost)
    document = make_tasks(30)
    if order == "shuffled":
        document["tasks"].reverse()
        document["tasks"][0], document["tasks"][7] = document["tasks"][7], document["tasks"][0]
    fast = decode_tasks_fast(raw(document))
    same_tasks(fast, parse_tasks(document))
    assert (fast.order is None) == (order == "ascending")  # positions by rank only where ids do not ascend
    for stranger in ("", "0", "task-", "task-0000005", "task-000005x", "task-000029-", "zzz", "task-0000\u00e9"):
        assert fast.position(stranger) is None
    duplicate = copy.deepcopy(document)
    duplicate["tasks"][-1]["id"] = duplicate["tasks"][0]["id"]
    assert decode_tasks_fast(raw(duplicate)) is None  # the standard library names the duplicate
    with pytest.raises(AllocstackError, match="duplicate task id"):
        decode_tasks(raw(duplicate))
    path = tmp_path / "tasks.json"
    path.write_bytes(raw(duplicate))  # read, its bytes let go before the ids are sorted: read again to name it
    with pytest.raises(AllocstackError, match=f"task 30: duplicate task id {duplicate['tasks'][0]['id']!r}"):
        taskset.load_tasks_and_digest(str(path))


def test_without_msgspec_the_standard_library_gives_the_same_tasks(monkeypatch):
    document = make_tasks(20)
    with_msgspec = decode_tasks(raw(document))
    monkeypatch.setattr(taskset, "msgspec", None)
    assert decode_tasks_fast(raw(document)) is None
    same_tasks(decode_tasks(raw(document)), with_msgspec)


@pytest.mark.parametrize("chunk", [taskset.TASK_CHUNK, 2])
@pytest.mark.parametrize("case", sorted(TASK_CASES))
def test_the_fast_path_leaves_every_malformed_document_to_the_standard_library(case, chunk, monkeypatch):
    monkeypatch.setattr(taskset, "TASK_CHUNK", chunk)  # 2: the problem is in a later chunk than the first
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
    results = [{"taskId": board.tasks.task_id(p), "output": outputs[p],
                "sha256": hashlib.sha256(outputs[p].encode()).hexdigest()} for p in reversed(claim.positions)]
    staged, rejected = board.stage("worker-1", results, now=1)
    assert not rejected
    board.commit(staged, now=1)
    return board


def test_results_json_is_the_standard_librarys_text():
    board = finished_board(TRICKY_OUTPUTS)
    expected = {"schemaVersion": 1, "results": [board.result(task_id) for task_id in sorted(board.tasks.id_list())]}
    assert b"".join(board.results_json()).decode("ascii") == json.dumps(expected, indent=2, sort_keys=True) + "\n"
    assert board.result("t002")["output"] == TRICKY_OUTPUTS[2] and board.result("t002")["workerId"] == "worker-1"
    empty = TaskBoard(parse_tasks(make_tasks(1)), lease_seconds=60)
    assert b"".join(empty.results_json()).decode() == json.dumps({"schemaVersion": 1, "results": []}, indent=2,
                                                                   sort_keys=True) + "\n"


@pytest.mark.parametrize("shuffled", [False, True])
def test_results_json_in_several_chunks(monkeypatch, shuffled):
    monkeypatch.setattr("allocstack.coordinator.taskboard.RESULTS_CHUNK", 3)
    board = finished_board([f"out-{i}" for i in range(10)], shuffled)
    assert board.tasks.ascending is not shuffled
    document = json.loads(b"".join(board.results_json()))
    assert [r["taskId"] for r in document["results"]] == sorted(board.tasks.id_list())
    assert {r["taskId"]: r["output"] for r in document["results"]} == {
        task_id: f"out-{position}" for position, task_id in enumerate(board.tasks.id_list())}
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


def test_the_journal_thread_serves_each_loop_reports_a_failed_write_and_stops_on_close(tmp_path):
    """Writes and fsyncs run on the journal's own thread: appends from two event loops in turn are
    durable, a write that fails reaches the appender as the journal's error, and close() ends the thread."""
    path = tmp_path / "journal.jsonl"
    fail = {"now": False}

    def write(fd, data):
        if fail["now"]:
            raise OSError(28, "No space left on device")
        return os.write(fd, data)

    journal = Journal(path, "abc", write=write)
    for name in ("a", "b"):  # a new loop each time (asyncio.run): the thread answers on the loop that asked
        asyncio.run(journal.append_lines([result_line(f"{name}-0", name, "x", "0" * 64)]))
    thread = journal._syncer
    assert thread is not None and thread.is_alive() and thread is not threading.current_thread()
    fail["now"] = True
    with pytest.raises(AllocstackError) as failed:
        asyncio.run(journal.append_lines([result_line("c-0", "c", "x", "0" * 64)]))
    assert failed.value.diag == "storage"
    journal.close()
    assert not thread.is_alive()
    assert [r["taskId"] for r in replay(path, "abc")[0]] == ["a-0", "b-0"]


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_the_window_gathers_a_late_submitter_and_is_bounded(loop, tmp_path, monkeypatch):
    """With group 2, a result arriving within the window shares the first one's fsync; a lone one is
    acknowledged once the window ends; without a window each takes its own fsync. On either event loop."""
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

    run = asyncio.run if loop == "asyncio" else uvloop.run
    assert run(pair(window=2.0)) == 1  # b came 50 ms later and still shared a's fsync
    assert run(pair(window=0.0)) == 2
    assert run(pair(window=0.2, second=False)) == 1  # alone: written when the window ended


@pytest.mark.parametrize("body", [
    b'{"workerId":"w","max":256,"results":[{"taskId":"t","output":"\xc3\xa9\\n","sha256":"0"}]}',
    b'{"a":1,"a":2}', b' [1.5, -0, 1e5, null, true] ', b'{"n":123456789012345678901234567890}',
    b'{"a":NaN}', b'{"a":1e400}', b'{"a":"\\ud800"}',  # msgspec refuses these; the standard library reads them
])
def test_loads_bytes_reads_as_the_standard_library_does(body, monkeypatch):
    from allocstack.common import jsonio

    want = json.loads(body.decode("utf-8"))
    got = jsonio.loads_bytes(body)
    assert json.dumps(got) == json.dumps(want)  # (NaN != NaN: compare the text)
    monkeypatch.setattr(jsonio, "msgspec", None)
    assert json.dumps(jsonio.loads_bytes(body)) == json.dumps(want)


@pytest.mark.parametrize("body", [b"\xef\xbb\xbf{}", b'{"a":' + b"9" * 5000 + b"}", b"[" * 100_000, b'{"a":"\xff"}', b"{"])
def test_loads_bytes_refuses_what_the_standard_library_refuses(body):
    from allocstack.common import jsonio

    with pytest.raises((ValueError, RecursionError)):
        jsonio.loads_bytes(body)


@pytest.mark.parametrize("document", [{"workerId": "w", "results": [{"output": "é\n\x00\ud800", "n": 1}]}, [1, None]])
def test_dumps_compact_reads_back_the_same(document, monkeypatch):
    from allocstack.common import jsonio

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


# -- the coordinator's batch path: whole batches at a time, the same outcome as result by result ----------

def digest_of(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()  # (a lone surrogate too, for the test)


@pytest.mark.parametrize("outputs", [TRICKY_OUTPUTS, ["x"]])
def test_result_lines_are_the_journal_lines_of_each_result(outputs):
    from json.encoder import encode_basestring_ascii

    from allocstack.coordinator.journal import result_lines

    ids = [f"t-{i}" for i in range(len(outputs))]
    digests = [digest_of(output) for output in outputs]
    assert result_lines(ids, "w.2", [encode_basestring_ascii(o) for o in outputs], digests) == b"".join(
        result_line(task_id, "w.2", output, digest) for task_id, output, digest in zip(ids, outputs, digests, strict=True))


@pytest.mark.parametrize("order", ["ascending", "shuffled"])
def test_tasks_json_of_a_run_is_each_tasks_json(order):
    document = make_tasks(12)
    document["tasks"][5]["payload"] = {"message": "ü \"q\"", "repeat": 2, "extra": [1, 2.5, None]}
    if order == "shuffled":
        document["tasks"].reverse()
    tasks = decode_tasks_fast(raw(document))
    for positions in (range(12), range(3, 7), range(11, 12), [7, 2, 9], range(0, 12, 2)):
        expected = b"[" + b",".join(tasks.task_json(p) for p in positions) + b"]"
        assert tasks.tasks_json(positions) == expected
        assert json.loads(expected) == [tasks.task(p) for p in positions]


def test_results_json_of_a_board_partly_done_in_chunks(monkeypatch):
    monkeypatch.setattr("allocstack.coordinator.taskboard.RESULTS_CHUNK", 4)
    board = TaskBoard(parse_tasks({"schemaVersion": 1, "tasks": [{"id": f"t{i:02d}", "payload": {}}
                                                                 for i in range(11)]}), lease_seconds=60)
    claim = board.claim("w-1", 11, now=0)
    assert claim.positions == range(11)  # one run, granted whole
    done = [0, 1, 2, 3, 5, 8, 9, 10]  # chunk 0 whole (a range), chunks 1 and 2 in part (lists)
    staged, rejected = board.stage("w-1", [{"taskId": f"t{p:02d}", "output": TRICKY_OUTPUTS[p % 8],
                                            "sha256": digest_of(TRICKY_OUTPUTS[p % 8])} for p in done], now=1)
    assert not rejected
    board.commit(staged, now=1)
    results = [board.result(f"t{p:02d}") for p in done]
    assert [r["output"] for r in results] == [TRICKY_OUTPUTS[p % 8] for p in done]
    assert b"".join(board.results_json()).decode("ascii") == json.dumps(
        {"schemaVersion": 1, "results": results}, indent=2, sort_keys=True) + "\n"


def test_results_json_leaves_the_stores_free_to_grow_written_or_not(monkeypatch):
    """results.json holds no view of the outputs' and digests' stores, written whole or stopped half-way: a
    result recorded afterwards (or meanwhile: it is written in a thread, and a late result for a task that
    failed for good is still taken) grows them (shuffled ids: the gathered path)."""
    monkeypatch.setattr("allocstack.coordinator.taskboard.RESULTS_CHUNK", 2)
    board = TaskBoard(parse_tasks({"schemaVersion": 1, "tasks": [{"id": f"t{i}", "payload": {}}
                                                                 for i in (3, 0, 4, 1, 2)]}), lease_seconds=60)
    board.claim("w-1", 5, now=0)

    def record(positions):
        staged, rejected = board.stage("w-1", [{"taskId": board.tasks.task_id(p), "output": TRICKY_OUTPUTS[p],
                                                 "sha256": digest_of(TRICKY_OUTPUTS[p])} for p in positions], now=1)
        assert not rejected
        board.commit(staged, now=1)

    record([0, 1, 2])
    partial = board.results_json()
    next(partial), next(partial)
    partial.close()  # stopped half-way
    b"".join(board.results_json())  # written whole
    record([3, 4])  # the stores grow
    results = [board.result(f"t{i}") for i in range(5)]
    assert b"".join(board.results_json()).decode("ascii") == json.dumps(
        {"schemaVersion": 1, "results": results}, indent=2, sort_keys=True) + "\n"


def test_a_claims_tasks_share_a_lease_and_a_heartbeat_renews_only_the_tasks_it_names():
    board = TaskBoard(parse_tasks(make_tasks(4)), lease_seconds=10)
    claim = board.claim("a", 3, now=0)
    ids = [board.tasks.task_id(p) for p in claim.positions]
    assert board.heartbeat("a", ids[:1], now=8) == ids[:1]
    assert sorted(board.expire(now=11)) == ids[1:]  # the others' lease was not moved
    assert board.expire(now=17) == [] and board.expire(now=18) == ids[:1]


class _Api:
    """The coordinator's protocol over a real journal, called as the HTTP server calls it."""

    def __init__(self, path, count: int = 12) -> None:
        from allocstack.coordinator.api import CoordinatorApi
        from allocstack.coordinator.progress import Progress

        self.board = TaskBoard(parse_tasks(make_tasks(count)), lease_seconds=60, expected_workers=2)
        self.journal = Journal(path, "in", group=1, window=0)
        self.api = CoordinatorApi(self.board, self.journal, Progress(), event=lambda *a, **k: None,
                                  on_fault=lambda error: None, on_change=lambda: None, log=lambda line: None)

    async def post(self, path: str, body) -> tuple[int, object]:
        from allocstack.coordinator.httpserver import ClientError, Request

        handler = {"/claim": self.api.claim, "/results": self.api.results, "/result": self.api.result}[path]
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        try:
            response = await handler(Request("POST", path, "", {}, data))
        except ClientError as error:
            return error.status, error.message
        return response.status, json.loads(response.body)


def result_of(task: dict, output: str | None = None) -> dict:
    output = task["payload"]["message"] * task["payload"]["repeat"] if output is None else output
    return {"taskId": task["id"], "output": output, "sha256": digest_of(output)}


async def _conversation(api: _Api) -> list:
    """Claims and batches of results through every branch: a whole good batch, a batch with a bad result,
    a duplicate, a lone surrogate, requeued tasks, a single-task claim, bad bodies."""
    said = []

    async def post(path, body):
        said.append(await api.post(path, body))
        return said[-1][1]

    a = (await post("/claim", {"workerId": "a", "max": 4}))["tasks"]
    b = (await post("/claim", {"workerId": "b", "max": 4, "node": "n1"}))["tasks"]
    a2 = (await post("/claim", {"workerId": "a", "max": 2, "results": [result_of(t) for t in a]}))["tasks"]
    bad = [result_of(t) for t in b]
    bad[2]["sha256"] = digest_of("not it")
    await post("/claim", {"workerId": "b", "max": 1, "results": bad})
    await post("/results", {"workerId": "b", "results": [result_of(b[2]), result_of(a[0])]})  # one good, a duplicate
    await post("/results", {"workerId": "a", "results": [result_of(a2[0], "\ud800 lone")]})
    await post("/results", {"workerId": "a", "results": [result_of(a2[1]), result_of(a2[0])]})  # not in claim order
    single = (await post("/claim", {"workerId": "a"}))["task"]
    await post("/claim", {"workerId": "a", "results": [result_of(single)]})
    await post("/claim", {"workerId": "b", "max": 3, "results": []})
    # b holds task-000010 (its claim of one above): its lease expires, and it is handed out again
    api.board.expire(max(lease.deadline for lease in api.board.leases.values()) + 1)
    requeued = await post("/claim", {"workerId": "b", "max": 10})
    while requeued.get("tasks"):
        requeued = await post("/claim", {"workerId": "b", "max": 10, "results": [result_of(t) for t in requeued["tasks"]]})
    for body in ({"workerId": "a", "max": True}, {"workerId": "a", "results": None}, {"workerId": "a", "extra": 1},
                 {"workerId": "a", "max": 2, "results": [{"taskId": "x", "output": 1, "sha256": "0"}]},
                 {"workerId": "a b"}, b'{"workerId":"a","max":1,"max":0}'):
        await post("/claim", body)
    return said


def test_the_batch_path_and_the_result_by_result_path_agree(tmp_path, monkeypatch):
    """Whatever the batches hold, the typed batch path gives the same answers, journal, board and results.json
    as the general path (msgspec absent); and it did take whole good batches at once."""
    from allocstack.coordinator import api as api_module

    taken = []
    stage_run = TaskBoard.stage_run
    monkeypatch.setattr(TaskBoard, "stage_run", lambda self, *args: taken.append(stage_run(self, *args)) or taken[-1])
    outcomes = {}
    for mode in ("batch", "general"):
        if mode == "general":
            monkeypatch.setattr(api_module, "_POST", None)
        api = _Api(tmp_path / f"{mode}.jsonl")
        said = asyncio.run(_conversation(api))
        api.journal.close()
        workers = {name: (stats.claimed, stats.completed, stats.rejected, stats.node)
                   for name, stats in api.board.workers.items()}
        outcomes[mode] = (said, (tmp_path / f"{mode}.jsonl").read_bytes(), b"".join(api.board.results_json()),
                          api.board.counts(), workers, api.board.complete)
    assert outcomes["batch"] == outcomes["general"]
    said = outcomes["batch"][0]
    assert outcomes["batch"][5] and sum(run is not None for run in taken) >= 3 and None in taken
    assert any(status == 200 and isinstance(reply, dict) and any(
        r["code"] == 400 and "lone surrogate" in r["reason"] for r in reply.get("rejected", [])) for status, reply in said)
    assert [status for status, _ in said].count(400) == 4  # the bad bodies, each named by the general path


# -- input validation and verification of a million: all at once, the same verdict as one by one --------

def baseline_verdict(tasks):
    from allocstack.worker import handlers

    try:
        return handlers.check_baseline_tasks(tasks, "tasks t.json")
    except AllocstackError as error:
        return error.message


@pytest.mark.parametrize("change", [None, "escaped", "unknown-key", "no-repeat", "repeat-0", "repeat-bool",
                                    "repeat-float", "long-output", "empty-message", "not-ascii"])
def test_baseline_payloads_all_at_once_agree_with_one_by_one(change, monkeypatch):
    from allocstack.worker import handlers

    document = make_tasks(6)
    payloads = [task["payload"] for task in document["tasks"]]
    bad = payloads[3]
    if change == "escaped":
        payloads[1]["message"] = 'quote " back \\ new\nline \x7f'
    elif change == "unknown-key":
        bad["extra"] = 1
    elif change == "no-repeat":
        del bad["repeat"]
    elif change in ("repeat-0", "repeat-bool", "repeat-float"):
        bad["repeat"] = {"repeat-0": 0, "repeat-bool": True, "repeat-float": 2.0}[change]
    elif change == "long-output":
        bad["message"], bad["repeat"] = "x" * 4096, 300
    elif change == "empty-message":
        bad["message"] = ""
    elif change == "not-ascii":
        payloads[2]["message"] = "ü é 漢字 🎉"
    tasks = decode_tasks(raw(document))
    fast = handlers._baseline_tasks_fast(tasks)
    assert (fast is not None) == (change in (None, "escaped", "not-ascii"))  # the fast path took every good set
    verdict = baseline_verdict(tasks)
    monkeypatch.setattr(handlers, "msgspec", None)
    assert baseline_verdict(tasks) == verdict  # the same sum, or the same first problem
    if fast is not None:
        assert fast == verdict == sum((len(json.dumps(p["message"])) - 2) * p["repeat"] for p in payloads)
    else:
        assert "task 4 (task-000003)" in verdict


@pytest.mark.parametrize("text", ["", "m12 plain words", 'quote "', "back \\ slash", "new\nline", "tab\t",
                                  "nul \x00", "del \x7f", "ü", "漢字", "🎉", "\u2028", "\ufeff", "x" * 5000 + "é"])
def test_a_text_is_written_as_is_exactly_when_json_escapes_none_of_it(text):
    from allocstack.worker import handlers

    assert handlers.written_as_is(text) == (json.dumps(text)[1:-1] == text)


@pytest.mark.parametrize("order", ["task order", "other order"])
def test_expected_results_come_in_task_order(order, tmp_path, monkeypatch):
    tasks = parse_tasks(make_tasks(7))
    document = expected_for(make_tasks(7))
    if order == "other order":
        document["results"].reverse()
    path = tmp_path / "expected.json"
    path.write_text(json.dumps(document))
    fast = load_expected(str(path), tasks)
    assert fast.outputs == [f"m{i}" * 2 for i in range(7)] and len(fast) == 7
    assert fast.digests == [hashlib.sha256(output.encode()).hexdigest() for output in fast.outputs]
    assert taskset._expected_fast(path.read_bytes(), tasks) == fast  # the fast path took both orders
    monkeypatch.setattr(taskset, "msgspec", None)
    assert load_expected(str(path), tasks) == fast


def results_of(expected, **change):
    return {"schemaVersion": 1, "results": [{**r, "workerId": "worker-01"} for r in expected["results"]], **change}


@pytest.mark.parametrize("case", ["good", "wrong digest", "wrong output", "missing", "duplicate", "unknown top key",
                                  "unknown key", "worker not a string", "schemaVersion true", "shuffled"])
@pytest.mark.parametrize("with_expected", [True, False])
def test_results_checked_all_at_once_or_one_by_one(case, with_expected, tmp_path):
    import verify

    tasks_document = make_tasks(5)
    tasks = parse_tasks(tasks_document)
    expected_path = tmp_path / "expected.json"
    expected_path.write_text(json.dumps(expected_for(tasks_document)))
    expected = load_expected(str(expected_path), tasks) if with_expected else None
    document = results_of(expected_for(tasks_document))
    entries = document["results"]
    if case == "wrong digest":
        entries[2]["sha256"] = "0" * 64
    elif case == "wrong output":  # its own digest: only the expected results tell
        entries[2]["output"] = "other"
        entries[2]["sha256"] = hashlib.sha256(b"other").hexdigest()
    elif case == "missing":
        del entries[2]
    elif case == "duplicate":
        entries[2] = entries[1]
    elif case == "unknown top key":
        document["note"] = "x"
    elif case == "unknown key":
        entries[2]["extra"] = 1
    elif case == "worker not a string":
        entries[2]["workerId"] = 1
    elif case == "schemaVersion true":
        document["schemaVersion"] = True
    elif case == "shuffled":
        entries.reverse()
    raw_results = json.dumps(document).encode()
    fast = verify.check_results_fast(raw_results, tasks, expected)
    own_digest = case == "wrong output" and not with_expected  # then verify.command decides
    assert (fast is not None) == (case == "good" or own_digest)
    try:
        slow = verify.check_results(json.loads(raw_results), tasks, expected)
    except AllocstackError:
        slow = None
    accepted = case in ("good", "unknown top key", "schemaVersion true", "shuffled") or own_digest
    assert (slow is not None) == accepted  # the one-by-one checks decide what the fast path leaves to them
    if fast is not None:
        import msgspec

        assert msgspec.to_builtins(fast) == slow


@pytest.mark.parametrize("outputs", [["plain", "quote \" back \\ new\n tab\t nul\x00 \x1f"], [], ["ü"], ["\x7f"],
                                     ["\ud800"]])
def test_results_written_in_one_piece_are_the_standard_librarys_text(outputs):
    from allocstack.common.jsonio import results_document, results_document_fast

    results = [{"output": o, "sha256": "a" * 64, "taskId": f"t{i}", "workerId": "worker-01"}
               for i, o in enumerate(outputs)]
    fields = {"schemaVersion": 1, "status": "success", "taskCount": len(results), "inputSha256": "b" * 64}
    text = results_document_fast(fields, results)
    rows = [[(r["output"], r["sha256"], r["taskId"], r["workerId"]) for r in results]]
    assert b"".join(results_document(fields, rows)) == (json.dumps({**fields, "results": results}, indent=2,
                                                                   sort_keys=True) + "\n").encode()
    if all(o.isascii() and "\x7f" not in o for o in outputs):
        assert b"".join(text) == b"".join(results_document(fields, rows))
    else:
        assert text is None  # msgspec would write it differently: results_document writes it


def test_a_validated_document_skips_only_the_checks_its_digest_proves_passed(tmp_path):
    """validate_inputs' digest of the task document lets the coordinator skip the id and number checks: the
    same tasks; any other bytes (here an id the checks refuse) are checked in full."""
    from allocstack.common.taskset import load_tasks_and_digest

    document = make_tasks(30)
    path = tmp_path / "tasks.json"
    path.write_bytes(raw(document))
    tasks, digest = load_tasks_and_digest(str(path))
    validated, same_digest = load_tasks_and_digest(str(path), validated_sha256=digest)
    assert same_digest == digest
    same_tasks(validated, tasks)
    document["tasks"][4]["id"] = "-starts-with-a-dash"
    path.write_bytes(raw(document))
    with pytest.raises(AllocstackError, match="must match"):
        load_tasks_and_digest(str(path), validated_sha256=digest)
    new_digest = hashlib.sha256(path.read_bytes()).hexdigest()
    assert load_tasks_and_digest(str(path), validated_sha256=new_digest)[0].task_id(4) == "-starts-with-a-dash"  # skipped


@pytest.mark.parametrize("order", ["ascending", "shuffled"])
def test_the_compact_task_set_is_the_validated_one_and_taken_only_while_both_digests_hold(order, tmp_path,
                                                                                         monkeypatch):
    """validate_inputs writes the task set it validated compactly; the coordinator takes it instead of decoding
    the document while the document's digest is the validated one and the copy's is the one recorded; a
    changed document, an edited copy or one of another document: the document is read as without it."""
    from allocstack.common.taskset import load_tasks_and_digest, read_compact, write_compact

    document = make_tasks(40)
    if order == "shuffled":
        document["tasks"] = document["tasks"][::-3] + [t for i, t in enumerate(document["tasks"][::-1]) if i % 3]
    document["tasks"][7]["payload"]["message"] = TRICKY_OUTPUTS[4]
    path, compact = tmp_path / "tasks.json", tmp_path / "tasks.compact"
    path.write_bytes(raw(document))
    tasks, digest = load_tasks_and_digest(str(path))
    compact_sha256 = write_compact(compact, tasks, digest)
    assert compact_sha256 == hashlib.sha256(compact.read_bytes()).hexdigest()
    same_tasks(read_compact(compact, compact_sha256, digest), tasks)
    assert read_compact(compact, compact_sha256, "0" * 64) is None  # another document's
    assert read_compact(compact, "0" * 64, digest) is None
    assert read_compact(tmp_path / "missing", compact_sha256, digest) is None

    decoded = []
    real_decode = taskset.task_parts_fast
    monkeypatch.setattr(taskset, "task_parts_fast", lambda *a, **k: decoded.append(1) or real_decode(*a, **k))
    loaded, same_digest = load_tasks_and_digest(str(path), validated_sha256=digest, compact=compact,
                                                compact_sha256=compact_sha256)
    assert (same_digest, decoded) == (digest, [])  # taken from the copy, not decoded
    same_tasks(loaded, tasks)
    assert [loaded.tasks_json(range(3, 9))] == [tasks.tasks_json(range(3, 9))]
    edited = bytearray(compact.read_bytes())
    edited[-9] ^= 1  # an offset
    compact.write_bytes(bytes(edited))
    same_tasks(load_tasks_and_digest(str(path), validated_sha256=digest, compact=compact,
                                     compact_sha256=compact_sha256)[0], tasks)
    assert decoded == [1]
    write_compact(compact, tasks, digest)
    document["tasks"][0]["payload"]["repeat"] += 1  # the document changed after validation
    path.write_bytes(raw(document))
    changed, new_digest = load_tasks_and_digest(str(path), validated_sha256=digest, compact=compact,
                                                compact_sha256=compact_sha256)
    assert new_digest != digest and changed.payload(0) == document["tasks"][0]["payload"] and decoded == [1, 1]


def test_validate_inputs_writes_the_compact_task_set_only_for_good_inputs(tmp_path):
    from conftest import run_script, write_json

    tasks = make_tasks(5)
    compact, summary = tmp_path / "tasks.compact", tmp_path / "inputs.json"
    args = ["--tasks", tmp_path / "tasks.json", "--expected", tmp_path / "expected.json", "--workers", 1,
            "--output", summary, "--compact-tasks", compact]
    write_json(tmp_path / "tasks.json", tasks)
    write_json(tmp_path / "expected.json", {**expected_for(tasks), "schemaVersion": 2})
    done = run_script("validate_inputs.py", *args)
    assert done.returncode != 0 and not compact.exists() and not summary.exists()
    write_json(tmp_path / "expected.json", expected_for(tasks))
    done = run_script("validate_inputs.py", *args)
    assert done.returncode == 0, done.stderr
    assert json.loads(summary.read_text())["compactTasksSha256"] == hashlib.sha256(compact.read_bytes()).hexdigest()


@pytest.mark.parametrize("where", ["payload string", "payload key", "id"])
def test_a_byte_that_is_not_utf8_anywhere_is_left_to_the_standard_library(where, monkeypatch):
    """msgspec checks the UTF-8 of what it decodes (ids), not of the payloads it passes over as raw bytes:
    those are checked apart, a chunk at a time (here 7 bytes: the bad byte in a later chunk)."""
    monkeypatch.setattr(taskset, "_SCAN_CHUNK", 7)
    document = make_tasks(3)
    document["tasks"][2]["payload"] = {"message": "é ok 🎉", "repeat": 1}
    good = json.dumps(document, ensure_ascii=False).encode()
    assert decode_tasks_fast(good) is not None
    text = {"payload string": "ok 🎉", "payload key": '"repeat"', "id": "task-000002"}[where]
    bad = good.replace(text.encode(), text.encode()[:-2] + b"\xff" + text.encode()[-1:], 1)
    assert bad != good and decode_tasks_fast(bad) is None
    with pytest.raises(AllocstackError, match="not UTF-8"):
        decode_tasks(bad)


def _batch_of_claims(api: _Api, bodies: list) -> list:
    """``bodies`` as one /batch of claims, each answer as (status, JSON)."""
    from allocstack.coordinator.httpserver import Request

    document = {"requests": [{"path": "/claim", "body": body} for body in bodies]}
    response = asyncio.run(api.api.batch(Request("POST", "/batch", "", {}, json.dumps(document).encode())))
    return [(part["status"], part["body"]) for part in json.loads(response.body)["responses"]]


def _claims_alone(api: _Api, bodies: list) -> list:
    async def each() -> list:
        return [await api.post("/claim", body) for body in bodies]

    return asyncio.run(each())


def test_a_batch_of_claims_is_answered_as_the_claims_alone(tmp_path, monkeypatch):
    """A relay's /batch of claims takes the claims' path for the price of one (one decode, one journal append for
    every good batch of results, no task a request): each answer, the journal, the board's results and the workers'
    stats are those of the same claims sent alone, in order; a claim with a bad result is judged alone meanwhile."""
    from allocstack.coordinator import api as api_module

    calls = []
    claims = api_module.CoordinatorApi.claims
    monkeypatch.setattr(api_module.CoordinatorApi, "claims", lambda self, posts: calls.append(len(posts)) or claims(self, posts))
    tasks = make_tasks(40)["tasks"]
    first = [{"workerId": "a", "max": 4}, {"workerId": "b", "max": 4, "node": "n1"}, {"workerId": "c"}]
    outcome = {}
    for mode, send in (("batch", _batch_of_claims), ("alone", _claims_alone)):
        api = _Api(tmp_path / f"{mode}.jsonl", count=40)
        said = send(api, first)
        held = {body["workerId"]: reply.get("tasks") or [reply["task"]] for body, (_, reply) in zip(first, said, strict=True)}
        bad = [result_of(t) for t in held["b"]]
        bad[1]["sha256"] = digest_of("not it")
        second = [{"workerId": "a", "max": 2, "results": [result_of(t) for t in held["a"]]},
                  {"workerId": "c", "max": 3, "results": [result_of(t) for t in held["c"]]},
                  {"workerId": "d", "max": 2, "results": []},
                  {"workerId": "b", "max": 1, "results": bad}]
        said2 = send(api, second)
        api.journal.close()
        lines = sorted((tmp_path / f"{mode}.jsonl").read_bytes().splitlines())
        workers = {name: (s.claimed, s.completed, s.rejected, s.node) for name, s in api.board.workers.items()}
        outcome[mode] = (said, [(status, {k: v for k, v in reply.items() if k not in ("tasks", "task")},
                                 len(reply.get("tasks", ()))) for status, reply in said2],
                         lines, b"".join(api.board.results_json()), api.board.counts(), workers)
    for got, want in zip(outcome["batch"], outcome["alone"], strict=True):
        assert got == want, (got, want)
    assert calls == [3, 4]
    said2 = outcome["batch"][1]
    assert [reply["accepted"] for _, reply, _ in said2] == [[t["id"] for t in tasks[:4]], [tasks[8]["id"]], [],
                                                            [tasks[4]["id"], tasks[6]["id"], tasks[7]["id"]]]
    assert said2[3][1]["rejected"][0]["code"] == 400 and outcome["batch"][4]["done"] == 8


def test_a_batch_of_claims_whose_results_cannot_be_stored_accepts_none_of_them(tmp_path):
    """The journal cannot write: each claim of the batch that carried results is answered 507 and none of its results
    is done (its tasks stay leased, for a retry); a claim without results is answered as alone."""
    api = _Api(tmp_path / "full.jsonl", count=8)
    held = [reply["tasks"] for _, reply in _batch_of_claims(api, [{"workerId": "a", "max": 2}, {"workerId": "b", "max": 2}])]

    def full(fd, data):
        raise OSError(28, "No space left on device")

    api.journal._write = full
    said = _batch_of_claims(api, [{"workerId": "a", "max": 2, "results": [result_of(t) for t in held[0]]},
                                  {"workerId": "c", "max": 1},
                                  {"workerId": "b", "max": 2, "results": [result_of(t) for t in held[1]]}])
    api.journal.close()
    assert [status for status, _ in said] == [507, 200, 507] and "not stored" in said[0][1]["error"]
    assert said[1][1]["status"] == "task"
    assert api.board.counts()["done"] == 0 and not any(api.board.committing)
    assert api.board.counts()["leased"] == 5


def test_a_batch_of_claims_with_a_lone_surrogate_takes_the_general_path(tmp_path):
    """msgspec refuses the batch (a lone surrogate in an output): the general path answers each claim, the bad result
    rejected by name, the good claim's results accepted."""
    api = _Api(tmp_path / "surrogate.jsonl", count=8)
    held = [reply["tasks"] for _, reply in _batch_of_claims(api, [{"workerId": "a", "max": 2}, {"workerId": "b", "max": 2}])]
    said = _batch_of_claims(api, [{"workerId": "a", "max": 1, "results": [result_of(t) for t in held[0]]},
                                  {"workerId": "b", "max": 1, "results": [result_of(held[1][0], "\ud800 lone")]}])
    api.journal.close()
    assert said[0][1]["accepted"] == [t["id"] for t in held[0]]
    assert said[1][0] == 200 and "lone surrogate" in said[1][1]["rejected"][0]["reason"]
