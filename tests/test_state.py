"""The task board, the journal and job-scoped scratch, tested directly."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import pytest

from allocstack.common.errors import AllocstackError
from allocstack.common.jsonio import atomic_write_json
from allocstack.common.scratch import ensure_private_dir, resolve_root, run_scratch
from allocstack.common.taskset import parse_tasks
from allocstack.coordinator.journal import Journal, replay
from allocstack.coordinator.taskboard import TaskBoard, fair_share
from conftest import make_tasks


def result_for(task):
    import hashlib

    out = task["payload"]["message"] * task["payload"]["repeat"]
    return {"taskId": task["id"], "output": out, "sha256": hashlib.sha256(out.encode()).hexdigest()}


def new_board(count, **options):
    return TaskBoard(parse_tasks(make_tasks(count)), **options)


def granted(board, claim):
    """The tasks a claim handed out, as a worker receives them."""
    return [json.loads(board.tasks.task_json(position)) for position in claim.positions]


def accept(board, worker, result, now):
    staged, rejected = board.stage(worker, [result], now)
    assert not rejected, rejected
    board.commit(staged, now)


def test_board_exactly_once_with_expiry_and_late_results():
    board = new_board(3, lease_seconds=10)
    [first] = granted(board, board.claim("a", 1, now=0))
    assert board.expire(now=5) == []
    assert board.expire(now=11) == [first["id"]]
    [again] = granted(board, board.claim("b", 1, now=11))
    assert again["id"] == first["id"]  # requeued at the front
    late = result_for(first)
    assert board.check(late).accepted
    accept(board, "a", late, now=12)  # the late worker wins; b's result is now a duplicate
    assert board.check(result_for(again)).code == 409
    assert board.counts() == {"total": 3, "pending": 2, "leased": 0, "done": 1, "failed": 0}
    assert [t["id"] for t in granted(board, board.claim("b", 10, now=13))] == ["task-000001", "task-000002"]


def test_board_heartbeat_keeps_lease():
    board = new_board(1, lease_seconds=10)
    [task] = granted(board, board.claim("a", 1, now=0))
    assert board.heartbeat("a", [task["id"]], now=8) == [task["id"]]
    assert board.heartbeat("b", [task["id"]], now=8) == []
    assert board.expire(now=15) == []
    assert board.expire(now=19) == [task["id"]]


def test_fair_share_gives_every_worker_work_while_tasks_are_at_least_workers():
    # 4 tasks, 2 workers, batch 64: the first gets its half, then waits while the other's half is held
    assert fair_share(64, 4, 2, newcomer=True, waiting=1, reserve_each=2) == 2
    assert fair_share(64, 2, 2, waiting=1, reserve_each=2) == 0
    assert fair_share(64, 2, 2, newcomer=True, waiting=0, reserve_each=2) == 2
    # as many tasks as workers: one each, the last comer included
    assert [fair_share(64, 3 - i, 3, newcomer=True, waiting=2 - i, reserve_each=1) for i in range(3)] == [1, 1, 1]
    # the reservation lapsed (reserve_each 0): an equal share of what is pending, never more than asked
    assert fair_share(64, 10, 2) == 5 and fair_share(3, 10, 2) == 3 and fair_share(64, 1, 8) == 1
    assert fair_share(256, 100_000, 8, newcomer=True, waiting=7, reserve_each=12_500) == 256
    assert fair_share(64, 0, 2) == 0


def test_a_claim_gets_an_equal_share_of_the_unfinished_work_whatever_the_others_hold():
    """Thousands of workers: each worker's share is of the tasks without a result (pending and leased), so
    claims do not shrink as the others take theirs (one claim a worker does, not several); never more than is
    pending, nor than asked."""
    assert fair_share(64, 100, 8, unfinished=800) == 64 and fair_share(64, 40, 8, unfinished=800) == 40
    assert fair_share(64, 10, 2, unfinished=10) == fair_share(64, 10, 2) == 5
    board = TaskBoard(parse_tasks(make_tasks(1000)), lease_seconds=60, expected_workers=10)
    workers = [f"w{i}" for i in range(10)]
    assert [len(board.claim(w, 1, now=0).positions) for w in workers] == [1] * 10
    assert [len(board.claim(w, 500, now=1).positions) for w in workers] == [100] * 9 + [90]
    assert board.claim("w0", 500, now=2).status == "wait" and board.counts()["leased"] == 1000


def test_board_never_runs_ahead_of_the_journal():
    """A staged result is not done until committed; an aborted one is as if never sent."""
    board = new_board(2, lease_seconds=10)
    tasks = granted(board, board.claim("a", 2, now=0))
    good, wrong = result_for(tasks[0]), {**result_for(tasks[1]), "sha256": "0" * 64}
    staged, rejected = board.stage("a", [good, good, wrong], now=1)
    assert [r.task_id for r in staged] == [tasks[0]["id"]]
    assert [(r["code"], r["reason"]) for r in rejected] == [
        (409, "duplicate: the task already has a result"), (400, "sha256 is not the digest of output")]
    assert board.counts()["done"] == 0 and board.result(tasks[0]["id"]) is None  # nothing accepted before the journal has it
    assert board.check(good).code == 409  # a second submission while the first is being written
    board.abort(staged)  # the journal could not write it
    assert board.counts()["done"] == 0 and board.check(good).accepted
    staged, _ = board.stage("a", [good], now=2)
    board.commit(staged, now=2)
    assert board.result(tasks[0]["id"])["workerId"] == "a" and board.workers["a"].completed == 1
    assert board.workers["a"].rejected == 2


def test_board_claim_policy_fair_share_and_closing():
    board = new_board(10, lease_seconds=10, expected_workers=2, claims_until=100)
    first = board.claim("a", 64, now=0)
    assert (first.status, len(first.positions), first.first) == ("task", 5, True)  # ceil(10 / 2)
    assert board.claim("a", 64, now=1).status == "wait"  # the other half is held for b, who has had none
    second = board.claim("b", 64, now=2)
    assert (len(second.positions), second.first) == (5, True)
    board.expire(now=20)  # both leases lapse, and with them the reservation
    assert len(granted(board, board.claim("a", 64, now=20))) == 5  # ceil(10 / 2) again
    late = board.claim("b", 1, now=95)
    assert late.status == "stop" and "allocation ends" in late.reason
    board.close_claims("the disk is full")
    board.close_claims("the coordinator is draining")
    assert board.claim("b", 1, now=1).reason == "the disk is full"  # the first reason stays


def test_board_wait_then_done():
    board = new_board(1, lease_seconds=10)
    [task] = granted(board, board.claim("a", 1, now=0))
    assert board.claim("b", 1, now=0).status == "wait"
    accept(board, "a", result_for(task), now=1)
    assert board.claim("b", 1, now=2).status == "done"


def test_journal_group_commit_replay_and_torn_line(tmp_path):
    path = tmp_path / "journal.jsonl"
    tasks = make_tasks(20)["tasks"]

    async def write():
        journal = Journal(path, "abc")
        await asyncio.gather(*(journal.append([result_for(t)]) for t in tasks))
        journal.close()
        return journal.fsyncs

    fsyncs = asyncio.run(write())
    assert fsyncs < 20  # concurrent appends shared fsyncs
    with open(path, "ab") as handle:
        handle.write(b'{"kind":"result","taskId":"torn')
    results, note = replay(path, "abc")
    assert len(results) == 20 and "torn" in note
    assert path.read_bytes().endswith(b"\n")
    results, note = replay(path, "other-input")
    assert results == [] and note.startswith("stale")
    assert not path.exists()


def test_journal_corruption_in_the_middle_is_an_integrity_error(tmp_path):
    path = tmp_path / "journal.jsonl"
    path.write_text('{"kind":"header","inputSha256":"abc"}\nGARBAGE\n{"kind":"result","taskId":"x"}\n')
    with pytest.raises(AllocstackError) as raised:
        replay(path, "abc")
    assert raised.value.diag == "integrity"


def test_atomic_json_is_streamed_stable_and_never_half_written(tmp_path):
    target = tmp_path / "results.json"
    document = {"schemaVersion": 1, "results": [{"taskId": f"t{i}", "output": "ü" * i} for i in range(3)]}
    atomic_write_json(target, document)
    assert target.read_text(encoding="utf-8") == json.dumps(document, indent=2, sort_keys=True) + "\n"
    assert oct(target.stat().st_mode & 0o777) == "0o600"
    before = target.read_bytes()
    with pytest.raises(TypeError):  # fails mid-stream, after the first results were written to the temp file
        atomic_write_json(target, {"results": [{"taskId": "t0"}, {"taskId": object()}]})
    assert target.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["results.json"]  # no temp file left behind


def test_scratch_resolution_order(tmp_path):
    assert resolve_root("/custom", {"TMPDIR": "/t"}) == Path("/custom")
    assert resolve_root(None, {"SLURM_TMPDIR": "/s", "TMPDIR": "/t"}) == Path("/s")
    assert resolve_root(None, {"TMPDIR": "/t"}) == Path("/t")
    with pytest.raises(AllocstackError) as raised:
        resolve_root(None, {"SLURM_JOB_ID": "42"})
    assert raised.value.diag == "scratch" and "42" in raised.value.message


def test_scratch_is_private_and_refuses_foreign_or_symlinked_dirs(tmp_path):
    path = ensure_private_dir(run_scratch(tmp_path, "run1"))
    assert path.stat().st_mode & 0o777 == 0o700 and path.parent.stat().st_mode & 0o777 == 0o700
    os.chmod(path, 0o755)  # noqa: S103  (made too open, to be closed again)
    ensure_private_dir(path)
    assert path.stat().st_mode & 0o777 == 0o700
    link = run_scratch(tmp_path, "linked")
    link.symlink_to(tmp_path)
    with pytest.raises(AllocstackError, match="not a plain directory"):
        ensure_private_dir(link)


def test_scratch_owned_by_someone_else_is_refused(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("needs root to create a directory owned by another user")
    foreign = run_scratch(tmp_path, "theirs")
    foreign.parent.mkdir(mode=0o700)
    foreign.mkdir(mode=0o700)
    os.chown(foreign, 65534, 65534)
    with pytest.raises(AllocstackError, match="belongs to uid 65534"):
        ensure_private_dir(foreign)


def test_launch_passes_gpu_and_slurm_context_into_the_image(tmp_path):
    import launch

    args = launch.parse_args(["--component=worker-01", "--run=r", "--image=/img.sif", "--runtime-arg=--cleanenv",
                              "--bind=/data", "--job-steps", "--step-arg=--gpus=1", "--", "worker.py", "--x"])
    environ = {"SLURM_JOB_ID": "7", "CUDA_VISIBLE_DEVICES": "0,1", "SECRET": "no", "ALLOCSTACK_LAUNCHER_PID": "1"}
    argv = launch.build_argv(args, tmp_path, environ)
    assert argv[:2] == ["srun", "--job-name=worker-01"] and "--gpus=1" in argv
    inner = argv[argv.index("apptainer"):]
    assert "CUDA_VISIBLE_DEVICES=0,1" in inner and "SLURM_JOB_ID=7" in inner and "SECRET=no" not in inner
    assert f"{tmp_path}:{tmp_path}" in inner and "/data:/data" in inner
    assert inner[inner.index("/img.sif") + 1:] [:1] == ["python3"]


def test_launch_pins_the_step_to_the_node_it_runs_on(tmp_path):
    """Inside a job step Slurm names the node; in an allocation's own shell (salloc) it is this host."""
    import socket

    import launch

    args = launch.parse_args(["--component=coordinator", "--run=r", "--job-steps", "--", "coordinator.py"])
    in_step = launch.build_argv(args, tmp_path, {"SLURM_JOB_ID": "7", "SLURMD_NODENAME": "node042"})
    assert "--nodelist=node042" in in_step[:in_step.index("--cpus-per-task=1")]
    in_salloc = launch.build_argv(args, tmp_path, {"SLURM_JOB_ID": "7"})
    assert f"--nodelist={socket.gethostname().split('.')[0]}" in in_salloc
    assert launch.build_argv(args, tmp_path, {})[0] != "srun"  # outside Slurm: a plain process
