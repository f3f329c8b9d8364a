#!/usr/bin/env python3
"""Start one stack component: as a Slurm job step when inside an allocation, in the image when one is set.

This is where a Compose service becomes a program the scheduler launches and
tracks. ``launch.py [options] -- SCRIPT [ARGS...]`` makes and checks the run's
job-scoped scratch on the host (0700 and yours, its root writable and not full:
allocstack/common/scratch.py ``prepare``; inside the container the component only uses the
directory it is given), then runs and supervises::

    [srun STEP_ARGS... [python3 node_scratch.py ... --]] [apptainer exec ... IMAGE | ch-run ... IMAGE --] python SCRIPT ARGS...

* ``srun`` is used when ``--job-steps`` is on and ``$SLURM_JOB_ID`` is set, so
  ``sacct -j JOB`` lists the component as its own step with its own state and
  CPU time. Outside Slurm the component is a plain process. The step is pinned to
  one node: this launcher's (where the group job and the coordinator run), or with
  ``--node-index K`` (config ``nodes`` above 1: a worker's place) the allocation's
  K-th other node.
* the container runtime (``--runtime``: Apptainer's ``apptainer exec`` or
  Charliecloud's ``ch-run``, see allocstack/launch/containers.py) is used when
  ``--image`` is given; paths are bound at the same location inside the
  container (the scripts, scratch and the paths in ``--bind``), so the command
  line needs no rewriting, and the environment holds only what allocstack sets.
* a step on another node (``--node-index``) first runs ``node_scratch.py`` there, which
  makes the run's scratch (and Charliecloud's mount-point tree) on that node and execs the
  rest; srun runs it again as the step's task epilog, which removes them once the node's
  last step of the run ended (scratch may be local to each node: see allocstack/launch/nodescratch.py).
* ``--volume NAME`` (a Compose named volume) is the directory ``SCRATCH/volumes/NAME``,
  named to the component in ``$ALLOCSTACK_VOLUME_NAME``.
* ``--hosts-name SERVICE=NAME,...`` (the stack's services and their Compose names): the stack's hosts file
  ``SCRATCH/hosts`` is written on the component's node (once per node and attempt, after the attempt's first
  launcher emptied the scratch: allocstack/launch/hostsfile.py) and bound at ``/etc/hosts`` in the image; the
  supervisors of your programs bind it there too, in their images or in a mount namespace of their own.

* ``--network-namespace`` (config ``network.isolation: private``): the component runs in the stack's private
  network on its node, entered with ``nsenter`` inside the job step and before the container runtime, once the job
  stack_network has published its holder in ``SCRATCH/network.json`` (allocstack/launch/stacknet.py); with
  ``--network-space NAME``, in the namespace of its own that replica NAME of a service that listens runs in.

A step on another node writes its output on that node, into a file beside this
launcher's log (``srun --output=LOG-STEM.%N.log``, on the filesystem the nodes share),
appended to the log when the step ends: srun would otherwise forward it over the network,
which Slurm does not encrypt (measured on the test cluster's bridge), and a task's failure
message may quote its data.

A service in a job step on this node (``--stop-request SECONDS``) is asked to stop through a file
(``SCRATCH/stop/COMPONENT``, named to it in ``$ALLOCSTACK_STOP_REQUEST``), not through a signal to its step:
Slurm signals every process of a step, so your program would get SIGTERM twice, straight and through the
container runtime, where Compose sends it once (allocstack/launch/lifeline.py says what that breaks). Its
supervisor passes one SIGTERM to your program. Only a step still running SECONDS later is signalled.

Supervision: SIGTERM, SIGINT and SIGHUP are forwarded to the component (so a
drain reaches it through srun and the container runtime; with a Charliecloud SquashFS
image to ch-run's child alone, since ch-run unmounts the image when it gets SIGTERM
itself, see allocstack/launch/containers.py ``forks_component``); if launch.py itself is
killed, the kernel kills the component too (``PR_SET_PDEATHSIG``), so nothing is
orphaned. With ``--tolerate-kill RECORD`` (workers), a component killed by a
signal that did not come through launch.py (``kill -9``, the OOM killer, its job
step cancelled, its node lost) is recorded in RECORD and the job succeeds: its
leased tasks return to the queue and the other workers finish them; verification
still decides whether the run succeeded.

Outside an allocation (or without job steps) and without an image, a component without
``--tolerate-kill`` runs in this launcher's own process (:func:`runs_here`): supervision would
add nothing there, and it saves an interpreter per component when the stack starts.

When the component has ended by itself (no stop signal reached this launcher) it notes how in
scratch (``ended/<component>.json``: the exit code and the component's last line,
allocstack/coordinator/endrecord.py), where the gate that waits for it looks: a component that died at
start, or whose container runtime failed, ends its gate at once. A component that failed ends
its log with ``launch: COMPONENT exited CODE`` (the end-of-run summary quotes the line before).

With ``--run-state`` (the run's state directory, allocstack/common/attempts.py): a second start of the
same run while another command runs it is refused in one line naming that command; a failure
another attempt cannot change (:data:`allocstack.common.errors.LASTING`) is recorded there, and every
launcher of a later attempt of the same command (the profile's ``retries``) ends at once with
that attempt's line instead of running into it again.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from allocstack.common import attempts, names
from allocstack.common.cli import ArgumentParser, positive_int, run
from allocstack.common.errors import LASTING, AllocstackError, diag_of, report
from allocstack.common.jsonio import atomic_write_json
from allocstack.common.names import ENDED_DIR, VOLUME_PREFIX
from allocstack.common.scratch import make_private, prepare, resolve_root, root_source, scratch_of
from allocstack.coordinator import endrecord
from allocstack.launch import hostsfile
from allocstack.launch.containers import PROGRAMS
from allocstack.launch.lifeline import ENV as LIFELINE_ENV
from allocstack.launch.lifeline import STOP_ENV
from allocstack.launch.nodescratch import FIRST_NODE, SCRATCH_ENV, STEP_ENV, step_mount_tree
from allocstack.launch.program import volume_environment
from allocstack.launch.supervise import Supervised

# Imported where they are used, not here: allocstack.common.slurm (job steps), allocstack.launch.containers (an image) and
# allocstack.common.network (a step on another node). Outside an allocation and without an image launch.py needs
# none of them, and four launchers start at once with the stack on the login node's few CPUs.


def step_prefix(component: str, cpus: int, step_args: list[str], node: str | None) -> list[str]:
    """srun arguments that make ``component`` its own job step inside the current allocation.

    ``--overlap`` and ``--mem=0`` (from ``step_args``) because Snakemake's group job already
    runs inside one step that holds the allocation's CPUs and memory; ``--exact`` so the step
    gets exactly ``cpus`` CPUs. ``--nodes=1 --nodelist=NODE`` pins the component to one node:
    the one this launcher runs on (the coordinator's, whose loopback the stack uses), or the
    node a worker was placed on when the stack spans several (``--node-index``).
    """
    pin = ["--nodes=1", f"--nodelist={node}"] if node else ["--nodes=1"]
    return ["srun", f"--job-name={component}", "--ntasks=1", *pin, f"--cpus-per-task={cpus}", *step_args]


def this_node(environ: Mapping[str, str]) -> str:
    """The allocation's node this launcher runs on, for pinning the component's step.

    Inside a job step Slurm sets $SLURMD_NODENAME; in an allocation's own shell (``salloc``,
    then snakemake on the node) it does not, and the host's short name is the node's
    (the workflow has checked that this host is one of the allocation's nodes).
    """
    return environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]


#: What passes from the launcher's environment into the image (the runtime drops everything else).
#: Not SLURM_STEP_ID: the launcher's is Snakemake's step, not the component's own.
#: The command mark (allocstack/common/attempts.py) too: a gate tells its own attempt's notes from an earlier one's.
PASSED_ENV = ("SLURM_JOB_ID", "SLURM_JOB_END_TIME", "SLURMD_NODENAME", "SLURM_SUBMIT_HOST", "USER",
              "CUDA_VISIBLE_DEVICES", LIFELINE_ENV, STOP_ENV, attempts.COMMAND_ENV, names.NETWORK_ENV)
#: Where a service's stop request is created, in the run's scratch (:func:`stop_request_file`).
STOP_DIR = "stop"


def component_binds(args, scratch: Path | None) -> list[str]:
    """Host paths the component sees in the image: scratch, the scripts' directory, ``--bind`` paths."""
    script = Path(args.command[0]).absolute()
    binds = [str(scratch)] if scratch is not None else []
    return [*binds, str(script.parent), *(str(Path(b).absolute()) for b in args.bind)]


def component_env(args, scratch: Path | None, environ: Mapping[str, str]) -> dict[str, str]:
    """The component's whole environment inside the image, besides the image's own."""
    env = {"PYTHONDONTWRITEBYTECODE": "1"}
    for name in (*PASSED_ENV, *args.pass_env):
        if environ.get(name):
            env[name] = environ[name]
    if scratch is not None:
        env[SCRATCH_ENV] = str(scratch)
    env.update((name, value) for name, value in environ.items() if name.startswith(VOLUME_PREFIX))
    if args.runtime == "charliecloud":  # Apptainer names the image itself ($APPTAINER_CONTAINER)
        env["ALLOCSTACK_CONTAINER"] = args.image
    return env


#: Run on the node of a step off the first node, before the component (see allocstack/launch/nodescratch.py).
NODE_SCRATCH = Path(__file__).resolve().with_name("node_scratch.py")


def off_node(args, environ: Mapping[str, str]) -> bool:
    """Whether the component is a job step on another node than this launcher's."""
    return bool(args.node_index and args.job_steps and environ.get("SLURM_JOB_ID"))


def node_scratch_prefix(step_dirs: list[Path], hosts_names: list[str] | None = None,
                        network_holder: str | None = None) -> list[str]:
    """The wrapper that makes the run's scratch (and ``step_dirs`` in it, and the stack's hosts file) on the
    step's own node, and (``network_holder``: the stack's private network) enters that node's namespace."""
    return [sys.executable, str(NODE_SCRATCH), *(f"--dir={d}" for d in step_dirs),
            *(f"--hosts-name={name}" for name in hosts_names or []),
            *([f"--network-holder={network_holder}"] if network_holder else []), "--"]


def build_argv(args, scratch: Path | None, environ: Mapping[str, str], mount_tree: Path | None = None,
               step_dirs: list[Path] | None = None, join: list[str] | None = None) -> list[str]:
    """The whole command: ``[srun ... [node_scratch.py ... --]] [nsenter ... --] [runtime ... IMAGE] python SCRIPT
    ARGS``.

    Off the first node with scratch, the step first runs node_scratch.py there (making scratch
    and ``step_dirs``), which srun also runs as the step's task epilog (removing them). ``join`` (the stack's
    private network: allocstack/launch/stacknet.py) enters the node's namespace inside the step, before the
    container runtime, so the runtime and the component run in it.
    """
    in_step = bool(args.job_steps and environ.get("SLURM_JOB_ID"))
    if args.node_index and not in_step:
        raise AllocstackError("config", f"{args.component} is placed on node {args.node_index + 1}, but more than "
                                        "one node needs Slurm job steps (slurm.job_steps: true, inside an allocation)")
    if args.node_index:
        from allocstack.common.network import node_for

        node = node_for(args.node_index, this_node(environ), environ.get("SLURM_JOB_ID", ""))
    else:
        node = this_node(environ)
    script = Path(args.command[0]).absolute()
    python = "python3" if args.image else sys.executable
    argv = [python, str(script), *args.command[1:]]
    if args.image:
        from allocstack.launch.containers import container_prefix

        env = component_env(args, scratch, environ)
        if in_step:
            env["SLURMD_NODENAME"] = node  # the node the step runs on, not this launcher's
        hosts = hostsfile.hosts_path(scratch) if scratch is not None and args.hosts_name else None
        argv = container_prefix(args.runtime, args.image, args.runtime_arg, component_binds(args, scratch),
                                env, os.getcwd(), mount_tree, hosts) + argv
    argv = [*(join or []), *argv]
    step_args = [*args.step_arg, *step_output(args.node_index)]
    if off_node(args, environ) and scratch is not None:
        holder = None
        if args.network_namespace:
            from allocstack.launch.stacknet import holder_name

            holder = holder_name(args.node_index)
        argv = node_scratch_prefix(step_dirs or [], args.hosts_name, holder) + argv
        step_args.append(f"--task-epilog={NODE_SCRATCH}")
    if in_step:
        argv = step_prefix(args.component, args.cpus, step_args, node) + argv
    return argv


def log_file() -> Path | None:
    """The regular file this launcher's stderr goes to (the rule's log), or None."""
    try:
        path = Path(os.readlink("/proc/self/fd/2"))
    except OSError:
        return None
    return path if path.is_file() else None


def step_output(node_index: int) -> list[str]:
    """srun arguments that keep the output of a step on another node off the network (see above).

    ``%N`` (the node's name) makes slurmstepd write the file on that node; a plain file name
    would have srun receive the output over the network and write it here.
    """
    log = log_file()
    if not node_index or log is None:
        return []
    pattern = log.with_name(f"{log.stem}.%N{log.suffix}")
    return [f"--output={pattern}", f"--error={pattern}"]


def collect_step_output() -> None:
    """Append what a step on another node wrote beside the log (see :func:`step_output`) to the log."""
    log = log_file()
    if log is None:
        return
    sys.stderr.flush()
    for written in sorted(log.parent.glob(f"{log.stem}.*{log.suffix}")):
        with open(written, "rb") as handle:
            os.write(2, handle.read())
        written.unlink()


def prepare_binds(args, scratch: Path | None, environ: Mapping[str, str]) -> tuple[Path | None, list[Path]]:
    """With an image: create the ``--bind`` sources and, for Charliecloud, the mount-point tree.

    A bind source must exist (results/<run>, state/<run> may not yet; they are on the
    filesystem the nodes share). The Charliecloud mount-point tree (see allocstack/launch/containers.py)
    lives in scratch (or, without scratch, in the scratch root) and is removed when the
    component ends; collection removes scratch anyway. For a step on another node the tree is
    made there, by node_scratch.py: it is named, not created, here.
    Returns the tree (or None) and the directories left for the step's node to create.

    :raises AllocstackError: ``prerequisite`` for a path ch-run cannot bind or a mount point
        the image lacks.
    """
    if not args.image:
        return None, []
    for path in args.bind:
        Path(path).mkdir(mode=0o700, parents=True, exist_ok=True)
    if args.runtime != "charliecloud":
        return None, []
    from allocstack.launch.containers import check_mount_points, mount_tops, mount_tree_dirs

    binds, cwd = component_binds(args, scratch), os.getcwd()
    check_mount_points(args.image, mount_tops([*binds, cwd]))
    if scratch is not None and off_node(args, environ):
        tree = step_mount_tree(scratch, args.component)
        return tree, [tree, *mount_tree_dirs(binds, cwd, tree)]
    base = scratch if scratch is not None else resolve_root(args.scratch_root, environ)
    base.mkdir(mode=0o700, parents=True, exist_ok=True)
    tree = Path(tempfile.mkdtemp(prefix=f".mounts-{args.component}-", dir=base))
    for directory in mount_tree_dirs(binds, cwd, tree):
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    return tree, []


def check_programs(argv: list[str], runtime: str, hint: str) -> None:
    """Fail early, naming the fix, when srun or the container runtime is needed but not on PATH."""
    for program in ("srun", PROGRAMS[runtime]):
        if program in argv and shutil.which(program) is None:
            fix = f"; {hint}" if program == PROGRAMS[runtime] and hint else ""
            raise AllocstackError("prerequisite", f"{program} is not on PATH{fix}")


def killed_by(code: int, in_step: bool) -> int | None:
    """The signal that ended the component, from its exit code (None: it exited).

    A process killed by signal N is ``-N`` to Popen; srun reports a step whose task was killed
    (``kill -9``, the OOM killer, ``scancel`` of the step) as exit code 128 + N.
    """
    if code < 0:
        return -code
    if in_step and code > 128 and code - 128 in {int(s) for s in signal.Signals}:
        return code - 128
    return None


def stop_request_file(args, scratch: Path | None, env: Mapping[str, str]) -> Path | None:
    """Where the component is asked to stop (``--stop-request``): in a job step on this node, with scratch (the
    node's own: the launcher and the step see the same file at once); else None (it is signalled)."""
    in_step = args.job_steps and bool(env.get("SLURM_JOB_ID"))
    if args.stop_request is None or scratch is None or not in_step or off_node(args, env):
        return None
    return scratch / STOP_DIR / args.component


@dataclass(frozen=True)
class StopRequest:
    """A stop asked through ``path``; the step is signalled only if it still runs ``wait`` seconds later."""

    path: Path
    wait: float

    def make(self) -> bool:
        """Create the request; False when it cannot be (the component is signalled instead)."""
        try:
            self.path.parent.mkdir(mode=0o700, exist_ok=True)
            self.path.touch(mode=0o600)
        except OSError as exc:
            print(f"launch: cannot ask through {self.path} ({exc.strerror}): signalling its job step",
                  file=sys.stderr, flush=True)
            return False
        return True


def supervise(command: list[str], env: dict[str, str], component: str, kill_records: list[Path],
              off_node: bool = False, forked: bool = False, stop_request: StopRequest | None = None) -> tuple[int, bool]:
    """Run ``command``, forward signals to it; return the job's exit code, and whether this launcher got a stop
    signal (the component was stopped, it did not end by itself).

    :param kill_records: with ``--tolerate-kill``: the records a component killed from outside leaves (a
        worker's; each worker's of a job step of several, but those that wrote their own).
    :param forked: the runtime runs the component as its child and must not get the signal itself
        (ch-run with a SquashFS image, :func:`allocstack.launch.containers.forks_component`): the signal
        goes to ch-run's child, found among the job step's processes (``scontrol listpids``) or
        below our own child. Until ch-run has started it, the signal goes the usual way.
    :param stop_request: the first stop signal becomes this request (the component's supervisor passes one SIGTERM
        to your program); the signal itself follows only if the step still runs its ``wait`` seconds later.
    :raises AllocstackError: ``prerequisite`` when ``command`` cannot be started.
    """
    in_step = command[0] == "srun"
    requested: list[bool] = []

    def deliver(child: subprocess.Popen[bytes], signum: int) -> None:
        if stop_request is not None and not requested:
            requested.append(True)
            if stop_request.make():
                print(f"launch: {component}: asked to stop ({signal.Signals(signum).name}): its supervisor passes one "
                      f"SIGTERM to your program; its step is signalled if it still runs after {stop_request.wait:g} s",
                      file=sys.stderr, flush=True)
                later = threading.Timer(stop_request.wait, lambda: child.poll() is None and signal_it(child, signum))
                later.daemon = True
                later.start()
                return
        signal_it(child, signum)

    def signal_it(child: subprocess.Popen[bytes], signum: int) -> None:
        if forked and signal_forked(child.pid, env.get("SLURM_JOB_ID", "") if in_step else "", component, signum):
            return
        if in_step:
            from allocstack.common import slurm

            if slurm.signal_step(env["SLURM_JOB_ID"], component, signum):
                return
        child.send_signal(signum)

    # Its stderr goes to the log as it is (keep_tail=False): this supervisor adds no copy.
    supervised = Supervised(component, deliver, keep_tail=False)
    supervised.start(command, env)
    outcome = supervised.wait()
    if off_node:
        collect_step_output()
    signum = killed_by(outcome.code, in_step)
    missing = [record for record in kill_records if not record.exists()]
    lost = in_step and outcome.code == 0 and bool(missing)
    stopped = bool(outcome.received)
    if signum is None and not lost:
        return outcome.code, stopped
    killer = signal.Signals(signum).name if signum else "the loss of its node"
    if kill_records and not outcome.received:  # launch.py got no stop signal of its own
        # srun exits 0 when the step's node failed (after Slurm's SlurmdTimeout): its workers wrote no record.
        print(f"launch: {component} was killed by {killer} from outside; tolerated: its leased tasks "
              "return to the queue when their lease expires", file=sys.stderr, flush=True)
        for record in missing:
            record.parent.mkdir(parents=True, exist_ok=True)  # a step that never started made no directory
            atomic_write_json(record, {"schemaVersion": 1, "workerId": record.stem, "status": "killed",
                                       "signal": signal.Signals(signum).name if signum else None,
                                       "reason": killer, "tasksCompleted": None, "endedAt": time.time()}, 0o644)
        return 0, stopped
    if signum is None:
        return outcome.code, stopped
    print(f"launch: {component} ended by {killer}", file=sys.stderr, flush=True)
    return 128 + signum, stopped


def signal_forked(child: int, job_id: str, component: str, signum: int) -> bool:
    """Send ``signum`` to the component ch-run runs as its child; False when there is none (yet).

    :param job_id: the allocation when the component is a job step (its processes are not ours).
    """
    from allocstack.common import slurm
    from allocstack.launch.containers import forked_components

    pids = slurm.step_pids(job_id, component) if job_id else [child]
    targets = forked_components(pids)
    for pid in targets:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)
    return bool(targets)


