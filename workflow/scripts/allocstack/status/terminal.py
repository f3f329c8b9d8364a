"""What Snakemake prints on the terminal during a run, made readable for the person watching.

``workflow/rules/common.smk`` adds :class:`TerminalFilter` to Snakemake's logger once.
"""

from __future__ import annotations

import logging
import os
import sys
import time

from ..plan.layout import is_service_file

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
    """

    clear_line = sys.stderr.isatty() and sys.stdout.isatty()

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        services = [line.removesuffix(" (missing locally)") for line in message.splitlines()[1:]]
        if message.startswith("Waiting at most") and all(map(is_service_file, services)):
            deadline = time.monotonic() + SERVICE_FILE_WAIT
            while time.monotonic() < deadline and not all(os.path.exists(path) for path in services):
                time.sleep(0.002)
            return False
        if self.clear_line and record.levelno >= logging.INFO:
            sys.stderr.write("\r\033[K")
            sys.stderr.flush()
        return True
