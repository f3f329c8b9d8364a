"""The workflow itself: dry-run, lint, format, and real local runs in a temporary copy."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

from conftest import expected_for, make_tasks, pids_mentioning, write_json
from workflow_helpers import ROOT, SNAKEMAKE, snakemake


def events(workdir: Path, run: str = "baseline") -> list[dict]:
    return [json.loads(line) for line in (workdir / "results" / run / "events.jsonl").read_text().splitlines()]


def test_dry_run_as_typed_shows_the_stack(project):
    done = snakemake(project, "--dry-run")
    assert done.returncode == 0, done.stderr + done.stdout
    table = {line.split()[0]: line.split()[1] for line in done.stdout.splitlines()
             if len(line.split()) == 2 and line.split()[1].isdigit() and not line.endswith(":")
             and not line.split()[0].endswith(":")}
    assert table == {"validate_inputs": "1", "serve_coordinator": "1", "await_readiness": "1", "run_worker": "2",
                     "open_stack": "1", "stack_network": "1", "collect_results": "1", "verify_results": "1", "all": "1",
                     "total": "10"}
    # the decision record is reviewable before anything runs
    assert "decisions: allocation: scheduler policy; startup order: launch script" in done.stdout
    assert "service" in done.stdout  # the coordinator is marked as a service
    assert not (project / "results").exists()


def test_lint_and_format_are_clean():
    lint = subprocess.run([SNAKEMAKE, "--lint"], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
    assert lint.returncode == 0 and "Lints for" not in lint.stdout + lint.stderr, lint.stdout + lint.stderr
    snakefmt = str(Path(SNAKEMAKE).parent / "snakefmt")
    fmt = subprocess.run([snakefmt, "--check", "."], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
    assert fmt.returncode == 0, fmt.stderr
    ruff = subprocess.run([str(Path(SNAKEMAKE).parent / "ruff"), "check", "."], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, check=False)
    assert ruff.returncode == 0, ruff.stdout[-3000:]  # the rules and why are in pyproject.toml


def test_baseline_end_to_end_rerun_and_forcerun(project):
    done = snakemake(project, "--cores", "4")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "coordinator: progress 4/4 done" in done.stdout + done.stderr  # progress reaches the terminal
    marker = json.loads((project / "results/baseline/result.json").read_text())
    expected = json.loads((ROOT / "expected/results.json").read_text())
    assert marker["status"] == "success" and marker["taskCount"] == 4
    assert [{k: r[k] for k in ("taskId", "output", "sha256")} for r in marker["results"]] == expected["results"]
    log = events(project)
    gate = next(e["t"] for e in log if e["event"] == "gate-passed")
    starts = [e["t"] for e in log if e["event"] == "worker-start"]
    assert len(starts) == 2 and all(gate <= t for t in starts)
    assert next(e for e in log if e["event"] == "coordinator-end")["status"] == "completed"
    assert not (project / "state/baseline/journal.jsonl").exists()  # retired after verification
    assert not list((project / "tmp").glob("allocstack-*/baseline.*"))  # scratch cleaned after success
    for rule in ("serve_coordinator", "await_readiness", "collect_results", "verify_results", "validate_inputs"):
        assert (project / "logs" / rule / "baseline.log").stat().st_size > 0
    assert (project / "logs/run_worker/baseline/worker-02.log").exists()
    # outside Slurm and without an image verification is a plain process: no launch.py supervisor line
    assert (project / "logs/verify_results/baseline.log").read_text().startswith("verify: ")

    again = snakemake(project, "--cores", "4")
    assert again.returncode == 0 and "Nothing to be done" in again.stdout + again.stderr

    before = (project / "results/baseline/result.json").stat().st_mtime
    forced = snakemake(project, "--cores", "4", "--forcerun", "serve_coordinator")
    assert forced.returncode == 0, forced.stderr[-3000:]
    assert (project / "results/baseline/result.json").stat().st_mtime > before
    assert json.loads((project / "results/baseline/result.json").read_text())["status"] == "success"


def test_other_task_set_with_five_workers_via_config(project):
    tasks = make_tasks(40, message="z", repeat=3)
    write_json(project / "inputs/forty.json", tasks)
    write_json(project / "expected/forty.json", expected_for(tasks))
    done = snakemake(project, "--cores", "4", "--config", "workers=5", "tasks=inputs/forty.json",
                     "expected=expected/forty.json", "run=forty")
    assert done.returncode == 0, done.stderr[-3000:]
    marker = json.loads((project / "results/forty/result.json").read_text())
    assert marker["status"] == "success" and marker["taskCount"] == 40
    assert len(list((project / "results/forty/workers").glob("worker-*.json"))) == 5
    assert sum(json.loads(p.read_text())["tasksCompleted"]
               for p in (project / "results/forty/workers").glob("*.json")) == 40


def test_bad_input_fails_before_anything_starts(project):
    write_json(project / "inputs/bad.json", {"schemaVersion": 1, "tasks": [{"id": "x y", "payload": {}}]})
    done = snakemake(project, "--cores", "4", "--config", "tasks=inputs/bad.json", "run=bad")
    assert done.returncode != 0
    assert "allocstack: error [input]:" in done.stderr + done.stdout
    assert not (project / "results/bad/result.json").exists()
    assert not (project / "results/bad/inputs.json").exists()
    assert not (project / "logs/serve_coordinator").exists()


def test_crashed_coordinator_fails_the_run_and_leaves_nothing(project):
    tasks = make_tasks(12)
    write_json(project / "inputs/slow.json", tasks)
    write_json(project / "expected/slow.json", expected_for(tasks))
    (project / "config/crash.yaml").write_text(
        "tasks: inputs/slow.json\nexpected: expected/slow.json\nrun: crash\n"
        "simulate: {task_seconds: 0.5}\nworker: {connect_timeout: 2}\n")
    proc = subprocess.Popen(
        ["timeout", "-k", "10", "240", SNAKEMAKE, "--cores", "4", "--configfile", "config/crash.yaml"],
        cwd=project, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "TMPDIR": str(project / "tmp")},
    )
    deadline = time.monotonic() + 60
    while not list(project.glob("results/crash/workers")) and time.monotonic() < deadline:
        time.sleep(0.1)
    journal = project / "state/crash/journal.jsonl"
    while (not journal.exists() or journal.read_text().count('"result"') < 2) and time.monotonic() < deadline:
        time.sleep(0.1)
    # the program itself (python3 .../coordinator.py), not launch.py, whose command line names it too
    [coordinator] = [pid for pid in pids_mentioning(str(project))
                     if [*Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0"), b""][1].endswith(b"/coordinator.py")]
    os.kill(coordinator, signal.SIGKILL)
    output, _ = proc.communicate(timeout=120)
    assert proc.returncode != 0
    assert not (project / "results/crash/result.json").exists()
    assert "Error in rule" in output


def test_decision_record_timeline_and_report(project):
    (project / "config/decide.yaml").write_text(
        "decisions:\n  accelerators: {owner: scheduler policy, how: 'one A100 per worker via --gres'}\n")
    done = snakemake(project, "--cores", "4", "--configfile", "config/decide.yaml")
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    record = (project / "results/baseline/decision-record.md").read_text()
    assert "| Accelerators | scheduler policy | one A100 per worker via --gres |" in record
    assert "| Allocation | scheduler policy |" in record
    svg = (project / "results/baseline/timeline.svg").read_text()
    assert svg.startswith("<svg") and "worker-01" in svg and "gate passed" in svg
    report = snakemake(project, "--report", "report.html", "--configfile", "config/decide.yaml")
    assert report.returncode == 0, report.stderr[-2000:]
    html = (project / "report.html").read_text()
    assert "decision-record.md" in html and "timeline.svg" in html


def test_timeline_labels_neither_overlap_nor_run_past_the_edge():
    """The baseline's events: "gate passed" and "coordinator end" 9 ms apart, a worker with 0 tasks last."""
    import xml.etree.ElementTree as ET

    from plot_timeline import CHAR_WIDTH, WIDTH, render

    t = 1000.0
    events = [{"t": t, "event": "coordinator-listening"}, {"t": t + 0.99, "event": "gate-passed"},
              {"t": t + 1.0, "event": "worker-start", "worker": "worker-02"},
              {"t": t + 1.009, "event": "coordinator-end"},
              {"t": t + 1.01, "event": "worker-end", "worker": "worker-02", "completed": 4, "status": "done"},
              {"t": t + 1.03, "event": "worker-start", "worker": "worker-01"},
              {"t": t + 1.035, "event": "worker-end", "worker": "worker-01", "completed": 0, "status": "done"}]
    svg = ET.fromstring(render(events))
    height = float(svg.get("height"))
    boxes = []
    for text in svg.iter("{http://www.w3.org/2000/svg}text"):
        size = float(text.get("font-size", svg.get("font-size")))
        x, y, width = float(text.get("x")), float(text.get("y")), len(text.text) * CHAR_WIDTH * size / 12
        assert x >= 0 and x + width <= WIDTH and size <= y <= height, (text.text, x, width)
        boxes.append((text.text, x, x + width, y - size, y))
    labels = {box[0] for box in boxes}
    assert {"gate passed", "coordinator end", "0 tasks", "4 tasks", "listening"} <= labels
    for i, a in enumerate(boxes):
        for b in boxes[i + 1:]:
            apart = a[2] <= b[1] or b[2] <= a[1] or a[4] <= b[3] or b[4] <= a[3]
            assert apart, f"{a[0]!r} overlaps {b[0]!r}"


