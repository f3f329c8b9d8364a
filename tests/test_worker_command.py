"""Bring your own worker program: worker.command runs once per task, failures are retried then reported."""

from __future__ import annotations

import hashlib
import json
import sys
import textwrap

import pytest

from conftest import run_script, write_json

APP = textwrap.dedent("""
    import json, os, sys, time
    payload = json.load(open(os.environ["ALLOCSTACK_PAYLOAD_FILE"])) if os.environ.get("ALLOCSTACK_PAYLOAD_FILE") \\
        else json.load(sys.stdin)
    text = payload["text"]
    if text == "bad":
        print("cannot shout 'bad'", file=sys.stderr)
        sys.exit(3)
    if text == "slow":
        time.sleep(30)
    if text == "binary":
        sys.stdout.buffer.write(b"ok \\xff\\xfe")
        sys.exit(0)
    sys.stdout.buffer.write(f"{os.environ['ALLOCSTACK_TASK_ID']}:{text.upper()[:20]}:{len(text)}".encode("utf-8"))
""")


def documents(texts: list[str]) -> tuple[dict, dict]:
    tasks = {"schemaVersion": 1, "tasks": [{"id": f"t{i}", "payload": {"text": t}} for i, t in enumerate(texts)]}
    results = []
    for i, text in enumerate(texts):
        output = f"t{i}:{text.upper()[:20]}:{len(text)}"
        results.append({"taskId": f"t{i}", "output": output, "sha256": hashlib.sha256(output.encode()).hexdigest()})
    return tasks, {"schemaVersion": 1, "results": results}


#: The worker key that runs the shout app with this Python.
SHOUT_WORKER = f"worker: {{command: [{json.dumps(sys.executable)}, apps/shout.py]}}\n"


def write_app_project(project, texts: list[str], config_tail: str) -> None:
    """Run ``app`` in ``project``: ``texts`` as its tasks and expected results, the shout app in apps/ (mode
    0644), and config/app.yaml of two workers followed by ``config_tail``."""
    tasks, expected = documents(texts)
    write_json(project / "inputs/app.json", tasks)
    write_json(project / "expected/app.json", expected)
    (project / "apps").mkdir()
    (project / "apps/shout.py").write_text(APP)
    (project / "config/app.yaml").write_text(
        "run: app\ntasks: inputs/app.json\nexpected: expected/app.json\nworkers: 2\n" + config_tail)


def run_app(start_coordinator, tmp_path, texts: list[str], *worker_args: str, env: dict | None = None):
    tasks, expected = documents(texts)
    coordinator = start_coordinator(tasks, "--max-attempts", "2", "--lease-seconds", "60")
    app = tmp_path / "app.py"
    app.write_text(APP)
    gate = tmp_path / "gate.json"
    gate.write_text('{"status": "ready"}')
    done = run_script("worker.py", "--worker-id", "worker-01", "--scratch", coordinator.scratch, "--gate-record", gate,
                      "--batch", "4", "--command-json", json.dumps([sys.executable, str(app)]), *worker_args,
                      "--record", tmp_path / "w.json", env=env)
    assert done.returncode == 0, done.stderr
    coordinator.stop()
    write_json(coordinator.tasks_path, tasks)
    verify = run_script("verify.py", "--input", coordinator.tasks_path, "--results", coordinator.results,
                        "--expected", write_json(tmp_path / "expected.json", expected), "--output",
                        tmp_path / "result.json", "--end-record", coordinator.end_record)
    return coordinator, done, verify


def test_user_program_outputs_are_the_results(start_coordinator, tmp_path):
    big = "x" * 70_000  # above 64 KiB: the payload arrives in a file, not on stdin
    coordinator, _, verify = run_app(start_coordinator, tmp_path, ["alpha", "beta", big, "gamma"])
    assert verify.returncode == 0, verify.stderr
    assert json.loads(coordinator.end_record.read_text())["status"] == "completed"


def test_a_failing_task_is_retried_then_fails_the_run_with_its_stderr(start_coordinator, tmp_path):
    coordinator, worker, verify = run_app(start_coordinator, tmp_path, ["alpha", "bad", "gamma"])
    end = json.loads(coordinator.end_record.read_text())
    assert end["status"] == "failed" and end["resultCount"] == 2
    assert end["failedTasks"] == {"t1": "exit 3: cannot shout 'bad'"}
    assert worker.stderr.count("task t1 failed") == 2  # max_attempts = 2
    assert json.loads((tmp_path / "w.json").read_text())["failed"] == 2
    assert verify.returncode == 65 and "[task-failed]" in verify.stderr and "cannot shout" in verify.stderr
    assert not (tmp_path / "result.json").exists()


