#!/usr/bin/env python3
"""Make an image the way a registry would give it, from a root filesystem and an image config, without Docker.

    python3 container/oci.py archive ROOTFS CONFIG.json OUT.tar    # an OCI image layout, as `docker save` gives it
    python3 container/oci.py charliecloud ROOTFS CONFIG.json OUTDIR # a directory image, as `ch-image pull` leaves it

CONFIG.json is the ``config`` part of an OCI image config (what a Dockerfile's ENTRYPOINT, CMD,
EXPOSE, WORKDIR, ENV and VOLUME set): ``{"Entrypoint": [...], "Cmd": [...], "ExposedPorts":
{"6379/tcp": {}}, "WorkingDir": "/data", "Env": ["K=V"], "Volumes": {"/data": {}}}``.

``archive`` writes an OCI image layout tar (one uncompressed layer holding ROOTFS, the config, a
manifest, index.json), which ``apptainer build IMAGE.sif oci-archive://OUT.tar`` turns into a SIF
exactly as it turns an image from Docker Hub into one: the OCI config kept in the SIF
(``oci-config.json``), the ENTRYPOINT and CMD in its runscript. ``charliecloud`` copies ROOTFS to
OUTDIR with what ``ch-image pull`` writes beside a pulled image: ``/ch/config.pulled.json`` (the
config as pulled), ``/ch/metadata.json`` (its working directory, environment, volumes),
``/ch/environment``, and each VOLUME's directory made, as ch-image makes them.

Deterministic: the same ROOTFS and CONFIG give the same bytes (sorted names, times zeroed), so a
build's digest says what is in it. Standard library only (container/build.sh runs it with the build
machine's python3).
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import shutil
import sys
import tarfile
from pathlib import Path
from typing import Any

#: What Apptainer and Charliecloud add at the top of an image they built: never part of a layer (Apptainer
#: makes its own again from the OCI config, ch-image its ``/ch``).
SKIP = {"ch", ".singularity.d", ".exec", ".run", ".shell", ".test", "environment", "singularity"}


def layer(rootfs: Path) -> bytes:
    """ROOTFS as one uncompressed tar layer, entries sorted, owners root, times zeroed."""
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for directory, dirs, files in os.walk(rootfs):
            dirs.sort()
            relative = Path(directory).relative_to(rootfs)
            if relative == Path("."):
                dirs[:] = [name for name in dirs if name not in SKIP]
                files = [name for name in files if name not in SKIP]
            for name in sorted(dirs) + sorted(files):
                path = Path(directory) / name
                info = tar.gettarinfo(str(path), arcname=str(relative / name))
                info.uid = info.gid = 0
                info.uname = info.gname = ""
                info.mtime = 0
                if info.isfile():
                    with open(path, "rb") as handle:
                        tar.addfile(info, handle)
                else:
                    tar.addfile(info)
    return data.getvalue()


def archive(rootfs: Path, config: dict[str, Any], out: Path) -> None:
    """An OCI image layout tar of ROOTFS with CONFIG (see the module's docstring)."""
    blob = layer(rootfs)
    diff = hashlib.sha256(blob).hexdigest()
    image_config = {"architecture": "amd64", "os": "linux", "config": config,
                    "rootfs": {"type": "layers", "diff_ids": [f"sha256:{diff}"]},
                    "history": [{"created_by": "allocstack container/oci.py (from a Debian root filesystem)"}]}
    config_bytes = json.dumps(image_config, sort_keys=True).encode()
    manifest = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                           "digest": f"sha256:{hashlib.sha256(config_bytes).hexdigest()}", "size": len(config_bytes)},
                "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": f"sha256:{diff}",
                            "size": len(blob)}]}
    manifest_bytes = json.dumps(manifest, sort_keys=True).encode()
    index = {"schemaVersion": 2, "manifests": [{
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "digest": f"sha256:{hashlib.sha256(manifest_bytes).hexdigest()}", "size": len(manifest_bytes),
        "annotations": {"org.opencontainers.image.ref.name": "latest"}}]}
    with tarfile.open(out, "w") as tar:
        for directory in ("blobs", "blobs/sha256"):
            info = tarfile.TarInfo(directory)
            info.type, info.mode = tarfile.DIRTYPE, 0o755
            tar.addfile(info)
        files = [("oci-layout", json.dumps({"imageLayoutVersion": "1.0.0"}).encode()),
                 ("index.json", json.dumps(index, sort_keys=True).encode()),
                 *((f"blobs/sha256/{hashlib.sha256(data).hexdigest()}", data)
                   for data in (blob, config_bytes, manifest_bytes))]
        for name, data in files:
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))


def charliecloud(rootfs: Path, config: dict[str, Any], out: Path) -> None:
    """A Charliecloud directory image of ROOTFS, laid out as ``ch-image pull`` leaves a pulled image."""
    if out.exists():
        shutil.rmtree(out)
    shutil.copytree(rootfs, out, symlinks=True, ignore=lambda directory, names: (
        [name for name in names if name in SKIP] if Path(directory) == rootfs else []))
    (out / "ch").mkdir()
    env = dict(line.split("=", 1) for line in config.get("Env") or [] if "=" in line)
    (out / "ch" / "config.pulled.json").write_text(json.dumps({"architecture": "amd64", "os": "linux",
                                                               "config": config}, indent=2, sort_keys=True) + "\n")
    metadata = {"arch": "amd64", "cwd": config.get("WorkingDir") or "/", "env": env, "history": [],
                "labels": config.get("Labels") or {}, "shell": ["/bin/sh", "-c"],
                "volumes": sorted(config.get("Volumes") or {})}
    (out / "ch" / "metadata.json").write_text(json.dumps(metadata, indent=2, sort_keys=True) + "\n")
    (out / "ch" / "environment").write_text("".join(f"{name}={value}\n" for name, value in sorted(env.items())))
    for volume in [*(config.get("Volumes") or {}), config.get("WorkingDir") or "/"]:
        (out / volume.lstrip("/")).mkdir(parents=True, exist_ok=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("what", choices=["archive", "charliecloud"])
    parser.add_argument("rootfs", type=Path)
    parser.add_argument("config", type=Path, help="the image config (OCI config's `config` part), JSON")
    parser.add_argument("out", type=Path)
    args = parser.parse_args(argv)
    try:
        config = json.loads(args.config.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        print(f"oci.py: {args.config}: {exc}", file=sys.stderr)
        return 2
    if not args.rootfs.is_dir():
        print(f"oci.py: {args.rootfs} is not a directory", file=sys.stderr)
        return 2
    (archive if args.what == "archive" else charliecloud)(args.rootfs, config, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
