# Helpers shared by the rules: names, paths and the component launch command.
# No rules here.
import getpass
import importlib.util
import json
import logging
import os
import shlex
import shutil
import socket
import subprocess
import sys
import time

import jsonschema
import yaml
from snakemake.exceptions import WorkflowError
from snakemake.logging import logger
from snakemake.settings.types import DeploymentMethod
from snakemake.sourcecache import LocalSourceFile
from snakemake.utils import validate

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
    standard library): errors.py (the diagnostic ids and exit codes), slurm.py (Slurm's answers).
    """
    spec = importlib.util.spec_from_file_location(
        f"allocstack_{name}", os.path.join(SCRIPTS, "allocstack", f"{name}.py")
    )
    loaded = sys.modules[spec.name] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(loaded)
    return loaded


ERRORS = allocstack_module("errors")


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


def validate_config():
    """Validate (and fill defaults of) the config; a violation is ONE line naming the key."""
    schema_path = workflow.source_path("../schemas/config.schema.yaml")
    with open(schema_path) as handle:
        schema = yaml.safe_load(handle)
    nulls_from_command_line(config, schema)
    try:
        validate(config, schema_path)
    except WorkflowError:
        validator = jsonschema.Draft202012Validator(schema)
        error = jsonschema.exceptions.best_match(validator.iter_errors(config))
        key = ".".join(str(part) for part in error.absolute_path) or "config"
        fail_config("config", f"{key}: {error.message}")


validate_config()

RUN = config["run"]
WORKER_IDS = [f"worker-{i:02d}" for i in range(1, config["workers"] + 1)]
# Under --sdm conda the rule's environment provides python; otherwise the
# interpreter running Snakemake (the venv from requirements.txt) does.
PYTHON = (
    "python"
    if DeploymentMethod.CONDA in workflow.deployment_settings.deployment_method
    else sys.executable
)
STACK_ENV = "../envs/stack.yaml"
USE_IMAGE = (
    bool(config["image"])
    and DeploymentMethod.APPTAINER in workflow.deployment_settings.deployment_method
)


wildcard_constraints:
    run=r"[A-Za-z0-9][A-Za-z0-9._-]*",
    worker=r"worker-[0-9]+",


def submits_to_slurm():
    """True when this Snakemake is about to submit to Slurm (not when it runs inside a job)."""
    resources = workflow.resource_settings.default_resources or {}
    slurm_keys = {"slurm_account", "slurm_partition"} & set(resources.keys())
    return bool(slurm_keys) and not os.environ.get("SLURM_JOB_ID")


def largest_node_cpus():
    """CPUs of the largest node Slurm reports (``sinfo``), or None if it cannot tell."""
    try:
        listing = subprocess.run(
            ["sinfo", "--noheader", "--Node", "--format=%c"],
            capture_output=True,
            text=True,
            timeout=15,
            check=False,
        ).stdout
        return max(int(cpus.rstrip("+")) for cpus in listing.split())
    except (OSError, subprocess.TimeoutExpired, ValueError):
        return None


def check_cluster_settings(cpus):
    """Refuse what Slurm would refuse or never run, before anything is submitted (one line).

    An account that does not exist or that the user may not use, a partition that does not
    exist, a runtime above the partition's MaxTime, memory above its largest node's.
    """
    slurm = allocstack_module("slurm")
    resources = workflow.resource_settings.default_resources or {}
    components = config["workers"] + 2 + (2 if config["service"]["command"] else 0)
    submission = slurm.submission_from_resources(
        {name: resource.raw for name, resource in resources.items()},
        components=components,
        cpus=cpus,
        user=getpass.getuser(),
    )
    problem = slurm.submission_problem(submission, slurm.gather_facts(submission))
    if problem is not None:
        fail_config("config", f"default-resources {problem[1]}")


def check_allocation_host():
    """Inside an allocation you hold (``salloc``, then snakemake): Snakemake must run on its node.

    The components are job steps that talk over loopback, pinned to the node launch.py runs
    on; run from a login node they would be placed elsewhere and never meet. Inside a job
    step (the plugin's job, ``srun --pty``) Slurm names the node: nothing to check.
    """
    job = os.environ.get("SLURM_JOB_ID")
    if not job or os.environ.get("SLURMD_NODENAME") or not config["slurm"]["job_steps"]:
        return
    nodes = allocstack_module("slurm").allocation_nodes(
        os.environ.get("SLURM_JOB_NODELIST", "")
    )
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


def check_prerequisites():
    check_input_files()
    needed = sum(
        [config["workers"] * config["worker"]["cpus"], config["coordinator"]["cpus"]]
    )
    max_cpus = config["slurm"]["max_cpus"]
    source = "slurm.max_cpus"
    if max_cpus is None and submits_to_slurm():
        max_cpus, source = largest_node_cpus(), "the largest node in sinfo"
    if max_cpus is not None and needed > max_cpus:
        fail_config(
            "config",
            f"workers={config['workers']} needs {needed} CPUs in one allocation (workers x "
            f"worker.cpus, plus coordinator.cpus) but {source} has {max_cpus}: the job "
            "would pend forever; lower workers (or set slurm.max_cpus)",
        )
    if submits_to_slurm():
        check_cluster_settings(needed)
    check_allocation_host()
    ready = config["service"]["readiness"]
    if (
        config["service"]["command"]
        and ready["mode"] == "command"
        and not ready["command"]
    ):
        fail_config(
            "config",
            "service.readiness.mode is command but service.readiness.command is null",
        )
    if not config["expected"] and not config["verify"]["command"]:
        fail_config(
            "config",
            "expected is null and verify.command is not set: nothing would say "
            "whether the results are correct; set one of them",
        )
    if USE_IMAGE and shutil.which("apptainer") is None:
        fail_config(
            "prerequisite",
            f"image is set and --sdm apptainer is on, but apptainer is not on PATH; "
            f"{config['apptainer']['hint']}",
        )


check_prerequisites()


def script(name):
    """Path of a component script (an input, so that code changes rerun it).

    Scripts run from their own directory (not Snakemake's source cache) so they
    can import the shared ``allocstack`` package next to them.
    """
    return os.path.join(SCRIPTS, name)


def journal_path(wildcards):
    return f"{config['state_dir']}/{wildcards.run}/journal.jsonl"


def bind_paths(wildcards):
    """Host paths a containerised component needs (bound at the same place)."""
    return (
        config["apptainer"]["binds"]
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


def command_option(command):
    """``--command-json '[...]'`` for a user's program (worker or verify), or nothing."""
    return f"--command-json {shlex.quote(json.dumps(command))}" if command else ""


def expected_input(wildcards):
    """The expected document, when verification compares against one."""
    return [config["expected"]] if config["expected"] else []


def expected_option(wildcards, input):
    return f"--expected {shlex.quote(input.expected[0])}" if input.expected else ""


def launch(component, cpus=1, scratch=True, tolerate_kill=None, job_end_time=False):
    """Input function: the command that starts ``component`` (see workflow/scripts/launch.py)."""

    def command(wildcards, resources):
        argv = [
            PYTHON,
            script("launch.py"),
            f"--component={component.format(wildcards=wildcards)}",
            f"--run={wildcards.run}",
            f"--scratch-root={config['scratch'] or ''}",
            f"--cpus={cpus}",
        ]
        if not scratch:
            argv.append("--no-scratch")
        if job_end_time:
            argv.append("--job-end-time")
        if tolerate_kill:
            argv.append(f"--tolerate-kill={tolerate_kill.format(wildcards=wildcards)}")
        gpus = int(resources.get("gpu", 0) or 0)
        if config["slurm"]["job_steps"]:
            argv.append("--job-steps")
            argv += [f"--step-arg={arg}" for arg in config["slurm"]["step_args"]]
            if gpus:
                argv.append(f"--step-arg=--gpus={gpus}")
        if USE_IMAGE:
            argv.append(f"--image={os.path.abspath(config['image'])}")
            argv += [f"--apptainer-arg={arg}" for arg in config["apptainer"]["args"]]
            if gpus > 0 and "--nv" not in config["apptainer"]["args"]:
                argv.append("--apptainer-arg=--nv")  # GPUs requested: expose the driver
            argv.append(f"--apptainer-hint={config['apptainer']['hint']}")
            argv += [f"--bind={path}" for path in bind_paths(wildcards)]
        return shlex.join(argv) + " --"

    return command


def decision_facts(wildcards):
    """The run's settings that the decision record lists under its table (JSON)."""
    return json.dumps(
        {
            "workers": config["workers"],
            "image": config["image"],
            "scratch": config["scratch"] or "$SLURM_TMPDIR, else $TMPDIR",
            "state_dir": config["state_dir"],
            "job steps": config["slurm"]["job_steps"],
        }
    )


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


def app_readiness_options():
    """readiness.py options for config service.readiness."""
    ready = config["service"]["readiness"]
    options = [f"--mode={ready['mode']}"]
    if ready["mode"] == "http":
        options += [
            f"--path={ready['path']}",
            f"--expect-json={json.dumps(ready['expect'])}",
        ]
    if ready["mode"] == "command":
        options.append(f"--ready-command-json={json.dumps(ready['command'])}")
    return shlex.join(options)


def app_service_inputs(wildcards):
    """The own service's service file, so workers keep it alive (nothing without one)."""
    return (
        [f"results/{wildcards.run}/app.service"] if config["service"]["command"] else []
    )


def gate_records(wildcards):
    """The gate record(s) a worker waits for: the coordinator's, and the own service's."""
    records = [f"results/{wildcards.run}/readiness.json", *app_gate_record(wildcards)]
    return " ".join(f"--gate-record {record}" for record in records)


def app_gate_record(wildcards):
    return (
        [f"results/{wildcards.run}/app-readiness.json"]
        if config["service"]["command"]
        else []
    )


# The terminal during and after a run.
class TerminalFilter(logging.Filter):
    """What Snakemake prints on the terminal, made readable for the person watching.

    * "Waiting at most N seconds for missing files: results/<run>/coordinator.service" is
      normal: the consumers of a service start with it and wait (Snakemake polls once a
      second) until its process is up. Dropped when every missing file is a service file.
    * The coordinator draws a live progress line on a terminal (it ends in no newline):
      Snakemake's next message erases it first instead of being glued to its end; the
      coordinator redraws it below within half a second.
    """

    clear_line = sys.stderr.isatty() and sys.stdout.isatty()

    def filter(self, record):
        message = record.getMessage()
        if message.startswith("Waiting at most") and all(
            line.startswith("results/") and line.endswith(".service (missing locally)")
            for line in message.splitlines()[1:]
        ):
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
