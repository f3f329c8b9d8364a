"""The ``scale`` part of the benchmarks: thousands of workers, simulated where this machine cannot hold them.

1. **Planning**: ``snakemake --dry-run`` for stacks of 16 to 65,536 workers over 1 to 1,024 nodes, as
   planned (one job step per node above 16 workers) and, for reference, with each worker its own job
   (``worker.per_step: 1``, the shape before); wall and CPU seconds, jobs in the DAG.
2. **The coordinator against simulated workers**: a real coordinator process, and in another process
   asyncio clients speaking its protocol as worker.py does (the first claim takes one task, then
   ``worker.batch``; "wait" answered by sleeping ``retryAfter``; a 503 by backing off), shaped as the
   plan shapes them: up to 16 workers each on its own connection; above, one job step per node whose
   workers share its relay (``allocstack/worker/relay.py``: the same class, its batches over 4
   connections; only the relay's local HTTP listener and its JSON check of each request are skipped,
   whose CPU is the node's, not the coordinator's). The simulated workers share this machine's CPUs
   with the coordinator they measure, so their bookkeeping is kept cheap (:class:`Answers`: each
   distinct payload's output and digest computed once, the coordinator still checks every digest).
   1,000,000 no-op tasks by default; tasks/s from the first claim to the last result acknowledged,
   503 answers, the coordinator's peak memory and CPU, the connections it held, the load average.

``benchmarks/run.py --parts scale`` prints both tables. The steps per node of a real run on the 3-node test
cluster (sacct) are checked by tests/test_multinode.py, not measured here.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "workflow" / "scripts"
PYTHON = sys.executable
SNAKEMAKE = str(Path(PYTHON).parent / "snakemake")


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


# -- 1. planning ------------------------------------------------------------------------------
def planning_copy() -> Path:
    work = Path(tempfile.mkdtemp(prefix="allocstack-bench-plan-"))
    for part in ("Snakefile", "workflow", "config", "inputs", "expected", "profiles"):
        source = ROOT / part
        (shutil.copytree if source.is_dir() else shutil.copy2)(source, work / part)
    return work


def dry_run(work: Path, workers: int, nodes: int, per_step: int | None) -> dict[str, float]:
    """``snakemake --dry-run --config workers=N nodes=M`` (with ``per_step``: through a config file): wall and CPU
    seconds, and the jobs of the DAG."""
    args = ["--config", f"workers={workers}", f"nodes={nodes}", f"run=plan{workers}x{nodes}"]
    if per_step is not None:
        (work / "config/per_step.yaml").write_text(f"worker: {{per_step: {per_step}}}\n")
        args = ["--configfile", "config/per_step.yaml", *args]
    before, started = children_cpu(), time.monotonic()
    done = subprocess.run([SNAKEMAKE, "--dry-run", *args], cwd=work, capture_output=True, text=True, timeout=900,
                          check=False, env={**os.environ, "TMPDIR": str(work)})
    wall, cpu = time.monotonic() - started, children_cpu() - before
    if done.returncode != 0:
        raise RuntimeError(f"dry run of {workers} workers over {nodes} nodes failed: {done.stderr[-2000:]}")
    total = next((int(line.split()[1]) for line in done.stdout.splitlines()
                  if line.split()[:1] == ["total"] and line.split()[1:2] and line.split()[1].isdigit()), 0)
    return {"wall": wall, "cpu": cpu, "jobs": total}


#: (workers, nodes, per_step) rows of the planning table; per_step 1 is the shape before (one job per worker).
PLANNING = [(16, 1, None), (256, 1, None), (1024, 1, None), (4096, 64, None), (16384, 128, None),
            (16384, 256, None), (256, 1, 1), (512, 1, 1), (1024, 1, 1)]
#: ``--full`` adds the configured limits (about 8 minutes on 2 busy CPUs: Snakemake's DAG of 2,053 jobs).
PLANNING_FULL = [(65536, 1024, None)]
PLANNING_QUICK = [(16, 1, None), (1024, 1, None), (4096, 64, None), (256, 1, 1)]


def planning_rows(quick: bool, full: bool = False) -> list[dict]:
    work = planning_copy()
    try:
        dry_run(work, 2, 1, None)  # warm: bytecode compiled, the page cache filled
        rows = []
        for workers, nodes, per_step in (PLANNING_QUICK if quick else PLANNING + (PLANNING_FULL if full else [])):
            rows.append({"workers": workers, "nodes": nodes, "per_step": per_step,
                         **dry_run(work, workers, nodes, per_step)})
        return rows
    finally:
        shutil.rmtree(work, ignore_errors=True)


# -- 2. simulated workers against a real coordinator --------------------------------------------
class Tally:
    def __init__(self) -> None:
        self.refused = self.requests = self.waits = self.done_workers = self.results = self.unanswered = 0
        self.first_claim: float | None = None
        self.last_result = 0.0


class Answers:
    """What a simulated worker reads of an answer, and its results' bytes, cheaply: the answer decoded by msgspec into
    the few fields a worker reads (task ids and payloads kept as raw JSON), each distinct payload's output and
    digest computed once (a no-op task's are all alike), a result's JSON spliced from bytes. The coordinator checks
    every digest; the simulated workers' own CPU (the nodes' in a real run) is kept small because they share this
    machine's CPUs with the coordinator they measure."""

    def __init__(self) -> None:
        from allocstack.common.jsonio import msgspec

        if msgspec is None:
            raise RuntimeError("the simulated workers need msgspec (requirements.txt)")

        task = msgspec.defstruct("Task", [("id", msgspec.Raw), ("payload", msgspec.Raw)], gc=False)
        reply = msgspec.defstruct("Reply", [("status", str), ("tasks", list[task], []), ("accepted", list[msgspec.Raw], []),
                                            ("retryAfter", float, 0.1), ("reason", str, "")], gc=False)
        self.reply = msgspec.json.Decoder(reply)
        self.done: dict[bytes, bytes] = {}

    def result(self, task) -> bytes:
        """A task's result as a worker sends it (``{"taskId", "output", "sha256"}``)."""
        payload = bytes(task.payload)
        tail = self.done.get(payload)
        if tail is None:
            document = json.loads(payload)
            output = document["message"] * document["repeat"]
            tail = self.done[payload] = (b',"output":' + json.dumps(output).encode() + b',"sha256":"'
                                         + hashlib.sha256(output.encode()).hexdigest().encode() + b'"}')
        return b'{"taskId":' + bytes(task.id) + tail


