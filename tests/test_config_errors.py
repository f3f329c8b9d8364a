"""A refusal through Snakemake itself: ONE line and its diagnostic's exit code, before anything runs.

Every refusal is tested in-process (tests/unit/test_config_refusals.py, test_world_refusals.py); these
three dry runs show the adapter (workflow/rules/common.smk) turning one into the one-line exit: a
value the schema refuses, a stack the plan refuses, a missing input file (a real run: nothing written).
"""

from __future__ import annotations

import pytest

from workflow_helpers import snakemake


@pytest.mark.parametrize("text, words", [
    ("worker: {comand: [x]}\n",
     "allocstack: error [config]: worker.comand: worker has no key 'comand'; did you mean 'command'?"),
    ("services: {a: {command: [x], depends_on: [b]}, b: {command: [x], depends_on: [a]}}\n",
     "allocstack: error [config]: services: depends_on has a cycle: a -> b -> a"),
])
def test_a_refused_config_is_one_line_and_exit_78(project, text, words):
    (project / "config/bad.yaml").write_text(text)
    done = snakemake(project, "--dry-run", "--configfile", "config/bad.yaml", timeout=120)
    output = done.stdout + done.stderr
    lines = [line for line in output.splitlines() if "allocstack: error" in line]
    assert done.returncode == 78 and len(lines) == 1 and lines[0].startswith(words), output[-1500:]
    assert "Traceback" not in output


def test_a_missing_input_file_is_one_line_naming_its_key_and_nothing_is_written(project):
    (project / "config/bad.yaml").write_text("tasks: inputs/nope.json\n")
    done = snakemake(project, "--cores", "4", "--configfile", "config/bad.yaml", timeout=120)
    output = done.stdout + done.stderr
    assert done.returncode == 65
    assert "allocstack: error [input]: tasks file inputs/nope.json does not exist (config key 'tasks')" in output
    assert "MissingInputException" not in output
    assert not (project / "results").exists() and not (project / "logs").exists()
