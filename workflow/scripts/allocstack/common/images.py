"""Images as Compose names them and as a container runtime keeps them: references, files, and the image's own
command, working directory and EXPOSE ports.

Where each runtime keeps what a Docker/OCI image says about itself:

* **Apptainer**, a SIF built from a Docker or OCI source (``docker://``, ``docker-archive://``,
  ``oci-archive://``): the image's OCI config verbatim in the SIF data object ``oci-config.json``
  (``Entrypoint``, ``Cmd``, ``WorkingDir``, ``ExposedPorts``), read here from the SIF's descriptors without
  running anything; and the same ENTRYPOINT and CMD as ``OCI_ENTRYPOINT=`` / ``OCI_CMD=`` lines of the
  image's runscript, ``/.singularity.d/runscript`` (what ``apptainer run`` executes; a sandbox directory
  keeps only this). An image built from a definition file has no OCI config: its ``%runscript`` is its
  own command.
* **Charliecloud**, a directory image pulled by ``ch-image pull``: the OCI config verbatim in
  ``/ch/config.pulled.json`` (Charliecloud's ``/ch/metadata.json`` keeps the working directory as
  ``cwd``, but not the command: ch-image does not support CMD or ENTRYPOINT, its issue 780). A directory
  unpacked from a SIF keeps the runscript. A SquashFS image is read through ``ch-run`` (the caller's
  ``read`` function).

Compose's rule for what runs (:func:`program_argv`): ``entrypoint:`` replaces the image's ENTRYPOINT and
drops its CMD; ``command:`` replaces the CMD; otherwise ENTRYPOINT + CMD.
"""

from __future__ import annotations

import json
import re
import shlex
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: Where an Apptainer image keeps the program ``apptainer run`` runs (also in a directory unpacked from a SIF).
RUNSCRIPT = "/.singularity.d/runscript"
#: Where ``ch-image pull`` keeps the pulled image's OCI config, and Charliecloud its own metadata.
CH_CONFIG = "ch/config.pulled.json"
CH_METADATA = "ch/metadata.json"
#: The SIF data object holding the OCI config of an image built from a Docker or OCI source.
SIF_OCI_CONFIG = "oci-config.json"

# ---------------------------------------------------------------- references