def test_report_html_is_ignored_by_git():
    ignored = subprocess.run(["git", "check-ignore", "--no-index", "report.html", "report.zip"], cwd=ROOT,
                             capture_output=True, text=True, check=False)
    assert ignored.stdout.split() == ["report.html", "report.zip"]


def test_forty_workers_run_as_one_job_that_keeps_each_workers_identity(project):
    """Above 16 workers (worker.per_step null) one node's workers are ONE Snakemake job (run_workers), and each keeps
    its id, record, log and events; the dry run shows one job, not 40."""
    tasks = make_tasks(2000)
    write_json(project / "inputs/many.json", tasks)
    write_json(project / "expected/many.json", expected_for(tasks))
    config = ["--config", "workers=40", "tasks=inputs/many.json", "expected=expected/many.json", "run=many"]
    planned = snakemake(project, "--dry-run", *config)
    assert planned.returncode == 0, planned.stderr[-2000:]
    table = {line.split()[0]: line.split()[1] for line in planned.stdout.splitlines() if len(line.split()) == 2
             and line.split()[1].isdigit()}
    assert table["run_workers"] == "1" and "run_worker" not in table
    done = snakemake(project, "--cores", "4", *config)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads((project / "results/many/result.json").read_text())["status"] == "success"
    records = sorted((project / "results/many/workers/workers-01").glob("worker-*.json"))
    assert [path.stem for path in records] == [f"worker-{i:02d}" for i in range(1, 41)]
    assert sum(json.loads(path.read_text())["tasksCompleted"] for path in records) == 2000
    assert len(list((project / "logs/run_workers/many").glob("worker-*.log"))) == 40
    assert len([e for e in events(project, "many") if e["event"] == "worker-start"]) == 40
    assert "workers     40 in 1 job step: 40 ended (fewest" in done.stdout  # the end-of-run summary counts them
    end = json.loads((project / "results/many/coordinator.json").read_text())
    assert len(end["workers"]) == 40 and end["requests"] < 2000  # the step's relay batched its workers' requests


