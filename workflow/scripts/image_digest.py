#!/usr/bin/env python3
"""Write an image's SHA-256 sidecar (``IMAGE.sha256``), which the workflow checks before every run.

For a file (a SIF, a SquashFS file) the line is what ``sha256sum`` writes. For a directory image
(Charliecloud, or an Apptainer sandbox) ``sha256sum`` has no answer, so the digest
covers the whole tree: every entry's name, type and permission bits, every file's
contents and every symlink's target (see ``allocstack.common.jsonio.sha256_tree``)::

    python3 workflow/scripts/image_digest.py /project/mygroup/images/allocstack

Run it after the image is complete (after ``ch-fromhost --nvidia`` too), as a user
who can read every file of it. Prints the line it wrote. Exit 0, or one line and a
non-zero exit.
"""

from __future__ import annotations

import sys
from pathlib import Path

from allocstack.common.cli import ArgumentParser
from allocstack.common.errors import EXIT_OK, AllocstackError, report
from allocstack.common.jsonio import atomic_write_text, sha256_path, sidecar_line


def parse_args(argv: list[str] | None):
    parser = ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("image", type=Path, help="image file or directory; IMAGE.sha256 is written beside it")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        line = sidecar_line(args.image, sha256_path(args.image, "image"))
        atomic_write_text(Path(f"{str(args.image).rstrip('/')}.sha256"), line, 0o644)
    except AllocstackError as error:
        return report(error)
    print(line, end="", flush=True)
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
