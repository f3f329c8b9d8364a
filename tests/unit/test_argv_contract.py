"""Every command line the plan builds is one its script accepts: each is fed to that script's own parse_args.

An option renamed in a script (or in the plan) fails here, not at run time on the path that uses it. Every
entry point the rules start is covered: launch.py, validate_inputs.py, coordinator.py, readiness.py (the
coordinator's gate, each other node's, each service's and each global service's instance), app_service.py (a
service, a global service's instance on another node, a further replica of a service), worker.py, replica.py,
main.py, check.py, serve.py (a serving stack), collect.py, verify.py, and status.py at the end of a run.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from allocstack import plan
from allocstack.common.cli import ArgumentParser
from allocstack.coordinator.settings import parse_settings

from .plans import SCRIPTS, plan_of

IN_STEP = {"SLURM_JOB_ID": "7", "SLURMD_NODENAME": "vm"}
INSTALLED = {"which": lambda program: f"/usr/bin/{program}"}
SERVICES = ("services:\n"
            "  db: {command: [python3, db.py], port: 5000, readiness: {mode: command, command: [python3, -c, pass],"
            " interval: 0.2, probe_timeout: 3}, stop_grace_period: 20, environment: {K: v}}\n"
            "  web: {command: [python3, web.py], depends_on: [db], readiness: {mode: http, path: /ok,"
            " expect: {status: ok}}, cpus: 2}\n"
            "  cache: {command: [python3, cache.py], depends_on: [db, web], readiness: {mode: tcp, timeout: 12}}\n")
OWN_STACK = ("tasks: null\nexpected: null\nworker: {mode: long-running, command: [python3, w.py], environment: {A: b}}\n"
             "verify: {command: [python3, c.py], environment: {X: y}}\nvolumes: [data]\n")

#: Your own stack, each program in its own image (as import_compose.py writes it): no command (the image's own),
#: an entrypoint, mounts, a working directory, a port from the image's EXPOSE, a command gate in the image.
IMAGES = ("tasks: null\nexpected: null\nvolumes: [work]\n"
          "worker: {mode: long-running, image: images/app.sif, mounts: [{target: /work, volume: work}],"
          " working_dir: /code}\n"
          "verify: {image: images/app.sif, command: [check.py], mounts: [{target: /work, volume: work,"
          " read_only: true}, {target: /code, source: config, read_only: true}]}\n"
          "services:\n"
          "  redis: {image: images/redis-7.sif, command: [redis-server, --save, ''], port: image,"
          " readiness: {mode: command, command: [redis-cli, ping]}}\n"
          "  api: {image: images/api.sif, entrypoint: [python3, -m, api], port: 8080, depends_on: [redis],"
          " readiness: {mode: started}}\n")

#: Restart policies (Compose restart:, deploy.restart_policy): a service's and the long-running workers'.
RESTARTS = ("tasks: null\nexpected: null\nverify: {command: [python3, c.py]}\nmain: producer\n"
            "worker: {mode: long-running, command: [rq, worker], restart: {condition: any}}\n"
            "services:\n"
            "  db: {command: [db], restart: {condition: on-failure, delay: 0.5, max_attempts: 3, window: 60}}\n"
            "  producer: {command: [p], depends_on: [db]}\n")

#: Compose's depends_on mapping form: an edge that waits for the start only, one for the gate, one for an init job.
CONDITIONS = ("tasks: null\nexpected: null\nverify: {command: [python3, c.py]}\nmain: producer\ninit_jobs: [migrate]\n"
              "worker: {mode: long-running, command: [rq, worker]}\n"
              "services:\n"
              "  db: {command: [db], readiness: {mode: tcp, timeout: 40}}\n"
              "  cache: {command: [cache], readiness: {mode: command, command: [ping], timeout: 50}}\n"
              "  migrate: {command: [m], depends_on: {db: service_healthy}}\n"
              "  web: {command: [web], depends_on: {db: service_started, cache: service_healthy,"
              " migrate: service_completed_successfully}}\n"
              "  producer: {command: [p], depends_on: {db: service_started, web: service_started}}\n")

#: A service of three replicas (Compose deploy.replicas): a consumer that listens on nothing, with a restart policy.
REPLICAS = ("tasks: null\nexpected: null\nverify: {command: [python3, c.py]}\nvolumes: [data]\n"
            "worker: {mode: long-running, command: [w]}\n"
            "services:\n"
            "  db: {command: [db], port: 5000, readiness: {mode: tcp}}\n"
            "  consumer: {command: [c], replicas: 3, depends_on: [db], readiness: {mode: started},"
            " restart: {condition: on-failure}, stop_grace_period: 4}\n")

#: A web server of three replicas on one port, each in a network of its own, with a gate each; a store it uses.
LISTENING_REPLICAS = ("tasks: null\nexpected: null\nverify: {command: [python3, c.py]}\n"
                      "worker: {mode: long-running, command: [w]}\n"
                      "services:\n"
                      "  store: {command: [s], port: 8100, readiness: {mode: tcp}}\n"
                      "  web: {command: [web], port: 8000, replicas: 3, depends_on: [store]}\n")

#: name -> (config, facts): between them every option the plan can give.
STACKS = {
    "restart policies": (RESTARTS, {}),
    "the baseline": ("", {}),
    "Compose's depends_on conditions": (CONDITIONS, {}),
    "more nodes": ("nodes: 3\nworkers: 7\nnetwork: {interface: ib0, tls: false}\nservices: {kv: {command: [kv]}}",
                   {"environ": IN_STEP}),
    "more nodes, long-running workers": ("nodes: 2\nworkers: 2\nworker: {mode: long-running, command: [w]}",
                                         {"environ": IN_STEP}),
    "your own stack": (OWN_STACK + SERVICES, {}),
    "your own stack without services": (OWN_STACK, {}),
    "your own stack with a main program": (OWN_STACK + SERVICES + "main: cache\nworkers: 3\n"
                                           "worker: {mode: long-running, command: [rq, worker], stop_grace_period: 4}\n",
                                           {}),
    "your own stack with an init job and bounded daemon workers": (
        OWN_STACK.replace("environment: {A: b}}", "environment: {A: b}, max_lifetime: 30, stop_grace_period: 3}")
        + SERVICES + "  migrate: {command: [python3, migrate.py], depends_on: [db], stop_grace_period: 5}\n"
        + "init_jobs: [migrate]\n", {}),
    "a main program and no check of yours": (("tasks: null\nexpected: null\nworker: {mode: long-running, command: [w]}\n"
                                              "services: {app: {command: [python3, producer.py]}}\nmain: app\n"), {}),
    "Apptainer with GPUs, in a job step": (("image: allocstack.sif\nworker: {gpus: 2, command: [python3, x.py]}\n"
                                           "verify: {command: [python3, c.py]}\nslurm: {step_args: [--overlap]}"),
                                           {"environ": IN_STEP, "deployment": frozenset({"apptainer"}), **INSTALLED}),
    "Charliecloud, volumes kept for your check": (
        ("image: img\nruntime: charliecloud\nvolumes: [cache]\nverify: {command: [python3, c.py]}\nscratch: /scratch\n"
        "state_dir: st\ncoordinator: {stop_claims_before_end: false}\ncharliecloud: {args: [--set-env=A=1], binds: [x]}"),
        INSTALLED),
    "your own stack, each program in its own image (Apptainer)": (IMAGES, {"deployment": frozenset({"apptainer"}),
                                                                           **INSTALLED}),
    "your own stack, each program in its own image (Charliecloud)": (IMAGES + "runtime: charliecloud\n", INSTALLED),
    "per-task workers in worker.image": ("worker: {image: w.sif}\n", {"deployment": frozenset({"apptainer"}),
                                                                      **INSTALLED}),
    "no job steps, the older service block": ("slurm: {job_steps: false}\nservice: {command: [python3, app.py]}",
                                              {"environ": IN_STEP}),
    "many workers on one node": ("workers: 40\nworker: {command: [python3, x.py], task_timeout: 5}", {}),
    "many workers on many nodes, in an image": (
        "nodes: 4\nworkers: 70\nworker: {per_step: 9}\nimage: allocstack.sif\nservices: {kv: {command: [kv]}}",
        {"environ": IN_STEP, "deployment": frozenset({"apptainer"}), **INSTALLED}),
    "a serving stack (mode: serve) with an init job": (
        ("mode: serve\ntasks: null\nexpected: null\ninit_jobs: [migrate]\n"
        "services: {db: {command: [db], port: 5432}, migrate: {command: [m], depends_on: [db]},"
        " web: {command: [web], port: 8000, depends_on: [db, migrate]}}\n"), {"environ": IN_STEP}),
    "a global service on three nodes": (
        ("nodes: 3\nworkers: 6\nworker: {command: [python3, client.py]}\n"
        "services: {cache: {command: [cache], mode: global, readiness: {mode: tcp}}, api: {command: [api]}}\n"),
        {"environ": IN_STEP}),
    "a service of three replicas, in job steps": (REPLICAS, {"environ": IN_STEP}),
    "a service that listens, of three replicas, each in a network of its own": (LISTENING_REPLICAS,
                                                                              {"environ": IN_STEP}),
    "a service that listens, of two replicas, on three nodes": (
        "nodes: 3\nworkers: 6\nservices: {web: {command: [w], port: 8000, replicas: 2, readiness: {mode: tcp}}}",
        {"environ": IN_STEP}),
}


def jobs(planned: plan.Plan) -> Iterator[tuple[str, dict[str, str]]]:
    """Every job of the run, as (component, wildcards)."""
    run = {"run": planned.run}
    yield "validate_inputs", run
    if planned.private_network:
        yield "network", run
    if planned.builtin_coordinator:
        yield "coordinator", run
        yield "readiness", run
    for node in range(2, planned.nodes + 1):
        yield "node_gate", {**run, "node": str(node)}
    for service in planned.services:
        yield "service", {**run, "service": service}
        yield "service_gate", {**run, "service": service}
        if service in planned.global_services:
            for node in range(2, planned.nodes + 1):
                yield "instance", {**run, "service": service, "node": str(node)}
                yield "instance_gate", {**run, "service": service, "node": str(node)}
        for replica in planned.replicas(service)[1:]:
            yield "replica", {**run, "service": service, "replica": str(replica)}
            if service in planned.gated:
                yield "replica_gate", {**run, "service": service, "replica": str(replica)}
    for init in planned.init_jobs:
        yield "init", {**run, "service": init}
    if planned.main:
        yield "main", run
    if planned.grouped:
        for step in planned.step_names:
            yield "workers", {**run, "step": step}
    else:
        for worker in planned.workers:
            yield "worker", {**run, "worker": worker}
    if planned.runs_check:
        yield "check", run
    if planned.serving:
        yield "serve", run
    yield "collect", run
    yield "verify", run


def parse(script: str, argv: list[str]) -> object:
    """``argv`` as ``script`` (in workflow/scripts) parses it."""
    if script == "coordinator.py":
        return parse_settings(argv)
    return importlib.import_module(script.removesuffix(".py")).parse_args(argv)


@pytest.fixture(autouse=True)
def whole_options(monkeypatch):
    """An abbreviation argparse accepts (``--stop-grac``) is a misspelling here: the plan spells each option whole."""
    init = ArgumentParser.__init__
    monkeypatch.setattr(ArgumentParser, "__init__", lambda self, *args, **kwargs: init(self, *args, **kwargs,
                                                                                       allow_abbrev=False))


@pytest.fixture
def workdir(tmp_path, monkeypatch) -> Path:
    """A run's working directory: launch.py sets $ALLOCSTACK_SCRATCH; the gate reads the task count from the summary."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ALLOCSTACK_SCRATCH", str(tmp_path / "scratch"))
    return tmp_path


