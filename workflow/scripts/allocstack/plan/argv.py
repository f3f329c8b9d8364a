"""Every component's command line, as an argv list: what the rules run, and what the argv contract test parses.

A rule's shell is ``{launch} SCRIPT {args}``: :func:`launch` is ``launch.py``'s part (how and where
the component starts: job step, node, image, scratch) and :func:`args` the script's own options,
including the paths the rule declares (the same :class:`~allocstack.plan.layout.Layout`). Both
are keyed by the component (:func:`launched`, :data:`ARGS`) and the rule's wildcards. Options are
spelled ``--option=value``, so a value that starts with ``-`` stays a value; each list is fed to
its script's ``parse_args`` in ``tests/unit/test_argv_contract.py``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..common import names
from ..launch import stacknet
from ..launch.restart import RestartPolicy
from . import connections, decisions, placement, programs, timeouts

if TYPE_CHECKING:
    from .stack import Plan


def options(*pairs: tuple[str, Any], flags: tuple[str, ...] = ()) -> list[str]:
    """``--option=value`` for each pair (JSON for a list or a mapping), then the bare ``flags``."""
    return [f"{option}={json.dumps(value) if isinstance(value, (list, dict)) else value}"
            for option, value in pairs] + list(flags)


def each(option: str, values: Any) -> list[tuple[str, Any]]:
    """``(option, value)`` for each of ``values`` (a repeatable option)."""
    return [(option, value) for value in values]


# -- launch.py -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Launched:
    """How launch.py starts a component.

    :param name: the component's (and its job step's) name.
    :param node: the allocation's node it runs on (0 = the first: where the group job, the
        coordinator, the gates and your services run).
    :param tolerate_kill: the records a component killed from outside writes (each worker's of a job step that
        runs several), and the job succeeds.
    :param one_shot: a component that runs once and needs no supervision (verification) is started as
        a plain process where launch.py would add nothing: no job step, no image, no scratch.
    :param binds: more host paths it needs in the image (a step's workers' own logs).
    :param stop_request: a service: in a job step on the launcher's node it is asked to stop through a file, and its
        step signalled only if it still runs this many seconds later (workflow/scripts/launch.py).
    """

    name: str
    cpus: int = 1
    scratch: bool = True
    tolerate_kill: tuple[str, ...] = ()
    job_end_time: bool = False
    node: int = 0
    one_shot: bool = False
    binds: tuple[str, ...] = ()
    stop_request: float | None = None


#: Seconds a service's step may take beyond its stop_grace_period (its supervisor kills your program then) before
#: launch.py signals the step itself.
STOP_REQUEST_MARGIN = 10


def launched(plan: Plan, component: str, run: str, worker: str = "", service: str = "", node: str = "",
             step: str = "", replica: str = "") -> Launched:
    """How ``component`` (a key of :data:`ARGS`) with these wildcards is launched."""
    config, files = plan.config, plan.files(run)
    match component:
        case "coordinator":
            return Launched("coordinator", config["coordinator"]["cpus"],
                            job_end_time=config["coordinator"]["stop_claims_before_end"])
        case "readiness" | "check":
            return Launched(component)
        case "node_gate":
            # A node lost before its gate passed: recorded (not "ready"), its workers never start.
            return Launched(f"gate-node-{node}", node=int(node) - 1, tolerate_kill=(files.node_gate(node),))
        case "service":
            spec = config["services"][service]
            return Launched(service, spec["cpus"], stop_request=spec["stop_grace_period"] + STOP_REQUEST_MARGIN)
        case "replica":  # a further replica of a service (2..): stopped as the service is
            spec = config["services"][service]
            return Launched(placement.replica_name(service, replica), spec["cpus"],
                            stop_request=spec["stop_grace_period"] + STOP_REQUEST_MARGIN)
        case "init":
            return Launched(service, config["services"][service]["cpus"])
        case "service_gate":
            return Launched(f"{service}-readiness")
        case "replica_gate":  # a further replica's gate (in its network of its own, where it has one)
            return Launched(f"{placement.replica_name(service, replica)}-readiness")
        case "instance":  # a global service's instance on node ``node`` (1-based, above 1)
            return Launched(placement.instance_name(service, node), config["services"][service]["cpus"],
                            node=int(node) - 1)
        case "instance_gate":  # its gate, on its node (it probes that node's loopback)
            return Launched(f"{placement.instance_name(service, node)}-readiness", node=int(node) - 1)
        case "serve":
            return Launched("serve", job_end_time=True)  # scancel or the time limit: told apart by the end
        case "worker":
            # A per-task worker killed from outside is tolerated (its tasks go back to the queue); a
            # long-running one is not: the run fails.
            return Launched(worker, config["worker"]["cpus"], node=plan.worker_node(worker),
                            tolerate_kill=() if plan.long_running else (files.worker_record(worker),))
        case "main":
            return Launched(plan.main or "main", (plan.main_spec or {}).get("cpus", 1))
        case "workers":
            # A job step of several workers: killed from outside, or its node lost, each of its workers without a
            # record of its own is recorded killed (their leases expire, the other steps finish their tasks).
            block = plan.step(step)
            return Launched(step, config["worker"]["cpus"] * block.count, node=block.node,
                            tolerate_kill=tuple(files.worker_record(worker, step) for worker in block.workers),
                            binds=(files.step_logs,))
        case "verify":
            return Launched("verify", scratch=plan.volumes_after_collect, one_shot=True)
        case "network":  # the stack's private network on its node (config network.isolation: private)
            index = int(node or 1)
            return Launched(stacknet.HOLDER if index == 1 else f"{stacknet.HOLDER}-node-{index}", node=index - 1)
    raise KeyError(component)


def launch(plan: Plan, component: str, run: str, gpus: int = 0, **wildcards: str) -> list[str]:
    """The command that starts ``component`` (see workflow/scripts/launch.py), ending in ``--``;
    a one-shot component outside what launch.py adds: the interpreter alone.

    :param gpus: the job's ``gpu`` resource (config worker.gpus, services.<name>.gpus): its job step's
        ``--gpus``; ``--nv`` where the component itself runs in an Apptainer image (a program of yours in
        its own image gets it from :func:`programs.options`).
    """
    config = plan.config
    how = launched(plan, component, run, **wildcards)
    in_step = config["slurm"]["job_steps"] and plan.facts.job_id
    # A supervisor of a program of yours in an image runs beside it on the node, not in ``image``;
    # per-task workers run in worker.image when it is set.
    own = programs.own_image(plan, component)
    # The stack's private network is made on the host, where pasta is, around whatever runs in images.
    in_image = ((plan.use_image or bool(own)) and plan.images_on and component != "network"
                and not programs.beside(plan, component, wildcards.get("service", "")))
    if how.one_shot and not (how.scratch or in_image or in_step):
        return [plan.python]
    # Absolute, like the component's own path when launch.py starts it as a child: a component that runs
    # in launch.py's process (outside an allocation, no image) is still found by its path.
    argv = [plan.python, plan.facts.absolute(plan.script("launch.py")),
            *options(("--component", how.name), ("--run", run), ("--scratch-root", config["scratch"] or ""),
                     ("--cpus", how.cpus), ("--run-state", plan.files(run).state),
                     ("--marker", plan.files(run).marker))]
    argv += ["--no-scratch"] if not how.scratch else options(*each("--volume", config["volumes"]),
                                                              *each("--keep-volume", config["keep_volumes"]))
    if how.scratch:
        argv += options(*each("--hosts-name", hosts_names(plan)))
        # verify runs after the stack (and its network) ended: on the node's own network, reading files only.
        if plan.private_network and component not in ("network", "verify"):
            argv.append("--network-namespace")
            argv += options(*each("--network-space", [space] if (space := network_space(plan, component, wildcards))
                                  else []))
    if how.job_end_time:
        argv.append("--job-end-time")
    argv += options(*each("--tolerate-kill", how.tolerate_kill))
    if how.node > 0:
        argv += options(("--node-index", how.node))
    if config["slurm"]["job_steps"]:
        argv.append("--job-steps")
        if how.stop_request is not None:
            argv += options(("--stop-request", how.stop_request))
        argv += options(*each("--step-arg", config["slurm"]["step_args"]))
        if gpus:
            argv += options(("--step-arg", f"--gpus={gpus}"))
    if in_image:
        runtime = config["runtime"]
        runtime_args = config[runtime]["args"]
        argv += options(("--image", plan.facts.absolute(own or config["image"])), ("--runtime", runtime),
                        *each("--runtime-arg", runtime_args))
        if gpus > 0 and runtime == "apptainer" and "--nv" not in runtime_args:
            # GPUs requested: expose the driver (Charliecloud: ch-fromhost --nvidia put it into the
            # image once, see container/README.md)
            argv += options(("--runtime-arg", "--nv"))
        argv += options(("--runtime-hint", config[runtime]["hint"]),
                        *each("--bind", [*bind_paths(plan, run), *how.binds]),
                        *each("--pass-env", programs.env_references(config["worker"])))
    return [*argv, "--"]


def network_space(plan: Plan, component: str, wildcards: dict[str, str]) -> str:
    """The network of its own a replica of a service that listens runs in, and its gate (:attr:`Plan.fronted`),
    by the replica's name; "" for the stack's."""
    service = wildcards.get("service", "")
    if service not in plan.fronted or component not in ("service", "service_gate", "replica", "replica_gate"):
        return ""
    return placement.replica_name(service, wildcards["replica"]) if component.startswith("replica") else service


def hosts_names(plan: Plan) -> list[str]:
    """The stack's services with their other names, for its hosts file (allocstack/launch/hostsfile.py):
    ``SERVICE=NAME,...`` each."""
    return [f"{name}={','.join(spec.get('hostnames') or [])}" for name, spec in plan.services.items()]


def bind_paths(plan: Plan, run: str) -> list[str]:
    """Host paths a containerised component needs (bound at the same place)."""
    config, files = plan.config, plan.files(run)
    inputs = [os.path.dirname(plan.facts.absolute(path)) for path in (config["tasks"], config["expected"]) if path]
    return [*config[config["runtime"]]["binds"], files.results, files.state, *inputs]


# -- the scripts' own options -----------------------------------------------------------------------

def validate_inputs(plan: Plan, run: str) -> list[str]:
    """validate_inputs.py: the inputs (and the image's digest), then the decision record."""
    config, files = plan.config, plan.files(run)
    handler = "long-running" if plan.long_running else ("command" if config["worker"]["command"] else "baseline")
    pairs = []
    if plan.builtin_coordinator:
        pairs += [("--tasks", config["tasks"]), ("--compact-tasks", files.compact_tasks)]
    if config["expected"]:
        pairs.append(("--expected", config["expected"]))
    pairs += [("--workers", config["workers"]), ("--handler", handler)]
    if config["worker"]["command"]:
        pairs.append(("--command-json", config["worker"]["command"]))
    pairs += [("--environment-json", config["worker"]["environment"]), *each("--program-file", plan.program_files())]
    if plan.use_image:
        pairs.append(("--image", plan.image))
    # the runtime also reads the images of your programs (programImages: their sidecars, own commands, EXPOSE)
    pairs.append(("--runtime", config["runtime"]))
    runtime = config["runtime"] if plan.use_image else None
    pairs += [("--output", files.inputs_summary), ("--run", run), ("--decisions-json", config["decisions"]),
              ("--facts-json", decisions.facts(config, files, plan.order, plan.image, runtime,
                                              bool(plan.facts.job_id) or plan.facts.submits_to_slurm,
                                              plan.image_written)),
              ("--program-images-json", programs.image_checks(plan)),
              ("--decision-record", files.decision_record)]
    return options(*pairs)


def network(plan: Plan, published: str) -> list[str]:
    """coordinator.py / app_service.py: with more than one node, also listen on the network address
    (config network.*) and publish that endpoint for the other nodes at ``published``."""
    if plan.nodes == 1:
        return []
    interface = plan.config["network"]["interface"]
    return options(("--network-endpoint-file", published), *([("--interface", interface)] if interface else []),
                   flags=() if plan.config["network"]["tls"] else ("--no-tls",))


def coordinator(plan: Plan, run: str) -> list[str]:
    """coordinator.py: the built-in coordinator, a service of the stack's group."""
    config, files = plan.config, plan.files(run)
    coordinator = config["coordinator"]
    stop_claims = () if coordinator["stop_claims_before_end"] else (("--stop-claims-at", 0),)
    return [*options(("--input", config["tasks"]), ("--results", files.coordinator_results),
                     ("--end-record", files.coordinator_end), ("--inputs-summary", files.inputs_summary),
                     ("--compact-tasks", files.compact_tasks), ("--service-file", files.coordinator_service),
                     ("--journal", files.journal), ("--workers", config["workers"]),
                     ("--max-attempts", coordinator["max_attempts"]), ("--lease-seconds", coordinator["lease_seconds"]),
                     ("--idle-timeout", coordinator["idle_timeout"]), ("--lifetime", coordinator["lifetime"]),
                     ("--max-connections", plan.coordinator_connections), *stop_claims),
            *network(plan, files.shared_endpoint)]


def readiness(plan: Plan, run: str) -> list[str]:
    """readiness.py: the coordinator's gate (its /health reports the task count)."""
    config, files = plan.config, plan.files(run)
    return options(("--inputs-summary", files.inputs_summary), ("--timeout", config["readiness"]["timeout"]),
                   ("--interval", config["readiness"]["interval"]), ("--record", files.coordinator_gate),
                   ("--coordinator-record", files.coordinator_end))


def node_gate(plan: Plan, run: str, node: str) -> list[str]:
    """readiness.py: node ``node``'s gate (1-based, above 1): the coordinator is reachable from there."""
    config, files = plan.config, plan.files(run)
    return options(("--inputs-summary", files.inputs_summary), ("--endpoint-file", files.shared_endpoint),
                   ("--events", files.shared_events(f"gate-node-{node}")),
                   ("--timeout", config["readiness"]["timeout"]), ("--interval", config["readiness"]["interval"]),
                   ("--record", files.node_gate(node)), ("--coordinator-record", files.coordinator_end),
                   flags=("--off-node",))


def waits(plan: Plan, run: str, spec: dict[str, Any]) -> list[tuple[str, Any]]:
    """app_service.py, main.py: what a program of yours waits for before it starts (its ``depends_on``): the services
    whose variables it gets, the gate records of the edges that wait for a gate, and the services it waits for only
    until they have started (``service_started``: their endpoint files)."""
    return [*each("--uses", plan.uses(spec["depends_on"])), *each("--gate-record", plan.gates(run, spec["depends_on"])),
            *each("--started", plan.started(spec["depends_on"]))]


def service(plan: Plan, run: str, service: str, node: str = "", replica: str = "") -> list[str]:
    """app_service.py: services.<service>, started once its dependencies' gates passed (``node``: a global service's
    instance on that node, 1-based above 1: its own files, and no relay: each node's programs use their own;
    ``replica``: its further replica, 2.., its own files too, and no relay: it listens for nobody)."""
    spec, files = plan.services[service], plan.files(run)
    from_image = spec["port"] == "image"  # the port its image EXPOSEs, read when it starts
    port = [] if from_image else [("--port", spec["port"] or 0)]
    if node:
        own = [("--service-file", files.instance_file(service, node)), ("--instance", placement.instance_name(service, node))]
    elif replica:
        own = [("--service-file", files.replica_file(service, replica)),
               ("--instance", placement.replica_name(service, replica))]
    else:
        own = [("--service-file", files.service_file(service))]
    if spec["replicas"] > 1:  # $ALLOCSTACK_REPLICA, $ALLOCSTACK_REPLICAS
        own += [("--replica", replica or 1), ("--replicas", spec["replicas"])]
    relayed = service in plan.relayed_services and not replica and service not in plan.fronted  # (its front is)
    relay = network(plan, files.shared_service_endpoint(service)) if relayed else []
    if service in plan.fronted:  # each replica in a network of its own, the stack's services put there
        own += [*each("--forward", forwards(plan, service))]
    return [*options(*own, ("--name", service),
                     *programs.options(plan, spec), ("--environment-json", spec["environment"]),
                     *port, ("--gate-timeout", timeouts.start_bound(plan.config, service)),
                     ("--stop-grace", spec["stop_grace_period"]), *restart(spec),
                     *waits(plan, run, spec),
                     flags=(*(("--port-from-image",) if from_image else ()),
                            *(("--own-network",) if service in plan.fronted else ()))),
            *relay]


def forwards(plan: Plan, service: str) -> list[str]:
    """app_service.py --forward: the stack's services a replica of ``service`` in a network of its own may use, on
    their ports there: every other one with a port written (``NAME=PORT``), and those it depends on whose port is
    chosen when they start (``NAME``: read from their endpoints, which exist by then)."""
    fixed = {name: spec["port"] for name, spec in plan.services.items()
             if name != service and isinstance(spec["port"], int)}
    chosen = [name for name in plan.uses(plan.services[service]["depends_on"]) if name not in fixed]
    return [*(f"{name}={port}" for name, port in fixed.items()), *chosen]


service_args = service  # (the wildcard ``service`` hides the function in :func:`instance`)


def instance(plan: Plan, run: str, service: str, node: str) -> list[str]:
    """app_service.py: global service ``service``'s instance on node ``node`` (1-based, above 1)."""
    return service_args(plan, run, service, node)


def instance_gate(plan: Plan, run: str, service: str, node: str) -> list[str]:
    """readiness.py: the gate of global service ``service``'s instance on node ``node``, run on that node."""
    return service_gate(plan, run, service, node)


def replica(plan: Plan, run: str, service: str, replica: str) -> list[str]:
    """app_service.py: replica ``replica`` (2..) of services.<service>, supervised as the service is."""
    return service_args(plan, run, service, replica=replica)


def replica_gate(plan: Plan, run: str, service: str, replica: str) -> list[str]:
    """readiness.py: the gate of replica ``replica`` (2..) of services.<service>, as the service's own."""
    return service_gate(plan, run, service, instance=placement.replica_name(service, replica))


def service_gate(plan: Plan, run: str, service: str, node: str = "", instance: str = "") -> list[str]:
    """readiness.py: the gate of services.<service> (its readiness; ``node``: of its instance there; ``instance``:
    of that further replica)."""
    spec, files = plan.services[service], plan.files(run)
    ready = spec["readiness"]
    instance = instance or (placement.instance_name(service, node) if node else service)
    pairs = [("--service", instance), ("--mode", ready["mode"]),
             ("--timeout", timeouts.gate_timeout(plan.config, service)),
             ("--interval", timeouts.gate_interval(plan.config, service)), ("--probe-timeout", ready["probe_timeout"]),
             ("--start-timeout", timeouts.start_bound(plan.config, service)),
             *each("--uses", plan.uses(spec["depends_on"]))]
    if ready["mode"] == "http":
        pairs += [("--path", ready["path"]), ("--expect-json", ready["expect"])]
    if ready["mode"] == "command":
        pairs.append(("--ready-command-json", ready["command"]))
        # in the service's image, as Compose runs a healthcheck in the service's container
        pairs += [pair for pair in programs.options(plan, spec, with_command=False) if pair[0] != "--entrypoint-json"]
    record = files.instance_gate(service, node) if node else files.service_gate(instance)
    return options(*pairs, ("--record", record))


def worker(plan: Plan, run: str, worker: str) -> list[str]:
    """worker.py (per-task) or replica.py (long-running): a worker of its own job step, once every gate passed."""
    config, files = plan.config, plan.files(run)
    pairs = [("--worker-id", worker), *each("--gate-record", gate_records(plan, run, plan.worker_node(worker))),
             *each("--started", started_waits(plan, plan.worker_node(worker))),
             ("--gate-timeout", timeouts.gates_timeout(config)), ("--record", files.worker_record(worker))]
    flags: tuple[str, ...] = ()
    if plan.long_running:
        pairs += [("--index", placement.worker_index(worker)), ("--workers", config["workers"]), *program(plan)]
        if plan.main:  # its end ends the stack: the workers are stopped then
            pairs += [("--stop-when-main-ends", plan.main)]
        if config["worker"]["max_lifetime"]:  # or once it ran that long
            pairs += [("--max-lifetime", config["worker"]["max_lifetime"])]
        if plan.main or config["worker"]["max_lifetime"]:
            pairs += [("--stop-grace", config["worker"]["stop_grace_period"])]
        pairs += restart(config["worker"])
        flags = ("--uses-coordinator",) if plan.builtin_coordinator else ()
    else:
        pairs += per_task(plan)
    return [*options(*pairs, flags=flags), *worker_network(plan, run, worker)]


def restart(spec: dict[str, Any]) -> list[tuple[str, Any]]:
    """app_service.py / replica.py: the program's restart policy (none: no option)."""
    return RestartPolicy.from_config(spec["restart"]).options()


def main(plan: Plan, run: str) -> list[str]:
    """main.py: config ``main``, once its dependencies' gates passed, beside the workers; its end ends the stack."""
    spec, files = plan.main_spec or {}, plan.files(run)
    return options(("--name", plan.main), *programs.options(plan, spec), ("--environment-json", spec["environment"]),
                   *waits(plan, run, spec),
                   ("--gate-timeout", timeouts.gates_timeout(plan.config)), ("--record", files.main_record))


def init(plan: Plan, run: str, service: str) -> list[str]:
    """main.py --init: init job ``service`` (config init_jobs), once its dependencies' gates passed, before what
    depends on it; bounded by its readiness.timeout (else the stack's)."""
    spec, files = plan.config["services"][service], plan.files(run)
    return options(("--name", service), *programs.options(plan, spec), ("--environment-json", spec["environment"]),
                   *waits(plan, run, spec),
                   ("--gate-timeout", timeouts.start_bound(plan.config, service)),
                   ("--timeout", timeouts.gate_timeout(plan.config, service)),
                   ("--stop-grace", spec["stop_grace_period"]), ("--record", files.init_record(service)),
                   flags=("--init",))


def program(plan: Plan) -> list[tuple[str, Any]]:
    """A worker's own program (config worker.command, environment; a long-running one's image, mounts, working
    directory and entrypoint) and the services it uses."""
    spec = plan.config["worker"]
    pairs = [("--environment-json", spec["environment"]), *each("--uses", plan.services)]
    if plan.long_running:
        pairs += programs.options(plan, spec)
    elif spec["command"]:
        pairs.append(("--command-json", spec["command"]))
    return pairs


def per_task(plan: Plan) -> list[tuple[str, Any]]:
    """worker.py's options every per-task worker shares: the protocol's bounds, then its program."""
    config = plan.config
    spec = config["worker"]
    return [("--batch", spec["batch"]), ("--wait-timeout", spec["wait_timeout"]),
            ("--connect-timeout", spec["connect_timeout"]), ("--lease-seconds", config["coordinator"]["lease_seconds"]),
            ("--simulate-seconds", config["simulate"]["task_seconds"]), ("--task-timeout", spec["task_timeout"]),
            *program(plan)]


def workers(plan: Plan, run: str, step: str) -> list[str]:
    """worker_block.py: a job step of several per-task workers on one node, once every gate passed; each worker
    gets worker.py's shared options (``--worker-arg``) and its own id, record, log and event log."""
    config, files = plan.config, plan.files(run)
    block = plan.step(step)
    pairs: list[tuple[str, Any]] = [
        ("--step", step), *each("--worker", block.workers), ("--records", files.step_records(step)),
        ("--log-dir", files.step_logs), ("--connections", connections.PER_STEP),
        *each("--gate-record", gate_records(plan, run, block.node)), *each("--started", started_waits(plan, block.node)),
        ("--gate-timeout", timeouts.gates_timeout(config)),
        ("--connect-timeout", config["worker"]["connect_timeout"])]
    worker_args = options(*per_task(plan))
    if plan.nodes > 1:
        pairs.append(("--shared-dir", files.state))
        if block.node > 0:
            pairs.append(("--endpoint-file", files.shared_endpoint))
            if plan.services:
                worker_args += options(("--remote-services", files.shared_services), *local_services(plan, block.node))
    return options(*pairs, *each("--worker-arg", worker_args))


def gate_records(plan: Plan, run: str, node: int) -> list[str]:
    """The gate records the workers on ``node`` wait for: the coordinator's, every service's, and off the first
    node its node's (the coordinator is reachable from there)."""
    files = plan.files(run)
    records = [files.coordinator_gate] if plan.builtin_coordinator else []
    records += [files.instance_gate(name, node + 1) if node > 0 and name in plan.global_services
                else files.service_gate(name) for name in plan.gated] + plan.init_records(run)
    records += [files.service_gate(name) for name in plan.gated_replicas]
    if node > 0:
        records.append(files.node_gate(node + 1))
    return records


def started_waits(plan: Plan, node: int) -> list[str]:
    """The services the workers on the first node (``node`` 0) wait for only until they have started: those with no
    gate, whose variables they get too, and every further replica (their endpoint files are in that node's
    scratch)."""
    return [*plan.ungated, *plan.replicated] if node == 0 else []


def worker_network(plan: Plan, run: str, worker: str) -> list[str]:
    """With more than one node: the worker's event log in the shared directory, and off the first node
    the endpoints published for the other nodes (the coordinator's, your services')."""
    if plan.nodes == 1:
        return []
    files = plan.files(run)
    pairs = [("--events", files.shared_events(worker))]
    if plan.worker_node(worker) > 0:
        pairs.append(("--endpoint-file", files.shared_endpoint))
        # A long-running worker may use the coordinator through a tunnel too.
        if plan.services or plan.long_running:
            pairs.append(("--remote-services", files.shared_services))
        pairs += local_services(plan, plan.worker_node(worker))
    return options(*pairs)


def local_services(plan: Plan, node: int) -> list[tuple[str, Any]]:
    """Off the first node: each global service's variables from its instance on ``node`` (0-based), not the tunnel."""
    if node == 0:
        return []
    return [("--local-service", f"{name}={placement.instance_name(name, node + 1)}") for name in plan.global_services]


def check(plan: Plan, run: str) -> list[str]:
    """check.py: your check (verify.command) of your own stack, once every worker ended."""
    spec, files = plan.config["verify"], plan.files(run)
    return options(*programs.options(plan, spec), ("--environment-json", spec["environment"]),
                   *each("--uses", plan.services), *each("--wait-for", plan.worker_record_files(run)),
                   *each("--wait-for", plan.main_records(run)), ("--record", files.check_record),
                   *([("--max-lifetime", lifetime)] if (lifetime := plan.config["worker"]["max_lifetime"]) else []),
                   flags=("--main-decides",) if plan.main and not programs.check_command_set(plan.config,
                                                                                         plan.images_on) else ())


def stack_network(plan: Plan, run: str, node: str = "") -> list[str]:
    """stack_network.py: the stack's private network on its node (config ``network.isolation: private``; ``node``:
    1-based, above 1 for another node's), pasta where the plan found it; on the first node the ports it publishes to
    their owner as sockets (the built-in coordinator's status page and each of your services; not an init job: it
    ends before the others start) and, with more than one node, the listeners the other nodes use (forwarded in)."""
    interface = plan.config["network"]["interface"]
    where = [("--pasta", plan.facts.which("pasta") or "pasta"), *([("--interface", interface)] if interface else [])]
    if node and int(node) > 1:
        forwards = [("--published", plan.files(run).shared_services), *each("--forward", plan.relayed_services)]
        return options(*where, *(forwards if plan.relayed_services else []))
    coordinator = [names.COORDINATOR_PORT] if plan.builtin_coordinator else []
    published = coordinator + [name for name in plan.services if name not in plan.init_jobs]
    inbound = [] if plan.nodes == 1 else coordinator + plan.relayed_services
    fronts = [f"{port}={','.join(plan.instances(name))}" for name, port in plan.fronted.items()]
    # the other nodes reach such a front through a relay port_sockets.py makes, as a service's supervisor relays it
    relays = [] if plan.nodes == 1 else [f"{name}={plan.files(run).shared_service_endpoint(name)}"
                                         for name in plan.fronted]
    return options(*where, *each("--publish", published), *each("--inbound", inbound),
                   *each("--replica-space", plan.replica_spaces), *each("--front", fronts), *each("--relay", relays),
                   flags=("--no-tls",) if relays and not plan.config["network"]["tls"] else ())


def serve(plan: Plan, run: str) -> list[str]:
    """serve.py: a serving stack (config ``mode: serve``): up once every gate passed, until it is ended."""
    files = plan.files(run)
    gates = plan.service_gates(run)
    return options(*each("--gate-record", gates), ("--gate-timeout", timeouts.gates_timeout(plan.config)),
                   *each("--uses", plan.reachable), *each("--main-record", plan.main_records(run)),
                   ("--up-record", files.up_record), ("--record", files.served_record), ("--marker", files.marker),
                   ("--run", run))


def collect(plan: Plan, run: str) -> list[str]:
    """collect.py: the event logs merged, the timeline drawn, how every component ran and ended."""
    config, files = plan.config, plan.files(run)
    components = [*plan.init_jobs, *plan.services, *plan.replicated, *([plan.main] if plan.main else []), *(plan.workers if plan.long_running else []),
                  *(["check"] if plan.runs_check else []), *(["serve"] if plan.serving else [])]
    return options(("--scratch-root", config["scratch"] or ""), ("--run", run),
                   ("--inputs-summary", files.inputs_summary), ("--shared-dir", files.state),
                   ("--events-out", files.events), ("--provenance-out", files.provenance),
                   ("--stack-job", files.stack_job), ("--services-out", files.services_record),
                   ("--timeline-out", files.timeline),
                   ("--decision-record", files.decision_record),
                   *each("--service", [*plan.services, *plan.replicated]), *each("--component", components),
                   ("--stop-timeout", timeouts.stop_timeout(config)),
                   flags=("--keep-scratch",) if plan.volumes_after_collect else ())


def verify(plan: Plan, run: str) -> list[str]:
    """verify.py: the coordinator's results (with a task document), or your check's record; the gate
    order in the event log when there is a gate (a stack of workers and a check alone has none)."""
    config, files = plan.config, plan.files(run)
    pairs: list[tuple[str, Any]] = [("--services-record", files.services_record)]
    if (plan.builtin_coordinator or plan.gated) and not plan.serving:  # a serving stack has no worker to order
        pairs.append(("--events", files.events))
    if plan.builtin_coordinator:
        pairs += [("--input", config["tasks"]), ("--results", files.coordinator_results),
                  ("--end-record", files.coordinator_end), ("--inputs-summary", files.inputs_summary),
                  ("--environment-json", config["verify"]["environment"])]
        if config["expected"]:
            pairs.append(("--expected", config["expected"]))
        if config["verify"]["command"]:
            pairs += programs.options(plan, config["verify"])
    elif plan.serving:
        pairs += [("--served-record", files.served_record), ("--serve-verified", files.serve_verified)]
    else:
        pairs.append(("--check-record", files.check_record))
    pairs += [("--output", files.marker), ("--retire-journal", files.journal)]
    return options(*pairs, flags=("--remove-scratch",) if plan.volumes_after_collect else ())


#: Each component's script, and the function of its options (its wildcards besides ``run`` as keywords).
ARGS: dict[str, tuple[str, Callable[..., list[str]]]] = {
    "validate_inputs": ("validate_inputs.py", validate_inputs),
    "coordinator": ("coordinator.py", coordinator),
    "readiness": ("readiness.py", readiness),
    "node_gate": ("readiness.py", node_gate),
    "service": ("app_service.py", service),
    "service_gate": ("readiness.py", service_gate),
    "instance": ("app_service.py", instance),
    "replica": ("app_service.py", replica),
    "instance_gate": ("readiness.py", instance_gate),
    "replica_gate": ("readiness.py", replica_gate),
    "serve": ("serve.py", serve),
    "network": ("stack_network.py", stack_network),
    "worker": ("worker.py", worker),  # replica.py for long-running workers: see :func:`script_of`
    "main": ("main.py", main),
    "init": ("main.py", init),
    "workers": ("worker_block.py", workers),
    "check": ("check.py", check),
    "collect": ("collect.py", collect),
    "verify": ("verify.py", verify),
}


def script_of(plan: Plan, component: str) -> str:
    """The script (in workflow/scripts) that runs ``component``."""
    if component == "worker" and plan.long_running:
        return "replica.py"
    return ARGS[component][0]


def args(plan: Plan, component: str, run: str, **wildcards: str) -> list[str]:
    """The options of ``component``'s script for the run ``run`` and the rule's other wildcards."""
    return ARGS[component][1](plan, run, **wildcards)


def end_of_run(plan: Plan, outcome: str, since: float, command: str = "") -> list[str]:
    """status.py --end-of-run: the run's verdict, counts and wall time, the last thing on the terminal
    (``command``: the one that resumes an interrupted run)."""
    return [plan.facts.python, plan.script("status.py"),
            *options(("--run", plan.run), ("--end-of-run", outcome), ("--since", since),
                     ("--state-dir", plan.config["state_dir"]),
                     *([("--resume", command)] if command else []))]
