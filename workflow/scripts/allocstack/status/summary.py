"""A finished run, read back from its records: the end-of-run summary and ``status.py`` after the run.

Everything here reads files a run leaves (``results/<run>/...`` and the components'
logs) and renders text; nothing talks to a coordinator. The records:
``result.json`` (the success marker), ``coordinator.json`` (how the coordinator
ended, per-worker counts), ``workers/worker-NN.json``, ``readiness.json``,
``services.json`` (how each of your services ended), ``check.json`` (your own
stack's check) and ``events.jsonl``.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from ..common import jsonio, names
from ..common.errors import LINE_PREFIX
from ..common.events import read_events
from ..coordinator.endrecord import failed_count
from ..coordinator.journal import acknowledged
from ..launch.exposure import summary_lines
from ..plan import layout

#: The files of ``results/<run>/`` a summary reads (any may be missing).
RECORDS = {"marker": layout.MARKER, "end": layout.COORDINATOR_END, "gate": layout.COORDINATOR_GATE,
           "inputs": layout.INPUTS_SUMMARY, "services": layout.SERVICES_RECORD, "up": layout.UP_RECORD,
           "served": layout.SERVED_RECORD}
ERROR_PREFIX = LINE_PREFIX
#: Records and logs at most this many seconds older than the start of the command count as its own
#: (file systems round modification times; Slurm's clocks may differ by a little).
CLOCK_SLACK = 2.0


@dataclass
class RunRecords:
    """What ``results/<run>/`` holds; ``None`` for a record that is missing or unreadable."""

    run: str
    directory: Path
    documents: dict[str, Any] = field(default_factory=dict)
    workers: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: The job steps of several workers that recorded them (empty: each worker its own step).
    steps: set[str] = field(default_factory=set)
    events: list[dict[str, Any]] = field(default_factory=list)

    def get(self, name: str) -> Any:
        return self.documents.get(name)

    @property
    def exists(self) -> bool:
        return any(value is not None for value in self.documents.values()) or bool(self.workers or self.events)


def _read(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


#: The success marker's keys a summary reads (:func:`verdict`, :func:`render_finished`): never its results.
MARKER_KEYS = ("status", "taskCount", "check", "services", "mode", "ended")


@cache
def _marker_decoder() -> Any:
    """msgspec's decoder of the success marker's :data:`MARKER_KEYS` (the rest skipped), or None without msgspec."""
    msgspec = jsonio.msgspec
    if msgspec is None:
        return None
    fields = [(key, Any, msgspec.UNSET) for key in MARKER_KEYS]
    return msgspec.json.Decoder(msgspec.defstruct("MarkerKeys", fields))


def _read_marker(path: Path) -> Any:
    """The success marker's :data:`MARKER_KEYS` that it has (a million results are 1.4 s to read as dicts, at
    the end of every run, for a summary that needs none of them: 0.3 s through msgspec); the standard
    library reads it where msgspec does not read it as an object. A marker that is not an object as it is."""
    decoder = _marker_decoder()
    try:
        keys = decoder.decode(path.read_bytes()) if decoder is not None else None
    except OSError:
        return None
    except (jsonio.msgspec.MsgspecError, RecursionError):
        keys = None
    if keys is not None:
        return {key: getattr(keys, key) for key in MARKER_KEYS if getattr(keys, key) is not jsonio.msgspec.UNSET}
    document = _read(path)
    return {key: document[key] for key in MARKER_KEYS if key in document} if isinstance(document, dict) else document


def read_run(results_dir: Path, run: str, since: float = 0.0) -> RunRecords:
    """Read every record of ``run`` under ``results_dir``.

    A record that is missing, unreadable or older than ``since`` (epoch seconds: left by an
    earlier run) is ``None``.
    """
    directory = results_dir / run
    records = RunRecords(run, directory)

    def fresh(path: Path) -> bool:
        try:
            return path.stat().st_mtime >= since - CLOCK_SLACK
        except OSError:
            return False

    for name, filename in RECORDS.items():
        path = directory / filename
        records.documents[name] = (_read_marker if name == "marker" else _read)(path) if fresh(path) else None
    workers = directory / layout.WORKERS  # each worker's record; in its job step's directory when a step runs several
    for path in sorted([*workers.glob("*.json"), *workers.glob("*/*.json")]):
        document = _read(path) if fresh(path) else None
        if isinstance(document, dict):
            records.workers[path.stem] = document
            if path.parent != workers:
                records.steps.add(path.parent.name)
    if fresh(directory / names.EVENTS):
        records.events = read_events(directory / names.EVENTS)
    return records


def known_runs(results_dir: Path) -> list[str]:
    """Runs that left records under ``results_dir`` (a directory with any of the run's records)."""
    if not results_dir.is_dir():
        return []
    return sorted(entry.name for entry in results_dir.iterdir()
                  if entry.is_dir() and any((entry / name).exists() for name in RECORDS.values()))


#: Under the logs directory: the Slurm job logs (profiles/slurm ``slurm-logdir``). What the Snakemake inside the
#: stack's job says before any component starts (a $TMPDIR it refuses there) is only there.
SLURM_LOGS = "slurm"


def run_logs(logs_dir: Path, run: str, since: float = 0.0) -> list[Path]:
    """``run``'s component logs written since ``since`` (epoch seconds), oldest first; and the Slurm job logs
    written since then (they name no run: the command's jobs are those).

    Logs are ``logs/<rule>/<run>.log`` and ``logs/<rule>/<run>/<name>.log``.
    """
    found = []
    slurm = [*logs_dir.glob(f"{SLURM_LOGS}/*/*.log")] if since else []
    for path in dict.fromkeys([*logs_dir.glob(f"*/{run}.log"), *logs_dir.glob(f"*/{run}/*.log"), *slurm]):
        try:
            written = path.stat().st_mtime
        except OSError:
            continue
        if written >= since - CLOCK_SLACK:
            found.append((written, path))
    return [path for _, path in sorted(found)]


def error_lines(logs_dir: Path, run: str, since: float = 0.0) -> list[tuple[str, Path]]:
    """The allocstack error lines in ``run``'s component logs written since ``since`` (epoch seconds).

    Each distinct line once, in the order of the logs' modification times.
    """
    found: dict[str, Path] = {}
    for path in run_logs(logs_dir, run, since):
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
            start = line.find(ERROR_PREFIX)
            if start >= 0:
                found.setdefault(line[start:].strip(), path)
    return list(found.items())


#: What launch.py writes in a component's log when the component failed (the last line of that log).
EXITED = "launch: {component} exited {code}"
EXITED_PATTERN = re.compile(r"^launch: (?P<component>\S+) exited (?P<code>-?\d+)$")
#: A launcher's own lines: not the component's.
LAUNCHER_PREFIX = "launch: "
#: What Slurm says about a job step's end (``srun: error: node: task 0: Exited with exit code 1``): the
#: program's own last line comes before; only when there is none (the step never started) is this the why.
STEP_PREFIXES = ("srun: ", "slurmstepd: ")


def last_line(text: str) -> str | None:
    """What a failed program last said: its last allocstack error line, else its last line that is neither its
    launcher's nor Slurm's about its step (a traceback's last line, a container runtime's own error), else
    Slurm's (a step that could not start); None when nothing was said."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    errors = [line[line.find(ERROR_PREFIX):] for line in lines if ERROR_PREFIX in line]
    if errors:
        return errors[-1]
    said = [line for line in lines if not line.startswith(LAUNCHER_PREFIX)]
    own = [line for line in said if not line.startswith(STEP_PREFIXES)] or said
    return own[-1][-500:] if own else None


@dataclass
class Failure:
    """A component that failed: its name, exit code, last line and log."""

    component: str
    code: int
    line: str | None
    log: Path


def failed_components(logs_dir: Path, run: str, since: float = 0.0) -> list[Failure]:
    """The components of ``run`` whose launcher said they failed (:data:`EXITED`), first failed first."""
    failures = []
    for path in run_logs(logs_dir, run, since):
        text = path.read_text(encoding="utf-8", errors="replace")
        lines = text.splitlines()
        for index in range(len(lines) - 1, -1, -1):
            ended = EXITED_PATTERN.match(lines[index].strip())
            if ended:
                failures.append(Failure(ended["component"], int(ended["code"]), last_line("\n".join(lines[:index])),
                                        path))
                break
    return failures


#: Known ways a runtime fails before a program of the run could say anything: (what its line holds, what to do).
HINTS = (
    ("too many FUSE errors",
     ("ch-run could not use /dev/fuse on this node to mount the SquashFS image: run a directory image there "
      "(ch-convert IMAGE.sqfs DIR, container/README.md), or ask your center whether compute nodes allow FUSE")),
    ("/dev/fuse",
     ("this node's /dev/fuse is not usable (a SquashFS image needs it): run a directory image there, or ask your "
      "center whether compute nodes allow FUSE")),
    ("can't mkdir",
     ("the image lacks a directory for a top-level directory of the run's paths (ch-run cannot make one in a "
      "read-only image): add it (container/README.md: mount points)")),
    ("Read-only file system",
     "a directory the run writes is read-only there: point $TMPDIR (or config scratch) at a writable node-local one"),
    ("No space left on device",
     "a filesystem the run writes is full: free space, or point $TMPDIR (or config scratch) elsewhere"),
    ("Disk quota exceeded",
     "your quota is exhausted on a filesystem the run writes: free space, or point $TMPDIR (or config scratch) elsewhere"),
)


def hint(line: str | None) -> str | None:
    """What to do about a known runtime failure quoted in ``line``, or None."""
    return next((what for needle, what in HINTS if line and needle in line), None)


def _holds_files(directory: Path) -> bool:
    """``directory`` holds a file (an earlier command's records, when none is this command's)."""
    try:
        return any(path.is_file() for path in directory.iterdir())
    except OSError:
        return False


def _n(value: Any) -> str:
    """A count with thousands separators (anything else as it is)."""
    return f"{value:,}" if isinstance(value, int) else str(value)


def _seconds(value: float) -> str:
    return f"{value:.1f} s" if value < 120 else f"{value / 60:.1f} min"


def stack_seconds(records: RunRecords) -> float | None:
    """From the coordinator's start to the last event of the stack (its end, or a worker's end)."""
    end = records.get("end")
    times = [event["t"] for event in records.events if isinstance(event.get("t"), (int, float))]
    start = end.get("startedAt") if isinstance(end, dict) else None
    if start is None and times:
        start = min(times)
    if start is None or not times:
        return None
    return max(times) - start


#: Up to this many workers the summary names each; more are counted.
NAMED_WORKERS = 16


def worker_line(records: RunRecords) -> str:
    """``2: worker-01 2 tasks, worker-02 2 tasks`` (killed workers say so); above :data:`NAMED_WORKERS`, counted:
    ``4,096 in 64 job steps: 4,095 done (fewest 230 tasks, most 260), 1 killed (worker-0017 SIGKILL)``."""
    if len(records.workers) > NAMED_WORKERS:
        return many_workers_line(records)
    parts = []
    for name, record in sorted(records.workers.items()):
        if record.get("status") == "killed":
            parts.append(f"{name} killed ({record.get('signal', '?')})")
        elif record.get("mode") == "long-running":  # your program, once: how it ended
            parts.append(f"{name} exited {record.get('exitCode', '?')}{restarted(record)}")
        else:
            parts.append(f"{name} {_n(record.get('tasksCompleted', 0))} tasks")
    return f"{len(records.workers)}: " + ", ".join(parts) if parts else "none recorded"


def many_workers_line(records: RunRecords) -> str:
    killed = sorted(name for name, record in records.workers.items() if record.get("status") == "killed")
    counts = [record.get("tasksCompleted") or 0 for record in records.workers.values()
              if record.get("status") != "killed"]
    count = len(records.steps)
    steps = f" in {_n(count)} job step{'' if count == 1 else 's'}" if count else ""
    line = f"{_n(len(records.workers))}{steps}: {_n(len(counts))} ended"
    if counts:
        line += f" (fewest {_n(min(counts))} tasks, most {_n(max(counts))})"
    if killed:
        named = ", ".join(f"{name} {records.workers[name].get('signal') or '?'}" for name in killed[:3])
        line += f", {_n(len(killed))} killed ({named}{', ...' if len(killed) > 3 else ''})"
    return line


def services_line(records: RunRecords) -> str | None:
    """``kv stopped, api stopped (restarted 1 time)``: how each of your services ended (None without services)."""
    document = records.get("services")
    services = document.get("services") if isinstance(document, dict) else None
    if not services:
        return None
    return ", ".join(f"{name} {record.get('status', '?')}{restarted(record)}" if isinstance(record, dict) else
                     f"{name} ?" for name, record in sorted(services.items()))


def restarted(record: dict[str, Any]) -> str:
    """`` (restarted 2 times)`` for a program its restart policy started again, else ''."""
    count = record.get("restarts")
    return f" (restarted {count} time{'' if count == 1 else 's'})" if isinstance(count, int) and count > 0 else ""


def served(records: RunRecords) -> str | None:
    """A serving stack's end after it was up (its success marker, config ``mode: serve``): how it ended, else None."""
    marker = records.get("marker")
    if isinstance(marker, dict) and marker.get("mode") == "serve" and marker.get("status") == "success":
        return str(marker.get("ended", "ended"))
    return None


