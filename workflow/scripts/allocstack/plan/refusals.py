"""What the plan refuses before anything runs: each a :class:`PlanError`, ONE line naming the key.

What the schema cannot say about a stack (:func:`refuse_bad_stack`), a restart policy where none can apply
(:func:`refuse_bad_restarts`), a stack over more than one
node (:func:`refuse_bad_nodes`; outside Slurm only when it is run, :func:`refuse_without_allocation`),
several workers in one job step (:func:`refuse_shared_steps`), missing input files (:func:`refuse_missing_inputs`), an
allocation no node can hold (:func:`refuse_too_many_cpus`), what Slurm itself would refuse or
never run (:func:`refuse_cluster_settings`), an allocation held from another host
(:func:`refuse_foreign_host`), a run nothing verifies (:func:`refuse_unverified`), an image
without its runtime's program (:func:`refuse_missing_runtime`), and a $TMPDIR that Snakemake
would silently replace (:func:`refuse_unusable_tmpdir`). The world each one needs comes
in :class:`~allocstack.plan.facts.Facts` (Slurm through its injectable query).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any

from ..common import names, namespaces, slurm
from ..common.errors import AllocstackError
from ..launch.containers import PROGRAMS
from . import depends
from .facts import Facts
from .placement import replica_name
from .programs import check_command_set, env_references, parts_of_yours, program_image, program_images
from .shape import Shape


class PlanError(AllocstackError):
    """A config (or a world) the plan refuses: the adapter prints its one line and exits with its code."""


def refuse_first(diag: str, *cases: tuple[bool, str]) -> None:
    """Refusals as a table of (when, why): the first case that holds, as :class:`PlanError` ``(diag, why)``."""
    for holds, message in cases:
        if holds:
            raise PlanError(diag, message)


#: Names allocstack's own job steps and files use: a service may not take them.
RESERVED_NAMES = {"readiness", "check", "verify", "collect", "worker"}


def reserved(name: str) -> bool:
    """``name`` is allocstack's own (a job step or a file of its own), whatever the stack."""
    return name in RESERVED_NAMES or bool(re.fullmatch(r"worker-[0-9]+|.*-readiness", name))


def refuse_missing_inputs(config: Mapping[str, Any], facts: Facts) -> None:
    """A missing input file is one line naming the key, not Snakemake's MissingInputException.

    The image is not checked here: validate_inputs checks it and its digest before anything
    starts, and ``--dry-run`` stays usable for review before the image is built.
    """
    for key in ("tasks", "expected"):
        path = config[key]
        if path and not facts.is_file(path):
            raise PlanError("input", f"{key} file {path} does not exist (config key '{key}')")


def refuse_bad_stack(config: Mapping[str, Any], spelled: Mapping[str, str], images_on: bool = False) -> None:
    """What the schema cannot say about your own stack (services, workers, your check).

    :param spelled: how the config names a service, where not ``services.<name>`` (the older ``service:``).
    :param images_on: programs run in their images (whose own command runs when they have none).
    """
    builtin = bool(config["tasks"])
    long_running = config["worker"]["mode"] == "long-running"
    prefixes: dict[str, str] = {}
    for name, spec in config["services"].items():
        key = spelled.get(name, f"services.{name}")
        if reserved(name) or (builtin and name == "coordinator"):
            why = "the built-in coordinator's (tasks is set)" if name == "coordinator" else "allocstack's own"
            raise PlanError("config", f"services.{name}: the name is {why}; rename the service")
        other = prefixes.setdefault(names.variable_prefix(name), name)
        if other != name:
            raise PlanError("config", f"services.{other} and services.{name} would both be "
                                      f"{names.variable_prefix(name)}*; rename one")
        in_image = program_image(config, images_on, spec)
        if not spec["command"] and not spec["entrypoint"] and not in_image:
            raise PlanError("config", f"services.{name}.command is not set: the service's program as an argv list "
                                      "(or run it in its image, whose own command then runs)")
        if spec["port"] == "image" and not in_image:
            raise PlanError("config", f"services.{name}.port is image (the port its image EXPOSEs) but it runs "
                                      f"without an image: set services.{name}.port, or run it in its image")
        if spec["readiness"]["mode"] == "command" and not spec["readiness"]["command"]:
            raise PlanError("config", f"{key}.readiness.mode is command but {key}.readiness.command is null")
    if config["mode"] == "serve":
        return  # no workers, no check: their blocks are not used
    worker = config["worker"]
    if long_running and not worker["command"] and not worker["entrypoint"] and not program_image(config, images_on,
                                                                                                  worker):
        raise PlanError("config", "worker.mode is long-running but worker.command is not set: the workers' program, "
                                  "as an argv list (or run them in their image, whose own command then runs)")
    if not long_running and worker["max_lifetime"]:
        raise PlanError("config", "worker.max_lifetime is for long-running workers (worker.mode: long-running): "
                                  "per-task workers end once the tasks are done (bound a task with worker.task_timeout)")
    if not long_running:
        for key in ("entrypoint", "working_dir", "mounts"):
            if worker[key]:
                raise PlanError("config", f"worker.{key} is for long-running workers (your own stack): per-task "
                                          "workers run allocstack's worker in worker.image (or image), which sees "
                                          f"paths bound at the same place ({config['runtime']}.binds)")
    if not builtin and config["mode"] != "serve":
        if not long_running:
            raise PlanError("config", "tasks is null (no built-in coordinator) but worker.mode is per-task: set "
                                      "worker.mode: long-running and worker.command, or give a task document")
        if config["expected"]:
            raise PlanError("config", "expected is set but tasks is null: there are no task results to compare; "
                                      "set expected: null")