def test_outputs_are_utf8_whatever_the_locale_and_bytes_that_are_not_fail_the_task(start_coordinator, tmp_path):
    ascii_locale = {"LC_ALL": "C", "PYTHONUTF8": "0"}  # the worker's preferred encoding is then ASCII
    coordinator, _, verify = run_app(start_coordinator, tmp_path, ["grüße ✓", "naïve"], env=ascii_locale)
    assert verify.returncode == 0, verify.stderr
    coordinator, worker, verify = run_app(start_coordinator, tmp_path, ["alpha", "binary"], env=ascii_locale)
    end = json.loads(coordinator.end_record.read_text())
    assert end["failedTasks"] == {"t1": "output is not UTF-8 text (byte 3): write text, or encode binary output, "
                                        "e.g. base64"}
    assert "Traceback" not in worker.stderr
    assert verify.returncode == 65 and "[task-failed]" in verify.stderr


def test_task_timeout_counts_as_a_failure(start_coordinator, tmp_path):
    coordinator, _worker, verify = run_app(start_coordinator, tmp_path, ["slow", "alpha"], "--task-timeout", "0.5")
    end = json.loads(coordinator.end_record.read_text())
    assert end["failedTasks"] == {"t0": "timed out after 0.5 s"}
    assert verify.returncode == 65


def test_bad_command_json_is_a_usage_error(tmp_path):
    for bad in ("not json", "[]", '"python3 x.py"', '["", "x"]'):  # an empty argument is fine, an empty program not
        done = run_script("worker.py", "--worker-id", "w", "--endpoint-file", tmp_path / "e.json", "--command-json", bad)
        assert done.returncode == 64, (bad, done.stderr)


def test_worker_command_through_the_workflow(project):
    write_app_project(project, ["one", "two", "three", "four", "five"], SHOUT_WORKER)
    from workflow_helpers import snakemake

    done = snakemake(project, "--cores", "4", "--configfile", "config/app.yaml")
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    assert json.loads((project / "results/app/result.json").read_text())["status"] == "success"


CHECK = textwrap.dedent("""
    import json, os, sys
    tasks = {t["id"]: t["payload"]["text"] for t in json.load(open(os.environ["ALLOCSTACK_TASKS"]))["tasks"]}
    for result in json.load(open(os.environ["ALLOCSTACK_RESULTS"]))["results"]:
        task_id, shouted, length = result["output"].split(":")
        if task_id != result["taskId"] or int(length) != len(tasks[task_id]):
            sys.exit(f"{task_id}: wrong length {length}")
""")


def test_verify_command_replaces_the_expected_comparison(tmp_path):
    tasks, expected = documents(["alpha", "beta"])
    results = {"schemaVersion": 1, "results": [{**r, "workerId": "w"} for r in expected["results"]]}
    check = tmp_path / "check.py"
    check.write_text(CHECK)
    argv = json.dumps([sys.executable, str(check)])
    common = ["--input", write_json(tmp_path / "tasks.json", tasks), "--output", tmp_path / "result.json",
              "--command-json", argv]
    ok = run_script("verify.py", "--results", write_json(tmp_path / "results.json", results), *common)
    assert ok.returncode == 0, ok.stderr
    wrong = json.loads(json.dumps(results))
    wrong["results"][0]["output"] = "t0:ALPHA:9"
    wrong["results"][0]["sha256"] = hashlib.sha256(b"t0:ALPHA:9").hexdigest()
    bad = run_script("verify.py", "--results", write_json(tmp_path / "results.json", wrong), *common)
    assert bad.returncode == 65 and "verify.command exited 1: t0: wrong length 9" in bad.stderr
    assert not (tmp_path / "result.json").exists()
    neither = run_script("verify.py", "--input", tmp_path / "tasks.json", "--results", tmp_path / "results.json",
                         "--output", tmp_path / "result.json")
    assert neither.returncode == 64


