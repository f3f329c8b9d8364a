"""What Slurm says, asked in one place: accounts, partitions and nodes, with their parsing.

The calls (``sacctmgr``, ``scontrol``) run with a bound (:data:`QUERY_TIMEOUT`) and answer
``None`` when a client is missing, fails or does not answer: a check that cannot ask Slurm
says nothing rather than guessing. The parsing functions take the text the commands print,
so they are tested on captured output.

:func:`submission_problem` is the check the workflow runs before it submits anything: an
account that does not exist or that the user may not use, a partition that does not exist,
a runtime above the partition's MaxTime, memory above the largest node's, more nodes
(config ``nodes``) than the partition has. Each of these
either hangs the Snakemake Slurm plugin (an invalid account) or leaves the job pending
for ever (a time limit the partition refuses), so they are refused up front, in one line
naming the profile key. The plan (:mod:`allocstack.plan`) runs it with the query its
:class:`~allocstack.plan.facts.Facts` carries, so its refusals are tested on captured text; it
never starts a process itself (``subprocess`` is imported where a query runs).

The job's own facts live here too: whether a job is still active (``squeue %T``), when the allocation ends (``squeue %e``), its steps
(``squeue --steps``, ``sacct``), signalling a step (``scancel --signal``) or finding its
processes on this node (``scontrol listpids``), the largest node
(``sinfo``) and Slurm's version, each with its parser (``tests/test_slurm_parsing.py``).
"""

from __future__ import annotations

import re
import signal
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

#: Seconds any one Slurm query may take: a controller that does not answer must not hang a run.
QUERY_TIMEOUT = 15.0

Query = Callable[[list[str]], "str | None"]


def query(argv: list[str], timeout: float = QUERY_TIMEOUT) -> str | None:
    """stdout of the Slurm client command ``argv``, or None if it is missing, fails or times out."""
    import subprocess  # here: the plan imports this module, and starts no process (allocstack/plan)

    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


# -- parsing ------------------------------------------------------------------------------

UNLIMITED = {"UNLIMITED", "INFINITE", "NONE", "N/A", ""}


