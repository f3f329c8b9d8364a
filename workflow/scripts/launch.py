#!/usr/bin/env python3
"""Start one stack component: as a Slurm job step when inside an allocation, in the image when one is set.

This is where a Compose service becomes a program the scheduler launches and
tracks. ``launch.py [options] -- SCRIPT [ARGS...]`` resolves the run's job-scoped
scratch (creating it 0700), then runs and supervises::

    [srun STEP_ARGS...] [apptainer exec APPTAINER_ARGS... --bind ... IMAGE] python SCRIPT ARGS...

* ``srun`` is used when ``--job-steps`` is on and ``$SLURM_JOB_ID`` is set, so
  ``sacct -j JOB`` lists the component as its own step with its own state and
  CPU time. Outside Slurm the component is a plain process.
* ``apptainer exec`` is used when ``--image`` is given; paths are bound at the
  same location inside the container (scripts read-only, plus scratch and the
  paths in ``--bind``), so the command line needs no rewriting.
* ``--volume NAME`` (a Compose named volume) is the directory ``SCRATCH/volumes/NAME``,
  named to the component in ``$ALLOCSTACK_VOLUME_NAME``.

Supervision: SIGTERM, SIGINT and SIGHUP are forwarded to the component (so a
drain reaches it through srun and Apptainer); if launch.py itself is killed, the
kernel kills the component too (``PR_SET_PDEATHSIG``), so nothing is orphaned.
With ``--tolerate-kill RECORD`` (workers), a component killed by a signal that
did not come through launch.py (``kill -9``, the OOM killer) is recorded in
RECORD and the job succeeds: its leased tasks return to the queue and the other
workers finish them; verification still decides whether the run succeeded.
"""

from __future__ import annotations

import ctypes
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

from allocstack.cli import ArgumentParser, positive_int, run
from allocstack.errors import AllocstackError, report
from allocstack.jsonio import atomic_write_json
from allocstack.lifeline import ENV as LIFELINE_ENV
from allocstack.lifeline import forward_signals
from allocstack.names import VOLUME_PREFIX
from allocstack.program import volume_environment
from allocstack.scratch import ensure_private_dir, resolve_root, run_scratch


def step_prefix(component: str, cpus: int, step_args: list[str], node: str | None) -> list[str]:
    """srun arguments that make ``component`` its own job step inside the current allocation.

    ``--overlap`` and ``--mem=0`` (from ``step_args``) because Snakemake's group job already
    runs inside one step that holds the allocation's CPUs and memory; ``--exact`` so the step
    gets exactly ``cpus`` CPUs. ``--nodes=1 --nodelist=NODE`` pins every component to the node
    this launcher runs on: the stack talks over loopback, so in an allocation of several nodes
    a step placed elsewhere could never reach the coordinator.
    """
    pin = ["--nodes=1", f"--nodelist={node}"] if node else ["--nodes=1"]
    return ["srun", f"--job-name={component}", "--ntasks=1", *pin, f"--cpus-per-task={cpus}", *step_args]


def container_prefix(image: str, apptainer_args: list[str], binds: list[str], env: Mapping[str, str]) -> list[str]:
    """``apptainer exec`` in the current directory with ``binds`` at the same paths.

    ``--pwd`` keeps relative paths working under ``--contain`` (which would start in $HOME).
    """
    argv = ["apptainer", "exec", *apptainer_args, "--pwd", os.getcwd()]
    for name, value in env.items():
        argv += ["--env", f"{name}={value}"]
    for path in dict.fromkeys(binds):  # same path inside as outside; de-duplicated, order kept
        argv += ["--bind", f"{path}:{path}"]
    return [*argv, image]


def job_end_time(environ: Mapping[str, str]) -> str | None:
    """Epoch seconds at which the Slurm allocation ends, from $SLURM_JOB_END_TIME or squeue.

    Slurm 22.05 does not export SLURM_JOB_END_TIME; ``squeue -o %e`` knows it.
    """
    if environ.get("SLURM_JOB_END_TIME") or not environ.get("SLURM_JOB_ID"):
        return environ.get("SLURM_JOB_END_TIME")
    try:
        done = subprocess.run(["squeue", "--noheader", "--jobs", environ["SLURM_JOB_ID"], "--format=%e"],
                              capture_output=True, text=True, timeout=10, check=False)
        end = time.mktime(time.strptime(done.stdout.strip(), "%Y-%m-%dT%H:%M:%S"))
    except (OSError, subprocess.TimeoutExpired, ValueError):
        return None
    return str(int(end))


def this_node(environ: Mapping[str, str]) -> str:
    """The allocation's node this launcher runs on, for pinning the component's step.

    Inside a job step Slurm sets $SLURMD_NODENAME; in an allocation's own shell (``salloc``,
    then snakemake on the node) it does not, and the host's short name is the node's
    (the workflow has checked that this host is one of the allocation's nodes).
    """
    return environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]


def build_argv(args, scratch: Path | None, environ: Mapping[str, str]) -> list[str]:
    script = Path(args.command[0]).absolute()
    python = "python3" if args.image else sys.executable
    argv = [python, str(script), *args.command[1:]]
    if args.image:
        binds = [str(script.parent), *(str(Path(b).absolute()) for b in args.bind)]
        for path in args.bind:  # a bind source must exist: results/<run>, state/<run> may not yet
            Path(path).mkdir(mode=0o700, parents=True, exist_ok=True)
        env = {"PYTHONDONTWRITEBYTECODE": "1"}
        passed = ("SLURM_JOB_ID", "SLURM_JOB_END_TIME", "SLURMD_NODENAME", "SLURM_SUBMIT_HOST", "USER",
                  "CUDA_VISIBLE_DEVICES", LIFELINE_ENV)
        for name in passed:
            if environ.get(name):  # --cleanenv drops them; the components need them
                env[name] = environ[name]
        if scratch is not None:
            binds.insert(0, str(scratch))
            env["ALLOCSTACK_SCRATCH"] = str(scratch)
        env.update((name, value) for name, value in environ.items() if name.startswith(VOLUME_PREFIX))
        argv = container_prefix(args.image, args.apptainer_arg, binds, env) + argv
    if args.job_steps and environ.get("SLURM_JOB_ID"):
        argv = step_prefix(args.component, args.cpus, args.step_arg, this_node(environ)) + argv
    return argv


