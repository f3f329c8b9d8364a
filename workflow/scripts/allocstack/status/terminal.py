"""What Snakemake prints on the terminal during a run, made readable for the person watching.

``workflow/rules/common.smk`` adds :class:`TerminalFilter` to Snakemake's logger once.
"""

from __future__ import annotations

import logging
import os
import sys
import time

from ..plan.layout import is_service_file
from . import interrupt

#: Snakemake's log events about a job that ended with an error (its rule, its log): after an interruption, a
#: job the interruption stopped.
STOPPED_JOB_EVENTS = {"job_error", "group_error"}
#: What Snakemake says, after an interruption, about the jobs it stopped and its own end.
STOPPED_JOB_MESSAGES = (
    "RuleException", "Error in rule", "Removing output files of failed job", "Shutting down, this might take",
    "Will exit after finishing currently running jobs", "Terminating processes on user request",
    "Exiting because a job execution failed", "WorkflowError:\nAt least one job did not complete",
    "At least one job did not complete successfully",
)
#: Seconds the "Waiting at most ..." message of a service's consumer waits for its service file.
SERVICE_FILE_WAIT = 0.5


class TerminalFilter(logging.Filter):
    """Snakemake's log records, filtered for the terminal.

    * "Waiting at most N seconds for missing files: results/<run>/coordinator.service" is
      normal: the consumers of a service start with it and wait until its process is up.
      Dropped when every missing file is a service file. Snakemake checks again right after
      this message and then once a second; the service's shell creates its file first thing,
      within milliseconds, so the message waits for the files up to SERVICE_FILE_WAIT seconds
      (the consumers then start at once instead of a second later, which was most runs).
    * The coordinator draws a live progress line on a terminal (it ends in no newline):
      Snakemake's next message erases it first instead of being glued to its end; the
      coordinator redraws it below within half a second.
    * Once the command was interrupted (Ctrl-C, :mod:`allocstack.status.interrupt`), what
      Snakemake says about the jobs the interruption ended is dropped (each job's error and
      log, its traceback, "Shutting down", the final WorkflowError): they did not fail, they
      were stopped, and the end-of-run summary says so once.
    """

    clear_line = sys.stderr.isatty() and sys.stdout.isatty()

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        services = [line.removesuffix(" (missing locally)") for line in message.splitlines()[1:]]
        if interrupt.STATE.interrupted and self.after_interruption(record, message):
            return False
        if message.startswith("Waiting at most") and all(map(is_service_file, services)):
            deadline = time.monotonic() + SERVICE_FILE_WAIT
            while time.monotonic() < deadline and not all(os.path.exists(path) for path in services):
                time.sleep(0.002)
            return False
        if self.clear_line and record.levelno >= logging.INFO:
            sys.stderr.write("\r\033[K")
            sys.stderr.flush()
        return True

    @staticmethod
    def after_interruption(record: logging.LogRecord, message: str) -> bool:
        """A record about the jobs an interruption ended, or about Snakemake ending because of them."""
        event = str(getattr(getattr(record, "event", None), "value", getattr(record, "event", "")))
        return event in STOPPED_JOB_EVENTS or message.lstrip().startswith(STOPPED_JOB_MESSAGES)
