"""Shared building blocks of allocstack's components.

Every script in ``workflow/scripts`` imports from here instead of copying code:
diagnostics and exit codes (:mod:`errors`), atomic JSON files (:mod:`jsonio`),
the task/expected documents (:mod:`taskset`), the baseline handler
(:mod:`handlers`), the event log (:mod:`events`), job-scoped scratch
(:mod:`scratch`), the endpoint file and the services' variables (:mod:`endpoint`),
the HTTP client of the coordinator's protocol (:mod:`client`), and what runs your own
programs (:mod:`program`). :mod:`compose` is the Compose mapping behind
``import_compose.py``, which runs where snakemake runs (never inside the image).
"""

SCHEMA_VERSION = 1
