# The adapter between Snakemake and the plan (workflow/scripts/allocstack/plan/): the world
# gathered into Facts, PLAN = plan.load(config, facts), a refusal as ONE line and its exit code,
# the few side effects, and input functions that each ask the plan. No rules here; nothing
# is decided here.
import getpass
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

from snakemake.logging import logger
from snakemake.shell import shell
from snakemake.sourcecache import LocalSourceFile

STARTED_AT = time.time()


def scripts_dir():
    """The component scripts, next to this file (also when allocstack is a module of another
    workflow), relative to the working directory like every other path of a rule."""
    here = workflow.current_basedir
    if not isinstance(here, LocalSourceFile):
        # errors.py is not importable yet (it is found through this path): 78 is [config]'s code.
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
if os.path.abspath(SCRIPTS) not in sys.path:
    sys.path.insert(0, os.path.abspath(SCRIPTS))

from allocstack import plan  # noqa: E402  (found through SCRIPTS)
from allocstack.common import attempts, errors, identity, slurm  # noqa: E402
from allocstack.status import exitcode, interrupt  # noqa: E402
from allocstack.status.terminal import TerminalFilter  # noqa: E402


def world():
    """What the plan is made for: this Snakemake, this process, this host, this Slurm."""
    resources = workflow.resource_settings.default_resources or {}
    return plan.Facts(
        scripts=SCRIPTS,
        cwd=os.getcwd(),
        python=sys.executable,
        deployment=frozenset(map(str, workflow.deployment_settings.deployment_method)),
        default_resources={name: value.raw for name, value in resources.items()},
        skip_validation=workflow.modifier.skip_validation,
        environ=dict(os.environ),
        user=getpass.getuser(),
        hostname=socket.gethostname(),
        which=shutil.which,
        slurm_query=slurm.query,
        tempdir=tempfile.gettempdir(),
        statvfs=os.statvfs,
        sysctl=plan.read_setting,
    )


try:
    PLAN = plan.load(config, world())
except plan.PlanError as refusal:
    # Stop before anything runs: ONE allocstack line and the diagnostic's exit code (no traceback).
    sys.exit(errors.report(refusal))
os.environ.update(PLAN.environment)


def mark_the_command():
    """The command that starts the run marks itself for every job of it (each attempt inherits the
    mark, and its launchers record it as the run's live command); a second start of a run another
    command runs is refused in one line naming that command. Inside the stack's job: the same
    command, marked already."""
    if os.environ.get(attempts.COMMAND_ENV):
        return
    state = Path(PLAN.files(PLAN.run).state)
    who = attempts.live_elsewhere(state, None, slurm.job_active)
    if who is not None:
        refusal = errors.AllocstackError(
            "already-running", attempts.refusal(PLAN.run, who)
        )
        sys.exit(errors.report(refusal))
    attempts.mark(os.environ)
    if attempts.runs_jobs(sys.argv[1:]):
        start_clean()


def start_clean():
    """A command that finds an earlier attempt's records without its success marker (it failed or was
    interrupted) sets them aside, so that the stack runs again from the start against fresh volumes and
    every record read is this attempt's (the built-in coordinator's journal still resumes).
    """
    files = PLAN.files(PLAN.run)
    try:
        moved = attempts.set_aside(
            Path(files.results),
            Path(files.marker),
            plan.layout.BEFORE_THE_STACK,
            plan.layout.EARLIER_ATTEMPT,
        )
    except OSError as exc:
        refusal = errors.AllocstackError(
            "io",
            f"cannot set aside an earlier attempt's records in {files.results}: {exc.strerror}",
        )
        sys.exit(errors.report(refusal))
    if moved:
        logger.info(
            f"allocstack: an earlier attempt of run {PLAN.run} ended without its marker: its records "
            f"set aside in {files.results}/{plan.layout.EARLIER_ATTEMPT}/; the stack starts again"
        )


def running_jobs():
    """The processes of the jobs Snakemake runs on this machine now (Snakemake keeps them in shell._processes)."""
    with shell._lock:
        return [process.pid for process in shell._processes.values()]


def stop_scheduling():
    """Snakemake's own graceful stop (its SIGTERM handler): no job starts any more, it ends once the running did."""
    workflow.scheduler.exit_gracefully()


# The command that starts the run (not the Snakemake inside its job): Ctrl-C interrupts it.
if not os.environ.get(attempts.COMMAND_ENV):
    interrupt.install(
        interrupt.Snakemake(
            jobs=running_jobs,
            scheduling=lambda: workflow.scheduler is not None,
            stop=stop_scheduling,
            local=lambda: workflow.local_exec,
        )
    )
mark_the_command()
if not any(type(f).__name__ == "TerminalFilter" for f in logger.filters):
    logger.addFilter(TerminalFilter())