@pytest.mark.parametrize("stack", sorted(STACKS))
def test_every_command_line_parses_with_its_scripts_own_parser(stack, workdir):
    text, facts = STACKS[stack]
    planned = plan_of(text, **facts)
    summary = workdir / planned.layout.inputs_summary
    summary.parent.mkdir(parents=True)
    summary.write_text(json.dumps({"taskCount": 4}))
    started = set()
    for component, wildcards in jobs(planned):
        script = planned.script_of(component)
        args = planned.args(component, **wildcards)
        parsed = parse(script, args)
        assert parsed is not None
        started.add(script)
        if component in ("validate_inputs", "collect"):
            continue  # run by the rule's interpreter directly, not through launch.py
        launch = planned.launch(component, gpus=planned.config["worker"]["gpus"] if component == "worker" else 0,
                                **wildcards)
        if launch == [planned.python]:
            assert component == "verify"  # one-shot: a plain process where launch.py would add nothing
            continue
        assert Path(launch[1]) == SCRIPTS / "launch.py" and launch[-1] == "--"
        launched = parse("launch.py", [*launch[2:], planned.script(script), *args])
        assert launched.command == [planned.script(script), *args]
        if component == "workers":  # and each worker's own command line, as the step makes it
            block = parse("worker_block.py", args)
            for worker in block.worker:
                parse("worker.py", importlib.import_module("worker_block").worker_argv(block, worker, Path("r.json"))[2:])
            started.add("worker.py")
    assert {"validate_inputs.py", "collect.py", "verify.py"} <= started


