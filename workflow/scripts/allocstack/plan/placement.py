"""Where each worker runs: balanced blocks of workers over the allocation's nodes, and the job steps that run them.

``worker-01``.. fill the first node, and the first ``workers % nodes`` nodes get one more
(the first node, where the coordinator and your services also run, is never lighter than
another). Node numbers are 0-based here (0 = the first node, where Snakemake's group job,
the coordinator, its gate and your services run); the other nodes' gates are numbered
from 1 in the files (``gates/node-2.json`` is node 1's).

A node's workers run in job steps of ``per_step`` workers (config ``worker.per_step``,
:func:`per_step`): 1 is the seed's shape (each worker its own Snakemake job and job step);
more makes :class:`Step` blocks (``workers-01``..), each ONE Snakemake job and ONE job step
that runs its workers as processes it supervises (``worker_block.py``), so the DAG, the
step count and the planning time grow with the nodes, not with the workers. A step never
spans two nodes.
"""

from __future__ import annotations

from dataclasses import dataclass

#: Up to this many workers each is its own job step by default (the seed's shape, and its own bound).
SEED_WORKERS = 16


def replica_name(service: str, replica: int | str) -> str:
    """The name of replica ``replica`` of service ``service`` (config services.<name>.replicas; 2.., the first is
    the service itself): its job step, files and log (``consumer-replica-2``)."""
    return f"{service}-replica-{replica}"


def instance_name(service: str, node: int | str) -> str:
    """The name of global service ``service``'s instance on node ``node`` (1-based, above 1: the first node's
    instance is the service itself): its job step, files and log (``cache-node-2``)."""
    return f"{service}-node-{node}"


def worker_id(index: int) -> str:
    """The name of the worker with 0-based ``index`` (``worker-01``, ..., ``worker-100``)."""
    return f"worker-{index + 1:02d}"


def worker_ids(workers: int) -> list[str]:
    """``worker-01``, ``worker-02``, ...: the names of ``workers`` workers (their records, logs, ids)."""
    return [worker_id(index) for index in range(workers)]


def worker_index(worker: str) -> int:
    """0-based index of a worker name (``worker-01`` -> 0)."""
    return int(worker.split("-")[1]) - 1


def node_of(index: int, workers: int, nodes: int) -> int:
    """The node (0 = the first) of the worker with 0-based ``index`` of ``workers`` over ``nodes``."""
    per_node, extra = divmod(workers, nodes)
    big = extra * (per_node + 1)
    if index < big:
        return index // (per_node + 1)
    return extra + (index - big) // per_node


def node_range(node: int, workers: int, nodes: int) -> range:
    """The 0-based indexes of the workers on ``node`` (a contiguous block)."""
    per_node, extra = divmod(workers, nodes)
    start = node * per_node + min(node, extra)
    return range(start, start + per_node + (node < extra))


def per_step(workers: int, nodes: int, configured: int | None, one_each: bool = False) -> int:
    """Workers per job step: ``configured`` (config ``worker.per_step``), else 1 up to :data:`SEED_WORKERS`
    workers or where each worker needs a step of its own (``one_each``: long-running workers, GPUs), else the
    most workers a node gets (one step per node)."""
    if configured is not None:
        return configured
    if one_each or workers <= SEED_WORKERS:
        return 1
    return -(-workers // nodes)


@dataclass(frozen=True)
class Step:
    """One job step of workers: ``name`` (``workers-01``: its Snakemake job, job step, record directory and log),
    the ``node`` it runs on, and its workers, the 0-based indexes ``start`` .. ``start + count - 1``."""

    name: str
    node: int
    start: int
    count: int

    @property
    def workers(self) -> list[str]:
        return [worker_id(index) for index in range(self.start, self.start + self.count)]


def step_name(number: int) -> str:
    """The name of the ``number``-th step (1-based): ``workers-01``."""
    return f"workers-{number:02d}"


def steps(workers: int, nodes: int, size: int) -> list[Step]:
    """Each node's workers in steps of at most ``size`` (a node's last step takes what is left), in node order."""
    found: list[Step] = []
    for node in range(nodes):
        block = node_range(node, workers, nodes)
        for start in range(block.start, block.stop, size):
            found.append(Step(step_name(len(found) + 1), node, start, min(size, block.stop - start)))
    return found


def step_index(name: str) -> int:
    """0-based index of a step name (``workers-01`` -> 0)."""
    return int(name.split("-")[1]) - 1
