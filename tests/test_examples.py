"""The worked examples under config/examples/ run end to end locally, each with its one documented command."""

from __future__ import annotations

import json

import pytest

from workflow_helpers import snakemake


@pytest.mark.parametrize("configfile, run", [
    ("config/examples/baseline.yaml", "example-baseline"),
    ("config/examples/wordcount/config.yaml", "wordcount"),
    ("config/examples/primes/config.yaml", "primes"),  # the README's "Run your own program"
])
def test_example_runs_locally(project, configfile, run):
    done = snakemake(project, "--cores", "4", "--configfile", configfile)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    assert json.loads((project / f"results/{run}/result.json").read_text())["status"] == "success"
    assert (project / f"results/{run}/decision-record.md").exists()


def test_wordcount_check_catches_a_wrong_count(project, tmp_path):
    """The example's verify.command is a real check: a corrupted count fails the run."""
    import os
    import subprocess
    import sys

    tasks = project / "config/examples/wordcount/tasks.json"
    document = json.loads(tasks.read_text())
    results = []
    for task in document["tasks"]:
        out = subprocess.run([sys.executable, str(project / "config/examples/wordcount/count_words.py")],
                             input=json.dumps(task["payload"]), capture_output=True, text=True, check=True).stdout
        results.append({"taskId": task["id"], "workerId": "w", "output": out, "sha256": ""})
    counts = json.loads(results[0]["output"])
    counts["counts"]["scheduler"] = counts["counts"].get("scheduler", 0) + 1
    results[0]["output"] = json.dumps(counts)
    path = tmp_path / "results.json"
    path.write_text(json.dumps({"schemaVersion": 1, "results": results}))
    check = subprocess.run([sys.executable, str(project / "config/examples/wordcount/check_counts.py")],
                           env={**os.environ, "ALLOCSTACK_TASKS": str(tasks), "ALLOCSTACK_RESULTS": str(path)},
                           capture_output=True, text=True, check=False)
    assert check.returncode == 1 and "count of 'scheduler'" in check.stderr