def serving_lines(records: RunRecords) -> list[str]:
    """A serving stack that is up (config ``mode: serve``): how to reach each of its services."""
    up = records.get("up")
    if not isinstance(up, dict) or not isinstance(up.get("services"), dict):
        return []
    return [f"  serving     {name}: {entry.get('url')}" + (f"; from your laptop: {entry['tunnel']}" if "tunnel" in entry
                                                         else "")
            for name, entry in sorted(up["services"].items()) if isinstance(entry, dict)]


def verdict(records: RunRecords) -> str:
    """What a verified run was verified against: the coordinator's tasks, or your own stack's check."""
    if served(records):
        return f"a serving stack, {served(records)}"
    marker = records.get("marker")
    if isinstance(marker, dict) and "taskCount" not in marker and marker.get("check") == "passed":
        services = marker.get("services") or []
        return f"your check passed, {len(services)} service(s) stopped cleanly"
    count = marker.get("taskCount", "?") if isinstance(marker, dict) else "?"
    return f"{_n(count)} of {_n(count)} tasks correct"


def quoted_failure(failures: list[Failure]) -> list[str]:
    """With no allocstack error line in the logs: the first failed component's last line, and a hint for it."""
    if not failures or not failures[0].line:
        return ["  no allocstack error line in this run's logs: see the failed job's log above"]
    first = failures[0]
    lines = [f"  {first.component} exited {first.code}: {first.line}", f"      (in {first.log})"]
    if hint(first.line):
        lines.append(f"      hint: {hint(first.line)}")
    return lines


