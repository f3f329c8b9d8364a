"""Bad inputs are refused before anything starts: one line, a stable id, non-zero, nothing written."""

from __future__ import annotations

import copy
import json

import pytest

from conftest import expected_for, make_tasks, run_script, write_json

GOOD_TASKS = make_tasks(3)
GOOD_EXPECTED = expected_for(GOOD_TASKS)


def mutate(document, change):
    document = copy.deepcopy(document)
    change(document)
    return document


TASK_CASES = {
    "not an object": ([1, 2], "top level must be a JSON object"),
    "schemaVersion 2": (mutate(GOOD_TASKS, lambda d: d.update(schemaVersion=2)), "schemaVersion must be 1"),
    "schemaVersion string": (mutate(GOOD_TASKS, lambda d: d.update(schemaVersion="1")), "schemaVersion must be 1"),
    "no tasks key": ({"schemaVersion": 1}, "'tasks' must be a list"),
    "empty tasks": ({"schemaVersion": 1, "tasks": []}, "nothing to run"),
    "unknown top key": (mutate(GOOD_TASKS, lambda d: d.update(extra=1)), "unknown top-level key"),
    "task not object": (mutate(GOOD_TASKS, lambda d: d["tasks"].append("x")), "must be a JSON object"),
    "id missing": (mutate(GOOD_TASKS, lambda d: d["tasks"][0].pop("id")), "id must be a string"),
    "id with space": (mutate(GOOD_TASKS, lambda d: d["tasks"][0].update(id="a b")), "must match"),
    "id shell injection": (mutate(GOOD_TASKS, lambda d: d["tasks"][0].update(id="$(rm -rf ~)")), "must match"),
    "id too long": (mutate(GOOD_TASKS, lambda d: d["tasks"][0].update(id="a" * 65)), "must match"),
    "id leading dot": (mutate(GOOD_TASKS, lambda d: d["tasks"][0].update(id=".hidden")), "must match"),
    "duplicate id": (mutate(GOOD_TASKS, lambda d: d["tasks"][1].update(id=d["tasks"][0]["id"])), "duplicate task id"),
    "payload list": (mutate(GOOD_TASKS, lambda d: d["tasks"][0].update(payload=[1])), "payload must be a JSON object"),
    "unknown task key": (mutate(GOOD_TASKS, lambda d: d["tasks"][0].update(cmd="ls")), "unknown key"),
    "repeat string": (mutate(GOOD_TASKS, lambda d: d["tasks"][0]["payload"].update(repeat="2")), "repeat must be an integer"),
    "repeat bool": (mutate(GOOD_TASKS, lambda d: d["tasks"][0]["payload"].update(repeat=True)), "repeat must be an integer"),
    "repeat zero": (mutate(GOOD_TASKS, lambda d: d["tasks"][0]["payload"].update(repeat=0)), "repeat must be an integer"),
    "repeat huge": (mutate(GOOD_TASKS, lambda d: d["tasks"][0]["payload"].update(repeat=10**9)), "repeat must be an integer"),
    "message empty": (mutate(GOOD_TASKS, lambda d: d["tasks"][0]["payload"].update(message="")), "payload.message"),
    "message number": (mutate(GOOD_TASKS, lambda d: d["tasks"][0]["payload"].update(message=5)), "payload.message"),
    "unknown payload key": (mutate(GOOD_TASKS, lambda d: d["tasks"][0]["payload"].update(x=1)), "unknown payload key"),
    "payload too big": (mutate(GOOD_TASKS, lambda d: d["tasks"][0]["payload"].update(blob="x" * 1_100_000)), "bytes, over"),
}

EXPECTED_CASES = {
    "expected version": (mutate(GOOD_EXPECTED, lambda d: d.update(schemaVersion=3)), "schemaVersion must be 1"),
    "expected missing task": (mutate(GOOD_EXPECTED, lambda d: d["results"].pop()), "no expected result for task"),
    "expected extra task": (mutate(GOOD_EXPECTED, lambda d: d["results"].append(
        {**d["results"][0], "taskId": "task-zzz"})), "is not a task of the input"),
    "expected duplicate": (mutate(GOOD_EXPECTED, lambda d: d["results"].append(d["results"][0])), "duplicate taskId"),
    "expected bad digest": (mutate(GOOD_EXPECTED, lambda d: d["results"][0].update(sha256="f" * 64)), "not the digest"),
    "expected uppercase digest": (mutate(GOOD_EXPECTED, lambda d: d["results"][0].update(
        sha256=d["results"][0]["sha256"].upper())), "64 lowercase hex"),
    "expected output not string": (mutate(GOOD_EXPECTED, lambda d: d["results"][0].update(output=None)), "output must be a string"),
}