def test_every_entry_point_is_covered():
    started = {planned.script_of(component) for text, facts in STACKS.values()
               for planned in [plan_of(text, **facts)] for component, _ in jobs(planned)}
    assert started == {"validate_inputs.py", "coordinator.py", "readiness.py", "app_service.py", "worker.py",
                       "replica.py", "main.py", "worker_block.py", "check.py", "serve.py", "collect.py", "verify.py",
                       "stack_network.py"}


def test_the_end_of_run_summary_parses_with_status_pys_parser():
    planned = plan_of()
    argv = planned.end_of_run("error", 1700000000.5)
    assert argv[:2] == [planned.facts.python, planned.script("status.py")]
    parsed = parse("status.py", argv[2:])
    assert (parsed.run, parsed.end_of_run, parsed.since) == ("baseline", "error", 1700000000.5)


def test_values_reach_the_scripts_as_the_config_says(workdir):
    """A few values end to end: through argv and the script's own types."""
    planned = plan_of(OWN_STACK + SERVICES)
    gate = parse("readiness.py", planned.args("service_gate", run="baseline", service="web"))
    assert (gate.mode, gate.path, gate.expect_json, gate.timeout) == ("http", "/ok", {"status": "ok"}, 30.0)
    assert gate.start_timeout == 30 + 30 + 30  # db's start and gate, then web's start
    service = parse("app_service.py", planned.args("service", run="baseline", service="cache"))
    assert service.uses == ["db", "web"] and service.command_json == ["python3", "cache.py"]
    assert service.gate_record == [Path("results/baseline/services/db-readiness.json"),
                                   Path("results/baseline/services/web-readiness.json")]
    replica = parse("replica.py", planned.args("worker", run="baseline", worker="worker-02"))
    assert (replica.index, replica.workers, replica.environment_json) == (1, 2, {"A": "b"})
    assert replica.gate_timeout == max(30 + 30, 90 + 30, 150 + 12) + 30
    launched = parse("launch.py", [*planned.launch("worker", run="baseline", worker="worker-02")[2:], "replica.py"])
    assert launched.volume == ["data"] and launched.tolerate_kill == []  # a long-running worker's kill fails the run
    collect = parse("collect.py", planned.args("collect", run="baseline"))
    assert collect.component == ["db", "web", "cache", "worker-01", "worker-02", "check"]
    assert collect.stop_timeout == 20 + 15


