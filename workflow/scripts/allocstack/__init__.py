"""Shared building blocks of allocstack's components.

Every script in ``workflow/scripts`` imports from here instead of copying code:
diagnostics and exit codes (:mod:`errors`), atomic JSON files (:mod:`jsonio`),
disk space and storage faults (:mod:`storage`), the run's file names and the
variables derived from yours (:mod:`names`), the task/expected documents
(:mod:`taskset`), the baseline handler (:mod:`handlers`), the event log
(:mod:`events`), job-scoped scratch (:mod:`scratch`), the endpoint file and the
services' variables (:mod:`endpoint`), every Slurm command (:mod:`slurm`), child
supervision (:mod:`supervise`, :mod:`lifeline`), the HTTP client of the
coordinator's protocol (:mod:`client`), what runs your own programs
(:mod:`program`), and which command runs a run and what its earlier attempts
left (:mod:`attempts`). :mod:`compose` is the Compose mapping behind
``import_compose.py``, which runs where snakemake runs (never inside the image).

The coordinator is built from :mod:`settings`, :mod:`httpserver` (h11),
:mod:`auth`, :mod:`routing`, :mod:`api`, :mod:`taskboard`, :mod:`journal`,
:mod:`progress` and :mod:`endrecord` (which the gate and verification read too).
"""

SCHEMA_VERSION = 1