def details(records: RunRecords, wall_seconds: float | None, interrupted: bool = False) -> list[str]:
    """The summary's lines under its verdict: tasks, the journal, services, workers, wall time, and a warning for
    each socket a program of yours listened on beyond loopback."""
    end, gate = records.get("end"), records.get("gate")
    lines = []
    if isinstance(end, dict):
        lines.append(f"  tasks       {_n(end.get('resultCount', '?'))} of {_n(end.get('taskCount', '?'))} done, "
                     f"{_n(failed_count(end))} failed; {_n(end.get('expiredLeases', 0))} leases expired "
                     f"and requeued; {_n(end.get('restored', 0))} restored from the journal")
        aside = end.get("journalSetAside")
        if isinstance(aside, dict):
            lines.append(f"  journal     started afresh: {aside.get('because')}; the earlier one is kept as "
                         f"{aside.get('path')}")
        if end.get("status") != "completed" and not interrupted:
            lines.append(f"  coordinator ended {end.get('status')} ({end.get('reason')}): its acknowledged results "
                         "stay in the journal, and a rerun of the same program resumes from them")
    services = services_line(records)
    if services:
        lines.append(f"  services    {services}")
    if records.workers:
        lines.append(f"  workers     {worker_line(records)}")
    times = [f"{_seconds(wall_seconds)} for this command"] if wall_seconds is not None else []
    stack = stack_seconds(records)
    if stack is not None:
        ready = f"ready after {gate['secondsToReady']:.2f} s, " if isinstance(gate, dict) and "secondsToReady" in gate else ""
        first = "coordinator start" if isinstance(records.get("end"), dict) else "first start"
        times.append(f"the stack {_seconds(stack)} ({ready}{first} to last event)")
    if times:
        lines.append(f"  wall time   {'; '.join(times)}")
    # a program of yours that listened beyond loopback, as its log said (allocstack/launch/exposure.py)
    lines += [f"  {line}" for line in summary_lines(records.events)]
    return lines


