"""What the plan refuses because of the world: nodes and Slurm, CPUs, the cluster's limits, the host, PATH.

Slurm is asked through the plan's injectable query, answered here with output captured from the test
cluster (tests/test_slurm_queries.py); the same refusals against the real cluster are in tests/test_slurm.py.
"""

from __future__ import annotations

import pytest
from test_slurm_queries import ACCOUNTS, ASSOCIATIONS, NODES, PARTITIONS

from allocstack.plan import PlanError
from allocstack.plan.refusals import refuse_without_allocation

from .plans import plan_of, refusal, world

IN_ALLOCATION = {"environ": {"SLURM_JOB_ID": "1"}}
PROFILE = {"slurm_account": "allocstack", "slurm_partition": "debug", "runtime": 5}


def cluster(asked: list[list[str]] | None = None):
    """The test cluster's Slurm (Slurm 22.05.8, node vm: 8 CPUs, 8000 MB; partitions debug and short)."""
    answers = {"account": ACCOUNTS, "association": ASSOCIATIONS, "partition": PARTITIONS, "node": NODES,
               "sinfo": "8\n8\n"}

    def query(argv: list[str]) -> str | None:
        if asked is not None:
            asked.append(argv)
        return next((text for word, text in answers.items() if word in argv), None)

    return query


def submitting(**resources) -> dict:
    """The world of `snakemake --profile profiles/slurm` on the login node, with these default resources."""
    return {"default_resources": {**PROFILE, **resources}, "slurm_query": cluster(), "user": "root"}


@pytest.mark.parametrize("config, facts, words", [
    ("nodes: 3\nworkers: 2", {}, "nodes=3 but workers=2: a node would get no worker"),
    ("nodes: 2\nslurm: {job_steps: false}", IN_ALLOCATION, "nodes=2 needs slurm.job_steps: true"),
    ("nodes: 2\ntasks: null\nexpected: null\nworker: {mode: long-running, command: [w]}\nverify: {command: [c]}",
     IN_ALLOCATION, "nodes=2 needs the built-in coordinator"),
    ("nodes: 2\nvolumes: [data]", IN_ALLOCATION, "nodes=2 with volumes: a named volume is job-scoped scratch"),
])
def test_bad_multi_node_config_is_refused_before_anything_runs(config, facts, words):
    refused = refusal(config, **facts)
    assert refused.diag == "config" and words in refused.message, refused.message


def test_more_nodes_outside_slurm_are_planned_for_review_and_refused_only_to_run():
    """A dry run shows a plan of any size anywhere (no allocation, no profile); a run outside Slurm is refused when
    it starts (Snakemake's onstart, never in a dry run), with the same one line."""
    planned = plan_of("nodes: 64\nworkers: 4096", environ={"SLURM_JOB_ID": ""})
    assert len(planned.steps) == 64 and {step.count for step in planned.steps} == {64}
    with pytest.raises(PlanError) as refused:
        planned.before_running()
    assert refused.value.diag == "config"
    assert refused.value.message.startswith("nodes=64 needs a Slurm allocation: run with --profile profiles/slurm")
    plan_of("nodes: 2", **IN_ALLOCATION).before_running()  # inside an allocation it runs
    refuse_without_allocation(planned.config, world(**submitting()))  # and submitted to Slurm
    plan_of().before_running()  # one node runs anywhere


def test_more_nodes_plan_a_network_listener_node_gates_and_shared_logs():
    planned = plan_of("nodes: 3\nworkers: 7", **IN_ALLOCATION)
    assert planned.environment == {"SBATCH_NO_KILL": "set"}
    assert "--network-endpoint-file=state/baseline/endpoint.json" in planned.args("coordinator", run="baseline")
    assert planned.node_gates("baseline") == ["results/baseline/gates/node-2.json", "results/baseline/gates/node-3.json"]
    worker = planned.args("worker", run="baseline", worker="worker-07")
    assert "--gate-record=results/baseline/gates/node-3.json" in worker
    assert "--events=state/baseline/events/worker-07.jsonl" in worker
    assert "--node-index=2" in planned.launch("worker", run="baseline", worker="worker-07")


def test_one_node_plans_loopback_only():
    """nodes: 1 (the default) plans no network listener, no node gates and no shared event logs."""
    planned = plan_of()
    commands = [planned.args(component, run="baseline") for component in ("coordinator", "readiness", "verify")]
    commands += [planned.args("worker", run="baseline", worker=w) + planned.launch("worker", run="baseline", worker=w)
                 for w in planned.workers]
    text = " ".join(arg for argv in commands for arg in argv)
    assert "--network-endpoint-file" not in text and "--off-node" not in text
    assert "--node-index" not in text and "/events/" not in text
    assert planned.node_gates("baseline") == [] and planned.environment == {}