async def simulated_worker(worker: str, node: str, send, batch: int, tally: Tally, answers: Answers) -> None:
    """One worker as worker.py speaks the protocol: claim (results of the last batch riding along), run, repeat."""
    from allocstack.worker.client import backoff

    results: list[bytes] = []
    first, refused = True, 0
    head = b'{"workerId":"%s","node":"%s","max":' % (worker.encode(), node.encode())
    while True:
        body = head + (b"1" if first else b"%d" % batch)
        body += b',"results":[' + b",".join(results) + b"]}" if results else b"}"
        tally.first_claim = tally.first_claim or time.monotonic()
        try:
            status, answer = await send(body)
        except ConnectionError:  # as worker.py's claim_with_retry: again, a little later
            tally.unanswered += 1
            await asyncio.sleep(0.5)
            continue
        tally.requests += 1
        if status == 503:
            tally.refused += 1
            await asyncio.sleep(backoff(1.0, refused))
            refused += 1
            continue
        if status != 200:
            raise RuntimeError(f"{worker}: claim answered {status}: {answer[:200]!r}")
        refused = 0
        reply = answers.reply.decode(answer)
        if reply.accepted:
            tally.results += len(reply.accepted)
            tally.last_result = time.monotonic()
        if reply.status == "task":
            first = False
            results = list(map(answers.result, reply.tasks))
        elif reply.status == "wait":
            results = []
            tally.waits += 1
            await asyncio.sleep(reply.retryAfter)  # as worker.py: no jitter
        elif reply.status == "done":
            tally.done_workers += 1
            return
        else:
            raise RuntimeError(f"{worker}: {answer[:300]!r}")