def runs_here(args, command: list[str]) -> bool:
    """Whether the component can run in this very process: a plain ``python SCRIPT`` (no job step, no image)
    that no one needs to watch from outside (no ``--tolerate-kill``). Supervision would add nothing then:
    signals reach the component itself (Snakemake's SIGTERM to a service, Ctrl-C), a SIGKILL ends it as it
    would have ended launch.py and, through the parent-death signal, the child. So locally the coordinator,
    the gates and your services cost one interpreter each instead of two (four start at once with the stack)."""
    return command[0] == sys.executable and not args.tolerate_kill and not args.image


def run_here(command: list[str], env: dict[str, str]) -> int:
    """Run ``python SCRIPT ARGS`` (``command``) in this interpreter, as that command would, with ``env``.

    No launcher stays behind to watch, so the component gets no ``$ALLOCSTACK_LAUNCHER_PID``. The script's
    ``sys.exit(code)`` ends this process with its code.
    """
    import runpy

    script = command[1]
    os.environ.update((name, value) for name, value in env.items() if name != LIFELINE_ENV)
    os.environ.pop(LIFELINE_ENV, None)
    sys.argv = command[1:]
    sys.path[0] = str(Path(script).parent)
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as exited:  # as the interpreter reads it: None is 0, a number itself, anything else printed, 1
        if exited.code is None or isinstance(exited.code, int):
            return exited.code or 0
        print(exited.code, file=sys.stderr, flush=True)
        return 1
    except Exception:  # noqa: BLE001 - what the interpreter does with it (its traceback, exit 1), then the note
        traceback.print_exc()
        return 1
    return 0


