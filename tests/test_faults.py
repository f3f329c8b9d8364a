"""Faults injected with real signals into real runs: dying workers, a dying coordinator, resume."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from conftest import expected_for, make_tasks, pids_mentioning, wait_for, write_json
from workflow_helpers import SNAKEMAKE, snakemake


def slow_run(project: Path, run: str, tasks: int, seconds: float, workers: int = 2, lease: float = 2) -> Path:
    document = make_tasks(tasks)
    write_json(project / f"inputs/{run}.json", document)
    write_json(project / f"expected/{run}.json", expected_for(document))
    config = project / f"config/{run}.yaml"
    config.write_text(
        f"tasks: inputs/{run}.json\nexpected: expected/{run}.json\nrun: {run}\nworkers: {workers}\n"
        f"simulate: {{task_seconds: {seconds}}}\ncoordinator: {{lease_seconds: {lease}}}\n"
        "worker: {connect_timeout: 3, wait_timeout: 60}\n")
    return config


def start(project: Path, config: Path) -> subprocess.Popen:
    return subprocess.Popen(
        ["timeout", "-k", "10", "300", SNAKEMAKE, "--cores", "4", "--configfile", str(config)],
        cwd=project, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "TMPDIR": str(project / "tmp")},
    )


def component_pids(project: Path, needle: str) -> list[int]:
    """PIDs of the processes that run the component's code: ``python SCRIPT`` under a launch.py supervisor
    (workers), or launch.py itself where it runs the script in its own process (see launch.py runs_here)."""
    found, launchers = [], {}
    for pid in pids_mentioning(str(project)):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            parent = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
            environ = b"\0" + Path(f"/proc/{pid}/environ").read_bytes()
        except (OSError, ValueError, IndexError):
            continue
        if len(argv) > 1 and argv[1].endswith(needle.encode()):
            found.append((pid, parent))
        elif len(argv) > 1 and argv[1].endswith(b"launch.py") and b"--" in argv:
            options, command = argv[:argv.index(b"--")], argv[argv.index(b"--") + 1:]
            in_step = b"--job-steps" in options and b"\0SLURM_JOB_ID=" in environ
            supervised = in_step or any(o.startswith((b"--tolerate-kill", b"--image")) for o in options)  # a child
            if command and command[0].endswith(needle.encode()) and not supervised:
                launchers[pid] = parent
    supervising = {parent for _, parent in found}
    return [pid for pid, _ in found] + [pid for pid in launchers if pid not in supervising]


def journaled(project: Path, run: str) -> int:
    path = project / f"state/{run}/journal.jsonl"
    return path.read_text().count('"kind":"result"') if path.exists() else 0


def test_kill_9_of_a_worker_mid_task_and_the_run_still_succeeds(project):
    proc = start(project, slow_run(project, "wkill", tasks=12, seconds=0.4))
    wait_for(lambda: len(component_pids(project, "worker.py")) == 2 and journaled(project, "wkill") >= 1)
    victim = component_pids(project, "worker.py")[0]
    os.kill(victim, signal.SIGKILL)
    output, _ = proc.communicate(timeout=200)
    assert proc.returncode == 0, output[-3000:]
    marker = json.loads((project / "results/wkill/result.json").read_text())
    assert marker["status"] == "success" and marker["taskCount"] == 12
    records = [json.loads(p.read_text()) for p in (project / "results/wkill/workers").glob("*.json")]
    assert sorted(r["status"] for r in records) == ["done", "killed"]
    end = json.loads((project / "results/wkill/coordinator.json").read_text())
    assert end["expiredLeases"] >= 1  # the dead worker's task went back to the queue


def test_all_workers_dead_is_a_clear_failure_not_a_hang(project):
    proc = start(project, slow_run(project, "allkill", tasks=10, seconds=0.5))
    wait_for(lambda: len(component_pids(project, "worker.py")) == 2 and journaled(project, "allkill") >= 1)
    for pid in component_pids(project, "worker.py"):
        os.kill(pid, signal.SIGKILL)
    started = time.monotonic()
    output, _ = proc.communicate(timeout=200)
    assert proc.returncode != 0
    assert time.monotonic() - started < 60
    assert "[coordinator-exit]" in output and "incomplete" in output
    assert not (project / "results/allkill/result.json").exists()


def test_coordinator_kill_9_then_rerun_resumes_from_the_journal(project):
    config = slow_run(project, "resume", tasks=16, seconds=0.3)
    proc = start(project, config)
    wait_for(lambda: journaled(project, "resume") >= 4)
    [coordinator] = component_pids(project, "coordinator.py")
    os.kill(coordinator, signal.SIGKILL)
    _output, _ = proc.communicate(timeout=200)
    assert proc.returncode != 0
    assert not (project / "results/resume/result.json").exists()
    done_before = journaled(project, "resume")
    assert 4 <= done_before < 16
    with open(project / "state/resume/journal.jsonl", "ab") as journal:
        journal.write(b'{"kind":"result","taskId":"task-0')  # a torn last line, as a crash mid-write leaves

    rerun = snakemake(project, "--cores", "4", "--configfile", str(config))
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    end = json.loads((project / "results/resume/coordinator.json").read_text())
    assert end["restored"] == done_before
    computed = sum(json.loads(p.read_text())["tasksCompleted"] for p in (project / "results/resume/workers").glob("*.json"))
    assert computed == 16 - done_before  # acknowledged results were not computed again
    assert json.loads((project / "results/resume/result.json").read_text())["status"] == "success"
    assert not (project / "state/resume/journal.jsonl").exists()


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_an_interrupted_run_resumes_with_the_same_command(project, signum):
    """Ctrl-C (SIGINT to the terminal's whole process group) or SIGTERM to it (a session or batch system
    ending) mid-run, then exactly the same command: Snakemake reruns what it left incomplete
    (rerun-incomplete in the default profile) and the coordinator restores what the journal holds.
    No component prints a traceback."""
    config = slow_run(project, "stopped", tasks=24, seconds=0.3)
    command = [SNAKEMAKE, "--cores", "4", "--configfile", str(config)]
    env = {**os.environ, "TMPDIR": str(project / "tmp")}
    proc = subprocess.Popen(command, cwd=project, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env, start_new_session=True)  # its own process group, as in a terminal
    try:
        wait_for(lambda: journaled(project, "stopped") >= 4)
        os.killpg(proc.pid, signum)
        output, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode != 0
    assert not (project / "results/stopped/result.json").exists()
    logs = {path: path.read_text() for path in (project / "logs").rglob("*.log")}
    assert not [path for path, text in logs.items() if "Traceback" in text], output[-3000:]
    assert f"stopping (signal:{signum.name})" in logs[project / "logs/serve_coordinator/stopped.log"]
    done_before = journaled(project, "stopped")

    rerun = subprocess.run(command, cwd=project, capture_output=True, text=True, env=env, timeout=300, check=False)
    assert rerun.returncode == 0, (rerun.stdout + rerun.stderr)[-3000:]
    end = json.loads((project / "results/stopped/coordinator.json").read_text())
    assert 4 <= end["restored"] == done_before < 24
    assert json.loads((project / "results/stopped/result.json").read_text())["status"] == "success"


def test_a_closed_stdout_never_crashes_the_coordinator(project):
    """`snakemake ... | head`: the coordinator's progress lines go to Snakemake's stdout, whose reader is gone.
    The lines are dropped; the coordinator keeps serving, expiring leases and printing to its log."""
    config = slow_run(project, "piped", tasks=12, seconds=0.5)
    reader_gone = subprocess.Popen([SNAKEMAKE, "--cores", "4", "--configfile", str(config)], cwd=project,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                   env={**os.environ, "TMPDIR": str(project / "tmp")})
    reader_gone.stdout.close()  # like `| head` after its lines: nobody reads stdout any more
    _, errors = reader_gone.communicate(timeout=300)
    assert reader_gone.returncode == 0, errors[-3000:]
    log = (project / "logs/serve_coordinator/piped.log").read_text()
    assert "Traceback" not in log and "coordinator: progress" in log
    assert "coordinator: completed (all tasks done), 12/12 results" in log
