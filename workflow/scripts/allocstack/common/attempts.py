"""Which command runs a run now, and what an earlier attempt of it left: records in the run's state directory.

A run (this checkout, this run name) is started by one Snakemake command; with the Slurm
profile's ``retries`` that command may run the stack in several allocations, one after the
other (attempts). Two facts live in ``<state_dir>/<run>/``, on the filesystem every node shares:

* :data:`LIVE_RECORD`: which command runs the run (its Snakemake process: host, pid and
  start; the Slurm job and node of its current attempt). The workflow writes it when a command
  starts (common.smk) and each launcher adds its job; a second command that finds it while that
  command lives is refused in one line naming it (a second start would take over the first one's
  scratch, results and journal). A command that ended, or a job that ended, no longer counts.
* :data:`LASTING_FAILURE`: an attempt's failure that another attempt cannot change (a
  diagnostic in :data:`errors.LASTING`: the configuration, the inputs, the results, the scratch
  the center gives). The launcher of every component of a later attempt of the same command
  finds it and ends at once with that attempt's line, instead of running into it again.

Which command a process belongs to: the workflow marks the Snakemake command that starts the
run in its environment (:data:`COMMAND_ENV`, ``HOST:PID:START``), and every job of it
inherits the mark (Slurm's sbatch passes the environment on).

Standard library only: the workflow (common.smk) loads this file by its path.
"""

from __future__ import annotations

