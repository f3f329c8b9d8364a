"""The shape of the stack's ONE allocation: nodes, CPUs per node, components at once.

One function (:func:`allocation`) says it; the refusals hold it against Slurm, the rules
ask Slurm for it (:meth:`Shape.coordinator_resources`), and ``import_compose.py`` drafts the
decision record's allocation from it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Shape:
    """What the stack's allocation must hold.

    :param nodes: config ``nodes``.
    :param cpus: CPUs the busiest node (the first) needs: the coordinator's (with a task
        document), the most workers a node gets, and every service's (all on the first node).
        With one node, the whole allocation's.
    :param coordinator_cpus: CPUs of the coordinator's job, which carries the allocation: with one
        node its own (Snakemake adds the group's other jobs'); with more, the first node's but
        for the services (which add theirs).
    :param worker_cpus: CPUs a worker's job asks for: its own with one node, none with more
        (the coordinator's job carries the CPUs per node).
    :param components: components running at once, each with the profile's ``mem_mb``: the
        workers, the coordinator and its gate, each service and its gate.
    """

    nodes: int
    cpus: int
    coordinator_cpus: int
    worker_cpus: int
    components: int

    def coordinator_resources(self) -> dict[str, int]:
        """The coordinator job's resources (Snakemake combines a group's): with more than one node,
        the nodes, one task per node, and CPUs per task for the busiest node."""
        if self.nodes == 1:
            return {"cpus_per_task": self.coordinator_cpus}
        return {"cpus_per_task": self.coordinator_cpus, "nodes": self.nodes, "tasks": self.nodes}


def allocation(config: Mapping[str, Any]) -> Shape:
    """The shape of the allocation ``config`` (complete: defaults filled) needs."""
    nodes, workers = config["nodes"], config["workers"]
    most_workers = -(-workers // nodes)  # the first ``workers % nodes`` nodes get one more (placement.py)
    per_worker = config["worker"]["cpus"]
    coordinator = config["coordinator"]["cpus"]
    services = config["services"]
    own = sum(spec["cpus"] * spec["replicas"] for spec in services.values())  # each replica its own step
    return Shape(
        nodes=nodes,
        cpus=(coordinator if config["tasks"] else 0) + most_workers * per_worker + own,
        coordinator_cpus=coordinator + (0 if nodes == 1 else most_workers * per_worker),
        worker_cpus=per_worker if nodes == 1 else 0,
        components=workers + 2 + sum(1 + spec["replicas"] for spec in services.values()),
    )