def validate(tmp_path, tasks, expected, *extra):
    tasks_path = tmp_path / "tasks.json"
    if isinstance(tasks, (bytes, str)):
        tasks_path.write_bytes(tasks if isinstance(tasks, bytes) else tasks.encode())
    else:
        write_json(tasks_path, tasks)
    summary = tmp_path / "inputs.json"
    done = run_script("validate_inputs.py", "--tasks", tasks_path, "--expected",
                      write_json(tmp_path / "expected.json", expected), "--workers", 2, "--output", summary, *extra)
    return done, summary


def assert_refused(done, summary, words, diag="input"):
    assert done.returncode != 0
    assert done.stderr.count("\n") == 1, done.stderr
    assert f"[{diag}]" in done.stderr and words in done.stderr, done.stderr
    assert not summary.exists()


@pytest.mark.parametrize("case", sorted(TASK_CASES))
def test_malformed_tasks(tmp_path, case):
    tasks, words = TASK_CASES[case]
    assert_refused(*validate(tmp_path, tasks, GOOD_EXPECTED), words)


@pytest.mark.parametrize("case", sorted(EXPECTED_CASES))
def test_malformed_expected(tmp_path, case):
    expected, words = EXPECTED_CASES[case]
    assert_refused(*validate(tmp_path, GOOD_TASKS, expected), words)


@pytest.mark.parametrize("raw, words", [
    (b"{not json", "is not valid JSON"),
    (b"\xff\xfe", "is not UTF-8"),
    (b'{"schemaVersion": NaN, "tasks": []}', "non-standard JSON constant"),
    (b"", "is not valid JSON"),
])
def test_unparseable_task_files(tmp_path, raw, words):
    assert_refused(*validate(tmp_path, raw, GOOD_EXPECTED), words)


def test_missing_file(tmp_path):
    summary = tmp_path / "inputs.json"
    done = run_script("validate_inputs.py", "--tasks", tmp_path / "nope.json", "--expected", tmp_path / "e.json",
                      "--workers", 1, "--output", summary)
    assert_refused(done, summary, "does not exist")


def test_image_sidecar_checked(tmp_path):
    image = tmp_path / "stack.sif"
    image.write_bytes(b"not really an image")
    done, summary = validate(tmp_path, GOOD_TASKS, GOOD_EXPECTED, "--image", image)
    assert_refused(done, summary, "has no SHA-256 sidecar", diag="integrity")
    (tmp_path / "stack.sif.sha256").write_text("0" * 64 + "  stack.sif\n")
    done, summary = validate(tmp_path, GOOD_TASKS, GOOD_EXPECTED, "--image", image)
    assert_refused(done, summary, "does not match its sidecar", diag="integrity")
    import hashlib

    (tmp_path / "stack.sif.sha256").write_text(hashlib.sha256(image.read_bytes()).hexdigest() + "  stack.sif\n")
    done, summary = validate(tmp_path, GOOD_TASKS, GOOD_EXPECTED, "--image", image)
    assert done.returncode == 0, done.stderr
    assert json.loads(summary.read_text())["imageSha256"]


def test_good_inputs_summary(tmp_path):
    done, summary = validate(tmp_path, GOOD_TASKS, GOOD_EXPECTED)
    assert done.returncode == 0, done.stderr
    assert json.loads(summary.read_text())["taskCount"] == 3


def test_the_decision_record_is_written_only_after_the_inputs_passed(tmp_path):
    decisions = json.dumps({key: {"owner": "launch script", "how": f"how {key}"} for key in
                            ("allocation", "startup_order", "runtime_state", "service_access", "accelerators")})
    record = tmp_path / "decision-record.md"
    extra = ("--decision-record", record, "--run", "r1", "--decisions-json", decisions, "--facts-json", '{"nodes": 1}')
    bad = make_tasks(3)
    bad["tasks"][1]["payload"]["repeat"] = 0
    done, summary = validate(tmp_path, bad, expected_for(make_tasks(3)), *extra)
    assert_refused(done, summary, "payload.repeat")
    assert not record.exists()  # bad inputs write nothing, not even the record
    tasks = make_tasks(3)
    done, summary = validate(tmp_path, tasks, expected_for(tasks), *extra)
    assert done.returncode == 0, done.stderr
    text = record.read_text()
    assert text.startswith("# Decision record: run `r1`") and "how runtime_state" in text and "- nodes: `1`" in text


def reversed_expected(document):
    return {**document, "results": document["results"][::-1]}


PAYLOAD_CASES = ("repeat zero", "message number", "unknown payload key")


