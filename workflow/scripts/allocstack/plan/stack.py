"""The plan of a stack: ``load(config, facts)`` decides everything the rules then only ask.

Loading validates the config against its schema (filling in defaults), migrates the older
``service:`` block, orders your services, and applies every refusal in the order a reader
meets them: the inputs, the stack, the nodes, the CPUs, what Slurm would refuse, the host,
verification, the image's runtime. A refusal is a :class:`~allocstack.plan.refusals.PlanError`;
nothing is asked of the world but through :class:`~allocstack.plan.facts.Facts`.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ..common import identity as identities
from . import argv, connections, decisions, depends, placement, refusals
from .config import migrate_service_block, nulls_from_command_line, schema, validate
from .facts import Facts
from .layout import Layout
from .order import DependencyCycle, UnknownDependency, start_order
from .programs import images_on, parts_of_yours
from .refusals import PlanError
from .shape import Shape, allocation

#: The rules whose forced rerun (``--forcerun``, ``-R``) starts the run over (:meth:`Plan.starts_over`).
START_OVER_RULES = ("validate_inputs", "serve_coordinator")

#: Config ``image: auto`` (the default): the checkout's own image under ``--sdm apptainer``, else none.
AUTO_IMAGE = "auto"
#: The image ``container/build.sh`` makes (README, container/README.md), below the checkout.
DEFAULT_IMAGE = os.path.join("container", "allocstack.sif")


@dataclass(frozen=True)
class Plan:
    """Every decision about one run of the stack (the config complete, the world as ``facts`` says).

    :param config: validated, defaults filled, ``service:`` migrated into ``services``.
    :param facts: the world it was made for.
    :param order: your services in their start order.
    :param shape: the allocation's shape.
    :param use_image: components run in config ``image`` (Charliecloud: whenever it is set;
        Apptainer: with ``--sdm apptainer``; allocstack uses no container directive, so
        ``--sdm apptainer`` itself never needs apptainer). ``image: auto`` is resolved by then
        (:func:`image_in_use`).
    :param main_spec: config ``main``'s service spec: it runs once (``run_main``), not as a service job.
    :param steps: the job steps of several workers (:func:`placement.steps`), in node order; empty when each
        worker is its own step (``per_step`` 1, the seed's shape).
    :param images_on: images are switched on (as for ``use_image``, whether ``image`` is set or not):
        programs of yours run in their own images (allocstack/plan/programs.py).
    :param image_written: config ``image`` as written (``auto``, a path, or None), before it was resolved.
    """

    config: Mapping[str, Any]
    facts: Facts
    order: tuple[str, ...]
    shape: Shape
    use_image: bool
    steps: tuple[placement.Step, ...] = ()
    images_on: bool = False
    #: config ``main``'s program (its service spec, taken out of ``services``), or None.
    main_spec: Mapping[str, Any] | None = None
    image_written: str | None = AUTO_IMAGE
    #: config ``init_jobs`` in their start order (they stay in ``config["services"]``; :attr:`services` leaves them out).
    init_order: tuple[str, ...] = ()

    @property
    def image(self) -> str | None:
        """The image allocstack's own components run in (relative paths as written), None for none."""
        return self.config["image"] if self.use_image else None

    @property
    def run(self) -> str:
        return self.config["run"]

    @property
    def builtin_coordinator(self) -> bool:
        """A task document is set: the built-in coordinator hands it out (else: your own stack)."""
        return bool(self.config["tasks"])

    @property
    def runs_check(self) -> bool:
        """Your own stack (no task document): your check (verify.command) runs while the services are up,
        as Compose runs a check that waits for the workers to complete (not in serve mode: no check)."""
        return not self.builtin_coordinator and not self.serving

    @property
    def serving(self) -> bool:
        """config ``mode: serve``: your services run until the allocation's end, scancel, Ctrl-C or main's end."""
        return self.config["mode"] == "serve"

    @property
    def retries(self) -> int | None:
        """Each rule's ``retries``: None (the profile's) in batch mode; 0 in serve mode, where the end of an
        allocation (scancel, the time limit) ends the serving, and a new allocation must not start it again."""
        return 0 if self.serving else None

    def verdict(self, run: str) -> str:
        """What verification declares it makes: the marker; in serve mode its own record (a serving stack's marker
        is written when it ends, by scancel or the time limit too, and Snakemake removes a failed job's outputs)."""
        files = self.files(run)
        return files.serve_verified if self.serving else files.marker

    def served_records(self, run: str) -> list[str]:
        """serve.py's record of how the stack served and ended (serve mode), for collection and verification."""
        return [self.files(run).served_record] if self.serving else []

    def serve_inputs(self, run: str) -> list[str]:
        """What the serving stack keeps alive while it is up: your services' files (init jobs' records too)."""
        return self.service_files(run) + self.init_inputs(run)

    @property
    def global_services(self) -> list[str]:
        """Your services of ``mode: global`` with more than one node: one instance on each node."""
        if self.nodes == 1:
            return []
        return [name for name, spec in self.services.items() if spec["mode"] == "global"]

    def instance_files(self, run: str) -> list[str]:
        """The service files of the global services' instances off the first node (nodes 2..)."""
        files = self.files(run)
        return [files.instance_file(name, node) for name in self.global_services for node in range(2, self.nodes + 1)]

    def instance_gates(self, run: str) -> list[str]:
        files = self.files(run)
        return [files.instance_gate(name, node) for name in self.global_services for node in range(2, self.nodes + 1)]

    @property
    def main(self) -> str | None:
        """config ``main``: the service whose end ends the stack (Compose ``--exit-code-from``), or None."""
        return self.config["main"]

    @property
    def main_cpus(self) -> int:
        return self.main_spec["cpus"] if self.main_spec else 1

    @property
    def main_gpus(self) -> int:
        """GPUs of the main program's job step (its services.<name>.gpus)."""
        return self.main_spec.get("gpus", 0) if self.main_spec else 0

    def main_records(self, run: str) -> list[str]:
        """The main program's record (it exited 0), when there is one."""
        return [self.files(run).main_record] if self.main else []

    def main_inputs(self, run: str) -> list[str]:
        """What keeps the services alive while the main program runs: your services' files."""
        return self.service_files(run) + self.init_inputs(run)

    @property
    def private_network(self) -> bool:
        """config network.isolation is private: every component runs in the stack's own network namespace."""
        return self.config["network"]["isolation"] == "private"

    @property
    def long_running(self) -> bool:
        return self.config["worker"]["mode"] == "long-running"

    @property
    def services(self) -> Mapping[str, Any]:
        """Your long-running services (not the init jobs, not main): each a service job with its gate."""
        init = set(self.config["init_jobs"])
        return {name: spec for name, spec in self.config["services"].items() if name not in init}

    @property
    def gated(self) -> list[str]:
        """The services with a readiness gate: all but those ready once started (nothing probes them) that nothing
        depends on and that are not global (a Celery or RQ worker as a service: its gate would wait for nothing, as
        Compose waits for nothing; no readiness job step is run for it)."""
        specs = [*self.config["services"].values(), *([self.main_spec] if self.main_spec else [])]
        depended = {name for spec in specs for name in spec.get("depends_on") or []}
        return [name for name, spec in self.services.items()
                if name in depended or name in self.global_services
                or (spec.get("readiness") or {}).get("mode") != "started"]

    @property
    def ungated(self) -> list[str]:
        """The services with no gate (ready once started, and nothing depends on them): the workers, which get their
        variables too, wait only until each has started (its endpoint file), as Compose waits for nothing more."""
        gated = set(self.gated)
        return [name for name in self.services if name not in gated]

    @property
    def reachable(self) -> list[str]:
        """The services a serving stack's UP line shows a way to: all but those that publish nothing (no port, and
        ready once started: a Celery or RQ worker, which listens on nothing)."""
        return [name for name, spec in self.services.items()
                if spec.get("port") is not None or (spec.get("readiness") or {}).get("mode") != "started"]

    @property
    def init_jobs(self) -> list[str]:
        """config ``init_jobs`` in their start order: each runs once (``run_init``) before what depends on it."""
        return list(self.init_order)

    def init_records(self, run: str) -> list[str]:
        """Every init job's record (it exited 0): what its dependents, the workers among them, wait for."""
        return [self.files(run).init_record(name) for name in self.init_jobs]

    def gates(self, run: str, depends_on: Iterable[str] | Mapping[str, str]) -> list[str]:
        """The records waiting for a ``depends_on`` means (its edges that wait for more than the start): a service's
        gate record (every replica's, as Compose waits for each), an init job's record."""
        files = self.files(run)
        return [files.init_record(name) if name in self.init_jobs else files.service_gate(instance)
                for name in depends.gate_waits(depends_on) for instance in self.instances(name)]

    def started(self, depends_on: Iterable[str] | Mapping[str, str]) -> list[str]:
        """The services of a ``depends_on`` waited for only until they have started (``service_started``): each
        replica of one."""
        return [instance for name in depends.start_waits(depends_on) for instance in self.instances(name)]

    def instances(self, name: str) -> list[str]:
        """``name`` and its further replicas (``NAME-replica-2``...) by name; an init job is itself alone."""
        if name not in self.services:
            return [name]
        return [name, *(placement.replica_name(name, k) for k in self.replicas(name)[1:])]

    @property
    def fronted(self) -> dict[str, int]:
        """The services whose replicas each listen in a network of their own (more than one replica, and a port: the
        plan allows them in the stack's private network alone), with that port: one front on it in the stack's
        network carries each connection to the next replica (allocstack/launch/portsockets.py)."""
        return {name: spec["port"] for name, spec in self.services.items()
                if spec["replicas"] > 1 and isinstance(spec["port"], int)}

    @property
    def replica_spaces(self) -> list[str]:
        """Every replica with a network of its own, by name: what the stack's network job makes beside its own."""
        return [instance for name in self.fronted for instance in self.instances(name)]

    @property
    def gated_replicas(self) -> list[str]:
        """The further replicas (2..) of the gated services, by name: each has its own gate (rule await_replica)."""
        return [instance for name in self.gated for instance in self.instances(name)[1:]]

    def uses(self, names: Iterable[str]) -> list[str]:
        """The services among ``names`` (a depends_on) whose variables a program gets (an init job has none)."""
        return [name for name in names if name not in self.init_jobs]

    @property
    def nodes(self) -> int:
        return self.config["nodes"]

    @property
    def workers(self) -> list[str]:
        return placement.worker_ids(self.config["workers"])

    @property
    def grouped(self) -> bool:
        """A job step runs several workers (config ``worker.per_step``, or derived): rule ``run_workers``, one job
        per step; else rule ``run_worker``, one job per worker."""
        return bool(self.steps)

    def step(self, name: str) -> placement.Step:
        """The job step ``name`` (``workers-01``)."""
        return self.steps[placement.step_index(name)]

    @property
    def step_names(self) -> list[str]:
        return [step.name for step in self.steps]

    def step_cpus(self, name: str) -> int:
        """CPUs the job of step ``name`` asks for: its workers' with one node, none with more (the coordinator's
        job carries the CPUs per node)."""
        return self.shape.worker_cpus * self.step(name).count

    @property
    def coordinator_connections(self) -> int:
        """Connections the coordinator takes at once (:mod:`.connections`)."""
        if self.grouped:
            return connections.coordinator_cap(0, len(self.steps))
        return connections.coordinator_cap(self.config["workers"], 0)

    @property
    def python(self) -> str:
        """The interpreter of the rules: under ``--sdm conda`` the rule's environment provides
        ``python``; otherwise the one running Snakemake (the venv from requirements.txt)."""
        return "python" if "conda" in self.facts.deployment else self.facts.python

    @property
    def volumes_after_collect(self) -> bool:
        """verify.command runs after collect_results with the built-in coordinator: then the named
        volumes must outlive collection, and verification removes the scratch."""
        return self.builtin_coordinator and bool(self.config["volumes"]) and bool(self.config["verify"]["command"])

    @property
    def environment(self) -> dict[str, str]:
        """Variables the adapter sets in Snakemake's own environment.

        With more than one node, ``sbatch --no-kill`` for the stack's job (read by sbatch from the
        environment, so a profile's or the command line's default-resources cannot drop it): a node
        that fails mid-run costs only its workers, whose leased tasks go back to the queue; without
        it Slurm would end (and requeue) the whole stack.
        """
        return {"SBATCH_NO_KILL": "set"} if self.nodes > 1 else {}

    @property
    def layout(self) -> Layout:
        """The configured run's files."""
        return self.files(self.run)

    def files(self, run: str) -> Layout:
        """The files of run ``run`` (``"{run}"``: the rules' patterns)."""
        return Layout(run, self.config["state_dir"])

    def script(self, name: str) -> str:
        """A component script in workflow/scripts (relative, as every path of a rule)."""
        return os.path.join(self.facts.scripts, name)

    def script_of(self, component: str) -> str:
        """The script that runs ``component`` (``worker``: worker.py, or replica.py for long-running workers)."""
        return argv.script_of(self, component)

    def worker_node(self, worker: str) -> int:
        """The node (0 = the first) that runs ``worker``."""
        return placement.node_of(placement.worker_index(worker), self.config["workers"], self.nodes)

    def launch(self, component: str, gpus: int | None = 0, **wildcards: str) -> list[str]:
        """launch.py's part of ``component``'s command (``gpus``: its job's ``gpu`` resource)."""
        return argv.launch(self, component, gpus=int(gpus or 0), **wildcards)

    def args(self, component: str, **wildcards: str) -> list[str]:
        """The options of ``component``'s script, for the rule's ``wildcards`` (``run`` and its own)."""
        return argv.args(self, component, **wildcards)

    def starts_over(self, forcerun: Iterable[str], forceall: bool) -> bool:
        """A forced rerun of what makes the results (``--forcerun serve_coordinator``, or validate_inputs, also as a
        module's ``PREFIX_serve_coordinator``; ``--forceall``) is a clean start: a fresh journal, every task computed."""
        return self.builtin_coordinator and (forceall or any(rule.endswith(START_OVER_RULES) for rule in forcerun))

    def started_over(self, aside: str | os.PathLike[str]) -> str:
        """The one line that says a run starts over and where its earlier journal is kept."""
        return (f"allocstack: run {self.run} starts over (a forced rerun): every task is computed again; the earlier "
                f"journal is kept as {os.fspath(aside)}")

    def end_of_run(self, outcome: str, since: float, command: str = "") -> list[str]:
        return argv.end_of_run(self, outcome, since, command)

    @property
    def decision_summary(self) -> str:
        return decisions.summary(self.config)

    # -- what the rules consume and produce, beyond their fixed files --------------------------

    def tasks_input(self) -> list[str]:
        """The task document, when the built-in coordinator runs."""
        return [self.config["tasks"]] if self.builtin_coordinator else []

    def program_files(self) -> list[str]:
        """The files under the project that worker.command names (``apps/sq.py``): inputs of validate_inputs, so
        that a changed program reruns the stack, and part of the run's identity (:mod:`allocstack.common.identity`)."""
        return identities.named_files(self.config["worker"]["command"], self.facts.cwd)

    def image_sidecar(self) -> list[str]:
        """The image's ``.sha256`` sidecar, when the run uses an image and it exists: an image rebuilt in place
        reruns the stack (before the image is built, a dry run still plans; validate_inputs names it missing)."""
        if self.image is None:
            return []
        sidecar = f"{self.image.rstrip('/')}.sha256"
        return [sidecar] if self.facts.is_file(sidecar) else []

    def expected_input(self) -> list[str]:
        """The expected document, when verification compares against one."""
        return [self.config["expected"]] if self.config["expected"] else []

    def validated_outputs(self, run: str) -> dict[str, str]:
        """validate_inputs' compact task set: only with a task document."""
        return {"compact": self.files(run).compact_tasks} if self.builtin_coordinator else {}

    def coordinator_outputs(self, run: str) -> dict[str, str]:
        """The built-in coordinator's results, end record and gate record (with a task document)."""
        if not self.builtin_coordinator:
            return {}
        files = self.files(run)
        return {"results": files.coordinator_results, "end_record": files.coordinator_end,
                "gate": files.coordinator_gate}

    def service_files(self, run: str) -> list[str]:
        """Every service of yours' service file, and each of its further replicas' (what consumes them keeps them
        all alive, and the stack stops them all as it stops a service)."""
        files = self.files(run)
        return [file for name in self.services
                for file in [files.service_file(name), *(files.replica_file(name, k) for k in self.replicas(name)[1:])]]

    def replicas(self, service: str) -> list[int]:
        """The replicas of ``service`` (config services.<name>.replicas): 1..N, the first being the service itself."""
        return list(range(1, self.config["services"][service]["replicas"] + 1))

    @property
    def replicated(self) -> list[str]:
        """Every further replica of your services, by name (``NAME-replica-2``...): each its own job step."""
        return [placement.replica_name(name, k) for name in self.services for k in self.replicas(name)[1:]]

    @property
    def in_group(self) -> bool:
        """The stack runs as one group of jobs that start together (Snakemake's service outputs: the coordinator's,
        your services'); a plain file made inside it is no input of another job there (Snakemake would look for it
        before that job starts): whoever waits for an init job then waits for its record itself (a gate record). The
        stack's private network is such a service too: every component consumes it."""
        return self.builtin_coordinator or bool(self.services) or self.private_network

    def init_inputs(self, run: str, names: Iterable[str] | None = None) -> list[str]:
        """Init jobs' records as Snakemake inputs (of ``names``, else all): only when no group of jobs holds the
        stack (no service), so that the DAG runs them first; inside the group they are gates, waited for."""
        wanted = self.init_jobs if names is None else [name for name in names if name in self.init_jobs]
        return [] if self.in_group else [self.files(run).init_record(name) for name in wanted]

    def service_dependencies(self, run: str, service: str) -> list[str]:
        """The service files of what ``service`` (a service or an init job) depends on: kept alive together, and
        visible in the DAG. An init job that depends on no service still consumes one service file (or the stack's
        network's, as every component does), so that it runs in the stack's group: its failure then stops the group
        before what depends on it starts."""
        files, depends_on = self.files(run), self.config["services"][service]["depends_on"]
        found = [files.service_file(name) for name in self.uses(depends_on)]
        if service in self.init_jobs:
            if not found and (self.builtin_coordinator or self.services):  # (else the private network holds it)
                found = [files.coordinator_service if self.builtin_coordinator else self.service_files(run)[0]]
            found += self.init_inputs(run, depends_on)
        return found

    def service_gates(self, run: str) -> list[str]:
        """Every service's gate record (its replicas' too) and every init job's record (collection needs them all)."""
        return ([self.files(run).service_gate(name) for name in [*self.gated, *self.gated_replicas]]
                + self.init_records(run) + self.instance_gates(run))

    def worker_records(self, run: str) -> list[str]:
        """What the workers' jobs produce: each worker's record, or each job step's directory of them."""
        files = self.files(run)
        if self.grouped:
            return [files.step_records(step.name) for step in self.steps]
        return [files.worker_record(worker) for worker in self.workers]

    def worker_record_files(self, run: str) -> list[str]:
        """Every worker's own record (in its step's directory when a step runs several)."""
        files = self.files(run)
        if self.grouped:
            return [files.worker_record(worker, step.name) for step in self.steps for worker in step.workers]
        return [files.worker_record(worker) for worker in self.workers]

    def held_services(self, run: str) -> list[str]:
        """The coordinator's service file (the built-in one) and your services' (their replicas' too) on the first
        node: what a job consumes to keep them up while it runs."""
        coordinator = [self.files(run).coordinator_service] if self.builtin_coordinator else []
        return coordinator + self.service_files(run)

    def worker_inputs(self, run: str) -> list[str]:
        """What keeps the services alive while a worker runs: the coordinator's and your services' files."""
        return self.held_services(run) + self.instance_files(run) + self.init_inputs(run)

    def check_inputs(self, run: str) -> list[str]:
        """run_check consumes your services' files (they stay up while it runs) and waits for the workers
        itself; with no services, the workers' records are its plain inputs (not in a group: inside the stack's
        private network, the check waits for them itself as well)."""
        if self.services or self.private_network:
            return self.service_files(run)
        return [*self.worker_records(run), *self.main_records(run)]

    def check_records(self, run: str) -> list[str]:
        return [self.files(run).check_record] if self.runs_check else []

    def stack_services(self, run: str) -> list[str]:
        """Every service file of the stack on its first node (its private network's, the coordinator's, your
        services'): what rule open_stack consumes to start with the stack's group of jobs, and end at once
        (workflow/scripts/stack_job.py says why). None when nothing holds the stack as a group."""
        return [*self.stack_network(run), *self.held_services(run)]

    def stack_network(self, run: str, node: int = 0) -> list[str]:
        """The service file of the stack's private network on ``node`` (0 = the first; config network.isolation:
        private): every component on that node consumes it, so Snakemake keeps the network up while any of them runs
        (none with isolation none)."""
        if not self.private_network:
            return []
        return [self.files(run).stack_network if node == 0 else self.files(run).node_network(node + 1)]

    def node_of(self, wildcards: Mapping[str, str]) -> int:
        """The node (0 = the first) a rule's job runs on, from its wildcards: ``node`` (1-based: a node's gate, a
        global service's instance), ``worker``, ``step``; the first node for every other job."""
        if "node" in wildcards:
            return int(wildcards["node"]) - 1
        if "worker" in wildcards:
            return self.worker_node(wildcards["worker"])
        if "step" in wildcards:
            return self.step(wildcards["step"]).node
        return 0

    @property
    def relayed_services(self) -> list[str]:
        """With more than one node, the services the other nodes reach through a relay on the first node (a global
        service's instances are each node's own)."""
        return [name for name in self.services if name not in self.global_services]

    def node_gates(self, run: str) -> list[str]:
        """Every other node's gate record (none with one node)."""
        return [self.files(run).node_gate(node) for node in range(2, self.nodes + 1)]

    def before_running(self) -> None:
        """What only a run is refused, not a dry run (the adapter asks at Snakemake's ``onstart``): a plan of more
        than one node may be reviewed anywhere, but runs only inside an allocation or submitted to Slurm.

        :raises PlanError: the refusal, ONE line.
        """
        refusals.refuse_without_allocation(self.config, self.facts)



def image_in_use(config: Mapping[str, Any], facts: Facts) -> str | None:
    """The image the components run in (relative paths as written), or None.

    ``auto``: with ``--sdm apptainer`` (the Slurm profile) and runtime apptainer, this checkout's
    ``container/allocstack.sif`` when something runs in it (the built-in coordinator, or a program of
    yours without an image of its own); otherwise none (a stack whose every program has its own image
    runs allocstack's own parts beside them, on the host). A path: with runtime apptainer under ``--sdm
    apptainer``, with runtime charliecloud always. null: none, whatever the deployment method.
    The default lives in config/config.yaml and the schema, not in a profile: a ``--config`` on the
    command line replaces a profile's ``config:`` list, and with it the image, unsaid.
    """
    image, runtime = config["image"], config["runtime"]
    apptainer = "apptainer" in facts.deployment
    if image == AUTO_IMAGE:
        if runtime != "apptainer" or not apptainer:
            return None
        if not config["tasks"] and all(spec.get("image") for _, spec in parts_of_yours(config)):
            return None
        checkout = os.path.join(facts.scripts, os.pardir, os.pardir)
        return os.path.normpath(os.path.join(checkout, DEFAULT_IMAGE))
    return image if image and (runtime == "charliecloud" or apptainer) else None


def load(config: Mapping[str, Any], facts: Facts) -> Plan:
    """The plan of ``config`` (as Snakemake read it: not changed) in the world ``facts`` describes.

    :raises PlanError: the first refusal, ONE line naming the key.
    """
    complete = copy.deepcopy(dict(config))
    nulls_from_command_line(complete, schema())
    if not facts.skip_validation:
        validate(complete)
    spelled = migrate_service_block(complete)
    try:
        order = start_order({name: spec["depends_on"] for name, spec in complete["services"].items()})
    except UnknownDependency as error:
        raise PlanError("config", str(error)) from error
    except DependencyCycle as error:
        raise PlanError("config", f"services: {error}") from error
    if complete["mode"] == "serve":
        complete["workers"] = 0
    shape = allocation(complete)
    written = complete["image"]
    complete["image"] = image_in_use(complete, facts)  # auto resolved: programs of yours fall back on it too
    on = images_on(complete, facts.deployment)
    use_image = bool(complete["image"]) and on
    refusals.refuse_missing_inputs(complete, facts)
    refusals.refuse_bad_serve(complete)
    if complete["mode"] == "serve":
        complete["workers"] = 0  # your services alone: no worker (the schema's minimum is for batch work)
    refusals.refuse_bad_stack(complete, spelled, on)
    refusals.refuse_bad_programs(complete, facts)
    refusals.refuse_bad_nodes(complete, facts)
    refusals.refuse_too_many_cpus(complete, shape, facts)
    refusals.refuse_cluster_settings(shape, facts)
    refusals.refuse_foreign_host(complete, facts)
    refusals.refuse_unverified(complete, on)
    refusals.refuse_missing_runtime(complete, use_image, facts, on)
    refusals.refuse_unusable_tmpdir(complete, facts)
    refusals.refuse_private_network(complete, facts)
    refusals.refuse_bad_restarts(complete, spelled)
    refusals.refuse_bad_replicas(complete, spelled)
    main_spec = None
    if complete["main"]:
        refusals.refuse_bad_main(complete, spelled)
        main_spec = complete["services"].pop(complete["main"])
        order = [name for name in order if name != complete["main"]]
    refusals.refuse_bad_init(complete)
    refusals.refuse_bad_conditions(complete, main_spec, spelled)
    init_order = tuple(name for name in order if name in complete["init_jobs"])
    order = [name for name in order if name not in init_order]
    refusals.refuse_shared_steps(complete)
    worker = complete["worker"]
    size = placement.per_step(complete["workers"], complete["nodes"], worker["per_step"],
                              one_each=worker["mode"] == "long-running" or worker["gpus"] > 0)
    steps = placement.steps(complete["workers"], complete["nodes"], size) if size > 1 else []
    return Plan(complete, facts, tuple(order), shape, use_image, tuple(steps), on, main_spec, written, init_order)