COMPONENT = re.compile(r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*")
TAG = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")
DIGEST = re.compile(r"[A-Za-z0-9]+(?:[+._-][A-Za-z0-9]+)*:[A-Fa-f0-9]{32,}")
REGISTRY = re.compile(r"(?:[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*|\[[0-9A-Fa-f:]+\])(?::\d+)?")


@dataclass(frozen=True)
class ImageRef:
    """An image reference: ``[registry[:port]/]path[:tag][@digest]`` (a port is never the image's)."""

    registry: str | None
    path: str
    tag: str | None
    digest: str | None

    @property
    def slug(self) -> str:
        """A file name for the image: ``redis:7`` -> ``redis-7``, ``ghcr.io/a/b:1.2`` -> ``a-b-1.2``."""
        name = self.path.removeprefix("library/")
        return re.sub(r"[^A-Za-z0-9.]+", "-", f"{name}-{self.tag}" if self.tag else name).strip("-.").lower()


def parse_reference(text: str) -> ImageRef | None:
    """``text`` as an image reference (Docker's grammar: ``[registry[:port]/]path[:tag][@digest]``), or None."""
    rest, _, digest = text.strip().partition("@")
    if digest and not DIGEST.fullmatch(digest):
        return None
    parts = rest.split("/")
    registry = None
    if len(parts) > 1 and ("." in parts[0] or ":" in parts[0] or parts[0] == "localhost"):
        registry = parts.pop(0)
        if not REGISTRY.fullmatch(registry):
            return None
    last, _, tag = parts[-1].partition(":")
    parts[-1] = last
    if not all(COMPONENT.fullmatch(part) for part in parts) or (tag and not TAG.fullmatch(tag)) or (":" in tag):
        return None
    return ImageRef(registry, "/".join(parts), tag or None, digest or None)


# ---------------------------------------------------------------- what an image says about itself


@dataclass(frozen=True)
class ImageMeta:
    """What an image says about how it runs.

    :param oci: the image keeps Docker/OCI ENTRYPOINT and CMD (else its own command is its runscript, if any).
    """

    oci: bool = False
    entrypoint: list[str] = field(default_factory=list)
    cmd: list[str] = field(default_factory=list)
    workdir: str | None = None
    exposed: list[int] = field(default_factory=list)
    runscript: bool = False
    source: str = "nothing"  # where it was read, for messages

    def describe(self) -> str:
        if self.oci:
            return f"ENTRYPOINT {self.entrypoint or '[]'} CMD {self.cmd or '[]'} ({self.source})"
        return f"its runscript {RUNSCRIPT}" if self.runscript else "no command of its own"


def from_oci_config(config: Any, source: str) -> ImageMeta:
    """An OCI image config (the whole config blob, or its ``config`` part as Apptainer keeps it)."""
    if isinstance(config, dict) and isinstance(config.get("config"), dict):
        config = config["config"]
    if not isinstance(config, dict):
        return ImageMeta(source=source)
    words = lambda key: [str(word) for word in config.get(key) or [] if isinstance(word, (str, int))]  # noqa: E731
    exposed = []
    for key in config.get("ExposedPorts") or {}:
        port, _, protocol = str(key).partition("/")
        if port.isdigit() and protocol in ("", "tcp"):
            exposed.append(int(port))
    workdir = config.get("WorkingDir") if isinstance(config.get("WorkingDir"), str) else None
    return ImageMeta(True, words("Entrypoint"), words("Cmd"), workdir or None, sorted(set(exposed)), source=source)


def from_runscript(text: str, source: str) -> ImageMeta:
    """An Apptainer runscript: an OCI-sourced image's ``OCI_ENTRYPOINT='...'`` / ``OCI_CMD='...'``, else a
    definition file's ``%runscript`` (the image's own command, taking the arguments)."""
    found: dict[str, list[str]] = {}
    for line in text.splitlines():
        match = re.match(r"(OCI_ENTRYPOINT|OCI_CMD)=(.*)$", line.strip())
        if match:
            try:
                found[match.group(1)] = shlex.split(" ".join(shlex.split(match.group(2))))
            except ValueError:
                return ImageMeta(runscript=True, source=source)
    if "OCI_ENTRYPOINT" in found or "OCI_CMD" in found:
        return ImageMeta(True, found.get("OCI_ENTRYPOINT", []), found.get("OCI_CMD", []), runscript=True,
                         source=source)
    return ImageMeta(runscript=bool(text.strip()), source=source)


def sif_objects(path: Path, names: set[str]) -> dict[str, bytes]:
    """The SIF data objects named in ``names`` (read from the SIF's descriptors; absent ones are left out).

    A SIF starts with a 128-byte header (launch script, magic ``SIF_MAGIC``, version, architecture, UUID,
    then eight little-endian int64: created, modified, descriptors free, total, offset, size, data offset,
    size); each descriptor is 585 bytes: type, used, id, group, link, offset, size, ..., a 128-byte name.

    :raises OSError: when the file cannot be read. :raises ValueError: when it is not a SIF.
    """
    with open(path, "rb") as handle:
        header = handle.read(128)
        if len(header) < 128 or header[32:41] != b"SIF_MAGIC":
            raise ValueError(f"{path} is not a SIF file")
        total, offset = struct.unpack_from("<qq", header, 64 + 24)
        handle.seek(offset)
        table = handle.read(total * 585)
        found: dict[str, bytes] = {}
        for index in range(total):
            used, data_offset, size, name = (
                struct.unpack_from("<?", table, index * 585 + 4)[0],
                *struct.unpack_from("<qq", table, index * 585 + 17),
                table[index * 585 + 73:index * 585 + 201].rstrip(b"\0").decode("utf-8", "replace"))
            if used and name in names and 0 <= size <= 16 << 20:
                handle.seek(data_offset)
                found[name] = handle.read(size)
    return found


#: Reads one file inside an image that cannot be read from outside (a SquashFS image): None when absent.
Reader = Callable[[str], "str | None"]


def read_meta(image: str, read: Reader | None = None) -> ImageMeta:
    """What ``image`` (a SIF, a directory image, or through ``read`` any other) says about how it runs.

    :raises OSError: when the image cannot be read.
    """
    path = Path(image)
    if path.is_file() and path.suffix != ".sqfs":
        try:
            objects = sif_objects(path, {SIF_OCI_CONFIG})
        except ValueError:
            objects = None
        if objects is not None:
            if SIF_OCI_CONFIG in objects:
                return from_oci_config(json.loads(objects[SIF_OCI_CONFIG]), f"the SIF's {SIF_OCI_CONFIG}")
            return ImageMeta(runscript=True, source="its definition file's %runscript")
    if path.is_dir():
        files = {name: (path / name).read_text(encoding="utf-8") if (path / name).is_file() else None
                 for name in (CH_CONFIG, CH_METADATA, RUNSCRIPT.lstrip("/"))}
    elif read is not None:
        files = {name: read("/" + name) for name in (CH_CONFIG, CH_METADATA, RUNSCRIPT.lstrip("/"))}
    else:
        return ImageMeta()
    return meta_from_files(files)


def meta_from_files(files: dict[str, str | None]) -> ImageMeta:
    """:func:`read_meta` from the text of ``ch/config.pulled.json``, ``ch/metadata.json`` and the runscript."""
    workdir = None
    if files.get(CH_METADATA):
        try:
            cwd = json.loads(files[CH_METADATA] or "{}").get("cwd")
        except (ValueError, AttributeError):
            cwd = None
        workdir = cwd if isinstance(cwd, str) and cwd not in ("", "/") else None
    if files.get(CH_CONFIG):
        try:
            meta = from_oci_config(json.loads(files[CH_CONFIG] or "{}"), f"/{CH_CONFIG}")
        except ValueError:
            meta = ImageMeta()
        if meta.oci:
            return meta if meta.workdir or not workdir else ImageMeta(**{**meta.__dict__, "workdir": workdir})
    runscript = files.get(RUNSCRIPT.lstrip("/"))
    if runscript:
        meta = from_runscript(runscript, RUNSCRIPT)
        return meta if not workdir else ImageMeta(**{**meta.__dict__, "workdir": workdir})
    return ImageMeta(workdir=workdir, source=f"/{CH_METADATA}" if workdir else "nothing")


def program_argv(meta: ImageMeta, entrypoint: list[str] | None, command: list[str] | None) -> list[str]:
    """What runs in the image, by Compose's rules: ``entrypoint`` (given) replaces the image's ENTRYPOINT and
    its CMD; ``command`` (given) replaces the CMD; else the image's ENTRYPOINT + CMD. An image built from a
    definition file has its runscript instead: it runs when no command is given. [] when nothing would run."""
    if entrypoint:
        return [*entrypoint, *(command or [])]
    if meta.oci:
        return [*meta.entrypoint, *(command or meta.cmd)]
    if command:
        return list(command)
    return [RUNSCRIPT] if meta.runscript else []