def parse_args(argv: list[str] | None):
    parser = ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--component", required=True, help="name of the component (the job step's name)")
    parser.add_argument("--run", required=True, help="run name: scratch is ROOT/allocstack-UID/RUN.CHECKOUT[.JOB]")
    parser.add_argument("--scratch-root", default="", help="configured scratch root ('' = $SLURM_TMPDIR, $TMPDIR, ...)")
    parser.add_argument("--no-scratch", action="store_true", help="the component needs no scratch (e.g. verification)")
    parser.add_argument("--image", default="", help="image to run the component in ('' = none)")
    parser.add_argument("--runtime", choices=sorted(PROGRAMS), default="apptainer",
                        help="container runtime for --image: apptainer (apptainer exec) or charliecloud (ch-run)")
    parser.add_argument("--runtime-arg", action="append", default=[],
                        help="argument for apptainer exec or ch-run (repeatable)")
    parser.add_argument("--runtime-hint", default="", help="how to get the runtime's program, named when it is missing")
    parser.add_argument("--bind", action="append", default=[], help="host path to bind at the same place (repeatable)")
    parser.add_argument("--pass-env", action="append", default=[], metavar="NAME",
                        help="a variable of this environment the component reads in the image: a ${env:NAME} of its "
                             "program's command or environment (repeatable; its value never on a command line)")
    parser.add_argument("--job-steps", action="store_true", help="run as an srun job step inside a Slurm allocation")
    parser.add_argument("--step-arg", action="append", default=[], help="argument for srun (repeatable)")
    parser.add_argument("--cpus", type=positive_int, default=1, help="CPUs of the job step")
    parser.add_argument("--volume", action="append", default=[],
                        help="a named volume: SCRATCH/volumes/NAME, given to the component as $ALLOCSTACK_VOLUME_NAME")
    parser.add_argument("--network-namespace", action="store_true",
                        help="run the component in the stack's private network on its node (config network.isolation: "
                             "private): wait for SCRATCH/network.json, then enter it with nsenter")
    parser.add_argument("--network-space", default="", metavar="NAME",
                        help="with --network-namespace: the namespace of replica NAME of a service that listens (its "
                             "own, beside the stack's), not the stack's")
    parser.add_argument("--hosts-name", action="append", default=[], metavar="SERVICE=NAME,...",
                        help="a service of the stack and its other names (Compose hostname, aliases): written into "
                             "the stack's hosts file, bound at /etc/hosts in the image (repeatable)")
    parser.add_argument("--keep-volume", action="append", default=[], metavar="NAME",
                        help="a named volume kept across attempts: RUN_STATE/volumes/NAME instead of scratch")
    parser.add_argument("--node-index", type=int, default=0,
                        help="run the step on the allocation's node number K (0 = this launcher's node; "
                             "1.. = the others in Slurm's order)")
    parser.add_argument("--job-end-time", action="store_true",
                        help="export $SLURM_JOB_END_TIME (from squeue if Slurm does not set it) to the component")
    parser.add_argument("--tolerate-kill", type=Path, metavar="RECORD", action="append", default=[],
                        help="a component killed from outside is recorded here and the job succeeds (workers; "
                             "repeatable: each worker of a job step of several, but those that wrote their own)")
    parser.add_argument("--stop-request", type=float, metavar="SECONDS",
                        help="a service's supervisor in a job step on this node: ask it to stop through a file, and "
                             "signal its step only if it still runs SECONDS later")
    parser.add_argument("--run-state", type=Path,
                        help="the run's state directory: refuse a second start of a live run; record a failure "
                             "another attempt cannot change, and end at once on an earlier attempt's")
    parser.add_argument("--marker", type=Path,
                        help="the run's success marker: an earlier attempt's is removed when this attempt begins")
    parser.add_argument("command", nargs="+", help="-- SCRIPT [ARGS...]")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    env = {**os.environ, LIFELINE_ENV: str(os.getpid())}
    if args.image and args.runtime == "charliecloud":
        from allocstack.launch.containers import runtime_environ

        env = runtime_environ(env)
    mount_tree = step_dirs = scratch = None
    try:
        earlier = attempt_checks(args, env)
        if earlier is not None:
            return earlier
        root = None if args.no_scratch else resolve_root(args.scratch_root, env)
        scratch = None if root is None else scratch_of(root, args.run, env)
        if scratch is not None:
            # This node's, checked here on the host; a step on another node makes its own there.
            prepare(scratch, root_source(args.scratch_root, env))
        begin_attempt(args, scratch, env)
        if scratch is not None:
            make_private(scratch / ENDED_DIR)
            endrecord.clear_ended(scratch, args.component)  # an earlier command's, in a reused scratch
            env[SCRATCH_ENV] = str(scratch)
            env.update(volume_environment(scratch, args.volume, args.run_state, frozenset(args.keep_volume)))
            if args.hosts_name and not off_node(args, env):  # a step on another node writes its own there
                hostsfile.write_named(scratch, args.hosts_name)
        if off_node(args, env):
            # This launcher's pid means nothing on another node (another machine's processes): the step ends with
            # its srun, which dies with this launcher (the parent-death signal).
            env.pop(LIFELINE_ENV, None)
            env[STEP_ENV] = args.component  # node_scratch.py's record of the step on its node
            if scratch is not None:  # a node that sees this mark shares this node's scratch: not its to remove
                (scratch / FIRST_NODE).touch(mode=0o600)
        end_time = None
        if args.job_end_time and (env.get("SLURM_JOB_ID") or env.get("SLURM_JOB_END_TIME")):  # else none to find
            from allocstack.common import slurm

            end_time = slurm.allocation_end(env)
        if end_time:
            env["SLURM_JOB_END_TIME"] = str(end_time)
        stop_request = stop_request_file(args, scratch, env)
        if stop_request is not None:
            stop_request.unlink(missing_ok=True)  # an earlier command's, in a reused scratch
            env[STOP_ENV] = str(stop_request)
        mount_tree, step_dirs = prepare_binds(args, scratch, env)
        join = None
        if args.network_namespace and scratch is not None:
            from allocstack.launch import stacknet

            if not off_node(args, env):  # off it, node_scratch.py enters that node's own, on that node
                join = stacknet.join_prefix(stacknet.await_held(scratch, args.component, space=args.network_space))
            env[names.NETWORK_ENV] = "private"
        command = build_argv(args, scratch, env, mount_tree, step_dirs, join)
        check_programs(command, args.runtime, args.runtime_hint)
    except AllocstackError as error:
        remove_mount_tree(mount_tree, step_dirs)
        record_lasting(args, env, error.line(), error.exit_code)
        return report(error)
    if runs_here(args, command):
        print(f"launch: {args.component}: in this process: {shlex.join(command[1:])}", file=sys.stderr, flush=True)
        return ended(args, scratch, env, run_here(command, env), stopped=False)
    print(f"launch: {args.component}: {shlex.join(command)}", file=sys.stderr, flush=True)
    try:
        forked = False
        if args.image:
            from allocstack.launch.containers import forks_component

            forked = forks_component(args.runtime, args.image)
        asked = None if stop_request is None else StopRequest(stop_request, args.stop_request)
        code, stopped = supervise(command, env, args.component, args.tolerate_kill, off_node=args.node_index > 0,
                                  forked=forked, stop_request=asked)
    except AllocstackError as error:  # it could not be started: as good as dead at start, for its gate too
        code, stopped = report(error), False
    finally:
        remove_mount_tree(mount_tree, step_dirs)
    return ended(args, scratch, env, code, stopped)


def attempt_checks(args, env: dict[str, str]) -> int | None:
    """Before anything starts (with ``--run-state``): end at once when an earlier attempt of this command failed
    in a way this one cannot change (its line, its exit code); refuse when another command runs the run.

    :returns: the exit code to end with, or None to go on.
    :raises AllocstackError: ``already-running`` naming the other command.
    """
    ours = attempts.command_of(env)
    if args.run_state is None or ours is None:
        return None
    job = env.get("SLURM_JOB_ID") or None
    earlier = attempts.earlier_lasting(args.run_state, ours, job, args.component)
    if earlier is not None:
        print(f"launch: {args.component}: not started: an earlier attempt of this command "
              f"({attempts.attempt_name(earlier)}) failed in a way another attempt cannot change:",
              file=sys.stderr, flush=True)
        print(earlier["line"], file=sys.stderr, flush=True)
        return earlier["exitCode"]

    def job_active(job: str) -> bool | None:
        from allocstack.common import slurm

        return slurm.job_active(job)

    who = attempts.live_elsewhere(args.run_state, ours, job_active)
    if who is not None:
        raise AllocstackError("already-running", attempts.refusal(args.run, who))
    try:
        attempts.claim(args.run_state, args.run, ours, job, this_node(env) if job else None)
    except OSError as exc:
        raise AllocstackError("io", f"cannot record the live run in {args.run_state}: {exc.strerror}") from exc
    return None


def begin_attempt(args, scratch: Path | None, env: Mapping[str, str]) -> None:
    """The attempt's first launcher (with ``--run-state``, in a command): clear what an earlier attempt left (its
    scratch, volumes and all, its records for the other nodes, its success marker), so that every message is
    this attempt's (allocstack/common/attempts.py ``begin_attempt``).

    :raises AllocstackError: ``scratch`` when they cannot be cleared.
    """
    ours = attempts.command_of(env)
    if args.run_state is None or args.marker is None or ours is None:
        return
    attempt = attempts.attempt_of(ours, env.get("SLURM_JOB_ID") or None)
    try:
        if attempts.begin_attempt(scratch, args.run_state, attempt, args.marker):
            print(f"launch: {args.component}: a new attempt: cleared what an earlier one left in {scratch or args.run_state}",
                  file=sys.stderr, flush=True)
    except OSError as exc:
        raise AllocstackError("scratch", f"cannot clear an earlier attempt's records ({exc.filename}): "
                                         f"{exc.strerror}") from exc


def ended(args, scratch: Path | None, env: Mapping[str, str], code: int, stopped: bool) -> int:
    """After the component ended with ``code``: note it for its gate when it ended by itself (not ``stopped``), say
    that it failed in its log, record a failure another attempt cannot change; return ``code``."""
    line = None
    if code != 0 or not stopped:
        from allocstack.status.summary import last_line

        log = log_file()
        line = last_line(read_tail(log)) if log is not None else None
    if scratch is not None and not stopped and (scratch / ENDED_DIR).is_dir():  # collection may have removed it
        try:
            endrecord.write_ended(scratch, args.component, code, line, env)
        except AllocstackError as error:
            print(f"launch: {args.component}: its end was not noted for its gate ({error.message})", file=sys.stderr,
                  flush=True)
    if code != 0:
        from allocstack.status.summary import EXITED

        print(EXITED.format(component=args.component, code=code), file=sys.stderr, flush=True)
        if line is not None:
            record_lasting(args, env, line, code)
    return code


#: Bytes at the end of a component's log that hold its last lines.
TAIL_BYTES = 64 << 10


def read_tail(path: Path) -> str:
    """The last :data:`TAIL_BYTES` of ``path`` (its first, partial line dropped); '' when it cannot be read."""
    try:
        with open(path, "rb") as handle:
            handle.seek(max(0, handle.seek(0, os.SEEK_END) - TAIL_BYTES))
            data = handle.read()
    except OSError:
        return ""
    text = data.decode("utf-8", errors="replace")
    return text if len(data) < TAIL_BYTES else text.split("\n", 1)[-1]


def record_lasting(args, env: Mapping[str, str], line: str, code: int) -> None:
    """Record ``line`` for the later attempts of this command when it is a failure they cannot change."""
    ours = attempts.command_of(env)
    if args.run_state is None or ours is None or diag_of(line) not in LASTING:
        return
    try:
        attempts.record_lasting(args.run_state, ours, env.get("SLURM_JOB_ID") or None, args.component, line, code)
    except OSError as exc:
        print(f"launch: {args.component}: could not record the lasting failure in {args.run_state}: {exc.strerror}",
              file=sys.stderr, flush=True)


def remove_mount_tree(tree: Path | None, step_dirs: list[Path] | None) -> None:
    """Remove a Charliecloud mount-point tree (empty directories) this launcher made, once nothing uses it.

    A tree on another node (``step_dirs``) is that node's: its step's task epilog removes it.
    """
    if tree is not None and not step_dirs:
        shutil.rmtree(tree, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(run(main))
