"""A global service (issue 25, point 4; Compose `deploy.mode: global`, config `services.<name>.mode: global`) on the
real 3-node test cluster: one instance on every node, each its own job step gated on its node, and each node's
workers use their own node's instance (its loopback: a worker on mn2 cannot reach mn1's)."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from test_multinode import (  # noqa: F401 - a fixture
    cluster_args,
    job_steps,
    multinode_project,
    submitted_job,
    upper_case_tasks,
)
from test_own_service import WORD_SERVER

from workflow_helpers import snakemake

pytestmark = [pytest.mark.multinode, pytest.mark.slurm, pytest.mark.apptainer]

#: A per-node cache: upper-cases a word for the token's holder, and notes each word it served under its node's name.
CACHE = WORD_SERVER + textwrap.dedent("""
    import os, socket
    TOKEN, NODE = os.environ["ALLOCSTACK_CACHE_TOKEN"], socket.gethostname()
    NOTES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "served-" + NODE + ".txt")
    def note(word):
        with open(NOTES, "a") as notes:
            notes.write(word + "\\n")
    serve(os.environ["ALLOCSTACK_CACHE_HOST"], int(os.environ["ALLOCSTACK_CACHE_PORT"]), TOKEN,
          {"status": "ok", "node": NODE}, note)
""")

#: The workers' program: asks its node's cache (the variables say 127.0.0.1, as on one node).
CLIENT = textwrap.dedent("""
    import json, os, sys, urllib.request
    assert os.environ["ALLOCSTACK_CACHE_HOST"] == "127.0.0.1", os.environ["ALLOCSTACK_CACHE_HOST"]
    word = json.load(sys.stdin)["message"]
    request = urllib.request.Request(os.environ["ALLOCSTACK_CACHE_ENDPOINT"] + "/word/" + word,
                                     headers={"Authorization": "Bearer " + os.environ["ALLOCSTACK_CACHE_TOKEN"]})
    sys.stdout.write(json.load(urllib.request.urlopen(request, timeout=5))["value"])
""")


def global_cache_run(project: Path, run: str, count: int) -> Path:
    upper_case_tasks(project, run, count, "w")
    (project / "apps/cache.py").write_text(CACHE)
    (project / "apps/client.py").write_text(CLIENT)
    config = project / f"config/{run}.yaml"
    config.write_text(f"run: {run}\ntasks: inputs/{run}.json\nexpected: expected/{run}.json\n"
                      "simulate: {task_seconds: 0.2}\nworker: {batch: 2, command: [python3, apps/client.py]}\n"
                      "services:\n  cache:\n    command: [python3, apps/cache.py]\n    mode: global\n"
                      "    readiness: {mode: http, path: /health, expect: {status: ok}}\n"
                      f"apptainer: {{binds: [{project / 'apps'}]}}\n")
    return config


def test_a_global_service_runs_once_on_each_node_and_each_nodes_workers_use_their_own(multinode_project):  # noqa: F811
    project, image, layout = multinode_project
    config = global_cache_run(project, "percache", 24)
    done = snakemake(project, "--configfile", str(config), *cluster_args(layout, image), timeout=600)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    assert json.loads((project / "results/percache/result.json").read_text())["status"] == "success"
    nodes = sorted(layout["nodes"])  # the three nodes of its set
    job = submitted_job(output)
    instances = {"cache": nodes[0], "cache-node-2": nodes[1], "cache-node-3": nodes[2]}
    gates = {f"{name}-readiness": node for name, node in instances.items()}
    steps = job_steps(job, {*instances, *gates})
    # the service ran once on each node, as its own step there, each gated on its own node
    assert {name: steps[name]["node"] for name in instances} == instances, steps
    assert {name: steps[name]["node"] for name in gates} == gates, steps
    for name in ("cache-node-2", "cache-node-3"):
        gate = json.loads((project / f"results/percache/services/{name}-readiness.json").read_text())
        assert gate["status"] == "ready", gate
        assert (project / f"logs/serve_service/percache/{name}.log").is_file()
    # each node's workers asked their own node's instance, and only it
    end = json.loads((project / "results/percache/coordinator.json").read_text())
    node_of_worker = {worker: stats["node"] for worker, stats in end["workers"].items()}
    results = json.loads((project / "results/percache/results.json").read_text())["results"]
    asked = {node: set() for node in nodes}
    for result in results:
        asked[node_of_worker[result["workerId"]]].add(result["output"].lower())
    served = {node: set((project / f"apps/served-{node}.txt").read_text().split())
              if (project / f"apps/served-{node}.txt").exists() else set() for node in nodes}
    assert all(asked[node] for node in nodes), asked  # every node's workers did work
    assert served == asked, (served, asked)
