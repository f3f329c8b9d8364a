"""Every attempt starts clean (allocstack/common/attempts.py ``begin_attempt``): the first launcher of an attempt
clears what an earlier attempt left; a later launcher of the same attempt changes nothing."""

from __future__ import annotations

import json

from allocstack.common import attempts
from allocstack.common.attempts import ATTEMPT_MARK, Command, attempt_of, begin_attempt


def an_earlier_attempt(scratch, state, marker):
    """What an interrupted attempt leaves: a service's end record, a gate's note, a volume with data, the shared
    endpoint for the other nodes, the journal, and the success marker of an attempt before it."""
    (scratch / "services").mkdir(parents=True)
    (scratch / "services/redis.end.json").write_text(json.dumps({"status": "failed", "how": "exited 1"}))
    (scratch / "ended").mkdir()
    (scratch / "ended/redis-readiness.json").write_text("{}")
    (scratch / "volumes/data").mkdir(parents=True)
    (scratch / "volumes/data/dump.rdb").write_text("20 jobs")
    (state / "services").mkdir(parents=True)
    (state / "services/redis.json").write_text("{}")
    (state / "journal.jsonl").write_text('{"task": 1}\n')
    (state / "volumes/kept").mkdir(parents=True)
    (state / "volumes/kept/carried").write_text("yes")
    marker.parent.mkdir(parents=True)
    marker.write_text('{"status": "success"}')


def test_the_first_launcher_of_an_attempt_clears_what_an_earlier_attempt_left(tmp_path):
    scratch, state, marker = tmp_path / "scratch", tmp_path / "state", tmp_path / "results/run/result.json"
    an_earlier_attempt(scratch, state, marker)
    attempt = attempt_of(Command("vm", 42, 7), None)
    assert begin_attempt(scratch, state, attempt, marker)
    assert sorted(p.name for p in scratch.iterdir()) == [ATTEMPT_MARK]  # volumes, end records, notes: gone
    assert not marker.exists()  # no success marker of an earlier attempt outlives this one's start
    assert sorted(p.name for p in state.iterdir() if not p.name.startswith(".")) == \
        [ATTEMPT_MARK, "journal.jsonl", "volumes"]  # the journal resumes; a kept volume is carried
    assert (state / "volumes/kept/carried").read_text() == "yes"

    # the attempt's other launchers: what the first one's components wrote meanwhile stays
    (scratch / "services").mkdir()
    (scratch / "services/redis.json").write_text("{}")
    marker.write_text('{"status": "success"}')
    assert not begin_attempt(scratch, state, attempt, marker)
    assert (scratch / "services/redis.json").exists() and marker.exists()


def test_another_job_of_the_same_command_is_another_attempt(tmp_path):
    scratch, state, marker = tmp_path / "scratch", tmp_path / "state", tmp_path / "result.json"
    scratch.mkdir()
    command = Command("vm", 42, 7)
    assert begin_attempt(scratch, state, attempt_of(command, "101"), marker)
    (scratch / "endpoint.json").write_text("{}")
    assert begin_attempt(scratch, state, attempt_of(command, "102"), marker)  # the profile's retry
    assert not (scratch / "endpoint.json").exists()
    assert attempts.read_record(state / ATTEMPT_MARK)["attempt"] == attempt_of(command, "102")


def test_a_launcher_without_scratch_still_clears_the_state_and_the_marker(tmp_path):
    state, marker = tmp_path / "state", tmp_path / "result.json"
    (state / "events").mkdir(parents=True)
    marker.write_text("{}")
    assert begin_attempt(None, state, attempt_of(Command("vm", 1, 1), None), marker)
    assert not (state / "events").exists() and not marker.exists()


def test_only_a_command_that_runs_jobs_sets_an_earlier_attempt_aside(tmp_path):
    assert attempts.runs_jobs(["--cores", "4", "--configfile", "config/x.yaml"])
    assert attempts.runs_jobs(["--profile", "profiles/slurm", "--forceall"])
    for quiet in (["-n"], ["-np"], ["--dry-run"], ["--lint"], ["--report", "r.html"], ["--list-rules"], ["--dag"],
                  ["--summary"], ["--touch"], ["--unlock"]):
        assert not attempts.runs_jobs(["--cores", "1", *quiet]), quiet
    results, marker = tmp_path / "results/run", tmp_path / "results/run/result.json"
    (results / "workers").mkdir(parents=True)
    (results / "workers/worker-01.json").write_text("{}")
    (results / "inputs.json").write_text("{}")
    keep = ("inputs.json",)
    assert attempts.set_aside(results, marker, keep, "earlier-attempt") == ["workers"]
    assert (results / "earlier-attempt/workers/worker-01.json").exists() and (results / "inputs.json").exists()
    assert attempts.set_aside(results, marker, keep, "earlier-attempt") == []  # nothing left to set aside
    (results / "check.json").write_text("{}")
    marker.write_text("{}")
    assert attempts.set_aside(results, marker, keep, "earlier-attempt") == []  # a run with its marker is done