import json
import os
import socket
import tempfile
import time
from collections.abc import Callable, Mapping, MutableMapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: Set by the workflow in the Snakemake command that starts a run and inherited by every job of it (each
#: attempt, in each allocation): which command this is, ``HOST:PID:START``.
COMMAND_ENV = "ALLOCSTACK_COMMAND"
#: In the state directory: which command runs the run now.
LIVE_RECORD = "live.json"
#: In the state directory: an attempt's failure that another attempt cannot change.
LASTING_FAILURE = "lasting-failure.json"

#: Asks Slurm whether a job still runs (pending, running, completing): True, False, or None when it cannot tell.
JobActive = Callable[[str], "bool | None"]


def host() -> str:
    return socket.gethostname().split(".")[0]


def process_start(pid: int) -> int | None:
    """When process ``pid`` started (clock ticks since boot, /proc/PID/stat field 22), None when it is gone.

    With the pid it tells a process from a later one that got the same pid.
    """
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as handle:
            return int(handle.read().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


@dataclass(frozen=True)
class Command:
    """A Snakemake command: the process that started a run."""

    host: str
    pid: int
    start: int

    def encode(self) -> str:
        return f"{self.host}:{self.pid}:{self.start}"

    @classmethod
    def parse(cls, text: object) -> Command | None:
        try:
            name, pid, start = str(text).rsplit(":", 2)
            return cls(name, int(pid), int(start))
        except ValueError:
            return None

    def alive(self) -> bool | None:
        """Whether it still runs; None when it runs on another host (this one cannot tell)."""
        if self.host != host():
            return None
        return process_start(self.pid) == self.start

    def describe(self) -> str:
        return f"snakemake pid {self.pid} on {self.host}"


def this_command() -> Command:
    pid = os.getpid()
    return Command(host(), pid, process_start(pid) or 0)


def command_of(environ: Mapping[str, str]) -> Command | None:
    """The command a process belongs to (its inherited mark), None outside one (a component run by hand)."""
    return Command.parse(environ[COMMAND_ENV]) if environ.get(COMMAND_ENV) else None


def mark(environ: MutableMapping[str, str]) -> Command:
    """Mark ``environ`` (the Snakemake command's own) so every job of the command inherits which one it is."""
    environ.setdefault(COMMAND_ENV, this_command().encode())
    return Command.parse(environ[COMMAND_ENV]) or this_command()


def read_record(path: Path) -> dict[str, Any] | None:
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def write_record(path: Path, record: dict[str, Any]) -> None:
    """Atomically (temp + fsync + rename), 0600, in a 0700 directory made as needed.

    :raises OSError: when it cannot be written.
    """
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    descriptor, temp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
            json.dump({"schemaVersion": 1, **record}, handle, sort_keys=True)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temp, path)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise


# -- the live record ----------------------------------------------------------------------------------

def live_elsewhere(state: Path, ours: Command | None, job_active: JobActive) -> str | None:
    """Who runs this run now, if that is another command that still lives: a description naming it, else None.

    It lives while its Snakemake process does (on this host), or while its Slurm job does (asked from
    anywhere: a job goes on when the Snakemake that submitted it was killed); a command on another host
    without a job cannot be asked, and does not count.
    """
    record = read_record(state / LIVE_RECORD)
    other = Command.parse(record.get("command")) if record else None
    if other is None or other == ours:
        return None
    job = record.get("job")
    alive = other.alive()
    if not alive and job:
        alive = job_active(str(job))
    if not alive:
        return None
    since = time.strftime("%H:%M:%S", time.localtime(record.get("since") or 0))
    where = f", Slurm job {job}" + (f" on {record['node']}" if record.get("node") else "") if job else ""
    return f"{other.describe()} since {since}{where}"


def refusal(run: str, who: str) -> str:
    """The one line that refuses a second start of a live run (diagnostic ``already-running``)."""
    return (f"run {run} is already running from this checkout ({who}): a second start would take over its "
            "scratch, results and journal; wait for it to end, or start this one under another run name "
            "(--config run=NAME)")


def claim(state: Path, run: str, ours: Command, job: str | None = None, node: str | None = None) -> None:
    """Record that ``ours`` runs the run now (in ``job`` on ``node``, for a launcher in an allocation).

    :raises OSError: when the state directory cannot be written.
    """
    record = read_record(state / LIVE_RECORD) or {}
    if Command.parse(record.get("command")) == ours and record.get("job") == job and record.get("node") == node:
        return  # every launcher of an attempt says the same: once is enough
    since = record.get("since") if Command.parse(record.get("command")) == ours else None
    write_record(state / LIVE_RECORD, {"run": run, "command": ours.encode(), "job": job, "node": node,
                                       "since": since or time.time()})


# -- an attempt's lasting failure ----------------------------------------------------------------------

def record_lasting(state: Path, ours: Command, job: str | None, component: str, line: str, code: int) -> None:
    """Record an attempt's failure that another attempt cannot change (the first one of the attempt stays).

    :raises OSError: when the state directory cannot be written.
    """
    if earlier_lasting(state, ours) is not None:
        return
    write_record(state / LASTING_FAILURE, {"command": ours.encode(), "job": job, "node": host(),
                                           "component": component, "line": line, "exitCode": code,
                                           "at": time.time()})


def earlier_lasting(state: Path, ours: Command | None, job: str | None = None,
                    component: str | None = None) -> dict[str, Any] | None:
    """The lasting failure an earlier attempt of this same command recorded, or None (another command's is not ours).

    With ``job`` and ``component`` (the asking launcher's): a record of the same job by another component is
    a sibling's in this very attempt (locally, where there is no job, every attempt's record looks so), not
    an earlier attempt's: that component meets the failure itself, if it is one for it too, and says it.
    """
    record = read_record(state / LASTING_FAILURE)
    if ours is None or record is None or Command.parse(record.get("command")) != ours:
        return None
    if not isinstance(record.get("line"), str) or not isinstance(record.get("exitCode"), int):
        return None
    if component is not None and record.get("job") == job and record.get("component") != component:
        return None
    return record


def attempt_name(record: Mapping[str, Any]) -> str:
    """``Slurm job 123 on mn1`` or ``on vm``: where the recorded attempt ran."""
    job = f"Slurm job {record['job']} " if record.get("job") else ""
    return f"{job}on {record.get('node') or '?'}"
