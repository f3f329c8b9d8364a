"""The coordinator's pieces, each alone: settings, auth, routing, progress (a driven clock), the end record."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from allocstack.common import names
from allocstack.common.errors import AllocstackError
from allocstack.common.taskset import parse_tasks
from allocstack.coordinator import endrecord
from allocstack.coordinator.auth import Tokens
from allocstack.coordinator.httpserver import Request, Response
from allocstack.coordinator.progress import Progress, progress_line
from allocstack.coordinator.routing import Router
from allocstack.coordinator.settings import CoordinatorSettings, parse_settings
from allocstack.coordinator.taskboard import TaskBoard
from conftest import make_tasks


def test_settings_are_a_typed_dataclass_with_scratch_defaults(monkeypatch):
    monkeypatch.delenv("ALLOCSTACK_SCRATCH", raising=False)
    monkeypatch.delenv("SLURM_JOB_END_TIME", raising=False)
    settings = parse_settings(["--input", "t.json", "--results", "out/results.json", "--scratch", "/s", "--workers", "3"])
    assert isinstance(settings, CoordinatorSettings)
    assert settings.endpoint_file == Path("/s") / names.ENDPOINT and settings.events == Path("/s") / names.EVENTS
    assert settings.journal == Path("out").absolute() / names.JOURNAL
    assert (settings.workers, settings.lease_seconds, settings.stop_claims_at) == (3, 60.0, 0.0)
    with pytest.raises(AttributeError):
        settings.workers = 4  # frozen
    monkeypatch.setenv("SLURM_JOB_END_TIME", "1790000000")
    assert parse_settings(["--input", "t", "--results", "r", "--endpoint-file", "e"]).stop_claims_at == 1790000000.0


def test_settings_without_scratch_need_an_endpoint_file(monkeypatch, capsys):
    monkeypatch.delenv("ALLOCSTACK_SCRATCH", raising=False)
    with pytest.raises(SystemExit) as raised:
        parse_settings(["--input", "t", "--results", "r"])
    assert raised.value.code == 64 and "--endpoint-file is required" in capsys.readouterr().err


def request(path: str, method: str = "GET", query: str = "", authorization: str | None = None) -> Request:
    headers = {"authorization": authorization} if authorization is not None else {}
    return Request(method, path, query, headers)


def test_auth_decides_from_the_head():
    tokens = Tokens()
    bearer = f"Bearer {tokens.token}"
    assert tokens.admit(request("/health")) is None
    assert tokens.admit(request("/claim", "POST")).status == 401
    assert tokens.admit(request("/claim", "POST", authorization="Bearer guess")).close  # refused: closed
    assert tokens.admit(request("/claim", "POST", authorization=bearer)) is None
    assert tokens.admit(request("/status", query=f"token={tokens.view_token}")) is None
    assert tokens.admit(request("/ui", query=f"token={tokens.view_token}")) is None
    assert tokens.admit(request("/claim", "POST", query=f"token={tokens.view_token}")).status == 401  # view only
    assert tokens.admit(request("/status", authorization=f"{bearer}, {bearer}")).status == 401  # doubled header
    assert Tokens().token != tokens.token and len(tokens.token) >= 32


def test_routing_answers_404_and_405_with_allow():
    async def ok(request: Request) -> Response:
        return Response(200)

    router = Router({("GET", "/a"): ok, ("POST", "/a"): ok, ("POST", "/b"): ok})

    async def statuses():
        return [await router.dispatch(request(path, method)) for path, method in
                (("/a", "GET"), ("/b", "GET"), ("/c", "GET"), ("/a", "DELETE"))]

    answers = asyncio.run(statuses())
    assert [answer.status for answer in answers] == [200, 405, 404, 405]
    assert answers[1].headers == {"Allow": "POST"} and answers[3].headers == {"Allow": "GET, HEAD, POST"}


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_progress_rate_eta_and_history_on_a_driven_clock():
    mono, wall = Clock(100.0), Clock(1_000_000.0)
    progress = Progress(clock=mono, wall=wall)
    board = TaskBoard(parse_tasks(make_tasks(100)), lease_seconds=10)
    assert progress.rate() == 0.0
    for second in range(41):
        mono.now, wall.now = 100.0 + second, 1_000_000.0 + second
        progress.sample(done=2 * second)  # two results a second
    assert progress.rate() == pytest.approx(2.0)
    assert len(progress.samples) == 31  # a 30 s window
    assert progress.history[0] == (0.0, 0) and progress.history[-1] == (40.0, 80) and len(progress.history) == 41
    board.claim("w", 1, now=mono.now - 1.5)
    summary = progress.summary(board)
    assert summary["done"] == 0 and summary["ratePerSecond"] == 2.0 and summary["etaSeconds"] == 50.0
    assert summary["elapsedSeconds"] == 40.0 and summary["readySeconds"] is None
    assert summary["workers"]["w"]["lastSeenSecondsAgo"] == 1.5 and summary["draining"] is False
    assert progress_line(summary) == "coordinator: progress 0/100 done, 1 leased, 2 tasks/s, eta 50 s"


def test_the_end_record_writer_and_its_readers(tmp_path):
    path = tmp_path / "coordinator.json"
    endrecord.ended_before_ready(path)  # no record yet: the gate keeps waiting
    endrecord.write_startup_failure(path, AllocstackError("storage", "not enough room"), ended_at=1.0)
    with pytest.raises(AllocstackError, match=r"ended before it was ready: allocstack: error \[storage\]: not"):
        endrecord.ended_before_ready(path)
    with pytest.raises(AllocstackError) as raised:
        endrecord.check_completed(endrecord.read(path), 1, "in", "out")
    assert raised.value.diag == "coordinator-exit"
    record = endrecord.write(path, endrecord.COMPLETED, "all tasks done", taskCount=2, resultCount=2,
                             inputSha256="in", resultsSha256="out")
    assert json.loads(path.read_text()) == record and record["schemaVersion"] == 1
    endrecord.check_completed(record, 2, "in", "out")
    for task_count, digests, diag in ((3, ("in", "out"), "verification"), (2, ("other", "out"), "verification"),
                                      (2, ("in", "other"), "verification")):
        with pytest.raises(AllocstackError) as raised:
            endrecord.check_completed(record, task_count, *digests)
        assert raised.value.diag == diag
    failed = {"status": endrecord.FAILED, "failedTasks": {"t1": "exit 3: boom"}}
    with pytest.raises(AllocstackError, match=r"1 of 2 task\(s\) failed for good, e\.g\. t1: exit 3: boom") as raised:
        endrecord.check_completed(failed, 2, "in", "out")
    assert raised.value.diag == "task-failed"
    # the record lists the first 100 failures; failedCount counts them all (the summary's and this line's count)
    many = {"status": endrecord.FAILED, "failedTasks": {f"t{n}": "exit 1" for n in range(100)}, "failedCount": 200}
    with pytest.raises(AllocstackError, match=r"^200 of 200 task\(s\) failed for good"):
        endrecord.check_completed(many, 200, "in", "out")
    # results another program produced (its identity differs from this run's) are not this run's
    produced = {**record, "identity": "a" * 64}
    endrecord.check_completed(produced, 2, "in", "out", "a" * 64)
    with pytest.raises(AllocstackError, match="produced by another program than this run's") as raised:
        endrecord.check_completed(produced, 2, "in", "out", "b" * 64)
    assert raised.value.diag == "verification"
