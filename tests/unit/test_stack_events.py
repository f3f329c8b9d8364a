"""The stack's notable events as the coordinator reads them while the run goes on (allocstack/status/stackevents.py)."""

from __future__ import annotations

import json

from allocstack.common.events import append_event
from allocstack.status.stackevents import EventTail, describe


def test_each_notable_event_is_one_line_and_the_others_none():
    assert describe({"event": "worker-restart", "worker": "worker-02", "attempt": 2, "exitCode": 1,
                     "how": "exited 1"}) == "worker worker-02 restarted by its restart policy (attempt 2): it exited 1"
    assert describe({"event": "gate-failed", "reason": "service kv ended before it was ready"}) == \
        "gate failed: service kv ended before it was ready"
    assert describe({"event": "listening-exposed", "kind": "service"}) is None  # fields missing: no line, no crash
    assert describe({"event": "worker-start", "worker": "worker-01"}) is None


def test_only_what_was_appended_since_the_last_look_is_read(tmp_path):
    logs = tmp_path / "events"
    logs.mkdir()
    tail = EventTail([logs, tmp_path / "absent"])
    assert tail.poll() == []
    append_event(logs / "serve_kv.jsonl", "service-restart", service="kv", attempt=1, exitCode=-9, how="was killed")
    first = tail.poll()
    assert [event["event"] for event in first] == ["service-restart"]
    assert tail.poll() == first  # nothing new: the same events, none twice
    append_event(logs / "run_workers.jsonl", "worker-restart", worker="worker-01", attempt=1, exitCode=3)
    assert [event["line"] for event in tail.poll()][-1] == \
        "worker worker-01 restarted by its restart policy (attempt 1): it exited 3"


def test_a_line_being_written_is_read_once_it_is_whole(tmp_path):
    log = tmp_path / "serve_kv.jsonl"
    line = json.dumps({"t": 1.0, "event": "gate-failed", "reason": "no answer"})
    log.write_text(line[:10])
    tail = EventTail([tmp_path])
    assert tail.poll() == []
    log.write_text(line + "\n")
    assert [event["line"] for event in tail.poll()] == ["gate failed: no answer"]


def test_a_log_that_shrank_is_read_again_from_its_start_and_the_newest_are_kept(tmp_path):
    log = tmp_path / "serve_kv.jsonl"
    tail = EventTail([tmp_path], kept=3)
    for attempt in range(1, 6):
        append_event(log, "service-restart", service="kv", attempt=attempt, exitCode=1)
    assert [event["line"].split("restart ")[-1] for event in tail.poll()] == [
        f"policy (attempt {attempt}): it exited 1" for attempt in (3, 4, 5)]
    log.write_text("")  # a new attempt's log
    append_event(log, "gate-failed", reason="again")
    assert tail.poll()[-1]["line"] == "gate failed: again"