async def simulate(endpoint_file: str, workers: int, nodes: int, per_step: int, batch: int) -> dict:
    """Every worker of the shape at once; the tally when the last one heard "done"."""
    sys.path.insert(0, str(SCRIPTS))
    from allocstack.common.endpoint import read_endpoint
    from allocstack.coordinator.httpserver import Request
    from allocstack.plan import connections
    from allocstack.plan.placement import steps, worker_ids
    from allocstack.worker.relay import Relay, Upstream

    endpoint = read_endpoint(endpoint_file)
    tally, answers = Tally(), Answers()
    coroutines, relays = [], []
    if per_step == 1:  # the seed's shape: each worker its own connection
        for worker in worker_ids(workers):
            upstream = Upstream(endpoint, 60.0)

            async def send(body: bytes, upstream: Upstream = upstream) -> tuple[int, bytes]:
                answer = await upstream.request(b"POST", b"/claim", body)
                return answer.status, answer.body

            coroutines.append(simulated_worker(worker, "node-1", send, batch, tally, answers))
    else:  # a relay per job step, shared by its workers
        for step in steps(workers, nodes, per_step):
            relay = Relay(endpoint, step.count, connections.PER_STEP, 60.0, lambda line: None)
            relay.start_carrying()
            relays.append(relay)

            async def send(body: bytes, relay: Relay = relay) -> tuple[int, bytes]:
                response = await relay.submit(Request("POST", "/claim", "", {}, body), True)
                return response.status, response.body

            coroutines += [simulated_worker(worker, f"node-{step.node + 1}", send, batch, tally, answers)
                           for worker in step.workers]
    started = time.monotonic()
    await asyncio.gather(*coroutines)
    elapsed = time.monotonic() - started
    trips = sum(relay.round_trips for relay in relays)
    for relay in relays:
        await relay.close()
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return {"elapsed": elapsed, "dispatch": tally.last_result - (tally.first_claim or started),
            "clientCpu": usage.ru_utime + usage.ru_stime,
            "results": tally.results, "refused": tally.refused, "unanswered": tally.unanswered, "requests": tally.requests, "waits": tally.waits,
            "roundTrips": trips or tally.requests, "done": tally.done_workers}


def coordinator_sockets(pid: int) -> int:
    """Sockets the process holds now."""
    count = 0
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            count += os.readlink(fd).startswith("socket:")
        except OSError:
            continue
    return count


