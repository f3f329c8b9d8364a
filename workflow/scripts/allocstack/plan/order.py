"""The ONE topological sort of services by ``depends_on``: the plan's start order, and the import's."""

from __future__ import annotations

from collections.abc import Mapping, Sequence


class UnknownDependency(ValueError):
    """``service`` depends on ``dependency``, which is not one of the services."""

    def __init__(self, service: str, dependency: str, services: Sequence[str]) -> None:
        self.service, self.dependency = service, dependency
        super().__init__(f"services.{service}.depends_on: {dependency!r} is not one of services "
                         f"({', '.join(sorted(services))})")


class DependencyCycle(ValueError):
    """``depends_on`` goes round: ``cycle`` starts and ends with the same service."""

    def __init__(self, cycle: list[str]) -> None:
        self.cycle = cycle
        super().__init__(f"depends_on has a cycle: {' -> '.join(cycle)}")


def start_order(depends_on: Mapping[str, Sequence[str]]) -> list[str]:
    """Service names, each after every service it depends on; otherwise in the order given.

    :param depends_on: each service's ``depends_on``.
    :raises UnknownDependency: for a name in depends_on that is not a service.
    :raises DependencyCycle: for the first cycle met.
    """
    order: list[str] = []

    def visit(name: str, path: list[str]) -> None:
        if name in path:
            raise DependencyCycle([*path[path.index(name):], name])
        if name in order:
            return
        for dependency in depends_on[name]:
            if dependency not in depends_on:
                raise UnknownDependency(name, dependency, list(depends_on))
            visit(dependency, [*path, name])
        order.append(name)

    for name in depends_on:
        visit(name, [])
    return order
