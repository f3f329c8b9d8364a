#!/usr/bin/env python3
"""allocstack's benchmarks: one command, one table (and a PNG plot), all on this machine, in one run.

    make bench                      # or: .venv/bin/python benchmarks/run.py [--quick | --full]

1. Dispatch throughput of no-op tasks (message "x", repeat 1) through a real
   coordinator and real worker processes on loopback, against Dask distributed
   (LocalCluster, same task count and worker count) and a one-request-per-task
   stdlib client (urllib, a new connection per request: the reference's model).
   Timed alike: Dask from a warmed-up cluster, allocstack and the stdlib client
   from opening the gate with every worker process started and waiting for it;
   the worker start cost is printed beside (a cold rate).
   Batch 1 against the disk: the fsync rate of the journal's filesystem (append +
   fsync in a loop, same run) and batch 1's rate as a fraction of workers x that
   rate, with group commit's window and without it (and the mean latency per task).
2. Coordinator peak memory (VmHWM) and wall time from 1,000 to 100,000 tasks
   (``--full``: 1,000,000, of both shapes: the no-op tasks, and the realistic set below).
3. ``snakemake --cores 4`` on the baseline against Snakemake's own floor (a
   one-rule workflow), and the gate latency from the run's events.jsonl; the whole
   workflow end to end (collection and verification included) on 10,000 and
   100,000 tasks (``--full``: 1,000,000) against Dask's compute phase alone. The
   million runs twice: make_tasks.py's plain set (ids in order, "m<N>" twice) and
   its realistic one (``--shape realistic``, seed 31: shuffled ids of several forms,
   ASCII and non-ASCII messages with characters outside the BMP, quotes, backslashes
   and JSON escapes, repeats 1-9), in the same run, each with where its seconds went.
4. ``cluster``, when the Slurm test cluster and the test image are there
   (tests/cluster/prepare.sh): the baseline through ``--profile profiles/slurm``
   against a one-rule workflow through the same profile, and where the seconds go:
   the queue, the Snakemake plugin's batch step, the Snakemake it starts inside the
   job, the stack, collection and verification, the job's end, the plugin's polling.
5. ``multinode``, more than one node (when the 3-node test cluster is up: root,
   ``tests/cluster/slurm.sh start --nodes 3``): no-op tasks/s with 6 workers on 3
   namespaced nodes (2 each: the first node's over loopback, the others over the
   bridge with TLS, and once without) against 6 workers on 1 node, batch 1 and
   batch k; and what TLS costs per request, on loopback and between nodes.

6. ``compose``: the importer on the 31 real Compose files of tests/compose_corpus (each in-process, and one
   ``import_compose.py`` process end to end), and what starting a program of yours in its own image costs a
   component (replica.py with ``true``): on the host, in the redis stack image under Apptainer, under
   Charliecloud, and under Charliecloud with a read-only mount (its user namespace first); needs the stack
   images (tests/cluster/prepare.sh) for the image rows.

Numbers are measurements, not assertions: targets are printed beside them, with
"met" or "NOT met". The default run takes about 8 minutes on 2 CPUs, ``--full``
adds the million-task rows, batch 1 and Dask at 100,000 (about 6 minutes more),
``--quick`` is a smoke run. ``--parts cluster`` runs only part 4 (about 2 minutes),
``--parts multinode`` only part 5 (about 8), ``--parts compose`` only part 6 (about half a minute).

7. ``scale`` (only when asked: ``--parts scale``, about 3 minutes; ``--full`` adds the dry run at the limits,
   65,536 workers over 1,024 nodes, about 8 more): ``snakemake --dry-run`` from 16 to 16,384 workers over 1 to 256
   nodes, as planned and with each worker its own job; a real coordinator against 8, 4,096 and 16,384 simulated
   workers shaped as the plan shapes them (benchmarks/scale.py).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "workflow" / "scripts"
PYTHON = sys.executable
SNAKEMAKE = str(Path(PYTHON).parent / "snakemake")


def task_document(count: int) -> dict:
    return {"schemaVersion": 1,
            "tasks": [{"id": f"t{i:07d}", "payload": {"message": "x", "repeat": 1}} for i in range(count)]}


#: The realistic task set's seed (make_tasks.py --shape realistic --seed): the same set in every run.
REALISTIC_SEED = 31
_GENERATED: dict[tuple[str, int], tuple[Path, Path]] = {}


def generated_set(shape: str, count: int) -> tuple[Path, Path]:
    """make_tasks.py's task document and expected results of ``shape`` ("plain" or "realistic"), made once
    per benchmark run (a realistic million takes about half a minute) in a temporary directory."""
    if (shape, count) not in _GENERATED:
        directory = Path(tempfile.mkdtemp(prefix=f"allocstack-bench-{shape}-"))
        tasks, expected = directory / "tasks.json", directory / "expected.json"
        subprocess.run([PYTHON, str(SCRIPTS / "make_tasks.py"), str(count), "--shape", shape, "--seed",
                        str(REALISTIC_SEED), "--tasks", str(tasks), "--expected", str(expected)],
                       check=True, capture_output=True)
        _GENERATED[shape, count] = tasks, expected
    return _GENERATED[shape, count]


def remove_generated() -> None:
    for tasks, _ in _GENERATED.values():
        shutil.rmtree(tasks.parent, ignore_errors=True)
    _GENERATED.clear()


class Coordinator:
    """A real coordinator process in its own temporary directory (``prefix``: e.g. run it on a test-cluster node),
    on ``count`` no-op tasks, or on the task document ``tasks`` (linked, not copied)."""

    def __init__(self, count: int, workers: int, *extra: str, prefix: tuple[str, ...] = (),
                 tasks: Path | None = None) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="allocstack-bench-"))
        self.tasks = self.dir / "tasks.json"
        if tasks is None:
            self.tasks.write_text(json.dumps(task_document(count)))
        else:
            os.link(tasks, self.tasks)
        self.scratch = self.dir / "scratch"
        self.started = time.monotonic()
        self.proc = subprocess.Popen(
            [*prefix, PYTHON, str(SCRIPTS / "coordinator.py"), "--input", str(self.tasks), "--results",
             str(self.dir / "results.json"), "--scratch", str(self.scratch), "--end-record",
             str(self.dir / "end.json"), "--lease-seconds", "600", "--progress-interval", "3600",
             "--workers", str(workers), *extra],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        while not (self.scratch / "endpoint.json").exists():
            if self.proc.poll() is not None:
                raise RuntimeError("coordinator failed to start")
            time.sleep(0.01)
        self.ready_seconds = time.monotonic() - self.started
        endpoint = json.loads((self.scratch / "endpoint.json").read_text())
        self.url, self.token = endpoint["endpoint"], endpoint["token"]
        self.gate = self.dir / "gate.json"  # written by run_warm() once every worker waits for it

    def peak_rss_mb(self) -> float:
        with open(f"/proc/{self.proc.pid}/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
        return float("nan")

    def cpu_seconds(self) -> float:
        """CPU time (user + system) the coordinator process has used so far."""
        return process_cpu_seconds(self.proc.pid)

    def stop(self) -> dict:
        self.proc.terminate()
        self.proc.wait(timeout=120)
        end = json.loads((self.dir / "end.json").read_text())
        shutil.rmtree(self.dir, ignore_errors=True)
        return end


def start_warm(coordinator: Coordinator, argvs: list[list[str]]) -> tuple[list[subprocess.Popen], float]:
    """Start worker processes and wait until each says it is waiting at the gate.

    Like Dask's warmed-up LocalCluster: the clock starts when every worker is up (interpreter
    started, imports done) and only the gate record is missing. Returns the processes and the
    seconds they took to get there (the process start cost, reported separately).
    """
    started = time.monotonic()
    logs = [coordinator.dir / f"worker-{i}.log" for i in range(len(argvs))]
    procs = [subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=log.open("wb")) for argv, log in zip(argvs, logs, strict=True)]
    pending = set(range(len(procs)))
    while pending:
        for i in list(pending):
            if b"waiting for the readiness gate" in logs[i].read_bytes():
                pending.discard(i)
            elif procs[i].poll() is not None:
                raise RuntimeError(f"worker {i} exited before the gate: {logs[i].read_text()[-500:]}")
        time.sleep(0.005)
    return procs, time.monotonic() - started


def process_cpu_seconds(pid: int) -> float:
    """CPU time (user + system) process ``pid`` has used so far."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def children_cpu_seconds() -> float:
    """CPU time (user + system) of this process's children that have ended and been waited for."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_warm(coordinator: Coordinator, argvs: list[list[str]], cpu: dict | None = None) -> tuple[float, float]:
    """(seconds from opening the gate to the last worker exit, seconds the workers took to start).

    With ``cpu``, ``cpu["workers"]`` is set to the CPU seconds all the workers used from the gate to their exit.
    """
    procs, startup = start_warm(coordinator, argvs)
    at_gate = sum(process_cpu_seconds(proc.pid) for proc in procs)
    ended_before = children_cpu_seconds()
    started = time.monotonic()
    staged = coordinator.gate.with_suffix(".tmp")  # whole or absent: a worker may read it at any moment
    staged.write_text('{"status": "ready"}')
    os.replace(staged, coordinator.gate)
    for proc in procs:
        if proc.wait() != 0:
            raise RuntimeError(f"a worker failed: {proc.args}")
    elapsed = time.monotonic() - started
    if cpu is not None:
        cpu["workers"] = children_cpu_seconds() - ended_before - at_gate
    return elapsed, startup


def allocstack_rate(count: int, workers: int, batch: int, *extra: str, tasks: Path | None = None) -> tuple[float, dict]:
    """Tasks/s from opening the gate (workers started and waiting) to the last worker exit (``tasks``: a task
    document of ``count`` tasks to run instead of no-op tasks)."""
    coordinator = Coordinator(count, workers, *extra, tasks=tasks)
    argvs = [[PYTHON, str(SCRIPTS / "worker.py"), "--worker-id", f"worker-{i:02d}", "--scratch",
              str(coordinator.scratch), "--gate-record", str(coordinator.gate), "--batch", str(batch)]
             for i in range(1, workers + 1)]
    cpu_before, workers_cpu = coordinator.cpu_seconds(), {}
    elapsed, startup = run_warm(coordinator, argvs, workers_cpu)
    cpu = coordinator.cpu_seconds() - cpu_before
    peak = coordinator.peak_rss_mb()
    end = coordinator.stop()
    assert end["resultCount"] == count, end
    return count / elapsed, {"peak": peak, "fsyncs": end["journalFsyncs"], "ready": coordinator.ready_seconds,
                             "elapsed": elapsed, "startup": startup, "cpu_us_per_task": cpu / count * 1e6,
                             "worker_cpu_us_per_task": workers_cpu["workers"] / count * 1e6}


STDLIB_WORKER = r"""
import hashlib, json, os, sys, time, urllib.request
url, token, worker, gate = sys.argv[1:5]
print("waiting for the readiness gate", file=sys.stderr, flush=True)
while not os.path.exists(gate):
    time.sleep(0.02)
