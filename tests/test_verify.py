"""Verification: only correct, complete, once-each results get a success marker."""

from __future__ import annotations

import copy
import hashlib
import json

import pytest

from conftest import expected_for, make_tasks, run_script, write_json


def digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


@pytest.fixture
def run_files(tmp_path):
    tasks = make_tasks(5)
    expected = expected_for(tasks)
    results = {"schemaVersion": 1, "results": [{**r, "workerId": "worker-01"} for r in expected["results"]]}
    return tmp_path, tasks, expected, results


def verify(tmp_path, tasks, expected, results, *extra):
    marker = tmp_path / "result.json"
    done = run_script("verify.py", "--input", write_json(tmp_path / "tasks.json", tasks),
                      "--expected", write_json(tmp_path / "expected.json", expected),
                      "--results", write_json(tmp_path / "results.json", results), "--output", marker, *extra)
    return done, marker


def test_success_marker_format(run_files):
    tmp_path, tasks, expected, results = run_files
    results["results"].reverse()
    done, marker = verify(tmp_path, tasks, expected, results)
    assert done.returncode == 0, done.stderr
    document = json.loads(marker.read_text())
    assert document["status"] == "success" and document["schemaVersion"] == 1 and document["taskCount"] == 5
    assert [r["taskId"] for r in document["results"]] == sorted(r["taskId"] for r in results["results"])
    assert document["inputSha256"] == hashlib.sha256((tmp_path / "tasks.json").read_bytes()).hexdigest()
    assert document["resultsSha256"] == hashlib.sha256((tmp_path / "results.json").read_bytes()).hexdigest()
    assert marker.stat().st_mode & 0o777 == 0o600


def _dup(r):
    r["results"].append(copy.deepcopy(r["results"][0]))


def _drop(r):
    r["results"].pop()


def _wrong_output(r):
    r["results"][1]["output"] = "wrong"
    r["results"][1]["sha256"] = digest("wrong")


def _wrong_digest(r):
    r["results"][2]["sha256"] = "0" * 64


def _unknown_id(r):
    r["results"][0]["taskId"] = "task-999999"


def _extra_key(r):
    r["results"][0]["extra"] = 1


def _bad_version(r):
    r["schemaVersion"] = 2


@pytest.mark.parametrize("corrupt, words", [
    (_dup, "duplicate task id"),
    (_drop, "no result for"),
    (_wrong_output, "differs from the expected"),
    (_wrong_digest, "not the digest"),
    (_unknown_id, "unexpected task id"),
    (_extra_key, "exactly taskId"),
    (_bad_version, "schemaVersion 1"),
])
def test_bad_results_fail_with_one_line_and_no_marker(run_files, corrupt, words):
    tmp_path, tasks, expected, results = run_files
    (tmp_path / "result.json").write_text("stale marker from an earlier run")
    corrupt(results)
    done, marker = verify(tmp_path, tasks, expected, results)
    assert done.returncode == 65
    assert words in done.stderr and done.stderr.count("\n") == 1 and "[verification]" in done.stderr
    assert not marker.exists()


def test_end_record_must_say_completed_for_these_results(run_files):
    tmp_path, tasks, expected, results = run_files
    end = tmp_path / "end.json"
    write_json(end, {"status": "incomplete", "reason": "signal:SIGKILL"})
    done, marker = verify(tmp_path, tasks, expected, results, "--end-record", end)
    assert done.returncode == 70 and "[coordinator-exit]" in done.stderr and "not completed" in done.stderr
    assert not marker.exists()
    done, marker = verify(tmp_path, tasks, expected, results, "--end-record", tmp_path / "missing.json")
    assert done.returncode == 70 and "does not exist" in done.stderr and not marker.exists()


def test_events_must_show_gate_before_workers(run_files):
    tmp_path, tasks, expected, results = run_files
    events = tmp_path / "events.jsonl"
    events.write_text('{"t": 2.0, "event": "gate-passed"}\n{"t": 1.0, "event": "worker-start", "worker": "worker-01"}\n')
    done, marker = verify(tmp_path, tasks, expected, results, "--events", events)
    assert done.returncode == 65 and "before the gate passed" in done.stderr and not marker.exists()


def test_verification_is_linear(tmp_path):
    """100,000 results verify in well under the time a quadratic check would take."""
    import time

    tasks = make_tasks(100_000)
    expected = expected_for(tasks)
    results = {"schemaVersion": 1, "results": [{**r, "workerId": "w"} for r in expected["results"]]}
    started = time.monotonic()
    done, _marker = verify(tmp_path, tasks, expected, results)
    assert done.returncode == 0, done.stderr
    assert time.monotonic() - started < 30


def validated_summary(tmp_path, tasks, expected):
    """validate_inputs.py's real summary of these documents (their digests), as the workflow passes it."""
    summary = tmp_path / "inputs.json"
    done = run_script("validate_inputs.py", "--tasks", write_json(tmp_path / "tasks.json", tasks),
                      "--expected", write_json(tmp_path / "expected.json", expected), "--workers", "1",
                      "--output", summary)
    assert done.returncode == 0, done.stderr
    return summary


