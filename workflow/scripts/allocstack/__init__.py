"""Shared building blocks of allocstack's components, grouped by the process they run in.

Every script in ``workflow/scripts`` imports from here instead of copying code. A module's
folder says where it runs (the map, module by module, is in docs/architecture.md):

* :mod:`.plan` - Snakemake's own process: every decision the rules ask (``workflow/rules/common.smk``)
* :mod:`.common` - every process: diagnostics, names, JSON files, the event log, Slurm, scratch, ...
* :mod:`.coordinator` - the built-in coordinator
* :mod:`.worker` - workers and readiness gates, the coordinator's clients
* :mod:`.launch` - launch.py and the supervisors of your programs
* :mod:`.status` - what the person watching a run sees (the terminal, the end-of-run summary)
* :mod:`.compose` - ``import_compose.py``, which runs where snakemake runs (never inside the image)
"""

SCHEMA_VERSION = 1