def refuse_bad_serve(config: Mapping[str, Any]) -> None:
    """Serve mode runs your services alone; a global service's instances each run on their own node, alone."""
    if config["nodes"] > 1:
        for name, spec in config["services"].items():
            if spec["mode"] == "global" and spec["depends_on"]:
                raise PlanError("config", f"services.{name}.mode is global with depends_on {list(spec['depends_on'])}: an "
                                          "instance on each node reaches nothing of the first node's; drop depends_on")
    if config["mode"] != "serve":
        return
    if config["tasks"]:
        raise PlanError("config", "mode is serve but tasks is set: a serving stack runs your services alone; set "
                                  "tasks: null, or mode: batch for work that ends")
    if config["verify"]["command"] or config["verify"]["entrypoint"]:
        raise PlanError("config", "mode is serve but verify.command is set: a serving stack has no check (it runs until "
                                  "the allocation's end, scancel, Ctrl-C or main ends); set verify.command: null")
    if config["expected"]:
        raise PlanError("config", "mode is serve but expected is set: there are no results to compare; set expected: null")
    if not [name for name in config["services"] if name not in config["init_jobs"] and name != config["main"]]:
        raise PlanError("config", "mode is serve but services has no long-running service: nothing would serve")


def refuse_bad_main(config: Mapping[str, Any], spelled: Mapping[str, str]) -> None:
    """config ``main`` names a service of yours that nothing depends on, in your own stack."""
    main = config["main"]
    if main not in config["services"]:
        known = ", ".join(config["services"]) or "none"
        raise PlanError("config", f"main: {main} is not one of services ({known})")
    if config["tasks"]:
        raise PlanError("config", f"main: {main} with a task document (tasks): the built-in coordinator's tasks end "
                                  "the stack; set main: null, or tasks: null for your own stack")
    users = sorted(name for name, spec in config["services"].items() if main in spec["depends_on"])
    if users:
        raise PlanError("config", f"main: {main} runs once and ends the stack, but {spelled.get(users[0], 'services.' + users[0])}"
                                  f" depends on it: nothing may wait for it")


def refuse_bad_init(config: Mapping[str, Any]) -> None:
    """config ``init_jobs`` name services of yours, none of them ``main`` (taken out of ``services`` by then)."""
    for name in config["init_jobs"]:
        if name == config["main"]:
            raise PlanError("config", f"init_jobs: {name} is main: an init job runs once before what depends on it, "
                                      "main beside the workers until the stack ends; name it in one of them")
        if name not in config["services"]:
            known = ", ".join(config["services"]) or "none"
            raise PlanError("config", f"init_jobs: {name} is not one of services ({known})")


def refuse_bad_conditions(config: Mapping[str, Any], main_spec: Mapping[str, Any] | None,
                          spelled: Mapping[str, str]) -> None:
    """A ``depends_on`` in Compose's mapping form waits for an init job only to complete, and only an init job so."""
    specs = {**config["services"], **({config["main"]: main_spec} if main_spec else {})}
    for name, spec in specs.items():
        why = depends.refusal(f"{spelled.get(name, f'services.{name}')}.depends_on", spec["depends_on"],
                              config["init_jobs"])
        if why:
            raise PlanError("config", why)