def render_interrupted(records: RunRecords, *, wall_seconds: float | None = None, command: str = "",
                       journal: Path | None = None) -> str:
    """The summary of a run Ctrl-C stopped: INTERRUPTED, what was done, and the one command that resumes it.

    Snakemake removes the outputs of the jobs the interruption ended (the coordinator's end record among them):
    what was done is what the run's ``journal`` holds, of the task count validation recorded.
    """
    inputs = _read(records.directory / RECORDS["inputs"])
    total = inputs.get("taskCount") if isinstance(inputs, dict) else None
    if type(total) is int:
        done_count = (acknowledged(journal) if journal is not None else None) or 0
        kept = f", kept in the journal ({journal})" if done_count else ""
        done = f": {_n(done_count)} of {_n(total)} tasks done{kept}; {_n(total - done_count)} to do"
    elif records.exists or isinstance(inputs, dict):
        done = ": the stack was stopped"
    else:
        done = ": before the stack started"
    lines = [f"allocstack: run {records.run} INTERRUPTED{done}", *details(records, wall_seconds, interrupted=True)]
    if command:
        lines.append(f"  resume      {command}")
        lines.append("              (the same command: what is done is not done again)")
    return "\n".join(lines)


def render_finished(records: RunRecords, *, failed: bool | None = None, wall_seconds: float | None = None,
                    errors: list[tuple[str, Path]] | None = None, failures: list[Failure] | None = None) -> str:
    """The summary of a run that is not running: verdict, counts, times, where things are.

    :param failed: the outcome when the caller knows it (Snakemake's onsuccess/onerror);
        ``None`` = from the marker alone.
    :param errors: the run's allocstack error lines and the log each is in (failed runs).
    :param failures: the components that failed (:func:`failed_components`): quoted when there is no error line.
    """
    marker = records.get("marker")
    verified = isinstance(marker, dict) and marker.get("status") == "success"
    live = failed is None and not verified and records.get("up") and not records.get("served")
    failed = not verified if failed is None else failed
    where = records.directory
    if live:  # the status command while a serving stack is up
        up = records.get("up")
        since = f" since {time.strftime('%H:%M:%S', time.localtime(up['upAt']))}" if isinstance(up.get("upAt"), float) else ""
        return "\n".join([f"allocstack: run {records.run} is UP{since} (a serving stack)", *serving_lines(records)])
    if not failed:
        lines = [f"allocstack: run {records.run} VERIFIED: {verdict(records)}"]
    else:
        lines = [f"allocstack: run {records.run} FAILED" + ("" if records.exists or _holds_files(where)
                                                           else f": nothing was written to {where}/")]
        for line, path in (errors or [])[:5]:
            lines += [f"  {line}", f"      (in {path})"]
            if hint(line):
                lines.append(f"      hint: {hint(line)}")
        if errors is not None and not errors:
            lines += quoted_failure(failures or [])
    lines += details(records, wall_seconds)
    if not failed:
        lines.append(f"  marker      {where / RECORDS['marker']}")
        for label, name in (("timeline", layout.TIMELINE), ("decisions", layout.DECISION_RECORD)):
            if (where / name).exists():
                lines.append(f"  {label:<11} {where / name}")
        lines.append("  report      snakemake --report report.html  (the DAG, the decision record and the timeline)")
    return "\n".join(lines)


def live_runs(user_scratch: Path) -> list[str]:
    """This checkout's runs with an endpoint file in this user's scratch root (``<root>/allocstack-<uid>/``)."""
    from ..common.scratch import runs_in

    return sorted(run for run, dirs in runs_in(user_scratch).items() if any((d / names.ENDPOINT).exists() for d in dirs))
