"""allocstack as a Snakemake module of another workflow, as the Snakemake docs teach.

A test workflow (written here, in a temporary directory beside a copy of allocstack)
declares ``module allocstack: snakefile: ...``, imports every rule with
``use rule * from allocstack as allocstack_*`` and consumes the success marker in a
rule of its own.
"""

from __future__ import annotations

import json
import shutil

from workflow_helpers import MODULE_USER, copy_project, snakemake

OUTER = MODULE_USER + '''\


rule all:
    default_target: True
    input:
        "task-count.txt",


rule count_tasks:
    input:
        "results/mine/result.json",
    output:
        "task-count.txt",
    log:
        "logs/count_tasks.log",
    shell:
        "python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))[\\"taskCount\\"])' {input} > {output} 2> {log}"
'''

CONFIG = '''\
allocstack:
  run: mine
  tasks: data/tasks.json
  expected: data/expected.json
  workers: 2
'''


def test_allocstack_runs_as_a_module_of_another_workflow(tmp_path):
    allocstack = copy_project(tmp_path / "allocstack")
    outer = tmp_path / "outer"
    (outer / "data").mkdir(parents=True)
    (outer / "tmp").mkdir()
    shutil.copy(allocstack / "inputs/tasks.json", outer / "data/tasks.json")
    shutil.copy(allocstack / "expected/results.json", outer / "data/expected.json")
    (outer / "Snakefile").write_text(OUTER)
    (outer / "config.yaml").write_text(CONFIG)
    done = snakemake(outer, "--cores", "4")
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    assert (outer / "task-count.txt").read_text().strip() == "4"
    marker = json.loads((outer / "results/mine/result.json").read_text())
    assert marker["status"] == "success" and marker["taskCount"] == 4
    assert "Rule: allocstack_serve_coordinator" in done.stdout + done.stderr  # the module's rules, renamed
    assert not (allocstack / "results").exists()  # everything of the run is in the outer workflow's directory
    bad = outer / "config.yaml"
    bad.write_text(CONFIG.replace("workers: 2", "workers: 0"))
    refused = snakemake(outer, "--cores", "4", "--dry-run")
    assert refused.returncode == 78 and "allocstack: error [config]: workers: 0 is less than the minimum of 1" in (
        refused.stdout + refused.stderr)
