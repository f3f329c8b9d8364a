"""Command-line plumbing shared by the components."""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import sys
from typing import Any, NoReturn

from .errors import EXIT_USAGE


class ArgumentParser(argparse.ArgumentParser):
    """argparse that exits with 64 (the seed's "bad arguments") and a one-line message."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"allocstack: error [usage]: {self.prog}: {message}\n")


def positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {text}")
    return value


def non_negative_float(text: str) -> float:
    value = float(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must not be negative, got {text}")
    return value


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {text}")
    return value


def argv_list(text: str) -> list[str]:
    """argparse type: a JSON argv list (a user's program, never a shell string)."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not JSON: {exc.msg}") from exc
    if not isinstance(value, list) or not value or not all(isinstance(arg, str) and arg for arg in value):
        raise argparse.ArgumentTypeError("must be a non-empty JSON list of non-empty strings")
    return value


def scratch_defaults(args: argparse.Namespace) -> None:
    """With ``args.scratch`` set, default ``endpoint_file`` and ``events`` to the files in it."""
    if args.scratch:
        args.endpoint_file = args.endpoint_file or os.path.join(args.scratch, "endpoint.json")
        args.events = args.events or os.path.join(args.scratch, "events.jsonl")


def os_release() -> str:
    """PRETTY_NAME from /etc/os-release as seen by this process (inside a container: the image's)."""
    try:
        with open("/etc/os-release", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("PRETTY_NAME="):
                    return line.split("=", 1)[1].strip().strip('"')
    except OSError:
        pass
    return "unknown"


def runtime_facts() -> dict[str, Any]:
    """Where this component runs: recorded in its start event for the run's provenance."""
    return {
        "host": socket.gethostname(),
        "python": sys.executable,
        "pythonVersion": platform.python_version(),
        "osRelease": os_release(),
        "container": os.environ.get("APPTAINER_CONTAINER") or os.environ.get("SINGULARITY_CONTAINER") or None,
        "slurmJobId": os.environ.get("SLURM_JOB_ID"),
        "slurmStepId": os.environ.get("SLURM_STEP_ID"),
    }