def test_a_restart_policy_reaches_the_supervisors_and_none_adds_no_option(workdir):
    planned = plan_of(RESTARTS)
    db = parse("app_service.py", planned.args("service", run="baseline", service="db"))
    assert (db.restart, db.restart_delay, db.restart_max_attempts, db.restart_window) == ("on-failure", 0.5, 3, 60.0)
    replica = parse("replica.py", planned.args("worker", run="baseline", worker="worker-01"))
    assert (replica.restart, replica.restart_delay, replica.restart_max_attempts) == ("any", 0.0, None)
    assert not any(arg.startswith("--restart") for arg in plan_of(OWN_STACK + SERVICES).args("service", run="baseline",
                                                                                             service="db"))


def test_a_step_of_several_workers_gives_each_its_own_id_record_log_and_events(workdir):
    planned = plan_of("nodes: 3\nworkers: 20\nworker: {batch: 16}", environ=IN_STEP)
    assert planned.step_names == ["workers-01", "workers-02", "workers-03"]  # one step per node: 7, 7, 6 workers
    block = parse("worker_block.py", planned.args("workers", run="baseline", step="workers-02"))
    assert block.worker == [f"worker-{i:02d}" for i in range(8, 15)]
    assert block.records == Path("results/baseline/workers/workers-02")
    assert block.endpoint_file == Path("state/baseline/endpoint.json")  # off the first node: the network endpoint
    assert block.gate_record[-1] == Path("results/baseline/gates/node-2.json")  # its node's gate
    worker = parse("worker.py", importlib.import_module("worker_block").worker_argv(block, "worker-09",
                                                                                    Path("relay.json"))[2:])
    assert (worker.worker_id, worker.batch, worker.endpoint_file) == ("worker-09", 16, "relay.json")
    assert worker.record == Path("results/baseline/workers/workers-02/worker-09.json")
    assert worker.events == Path("state/baseline/events/worker-09.jsonl") and worker.gate_record == []
    launched = parse("launch.py", [*planned.launch("workers", run="baseline", step="workers-02")[2:], "x.py"])
    assert launched.component == "workers-02" and launched.node_index == 1 and launched.cpus == 7
    assert launched.tolerate_kill == [Path(f"results/baseline/workers/workers-02/worker-{i:02d}.json")
                                      for i in range(8, 15)]
    coordinator = parse("coordinator.py", planned.args("coordinator", run="baseline"))
    assert coordinator.max_connections == 512 + 3 * 4  # a few connections a step, not two a worker