def test_a_multi_node_plan_is_shown_anywhere_and_refused_only_when_run(project):
    planned = snakemake(project, "--dry-run", "--config", "nodes=64", "workers=4096")
    assert planned.returncode == 0, planned.stderr[-2000:]
    assert "run_workers" in planned.stdout and "await_network" in planned.stdout
    ran = snakemake(project, "--cores", "4", "--config", "nodes=3", "workers=6")
    assert ran.returncode == 78
    assert "allocstack: error [config]: nodes=3 needs a Slurm allocation" in ran.stderr + ran.stdout
    assert not (project / "results/baseline/inputs.json").exists()  # refused before anything ran


def test_a_services_gpus_reach_its_job_steps_command_and_no_other(project):
    """services.<name>.gpus is the serve_service job's gpu resource (the Slurm executor sums it into the stack's
    sbatch --gpus) and its job step's --gpus; the other services, the workers and the check get none."""
    (project / "config/gpu.yaml").write_text(
        "run: gpu\ntasks: null\nexpected: null\nworkers: 2\nworker: {mode: long-running, command: [python3, w.py]}\n"
        "verify: {command: [python3, c.py]}\n"
        "services:\n  model: {command: [python3, serve.py], gpus: 2, readiness: {mode: started}}\n"
        "  web: {command: [python3, web.py], depends_on: [model], readiness: {mode: started}}\n")
    planned = snakemake(project, "--dry-run", "--printshellcmds", "--configfile", "config/gpu.yaml")
    assert planned.returncode == 0, planned.stderr[-2000:]
    commands = [line for line in planned.stdout.splitlines() if "launch.py" in line]
    with_gpus = [line for line in commands if "--step-arg=--gpus=" in line]
    assert len(with_gpus) == 1 and "--component=model" in with_gpus[0] and "--gpus=2" in with_gpus[0], commands
    assert any("--component=web" in line for line in commands)