#: The rules' patterns: the files of the run "{run}".
FILES = PLAN.files("{run}")
STACK_ENV = "../envs/stack.yaml"


wildcard_constraints:
    run=r"[A-Za-z0-9][A-Za-z0-9._-]*",
    worker=r"worker-[0-9]+",
    step=r"workers-[0-9]+",
    service="|".join(re.escape(name) for name in PLAN.config["services"]) or "(?!)",
    node=r"[0-9]+",


def script(name):
    """Path of a component script (an input, so that code changes rerun it).

    Scripts run from their own directory (not Snakemake's source cache) so they
    can import the shared ``allocstack`` package next to them.
    """
    return PLAN.script(name)


def launch(component):
    """Input function: the command that starts ``component`` (launch.py's part, see plan/argv.py)."""

    def command(wildcards, resources):
        return shlex.join(PLAN.launch(component, resources.get("gpu"), **wildcards))

    return command


def args(component):
    """Input function: the options of ``component``'s script (see plan/argv.py)."""
    return lambda wildcards: shlex.join(PLAN.args(component, **wildcards))


# Input functions (and per-job resources), each a question to the plan for the job's wildcards.
tasks_input = lambda wildcards: PLAN.tasks_input()
expected_input = lambda wildcards: PLAN.expected_input()
program_files = lambda wildcards: PLAN.program_files()
image_sidecar = lambda wildcards: PLAN.image_sidecar()
coordinator_outputs = lambda wildcards: PLAN.coordinator_outputs(wildcards.run)
service_dependencies = lambda wildcards: PLAN.service_dependencies(
    wildcards.run, wildcards.service
)
service_cpus = lambda wildcards: PLAN.config["services"][wildcards.service]["cpus"]
service_gpus = lambda wildcards: PLAN.config["services"][wildcards.service]["gpus"]
service_gates = lambda wildcards: PLAN.service_gates(wildcards.run)
worker_inputs = lambda wildcards: PLAN.worker_inputs(wildcards.run)
worker_records = lambda wildcards: PLAN.worker_records(wildcards.run)
main_inputs = lambda wildcards: PLAN.main_inputs(wildcards.run)
main_cpus = lambda wildcards: PLAN.main_cpus
main_records = lambda wildcards: PLAN.main_records(wildcards.run)
step_cpus = lambda wildcards: PLAN.step_cpus(wildcards.step)
check_inputs = lambda wildcards: PLAN.check_inputs(wildcards.run)
check_records = lambda wildcards: PLAN.check_records(wildcards.run)
node_gates = lambda wildcards: PLAN.node_gates(wildcards.run)
stack_services = lambda wildcards: PLAN.stack_services(wildcards.run)
network_held = lambda w: PLAN.stack_network(w.run, PLAN.node_of(dict(w.items())))


def start_of_run():
    """Snakemake's onstart (a run): SIGTERM interrupts as Ctrl-C does; --forcerun serve_coordinator starts over."""
    interrupt.take_sigterm()
    dag = workflow.dag_settings
    if not PLAN.starts_over(dag.forcerun, dag.forceall):
        return
    aside = identity.set_aside(Path(PLAN.layout.journal))
    if aside is not None:
        print(PLAN.started_over(aside), file=sys.stderr, flush=True)


def refuse_what_cannot_run():
    """Snakemake's onstart (a run, not a dry run): what the plan refuses only to run, ONE line and its exit code."""
    try:
        PLAN.before_running()
    except plan.PlanError as refusal:
        sys.exit(errors.report(refusal))


def this_command():
    """The command line that started this Snakemake: what resumes an interrupted run."""
    program = sys.argv[0]
    found = shutil.which(os.path.basename(program))
    if found and os.path.realpath(found) == os.path.realpath(program):
        program = os.path.basename(program)
    return shlex.join([program, *sys.argv[1:]])


def end_of_run_summary(outcome):
    """Snakemake's onsuccess/onerror: the run's verdict, counts, wall time and where things are.
    ``status.py --end-of-run`` renders it from the run's records (and, after an error, the
    allocstack error lines of this run's logs), so it is the last thing on the terminal. After
    Ctrl-C: INTERRUPTED, what was done and the command that resumes (its own session: another
    Ctrl-C does not cut it short). Its exit code: allocstack/status/exitcode.py.
    """
    if interrupt.STATE.interrupted:
        outcome = "interrupted"
    exitcode.settle(outcome, PLAN.layout.marker, PLAN.layout.main_log, STARTED_AT)
    command = PLAN.end_of_run(outcome, STARTED_AT, this_command())
    subprocess.run(command, check=False, timeout=60, start_new_session=True)
