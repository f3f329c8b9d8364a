"""The container runtimes allocstack composes, and the program each needs on PATH.

Standard library only: the workflow (common.smk) loads this file by its path to check,
before anything is submitted, that the configured runtime's program is there;
launch.py and collect.py use it through allocstack/containers.py.
"""

from __future__ import annotations

#: runtime (config ``runtime``) -> the program that runs an image.
PROGRAMS = {"apptainer": "apptainer", "charliecloud": "ch-run"}


def version_argv(runtime: str) -> list[str]:
    """The command that prints ``runtime``'s version (ch-run prints it on stderr)."""
    return [PROGRAMS[runtime], "--version"]