def test_programs_of_yours_run_in_their_images_and_their_supervisors_beside_them(workdir):
    """Each program's image, mounts, working directory and entrypoint reach its supervisor; the supervisor itself
    (and a service's gate) runs beside the image, not in ``image``; validate_inputs gets every image to check."""
    planned = plan_of(IMAGES, deployment=frozenset({"apptainer"}), **INSTALLED)
    service = parse("app_service.py", planned.args("service", run="r", service="redis"))
    assert service.image.endswith("images/redis-7.sif") and service.port_from_image and service.command_json == [
        "redis-server", "--save", ""]
    api = parse("app_service.py", planned.args("service", run="r", service="api"))
    assert api.entrypoint_json == ["python3", "-m", "api"] and api.command_json is None and api.port == 8080
    gate = parse("readiness.py", planned.args("service_gate", run="r", service="redis"))
    assert gate.image.endswith("images/redis-7.sif") and gate.ready_command_json == ["redis-cli", "ping"]
    replica = parse("replica.py", planned.args("worker", run="r", worker="worker-01"))
    assert replica.command_json is None and replica.working_dir == "/code"
    assert replica.mounts_json == [{"target": "/work", "volume": "work", "read_only": False}]  # the default filled in
    check = parse("check.py", planned.args("check", run="r"))
    assert check.image.endswith("images/app.sif") and check.mounts_json[1]["read_only"] is True
    for component, wildcards in (("service", {"service": "redis"}), ("service_gate", {"service": "redis"}),
                                 ("worker", {"worker": "worker-01"}), ("check", {})):
        assert not any(part.startswith("--image") for part in planned.launch(component, run="r", **wildcards)), component
    # allocstack's own components in ``image``: a replica's supervisor and its gate still run beside its image (as
    # the service's do), on the host where its mounts' sources are
    in_image = plan_of(IMAGES.replace("readiness: {mode: started}}", "readiness: {mode: tcp}, replicas: 2}")
                       + "image: allocstack.sif\n", deployment=frozenset({"apptainer"}), **INSTALLED)
    for component in ("service", "service_gate", "replica", "replica_gate"):
        launched = in_image.launch(component, run="r", service="api", replica="2")
        assert not any(part.startswith("--image") for part in launched), component
    assert in_image.use_image  # (else nothing would run in ``image``, and the loop above would pass anyway)
    inputs = parse("validate_inputs.py", planned.args("validate_inputs", run="r"))
    assert {entry["what"]: (entry["image"], entry["command"], entry["port"]) for entry in inputs.program_images_json} == {
        "services.redis": ("images/redis-7.sif", False, True), "services.api": ("images/api.sif", False, False),
        "worker": ("images/app.sif", True, False), "verify": ("images/app.sif", False, False)}
    # per-task workers run allocstack's worker.py IN worker.image
    per_task = plan_of("worker: {image: w.sif}\n", deployment=frozenset({"apptainer"}), **INSTALLED)
    launch = parse("launch.py", [*per_task.launch("worker", run="r", worker="worker-01")[2:], "worker.py"])
    assert launch.image.endswith("w.sif")
    # and a job step of several: its supervisor and relay run in worker.image with its workers
    grouped = plan_of("workers: 40\nworker: {image: w.sif}\n", deployment=frozenset({"apptainer"}), **INSTALLED)
    launch = parse("launch.py", [*grouped.launch("workers", run="r", step="workers-01")[2:], "worker_block.py"])
    assert launch.image.endswith("w.sif")


def test_a_main_program_and_every_program_in_its_image_need_no_image_for_a_check_it_has_not(workdir):
    """A Compose stack imported with --exit-code-from (config ``main``, no check: main's exit code is the verdict),
    each program in its own image: ``image: auto`` resolves to none under --sdm apptainer, nothing asks for
    container/allocstack.sif (the real public stack tests/test_public_stacks.py runs so)."""
    stack = ("tasks: null\nexpected: null\nmain: app\n"
             "worker: {mode: long-running, image: images/app.sif, command: [celery, worker]}\n"
             "services:\n  redis: {image: images/redis-7.sif, port: 6379}\n"
             "  app: {image: images/app.sif, command: [python, -m, pytest], depends_on: [redis]}\n")
    planned = plan_of(stack, deployment=frozenset({"apptainer"}), **INSTALLED)
    assert planned.image is None and not planned.use_image
    inputs = parse("validate_inputs.py", planned.args("validate_inputs", run="r"))
    assert inputs.image is None
    assert {entry["what"]: entry["image"] for entry in inputs.program_images_json} == {
        "services.redis": "images/redis-7.sif", "worker": "images/app.sif", "services.app": "images/app.sif"}
    check = parse("check.py", planned.args("check", run="r"))
    assert check.main_decides and not check.image
    # a check of yours without an image of its own still runs in ``image``: auto is this checkout's
    with_check = plan_of(stack + "verify: {command: [python3, c.py]}\n", deployment=frozenset({"apptainer"}),
                         **INSTALLED)
    assert with_check.image.endswith("container/allocstack.sif")