def _swap_tasks(tmp_path):  # another (valid) task set after validation: its expected results no longer fit
    write_json(tmp_path / "tasks.json", make_tasks(6))


def _corrupt_tasks(tmp_path):
    (tmp_path / "tasks.json").write_text('{"schemaVersion": 1, "tasks": [')


def _corrupt_expected(tmp_path):
    (tmp_path / "expected.json").write_text("not json")


def _edit_expected(tmp_path):  # still valid, but not what was validated: its new output is what counts
    document = json.loads((tmp_path / "expected.json").read_text())
    document["results"][1].update(output="other", sha256=digest("other"))
    write_json(tmp_path / "expected.json", document)


def _wrong_expected_digest(tmp_path):  # as _wrong_digest makes result 3's: only validation tells
    document = json.loads((tmp_path / "expected.json").read_text())
    document["results"][2]["sha256"] = "0" * 64
    write_json(tmp_path / "expected.json", document)


def _no_results(tmp_path):  # read after both documents are hashed: still their errors first
    (tmp_path / "results.json").unlink()


def _no_tasks_nor_results(tmp_path):
    (tmp_path / "results.json").unlink()
    (tmp_path / "tasks.json").unlink()


def _no_expected(tmp_path):
    (tmp_path / "expected.json").unlink()


@pytest.mark.parametrize("corrupt, change", [
    *((corrupt, None) for corrupt in (None, _dup, _drop, _wrong_output, _wrong_digest, _unknown_id, _extra_key,
                                      _bad_version, reversed)),
    *((None, change) for change in (_swap_tasks, _corrupt_tasks, _corrupt_expected, _edit_expected, _no_results,
                                    _no_tasks_nor_results, _no_expected)),
    (_wrong_digest, _wrong_expected_digest), (reversed, _swap_tasks),
])
@pytest.mark.parametrize("as_the_coordinator_writes", [False, True])
def test_validated_inputs_give_the_same_verdict(run_files, corrupt, change, as_the_coordinator_writes):
    """Documents whose digests validate_inputs' summary holds are not checked again: the same marker, or the
    same one line, as when every document is checked again (also for a file swapped after validation).
    results.json in the coordinator's text: the marker is written ahead while the results are checked,
    and put in place only if they pass (no temp file is left either way)."""
    tmp_path, tasks, expected, results = run_files
    summary = validated_summary(tmp_path, tasks, expected)
    if corrupt is reversed:
        results["results"].reverse()
    elif corrupt:
        corrupt(results)
    end = write_json(tmp_path / "end.json", {})
    outcomes = []
    for extra in ((), ("--inputs-summary", summary)):
        (tmp_path / "result.json").unlink(missing_ok=True)
        if as_the_coordinator_writes:
            (tmp_path / "results.json").write_text(json.dumps(results, indent=2, sort_keys=True) + "\n")
        else:
            write_json(tmp_path / "results.json", results)
        raw_results = (tmp_path / "results.json").read_bytes()
        write_json(end, {"status": "completed", "resultCount": 5, "inputSha256": hashlib.sha256(
            (tmp_path / "tasks.json").read_bytes()).hexdigest(), "resultsSha256": hashlib.sha256(raw_results).hexdigest()})
        if change:
            change(tmp_path)
        marker = tmp_path / "result.json"
        done = run_script("verify.py", "--input", tmp_path / "tasks.json", "--expected", tmp_path / "expected.json",
                          "--results", tmp_path / "results.json", "--end-record", end, "--output", marker, *extra)
        outcomes.append((done.returncode, done.stderr, marker.read_bytes() if marker.exists() else None))
        assert not list(tmp_path.glob(".result.json.*"))
        write_json(tmp_path / "tasks.json", tasks)
        write_json(tmp_path / "expected.json", expected)
    assert outcomes[0] == outcomes[1]
    assert (outcomes[0][0] == 0) == (change is None and corrupt in (None, reversed))


def test_validated_inputs_are_not_checked_again(run_files, monkeypatch):
    """The summary's digests skip the documents' checks only while the files are the bytes validated."""
    import verify

    tmp_path, tasks, expected, results = run_files
    summary = validated_summary(tmp_path, tasks, expected)
    write_json(tmp_path / "results.json", results)
    args = verify.parse_args(["--input", str(tmp_path / "tasks.json"), "--expected", str(tmp_path / "expected.json"),
                              "--results", str(tmp_path / "results.json"), "--output", str(tmp_path / "result.json"),
                              "--inputs-summary", str(summary)])
    facts, records = verify.verify_validated(args)
    again, checked = verify.verify_one_by_one(args)
    assert (facts, verify.msgspec.to_builtins(records)) == (again, verify.msgspec.to_builtins(checked))
    assert facts["taskCount"] == 5 and facts["inputSha256"] == json.loads(summary.read_text())["inputSha256"]
    write_json(tmp_path / "tasks.json", {**tasks, "tasks": list(reversed(tasks["tasks"]))})  # valid, not validated
    assert verify.verify_validated(args) is None
    write_json(tmp_path / "tasks.json", tasks)
    results["results"].reverse()  # not in the order of the ids: checked one by one
    write_json(tmp_path / "results.json", results)
    assert verify.verify_validated(args) is None and verify.verify_one_by_one(args)[0] == facts | {
        "resultsSha256": hashlib.sha256((tmp_path / "results.json").read_bytes()).hexdigest()}


