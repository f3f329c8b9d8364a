# Helpers shared by the rules: names, paths and the component launch command.
# No rules here.
import getpass
import importlib.util
import json
import logging
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import jsonschema
import yaml
from snakemake.exceptions import WorkflowError
from snakemake.logging import logger
from snakemake.settings.types import DeploymentMethod
from snakemake.sourcecache import LocalSourceFile

STARTED_AT = time.time()


def scripts_dir():
    """The component scripts, next to this file (also when allocstack is a module of another workflow).

    Relative to the working directory, like every other path of a rule.
    """
    here = workflow.current_basedir
    if not isinstance(here, LocalSourceFile):
        # errors.py is not loadable yet (it is found through this path): 78 is [config]'s code.
        print(
            "allocstack: error [config]: allocstack runs as a module from a local checkout "
            "only (a git submodule or clone: snakefile: 'path/to/allocstack/Snakefile'), "
            f"not from {here.get_path_or_uri(secret_free=True)}",
            file=sys.stderr,
        )
        sys.exit(78)
    path = os.path.join(here.get_path_or_uri(secret_free=True), "..", "scripts")
    return os.path.relpath(os.path.normpath(path))


SCRIPTS = scripts_dir()


def allocstack_module(name):
    """workflow/scripts/allocstack/NAME.py, loaded by its path (a module that needs only the
    standard library): errors.py (the diagnostic ids and exit codes), names.py (the run's file
    names, the variables of a service), slurm.py (every Slurm command and its parsing),
    runtimes.py (the container runtimes' programs).
    """
    spec = importlib.util.spec_from_file_location(
        f"allocstack_{name}", os.path.join(SCRIPTS, "allocstack", f"{name}.py")
    )
    loaded = sys.modules[spec.name] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(loaded)
    return loaded


ERRORS = allocstack_module("errors")
NAMES = allocstack_module("names")
SLURM = allocstack_module("slurm")
# Which command runs a run, and what an earlier attempt of it left (allocstack/attempts.py).
ATTEMPTS = allocstack_module("attempts")
# Which program each container runtime (config `runtime`) needs.
PROGRAMS = allocstack_module("runtimes").PROGRAMS


def fail_config(diag, message):
    """Stop before anything runs: ONE allocstack line and the diagnostic's exit code (no traceback)."""
    sys.exit(ERRORS.report(ERRORS.AllocstackError(diag, message)))


def nulls_from_command_line(values, schema):
    """``--config expected=null`` arrives as the string "null" (Snakemake parses it as text):
    where the schema allows null, it means null."""
    for key, spec in schema.get("properties", {}).items():
        if key not in values:
            continue
        kinds = spec.get("type", [])
        if values[key] == "null" and "null" in (
            [kinds] if isinstance(kinds, str) else kinds
        ):
            values[key] = None
        elif isinstance(values[key], dict) and "properties" in spec:
            nulls_from_command_line(values[key], spec)


def fill_defaults(validator, properties, instance, schema):
    """The ``properties`` keyword that also sets each missing property's ``default`` (as
    snakemake.utils.validate does), then checks the properties as usual."""
    if validator.is_type(instance, "object"):  # else "type" names the problem
        for name, subschema in properties.items():
            if "default" in subschema:
                instance.setdefault(name, subschema["default"])
    yield from jsonschema.Draft202012Validator.VALIDATORS["properties"](
        validator, properties, instance, schema
    )


