"""The plan of a serving stack (config ``mode: serve``) and of a global service (``services.<name>.mode: global``):
what each rule gets, and what is refused in one line."""

from __future__ import annotations

import pytest

from .plans import plan_of, refusal

IN_ALLOCATION = {"environ": {"SLURM_JOB_ID": "1"}}
SERVE = ("mode: serve\ntasks: null\nexpected: null\n"
         "services: {web: {command: [python3, web.py], readiness: {mode: tcp}}}\n")
GLOBAL = ("nodes: 3\nworkers: 6\nworker: {command: [python3, client.py]}\n"
          "services: {cache: {command: [python3, cache.py], mode: global, readiness: {mode: tcp}},"
          " api: {command: [python3, api.py], readiness: {mode: tcp}}}\n")


def test_a_serving_stack_has_no_workers_no_check_and_no_retries():
    planned = plan_of(SERVE)
    assert planned.serving and not planned.runs_check and planned.workers == [] and planned.retries == 0
    assert planned.verdict("r") == "results/r/serve-verified.json"  # the marker is not a Snakemake output
    assert planned.served_records("r") == ["results/r/served.json"]
    serve = planned.args("serve", run="r")
    assert "--gate-record=results/r/services/web-readiness.json" in serve and "--uses=web" in serve
    assert "--marker=results/r/result.json" in serve and "--up-record=results/r/up.json" in serve
    verify = planned.args("verify", run="r")
    assert "--served-record=results/r/served.json" in verify and not any(a.startswith("--events") for a in verify)
    assert planned.decision_summary.startswith("mode: serve (")


def test_the_up_lines_show_no_address_for_a_service_that_publishes_nothing():
    """A Celery worker as a service (no port, ready once started) listens on nothing: serve.py shows no URL or tunnel
    for it; a service with no port written still gets one (allocstack picks a free port for it)."""
    planned = plan_of(SERVE.replace("}}\n", "}, worker-service: {command: [celery, worker], readiness: {mode: started}},"
                                           " api: {command: [python3, api.py]}}\n"))
    serve = planned.args("serve", run="r")
    assert [a for a in serve if a.startswith("--uses")] == ["--uses=web", "--uses=api"]


WORKER_SERVICE = ("worker-service: {command: [celery, worker], readiness: {mode: started}}")


@pytest.mark.parametrize("shape", ["serve", "batch"])
def test_a_service_ready_once_started_that_nothing_depends_on_gets_no_gate(shape):
    """A Celery or RQ worker as a service (no port, no healthcheck: the import makes it ready once started): nothing
    waits for it, so no readiness step runs for it, in a serving stack or beside workers."""
    text = (SERVE if shape == "serve" else "services: {web: {command: [python3, web.py], readiness: {mode: tcp}}}\n")
    planned = plan_of(text.replace("}}\n", "}, " + WORKER_SERVICE + "}\n"))
    assert planned.gated == ["web"] and list(planned.services) == ["web", "worker-service"]
    assert planned.service_gates("r") == ["results/r/services/web-readiness.json"]
    waited = planned.args("serve", run="r") if shape == "serve" else planned.args("worker", run="r", worker="worker-01")
    assert "--gate-record=results/r/services/web-readiness.json" in waited
    assert not any("worker-service-readiness" in arg for arg in waited)


API = "api: {command: [python3, api.py], depends_on: [worker-service]}"


@pytest.mark.parametrize("main", ["", "main: api"], ids=["a-service", "main"])
def test_a_service_ready_once_started_keeps_its_gate_when_something_depends_on_it(main):
    services = f"services: {{web: {{command: [python3, web.py], readiness: {{mode: tcp}}}}, {WORKER_SERVICE}, {API}}}"
    planned = plan_of(f"mode: serve\ntasks: null\nexpected: null\n{services}\n{main}\n")
    assert "worker-service" in planned.gated
    assert "results/r/services/worker-service-readiness.json" in planned.service_gates("r")


def test_batch_mode_keeps_the_profiles_retries_and_its_marker():
    planned = plan_of()
    assert not planned.serving and planned.retries is None and planned.verdict("r") == "results/r/result.json"