def check_programs(argv: list[str], hint: str) -> None:
    """Fail early, naming the fix, when srun or apptainer is needed but not on PATH."""
    for program in ("srun", "apptainer"):
        if program in argv and shutil.which(program) is None:
            fix = f"; {hint}" if program == "apptainer" and hint else ""
            raise AllocstackError("prerequisite", f"{program} is not on PATH{fix}")


PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """In the child, before exec: get SIGKILL when launch.py dies (Linux)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass


def signal_step(job_id: str, step_name: str, signum: int) -> bool:
    """Send ``signum`` to the job step(s) named ``step_name`` with scancel; False if none was found.

    Signalling srun itself is not the same: on SIGTERM srun "forces job termination"
    (SIGKILL after KillWait) and the component never drains. ``scancel --signal``
    delivers the signal to the step's tasks, through Apptainer, to the component.
    """
    try:
        listing = subprocess.run(["squeue", "--steps", "--jobs", job_id, "--noheader", "--format=%i %j"],
                                 capture_output=True, text=True, timeout=10, check=False).stdout
        steps = [line.split()[0] for line in listing.splitlines() if line.split()[1:] == [step_name]]
        for step in steps:
            subprocess.run(["scancel", f"--signal={signal.Signals(signum).name[3:]}", step],
                           timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired, IndexError):
        return False
    return bool(steps)


def supervise(command: list[str], env: dict[str, str], component: str, kill_record: Path | None) -> int:
    """Run ``command``, forward signals to it, and return the job's exit code."""
    child = subprocess.Popen(command, env=env, preexec_fn=die_with_parent)
    forwarded: set[int] = set()
    in_step = command[0] == "srun"

    def forward(signum: int, _frame: object) -> None:
        forwarded.add(signum)
        if not (in_step and signal_step(env["SLURM_JOB_ID"], component, signum)):
            child.send_signal(signum)

    forward_signals(forward)
    code = child.wait()
    if code >= 0:
        return code
    killer = signal.Signals(-code).name
    if kill_record is not None and -code not in forwarded:
        print(f"launch: {component} was killed by {killer} from outside; tolerated: its leased tasks "
              "return to the queue when their lease expires", file=sys.stderr, flush=True)
        atomic_write_json(kill_record, {"schemaVersion": 1, "workerId": component, "status": "killed",
                                        "signal": killer, "tasksCompleted": None, "endedAt": time.time()}, 0o644)
        return 0
    print(f"launch: {component} ended by {killer}", file=sys.stderr, flush=True)
    return 128 - code


def parse_args(argv: list[str] | None):
    parser = ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--component", required=True, help="name of the component (the job step's name)")
    parser.add_argument("--run", required=True, help="run name: scratch is ROOT/allocstack-UID/RUN")
    parser.add_argument("--scratch-root", default="", help="configured scratch root ('' = $SLURM_TMPDIR, $TMPDIR, ...)")
    parser.add_argument("--no-scratch", action="store_true", help="the component needs no scratch (e.g. verification)")
    parser.add_argument("--image", default="", help="Apptainer image to run the component in ('' = none)")
    parser.add_argument("--apptainer-arg", action="append", default=[], help="argument for apptainer exec (repeatable)")
    parser.add_argument("--apptainer-hint", default="", help="how to get apptainer, named when it is missing")
    parser.add_argument("--bind", action="append", default=[], help="host path to bind at the same place (repeatable)")
    parser.add_argument("--job-steps", action="store_true", help="run as an srun job step inside a Slurm allocation")
    parser.add_argument("--step-arg", action="append", default=[], help="argument for srun (repeatable)")
    parser.add_argument("--cpus", type=positive_int, default=1, help="CPUs of the job step")
    parser.add_argument("--volume", action="append", default=[],
                        help="a named volume: SCRATCH/volumes/NAME, given to the component as $ALLOCSTACK_VOLUME_NAME")
    parser.add_argument("--job-end-time", action="store_true",
                        help="export $SLURM_JOB_END_TIME (from squeue if Slurm does not set it) to the component")
    parser.add_argument("--tolerate-kill", type=Path, metavar="RECORD",
                        help="a component killed from outside is recorded here and the job succeeds (workers)")
    parser.add_argument("command", nargs="+", help="-- SCRIPT [ARGS...]")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    env = {**os.environ, LIFELINE_ENV: str(os.getpid())}
    try:
        scratch = None if args.no_scratch else run_scratch(resolve_root(args.scratch_root, env), args.run)
        if scratch is not None:
            ensure_private_dir(scratch)
            env["ALLOCSTACK_SCRATCH"] = str(scratch)
            env.update(volume_environment(scratch, args.volume))
        end_time = job_end_time(env) if args.job_end_time else None
        if end_time:
            env["SLURM_JOB_END_TIME"] = end_time
        command = build_argv(args, scratch, env)
        check_programs(command, args.apptainer_hint)
    except AllocstackError as error:
        return report(error)
    print(f"launch: {args.component}: {shlex.join(command)}", file=sys.stderr, flush=True)
    return supervise(command, env, args.component, args.tolerate_kill)


if __name__ == "__main__":
    sys.exit(run(main))