def refuse_bad_restarts(config: Mapping[str, Any], spelled: Mapping[str, str]) -> None:
    """A restart policy (``restart``) only where a program of yours can be started again without changing how the
    stack ends: your services, and long-running workers whose restart after exit 0 cannot keep the stack from
    ending; never the main program (its end is the stack's)."""
    for name, spec in config["services"].items():
        key = spelled.get(name, f"services.{name}")
        restart = spec["restart"]
        if name == config["main"] and restart["condition"] != "none":
            raise PlanError("config", f"{key}.restart: main: {name} runs once and its end ends the stack (Compose "
                                      "--exit-code-from): set its restart condition to none")
        refuse_bad_window(f"{key}.restart", restart)
    worker = config["worker"]
    restart = worker["restart"]
    refuse_bad_window("worker.restart", restart)
    if restart["condition"] != "none" and worker["mode"] != "long-running":
        raise PlanError("config", "worker.restart is for long-running workers: a per-task worker killed from outside "
                                  "is tolerated already (its tasks go back to the queue); set worker.restart."
                                  "condition: none")
    if restart["condition"] == "any" and not config["main"]:
        raise PlanError("config", "worker.restart.condition is any, but without main the stack ends when every worker "
                                  "ended: a worker started again after exit 0 would never let it end; use on-failure, "
                                  "or set main")


def replicas_refusal(name: str, config: Mapping[str, Any]) -> str | None:
    """Why services.<name> may not have more than one replica, or None. Each replica is its own program on the first
    node. One with no port shares the stack's network (nothing of its can collide: a second kind of Celery or RQ
    consumer, a service with a healthcheck command); one with a port listens on it in a network of its own (beside
    the stack's private network), reached through the service's front on that port, in turn (from the other nodes
    through that front's relay)."""
    spec = config["services"][name]
    if name == config["main"]:
        return "it is main: it runs once and its end ends the stack"
    if name in config["init_jobs"]:
        return "it is an init job: it runs once, before what depends on it"
    if spec["mode"] == "global":
        return "its mode is global: it has one instance on each node already"
    mode = spec["readiness"]["mode"]
    if spec["port"] == "image":
        return (f"its port is image: its replicas' front listens on the port before any replica started; write the "
                f"port it listens on (services.{name}.port)")
    if spec["port"] is None and mode in ("http", "tcp"):
        return (f"its readiness gate ({mode}) probes a port chosen when it starts (port: null): write the port it "
                f"listens on (services.{name}.port), which each replica listens on in a network of its own")
    if spec["port"] is None:
        return None
    if config["network"]["isolation"] != "private":
        return (f"it has port {spec['port']}: each replica listens on it in a network of its own, which needs "
                "network.isolation: private (else they would share the node's one loopback, and its port); run one "
                "copy, or write each copy as a service of its own on a port of its own")
    return None


def refuse_bad_replicas(config: Mapping[str, Any], spelled: Mapping[str, str]) -> None:
    """``replicas`` above 1 only where the copies cannot collide (:func:`replicas_refusal`)."""
    for name, spec in config["services"].items():
        if spec["replicas"] > 1 and (why := replicas_refusal(name, config)):
            raise PlanError("config", f"{spelled.get(name, f'services.{name}')}.replicas is {spec['replicas']}, but "
                                      f"{name}: {why}")
        taken = [replica_name(name, k) for k in range(2, spec["replicas"] + 1) if replica_name(name, k) in config["services"]]
        if taken:
            raise PlanError("config", f"services.{name}.replicas is {spec['replicas']}, but services.{taken[0]} is the "
                                      f"name of its replica {taken[0].rsplit('-', 1)[1]}: rename that service")


def refuse_bad_window(key: str, restart: Mapping[str, Any]) -> None:
    if restart["window"] and restart["max_attempts"] is None:
        raise PlanError("config", f"{key}.window is set but {key}.max_attempts is null: the window is the time in "
                                  "which restarts count toward max_attempts; set max_attempts, or window: 0")


def refuse_bad_programs(config: Mapping[str, Any], facts: Facts) -> None:
    """Each program's mounts name a volume of ``volumes`` and a source that exists (relative to where
    snakemake runs); every ``${env:NAME}`` is set in the environment snakemake runs in: the run reads it
    when the program starts, on the node, where the job got this environment."""
    for volume in config["keep_volumes"]:
        if volume not in config["volumes"]:
            raise PlanError("config", f"keep_volumes: {volume} is not one of `volumes`")
    for key, spec in parts_of_yours(config):
        for mount in spec.get("mounts") or []:
            if mount.get("volume") and mount["volume"] not in config["volumes"]:
                raise PlanError("config", f"{key}.mounts: {mount['target']}: volume {mount['volume']} is not one of "
                                          "`volumes`")
            if mount.get("source") and not facts.exists(facts.absolute(mount["source"])):
                raise PlanError("input", f"{key}.mounts: {mount['target']}: its source {mount['source']} does not "
                                         "exist")
        for name in env_references(spec):
            if name not in facts.environ:
                raise PlanError("config", f"{key}: ${{env:{name}}} is not set in the environment snakemake runs in: "
                                          f"export {name} (it is read when the program starts, never written in a "
                                          "file)")