@pytest.mark.parametrize(("extra", "words"), [
    ("tasks: inputs/tasks.json", "mode is serve but tasks is set"),
    ("verify: {command: [python3, check.py]}", "mode is serve but verify.command is set"),
    ("expected: expected/results.json", "mode is serve but expected is set"),
])
def test_what_a_serving_stack_cannot_have_is_one_line(extra, words):
    text = SERVE.replace("tasks: null\n", "").replace("expected: null\n", "")
    defaults = {"tasks": "tasks: null", "expected": "expected: null"}
    key = extra.split(":")[0]
    text += "\n".join(line for name, line in defaults.items() if name != key) + "\n" + extra + "\n"
    assert words in refusal(text).message


def test_a_serving_stack_needs_a_long_running_service():
    text = "mode: serve\ntasks: null\nexpected: null\nservices: {}\n"
    assert "nothing would serve" in refusal(text).message


def test_a_global_service_gets_an_instance_and_a_gate_on_every_other_node():
    planned = plan_of(GLOBAL, **IN_ALLOCATION)
    assert planned.global_services == ["cache"]
    assert planned.instance_files("r") == ["results/r/services/cache-node-2.service",
                                           "results/r/services/cache-node-3.service"]
    assert planned.instance_gates("r") == ["results/r/services/cache-node-2-readiness.json",
                                           "results/r/services/cache-node-3-readiness.json"]
    # collection waits for every instance's gate; every worker keeps every instance alive
    assert set(planned.instance_gates("r")) <= set(planned.service_gates("r"))
    assert set(planned.instance_files("r")) <= set(planned.worker_inputs("r"))
    # each instance is its own job step pinned to its node, its gate too
    launch = planned.launch("instance", run="r", service="cache", node="3")
    assert "--component=cache-node-3" in launch and "--node-index=2" in launch
    gate = planned.launch("instance_gate", run="r", service="cache", node="2")
    assert "--component=cache-node-2-readiness" in gate and "--node-index=1" in gate
    args = planned.args("instance", run="r", service="cache", node="2")
    assert "--instance=cache-node-2" in args and "--name=cache" in args
    assert "--service-file=results/r/services/cache-node-2.service" in args
    assert not any(a.startswith("--network-endpoint-file") for a in args)  # no relay: each node has its own
    assert not any(a.startswith("--network-endpoint-file") for a in planned.args("service", run="r", service="cache"))
    assert any(a.startswith("--network-endpoint-file") for a in planned.args("service", run="r", service="api"))
    gate_args = planned.args("instance_gate", run="r", service="cache", node="2")
    assert "--service=cache-node-2" in gate_args and "--record=results/r/services/cache-node-2-readiness.json" in gate_args


def test_workers_wait_for_and_use_their_own_nodes_instance():
    planned = plan_of(GLOBAL, **IN_ALLOCATION)
    first, third = planned.args("worker", run="r", worker="worker-01"), planned.args("worker", run="r", worker="worker-05")
    assert "--gate-record=results/r/services/cache-readiness.json" in first
    assert not any(a.startswith("--local-service") for a in first)  # the first node's instance is the service
    assert "--gate-record=results/r/services/cache-node-3-readiness.json" in third
    assert "--gate-record=results/r/services/cache-readiness.json" not in third
    assert "--gate-record=results/r/services/api-readiness.json" in third  # a replicated service: the first node's
    assert "--local-service=cache=cache-node-3" in third
    assert "one instance per node (mode: global)" in str(planned.args("validate_inputs", run="r"))


def test_a_global_service_with_one_node_is_an_ordinary_service():
    planned = plan_of(GLOBAL.replace("nodes: 3", "nodes: 1").replace("workers: 6", "workers: 2"))
    assert planned.global_services == [] and planned.instance_files("r") == []


def test_a_global_service_with_depends_on_across_nodes_is_refused():
    text = GLOBAL.replace("mode: global,", "mode: global, depends_on: [api],")
    assert "services.cache.mode is global with depends_on ['api']" in refusal(text, **IN_ALLOCATION).message