def test_a_main_program_runs_once_its_end_stops_the_workers_and_the_check_waits_for_it(workdir):
    planned = plan_of(STACKS["your own stack with a main program"][0])
    assert "cache" not in planned.services and planned.main_spec["depends_on"] == ["db", "web"]
    main = parse("main.py", planned.args("main", run=planned.run))
    assert main.name == "cache" and main.command_json == ["python3", "cache.py"] and main.uses == ["db", "web"]
    assert [str(path) for path in main.gate_record] == [planned.layout.service_gate(name) for name in ("db", "web")]
    assert str(main.record) == planned.layout.main_record
    replica = parse("replica.py", planned.args("worker", run=planned.run, worker="worker-01"))
    assert replica.stop_when_main_ends == "cache" and replica.stop_grace == 4
    check = parse("check.py", planned.args("check", run=planned.run))
    assert planned.layout.main_record in map(str, check.wait_for) and not check.main_decides
    alone = plan_of(STACKS["a main program and no check of yours"][0])
    assert parse("check.py", alone.args("check", run=alone.run)).main_decides
    launched = parse("launch.py", [*planned.launch("main", run=planned.run)[2:], "main.py"])
    assert launched.component == "cache"


def test_a_service_with_gpus_gets_them_in_its_job_step_and_its_image(workdir):
    """services.<name>.gpus (Compose's GPU reservation): its job step's --gpus (the rule's gpu resource, summed
    into the allocation by the executor) and, in an Apptainer image, --nv for that program only; a long-running
    worker in its own image with worker.gpus gets --nv the same way. Charliecloud takes no --nv."""
    text = ("tasks: null\nexpected: null\nworker: {mode: long-running, image: w.sif, gpus: 1}\n"
            "verify: {image: w.sif, command: [check]}\n"
            "services:\n  model: {image: m.sif, command: [serve], gpus: 2, readiness: {mode: started}}\n"
            "  web: {image: m.sif, command: [web], depends_on: [model], readiness: {mode: started}}\n")
    planned = plan_of(text, deployment=frozenset({"apptainer"}), environ=IN_STEP, **INSTALLED)
    assert planned.services["model"]["gpus"] == 2 and planned.services["web"]["gpus"] == 0
    model = parse("app_service.py", planned.args("service", run="r", service="model"))
    web = parse("app_service.py", planned.args("service", run="r", service="web"))
    assert "--nv" in model.runtime_arg and "--nv" not in (web.runtime_arg or [])
    assert "--nv" in parse("replica.py", planned.args("worker", run="r", worker="worker-01")).runtime_arg
    step = parse("launch.py", [*planned.launch("service", gpus=planned.services["model"]["gpus"], run="r",
                                               service="model")[2:], "app_service.py"])
    assert "--gpus=2" in step.step_arg
    charliecloud = plan_of(text.replace("image: m.sif", "image: m") + "runtime: charliecloud\n", **INSTALLED)
    assert "--nv" not in (parse("app_service.py", charliecloud.args("service", run="r", service="model")).runtime_arg
                          or [])
    main = plan_of(text + "main: web\n", deployment=frozenset({"apptainer"}), **INSTALLED)
    alone = text.replace("depends_on: [model], ", "") + "main: model\n"  # nothing may wait for main
    assert main.main_gpus == 0 and plan_of(alone, deployment=frozenset({"apptainer"}), **INSTALLED).main_gpus == 2


def test_an_init_job_runs_once_and_its_record_is_the_gate_of_what_waits_for_it(workdir):
    planned = plan_of(STACKS["your own stack with an init job and bounded daemon workers"][0].replace(
        "depends_on: [db, web]", "depends_on: [db, web, migrate]"))
    assert planned.init_jobs == ["migrate"] and "migrate" not in planned.services
    record = planned.layout.init_record("migrate")
    init = parse("main.py", planned.args("init", run=planned.run, service="migrate"))
    assert init.init and init.name == "migrate" and init.uses == ["db"] and str(init.record) == record
    assert [str(path) for path in init.gate_record] == [planned.layout.service_gate("db")]
    assert init.timeout == 3600 and init.stop_grace == 5  # no readiness.timeout of its own: an hour
    cache = parse("app_service.py", planned.args("service", run=planned.run, service="cache"))
    assert cache.uses == ["db", "web"] and record in map(str, cache.gate_record)  # waits for it, has no variables
    replica = parse("replica.py", planned.args("worker", run=planned.run, worker="worker-01"))
    assert record in map(str, replica.gate_record) and "migrate" not in replica.uses
    # in the stack's group its record is a gate, never a Snakemake input (the group's jobs start together)
    assert planned.service_dependencies(planned.run, "cache") == [planned.layout.service_file(name)
                                                                 for name in ("db", "web")]
    assert planned.service_dependencies(planned.run, "migrate") == [planned.layout.service_file("db")]
    assert record in planned.service_gates(planned.run)  # collection waits for it
    launched = parse("launch.py", [*planned.launch("init", run=planned.run, service="migrate")[2:], "main.py"])
    assert launched.component == "migrate"