def post(path, body):
    request = urllib.request.Request(url + path, data=json.dumps(body).encode(),
        headers={"Authorization": "Bearer " + token, "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request) as response:
            return json.load(response)
    except urllib.error.HTTPError as error:
        return json.load(error)
while True:
    reply = post("/claim", {"workerId": worker})
    if reply["status"] == "done":
        break
    if reply["status"] != "task":
        continue
    task = reply["task"]
    output = task["payload"]["message"] * task["payload"]["repeat"]
    post("/result", {"workerId": worker, "taskId": task["id"], "output": output,
                     "sha256": hashlib.sha256(output.encode()).hexdigest()})
"""


def stdlib_rate(count: int, workers: int) -> float:
    """The reference's model (one urllib request per claim and per result), timed like allocstack."""
    coordinator = Coordinator(count, workers)
    argvs = [[PYTHON, "-c", STDLIB_WORKER, coordinator.url, coordinator.token, f"w{i}", str(coordinator.gate)]
             for i in range(workers)]
    elapsed, _ = run_warm(coordinator, argvs)
    coordinator.stop()
    return count / elapsed


def noop(i: int) -> int:
    return i


def dask_rate(count: int, workers: int) -> float | None:
    try:
        from dask.distributed import Client, LocalCluster
    except ImportError:
        return None
    with LocalCluster(n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=None,
                      silence_logs=50) as cluster, Client(cluster) as client:
        client.submit(noop, -1).result()  # warm up: workers connected
        started = time.monotonic()
        futures = client.map(noop, range(count), pure=False)
        client.gather(futures)
        return count / (time.monotonic() - started)


def snakemake_overhead(runs: int) -> dict:
    """Baseline `snakemake --cores 4` vs a one-rule workflow, and the gate latency from events.jsonl."""
    results: dict[str, list[float]] = {"baseline": [], "floor": [], "listening_to_gate": [], "gate_to_claim": []}
    for _ in range(runs):
        work = workflow_copy("allocstack-bench-smk-")
        floor = work / "floor"
        floor.mkdir()
        (floor / "Snakefile").write_text('rule all:\n    output: "done.txt"\n    shell: "touch {output}"\n')
        env = {**os.environ, "TMPDIR": str(work)}
        started = time.monotonic()
        subprocess.run([SNAKEMAKE, "--cores", "4"], cwd=work, env=env, check=True, capture_output=True)
        results["baseline"].append(time.monotonic() - started)
        started = time.monotonic()
        subprocess.run([SNAKEMAKE, "--cores", "4"], cwd=floor, env=env, check=True, capture_output=True)
        results["floor"].append(time.monotonic() - started)
        events = [json.loads(line) for line in (work / "results/baseline/events.jsonl").read_text().splitlines()]
        first = {e["event"]: e["t"] for e in reversed(events)}
        results["listening_to_gate"].append(first["gate-passed"] - first["coordinator-listening"])
        results["gate_to_claim"].append(first["first-claim"] - first["gate-passed"])
        shutil.rmtree(work, ignore_errors=True)
    return {key: statistics.median(values) for key, values in results.items()}


def fsync_rate(seconds: float = 2.0) -> float:
    """Appends + fsyncs per second of a journal-sized line, in a loop, on the filesystem the benchmark's
    coordinators keep their journal on (the temporary directory): the disk's limit for batch 1."""
    directory = Path(tempfile.mkdtemp(prefix="allocstack-bench-fsync-"))
    line = b'{"kind":"result","output":"x","sha256":"' + b"0" * 64 + b'","taskId":"t0000000","workerId":"worker-01"}\n'
    fd = os.open(directory / "journal.jsonl", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        count, started = 0, time.monotonic()
        while time.monotonic() - started < seconds:
            os.write(fd, line)
            os.fsync(fd)
            count += 1
        return count / (time.monotonic() - started)
    finally:
        os.close(fd)
        shutil.rmtree(directory, ignore_errors=True)


def workflow_copy(prefix: str) -> Path:
    work = Path(tempfile.mkdtemp(prefix=prefix))
    for part in ("Snakefile", "workflow", "config", "inputs", "expected", "profiles"):
        source = ROOT / part
        (shutil.copytree if source.is_dir() else shutil.copy2)(source, work / part)
    return work


def snakemake_end_to_end(count: int, workers: int = 2, batch: int = 256, shape: str = "plain") -> dict:
    """``snakemake --cores 4`` on ``count`` generated tasks of ``shape`` (make_tasks.py), collection and
    verification included: the command's wall time, the coordinator's peak RSS (from its end record), and
    where the seconds went (:func:`phases`)."""
    import yaml

    work = workflow_copy("allocstack-bench-e2e-")
    try:
        tasks, expected = f"inputs/tasks-{count}.json", f"expected/results-{count}.json"
        for made, there in zip(generated_set(shape, count), (tasks, expected), strict=True):
            os.link(made, work / there)
        config = yaml.safe_load((work / "config/config.yaml").read_text())
        config.update(tasks=tasks, expected=expected, run=f"n{count}", workers=workers)
        config["worker"]["batch"] = batch
        (work / "config/bench.yaml").write_text(yaml.safe_dump(config))
        env = {**os.environ, "TMPDIR": str(work)}
        started, wall = time.monotonic(), time.time()
        subprocess.run([SNAKEMAKE, "--cores", "4", "--configfile", "config/bench.yaml"], cwd=work, env=env,
                       check=True, capture_output=True)
        seconds = time.monotonic() - started
        end = json.loads((work / f"results/n{count}/coordinator.json").read_text())
        return {"seconds": seconds, "peak": end.get("peakRssMb", float("nan")),
                "phases": phases(work, f"n{count}", wall, wall + seconds)}
    finally:
        shutil.rmtree(work, ignore_errors=True)


#: The phases of a run end to end (:func:`phases`), in order.
PHASES = ("Snakemake's start, validate_inputs", "-> coordinator listening (its start, the task set loaded)",
          "-> gate passed", "-> last worker ended (dispatch)", "-> results.json written (on completion)",
          "-> coordinator exited (Snakemake ends the group)", "-> collect_results done",
          "-> verify_results done", "-> Snakemake exits (the summary)")


def phases(work: Path, run: str, started: float, ended: float) -> dict[str, float]:
    """Seconds between the moments a run's events and logs record, from the command's start (``started``,
    epoch seconds) to its exit (``ended``); see :data:`PHASES`. (Logs, not outputs: Snakemake touches a
    group's outputs when the group ends.)"""
    events = [json.loads(line) for line in (work / f"results/{run}/events.jsonl").read_text().splitlines()]
    first = {e["event"]: e["t"] for e in reversed(events)}

    def logged(rule: str) -> float:
        return (work / f"logs/{rule}/{run}.log").stat().st_mtime

    moments = [started, logged("validate_inputs"), first["coordinator-listening"], first["gate-passed"],
               max(e["t"] for e in events if e["event"] == "worker-end"), first["coordinator-end"],
               logged("serve_coordinator"), logged("collect_results"), logged("verify_results"), ended]
    return {name: after - before for name, before, after in zip(PHASES, moments[:-1], moments[1:], strict=True)}


def verdict(met: bool) -> str:
    return "met" if met else "**NOT met**"


CLUSTER_RUNS = 3
IMAGE = os.environ.get("ALLOCSTACK_TEST_IMAGE", "/opt/allocstack-apptainer/images/allocstack-test.sif")


def cluster_missing() -> str | None:
    """Why the cluster part cannot run here, or None."""
    if shutil.which("sbatch") is None or shutil.which("apptainer") is None:
        return "no Slurm client or apptainer on PATH (as root: tests/cluster/prepare.sh; . tests/cluster/env.sh)"
    if subprocess.run(["sinfo"], capture_output=True, timeout=20, check=False).returncode != 0:
        return "no Slurm controller answers (tests/cluster/slurm.sh start)"
    if not os.path.exists(IMAGE + ".sha256"):
        return f"no test image at {IMAGE} (tests/cluster/prepare.sh builds it)"
    return None


def slurm_epoch(text: str) -> float | None:
    """Epoch seconds of a sacct time (local time, whole seconds), None for Unknown/None."""
    try:
        return time.mktime(time.strptime(text, "%Y-%m-%dT%H:%M:%S"))
    except ValueError:
        return None


def sacct_times(job: str, steps: set[str]) -> dict[str, dict[str, float | None]]:
    """The job's and its steps' Submit/Start/End by step name ("job", "batch", "python3", "coordinator", ...),
    once accounting has the job's end and ``steps``."""
    for _ in range(40):  # slurmdbd records a step when it ends
        listing = subprocess.run(["sacct", "-j", job, "--noheader", "--parsable2",
                                  "--format=JobID,JobName,Submit,Start,End,State"],
                                 capture_output=True, text=True, timeout=30, check=False).stdout
        rows = [line.split("|") for line in listing.splitlines() if line]
        found = {("job" if jobid == job else name): {"submit": slurm_epoch(submit), "start": slurm_epoch(start),
                                                    "end": slurm_epoch(end)}
                 for jobid, name, submit, start, end, state in rows}
        if found.get("job", {}).get("end") and steps <= set(found):
            return found
        time.sleep(0.5)
    return found


def profile_run(workdir: Path, *extra: str) -> dict[str, float | str]:
    """``snakemake --profile profiles/slurm`` in ``workdir``: wall time, submission time, the Slurm job id."""
    command = [SNAKEMAKE, "--profile", "profiles/slurm", "--config", f"image={IMAGE}", *extra]
    started = time.time()
    proc = subprocess.Popen(["timeout", "-k", "10", "300", *command], cwd=workdir, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env={**os.environ, "TMPDIR": str(workdir)})
    submitted, job = None, ""
    for line in proc.stdout:
        if "submitted with SLURM jobid" in line and submitted is None:
            submitted, job = time.time(), line.split("SLURM jobid")[1].split()[0]
    if proc.wait() != 0 or not job:
        raise RuntimeError(f"snakemake --profile profiles/slurm failed in {workdir}")
    return {"started": started, "submitted": submitted, "ended": time.time(), "job": job}


def median_table(rows: dict[str, list[float]]) -> dict[str, float]:
    return {key: statistics.median(values) for key, values in rows.items() if values}


def cluster_overhead(runs: int) -> tuple[dict[str, float], dict[str, float]]:
    """The baseline and the one-rule floor through the Slurm profile: medians of each phase."""
    baseline: dict[str, list[float]] = {}
    floor: dict[str, list[float]] = {}
    for _ in range(runs):
        work = workflow_copy("allocstack-bench-slurm-")
        run = profile_run(work)
        times = sacct_times(run["job"], {"python3", "verify"})
        job, inner = times["job"], times["python3"]
        events = [json.loads(line) for line in (work / "results/baseline/events.jsonl").read_text().splitlines()]
        first = {e["event"]: e["t"] for e in reversed(events)}
        last_worker = max(e["t"] for e in events if e["event"] == "worker-end")
        verified = times["verify"]["end"]  # result.json's mtime is the outer Snakemake's touch
        phases = {
            "command -> exit": run["ended"] - run["started"],
            "submission -> exit": run["ended"] - run["submitted"],
            "in the job (sacct Elapsed)": job["end"] - job["start"],
            "command -> submission": run["submitted"] - run["started"],
            "queue (sacct Submit -> Start)": job["start"] - job["submit"],
            "job start -> Snakemake step in the job starts": inner["start"] - job["start"],
            "that step starts -> coordinator listening": first["coordinator-listening"] - inner["start"],
            "coordinator listening -> gate passed": first["gate-passed"] - first["coordinator-listening"],
            "gate passed -> last worker done": last_worker - first["gate-passed"],
            "last worker done -> verified (group end, collect, verify)": verified - last_worker,
            "verified -> Snakemake step in the job ends": inner["end"] - verified,
            "that step ends -> job ends": job["end"] - inner["end"],
            "job ends -> Snakemake exits (status polling)": run["ended"] - job["end"],
        }
        for key, value in phases.items():
            baseline.setdefault(key, []).append(value)
        one_rule = work / "floor"
        one_rule.mkdir()
        (one_rule / "Snakefile").write_text('rule all:\n    output: "done.txt"\n    shell: "touch {output}"\n')
        shutil.copytree(ROOT / "profiles", one_rule / "profiles")
        run = profile_run(one_rule)
        times = sacct_times(run["job"], {"python3"})
        floor.setdefault("command -> exit", []).append(run["ended"] - run["started"])
        floor.setdefault("submission -> exit", []).append(run["ended"] - run["submitted"])
        floor.setdefault("in the job (sacct Elapsed)", []).append(times["job"]["end"] - times["job"]["start"])
        floor.setdefault("job ends -> Snakemake exits (status polling)", []).append(run["ended"] - times["job"]["end"])
        shutil.rmtree(work, ignore_errors=True)
    return median_table(baseline), median_table(floor)


def print_cluster(runs: int) -> None:
    missing = cluster_missing()
    if missing:
        print(f"\ncluster part skipped: {missing}")
        return
    baseline, floor = cluster_overhead(runs)
    print(f"\n| Slurm profile, test cluster (median of {runs}; sacct times are whole seconds) | baseline | "
          "one-rule floor | target |\n|---|---|---|---|")
    targets = {"submission -> exit": "<= 13", "in the job (sacct Elapsed)": "<= 5"}
    for key, value in baseline.items():
        other = f"{floor[key]:.2f}" if key in floor else ""
        print(f"| {key} | {value:.2f} | {other} | {targets.get(key, '')} |")


# -- 5. more than one node -----------------------------------------------------------------
SLURM_SH = ROOT / "tests" / "cluster" / "slurm.sh"
SLURM_STATE = Path(os.environ.get("ALLOCSTACK_SLURM_STATE", "/var/lib/allocstack-slurm"))


def cluster_layout() -> dict | None:
    """The namespaced nodes of the 3-node test cluster when it is up (and we may enter them), else None."""
    try:
        layout = json.loads((SLURM_STATE / "multi" / "layout.json").read_text())
    except (OSError, ValueError):
        return None
    return layout if os.geteuid() == 0 and len(layout.get("nodes", {})) >= 3 else None


def on_node(node: str) -> tuple[str, ...]:
    """Run a command inside test-cluster node ``node`` (its network namespace and hostname)."""
    return ("bash", str(SLURM_SH), "exec", node)


def multinode_rate(count: int, placement: list[str], batch: int, tls: bool) -> tuple[float, Coordinator]:
    """Tasks/s from opening the gate, the coordinator on the first node of ``placement``.

    Workers on the coordinator's node use loopback, the others its network endpoint
    (the address its hostname resolves to; TLS unless ``tls`` is False), as in a run.
    """
    first = placement[0]
    shared = Path(tempfile.mkdtemp(prefix="allocstack-bench-shared-")) / "run" / "endpoint.json"
    coordinator = Coordinator(count, len(placement), "--network-endpoint-file", str(shared),
                              *(() if tls else ("--no-tls",)), prefix=on_node(first))
    deadline = time.monotonic() + 30
    while not shared.exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    argvs = [[*on_node(node), PYTHON, str(SCRIPTS / "worker.py"), "--worker-id", f"worker-{i:02d}", "--scratch",
              str(coordinator.scratch), "--gate-record", str(coordinator.gate), "--batch", str(batch),
              *(() if node == first else ("--endpoint-file", str(shared)))]
             for i, node in enumerate(placement, start=1)]
    elapsed, _ = run_warm(coordinator, argvs)
    coordinator.stop()
    shutil.rmtree(shared.parent.parent, ignore_errors=True)
    return count / elapsed, coordinator


def request_costs(endpoint_files: list[Path], rounds: int = 7, requests_per_round: int = 1000,
                  connections: int = 20) -> list[dict]:
    """Per endpoint: the time of one request on a kept-alive connection (the best of ``rounds``
    rounds, which run in turn across the endpoints so they share the machine's noise), and the
    median time of a first request on a new connection (TCP, and the TLS handshake with https)."""
    sys.path.insert(0, str(SCRIPTS))
    from allocstack.common.endpoint import read_endpoint
    from allocstack.worker.client import CoordinatorClient

    endpoints = [read_endpoint(path) for path in endpoint_files]

    def client(endpoint) -> CoordinatorClient:
        return CoordinatorClient(endpoint.url, endpoint.token, fingerprint=endpoint.fingerprint)

    warm = [client(endpoint) for endpoint in endpoints]
    for session in warm:
        session.heartbeat("bench", [])
    best = [float("inf")] * len(endpoints)
    firsts: list[list[float]] = [[] for _ in endpoints]
    for _ in range(rounds):
        for i, session in enumerate(warm):
            started = time.perf_counter()
            for _ in range(requests_per_round):
                session.heartbeat("bench", [])
            best[i] = min(best[i], (time.perf_counter() - started) / requests_per_round)
    for _ in range(connections):
        for i, endpoint in enumerate(endpoints):
            fresh = client(endpoint)
            started = time.perf_counter()
            fresh.heartbeat("bench", [])
            firsts[i].append(time.perf_counter() - started)
            fresh.close()
    return [{"requestMicroseconds": best[i] * 1e6, "newConnectionMilliseconds": statistics.median(firsts[i]) * 1e3}
            for i in range(len(endpoints))]


def costs_against(where: tuple[str, ...], client_node: tuple[str, ...], address: str | None) -> list[dict]:
    """Two coordinators (``where``), plain and TLS; requests to their network endpoints from ``client_node``."""
    started = []
    for tls in (False, True):
        shared = Path(tempfile.mkdtemp(prefix="allocstack-bench-shared-")) / "run" / "endpoint.json"
        extra = ("--network-endpoint-file", str(shared), *(() if tls else ("--no-tls",)),
                 *(("--address", address) if address else ()))
        started.append((Coordinator(10, 1, *extra, prefix=where), shared))
    for _, shared in started:
        deadline = time.monotonic() + 30
        while not shared.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
    done = subprocess.run([*client_node, PYTHON, str(Path(__file__).resolve()), "--measure-requests",
                           *(str(shared) for _, shared in started)],
                          capture_output=True, text=True, timeout=900, check=True)
    for coordinator, shared in started:
        coordinator.stop()
        shutil.rmtree(shared.parent.parent, ignore_errors=True)
    return json.loads(done.stdout)


def multinode_part(args) -> None:
    """The multinode part: 6 workers on 3 nodes against 6 on 1 node, and what TLS costs per request."""
    print("\n| one client, /heartbeat (best of 7 x 1,000, plain and TLS in turn) | per request | first request "
          "on a new connection (median of 20) |\n|---|---|---|", flush=True)
    plain, secure = costs_against((), (), address="127.0.0.1")
    rows = [("loopback, plain HTTP", plain), ("loopback, TLS (the run's certificate, pinned)", secure)]
    layout = cluster_layout()
    if layout is not None:
        first, second = sorted(layout["nodes"])[:2]
        across = costs_against(on_node(first), on_node(second), address=None)
        rows += [(f"{second} -> {first} over the bridge, plain HTTP (network.tls: false)", across[0]),
                 (f"{second} -> {first} over the bridge, TLS", across[1])]
    for label, cost in rows:
        print(f"| {label} | {cost['requestMicroseconds']:,.0f} µs | {cost['newConnectionMilliseconds']:.2f} ms |",
              flush=True)
    for where, (clear, tls) in (("on loopback", (plain, secure)),
                                *((("between nodes", tuple(across)),) if layout is not None else ())):
        print(f"TLS costs {tls['requestMicroseconds'] - clear['requestMicroseconds']:,.0f} µs per request {where} "
              f"and {tls['newConnectionMilliseconds'] - clear['newConnectionMilliseconds']:.2f} ms per new "
              "connection (the handshake; a worker keeps its connection for the whole run).", flush=True)
    if layout is None:
        print("\n(the rest of the multinode part needs the 3-node test cluster: as root, "
              "tests/cluster/slurm.sh start --nodes 3)")
        return
    nodes = sorted(layout["nodes"])
    count = {1: 4_000 if args.quick else 20_000, args.batch: 50_000 if args.quick else 200_000}
    print("\n| 6 workers (no-op tasks/s, median of 3) | batch 1 | batch "
          f"{args.batch} |\n|---|---|---|", flush=True)
    layouts = [("on 1 node (loopback)", [nodes[0]] * 6, True),
               ("on 3 nodes, 2 each, TLS between nodes", [n for n in nodes[:3] for _ in range(2)], True),
               ("on 3 nodes, 2 each, plain HTTP between nodes", [n for n in nodes[:3] for _ in range(2)], False)]
    for label, placement, tls in layouts:
        rates = [statistics.median(multinode_rate(count[batch], placement, batch, tls)[0] for _ in range(3))
                 for batch in (1, args.batch)]
        print(f"| {label} | {rates[0]:,.0f} | {rates[1]:,.0f} |", flush=True)


def compose_import_times() -> tuple[list[float], float]:
    """Seconds to import each corpus file in-process (its .env, no environment), and one import_compose.py process
    on the largest (the process's start, reading, mapping, the schema check, writing)."""
    sys.path.insert(0, str(SCRIPTS))
    import import_compose

    from allocstack.compose.interpolation import Variables, read_env_file
    from allocstack.compose.mapping import combine, import_stack

    corpus = ROOT / "tests" / "compose_corpus"
    times = []
    for folder in sorted(path for path in corpus.iterdir() if path.is_dir()):
        started = time.perf_counter()
        dotenv = folder / ".env"
        variables = Variables({"PWD": str(folder)}, [(".env", read_env_file(dotenv))] if dotenv.is_file() else [])
        import_stack(combine([import_compose.load(folder / "compose.yaml")]), folder, ROOT, folder.name,
                     variables=variables)
        times.append(time.perf_counter() - started)
    largest = max((path for path in corpus.glob("*/compose.yaml")), key=lambda path: path.stat().st_size)
    with tempfile.TemporaryDirectory() as tmp:
        started = time.perf_counter()
        subprocess.run([PYTHON, str(SCRIPTS / "import_compose.py"), str(largest), "--output", f"{tmp}/x.yaml",
                        "--project-dir", str(ROOT)], capture_output=True, check=False, cwd=ROOT, env={"PWD": tmp,
                                                                                                        "PATH": os.environ["PATH"]})
        process = time.perf_counter() - started
    return times, process


def program_start_cost(image: str | None, runtime: str, read_only: bool = False, runs: int = 5) -> float:
    """Median seconds of replica.py running ``true``: on the host (``image`` None) or in ``image``."""
    samples = []
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "scratch").mkdir(mode=0o700)
        (Path(tmp) / "in").mkdir()
        argv = [PYTHON, str(SCRIPTS / "replica.py"), "--worker-id", "worker-01", "--index", "0", "--workers", "1",
                "--scratch", f"{tmp}/scratch", "--command-json", json.dumps(["true"])]
        if image:
            argv += ["--image", image, "--runtime", runtime]
            if runtime == "apptainer":
                argv += ["--runtime-arg=--cleanenv", "--runtime-arg=--contain"]
            if read_only:
                argv += ["--mounts-json", json.dumps([{"target": "/mnt", "source": f"{tmp}/in", "read_only": True}])]
        environ = {**os.environ, "USER": os.environ.get("USER") or "root"}
        for _ in range(runs):
            started = time.perf_counter()
            done = subprocess.run(argv, capture_output=True, check=False, env=environ, cwd=tmp)
            samples.append(time.perf_counter() - started)
            if done.returncode != 0:
                return float("nan")
    return statistics.median(samples)


def print_compose() -> None:
    print("\n## Compose: the importer, and a program's start in its own image", flush=True)
    times, process = compose_import_times()
    print(f"import, in-process, {len(times)} corpus files: median {statistics.median(times) * 1000:.1f} ms, "
          f"max {max(times) * 1000:.1f} ms, all {sum(times):.2f} s", flush=True)
    print(f"import_compose.py, one process on the largest file (start, map, schema check, write): {process:.2f} s",
          flush=True)
    stacks = os.environ.get("ALLOCSTACK_STACK_IMAGES", "")
    stacks_ch = os.environ.get("ALLOCSTACK_STACK_IMAGES_CHARLIECLOUD", "")
    rows = {"host (no image)": program_start_cost(None, "apptainer")}
    if shutil.which("apptainer") and Path(stacks, "redis.sif").exists():
        rows["Apptainer, redis.sif"] = program_start_cost(f"{stacks}/redis.sif", "apptainer")
    if shutil.which("ch-run") and Path(stacks_ch, "redis").is_dir():
        rows["Charliecloud, redis/ (directory)"] = program_start_cost(f"{stacks_ch}/redis", "charliecloud")
        rows["Charliecloud, a read-only mount"] = program_start_cost(f"{stacks_ch}/redis", "charliecloud", True)
    host = rows["host (no image)"]
    print("a component running `true` in its program's own image (replica.py, median of 5):", flush=True)
    for name, seconds in rows.items():
        print(f"  {name:36} {seconds * 1000:7.0f} ms  (+{(seconds - host) * 1000:.0f} over the host)", flush=True)


def machine() -> str:
    cpuinfo = Path("/proc/cpuinfo").read_text().splitlines()
    cpu = next((line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name")), "unknown CPU")
    meminfo = Path("/proc/meminfo").read_text().splitlines()
    memory = next(int(line.split()[1]) for line in meminfo if line.startswith("MemTotal")) / 2**20
    return f"{os.cpu_count()} CPUs ({cpu}), {memory:.0f} GiB, Python {sys.version.split()[0]}"


def plot(path: Path, throughput: list[tuple[str, float]], memory: list[tuple[int, float, float]]) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    figure, (left, right) = plt.subplots(1, 2, figsize=(13, 5))
    labels, rates = zip(*throughput, strict=False)
    left.barh(labels, rates, color=["#2b6cb0" if label.startswith("allocstack") else "#a0aec0" for label in labels])
    left.set_xscale("log")
    left.set_xlabel("no-op tasks per second (log scale)")
    left.set_title("Dispatch throughput")
    left.invert_yaxis()
    counts, peaks, walls = zip(*memory, strict=False)
    right.loglog(counts, peaks, "o-", label="coordinator peak RSS (MB)")
    right.loglog(counts, walls, "s-", label="wall time (s)")
    right.set_xlabel("tasks")
    right.set_title("Scale")
    right.legend()
    right.grid(True, which="both", alpha=0.3)
    figure.suptitle(f"allocstack benchmarks — {machine()}", fontsize=9)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    return True


def print_throughput(args: argparse.Namespace, sizes: tuple[int, ...]) -> tuple[list[tuple[str, float]], dict]:
    """Part 1: the dispatch table. Returns the plot's bars and the Dask rates by (count, workers)."""
    throughput: list[tuple[str, float]] = []
    dask_rates: dict[tuple[int, int], float] = {}
    print("| run | tasks | workers | tasks/s | notes | target |\n|---|---|---|---|---|---|", flush=True)
    for workers in (2, 8):
        stdlib = stdlib_rate(sizes[0], workers)  # the smaller size only: ~1,500 tasks/s would add 2 minutes at 100k
        for count in sizes:
            # Dask runs ~500 tasks/s here: 100,000 would take minutes (--full); its rate does not depend on the count
            dask = dask_rate(count, workers) if count == sizes[0] or (args.full and workers == 2) else None
            if dask:
                dask_rates[count, workers] = dask
            for batch in (1, args.batch):
                if batch == 1 and count > sizes[0] and not args.full:
                    continue  # batch 1 is bound by the disk: the smaller size says it (--full: both)
                rate, info = allocstack_rate(count, workers, batch)
                ratios = [f"{rate / stdlib:.1f}x stdlib"]
                if dask:
                    ratios.append(f"{rate / dask:.1f}x Dask")
                cold = count / (info["elapsed"] + info["startup"])
                target = ""
                if batch != 1 and workers == 2 and count == sizes[-1]:
                    target = f">= 100,000: {verdict(rate >= 100_000)}"
                line = (f"| allocstack batch {batch} | {count:,} | {workers} | {rate:,.0f} | "
                        f"{', '.join(ratios)}; {info['fsyncs']} fsyncs; coordinator "
                        f"{info['cpu_us_per_task']:.0f} µs CPU/task; {cold:,.0f}/s counting "
                        f"the {info['startup']:.2f} s worker start | {target} |")
                print(line, flush=True)
                throughput.append((f"allocstack b{batch} {count // 1000}k w{workers}", rate))
            if dask:
                print(f"| Dask LocalCluster | {count:,} | {workers} | {dask:,.0f} | | |", flush=True)
                throughput.append((f"Dask {count // 1000}k w{workers}", dask))
        print(f"| stdlib 1 req/task | {sizes[0]:,} | {workers} | {stdlib:,.0f} | | |", flush=True)
        throughput.append((f"stdlib 1 req/task {sizes[0] // 1000}k w{workers}", stdlib))
    return throughput, dask_rates


def print_batch_one(count: int, workers: int = 2) -> None:
    """Batch 1 against the disk's own fsync rate, with group commit's window and without it."""
    disk = fsync_rate()
    limit = workers * disk
    print(f"\n| batch 1, {workers} workers, {count:,} tasks | tasks/s | of {workers} x fsync rate | results per fsync | "
          f"mean latency per task | CPU per task: coordinator, worker | target |\n|---|---|---|---|---|---|---|")
    print(f"| the disk: append + fsync in a loop (journal's filesystem) | {disk:,.0f} fsyncs/s | | | | | |")
    for label, extra in (("group commit (window <= 2 ms)", ()), ("no window (--commit-window 0)", ("--commit-window", "0"))):
        rate, info = allocstack_rate(count, workers, 1, *extra)
        fraction = rate / limit
        met = fraction >= 0.8 or rate >= 1500
        latency = workers / rate * 1000  # closed loop: each worker has one task in flight
        print(f"| {label} | {rate:,.0f} | {fraction:.2f} | {count / max(1, info['fsyncs']):.2f} | {latency:.2f} ms | "
              f"{info['cpu_us_per_task']:.0f} µs, {info['worker_cpu_us_per_task']:.0f} µs | "
              f">= 0.80 or >= 1,500/s: {verdict(met) if not extra else '(reference)'} |", flush=True)


def print_scale(args: argparse.Namespace, scale: tuple[int, ...]) -> list[tuple[int, float, float]]:
    print("\n| tasks | coordinator peak RSS | KiB/task | start -> listening (parse+validate) | wall, 2 workers batch k | "
          "target |\n|---|---|---|---|---|---|", flush=True)
    memory = []
    for count in scale:
        for shape in ("no-op", "realistic") if count == 1_000_000 else ("no-op",):
            tasks = generated_set(shape, count)[0] if shape == "realistic" else None
            rate, info = allocstack_rate(count, 2, args.batch, tasks=tasks)
            target = ""
            if count == 1_000_000:
                target = (f"peak <= 300 MB: {verdict(info['peak'] <= 300)}; start <= 2 s: "
                          f"{verdict(info['ready'] <= 2)}; dispatch <= 10 s: {verdict(info['elapsed'] <= 10)}")
            label = f"{count:,}" + (f", realistic (seed {REALISTIC_SEED})" if tasks else "")
            print(f"| {label} | {info['peak']:.0f} MB | {info['peak'] * 1024 / count:.2f} | {info['ready']:.2f} s | "
                  f"{info['elapsed']:.1f} s ({rate:,.0f} tasks/s) | {target} |", flush=True)
            if not tasks:
                memory.append((count, info["peak"], info["elapsed"]))
    return memory


def print_snakemake(args: argparse.Namespace, sizes: tuple[int, ...], dask_rates: dict) -> None:
    overhead = snakemake_overhead(1 if args.quick else 3)
    difference = overhead["baseline"] - overhead["floor"]
    print(f"\n| Snakemake (median of {1 if args.quick else 3}) | seconds | target |\n|---|---|---|")
    print(f"| `snakemake --cores 4` baseline | {overhead['baseline']:.2f} | |")
    print(f"| one-rule floor | {overhead['floor']:.2f} | |")
    print(f"| difference | {difference:.2f} | <= 2.2: {verdict(difference <= 2.2)} |")
    print(f"| coordinator listening -> gate passed | {overhead['listening_to_gate']:.3f} | |")
    print(f"| gate passed -> first claim | {overhead['gate_to_claim']:.3f} | < 0.5: "
          f"{verdict(overhead['gate_to_claim'] < 0.5)} |", flush=True)
    counts = [*sizes, *((1_000_000,) if args.full else ())]
    print("\n| end to end, `snakemake --cores 4`, 2 workers, batch k | seconds | coordinator peak | "
          "Dask compute alone (2 workers) | speed-up | target |\n|---|---|---|---|---|---|")
    millions = {}
    for count, shape in [(count, "plain") for count in counts] + ([(1_000_000, "realistic")] if args.full else []):
        run = snakemake_end_to_end(count, 2, args.batch, shape)
        if count == 1_000_000:
            millions[shape] = run
        if shape == "realistic":
            trivial = millions["plain"]["seconds"]
            print(f"| {count:,} tasks, realistic (seed {REALISTIC_SEED}) | {run['seconds']:.1f} | {run['peak']:.0f} MB "
                  f"| | | <= 25 s: {verdict(run['seconds'] <= 25)}; peak <= 300 MB: {verdict(run['peak'] <= 300)}; "
                  f"<= 1.4x the plain set's {trivial:.1f} s ({run['seconds'] / trivial:.2f}x): "
                  f"{verdict(run['seconds'] <= 1.4 * trivial)} |", flush=True)
            continue
        dask = dask_rates.get((count, 2))
        measured = dask is not None
        dask = dask or dask_rates.get((sizes[0], 2))  # at the smaller size's rate (Dask's rate is flat in the count)
        dask_seconds = count / dask if dask else None
        ratio = dask_seconds / run["seconds"] if dask_seconds else None
        wanted = {10_000: 5, 100_000: 20}.get(count)
        target = f">= {wanted}x Dask: {verdict(ratio >= wanted)}" if wanted and ratio else ""
        if count == 1_000_000:
            target = (f"<= 25 s: {verdict(run['seconds'] <= 25)}; peak <= 300 MB: {verdict(run['peak'] <= 300)}")
        print(f"| {count:,} tasks | {run['seconds']:.1f} | {run['peak']:.0f} MB | "
              f"{f'{dask_seconds:.1f} s' if dask_seconds else '-'}{'' if measured else f' (at its {sizes[0] // 1000}k rate)'} | "
              f"{f'{ratio:.1f}x' if ratio else '-'} | {target} |",
              flush=True)
    if millions:
        print("\n| where the million's seconds went (s, from the run's files and events) | plain | realistic "
              "|\n|---|---|---|")
        for name in PHASES:
            print(f"| {name} | {millions['plain']['phases'][name]:.2f} | {millions['realistic']['phases'][name]:.2f} |")
        print(f"| end to end | {millions['plain']['seconds']:.2f} | {millions['realistic']['seconds']:.2f} |", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="smaller sizes (a smoke run, ~2 minutes)")
    size.add_argument("--full", action="store_true",
                      help="also the million-task rows, batch 1 and Dask at 100,000 (about 6 minutes more)")
    parser.add_argument("--batch", type=int, default=256, help="the batch size k compared with batch 1")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "output")
    parser.add_argument("--parts", nargs="+", choices=("local", "cluster", "multinode", "compose", "scale"),
                        default=["local", "cluster", "multinode", "compose"],
                        help="local: throughput, memory, Snakemake overhead; cluster: the Slurm profile; "
                             "multinode: 3 nodes against 1, and what TLS costs (needs the 3-node test cluster); "
                             "scale: planning time and a coordinator against thousands of simulated workers "
                             "(not in the default run)")
    parser.add_argument("--measure-requests", type=Path, nargs="+", metavar="ENDPOINT_FILE", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.measure_requests:  # the multinode part runs this on another node
        print(json.dumps(request_costs(args.measure_requests)))
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    print(f"machine: {machine()}; load average {Path('/proc/loadavg').read_text().split()[0]} at the start\n",
          flush=True)
    if "scale" in args.parts:
        sys.path.insert(0, str(ROOT / "benchmarks"))
        import scale

        scale.print_part(args.quick, args.full)
    if "local" not in args.parts:
        if "compose" in args.parts:
            print_compose()
        if "cluster" in args.parts:
            print_cluster(1 if args.quick else CLUSTER_RUNS)
        if "multinode" in args.parts:
            multinode_part(args)
        return 0
    sizes = (2_000, 10_000) if args.quick else (10_000, 100_000)
    scale = (1_000, 10_000, 50_000) if args.quick else (1_000, 10_000, 100_000, *((1_000_000,) if args.full else ()))
    throughput, dask_rates = print_throughput(args, sizes)
    print_batch_one(sizes[0])
    try:
        memory = print_scale(args, scale)
        print_snakemake(args, sizes, dask_rates)
    finally:
        remove_generated()
    if "cluster" in args.parts:
        print_cluster(1 if args.quick else CLUSTER_RUNS)
    print(f"\nload average {Path('/proc/loadavg').read_text().split()[0]} at the end (other work on this machine "
          "shares its CPUs)")
    if plot(args.out / "benchmarks.png", throughput, memory):
        print(f"\nplot: {args.out / 'benchmarks.png'}")
    if "multinode" in args.parts:
        multinode_part(args)
    if "compose" in args.parts:
        print_compose()
    return 0


if __name__ == "__main__":
    sys.exit(main())