@pytest.mark.parametrize("case", ["good", "good in another order", "child fails", *sorted(EXPECTED_CASES),
                                  *PAYLOAD_CASES, "payload and expected both bad"])
def test_the_documents_checked_in_children_give_the_same_verdict(case, tmp_path, capsys, monkeypatch):
    """A large expected document is checked in a forked child while the task document is read, a large
    task document's baseline payloads in another once it is read (validate_inputs.FORK_BYTES, here 0):
    the same exit code, the same one line (the payloads' problem before the expected results'), the same
    summary as when this process checks them; good documents, the expected results in the task order or
    another, are accepted on the children's word alone."""
    import validate_inputs

    from allocstack.common import taskset

    tasks = GOOD_TASKS
    expected = GOOD_EXPECTED if case.startswith(("good", "child", "payload")) or case in PAYLOAD_CASES \
        else EXPECTED_CASES[case][0]
    if case == "good in another order":
        expected = reversed_expected(expected)
    if case in PAYLOAD_CASES:
        tasks = TASK_CASES[case][0]
    if case == "payload and expected both bad":
        tasks, expected = TASK_CASES["repeat zero"][0], EXPECTED_CASES["expected bad digest"][0]
    tasks_path = write_json(tmp_path / "tasks.json", tasks)
    expected_path = write_json(tmp_path / "expected.json", expected)
    seen = {}
    for fork_bytes in (1 << 40, 0):
        monkeypatch.setattr(validate_inputs, "FORK_BYTES", fork_bytes)
        calls = {"expected": [], "payloads": []}
        monkeypatch.setattr(validate_inputs, "load_expected_and_digest", lambda *a, calls=calls, **k:
                            calls["expected"].append(1) or taskset.load_expected_and_digest(*a, **k))
        monkeypatch.setattr(validate_inputs, "check_baseline_tasks", lambda *a, calls=calls, real=
                            validate_inputs.check_baseline_tasks, **k: calls["payloads"].append(1) or real(*a, **k))
        if case == "child fails":
            monkeypatch.setattr(validate_inputs, "expected_facts", lambda path: 1 / 0)
        summary = tmp_path / f"inputs-{fork_bytes}.json"
        code = validate_inputs.main(["--tasks", str(tasks_path), "--expected", str(expected_path), "--workers", "2",
                                     "--output", str(summary)])
        seen[fork_bytes] = (code, capsys.readouterr().err, summary.read_bytes() if summary.exists() else None)
        monkeypatch.undo()
        if fork_bytes == 0:  # only a child's "valid" is taken as it is: anything else is checked here
            payload_case = case in PAYLOAD_CASES or case.startswith("payload")
            assert calls["expected"] == ([] if case.startswith("good") or payload_case else [1])
            assert calls["payloads"] == ([1] if payload_case else [])
    assert seen[0] == seen[1 << 40]
    assert (seen[0][0] == 0) == (case.startswith("good") or case == "child fails")
    if case.startswith("payload"):
        assert "payload.repeat" in seen[0][1]


@pytest.mark.parametrize("expected_order", ["task", "another"])
def test_a_realistic_task_set_gets_the_same_summary_from_the_children(expected_order, tmp_path, monkeypatch):
    """Shuffled ids, non-ASCII and escaped outputs (make_tasks.py's realistic shape): the children (the expected
    results' told the tasks' sorted order when they list them in the task order, finding it themselves
    otherwise) make the summary this process makes alone, byte for byte, and their word is taken."""
    import validate_inputs
    from make_tasks import realistic_tasks

    tasks = realistic_tasks(300, seed=5)
    expected = expected_for(tasks)
    if expected_order == "another":
        expected["results"].sort(key=lambda r: r["sha256"])
    tasks_path = write_json(tmp_path / "tasks.json", tasks)
    expected_path = write_json(tmp_path / "expected.json", expected)
    summaries = []
    for fork_bytes in (1 << 40, 0):
        monkeypatch.setattr(validate_inputs, "FORK_BYTES", fork_bytes)
        calls = []
        monkeypatch.setattr(validate_inputs, "load_expected_and_digest", lambda *a, calls=calls, real=validate_inputs.
                            load_expected_and_digest, **k: calls.append(1) or real(*a, **k))
        summary = tmp_path / f"inputs-{fork_bytes}.json"
        assert validate_inputs.main(["--tasks", str(tasks_path), "--expected", str(expected_path), "--workers", "2",
                                     "--output", str(summary)]) == 0
        summaries.append(summary.read_bytes())
        monkeypatch.undo()
        assert calls == ([1] if fork_bytes else [])
    assert summaries[0] == summaries[1]