def validate_config():
    """Validate (and fill defaults of) the config; a violation is ONE line naming the key.

    What snakemake.utils.validate does (it honours a module's ``skip_validation`` too), on
    the schema read once with libyaml: Snakemake would read it again with its pure-Python
    YAML reader, a twentieth of a second of every command's start.
    """
    schema_path = workflow.source_path("../schemas/config.schema.yaml")
    with open(schema_path) as handle:
        # libyaml's loader where PyYAML has it: the same document in a tenth of the time
        schema = yaml.load(handle, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    nulls_from_command_line(config, schema)
    if workflow.modifier.skip_validation:
        return
    defaults = jsonschema.validators.extend(
        jsonschema.Draft202012Validator, {"properties": fill_defaults}
    )
    error = jsonschema.exceptions.best_match(defaults(schema).iter_errors(config))
    if error is not None:
        key = ".".join(str(part) for part in error.absolute_path) or "config"
        fail_config("config", f"{key}: {error.message}")


validate_config()


def adopt_service_block():
    """The single `service:` block keeps working: it is the service `app` of `services`
    (so its variables stay ALLOCSTACK_APP_*)."""
    block = config["service"]
    if not block["command"]:
        return
    if "app" in config["services"]:
        fail_config(
            "config",
            "service.command and services.app are both set: `service:` is the older "
            "spelling of services.app; keep one",
        )
    config["services"] = {
        **config["services"],
        "app": {
            "command": block["command"],
            "readiness": {
                **block["readiness"],
                "timeout": None,
                "interval": None,
                "probe_timeout": 1,
            },
            "port": None,
            "depends_on": [],
            "cpus": 1,
            "environment": {},
            "stop_grace_period": 10,
        },
    }


adopt_service_block()

RUN = config["run"]
WORKER_IDS = [f"worker-{i:02d}" for i in range(1, config["workers"] + 1)]
# Nodes of the stack's allocation: 1 = loopback only; more = workers spread over them.
NODES = config["nodes"]
# Under --sdm conda the rule's environment provides python; otherwise the
# interpreter running Snakemake (the venv from requirements.txt) does.
PYTHON = (
    "python"
    if DeploymentMethod.CONDA in workflow.deployment_settings.deployment_method
    else sys.executable
)
STACK_ENV = "../envs/stack.yaml"
RUNTIME = config["runtime"]
# Apptainer images are switched on by Snakemake's --sdm apptainer (the Slurm profile
# sets it); Charliecloud has no Snakemake deployment method: runtime charliecloud
# and an image are the switch (allocstack uses no container directive, so --sdm
# apptainer itself never needs apptainer).
IMAGES_ON = (
    RUNTIME == "charliecloud"
    or DeploymentMethod.APPTAINER in workflow.deployment_settings.deployment_method
)
USE_IMAGE = bool(config["image"]) and IMAGES_ON


def program_image(part):
    """The image a program of yours runs in (config ``services.<name>``, ``worker`` or ``verify``): its own,
    else ``image``; None without images (no ``--sdm apptainer``, runtime apptainer) or without either.
    """
    if not IMAGES_ON:
        return None
    return part.get("image") or config["image"] or None


# Your own stack: services (config `services`), long-running workers, and with no
# task document (tasks: null) no built-in coordinator; then verify.command runs
# while the services are up (rule run_check), as Compose runs a check that waits
# for the workers to complete.
TASKS = bool(config["tasks"])
LONG_RUNNING = config["worker"]["mode"] == "long-running"
SERVICES = config["services"]
CHECK_IN_STACK = not TASKS
#: Seconds a service may take to publish its endpoint once its dependencies are ready
#: (srun + Apptainer + the supervisor's start).
SERVICE_START_SECONDS = 30


wildcard_constraints:
    run=r"[A-Za-z0-9][A-Za-z0-9._-]*",
    worker=r"worker-[0-9]+",
    service="|".join(re.escape(name) for name in SERVICES) or "(?!)",
    node=r"[0-9]+",


def submits_to_slurm():
    """True when this Snakemake is about to submit to Slurm (not when it runs inside a job)."""
    resources = workflow.resource_settings.default_resources or {}
    slurm_keys = {"slurm_account", "slurm_partition"} & set(resources.keys())
    return bool(slurm_keys) and not os.environ.get("SLURM_JOB_ID")


def check_cluster_settings(cpus):
    """Refuse what Slurm would refuse or never run, before anything is submitted (one line).

    An account that does not exist or that the user may not use, a partition that does not
    exist, a runtime above the partition's MaxTime, memory above its largest node's.
    """
    resources = workflow.resource_settings.default_resources or {}
    components = config["workers"] + 2 + (2 if config["service"]["command"] else 0)
    submission = SLURM.submission_from_resources(
        {name: resource.raw for name, resource in resources.items()},
        components=components,
        cpus=cpus,
        user=getpass.getuser(),
        nodes=NODES,
    )
    problem = SLURM.submission_problem(submission, SLURM.gather_facts(submission))
    if problem is not None:
        # config nodes, or a default resource of the profile (its runtime is not config runtime)
        where = "" if problem[0] == "nodes" else "default-resources "
        fail_config("config", f"{where}{problem[1]}")


def check_allocation_host():
    """Inside an allocation you hold (``salloc``, then snakemake): Snakemake must run on its node.

    The components are job steps that talk over loopback, pinned to the node launch.py runs
    on; run from a login node they would be placed elsewhere and never meet. Inside a job
    step (the plugin's job, ``srun --pty``) Slurm names the node: nothing to check.
    """
    job = os.environ.get("SLURM_JOB_ID")
    if not job or os.environ.get("SLURMD_NODENAME") or not config["slurm"]["job_steps"]:
        return
    nodes = SLURM.allocation_nodes(os.environ.get("SLURM_JOB_NODELIST", ""))
    host = socket.gethostname().split(".")[0]
    if nodes is not None and host not in nodes:
        fail_config(
            "prerequisite",
            f"inside allocation {job} (node(s) {', '.join(nodes)}) but on host {host}: the stack's "
            "job steps talk over loopback on one node, so run snakemake there: "
            f"srun --jobid {job} --overlap --pty bash, then the same snakemake command "
            "(or set slurm.job_steps: false)",
        )


def check_input_files():
    """A missing input file is one allocstack line naming the key, not Snakemake's MissingInputException.

    The image is not checked here: validate_inputs checks it and its digest before anything
    starts, and `--dry-run` stays usable for review before the image is built.
    """
    for key, path in (("tasks", config["tasks"]), ("expected", config["expected"])):
        if path and not os.path.isfile(path):
            fail_config(
                "input", f"{key} file {path} does not exist (config key '{key}')"
            )


#: Names allocstack's own job steps and files use: a service may not take them.
RESERVED_NAMES = {"readiness", "check", "verify", "collect", "worker"}


def service_order():
    """Service names, each after every service it depends on.

    A name in depends_on that is not a service, or a cycle, stops the run (one line).
    """
    order, visiting = [], []

    def visit(name):
        if name in order:
            return
        if name in visiting:
            cycle = " -> ".join(visiting[visiting.index(name) :] + [name])
            fail_config("config", f"services: depends_on has a cycle: {cycle}")
        visiting.append(name)
        for dependency in SERVICES[name]["depends_on"]:
            if dependency not in SERVICES:
                fail_config(
                    "config",
                    f"services.{name}.depends_on: {dependency!r} is not one of services "
                    f"({', '.join(sorted(SERVICES))})",
                )
            visit(dependency)
        visiting.pop()
        order.append(name)

    for name in SERVICES:
        visit(name)
    return order


def service_key(name):
    """How the config names a service: `service` for the single block, else services.<name>."""
    return (
        "service"
        if name == "app" and config["service"]["command"]
        else f"services.{name}"
    )


def check_stack():
    """What the schema cannot say about your own stack (services, workers, the check)."""
    prefixes = {}
    for name, spec in SERVICES.items():
        key = service_key(name)
        taken = name in RESERVED_NAMES or re.fullmatch(
            r"worker-[0-9]+|.*-readiness", name
        )
        if taken or (TASKS and name == "coordinator"):
            why = (
                "the built-in coordinator's (tasks is set)"
                if name == "coordinator"
                else "allocstack's own"
            )
            fail_config(
                "config", f"services.{name}: the name is {why}; rename the service"
            )
        other = prefixes.setdefault(NAMES.variable_prefix(name), name)
        if other != name:
            fail_config(
                "config",
                f"services.{other} and services.{name} would both be {NAMES.variable_prefix(name)}*; rename one",
            )
        if not spec["command"] and not spec["entrypoint"] and not program_image(spec):
            fail_config(
                "config",
                f"services.{name}.command is not set: the service's program as an argv list "
                "(or run it in its image, whose own command then runs)",
            )
        if spec["port"] == "image" and not program_image(spec):
            fail_config(
                "config",
                f"services.{name}.port is image (the port its image EXPOSEs) but it runs without an "
                f"image: set services.{name}.port, or run it in its image",
            )
        if spec["readiness"]["mode"] == "command" and not spec["readiness"]["command"]:
            fail_config(
                "config",
                f"{key}.readiness.mode is command but {key}.readiness.command is null",
            )
    worker = config["worker"]
    if (
        LONG_RUNNING
        and not worker["command"]
        and not worker["entrypoint"]
        and not program_image(worker)
    ):
        fail_config(
            "config",
            "worker.mode is long-running but worker.command is not set: the workers' program, as an argv list "
            "(or run them in their image, whose own command then runs)",
        )
    if not LONG_RUNNING:
        for key in ("entrypoint", "working_dir", "mounts"):
            if worker[key]:
                fail_config(
                    "config",
                    f"worker.{key} is for long-running workers (your own stack): per-task workers run "
                    "allocstack's worker in worker.image (or image), which sees paths bound at the same place "
                    f"({RUNTIME}.binds)",
                )
    for key, spec in parts_of_yours():
        check_mounts(key, spec)
    check_references()
    if not TASKS:
        if not LONG_RUNNING:
            fail_config(
                "config",
                "tasks is null (no built-in coordinator) but worker.mode is per-task: "
                "set worker.mode: long-running and worker.command, or give a task document",
            )
        if config["expected"]:
            fail_config(
                "config",
                "expected is set but tasks is null: there are no task results to compare; set expected: null",
            )


def parts_of_yours():
    """(config key, config) of every program of yours: each service, the workers, the check."""
    return [
        *((service_key(name), spec) for name, spec in SERVICES.items()),
        ("worker", config["worker"]),
        ("verify", config["verify"]),
    ]


def check_mounts(key, spec):
    """A mount's volume is one of ``volumes``; its source exists (relative to where snakemake runs)."""
    for mount in spec.get("mounts", []):
        if mount.get("volume") and mount["volume"] not in config["volumes"]:
            fail_config(
                "config",
                f"{key}.mounts: {mount['target']}: volume {mount['volume']} is not one of `volumes`",
            )
        if mount.get("source") and not os.path.exists(mount["source"]):
            fail_config(
                "input",
                f"{key}.mounts: {mount['target']}: its source {mount['source']} does not exist",
            )


#: ``${env:NAME}`` in a command or an environment value: read from this environment when the program starts.
ENV_REFERENCE = re.compile(r"\$\{env:([A-Za-z_][A-Za-z0-9_]*)\}")


def env_references(spec):
    """The variables of this environment that a program's command or environment reads (``${env:NAME}``)."""
    texts = [*(spec.get("command") or []), *(spec.get("entrypoint") or [])]
    texts += list(spec.get("environment", {}).values())
    return sorted({name for text in texts for name in ENV_REFERENCE.findall(text)})


def check_references():
    """Every ``${env:NAME}`` is set here before anything starts: the run reads it when the program starts,
    on the node, where the job got this environment (one line otherwise)."""
    for key, spec in parts_of_yours():
        for name in env_references(spec):
            if name not in os.environ:
                fail_config(
                    "config",
                    f"{key}: ${{env:{name}}} is not set in the environment snakemake runs in: export {name} "
                    "(it is read when the program starts, never written in a file)",
                )


def node_cpus(services=True):
    """CPUs the busiest node (the first) needs: the coordinator's, the most workers a node gets,
    and (``services``) your services'."""
    most_workers = -(-config["workers"] // NODES)
    own = sum(spec["cpus"] for spec in SERVICES.values()) if services else 0
    return config["coordinator"]["cpus"] + most_workers * config["worker"]["cpus"] + own


def check_nodes():
    """More than one node: Slurm job steps, a worker for every node, Slurm (the partition's node
    count is checked with the other cluster settings, check_cluster_settings)."""
    if NODES == 1:
        return
    if not config["slurm"]["job_steps"]:
        fail_config(
            "config",
            f"nodes={NODES} needs slurm.job_steps: true (workers are placed on their node as job steps)",
        )
    if not TASKS:
        fail_config(
            "config",
            f"nodes={NODES} needs the built-in coordinator (a task document in tasks): its "
            "network listener and each node's gate are what spread the workers over the nodes",
        )
    if config["volumes"]:
        fail_config(
            "config",
            f"nodes={NODES} with volumes: a named volume is job-scoped scratch on the first node, "
            "which workers on the other nodes cannot see; use nodes: 1, or files under the project",
        )
    if config["workers"] < NODES:
        fail_config(
            "config",
            f"nodes={NODES} but workers={config['workers']}: a node would get no worker; "
            "use at least as many workers as nodes",
        )
    if not submits_to_slurm() and not os.environ.get("SLURM_JOB_ID"):
        fail_config(
            "config",
            f"nodes={NODES} needs a Slurm allocation: run with --profile profiles/slurm "
            "(or inside an allocation of that many nodes)",
        )


def check_prerequisites():
    check_input_files()
    check_stack()
    check_nodes()
    if NODES > 1:
        # sbatch --no-kill for the stack's job (read by sbatch from the environment, so a
        # profile's or the command line's default-resources cannot drop it): a node that
        # fails mid-run costs only its workers, whose leased tasks go back to the queue;
        # without it Slurm would end (and requeue) the whole stack.
        os.environ.update(SBATCH_NO_KILL="set")
    needed = (
        sum(
            [
                config["workers"] * config["worker"]["cpus"],
                config["coordinator"]["cpus"] if TASKS else 0,
                *(spec["cpus"] for spec in SERVICES.values()),
            ]
        )
        if NODES == 1
        else node_cpus()
    )
    max_cpus = config["slurm"]["max_cpus"]
    source = "slurm.max_cpus"
    if max_cpus is None and submits_to_slurm():
        max_cpus, source = SLURM.largest_node_cpus(), "the largest node in sinfo"
    if max_cpus is not None and needed > max_cpus:
        where = "in one allocation" if NODES == 1 else f"on its first of {NODES} nodes"
        fail_config(
            "config",
            f"workers={config['workers']} needs {needed} CPUs {where} (workers x "
            f"worker.cpus, plus coordinator.cpus and each service's cpus) but {source} has {max_cpus}: the job "
            "would pend forever; lower workers (or set slurm.max_cpus)",
        )
    if submits_to_slurm():
        check_cluster_settings(needed)
    check_allocation_host()
    if not config["expected"] and not check_command_set():
        fail_config(
            "config",
            "expected is null and verify.command is not set: nothing would say "
            "whether the results are correct; set one of them",
        )
    if (USE_IMAGE or program_images()) and shutil.which(PROGRAMS[RUNTIME]) is None:
        switch = (
            "--sdm apptainer is on"
            if RUNTIME == "apptainer"
            else f"runtime is {RUNTIME}"
        )
        fail_config(
            "prerequisite",
            f"image is set and {switch}, but {PROGRAMS[RUNTIME]} is not on PATH; "
            f"{config[RUNTIME]['hint']}",
        )


def check_command_set():
    """verify.command is set, or (your own stack) the check runs its image's own command."""
    check = config["verify"]
    if check["command"] or check["entrypoint"]:
        return True
    return not TASKS and bool(config["verify"]["image"]) and IMAGES_ON


def program_images():
    """Every image a program of yours runs in (with images on): config key -> its path."""
    found = {}
    for key, spec in parts_of_yours():
        if key == "worker" and not LONG_RUNNING:
            image = config["worker"]["image"] if IMAGES_ON else None
        elif key == "verify" and TASKS and not spec["command"]:
            image = None
        else:
            image = program_image(spec)
        if image:
            found[key] = image
    return found


def check_tmpdir():
    """A $TMPDIR that is the run's scratch root but missing, read-only or full is one line, before anything runs.

    Snakemake hands its jobs Python's temporary directory as $TMPDIR, which silently skips such a
    directory for /tmp: the run would use a /tmp shared with the node's other users instead of the
    job's own storage, unsaid. Checked where the components run: here, or inside the stack's job
    (not on the login node that submits it); $SLURM_TMPDIR and config scratch reach the components
    as they are, and their launcher checks them.
    """
    wanted = os.environ.get("TMPDIR")
    if (
        config["scratch"]
        or os.environ.get("SLURM_TMPDIR")
        or not wanted
        or submits_to_slurm()
    ):
        return
    if os.path.realpath(tempfile.gettempdir()) == os.path.realpath(wanted):
        return
    try:
        room = os.statvfs(wanted)
        why = (
            "read-only"
            if room.f_flag & os.ST_RDONLY
            else "full" if room.f_bavail == 0 else "not writable by you"
        )
    except OSError as exc:
        why = f"unusable ({exc.strerror})"
    fail_config(
        "scratch",
        f"$TMPDIR {wanted} (the run's scratch root) is {why}: Snakemake would give the jobs "
        f"{tempfile.gettempdir()} instead, unsaid; point $TMPDIR (or config scratch) at a writable, "
        "node-local directory",
    )


def mark_the_command():
    """The command that starts the run marks itself for every job of it (each attempt inherits the mark,
    and its launchers record it as the run's live command); a second start of a run another command
    runs is refused in one line naming that command. Inside the stack's job: the same command, marked.
    """
    if os.environ.get(ATTEMPTS.COMMAND_ENV):
        return
    state = Path(config["state_dir"], RUN)
    who = ATTEMPTS.live_elsewhere(state, None, SLURM.job_active)
    if who is not None:
        fail_config("already-running", ATTEMPTS.refusal(RUN, who))
    ATTEMPTS.mark(os.environ)


SERVICE_ORDER = service_order()
check_prerequisites()
check_tmpdir()
mark_the_command()


def script(name):
    """Path of a component script (an input, so that code changes rerun it).

    Scripts run from their own directory (not Snakemake's source cache) so they
    can import the shared ``allocstack`` package next to them.
    """
    return os.path.join(SCRIPTS, name)


def journal_path(wildcards):
    return f"{config['state_dir']}/{wildcards.run}/{NAMES.JOURNAL}"


def bind_paths(wildcards):
    """Host paths a containerised component needs (bound at the same place)."""
    return (
        config[RUNTIME]["binds"]
        + [
            f"results/{wildcards.run}",
            f"{config['state_dir']}/{wildcards.run}",
        ]
        + [
            os.path.dirname(os.path.abspath(path))
            for path in (config["tasks"], config["expected"])
            if path
        ]
    )


def expected_input(wildcards):
    """The expected document, when verification compares against one."""
    return [config["expected"]] if config["expected"] else []


def tasks_option(wildcards, input):
    return f"--tasks {shlex.quote(input.tasks[0])}" if input.tasks else ""


# validate_inputs' compact copy of the task set it validated: the coordinator loads it instead
# of decoding the task document again (while the summary's digests say it is that document's).
COMPACT_TASKS = "results/{run}/tasks.compact"


def compact_tasks_output():
    """validate_inputs' named output for the compact task set: only with a task document."""
    return {"compact": COMPACT_TASKS} if TASKS else {}


def compact_tasks_option(wildcards, output):
    return f"--compact-tasks {shlex.quote(output.compact)}" if TASKS else ""


def expected_option(wildcards, input):
    return f"--expected {shlex.quote(input.expected[0])}" if input.expected else ""


def launch(
    component,
    cpus=1,
    scratch=True,
    tolerate_kill=None,
    job_end_time=False,
    node=None,
    one_shot=False,
    beside=None,
    image=None,
):
    """Input function: the command that starts ``component`` (see workflow/scripts/launch.py).

    ``cpus`` is a number or a function of the wildcards (a service's own cpus).
    ``node(wildcards)`` is the allocation's node the component runs on (0, the default,
    is the first: where the group job, the coordinator, the gates and your services run).
    ``one_shot``: a component that runs once and needs no supervision (verification) is
    started as a plain process where launch.py would add nothing: no job step (outside an
    allocation, or slurm.job_steps false), no image, no scratch (one interpreter less).
    ``beside(wildcards)``: the component runs a program of yours in an image, so it runs beside that
    image on the node, not in ``image`` (see program_options). ``image(wildcards)``: the image it runs
    in instead of ``image`` (per-task workers: worker.image).
    """

    def command(wildcards, resources):
        in_step = config["slurm"]["job_steps"] and os.environ.get("SLURM_JOB_ID")
        own = image(wildcards) if image else None
        in_image = (
            (USE_IMAGE or bool(own))
            and IMAGES_ON
            and not (beside is not None and beside(wildcards))
        )
        if one_shot and not (scratch or in_image or in_step):
            return PYTHON
        argv = [
            PYTHON,
            # Absolute, like the component's own path when launch.py starts it as a child: a component that
            # runs in launch.py's process (outside an allocation, no image) is still found by its path.
            os.path.abspath(script("launch.py")),
            f"--component={component.format(wildcards=wildcards)}",
            f"--run={wildcards.run}",
            f"--scratch-root={config['scratch'] or ''}",
            f"--cpus={cpus(wildcards) if callable(cpus) else cpus}",
            f"--run-state={config['state_dir']}/{wildcards.run}",
        ]
        if not scratch:
            argv.append("--no-scratch")
        else:
            argv += [f"--volume={volume}" for volume in config["volumes"]]
        if job_end_time:
            argv.append("--job-end-time")
        if tolerate_kill:
            argv.append(f"--tolerate-kill={tolerate_kill.format(wildcards=wildcards)}")
        if node is not None and node(wildcards) > 0:
            argv.append(f"--node-index={node(wildcards)}")
        gpus = int(resources.get("gpu", 0) or 0)
        if config["slurm"]["job_steps"]:
            argv.append("--job-steps")
            argv += [f"--step-arg={arg}" for arg in config["slurm"]["step_args"]]
            if gpus:
                argv.append(f"--step-arg=--gpus={gpus}")
        if in_image:
            argv.append(f"--image={os.path.abspath(own or config['image'])}")
            argv.append(f"--runtime={RUNTIME}")
            runtime_args = config[RUNTIME]["args"]
            argv += [f"--runtime-arg={arg}" for arg in runtime_args]
            if gpus > 0 and RUNTIME == "apptainer" and "--nv" not in runtime_args:
                # GPUs requested: expose the driver (Charliecloud: ch-fromhost --nvidia
                # put it into the image once, see container/README.md)
                argv.append("--runtime-arg=--nv")
            argv.append(f"--runtime-hint={config[RUNTIME]['hint']}")
            argv += [f"--bind={path}" for path in bind_paths(wildcards)]
            argv += [f"--pass-env={name}" for name in env_references(config["worker"])]
        return shlex.join(argv) + " --"

    return command


def decision_facts(wildcards):
    """The run's settings that the decision record lists under its table (JSON)."""
    facts = {
        "image": config["image"],
        "container runtime": RUNTIME if USE_IMAGE else None,
        "scratch": config["scratch"] or "$SLURM_TMPDIR, else $TMPDIR",
        "state_dir": config["state_dir"],
        "job steps": config["slurm"]["job_steps"],
        "built-in coordinator": TASKS,
        "workers": f"{config['workers']} ({config['worker']['mode']})",
        "nodes": NODES,
        "services": ", ".join(SERVICE_ORDER) or "none",
        "volumes": ", ".join(config["volumes"]) or "none",
    }
    if NODES > 1:
        interface = config["network"]["interface"]
        facts["bind address (network.interface)"] = (
            f"the IPv4 address of interface {interface} on the first node"
            if interface
            else "the address the first node's hostname resolves to"
        )
        facts["off-node encryption (network.tls)"] = (
            "TLS, certificate made at start for this run, clients pin its SHA-256 fingerprint"
            if config["network"]["tls"]
            else "NONE: plain text with the bearer token only (network.tls: false)"
        )
        if SERVICES:
            facts["your services across nodes"] = (
                "on the first node's loopback, relayed to the other nodes over TLS with "
                "their own per-run certificates, pinned (allocstack/tunnel.py)"
            )
        facts["how other nodes get the endpoint and token"] = (
            f"{shared_dir(wildcards)}/{NAMES.ENDPOINT} (and {NAMES.SERVICES}/NAME.json), mode 0600 in a "
            "0700 directory on the filesystem the nodes share; never in the environment, a "
            "command line or a Slurm RPC (not encrypted by Slurm)"
        )
    return json.dumps(facts)


def decision_summary():
    """One line for --dry-run: who owns each of the five things."""
    names = {
        "allocation": "allocation",
        "startup_order": "startup order",
        "runtime_state": "runtime state",
        "service_access": "access",
        "accelerators": "accelerators",
    }
    return "decisions: " + "; ".join(
        f"{names[key]}: {config['decisions'][key]['owner']}" for key in names
    )


def tasks_input(wildcards):
    """The task document, when the built-in coordinator runs (config tasks)."""
    return [config["tasks"]] if TASKS else []


def service_file(name):
    return f"results/{RUN}/services/{name}.service"


def service_gate(name):
    return f"results/{RUN}/services/{name}-readiness.json"


def gate_timeout(name):
    """Seconds from a service's start to ready: its own readiness.timeout, else the stack's."""
    return SERVICES[name]["readiness"]["timeout"] or config["readiness"]["timeout"]


def start_bound(name):
    """Seconds until ``name`` has published its endpoint at the latest: its dependencies' gates, then its start."""
    dependencies = SERVICES[name]["depends_on"]
    return SERVICE_START_SECONDS + max(
        (start_bound(d) + gate_timeout(d) for d in dependencies), default=0
    )


def gates_timeout():
    """Bound on waiting for every gate (workers): the slowest gate, plus a margin."""
    bounds = [start_bound(name) + gate_timeout(name) for name in SERVICES]
    if TASKS:
        bounds.append(config["readiness"]["timeout"])
    return max(bounds, default=0) + 30


def options(pairs, flags=()):
    """A shell-quoted option string from (option, value) pairs and bare flags."""
    argv = [f"{option}={value}" for option, value in pairs] + list(flags)
    return shlex.join(argv)


def uses(names):
    return [("--uses", name) for name in names]


def program_options(spec, with_command=True):
    """Where a program of yours runs and what: its command (none: its image's own), and its image, mounts,
    working directory and entrypoint for the supervisor that starts it there (allocstack/program.py).
    """
    pairs = []
    if with_command and spec["command"]:
        pairs.append(("--command-json", json.dumps(spec["command"])))
    if spec.get("mounts"):
        pairs.append(("--mounts-json", json.dumps(spec["mounts"])))
    if spec.get("working_dir"):
        pairs.append(("--working-dir", spec["working_dir"]))
    if spec.get("entrypoint"):
        pairs.append(("--entrypoint-json", json.dumps(spec["entrypoint"])))
    image = program_image(spec)
    if image:
        pairs += [("--image", os.path.abspath(image)), ("--runtime", RUNTIME)]
        pairs += [("--runtime-arg", arg) for arg in config[RUNTIME]["args"]]
        pairs += [
            ("--bind", os.path.abspath(path)) for path in config[RUNTIME]["binds"]
        ]
    return pairs


def service_beside(wildcards):
    """Your service runs in an image: its supervisor (and its gate) run beside it on the node."""
    return bool(program_image(SERVICES[wildcards.service]))


def worker_beside(wildcards):
    """Long-running workers in an image: each replica's supervisor runs beside it (per-task workers run
    allocstack's worker.py in worker.image, see worker_image)."""
    return LONG_RUNNING and bool(program_image(config["worker"]))


def worker_image(wildcards):
    """The image per-task workers run allocstack's worker in: worker.image (None: ``image``)."""
    return config["worker"]["image"] if not LONG_RUNNING and IMAGES_ON else None


def check_beside(wildcards):
    """Your check runs in an image: check.py (or verify.py with its command) runs beside it."""
    return bool(program_image(config["verify"])) and (
        not TASKS or bool(config["verify"]["command"])
    )


def image_checks(wildcards):
    """validate_inputs' checks of the programs' images before anything starts: each sidecar, and what the
    run takes from an image (its own command, the port it EXPOSEs), as JSON."""
    parts = dict(parts_of_yours())
    checks = []
    for key, image in program_images().items():
        spec = parts[key]
        own_command = not (spec["command"] or spec["entrypoint"]) and (
            key != "worker" or LONG_RUNNING
        )
        checks.append(
            {
                "what": key,
                "image": image,
                "command": own_command,
                "port": spec.get("port") == "image",
                "mounts": spec.get("mounts", []),
            }
        )
    return json.dumps(checks)


def service_options(wildcards):
    """app_service.py options for services.<name>."""
    spec = SERVICES[wildcards.service]
    port = [("--port", spec["port"] or 0)] if spec["port"] != "image" else []
    return options(
        [
            ("--name", wildcards.service),
            *program_options(spec),
            ("--environment-json", json.dumps(spec["environment"])),
            *port,
            ("--gate-timeout", start_bound(wildcards.service)),
            ("--stop-grace", spec["stop_grace_period"]),
            *uses(spec["depends_on"]),
            *[("--gate-record", service_gate(d)) for d in spec["depends_on"]],
        ],
        ["--port-from-image"] if spec["port"] == "image" else [],
    )


def service_dependencies(wildcards):
    """The service files of what it depends on: kept alive together, and visible in the DAG."""
    return [service_file(d) for d in SERVICES[wildcards.service]["depends_on"]]


def service_cpus(wildcards):
    return SERVICES[wildcards.service]["cpus"]


def service_gate_options(wildcards):
    """readiness.py options for services.<name>.readiness."""
    name = wildcards.service
    ready = SERVICES[name]["readiness"]
    pairs = [
        ("--service", name),
        ("--mode", ready["mode"]),
        ("--timeout", gate_timeout(name)),
        ("--interval", ready["interval"] or config["readiness"]["interval"]),
        ("--probe-timeout", ready["probe_timeout"]),
        ("--start-timeout", start_bound(name)),
        *uses(SERVICES[name]["depends_on"]),
    ]
    if ready["mode"] == "http":
        pairs += [
            ("--path", ready["path"]),
            ("--expect-json", json.dumps(ready["expect"])),
        ]
    if ready["mode"] == "command":
        pairs.append(("--ready-command-json", json.dumps(ready["command"])))
        # in the service's image, as Compose runs a healthcheck in the service's container
        pairs += [
            pair
            for pair in program_options(SERVICES[name], with_command=False)
            if pair[0] != "--entrypoint-json"
        ]
    return options(pairs)


def all_service_files(wildcards):
    return [service_file(name) for name in SERVICES]


def worker_inputs(wildcards):
    """What keeps the services alive while a worker runs: the coordinator's and your services' files."""
    coordinator = [f"results/{wildcards.run}/coordinator.service"] if TASKS else []
    return coordinator + all_service_files(wildcards)


def gate_records(wildcards):
    """The gate records a worker waits for: the coordinator's, every service's, and off the
    first node its node's (the coordinator is reachable from there)."""
    records = [f"results/{wildcards.run}/readiness.json"] if TASKS else []
    records += [service_gate(name) for name in SERVICES]
    if NODES > 1 and worker_node(wildcards) > 0:
        records.append(node_gate_record(wildcards, worker_node(wildcards) + 1))
    return options([("--gate-record", record) for record in records])


def worker_options(wildcards):
    """worker.py (per-task) or replica.py (long-running) options, besides the gates and the record."""
    worker = config["worker"]
    program = [
        ("--environment-json", json.dumps(worker["environment"])),
        *uses(SERVICES),
    ]
    if LONG_RUNNING:
        program += program_options(worker)
    elif worker["command"]:
        program.append(("--command-json", json.dumps(worker["command"])))
    if LONG_RUNNING:
        return options(
            [
                ("--index", WORKER_IDS.index(wildcards.worker)),
                ("--workers", config["workers"]),
                *program,
            ],
            ["--uses-coordinator"] if TASKS else [],
        )
    return options(
        [
            ("--batch", worker["batch"]),
            ("--wait-timeout", worker["wait_timeout"]),
            ("--connect-timeout", worker["connect_timeout"]),
            ("--lease-seconds", config["coordinator"]["lease_seconds"]),
            ("--simulate-seconds", config["simulate"]["task_seconds"]),
            ("--task-timeout", worker["task_timeout"]),
            *program,
        ]
    )


def worker_records(wildcards):
    return expand(f"results/{wildcards.run}/workers/{{worker}}.json", worker=WORKER_IDS)


def check_inputs(wildcards):
    """run_check consumes your services' files (they stay up while it runs) and waits for the
    workers itself; with no services, the workers' records are its plain inputs."""
    return all_service_files(wildcards) or worker_records(wildcards)


def check_options(wildcards):
    check = config["verify"]
    return options(
        [
            *program_options(check),
            ("--environment-json", json.dumps(check["environment"])),
            *uses(SERVICES),
            *[("--wait-for", record) for record in worker_records(wildcards)],
        ]
    )


def check_record(wildcards):
    return [f"results/{wildcards.run}/check.json"] if CHECK_IN_STACK else []


def coordinator_outputs(wildcards):
    """The built-in coordinator's results and end record (with config tasks)."""
    if not TASKS:
        return {}
    return {
        "results": f"results/{wildcards.run}/results.json",
        "end_record": f"results/{wildcards.run}/coordinator.json",
        "gate": f"results/{wildcards.run}/readiness.json",
    }


#: verify.command runs after collect_results with the built-in coordinator: then
#: the named volumes must outlive collection, and verification removes the scratch.
VOLUMES_AFTER_COLLECT = (
    TASKS and bool(config["volumes"]) and bool(config["verify"]["command"])
)


def collect_options(wildcards):
    components = list(SERVICES)
    if LONG_RUNNING:
        components += WORKER_IDS
    if CHECK_IN_STACK:
        components.append("check")
    grace = max((spec["stop_grace_period"] for spec in SERVICES.values()), default=0)
    return options(
        [("--service", name) for name in SERVICES]
        + [("--component", name) for name in components]
        + [("--stop-timeout", grace + 15)],
        ["--keep-scratch"] if VOLUMES_AFTER_COLLECT else [],
    )


def verify_options(wildcards, input):
    """verify.py options: the coordinator's results (with tasks), or your check's record; the gate order
    in the event log when there is a gate (a stack of workers and a check alone has none).
    """
    pairs = [("--services-record", input.services)]
    if TASKS or SERVICES:
        pairs.append(("--events", input.events))
    if TASKS:
        pairs += [
            ("--input", input.tasks[0]),
            ("--results", input.results),
            ("--end-record", input.end_record),
            ("--inputs-summary", input.validated),
            ("--environment-json", json.dumps(config["verify"]["environment"])),
        ]
        if input.expected:
            pairs.append(("--expected", input.expected[0]))
        if config["verify"]["command"]:
            pairs += program_options(config["verify"])
    else:
        pairs.append(("--check-record", input.check[0]))
    return options(pairs)


#: Seconds the "Waiting at most ..." message of a service's consumer waits for its service file.
SERVICE_FILE_WAIT = 0.5


# The terminal during and after a run.
class TerminalFilter(logging.Filter):
    """What Snakemake prints on the terminal, made readable for the person watching.

    * "Waiting at most N seconds for missing files: results/<run>/coordinator.service" is
      normal: the consumers of a service start with it and wait until its process is up.
      Dropped when every missing file is a service file. Snakemake checks again right after
      this message and then once a second; the service's shell creates its file first thing,
      within milliseconds, so the message waits for the files up to SERVICE_FILE_WAIT seconds
      (the consumers then start at once instead of a second later, which was most runs).
    * The coordinator draws a live progress line on a terminal (it ends in no newline):
      Snakemake's next message erases it first instead of being glued to its end; the
      coordinator redraws it below within half a second.
    """

    clear_line = sys.stderr.isatty() and sys.stdout.isatty()

    def filter(self, record):
        message = record.getMessage()
        services = [
            line.removesuffix(" (missing locally)") for line in message.splitlines()[1:]
        ]
        if message.startswith("Waiting at most") and all(
            path.startswith("results/") and path.endswith(".service")
            for path in services
        ):
            deadline = time.monotonic() + SERVICE_FILE_WAIT
            while time.monotonic() < deadline and not all(
                os.path.exists(path) for path in services
            ):
                time.sleep(0.002)
            return False
        if self.clear_line and record.levelno >= logging.INFO:
            sys.stderr.write("\r\033[K")
            sys.stderr.flush()
        return True


if not any(type(f).__name__ == "TerminalFilter" for f in logger.filters):
    logger.addFilter(TerminalFilter())


def end_of_run_summary(outcome):
    """Snakemake's onsuccess/onerror: the run's verdict, counts, wall time and where things are.

    ``status.py --end-of-run`` renders it from the run's records (and, after an error, the
    allocstack error lines of this run's logs), so it is the last thing on the terminal.
    """
    subprocess.run(
        [
            sys.executable,
            script("status.py"),
            f"--run={RUN}",
            f"--end-of-run={outcome}",
            f"--since={STARTED_AT}",
        ],
        check=False,
        timeout=60,
    )


def shared_dir(wildcards):
    """The run's state directory (0700, on the filesystem every node shares): with more
    than one node, the endpoint document for the other nodes and their event logs."""
    return f"{config['state_dir']}/{wildcards.run}"


def shared_endpoint(wildcards):
    """The coordinator's endpoint document for the other nodes (see shared_dir)."""
    return f"{shared_dir(wildcards)}/{NAMES.ENDPOINT}"


def node_gate_events(wildcards):
    """The event log of the gate of node ``wildcards.node`` (see shared_dir)."""
    gate = f"gate-node-{wildcards.node}"
    events = NAMES.component_events(gate)
    return f"{shared_dir(wildcards)}/{events}"


def worker_node(wildcards):
    """The node (0 = the first) that runs ``wildcards.worker``: balanced blocks, so
    worker-01.. fill the first node, and the first ``workers % nodes`` nodes get one more.
    """
    number = int(wildcards.worker.split("-")[1]) - 1
    per_node, extra = divmod(config["workers"], NODES)
    big = extra * (per_node + 1)
    if number < big:
        return number // (per_node + 1)
    return extra + (number - big) // per_node


def node_gate_record(wildcards, node):
    """The gate record of node ``node`` (1-based, above 1): it reached the coordinator."""
    return f"results/{wildcards.run}/gates/node-{node}.json"


def network_options(name):
    """Input function: with more than one node, a service of the first node also listens on its
    network address (config network.*) and publishes that for the other nodes as ``name``
    (in the run's state directory; ``{service}`` is the wildcard)."""

    def arguments(wildcards):
        if NODES == 1:
            return ""
        published = name.format(**dict(wildcards.items()))
        return shlex.join(network_arguments(f"{shared_dir(wildcards)}/{published}"))

    return arguments


def network_arguments(published):
    """coordinator.py / app_service.py arguments: listen for the other nodes as config network.* says."""
    argv = [f"--network-endpoint-file={published}"]
    if config["network"]["interface"]:
        argv.append(f"--interface={config['network']['interface']}")
    if not config["network"]["tls"]:
        argv.append("--no-tls")
    return argv


def worker_network_options(wildcards):
    """With more than one node: the worker's event log in the shared directory, and off the
    first node the endpoints published for the other nodes (the coordinator's, your service's).
    """
    if NODES == 1:
        return ""
    shared = shared_dir(wildcards)
    argv = [f"--events={shared}/{NAMES.component_events(wildcards.worker)}"]
    if worker_node(wildcards) > 0:
        argv.append(f"--endpoint-file={shared_endpoint(wildcards)}")
        # A long-running worker may use the coordinator through a tunnel too.
        if SERVICES or LONG_RUNNING:
            argv.append(f"--remote-services={shared}/{NAMES.SERVICES}")
    return shlex.join(argv)


def stack_resources():
    """The stack's allocation, carried by the coordinator's job (Snakemake combines a group's resources).

    One node: the coordinator's CPUs (the workers and your services add theirs). More: the
    nodes, one task per node, and CPUs per task for the busiest node (the workers then add
    none; your services, all on the first node, add theirs).
    """
    if NODES == 1:
        return {"cpus_per_task": config["coordinator"]["cpus"]}
    return {"cpus_per_task": node_cpus(services=False), "nodes": NODES, "tasks": NODES}


def node_gate_records(wildcards):
    """Every other node's gate record (none with one node)."""
    return [node_gate_record(wildcards, node) for node in range(2, NODES + 1)]


def gate_node(wildcards):
    """The node (0 = the first) of the gate ``await_network`` runs for node ``wildcards.node`` (1-based)."""
    return int(wildcards.node) - 1