def refuse_bad_nodes(config: Mapping[str, Any], facts: Facts) -> None:
    """More than one node: Slurm job steps, the built-in coordinator, no volumes, a worker for every
    node, Slurm (the partition's node count is checked with the other cluster settings)."""
    nodes = config["nodes"]
    if nodes == 1:
        return
    refuse_first(
        "config",
        (not config["slurm"]["job_steps"],
         f"nodes={nodes} needs slurm.job_steps: true (workers are placed on their node as job steps)"),
        (not config["tasks"],
         (f"nodes={nodes} needs the built-in coordinator (a task document in tasks): its network listener and each "
          "node's gate are what spread the workers over the nodes")),
        (bool(config["volumes"]),
         (f"nodes={nodes} with volumes: a named volume is job-scoped scratch on the first node, which workers on the "
          "other nodes cannot see; use nodes: 1, or files under the project")),
        (config["workers"] < nodes,
         (f"nodes={nodes} but workers={config['workers']}: a node would get no worker; use at least as many workers "
          "as nodes")))


def refuse_without_allocation(config: Mapping[str, Any], facts: Facts) -> None:
    """More than one node runs only in Slurm: submitted with the profile, or inside an allocation. A dry run may
    show the plan anywhere (so this is asked when the run starts, not when the plan is made)."""
    nodes = config["nodes"]
    if nodes > 1 and not facts.submits_to_slurm and not facts.job_id:
        raise PlanError("config", f"nodes={nodes} needs a Slurm allocation: run with --profile profiles/slurm (or "
                                  "inside an allocation of that many nodes); --dry-run shows the plan anywhere")


def refuse_shared_steps(config: Mapping[str, Any]) -> None:
    """Several workers in one job step (``worker.per_step`` above 1) are per-task workers without GPUs: a
    long-running worker's end fails the run, and a step's GPUs are not split between its workers."""
    per_step, worker = config["worker"]["per_step"], config["worker"]
    if per_step is None or per_step == 1:
        return
    refuse_first(
        "config",
        (worker["mode"] == "long-running",
         (f"worker.per_step={per_step} with worker.mode long-running: each long-running worker is its own job step; "
          "set worker.per_step: 1 (or null)")),
        (bool(worker["gpus"]),
         (f"worker.per_step={per_step} with worker.gpus={worker['gpus']}: a worker with GPUs is its own job step "
          "(srun gives each step its GPUs); set worker.per_step: 1 (or null)")))


def refuse_too_many_cpus(config: Mapping[str, Any], shape: Shape, facts: Facts) -> None:
    """An allocation whose busiest node needs more CPUs than the largest node has would pend forever."""
    max_cpus, source = config["slurm"]["max_cpus"], "slurm.max_cpus"
    if max_cpus is None and facts.submits_to_slurm:
        max_cpus, source = slurm.largest_node_cpus(facts.slurm_query), "the largest node in sinfo"
    if max_cpus is not None and shape.cpus > max_cpus:
        where = "in one allocation" if shape.nodes == 1 else f"on its first of {shape.nodes} nodes"
        raise PlanError("config", f"workers={config['workers']} needs {shape.cpus} CPUs {where} (workers x "
                                  "worker.cpus, plus coordinator.cpus and each service's cpus) but "
                                  f"{source} has {max_cpus}: the job would pend forever; lower workers (or set "
                                  "slurm.max_cpus)")


def refuse_cluster_settings(shape: Shape, facts: Facts) -> None:
    """Refuse what Slurm would refuse or never run, before anything is submitted.

    An account that does not exist or that the user may not use, a partition that does not
    exist, a runtime above the partition's MaxTime, memory above its largest node's, more
    nodes than the partition has (:func:`allocstack.common.slurm.submission_problem`).
    """
    if not facts.submits_to_slurm:
        return
    submission = slurm.submission_from_resources(facts.default_resources, components=shape.components,
                                                 cpus=shape.cpus, user=facts.user, nodes=shape.nodes)
    problem = slurm.submission_problem(submission, slurm.gather_facts(submission, facts.slurm_query))
    if problem is not None:
        # config nodes, or a default resource of the profile (its runtime is not config runtime)
        where = "" if problem[0] == "nodes" else "default-resources "
        raise PlanError("config", f"{where}{problem[1]}")