def test_the_coordinators_results_list_is_copied_into_the_marker(run_files):
    """results.json as the coordinator writes it (json.dumps' text, its digest in the end record), in task
    order: its list is copied into the marker, which is the text every other path writes."""
    import verify

    tmp_path, tasks, expected, results = run_files
    results["results"][3]["output"] = expected["results"][3]["output"] = 'quote " \\ \n ü'
    results["results"][3]["sha256"] = expected["results"][3]["sha256"] = digest('quote " \\ \n ü')
    summary = validated_summary(tmp_path, tasks, expected)
    (tmp_path / "results.json").write_text(json.dumps(results, indent=2, sort_keys=True) + "\n")
    raw = (tmp_path / "results.json").read_bytes()
    end = write_json(tmp_path / "end.json", {"status": "completed", "resultCount": 5, "resultsSha256": hashlib.sha256(
        raw).hexdigest(), "inputSha256": hashlib.sha256((tmp_path / "tasks.json").read_bytes()).hexdigest()})
    common = ["--input", str(tmp_path / "tasks.json"), "--expected", str(tmp_path / "expected.json"),
              "--results", str(tmp_path / "results.json"), "--end-record", str(end)]
    facts, staged = verify.verify_validated(verify.parse_args([*common, "--output", str(tmp_path / "x"),
                                                               "--inputs-summary", str(summary)]))
    assert isinstance(staged.listing, memoryview)  # copied, not written again: written ahead, while checked
    staged.discard()
    assert sorted(path.name for path in tmp_path.iterdir() if path.name.startswith(".x")) == []
    markers = []
    for extra in (("--inputs-summary", summary), ()):
        done = run_script("verify.py", *common, "--output", tmp_path / "result.json", *extra)
        assert done.returncode == 0, done.stderr
        markers.append((tmp_path / "result.json").read_bytes())
    document = {"schemaVersion": 1, "status": "success", **facts, "results": results["results"]}
    assert markers[0] == markers[1] == (json.dumps(document, indent=2, sort_keys=True) + "\n").encode()


@pytest.mark.parametrize("expected_order", ["task", "another"])
@pytest.mark.parametrize("as_the_coordinator_writes", [False, True])
def test_realistic_task_sets_take_the_validated_path(tmp_path, expected_order, as_the_coordinator_writes):
    """Shuffled ids of several forms and outputs with non-ASCII text (outside the BMP too), quotes, backslashes and
    control characters (make_tasks.py's realistic shape; the expected results in the task order or another):
    the validated path accepts them as they are, without checking a document again, and the marker is the one
    every path writes; a result changed in any field is still refused."""
    import verify
    from make_tasks import realistic_tasks

    tasks = realistic_tasks(200, seed=7)
    expected = expected_for(tasks)
    assert [task["id"] for task in tasks["tasks"]] != sorted(task["id"] for task in tasks["tasks"])
    assert any(not r["output"].isascii() for r in expected["results"])
    if expected_order == "another":
        expected["results"].sort(key=lambda r: r["sha256"])
    results = {"schemaVersion": 1, "results": sorted(({**r, "workerId": "worker-01"} for r in expected["results"]),
                                                     key=lambda r: r["taskId"])}
    summary = validated_summary(tmp_path, tasks, expected)
    for change in (None, "output", "sha256", "taskId"):
        changed = copy.deepcopy(results)
        if change:
            changed["results"][7][change] = {"output": "wrong", "sha256": "0" * 64, "taskId": "zz-not-a-task"}[change]
        path = tmp_path / "results.json"
        if as_the_coordinator_writes:
            path.write_text(json.dumps(changed, indent=2, sort_keys=True) + "\n")
        else:
            write_json(path, changed)
        end = write_json(tmp_path / "end.json", {
            "status": "completed", "resultCount": 200, "resultsSha256": hashlib.sha256(path.read_bytes()).hexdigest(),
            "inputSha256": hashlib.sha256((tmp_path / "tasks.json").read_bytes()).hexdigest()})
        common = ["--input", str(tmp_path / "tasks.json"), "--expected", str(tmp_path / "expected.json"),
                  "--results", str(path), "--end-record", str(end), "--output", str(tmp_path / "result.json")]
        checked = verify.verify_validated(verify.parse_args([*common, "--inputs-summary", str(summary)]))
        if change:
            assert checked is None  # left to the checks one by one, which refuse it
            assert run_script("verify.py", *common, "--inputs-summary", summary).returncode == 65
            continue
        assert checked is not None and checked[0]["taskCount"] == 200
        verify.discard(checked[1])
        markers = []
        for extra in (("--inputs-summary", summary), ()):
            done = run_script("verify.py", *common, *extra)
            assert done.returncode == 0, done.stderr
            markers.append((tmp_path / "result.json").read_bytes())
        assert markers[0] == markers[1]
