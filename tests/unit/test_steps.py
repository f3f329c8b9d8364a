"""Job steps of several workers: how many workers a step runs, which, where, and what the rules and the coordinator
are told (the plan's part; the steps themselves run in tests/test_worker_block.py and tests/test_multinode.py)."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from allocstack.plan import connections
from allocstack.plan.placement import SEED_WORKERS, node_of, per_step, steps, worker_ids

from .plans import plan_of, refusal

IN_ALLOCATION = {"environ": {"SLURM_JOB_ID": "1"}}


@settings(deadline=None, max_examples=60)
@given(st.integers(min_value=1, max_value=256).flatmap(
    lambda nodes: st.tuples(st.just(nodes), st.integers(min_value=nodes, max_value=5000),
                            st.integers(min_value=1, max_value=300))))
def test_steps_cover_every_worker_once_in_order_and_never_span_two_nodes(nodes_workers_size):
    nodes, workers, size = nodes_workers_size
    planned = steps(workers, nodes, size)
    ids = [worker for step in planned for worker in step.workers]
    assert ids == worker_ids(workers)  # every worker once, in order: its id is its place
    assert all(1 <= step.count <= size for step in planned)
    assert all({node_of(index, workers, nodes) for index in range(step.start, step.start + step.count)} == {step.node}
               for step in planned)
    assert [step.name for step in planned] == [f"workers-{i:02d}" for i in range(1, len(planned) + 1)]
    by_node = [len(list(group)) for _, group in itertools.groupby(step.node for step in planned)]
    assert len(by_node) == nodes  # every node has a step


def test_a_node_of_many_workers_is_split_into_steps_of_per_step_the_last_taking_the_rest():
    planned = steps(workers=20, nodes=2, size=4)
    assert [(step.name, step.node, step.count) for step in planned] == [
        ("workers-01", 0, 4), ("workers-02", 0, 4), ("workers-03", 0, 2),
        ("workers-04", 1, 4), ("workers-05", 1, 4), ("workers-06", 1, 2)]
    assert planned[3].workers[0] == "worker-11"


@pytest.mark.parametrize("workers, nodes, configured, one_each, wanted", [
    (SEED_WORKERS, 1, None, False, 1),  # the seed's shape up to 16 workers
    (SEED_WORKERS + 1, 1, None, False, SEED_WORKERS + 1),  # above: one step per node
    (4096, 64, None, False, 64),
    (100, 3, None, False, 34),  # the busiest node's workers
    (4096, 64, None, True, 1),  # long-running workers, GPUs: each its own step
    (24, 3, 8, False, 8),
    (4096, 64, 1, False, 1),  # the seed's shape asked for
])
def test_workers_per_step_is_the_configs_or_one_step_per_node_above_sixteen(workers, nodes, configured, one_each,
                                                                            wanted):
    assert per_step(workers, nodes, configured, one_each) == wanted


def test_sixteen_workers_keep_the_seeds_shape_and_more_make_one_job_per_node():
    seed = plan_of("workers: 16")
    assert not seed.grouped and len(seed.worker_records("baseline")) == 16
    assert seed.coordinator_connections == connections.MARGIN + 2 * 16
    grouped = plan_of("nodes: 64\nworkers: 4096", **IN_ALLOCATION)
    assert grouped.grouped and len(grouped.steps) == 64
    assert grouped.worker_records("baseline")[:2] == ["results/baseline/workers/workers-01",
                                                      "results/baseline/workers/workers-02"]
    assert grouped.worker_record_files("baseline")[64] == "results/baseline/workers/workers-02/worker-65.json"
    assert grouped.coordinator_connections == connections.MARGIN + 4 * 64  # not 2 x 4,096
    assert grouped.step_cpus("workers-02") == 0  # more nodes: the coordinator's job carries the CPUs per node
    assert plan_of("workers: 40\nworker: {cpus: 2}").step_cpus("workers-01") == 80


def test_a_step_of_a_node_starts_after_that_nodes_gate_and_is_pinned_there():
    planned = plan_of("nodes: 3\nworkers: 30\nworker: {per_step: 5}", **IN_ALLOCATION)
    assert [step.node for step in planned.steps] == [0, 0, 1, 1, 2, 2]
    launch = planned.launch("workers", run="baseline", step="workers-05")
    assert "--node-index=2" in launch and "--component=workers-05" in launch and "--cpus=5" in launch
    args = planned.args("workers", run="baseline", step="workers-05")
    assert "--gate-record=results/baseline/gates/node-3.json" in args
    assert "--endpoint-file=state/baseline/endpoint.json" in args and "--shared-dir=state/baseline" in args
    first = planned.args("workers", run="baseline", step="workers-01")
    assert not any(arg.startswith(("--endpoint-file", "--gate-record=results/baseline/gates")) for arg in first)


@pytest.mark.parametrize("config, words", [
    ("workers: 40\nworker: {per_step: 8, mode: long-running, command: [w]}",
     "worker.per_step=8 with worker.mode long-running"),
    ("workers: 40\nworker: {per_step: 8, gpus: 1}", "worker.per_step=8 with worker.gpus=1"),
])
def test_several_workers_in_a_step_are_per_task_workers_without_gpus(config, words):
    refused = refusal(config)
    assert refused.diag == "config" and words in refused.message, refused.message


def test_long_running_workers_and_gpu_workers_keep_a_step_each_by_default():
    assert not plan_of("workers: 40\nworker: {gpus: 1}").grouped
    own = "tasks: null\nexpected: null\nverify: {command: [c]}\nworkers: 40\nworker: {mode: long-running, command: [w]}"
    assert not plan_of(own).grouped


def test_the_limits_are_what_the_design_holds():
    planned = plan_of("nodes: 1024\nworkers: 65536", **IN_ALLOCATION)
    assert len(planned.steps) == 1024 and planned.steps[-1].workers[-1] == "worker-65536"
    assert refusal("workers: 65537").message.startswith("workers: 65537 is greater than the maximum of 65536")
    assert refusal("nodes: 1025\nworkers: 2000").message.startswith("nodes: 1025 is greater than the maximum of 1024")
