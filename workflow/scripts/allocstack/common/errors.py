"""Stable diagnostic ids and exit codes shared by every component.

A failure is reported as ONE line on stderr::

    allocstack: error [input]: inputs/tasks.json: task 2: id 'a b' is not a valid task id

The id in brackets is stable (documented in the diagnostics table of docs/failures.md) so
that users and tests can match on it; the rest of the line says what is wrong.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

# Exit codes follow sysexits.h where one fits, and the seed's readiness contract.
EXIT_OK = 0
EXIT_READINESS_TIMEOUT = 24  # seed: readiness probe timed out
EXIT_USAGE = 64  # seed: bad arguments
EXIT_DATA = 65  # malformed input / verification failed
EXIT_UNAVAILABLE = 69  # a prerequisite (program, service) is missing
EXIT_SOFTWARE = 70  # internal error of a component
EXIT_IO = 74  # could not write an artifact
EXIT_TEMPFAIL = 75  # the run was stopped before it could finish (drain, time limit)
EXIT_NOPERM = 77  # permission / authentication problem
EXIT_CONFIG = 78  # bad configuration

#: Diagnostic id -> (exit code, one-line meaning). docs/failures.md's table is kept in step with it (tests/test_docs.py).
DIAGNOSTICS: dict[str, tuple[int, str]] = {
    "usage": (EXIT_USAGE, "a component was called with bad arguments"),
    "config": (EXIT_CONFIG, "the workflow configuration is invalid"),
    "input": (EXIT_DATA, "the task or expected document is malformed"),
    "integrity": (EXIT_DATA, "a SHA-256 sidecar does not match its file"),
    "prerequisite": (EXIT_UNAVAILABLE, "a program, file or directory the run needs is missing or unsafe"),
    "scratch": (EXIT_UNAVAILABLE, "job-scoped scratch ($SLURM_TMPDIR, $TMPDIR or config scratch) is read-only, full or unsafe"),
    "already-running": (EXIT_TEMPFAIL, "the same run (this checkout, this run name) is already running"),
    "readiness-timeout": (EXIT_READINESS_TIMEOUT, "the coordinator did not become ready before the deadline"),
    "coordinator-exit": (EXIT_SOFTWARE, "the coordinator ended without completing every task"),
    "worker-exit": (EXIT_TEMPFAIL, "a worker stopped before the run was done, or a long-running worker failed"),
    "main-exit": (EXIT_SOFTWARE, "the stack's main program (config main) exited non-zero: its exit code fails the run"),
    "init-exit": (EXIT_SOFTWARE, "an init job (config init_jobs) failed or outlived its timeout: its dependents never started"),
    "service-exit": (EXIT_SOFTWARE, "a service of yours ended by itself, or did not stop cleanly"),
    "network": (EXIT_UNAVAILABLE, "the coordinator's address for the other nodes is wrong or unreachable, or the stack's private network (network.isolation: private) could not be made"),
    "auth": (EXIT_NOPERM, "the coordinator refused the token"),
    "task-failed": (EXIT_DATA, "a task's handler or command failed"),
    "verification": (EXIT_DATA, "the results are not correct"),
    "cleanup": (EXIT_IO, "job-scoped scratch could not be removed"),
    "io": (EXIT_IO, "an artifact could not be written"),
    "storage": (EXIT_IO, "the disk or the quota is full: nothing more can be stored durably"),
    "compose": (EXIT_DATA, "a Compose file uses something allocstack cannot run (import_compose.py)"),
}


#: Failures another attempt cannot change (the profile's ``retries``: a new allocation of the same
#: command): the configuration, the inputs, the results, scratch the center gives. A later attempt that
#: finds an earlier attempt's record of one ends at once with its line (allocstack/common/attempts.py).
LASTING = frozenset({"usage", "config", "input", "integrity", "compose", "verification", "scratch"})


@dataclass
class AllocstackError(Exception):
    """An expected failure with a stable diagnostic id.

    :param diag: a key of :data:`DIAGNOSTICS`.
    :param message: what is wrong, naming the file/field/value at fault.
    """

    diag: str
    message: str

    def __post_init__(self) -> None:
        if self.diag not in DIAGNOSTICS:
            raise ValueError(f"unknown diagnostic id {self.diag!r}")
        super().__init__(self.message)

    @property
    def exit_code(self) -> int:
        return DIAGNOSTICS[self.diag][0]

    def line(self) -> str:
        """The one-line rendering printed on stderr (never multi-line)."""
        text = " ".join(self.message.split())
        return f"allocstack: error [{self.diag}]: {text}"


def report(error: AllocstackError, stream=None) -> int:
    """Print ``error`` as one line on stderr and return its exit code."""
    print(error.line(), file=stream or sys.stderr, flush=True)
    return error.exit_code


#: How every error line starts (:meth:`AllocstackError.line`): what readers of a log look for.
LINE_PREFIX = "allocstack: error ["


def diag_of(line: str) -> str | None:
    """The diagnostic id of an error line (anywhere in ``line``), or None when it holds none."""
    start = line.find(LINE_PREFIX)
    if start < 0:
        return None
    diag = line[start + len(LINE_PREFIX):].split("]", 1)[0]
    return diag if diag in DIAGNOSTICS else None