def test_own_worker_and_own_check_without_expected_results(project):
    tasks, _ = documents(["one", "two", "three"])
    write_json(project / "inputs/own.json", tasks)
    (project / "apps").mkdir()
    (project / "apps/shout.py").write_text(APP)
    (project / "apps/check.py").write_text(CHECK)
    python = json.dumps(sys.executable)
    (project / "config/own.yaml").write_text(
        f"run: own\ntasks: inputs/own.json\nexpected: null\nworker: {{command: [{python}, apps/shout.py]}}\n"
        f"verify: {{command: [{python}, apps/check.py]}}\n")
    from workflow_helpers import snakemake

    done = snakemake(project, "--cores", "4", "--configfile", "config/own.yaml")
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    assert json.loads((project / "results/own/result.json").read_text())["status"] == "success"
    (project / "config/none.yaml").write_text("run: none\nexpected: null\n")
    refused = snakemake(project, "--dry-run", "--configfile", "config/none.yaml")
    assert refused.returncode != 0 and "nothing would say whether the results are correct" in refused.stdout + refused.stderr


def test_large_outputs_are_posted_in_bounded_requests(start_coordinator, tmp_path):
    """Four 3 MiB outputs in one batch: posted in requests below the coordinator's body limit."""
    tasks = {"schemaVersion": 1, "tasks": [{"id": f"t{i}", "payload": {"text": "y" * 10}} for i in range(4)]}
    coordinator = start_coordinator(tasks, "--max-body-bytes", str(12 << 20))
    app = tmp_path / "big.py"
    app.write_text("import sys\nsys.stdin.read()\nsys.stdout.write('z' * (3 << 20))\n")
    gate = tmp_path / "gate.json"
    gate.write_text('{"status": "ready"}')
    done = run_script("worker.py", "--worker-id", "worker-01", "--scratch", coordinator.scratch, "--gate-record", gate,
                      "--batch", "4", "--command-json", json.dumps([sys.executable, str(app)]))
    assert done.returncode == 0, done.stderr
    assert coordinator.stop() == 0
    assert json.loads(coordinator.end_record.read_text())["resultCount"] == 4


@pytest.mark.parametrize("argv, words", [
    (["isprime"], ('worker.command ["isprime"] cannot be started: isprime: not found on PATH; fix worker.command '
                  "in your config")),
    (["apps/nope.py"], ('worker.command ["apps/nope.py"] cannot be started: apps/nope.py: No such file or directory '
                       "(a relative path starts in the directory snakemake runs in;")),
    (["apps/shout.py"], ('worker.command ["apps/shout.py"] cannot be started: apps/shout.py: Permission denied: it is '
                        'not executable; chmod +x it, or name its interpreter first, e.g. ["python3", "apps/shout.py"]')),
])
def test_a_program_that_cannot_start_fails_the_run_once_naming_the_key(project, argv, words):
    """No such file, or not executable: the first attempt ends the run at once with ONE line naming worker.command
    (not 3 attempts x every task), the run's exit is a failure, and no task is counted as failed."""
    write_app_project(project, [f"text {n}" for n in range(150)],  # apps/shout.py: mode 0644, not executable
                      f"worker: {{command: {json.dumps(argv)}}}\n")
    from workflow_helpers import snakemake

    done = snakemake(project, "--cores", "4", "--configfile", "config/app.yaml")
    output = done.stdout + done.stderr
    assert done.returncode == 1, output[-3000:]
    line = f"allocstack: error [config]: {words}"
    assert f"  {line}" in done.stdout.split("allocstack: run app FAILED", 1)[1], output[-3000:]
    worker_logs = [path.read_text() for path in (project / "logs/run_worker/app").glob("*.log")]
    # each worker tried its first task once, then ended with the line (exit 78): nothing was retried
    assert all(text.count("cannot be started") <= 1 and " task t" not in text for text in worker_logs), worker_logs
    assert any(text.rstrip().endswith("exited 78") for text in worker_logs), worker_logs
    assert "[task-failed]" not in output


def test_the_counts_of_failed_tasks_agree(project):
    """150 tasks that each fail (max_attempts 1): the verdict's line, the summary's counts and the coordinator's
    reason say 150 (the end record lists the first 100 failures only)."""
    write_app_project(project, ["bad"] * 150, "coordinator: {max_attempts: 1}\n" + SHOUT_WORKER)
    from workflow_helpers import snakemake

    done = snakemake(project, "--cores", "4", "--configfile", "config/app.yaml")
    assert done.returncode == 1
    end = json.loads((project / "results/app/coordinator.json").read_text())
    assert end["failedCount"] == 150 and len(end["failedTasks"]) == 100
    summary = done.stdout.split("allocstack: run app FAILED", 1)[1]
    assert "allocstack: error [task-failed]: 150 of 150 task(s) failed for good, e.g. t" in summary
    assert "  tasks       0 of 150 done, 150 failed;" in summary
    assert "coordinator ended failed (150 task(s) failed 1 times:" in summary
