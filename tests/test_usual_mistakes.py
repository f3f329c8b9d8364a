"""The smaller things a newcomer meets on the walk (issue 27), each said in words a person acts on.

Own tasks with worker.command forgotten name the built-in handler; the decision record says "none" and "not in
Slurm", never Python's None and True; a local run's status page is a plain URL (no SSH tunnel); status.py
without --run picks the one run that is live. (Did-you-mean and how to write a value: tests/unit/
test_config_refusals.py and test_config_errors.py; got vs expected: test_reruns.py.) Real Snakemake runs.
"""

from __future__ import annotations

import json
import re

from test_faults import journaled, slow_run, start, wait_for

from conftest import run_script, write_json
from workflow_helpers import snakemake


def test_own_tasks_without_worker_command_name_the_builtin_handler(project):
    write_json(project / "inputs/mine.json", {"schemaVersion": 1, "tasks": [{"id": "n-1", "payload": {"n": 1}}]})
    (project / "config/mine.yaml").write_text("verify: {command: [python3, -c, pass]}\n")
    done = snakemake(project, "--cores", "4", "--configfile", "config/mine.yaml", "--config", "tasks=inputs/mine.json",
                     "expected=null", "run=mine", timeout=120)
    output = done.stdout + done.stderr
    assert done.returncode == 1
    assert ("allocstack: error [input]: tasks inputs/mine.json: task 1 (n-1): unknown payload key 'n' (worker.command "
            "is not set, so the built-in baseline handler runs the tasks, and it takes {\"message\": TEXT, \"repeat\": "
            "N}; set worker.command to your program to run tasks of your own)") in output, output[-3000:]


def test_the_decision_record_says_none_and_not_in_slurm_in_words(project):
    done = snakemake(project, "--cores", "4")
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    record = (project / "results/baseline/decision-record.md").read_text()
    facts = dict(re.findall(r"^- (.+?): `(.*)`$", record, flags=re.MULTILINE))
    assert facts["image"] == "none (no --sdm apptainer: the Slurm profile sets it)"
    assert facts["container runtime"] == "none"
    assert facts["job steps"] == "not in Slurm: processes on this machine"
    assert facts["built-in coordinator"] == "yes"
    assert not {"None", "True", "False"} & set(facts.values()), facts


def test_a_local_runs_page_is_a_plain_url_and_status_picks_the_one_live_run(project):
    """A finished run's records beside a live one: status.py without --run shows the live one; --url prints the
    page's address alone (the stack runs on this machine's own network, network.isolation none: no SSH tunnel), and
    so does the coordinator's log. In the stack's private network (the default) the page is an owner-only socket,
    named with its SSH line: tests/test_private_network.py."""
    finished = snakemake(project, "--cores", "4")
    assert finished.returncode == 0, (finished.stdout + finished.stderr)[-3000:]
    config = slow_run(project, "live", tasks=16, seconds=0.5)
    config.write_text(config.read_text() + "network: {isolation: none}\n")
    proc = start(project, config)
    env = {"TMPDIR": str(project / "tmp")}
    try:
        wait_for(lambda: journaled(project, "live") >= 1)
        status = run_script("status.py", cwd=project, env=env)
        assert status.returncode == 0, status.stderr
        assert re.match(r"allocstack stack at http://127\.0\.0\.1:\d+: running$", status.stdout.splitlines()[0])
        url = run_script("status.py", "--url", cwd=project, env=env)
        assert url.returncode == 0, url.stderr
        lines = url.stdout.splitlines()
        assert len(lines) == 1 and re.fullmatch(r"http://127\.0\.0\.1:\d+/ui\?token=\S+", lines[0]), lines
        log = (project / "logs/serve_coordinator/live.log").read_text()
        [page] = [line for line in log.splitlines() if "status page" in line]
        port = lines[0].split(":")[2].split("/")[0]
        assert page == (f"coordinator: status page: http://127.0.0.1:{port}/ui (`python workflow/scripts/status.py "
                        "--url` prints it with its view token)")
        assert "ssh" not in page
    finally:
        output, _ = proc.communicate(timeout=200)
    assert proc.returncode == 0, output[-3000:]
    # both ended: several runs, none serving, so --run is needed
    several = run_script("status.py", cwd=project, env=env)
    assert several.returncode == 64 and "2 runs: baseline, live, none serving; say which with --run" in several.stderr
    assert json.loads((project / "results/live/result.json").read_text())["status"] == "success"
