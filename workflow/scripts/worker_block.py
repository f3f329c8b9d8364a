#!/usr/bin/env python3
"""A job step of several workers on one node: their processes supervised as one, their requests relayed over a few
connections to the coordinator.

The rule ``run_workers`` runs one of these per block of a node's workers (config ``worker.per_step``;
by default one per node above 16 workers), as ONE job step, so the DAG, the job steps and the
coordinator's connections grow with the nodes, not with the workers. Once every gate passed
(the coordinator's, your services', this node's), it starts the relay
(``allocstack/worker/relay.py``: the run's token checked, requests batched over
``--connections`` connections, pinned TLS off the first node), publishes it for its workers in
scratch (0600), and starts each worker as its own ``worker.py`` process with its own id,
record (``--records``/WORKER.json), log (``--log-dir``/WORKER.log) and event log; then it
supervises them (``allocstack/worker/block.py``): a worker killed from outside is started
again (at most 3 times), one that fails fails the step, and the step's stop signals reach
every worker.

Exit codes: 0 every worker ended (done, or recorded killed); a failed worker's own code; 128 +
the signal that stopped the step; 69 a gate did not pass or the coordinator's endpoint is
unreadable; 64 bad arguments.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from allocstack import SCHEMA_VERSION
from allocstack.common import names
from allocstack.common.cli import (
    ArgumentParser,
    add_gate_arguments,
    add_started_arguments,
    positive_float,
    positive_int,
    run,
)
from allocstack.common.endpoint import Endpoint, read_endpoint, read_view_token, write_endpoint
from allocstack.common.errors import AllocstackError, report
from allocstack.common.jsonio import atomic_write_json
from allocstack.common.loopsignals import ending_quietly
from allocstack.launch.lifeline import ENV as LIFELINE_ENV
from allocstack.launch.lifeline import FORWARDED_SIGNALS, watch_launcher
from allocstack.launch.program import await_dependencies
from allocstack.launch.supervise import die_with_parent
from allocstack.worker.block import MAX_RESTARTS, Fate, Member, Members, restart_pause
from allocstack.worker.relay import Relay

WORKER = Path(__file__).resolve().with_name("worker.py")
#: Seconds between two looks at the workers besides SIGCHLD (a signal may coalesce).
REAP_PERIOD = 1.0


def parse_args(argv: list[str] | None):
    parser = ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--step", required=True, help="the job step's name, e.g. workers-01")
    parser.add_argument("--worker", action="append", required=True, help="a worker of the step, e.g. worker-17 "
                                                                         "(repeatable)")
    parser.add_argument("--records", type=Path, required=True, help="where each worker's record goes (WORKER.json)")
    parser.add_argument("--log-dir", type=Path, required=True, help="where each worker's log goes (WORKER.log)")
    parser.add_argument("--scratch", type=Path, default=os.environ.get("ALLOCSTACK_SCRATCH") or None,
                        help="job-scoped scratch on this node (default $ALLOCSTACK_SCRATCH): the relay's endpoint")
    parser.add_argument("--endpoint-file", type=Path,
                        help=f"the coordinator's endpoint (default SCRATCH/{names.ENDPOINT}; off the first node the "
                             "one published for the other nodes)")
    parser.add_argument("--shared-dir", type=Path,
                        help="more than one node: the run's state directory, where each worker's event log goes "
                             f"({names.component_events('WORKER')})")
    parser.add_argument("--connections", type=positive_int, default=4, help="connections to the coordinator")
    parser.add_argument("--connect-timeout", type=positive_float, default=30.0,
                        help="bound on connecting to the coordinator and on each answer")
    parser.add_argument("--max-restarts", type=int, default=MAX_RESTARTS,
                        help="times a worker killed from outside is started again")
    add_gate_arguments(parser)
    add_started_arguments(parser)
    parser.add_argument("--worker-arg", action="append", default=[],
                        help="an option of worker.py every worker gets, e.g. --worker-arg=--batch=64 (repeatable)")
    args = parser.parse_args(argv)
    if args.scratch is None:
        parser.error("--scratch (or $ALLOCSTACK_SCRATCH) is required: the relay's endpoint is published there")
    return args


def worker_argv(args, worker: str, relay_endpoint: Path) -> list[str]:
    """``worker``'s own command: worker.py with its id, record and event log, talking to the step's relay."""
    argv = [sys.executable, str(WORKER), f"--worker-id={worker}", f"--record={args.records / names.worker_record(worker)}",
            f"--endpoint-file={relay_endpoint}", f"--scratch={args.scratch}"]
    if args.shared_dir is not None:
        argv.append(f"--events={args.shared_dir / names.component_events(worker)}")
    return [*argv, *args.worker_arg]


def killed_record(member: Member) -> dict:
    """The record of a worker killed from outside too often (as launch.py writes a killed worker's)."""
    name = signal.Signals(-member.code).name if member.code is not None and member.code < 0 else None
    return {"schemaVersion": SCHEMA_VERSION, "workerId": member.worker, "status": "killed", "signal": name,
            "reason": f"{name} from outside, {member.restarts} restarts", "restarts": member.restarts,
            "tasksCompleted": None, "endedAt": time.time()}


class Step:
    """The step's life once its gates passed: the relay, the workers, their ends."""

    def __init__(self, args, endpoint: Endpoint, log: Callable[[str], None]) -> None:
        self.args, self.endpoint, self.log = args, endpoint, log
        self.processes: dict[int, subprocess.Popen[bytes]] = {}
        self.env = {**os.environ, LIFELINE_ENV: str(os.getpid())}  # each worker ends when this step is gone
        self.relay_endpoint = args.scratch / names.relay_endpoint(args.step)
        self.members = Members(args.worker, self.start, self.send, log, args.max_restarts)
        self.done = asyncio.Event()
        self.error: AllocstackError | None = None

    def start(self, worker: str, restart: bool) -> int:
        """Start ``worker``'s process, its output to its own log (appended to when it is started again).

        :raises AllocstackError: ``prerequisite`` when it cannot be started.
        """
        log = self.args.log_dir / names.worker_log(worker)
        try:
            with open(log, "ab" if restart else "wb") as output:
                if restart:  # its own log says why a second run of it follows
                    output.write(f"{self.args.step}: {worker} was killed from outside; started again\n".encode())
                    output.flush()
                process = subprocess.Popen(worker_argv(self.args, worker, self.relay_endpoint), env=self.env,
                                           stdin=subprocess.DEVNULL, stdout=output, stderr=subprocess.STDOUT,
                                           preexec_fn=die_with_parent)
        except OSError as exc:
            raise AllocstackError("prerequisite", f"cannot start {worker}: {exc.strerror}") from exc
        self.processes[process.pid] = process
        return process.pid

    def send(self, pid: int, signum: int) -> None:
        process = self.processes.get(pid)
        if process is not None and process.poll() is None:
            process.send_signal(signum)

    def stop(self, signum: int) -> None:
        self.log(f"{self.args.step}: {signal.Signals(signum).name}: stopping its {len(self.members.running)} "
                 "running worker(s)")
        self.members.stop(signum)
        self.reap()

    def reap(self) -> None:
        """Look at every worker process: decide the fate of those that ended, start again those killed from outside."""
        loop = asyncio.get_running_loop()
        for pid, process in list(self.processes.items()):
            code = process.poll()
            if code is None:
                continue
            del self.processes[pid]
            again = self.members.ended(pid, code)
            if again is not None:
                loop.call_later(restart_pause(again.restarts), self.restart, again)
        if self.members.finished and not self.processes:
            self.done.set()

    def restart(self, member: Member) -> None:
        if member.fate is not None or self.members.stopped_by is not None:
            return  # stopped meanwhile
        try:
            self.members.launch(member)
        except AllocstackError as error:
            member.fate, self.error = Fate.FAILED, self.error or error
            self.members.stop(signal.SIGTERM)
        self.reap()

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        relay = Relay(self.endpoint, len(self.args.worker), self.args.connections, self.args.connect_timeout,
                      self.log)
        port = await relay.start()
        write_endpoint(self.relay_endpoint, f"http://127.0.0.1:{port}", self.endpoint.token,
                       self.view_token())
        loop.add_signal_handler(signal.SIGCHLD, self.reap)
        for signum in FORWARDED_SIGNALS:
            loop.add_signal_handler(signum, self.stop, signum)
        watch_launcher(lambda: loop.call_soon_threadsafe(self.stop, signal.SIGTERM))
        try:
            self.members.start_all()
        except AllocstackError as error:
            self.error = error
            self.members.stop(signal.SIGTERM)
            for member in self.members.members.values():
                if member.pid is None:
                    member.fate = Fate.FAILED
        self.log(f"{self.args.step}: {len(self.args.worker)} workers started ({self.args.worker[0]} .. "
                 f"{self.args.worker[-1]}), relayed to {self.endpoint.url} over at most {self.args.connections} "
                 "connections")
        while not self.done.is_set():
            self.reap()
            try:
                await asyncio.wait_for(self.done.wait(), REAP_PERIOD)
            except TimeoutError:
                pass
        await relay.close()
        self.relay_endpoint.unlink(missing_ok=True)
        for member in self.members.members.values():
            if member.fate is Fate.KILLED:
                atomic_write_json(self.args.records / names.worker_record(member.worker), killed_record(member), 0o644)
                with open(self.args.log_dir / names.worker_log(member.worker), "ab") as output:
                    output.write(f"{self.args.step}: {member.worker} was killed from outside "
                                 f"{member.restarts + 1} times: recorded killed\n".encode())
        fates = [member.fate.value for member in self.members.members.values() if member.fate is not None]
        self.log(f"{self.args.step}: ended: " + ", ".join(f"{fates.count(f)} {f}" for f in sorted(set(fates))) +
                 f"; {relay.relayed} requests in {relay.round_trips} round trips to the coordinator"
                 + (f", {relay.unanswered} unanswered (retried)" if relay.unanswered else ""))
        if self.error is not None:
            return report(self.error)
        return self.members.exit_code()

    def view_token(self) -> str:
        try:
            return read_view_token(self.endpoint_file)
        except AllocstackError:
            return ""

    @property
    def endpoint_file(self) -> Path:
        return self.args.endpoint_file or self.args.scratch / names.ENDPOINT


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    log = lambda message: print(message, file=sys.stderr, flush=True)  # noqa: E731
    try:
        for directory in (args.records, args.log_dir):
            directory.mkdir(parents=True, exist_ok=True)
        await_dependencies(args.gate_record, args.started, args.scratch, args.gate_timeout,
                           lambda message: log(f"{args.step}: {message}"))
        endpoint = read_endpoint(args.endpoint_file or args.scratch / names.ENDPOINT)
    except AllocstackError as error:
        return report(error)
    except OSError as exc:
        return report(AllocstackError("io", f"{args.step}: cannot make {exc.filename}: {exc.strerror}"))
    step = Step(args, endpoint, lambda message: log(message if message.startswith(args.step) else
                                                    f"{args.step}: {message}"))
    return asyncio.run(ending_quietly(step.run(), (signal.SIGCHLD, *FORWARDED_SIGNALS)))


if __name__ == "__main__":
    sys.exit(run(main))
