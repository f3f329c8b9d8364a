"""The plan: every decision about a stack, importable and tested without Snakemake.

``workflow/rules/common.smk`` is its adapter: it gathers the world into :class:`Facts`, calls
``PLAN = plan.load(config, facts)``, turns a :class:`PlanError` into the one-line exit, and its
input functions ask the plan. Neither this package nor what it imports starts a process or
imports Snakemake (``tests/unit/test_plan_imports.py``).

* :mod:`.config` - the schema, nulls from the command line, defaults, the older ``service:``
* :mod:`.refusals` - what is refused before anything runs, each a :class:`PlanError`
* :mod:`.order` - the one topological sort of services (the import's too)
* :mod:`.shape` - the allocation's CPUs per node and components at once
* :mod:`.placement` - which node each worker runs on
* :mod:`.timeouts` - the gates' and the services' bounds
* :mod:`.layout` - every path of ``results/<run>/`` and ``<state_dir>/<run>/``
* :mod:`.argv` - every component's command line
* :mod:`.decisions` - the decision record's facts and the dry run's line
* :mod:`.facts` - the world, in one value
* :mod:`.stack` - :class:`Plan` and :func:`load`
"""

from ..common.namespaces import read_setting
from .facts import Facts
from .refusals import PlanError
from .stack import Plan, load

__all__ = ["Facts", "Plan", "PlanError", "load", "read_setting"]