def test_without_services_an_init_jobs_record_is_a_plain_input_of_the_workers(workdir):
    planned = plan_of(OWN_STACK + "services: {migrate: {command: [python3, migrate.py]}}\ninit_jobs: [migrate]\n"
                      "network: {isolation: none}\n")
    assert not planned.in_group and planned.service_dependencies(planned.run, "migrate") == []
    assert planned.worker_inputs(planned.run) == [planned.layout.init_record("migrate")]


def test_worker_max_lifetime_bounds_the_long_running_workers_and_the_check_names_it(workdir):
    planned = plan_of(STACKS["your own stack with an init job and bounded daemon workers"][0])
    replica = parse("replica.py", planned.args("worker", run=planned.run, worker="worker-01"))
    assert replica.max_lifetime == 30 and replica.stop_grace == 3 and replica.stop_when_main_ends is None
    assert parse("check.py", planned.args("check", run=planned.run)).max_lifetime == 30


def test_a_service_started_edge_waits_for_the_start_alone_and_the_others_for_their_gates(workdir):
    """depends_on {db: service_started}: web waits for db's endpoint file (--started db), not for db's gate record;
    cache (service_healthy) and migrate (an init job) are waited for as the list form waits; main likewise."""
    planned = plan_of(CONDITIONS)
    layout = planned.layout
    web = parse("app_service.py", planned.args("service", run=planned.run, service="web"))
    assert web.started == ["db"] and web.uses == ["db", "cache"]  # db's variables: its endpoint, once it started
    assert [str(path) for path in web.gate_record] == [layout.service_gate("cache"), layout.init_record("migrate")]
    # bounded by db's start (not its gate), cache's start and gate, migrate's start (after db's gate) and run
    assert web.gate_timeout == 30 + max(30, 30 + 50, 30 + 30 + 40 + 3600)
    bare = plan_of(CONDITIONS.replace(" migrate: service_completed_successfully", ""))
    assert parse("app_service.py", bare.args("service", run=bare.run, service="web")).gate_timeout == 30 + 30 + 50
    producer = parse("main.py", planned.args("main", run=planned.run))
    assert producer.started == ["db", "web"] and producer.gate_record == [] and producer.uses == ["db", "web"]
    migrate = parse("main.py", planned.args("init", run=planned.run, service="migrate"))
    assert migrate.started == [] and [str(path) for path in migrate.gate_record] == [layout.service_gate("db")]
    # the list form is unchanged: every edge waits for the gate, and no --started option is given
    listed = plan_of(CONDITIONS.replace("{db: service_started, web: service_started}", "[db, web]"))
    producer = parse("main.py", listed.args("main", run=listed.run))
    assert producer.started == [] and [str(path) for path in producer.gate_record] == [
        layout.service_gate("db"), layout.service_gate("web")]
    assert not any(arg.startswith("--started") for arg in listed.args("main", run=listed.run))
    # the workers still wait for every gate, db's included
    replica = parse("replica.py", planned.args("worker", run=planned.run, worker="worker-01"))
    assert layout.service_gate("db") in map(str, replica.gate_record)


def test_the_workers_wait_for_the_start_of_each_service_no_gate_covers(workdir):
    """A service ready once started that nothing depends on has no gate, but the workers get its variables: they
    wait until it has started (its endpoint file), else they could read its variables before it publishes them."""
    stack = ("workers: 20\nworker: {command: [python3, w.py], per_step: 10}\n"
             "services: {db: {command: [db], port: 5432},"
             " sidecar: {command: [agent], depends_on: [db], readiness: {mode: started}}}\n")
    planned = plan_of(stack)
    assert planned.gated == ["db"] and planned.ungated == ["sidecar"]
    block = parse("worker_block.py", planned.args("workers", run=planned.run, step=planned.step_names[0]))
    assert block.started == ["sidecar"] and [str(path) for path in block.gate_record] == [
        planned.layout.coordinator_gate, planned.layout.service_gate("db")]
    single = plan_of(stack.replace(", per_step: 10", ", per_step: 1"))
    assert parse("worker.py", single.args("worker", run=single.run, worker="worker-01")).started == ["sidecar"]
    daemons = plan_of("tasks: null\nexpected: null\nworker: {mode: long-running, command: [w]}\n"
                      "verify: {command: [c]}\n" + stack.split("\n", 2)[2])
    assert parse("replica.py", daemons.args("worker", run=daemons.run, worker="worker-01")).started == ["sidecar"]
    gated = plan_of(stack.replace("readiness: {mode: started}", "readiness: {mode: tcp}"))
    assert parse("worker_block.py", gated.args("workers", run=gated.run, step=gated.step_names[0])).started == []


