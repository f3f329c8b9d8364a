"""Every config path refuses bad values before anything runs, in one line naming the key."""

from __future__ import annotations

import pytest

from workflow_helpers import snakemake

BAD = {
    "worker.command empty": ("worker: {command: []}", "worker.command"),
    "worker.command a shell string": ("worker: {command: 'python3 x.py'}", "worker.command"),
    "worker.task_timeout negative": ("worker: {task_timeout: -1}", "worker.task_timeout"),
    "worker.gpus negative": ("worker: {gpus: -1}", "worker.gpus"),
    "verify.command not a list": ("verify: {command: check.sh}", "verify.command"),
    "service.readiness.mode unknown": ("service: {command: [x], readiness: {mode: ping}}", "service.readiness.mode"),
    "service.readiness.path relative": ("service: {command: [x], readiness: {path: health}}", "service.readiness.path"),
    "service command mode without a command": ("service: {command: [x], readiness: {mode: command}}",
                                               "service.readiness.command is null"),
    "decisions owner unknown": ("decisions: {accelerators: {owner: vendor, how: x}}", "decisions.accelerators.owner"),
    "decisions missing how": ("decisions: {allocation: {owner: launch script}}", "decisions.allocation"),
    "coordinator.max_attempts zero": ("coordinator: {max_attempts: 0}", "coordinator.max_attempts"),
    "apptainer.binds not a list": ("apptainer: {binds: /data}", "apptainer.binds"),
    "expected and verify.command both null": ("expected: null", "nothing would say whether"),
    "unknown nested key": ("worker: {comand: [x]}", "comand"),
    "services.depends_on unknown": ("services: {api: {command: [x], depends_on: [db]}}",
                                    "services.api.depends_on: 'db' is not one of services (api)"),
    "services.depends_on a cycle": ("services: {a: {command: [x], depends_on: [b]}, b: {command: [x], depends_on: [a]}}",
                                    "services: depends_on has a cycle: a -> b -> a"),
    "a service named like a worker": ("services: {worker-01: {command: [x]}}",
                                      "services.worker-01: the name is allocstack's own"),
    "tasks null with per-task workers": ("tasks: null\nexpected: null\nverify: {command: [x]}",
                                         "tasks is null (no built-in coordinator) but worker.mode is per-task"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_config(project, case):
    text, words = BAD[case]
    (project / "config/bad.yaml").write_text(text + "\n")
    done = snakemake(project, "--dry-run", "--configfile", "config/bad.yaml", timeout=120)
    output = done.stdout + done.stderr
    assert done.returncode != 0
    assert "allocstack: error [config]:" in output and words in output, output[-1500:]


@pytest.mark.parametrize("key", ["tasks", "expected"])
def test_a_missing_input_file_is_one_line_naming_its_key(project, key):
    (project / "config/bad.yaml").write_text(f"{key}: inputs/nope.json\n")
    done = snakemake(project, "--cores", "4", "--configfile", "config/bad.yaml", timeout=120)
    output = done.stdout + done.stderr
    assert done.returncode != 0
    assert f"allocstack: error [input]: {key} file inputs/nope.json does not exist (config key '{key}')" in output
    assert "MissingInputException" not in output
    assert not (project / "results").exists() and not (project / "logs").exists()