def process_cpu(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def peak_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def simulated_run(tasks: int, workers: int, nodes: int, batch: int = 64) -> dict:
    """A real coordinator (its connection cap as the plan sets it) against the simulated workers of one shape."""
    sys.path.insert(0, str(SCRIPTS))
    from allocstack.plan import connections
    from allocstack.plan.placement import per_step, steps

    size = per_step(workers, nodes, None)
    cap = connections.coordinator_cap(workers, 0) if size == 1 else \
        connections.coordinator_cap(0, len(steps(workers, nodes, size)))
    work = Path(tempfile.mkdtemp(prefix="allocstack-bench-scale-"))
    try:
        document = {"schemaVersion": 1, "tasks": [{"id": f"t{i:07d}", "payload": {"message": "x", "repeat": 1}}
                                                  for i in range(tasks)]}
        (work / "tasks.json").write_text(json.dumps(document))
        del document
        scratch = work / "scratch"
        coordinator = subprocess.Popen(
            [PYTHON, os.environ.get("ALLOCSTACK_BENCH_COORDINATOR", str(SCRIPTS / "coordinator.py")), "--input", str(work / "tasks.json"), "--results",
             str(work / "results.json"), "--scratch", str(scratch), "--end-record", str(work / "end.json"),
             "--lease-seconds", "600", "--progress-interval", "3600", "--workers", str(workers),
             "--max-connections", str(cap)], stdout=subprocess.DEVNULL, stderr=open(work / "coordinator.log", "wb"))  # noqa: SIM115
        while not (scratch / "endpoint.json").exists():
            if coordinator.poll() is not None:
                raise RuntimeError(f"the coordinator did not start: {(work / 'coordinator.log').read_text()[-2000:]}")
            time.sleep(0.05)
        cpu_before = process_cpu(coordinator.pid)
        client = subprocess.Popen([PYTHON, str(Path(__file__).resolve()), "--simulate", str(scratch / "endpoint.json"),
                                   str(workers), str(nodes), str(size), str(batch)],
                                  stdout=subprocess.PIPE, text=True)
        sockets = 0
        while client.poll() is None:
            sockets = max(sockets, coordinator_sockets(coordinator.pid))
            time.sleep(0.5)
        out, _ = client.communicate()
        if client.returncode != 0:
            raise RuntimeError(f"the simulated workers failed ({client.returncode})")
        measured = json.loads(out)
        cpu = process_cpu(coordinator.pid) - cpu_before
        peak = peak_mb(coordinator.pid)
        coordinator.terminate()
        coordinator.wait(timeout=300)
        end = json.loads((work / "end.json").read_text())
        results = json.loads((work / "results.json").read_text())["results"]
        once = len(results) == len({r["taskId"] for r in results}) == tasks
        return {**measured, "workers": workers, "nodes": nodes, "perStep": size, "cap": cap, "peak": peak,
                "cpu": cpu, "sockets": sockets, "exactlyOnce": once, "resultCount": end["resultCount"],
                "rate": tasks / measured["dispatch"], "coordinatorRequests": end["requests"]}
    finally:
        if coordinator.poll() is None:
            coordinator.kill()
        shutil.rmtree(work, ignore_errors=True)


def verdict(met: bool) -> str:
    return "met" if met else "NOT met"


def print_part(quick: bool, full: bool) -> None:
    """``benchmarks/run.py --parts scale``: the planning table, then the coordinator against simulated workers."""
    print("\n| `snakemake --dry-run` | workers | nodes | job steps of workers | jobs in the DAG | wall | CPU | target |"
          "\n|---|---|---|---|---|---|---|---|", flush=True)
    sys.path.insert(0, str(SCRIPTS))
    from allocstack.plan.placement import per_step, steps

    for row in planning_rows(quick, full):
        size = per_step(row["workers"], row["nodes"], row["per_step"])
        row["steps"] = row["workers"] if size == 1 else len(steps(row["workers"], row["nodes"], size))
        shape = "one per worker (`worker.per_step: 1`, the shape before)" if row["per_step"] == 1 else "as planned"
        target = ""
        if (row["workers"], row["nodes"], row["per_step"]) == (4096, 64, None):
            target = f"<= 3 s: {verdict(row['wall'] <= 3)}"
        print(f"| {shape} | {row['workers']:,} | {row['nodes']:,} | {row['steps']:,} | {row['jobs']:,} | "
              f"{row['wall']:.1f} s | {row['cpu']:.1f} s | {target} |", flush=True)
    tasks = 100_000 if quick else 1_000_000
    print(f"\n| a real coordinator, {tasks:,} no-op tasks, batch 64 | workers | nodes | per step | connections held "
          "(peak) | requests to the coordinator | 503 | tasks/s | of the 8-worker rate | coordinator peak RSS | "
          "coordinator CPU | load (1 min) | exactly once | target |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
          flush=True)
    reference = None
    for workers, nodes in ((8, 1), (4096, 64), (16384, 256)):
        load = os.getloadavg()[0]  # the machine's other work, as the row started
        row = simulated_run(tasks, workers, nodes)
        reference = reference or row["rate"]
        ratio = row["rate"] / reference
        target = "(reference)" if workers == 8 else (
            f"0 x 503: {verdict(row['refused'] == 0)}; >= 0.8x: {verdict(ratio >= 0.8)}; "
            f"peak <= 400 MB: {verdict(row['peak'] <= 400)}")
        print(f"| {'each worker its own connection' if row['perStep'] == 1 else 'a relay per step'} | {workers:,} | "
              f"{nodes} | {row['perStep']} | {row['sockets']:,} (cap {row['cap']:,}) | {row['coordinatorRequests']:,} | "
              f"{row['refused']} | {row['rate']:,.0f} | {ratio:.2f} | {row['peak']:.0f} MB | {row['cpu']:.1f} s | {load:.1f} | "
              f"{'yes' if row['exactlyOnce'] else 'NO'} | {target} |", flush=True)


def main(argv: list[str]) -> int:
    """``scale.py --simulate ENDPOINT_FILE WORKERS NODES PER_STEP BATCH``: the client side, in its own process."""
    if argv[:1] != ["--simulate"] or len(argv) != 6:
        print(__doc__)
        return 64
    endpoint, workers, nodes, size, batch = argv[1], *map(int, argv[2:])
    sys.path.insert(0, str(SCRIPTS))
    from allocstack.coordinator import eventloop

    print(json.dumps(eventloop.run(simulate(endpoint, workers, nodes, size, batch))))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
