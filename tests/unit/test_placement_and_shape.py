"""Where workers run (balanced blocks over the nodes) and what the allocation must hold."""

from __future__ import annotations

import itertools

from hypothesis import given
from hypothesis import strategies as st

from allocstack.compose.mapping import draft_decisions
from allocstack.plan.placement import node_of, worker_ids
from allocstack.plan.shape import allocation

from .plans import plan_of

IN_ALLOCATION = {"environ": {"SLURM_JOB_ID": "1"}}


@given(st.integers(min_value=1, max_value=64).flatmap(
    lambda nodes: st.tuples(st.just(nodes), st.integers(min_value=nodes, max_value=1024))))
def test_workers_fill_contiguous_balanced_blocks_and_every_node_gets_one(nodes_workers):
    nodes, workers = nodes_workers
    placed = [node_of(index, workers, nodes) for index in range(workers)]
    assert placed == sorted(placed)  # blocks: worker-01.. fill the first node, then the next
    sizes = [len(list(block)) for _, block in itertools.groupby(placed)]
    assert sorted(set(placed)) == list(range(nodes))  # every node has a worker
    assert max(sizes) - min(sizes) <= 1  # balanced
    assert sizes == sorted(sizes, reverse=True)  # the larger blocks first: the first node is never lighter


def test_the_plan_places_workers_as_the_readme_says():
    planned = plan_of("nodes: 3\nworkers: 7", **IN_ALLOCATION)
    assert {worker: planned.worker_node(worker) for worker in planned.workers} == {
        "worker-01": 0, "worker-02": 0, "worker-03": 0, "worker-04": 1, "worker-05": 1, "worker-06": 2,
        "worker-07": 2}
    assert worker_ids(3) == ["worker-01", "worker-02", "worker-03"]
    assert plan_of().worker_node("worker-02") == 0  # one node: all on it


def test_one_node_holds_everything_and_the_group_sums_the_cpus():
    shape = plan_of("workers: 4\nworker: {cpus: 2}\ncoordinator: {cpus: 3}").shape
    assert shape.cpus == 3 + 4 * 2
    assert shape.coordinator_resources() == {"cpus_per_task": 3}  # Snakemake adds the workers' own
    assert shape.worker_cpus == 2


def test_more_nodes_carry_the_busiest_nodes_cpus_on_the_coordinators_job():
    planned = plan_of("nodes: 3\nworkers: 7\nworker: {cpus: 2}\ncoordinator: {cpus: 3}\n"
                      "services: {kv: {command: [x], cpus: 4}}", **IN_ALLOCATION)
    shape = planned.shape
    assert shape.cpus == 3 + 3 * 2 + 4  # the first node: the coordinator, its 3 workers, the service
    assert shape.coordinator_resources() == {"cpus_per_task": 3 + 3 * 2, "nodes": 3, "tasks": 3}
    assert shape.worker_cpus == 0  # the coordinator's job carries them


def test_memory_counts_every_component_running_at_once_including_every_service():
    """mem_mb is per component: the workers, the coordinator and its gate, each service and its gate."""
    assert plan_of().shape.components == 2 + 2
    two = plan_of("services: {kv: {command: [x]}, api: {command: [y], depends_on: [kv]}}").shape
    assert two.components == 2 + 2 + 2 * 2
    assert plan_of("service: {command: [x]}").shape.components == 2 + 2 + 2  # the older spelling: one service


def test_your_own_stack_needs_no_coordinator_cpus():
    own = "tasks: null\nexpected: null\nworkers: 3\nworker: {mode: long-running, command: [w]}\nverify: {command: [c]}\n"
    assert plan_of(own).shape.cpus == 3
    assert plan_of(own + "services: {db: {command: [d], cpus: 2}}").shape.cpus == 3 + 2
    assert allocation(plan_of(own).config) == plan_of(own).shape


def test_the_imports_decision_record_drafts_the_same_allocation():
    config = {"run": "x", "tasks": None, "expected": None, "workers": 3,
              "worker": {"mode": "long-running", "command": ["w"], "environment": {}, "cpus": 2, "gpus": 0},
              "services": {"db": {"command": ["d"], "port": 5000, "readiness": {"mode": "tcp"}, "depends_on": [],
                                  "cpus": 2, "environment": {}, "stop_grace_period": 10}},
              "volumes": [], "verify": {"command": ["c"], "environment": {}},
              "apptainer": {"binds": []}, "charliecloud": {"binds": []}}
    how = draft_decisions(config, ["db"], "compose.yaml")["allocation"]["how"]
    assert how.startswith("One node for a bounded time: 8 CPUs (3 workers x 2, plus each service's)")