def test_each_replica_of_a_service_that_listens_runs_and_is_gated_in_a_network_of_its_own(workdir):
    """Its supervisor and its gate enter that replica's namespace (launch.py --network-space), the supervisor carries
    the front's connections and is given the store's port there; the stack's network makes each namespace and the
    front; the workers wait for every replica's gate."""
    planned = plan_of(LISTENING_REPLICAS, environ=IN_STEP)
    for k in ("2", "3"):
        launched = parse("launch.py", [*planned.launch("replica_gate", run="baseline", service="web", replica=k)[2:], "x"])
        assert (launched.component, launched.network_space) == (f"web-replica-{k}-readiness", f"web-replica-{k}")
        gate = parse("readiness.py", planned.args("replica_gate", run="baseline", service="web", replica=k))
        assert gate.service == f"web-replica-{k}" and str(gate.record).endswith(f"web-replica-{k}-readiness.json")
        replica = parse("app_service.py", planned.args("replica", run="baseline", service="web", replica=k))
        assert replica.own_network and replica.forward == ["store=8100"] and replica.port == 8000
    network = parse("stack_network.py", planned.args("network", run="baseline"))
    assert network.replica_space == ["web", "web-replica-2", "web-replica-3"]
    assert network.front == ["8000=web,web-replica-2,web-replica-3"]
    worker = parse("replica.py", planned.args("worker", run="baseline", worker="worker-01"))
    assert {planned.layout.service_gate(name) for name in ("web", "web-replica-2", "web-replica-3")} <= {
        str(record) for record in worker.gate_record}
    store = parse("launch.py", [*planned.launch("service", run="baseline", service="store")[2:], "x"])
    assert store.network_namespace and store.network_space == ""  # the stack's own


def test_each_replica_of_a_service_is_its_own_supervised_step_told_which_one_it_is(workdir):
    """services.<name>.replicas: 3: the service is replica 1, replicas 2 and 3 are service jobs of their own, each its
    own files (--instance), restart policy and stop request; the workers wait until all have started; collection
    gathers every replica's end record."""
    planned = plan_of(REPLICAS, environ=IN_STEP)
    first = parse("app_service.py", planned.args("service", run="baseline", service="consumer"))
    assert (first.instance, first.replica, first.replicas) == (None, 1, 3)
    for k in (2, 3):
        args = planned.args("replica", run="baseline", service="consumer", replica=str(k))
        parsed = parse("app_service.py", args)
        assert (parsed.name, parsed.instance, parsed.replica, parsed.replicas) == ("consumer", f"consumer-replica-{k}",
                                                                                   k, 3)
        assert str(parsed.service_file) == planned.layout.replica_file("consumer", k)
        assert parsed.restart == first.restart and parsed.stop_grace == 4.0
        assert parsed.gate_record == first.gate_record  # it waits for db's gate as the service does
        launched = parse("launch.py", [*planned.launch("replica", run="baseline", service="consumer", replica=str(k))[2:], "x"])
        assert launched.component == f"consumer-replica-{k}" and launched.stop_request == 4 + 10
    assert planned.layout.replica_file("consumer", 3) in planned.worker_inputs("baseline")
    assert planned.layout.replica_file("consumer", 2) in planned.check_inputs("baseline")
    worker = parse("replica.py", planned.args("worker", run="baseline", worker="worker-01"))
    assert worker.started == ["consumer", "consumer-replica-2", "consumer-replica-3"]
    collect = parse("collect.py", planned.args("collect", run="baseline"))
    assert collect.service == ["db", "consumer", "consumer-replica-2", "consumer-replica-3"]
    assert {"consumer-replica-2", "consumer-replica-3"} <= set(collect.component)
    one = parse("app_service.py", planned.args("service", run="baseline", service="db"))
    assert (one.replica, one.replicas) == (1, 1)  # a service of one: no option, told 1 of 1
    assert planned.shape.cpus == 1 + 3 + 2  # db, three replicas, two workers
