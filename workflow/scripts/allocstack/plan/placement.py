"""Where each worker runs: balanced blocks of workers over the allocation's nodes.

``worker-01``.. fill the first node, and the first ``workers % nodes`` nodes get one more
(the first node, where the coordinator and your services also run, is never lighter than
another). Node numbers are 0-based here (0 = the first node, where Snakemake's group job,
the coordinator, its gate and your services run); the other nodes' gates are numbered
from 1 in the files (``gates/node-2.json`` is node 1's).
"""

from __future__ import annotations


def worker_ids(workers: int) -> list[str]:
    """``worker-01``, ``worker-02``, ...: the names of ``workers`` workers (their job steps, records, logs)."""
    return [f"worker-{number:02d}" for number in range(1, workers + 1)]


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