def parse_minutes(text: str) -> int | None:
    """Minutes in a Slurm time (``MaxTime``, ``--time``); None for UNLIMITED/INFINITE.

    Slurm's forms: ``M``, ``M:S``, ``H:M:S``, ``D-H``, ``D-H:M``, ``D-H:M:S``. Seconds round up.

    :raises ValueError: for text that is none of these.
    """
    text = text.strip()
    if text.upper() in UNLIMITED:
        return None
    match = re.fullmatch(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?", text)
    if not match:
        raise ValueError(f"not a Slurm time: {text!r}")
    days, first, second, third = match.groups()
    if days is not None:  # D-H[:M[:S]]
        hours, minutes, seconds = int(first), int(second or 0), int(third or 0)
    elif third is not None:  # H:M:S
        hours, minutes, seconds = int(first), int(second), int(third)
    else:  # M or M:S
        hours, minutes, seconds = 0, int(first), int(second or 0)
    return int(days or 0) * 1440 + hours * 60 + minutes + (1 if seconds else 0)


def parse_megabytes(text: str) -> int | None:
    """Megabytes in a Slurm memory value (``8000``, ``8000M``, ``8G``); None for UNLIMITED.

    :raises ValueError: for text that is not a memory value.
    """
    text = text.strip()
    if text.upper() in UNLIMITED:
        return None
    match = re.fullmatch(r"(\d+)([KMGT]?)", text.upper())
    if not match:
        raise ValueError(f"not a Slurm memory value: {text!r}")
    factor = {"K": 1 / 1024, "": 1, "M": 1, "G": 1024, "T": 1024 * 1024}[match.group(2)]
    return int(int(match.group(1)) * factor)


def parse_record(line: str) -> dict[str, str]:
    """One ``scontrol show ... -o`` line (``Key=Value Key=Value ...``) as a dict.

    A value may contain spaces (``OS=Linux 6.1 #1 SMP``): a word without ``=`` belongs to
    the value before it.
    """
    record: dict[str, str] = {}
    key = None
    for word in line.split():
        name, sep, value = word.partition("=")
        if sep and name and (name[0].isupper() or name[0].isdigit()) and " " not in name:
            key = name
            record[key] = value
        elif key is not None:
            record[key] += " " + word
    return record


def parse_column(text: str) -> list[str]:
    """The first column of ``sacctmgr -n -P`` output, empty lines dropped, order kept."""
    values = (line.split("|", 1)[0].strip() for line in text.splitlines())
    return list(dict.fromkeys(value for value in values if value))


@dataclass(frozen=True)
class Partition:
    name: str
    max_time: int | None  # minutes; None = unlimited
    max_mem_per_node: int | None  # MB; None = unlimited
    default: bool = False  # where a job without --partition goes


@dataclass(frozen=True)
class Node:
    name: str
    real_memory: int  # MB
    cpus: int
    partitions: tuple[str, ...]


def parse_records(text: str, key: str) -> dict[str, dict[str, str]]:
    """Every ``scontrol show ... -o`` record of ``text`` that has ``key``, by its value."""
    records = (parse_record(line) for line in text.splitlines())
    return {record[key]: record for record in records if key in record}


def parse_partitions(text: str) -> dict[str, Partition]:
    """``scontrol show partition -o``: every partition by name."""
    return {name: Partition(name=name,
                            max_time=parse_minutes(record.get("MaxTime", "UNLIMITED")),
                            max_mem_per_node=parse_megabytes(record.get("MaxMemPerNode", "UNLIMITED")),
                            default=record.get("Default") == "YES")
            for name, record in parse_records(text, "PartitionName").items()}


def parse_nodes(text: str) -> dict[str, Node]:
    """``scontrol show node -o``: every node by name, with its memory, CPUs and partitions."""
    return {name: Node(name=name,
                       real_memory=parse_megabytes(record.get("RealMemory", "0")) or 0,
                       cpus=int(record.get("CPUTot", "0") or 0),
                       partitions=tuple(p for p in record.get("Partitions", "").split(",") if p))
            for name, record in parse_records(text, "NodeName").items()}


# -- what a submission asks for, and what Slurm has -------------------------------------

@dataclass(frozen=True)
class Submission:
    """The sbatch request of the stack's job, as the profile's default-resources give it."""

    account: str | None
    partition: str | None
    runtime: int | None  # minutes
    memory: int | None  # MB for the whole job
    memory_detail: str = ""  # how ``memory`` was computed, for the message
    user: str = ""
    runtime_text: str = ""  # ``runtime`` as the profile spells it
    nodes: int = 1  # config ``nodes``: the job's --nodes


@dataclass
class ClusterFacts:
    """What Slurm answered; None where it could not be asked."""

    accounts: list[str] | None = None  # every account in the accounting database
    user_accounts: list[str] | None = None  # accounts the user has an association with
    partitions: dict[str, Partition] | None = None
    nodes: dict[str, Node] | None = None


def gather_facts(submission: Submission, ask: Query = query) -> ClusterFacts:
    """Ask Slurm only what ``submission`` needs checked (each query bounded, see :func:`query`)."""
    facts = ClusterFacts()
    if submission.account:
        accounts = ask(["sacctmgr", "--noheader", "--parsable2", "show", "account", "format=account"])
        associations = ask(["sacctmgr", "--noheader", "--parsable2", "show", "association",
                            f"user={submission.user}", "format=account"])
        facts.accounts = parse_column(accounts) if accounts is not None else None
        facts.user_accounts = parse_column(associations) if associations is not None else None
    if submission.partition or submission.runtime or submission.memory:
        partitions = ask(["scontrol", "--oneliner", "show", "partition"])
        facts.partitions = parse_partitions(partitions) if partitions is not None else None
    if submission.memory or submission.nodes > 1:
        nodes = ask(["scontrol", "--oneliner", "show", "node"])
        facts.nodes = parse_nodes(nodes) if nodes is not None else None
    return facts


def submission_problem(submission: Submission, facts: ClusterFacts) -> tuple[str, str] | None:
    """The first setting Slurm would refuse or never run, as (profile key, why); None if none.

    Checked in this order: the account exists, the user may use it, the partition exists,
    the runtime fits the partition's MaxTime, the partition has the nodes (key ``nodes``, a
    config key), the memory fits the partition's largest node.
    A fact Slurm did not give (None) skips its check.
    """
    account = submission.account
    if account and facts.accounts is not None and facts.accounts:
        yours = ", ".join(facts.user_accounts or []) or "none"
        if account.lower() not in {a.lower() for a in facts.accounts}:
            return "slurm_account", (f"slurm_account={account}: there is no such account in Slurm "
                                     f"(accounts {submission.user} may use: {yours})")
        if facts.user_accounts is not None and account.lower() not in {a.lower() for a in facts.user_accounts}:
            return "slurm_account", (f"slurm_account={account}: the account exists but user {submission.user} "
                                     f"has no association with it, so Slurm refuses the job "
                                     f"(accounts {submission.user} may use: {yours})")
    if facts.partitions is None:
        return None
    if submission.partition:
        partition = facts.partitions.get(submission.partition)
        if partition is None:
            names = ", ".join(facts.partitions) or "none"
            return "slurm_partition", (f"slurm_partition={submission.partition}: there is no such partition "
                                       f"(partitions: {names})")
    else:  # no slurm_partition: Slurm's default partition
        partition = next((p for p in facts.partitions.values() if p.default), None)
    if partition is None:
        return None
    if submission.runtime and partition.max_time is not None and submission.runtime > partition.max_time:
        spelled = submission.runtime_text or str(submission.runtime)
        minutes = "" if spelled == str(submission.runtime) else f" ({submission.runtime} minutes)"
        return "runtime", (f"runtime={spelled}{minutes}: above the {partition.max_time}-minute MaxTime of "
                           f"partition {partition.name}, so the job would pend for ever; lower runtime or "
                           "choose another partition")
    members = [node for node in (facts.nodes or {}).values() if partition.name in node.partitions]
    if submission.nodes > 1 and facts.nodes is not None and len(members) < submission.nodes:
        return "nodes", (f"nodes={submission.nodes} but partition {partition.name} has {len(members)} node(s), so "
                         "the job would pend for ever; lower nodes or choose another partition")
    if submission.memory and facts.nodes is not None:
        sizes = [node.real_memory for node in facts.nodes.values() if partition.name in node.partitions]
        limit = max(sizes) if sizes else None
        if partition.max_mem_per_node is not None:
            limit = min(limit, partition.max_mem_per_node) if limit is not None else partition.max_mem_per_node
        if limit is not None and submission.memory > limit:
            return "mem_mb", (f"{submission.memory_detail or submission.memory} MB in one allocation, above the "
                              f"{limit} MB of the largest node of partition {partition.name}; lower mem_mb "
                              "(or workers)")
    return None


def as_int(value: object, parse: Callable[[str], int | None]) -> int | None:
    """A default-resources value as an integer: an int, or text ``parse`` understands; else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        try:
            return parse(value.strip().strip("'\""))
        except ValueError:
            return None
    return None


def as_text(value: object) -> str | None:
    """A default-resources value as plain text (quotes from a YAML or shell string removed)."""
    if value is None:
        return None
    text = str(value).strip().strip("'\"")
    return text or None


RUNTIME_UNITS = {"s": 1 / 60, "m": 1, "min": 1, "h": 60, "d": 1440, "w": 10080}


def parse_runtime(text: str) -> int:
    """Minutes in a Snakemake ``runtime`` resource: ``90`` (minutes), ``90m``, ``1.5h``, ``2d``.

    :raises ValueError: for anything else (an expression such as ``attempt * 60``).
    """
    match = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([a-z]*)", text.strip().lower())
    if not match or match.group(2) not in {"", *RUNTIME_UNITS}:
        raise ValueError(f"not a runtime: {text!r}")
    return round(float(match.group(1)) * RUNTIME_UNITS.get(match.group(2), 1))


def parse_int(text: str) -> int:
    """A plain integer (``mem_mb``). :raises ValueError: otherwise."""
    return int(text)


def submission_from_resources(resources: Mapping[str, object], components: int, cpus: int,
                              user: str, nodes: int = 1) -> Submission:
    """The stack job's request from the profile's default-resources (raw values).

    Snakemake sums ``mem_mb`` over the components that run at the same time (``components``)
    and ``mem_mb_per_cpu`` over the job's CPUs; ``runtime`` is the stack's (collection and
    verification declare 0). A value that is an expression (``attempt * 60``) is not checked.
    """
    runtime = as_int(resources.get("runtime"), parse_runtime)
    per_component = as_int(resources.get("mem_mb"), parse_int)
    per_cpu = as_int(resources.get("mem_mb_per_cpu"), parse_int)
    memory, detail = None, ""
    if per_component:
        memory = per_component * components
        detail = f"mem_mb={per_component} x {components} components running at once = {memory}"
    elif per_cpu:
        memory = per_cpu * cpus
        detail = f"mem_mb_per_cpu={per_cpu} x {cpus} CPUs = {memory}"
    return Submission(account=as_text(resources.get("slurm_account")),
                      partition=as_text(resources.get("slurm_partition")),
                      runtime=runtime, memory=memory, memory_detail=detail, user=user,
                      runtime_text=as_text(resources.get("runtime")) or "", nodes=nodes)


# -- an allocation you already hold (salloc) --------------------------------------------

def allocation_nodes(nodelist: str, ask: Query = query) -> list[str] | None:
    """The node names of an allocation's ``$SLURM_JOB_NODELIST`` (``node[01-03]``), via scontrol.

    None when there is no nodelist or scontrol cannot expand it.
    """
    if not nodelist:
        return None
    expanded = ask(["scontrol", "show", "hostnames", nodelist])
    return expanded.split() if expanded is not None else None


#: The job step fields provenance records (``sacct --format``).
STEP_FIELDS = ("JobID", "JobName", "State", "ExitCode", "AllocCPUS", "TotalCPU", "Elapsed", "NodeList")


# -- the allocation's end -----------------------------------------------------
def end_time_from_env(environ: Mapping[str, str]) -> float:
    """``$SLURM_JOB_END_TIME`` (epoch seconds), or 0.0 when Slurm did not export it."""
    value = environ.get("SLURM_JOB_END_TIME", "")
    return float(value) if value.isdigit() else 0.0


def parse_end_time(text: str) -> int | None:
    """``squeue --format=%e`` (local time, e.g. ``2026-12-03T03:43:49``) -> epoch seconds; None for N/A, NONE..."""
    try:
        return int(time.mktime(time.strptime(text.strip(), "%Y-%m-%dT%H:%M:%S")))
    except ValueError:
        return None


def allocation_end(environ: Mapping[str, str]) -> int | None:
    """When the current allocation ends: ``$SLURM_JOB_END_TIME``, else ``squeue`` (Slurm 22.05 does not export it)."""
    exported = end_time_from_env(environ)
    if exported:
        return int(exported)
    job = environ.get("SLURM_JOB_ID")
    listing = query(["squeue", "--noheader", "--jobs", job, "--format=%e"]) if job else None
    return parse_end_time(listing) if listing else None


#: A job in one of these states (``squeue --format=%T``) still holds, or waits for, its allocation.
ACTIVE_STATES = frozenset({"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED", "REQUEUE_HOLD",
                           "REQUEUE_FED", "RESIZING", "SIGNALING", "STAGE_OUT", "STOPPED", "RESV_DEL_HOLD"})


def parse_job_active(text: str) -> bool:
    """Whether ``squeue --noheader --jobs JOB --format=%T`` output says the job is still active."""
    return any(state in ACTIVE_STATES for state in text.split())


def job_active(job_id: str, ask: Query = query) -> bool | None:
    """Whether Slurm job ``job_id`` is still pending or running; None when Slurm cannot tell (no such job any
    more: squeue forgets a job MinJobAge after its end)."""
    listing = ask(["squeue", "--noheader", "--jobs", job_id, "--format=%T"])
    return None if listing is None else parse_job_active(listing)


# -- job steps ----------------------------------------------------------------
def parse_step_ids(listing: str, name: str) -> list[str]:
    """The ids of the steps called ``name`` in ``squeue --steps --format='%i %j'`` output."""
    found = []
    for line in listing.splitlines():
        fields = line.split()
        if fields[1:] == [name]:
            found.append(fields[0])
    return found


def signal_step(job_id: str, name: str, signum: int) -> bool:
    """Send ``signum`` to the job step(s) called ``name``; False when none was found.

    ``scancel --signal`` delivers the signal to the step's tasks (through Apptainer, to the
    component). Signalling ``srun`` itself is not the same: on SIGTERM srun "forces job
    termination" (SIGKILL after KillWait) and the component never drains.
    """
    steps = step_ids(job_id, name)
    for step in steps:
        query(["scancel", f"--signal={signal.Signals(signum).name[3:]}", step])
    return bool(steps)


def step_ids(job_id: str, name: str) -> list[str]:
    """The ids (``JOB.STEP``) of the running job steps called ``name``."""
    return parse_step_ids(query(["squeue", "--steps", "--jobs", job_id, "--noheader", "--format=%i %j"]) or "", name)


def parse_listpids(text: str) -> list[int]:
    """The PIDs in ``scontrol listpids`` output: a header, then ``PID JOBID STEPID LOCALID GLOBALID`` lines."""
    return [int(fields[0]) for fields in map(str.split, text.splitlines()) if fields and fields[0].isdigit()]


def step_pids(job_id: str, name: str) -> list[int]:
    """The processes on this node of the job step(s) called ``name`` ([] when none is found)."""
    return [pid for step in step_ids(job_id, name) for pid in parse_listpids(query(["scontrol", "listpids", step]) or "")]


def parse_steps(text: str) -> list[dict[str, str]]:
    """``sacct --parsable2 --noheader --format=STEP_FIELDS`` output -> one dict per line."""
    return [dict(zip(STEP_FIELDS, line.split("|"), strict=False)) for line in text.splitlines() if line]


def job_steps(job_id: str | None) -> list[dict[str, str]] | None:
    """The allocation's job steps as accounting records them (None without Slurm accounting)."""
    if not job_id:
        return None
    text = query(["sacct", "--jobs", job_id, "--noheader", "--parsable2", f"--format={','.join(STEP_FIELDS)}"])
    return None if text is None else parse_steps(text)


# -- the cluster --------------------------------------------------------------
def parse_node_cpus(text: str) -> int | None:
    """The largest CPU count in ``sinfo --Node --format=%c`` output (``8``, or ``64+`` for a range)."""
    try:
        return max(int(cpus.rstrip("+")) for cpus in text.split())
    except ValueError:
        return None


def largest_node_cpus(ask: Query = query) -> int | None:
    """CPUs of the largest node Slurm reports, or None if it cannot tell."""
    text = ask(["sinfo", "--noheader", "--Node", "--format=%c"])
    return parse_node_cpus(text) if text else None


def version() -> str | None:
    """``sinfo --version``: e.g. ``slurm-wlm 22.05.8``."""
    lines = (query(["sinfo", "--version"]) or "").strip().splitlines()
    return lines[0] if lines else None
