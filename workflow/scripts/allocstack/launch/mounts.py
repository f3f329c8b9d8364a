"""A program's mounts (config ``mounts``, Compose's volumes, secrets and configs): where each one's data is on
this machine, and, for a program that runs without an image, its container paths rewritten to there.

A mount is ``{target, source}`` (a host path, relative to the directory snakemake runs in) or ``{target,
volume}`` (a named volume: the job-scoped directory ``$ALLOCSTACK_VOLUME_<NAME>``), maybe ``read_only``. In an
image it is bound at its target (allocstack/launch/containers.py); without one the program runs on this machine,
where the target does not exist, so a path at or below a target in its command, its environment values and its
working directory becomes the same path below the mount's source (longest target first, on path boundaries).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..common.errors import AllocstackError
from ..common.names import volume_variable
from .containers import Bind


def resolve(mounts: list[dict[str, Any]], env: Mapping[str, str], where: str) -> list[Bind]:
    """Each mount's host path: a source made absolute, a volume's directory from ``env``.

    :raises AllocstackError: ``prerequisite`` for a source that does not exist, ``config`` for a volume the
        component was not given (not in config ``volumes``).
    """
    binds = []
    for mount in mounts:
        if mount.get("volume"):
            name = volume_variable(mount["volume"])
            if name not in env:
                raise AllocstackError("config", f"{where}: mount {mount['target']}: volume {mount['volume']} is not in "
                                                "`volumes`")
            host = env[name]
        else:
            host = os.path.abspath(mount["source"])
            if not os.path.exists(host):
                raise AllocstackError("prerequisite", f"{where}: mount {mount['target']}: its source {mount['source']} "
                                                      "does not exist")
        binds.append(Bind(host, os.path.normpath(mount["target"]), bool(mount.get("read_only"))))
    return binds


class PathRewriter:
    """Container paths -> host paths, for a program that runs without its image."""

    def __init__(self, binds: list[Bind]) -> None:
        self.by_target = {bind.target: bind.host for bind in binds}
        targets = sorted(self.by_target, key=len, reverse=True)
        alternatives = "|".join(re.escape(target) for target in targets if target != "/")
        self.pattern = re.compile(rf"(?<![A-Za-z0-9_.~/-])(?:{alternatives})(?=/|$|[^A-Za-z0-9_.-])") \
            if alternatives else None

    def text(self, value: str) -> str:
        if self.pattern is None:
            return value
        return self.pattern.sub(lambda match: self.by_target[match.group(0)], value)

    def argv(self, argv: list[str]) -> list[str]:
        return [self.text(arg) for arg in argv]

    def environment(self, env: Mapping[str, str], names: set[str]) -> dict[str, str]:
        """``env`` with the values of ``names`` (the program's own variables) rewritten."""
        return {name: self.text(value) if name in names else value for name, value in env.items()}

    def directory(self, path: str | None) -> str | None:
        return str(Path(self.text(path))) if path else None