def test_more_cpus_than_slurm_max_cpus_is_refused():
    refused = refusal("workers: 8\nslurm: {max_cpus: 8}")
    assert refused.message.startswith("workers=8 needs 9 CPUs in one allocation (workers x worker.cpus, plus "
                                      "coordinator.cpus and each service's cpus) but slurm.max_cpus has 8")
    refused = refusal("nodes: 2\nworkers: 9\nslurm: {max_cpus: 5}\nservices: {kv: {command: [x]}}", **IN_ALLOCATION)
    assert "workers=9 needs 7 CPUs on its first of 2 nodes" in refused.message  # 1 + 5 workers + 1 service


def test_submitting_asks_sinfo_for_the_largest_node():
    asked: list[list[str]] = []
    refused = refusal("workers: 40", default_resources=PROFILE, slurm_query=cluster(asked), user="root")
    assert "workers=40 needs 41 CPUs in one allocation" in refused.message and "the largest node in sinfo has 8" in \
        refused.message
    assert ["sinfo", "--noheader", "--Node", "--format=%c"] in asked
    assert plan_of("workers: 40").shape.cpus == 41  # not submitting: sinfo is not asked, nothing refused


@pytest.mark.parametrize("resources, words", [
    ({"slurm_account": "allocstack-no-such"}, "slurm_account=allocstack-no-such: there is no such account"),
    ({"slurm_account": "allocstack-other"}, "slurm_account=allocstack-other: the account exists but user root"),
    ({"slurm_partition": "allocstack-no-such"}, "slurm_partition=allocstack-no-such: there is no such partition"),
    ({"slurm_partition": "short", "runtime": 10}, "runtime=10: above the 5-minute MaxTime of partition short"),
    ({"mem_mb": 3000}, "mem_mb=3000 x 4 components running at once = 12000 MB in one allocation, above the"),
])
def test_wrong_cluster_settings_are_refused_before_anything_is_submitted(resources, words):
    refused = refusal(**submitting(**resources))
    assert refused.line() == f"allocstack: error [config]: default-resources {words}" + refused.line().split(words)[1]
    assert refused.exit_code == 78


def test_the_memory_check_counts_your_services():
    """2 workers, the coordinator and its gate, 2 services and their gates: 8 components of 1000 MB."""
    services = "services: {kv: {command: [x]}, api: {command: [y]}}"
    assert plan_of(services, **submitting(mem_mb=1000)).shape.components == 8  # 8000 MB: the node has 8000
    refused = refusal(services, **submitting(mem_mb=1001))  # without the services: 4004 MB, passed
    assert "mem_mb=1001 x 8 components running at once = 8008 MB in one allocation" in refused.message


def test_more_nodes_than_the_partition_has_names_config_nodes():
    refused = refusal("nodes: 2\nworkers: 2", **submitting())
    assert refused.message.startswith("nodes=2 but partition debug has 1 node(s)")  # config nodes: no profile key


def test_inside_an_allocation_snakemake_must_run_on_its_node():
    facts = {"environ": {"SLURM_JOB_ID": "424242", "SLURM_JOB_NODELIST": "elsewhere[01-02]"}, "hostname": "vm.local",
             "slurm_query": lambda argv: "elsewhere01\nelsewhere02\n" if argv[:2] == ["scontrol", "show"] else None}
    refused = refusal(**facts)
    assert refused.diag == "prerequisite" and refused.message.startswith(
        "inside allocation 424242 (node(s) elsewhere01, elsewhere02) but on host vm:")
    assert "srun --jobid 424242 --overlap --pty bash" in refused.message
    plan_of(**{**facts, "hostname": "elsewhere02.cluster"})  # on one of its nodes
    plan_of(**{**facts, "environ": {**facts["environ"], "SLURMD_NODENAME": "x"}})  # inside a job step
    plan_of("slurm: {job_steps: false}", **facts)


@pytest.mark.parametrize("config, deployment, words", [
    ("image: fake.sif", {"apptainer"}, ("image is set and --sdm apptainer is on, but apptainer is not on PATH; load it "
                                       "with `module load apptainer`")),
    ("image: fake\nruntime: charliecloud", set(), "image is set and runtime is charliecloud, but ch-run is not on PATH"),
])
def test_an_image_without_its_runtimes_program_is_refused(config, deployment, words):
    refused = refusal(config, deployment=frozenset(deployment))
    assert refused.diag == "prerequisite" and refused.message.startswith(words)
    planned = plan_of(config, deployment=frozenset(deployment), which=lambda program: f"/usr/bin/{program}")
    assert planned.use_image
    assert not plan_of("image: fake.sif").use_image  # Apptainer: only with --sdm apptainer