def refuse_foreign_host(config: Mapping[str, Any], facts: Facts) -> None:
    """Inside an allocation you hold (``salloc``, then snakemake): Snakemake must run on its node.

    The components are job steps that talk over loopback, pinned to the node launch.py runs
    on; run from a login node they would be placed elsewhere and never meet. Inside a job
    step (the plugin's job, ``srun --pty``) Slurm names the node: nothing to check.
    """
    job = facts.job_id
    if not job or facts.environ.get("SLURMD_NODENAME") or not config["slurm"]["job_steps"]:
        return
    nodes = slurm.allocation_nodes(facts.environ.get("SLURM_JOB_NODELIST", ""), facts.slurm_query)
    host = facts.hostname.split(".")[0]
    if nodes is not None and host not in nodes:
        raise PlanError("prerequisite", f"inside allocation {job} (node(s) {', '.join(nodes)}) but on host {host}: "
                                        "the stack's job steps talk over loopback on one node, so run snakemake "
                                        f"there: srun --jobid {job} --overlap --pty bash, then the same snakemake "
                                        "command (or set slurm.job_steps: false)")


def refuse_unverified(config: Mapping[str, Any], images_on: bool = False) -> None:
    """Nothing would say whether the results are correct (your check may run its image's own command)."""
    if config["mode"] == "serve":
        return  # up, then ended by the allocation's end, scancel, Ctrl-C or main: serve.py says how
    if not config["expected"] and not config["main"] and not check_command_set(config, images_on):
        raise PlanError("config", "expected is null and verify.command is not set: nothing would say whether the "
                                  "results are correct; set one of them (or main: the program whose exit decides)")


def refuse_missing_runtime(config: Mapping[str, Any], use_image: bool, facts: Facts, images_on: bool = False) -> None:
    """An image is switched on (allocstack's, or one a program of yours runs in) but its runtime's program is
    not on PATH."""
    runtime = config["runtime"]
    if (use_image or program_images(config, images_on)) and facts.which(PROGRAMS[runtime]) is None:
        switch = "--sdm apptainer is on" if runtime == "apptainer" else f"runtime is {runtime}"
        raise PlanError("prerequisite", f"image is set and {switch}, but {PROGRAMS[runtime]} is not on PATH; "
                                        f"{config[runtime]['hint']}")


def refuse_private_network(config: Mapping[str, Any], facts: Facts) -> None:
    """``network.isolation: private`` where this node can make it: user namespaces (for root, only
    ``user.max_user_namespaces`` above 0) and ``pasta`` on PATH (read here, on the node that plans the run; every
    node of the allocation is taken to be alike)."""
    if config["network"]["isolation"] != "private":
        return
    possible, why = namespaces.user_namespaces(facts.sysctl, privileged=facts.user == "root")
    if not possible:
        raise PlanError("config", f"network.isolation is private but {facts.hostname or 'this node'} does not let "
                                  f"users make user namespaces ({why}): set network.isolation: none (the stack "
                                  "then runs on the node's own network)")
    if facts.which("pasta") is None:
        raise PlanError("config", "network.isolation is private but pasta is not on PATH (Debian and Ubuntu: package "
                                  "passt; it gives the stack's network its way out): install it, load its module, "
                                  "or set network.isolation: none")


def refuse_unusable_tmpdir(config: Mapping[str, Any], facts: Facts) -> None:
    """A $TMPDIR that is the run's scratch root but missing, read-only or full is one line, before anything runs.

    Snakemake hands its jobs Python's temporary directory as $TMPDIR, which silently skips such a
    directory for /tmp: the run would use a /tmp shared with the node's other users instead of the
    job's own storage, unsaid. Checked where the components run: here, or inside the stack's job
    (not on the login node that submits it); $SLURM_TMPDIR and config scratch reach the components
    as they are, and their launcher checks them.
    """
    wanted = facts.environ.get("TMPDIR")
    if config["scratch"] or facts.environ.get("SLURM_TMPDIR") or not wanted or facts.submits_to_slurm:
        return
    if os.path.realpath(facts.tempdir) == os.path.realpath(wanted):
        return
    try:
        room = facts.statvfs(wanted)
        why = "read-only" if room.f_flag & os.ST_RDONLY else "full" if room.f_bavail == 0 else "not writable by you"
    except OSError as exc:
        why = f"unusable ({exc.strerror})"
    raise PlanError("scratch", f"$TMPDIR {wanted} (the run's scratch root) is {why}: Snakemake would give the jobs "
                               f"{facts.tempdir} instead, unsaid; point $TMPDIR (or config scratch) at a writable, "
                               "node-local directory")
