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
