"""How a component runs inside an image: the one place that knows Apptainer and Charliecloud.

``launch.py`` puts :func:`container_prefix` in front of ``python3 SCRIPT ...``; the plan
refuses an image whose runtime's program (:data:`PROGRAMS`) is not on PATH before anything is
submitted; ``collect.py`` records its ``--version``.

Both runtimes give a component the same view: the environment holds only what
allocstack sets, and of the host's files only the run's paths are there, each at the
same path as outside (so no command line needs rewriting).

Charliecloud's ``ch-run`` (0.31) can bind a host path only onto a directory that
already exists in the image, and it mounts the image read-only. So allocstack builds
a private *mount-point tree* for each component: for every top-level directory the
run's paths live under (``/project`` for ``/project/me/allocstack/results/run``), an
empty tree of just the directories leading to those paths; that tree is bound at
the top-level directory (which the image must have, empty: everything the image
keeps below it is hidden during the run), and the run's paths are bound inside it.

ch-run takes a directory image or a SquashFS file; with the latter it stays behind as
the image's file server and runs the component as its child (:func:`forks_component`),
which is where launch.py sends the stop signals (:func:`forked_components`).
"""

from __future__ import annotations

import contextlib
import os
import pwd
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..common.errors import AllocstackError
from .procfs import child_pids

#: runtime (config ``runtime``) -> the program that runs an image.
PROGRAMS = {"apptainer": "apptainer", "charliecloud": "ch-run"}


def version_argv(runtime: str) -> list[str]:
    """The command that prints ``runtime``'s version (ch-run prints it on stderr)."""
    return [PROGRAMS[runtime], "--version"]


#: The PATH a Charliecloud component starts with (Docker's default); the image's own
#: ``/ch/environment`` (where ch-image writes a Dockerfile's ENV) is applied after it.
BASE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
#: Top-level directories of the image itself: hiding one behind a mount-point tree would
#: break the image, so a run path below one of them is refused.
SYSTEM_DIRS = frozenset({"bin", "boot", "dev", "etc", "lib", "lib32", "lib64", "libx32", "proc", "sbin", "sys", "usr"})


def runtime_environ(environ: Mapping[str, str]) -> dict[str, str]:
    """``environ`` with ``$USER`` set: ch-run refuses to start without it ("$USER not set")."""
    env = dict(environ)
    if not env.get("USER"):
        env["USER"] = pwd.getpwuid(os.getuid()).pw_name
    return env


def container_prefix(runtime: str, image: str, args: list[str], binds: list[str], env: Mapping[str, str],
                     cwd: str, mount_tree: Path | None = None, hosts: Path | None = None) -> list[str]:
    """The argv that runs a command in ``image`` with ``binds`` at the same paths, in ``cwd``.

    :param env: the component's whole environment inside the image (besides the image's own).
    :param mount_tree: Charliecloud only: the directory :func:`mount_tree_dirs` was created in.
    :param hosts: the stack's hosts file (allocstack/launch/hostsfile.py), bound at /etc/hosts.
    :raises AllocstackError: ``prerequisite`` for a path Charliecloud cannot bind.
    """
    unique = list(dict.fromkeys(binds))  # de-duplicated, order kept
    if runtime == "apptainer":
        argv = apptainer_prefix(image, args, unique, env, cwd)
        return [*argv[:-1], *hosts_binds(runtime, hosts), argv[-1]]
    if mount_tree is None:
        raise ValueError("charliecloud needs a mount-point tree")
    argv = charliecloud_prefix(image, args, unique, env, cwd, mount_tree)
    return [*argv[:-2], *hosts_binds(runtime, hosts if has_etc_hosts(image) else None), *argv[-2:]]


#: Where the stack's hosts file is seen in every image.
ETC_HOSTS = "/etc/hosts"


def has_etc_hosts(image: str | None) -> bool:
    """ch-run binds only onto a file the image has: a directory image without /etc/hosts gets none (a SquashFS
    image cannot be looked into before ch-run mounts it: Debian's and Docker's images all have one)."""
    return bool(image) and (not Path(image or "").is_dir() or (Path(image or "") / "etc" / "hosts").is_file())


def hosts_binds(runtime: str, hosts: Path | None) -> list[str]:
    """The runtime's arguments that bind ``hosts`` (the stack's hosts file) at /etc/hosts, read-only (none: [])."""
    if hosts is None:
        return []
    if runtime == "apptainer":  # over the host's /etc/hosts, which apptainer.conf binds by default
        return ["--bind", f"{hosts}:{ETC_HOSTS}:ro"]
    return [f"--bind={hosts}:{ETC_HOSTS}"]  # ch-run binds read-write only; the file is the user's own anyway


def apptainer_prefix(image: str, args: list[str], binds: list[str], env: Mapping[str, str], cwd: str) -> list[str]:
    """``apptainer exec``; ``--pwd`` keeps relative paths working under ``--contain`` (which starts in $HOME).

    The clean environment and the contained file system come from ``apptainer.args``
    (default ``--cleanenv --contain``).
    """
    argv = [PROGRAMS["apptainer"], "exec", *args, "--pwd", cwd]
    for name, value in env.items():
        argv += ["--env", f"{name}={value}"]
    for path in binds:
        argv += ["--bind", f"{path}:{path}"]
    return [*argv, image]


def charliecloud_prefix(image: str, args: list[str], binds: list[str], env: Mapping[str, str], cwd: str,
                        mount_tree: Path) -> list[str]:
    """``ch-run`` with a clean environment, a private /tmp and only ``binds`` from the host.

    Order matters to ch-run: ``--unset-env='*'`` first (nothing from the host), then the base
    PATH and, for a directory image that has one, the image's ``/ch/environment`` (as
    Apptainer applies an image's %environment), then ``charliecloud.args``, then allocstack's
    variables, so that none of them can be dropped or overridden by accident. Each value is
    written ``NAME='VALUE'``: ch-run strips one pair of single quotes, so the value arrives
    exactly as given.
    """
    argv = [PROGRAMS["charliecloud"], "--unset-env=*", f"--set-env=PATH={BASE_PATH}"]
    if Path(image).is_dir() and (Path(image) / "ch" / "environment").is_file():
        argv.append(f"--set-env={Path(image) / 'ch' / 'environment'}")
    argv += args
    for name, value in env.items():
        argv.append(f"--set-env={name}={charliecloud_value(name, value)}")
    argv += ["--private-tmp", f"--cd={cwd}"]
    for top in sorted(mount_tops([*binds, cwd]) - set(whole_tops(binds))):
        argv.append(f"--bind={mount_tree / top}:/{top}")
    for path in sorted(binds):  # a parent before anything bound inside it
        argv.append(f"--bind={path}:{path}")
    return [*argv, image, "--"]


def charliecloud_value(name: str, value: str) -> str:
    """``value`` quoted for ``ch-run --set-env``, which expands ``$NAME`` items of colon lists.

    :raises AllocstackError: ``prerequisite`` for a value ch-run would expand.
    """
    if any(item.startswith("$") for item in value.split(":")):
        raise AllocstackError("prerequisite", f"${name}={value!r} cannot pass into ch-run unchanged "
                                              "(it would expand the $ item)")
    return f"'{value}'"


def mount_tops(paths: Iterable[str]) -> set[str]:
    """Top-level directory names of absolute ``paths`` (``/`` itself has none).

    :raises AllocstackError: ``prerequisite`` for a path below a system directory of the image,
        or one ch-run cannot bind (a colon separates its source from its destination).
    """
    tops = set()
    for path in paths:
        if ":" in path:
            raise AllocstackError("prerequisite", f"{path}: ch-run cannot bind a path that contains ':'")
        parts = Path(path).parts[1:]
        if not parts:
            continue
        if parts[0] in SYSTEM_DIRS:
            raise AllocstackError("prerequisite", f"{path} is below /{parts[0]}, which belongs to the image: "
                                                  "ch-run cannot bind a run path there; move it elsewhere")
        tops.add(parts[0])
    return tops


def whole_tops(binds: Iterable[str]) -> list[str]:
    """Top-level directories bound as a whole (``/scratch`` itself): no mount-point tree there."""
    return [Path(path).parts[1] for path in binds if len(Path(path).parts) == 2]


def mount_tree_dirs(binds: list[str], cwd: str | None, mount_tree: Path) -> list[Path]:
    """The directories to create in ``mount_tree`` before ch-run starts: each path's own, below its top."""
    whole = set(whole_tops(binds))
    return [mount_tree / path.lstrip("/") for path in [*binds, *([cwd] if cwd else [])]
            if len(Path(path).parts) > 1 and Path(path).parts[1] not in whole]


def check_mount_points(image: str, tops: Iterable[str]) -> None:
    """A directory image must have each top-level directory the run's paths live under.

    A SquashFS image cannot be looked into before ch-run mounts it: ch-run then reports
    ``can't mkdir ... Read-only file system`` itself.

    :raises AllocstackError: ``prerequisite`` naming the missing directory and the fix.
    """
    if not Path(image).is_dir():
        return
    for top in sorted(tops):
        if not (Path(image) / top).is_dir() or (Path(image) / top).is_symlink():
            raise AllocstackError(
                "prerequisite", f"image {image} has no directory /{top} to bind the run's paths under: ch-run "
                                f"binds only onto directories the image has; create it in the image (container/"
                                f"README.md: mount points) or run from elsewhere")


#: The first four bytes of a SquashFS file (its magic number, little-endian ``0x73717368``).
SQUASHFS_MAGIC = b"hsqs"


def is_squashfs(image: str) -> bool:
    """``image`` is a SquashFS file (not a directory, not a SIF, whose SquashFS lies inside it)."""
    try:
        with open(image, "rb") as stream:
            return stream.read(len(SQUASHFS_MAGIC)) == SQUASHFS_MAGIC
    except (IsADirectoryError, FileNotFoundError):
        return False


def check_image_format(runtime: str, image: str) -> None:
    """Charliecloud runs a directory image or a SquashFS file (``ch-run`` 0.31 cannot open a SIF).

    :raises AllocstackError: ``config`` for any other file under Charliecloud, naming the fix.
    """
    if runtime == "charliecloud" and Path(image).is_file() and not is_squashfs(image):
        raise AllocstackError(
            "config", f"image {image} is neither a directory nor a SquashFS file, which is what runtime charliecloud "
                      f"runs (a SIF? unpack it: ch-convert {image} DIR, then python3 workflow/scripts/image_digest.py "
                      "DIR, and set image to DIR)")


def forks_component(runtime: str, image: str) -> bool:
    """``ch-run`` runs the component as its child, not as itself: a SquashFS image.

    ch-run (0.31) mounts a SquashFS image itself (libsquashfuse, in its own namespace) and
    stays as the mount's server while its child runs the component; on SIGTERM it unmounts
    the image at once and exits without waiting for that child (measured), so a stop signal
    must reach the child alone: ch-run then unmounts and exits when the child has drained.
    With a directory image ch-run becomes the component (exec), and the signal goes to it.
    """
    return runtime == "charliecloud" and is_squashfs(image)


def process_name(pid: int) -> str | None:
    """The program name of process ``pid`` (``/proc/PID/comm``), None when it is gone."""
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return None


def forked_components(pids: list[int]) -> list[int]:
    """Among ``pids`` (a job step's processes, or ch-run itself), the children of the ch-run processes.

    ch-run's own child is named ch-run too until it starts the component, and has no children.
    """
    program = PROGRAMS["charliecloud"]
    return [child for pid in pids if process_name(pid) == program for child in child_pids(pid)]


# ---------------------------------------------------------------- a program of yours in its own image


@dataclass(frozen=True)
class Bind:
    """A Compose mount of a program: ``host`` seen at ``target`` in its image, read-only or not."""

    host: str
    target: str
    read_only: bool = False


#: ``apptainer exec`` takes a program's variables from its own environment under this prefix (also with
#: --cleanenv), so that no value (a token, a password) is ever on a command line other users can read.
APPTAINER_ENV_PREFIX = "APPTAINERENV_"
#: Run before ch-run when a mount must be read-only (ch-run binds read-write only): in a user and mount
#: namespace of its own, each source is bound read-only onto a private path, which ch-run then binds.
READ_ONLY_SCRIPT = ('while [ "$1" != -- ]; do mount --bind "$1" "$2" && mount -o remount,bind,ro "$2" || exit 69; '
                    'shift 2; done; shift; exec "$@"')


def program_prefix(runtime: str, image: str, args: list[str], binds: list[str], mounts: list[Bind],
                   env: Mapping[str, str], cwd: str, private: Path, host_cwd: bool = False) -> tuple[list[str], dict[str, str]]:
    """The argv that runs a program of yours in ``image`` (before its own argv), and what its runtime's process
    needs in its environment besides ours.

    The program sees ``binds`` at the same paths, each of ``mounts`` at its target (read-only where it says so,
    and a write there fails), starts in ``cwd`` and has exactly ``env`` besides the image's own variables, none of
    them on the command line: Apptainer takes them as ``APPTAINERENV_*`` from its own environment, ch-run from
    a 0600 file in ``private`` (the program's directory in the run's scratch, which also holds Charliecloud's
    mount-point tree and the read-only views of its mounts). ``host_cwd``: ``cwd`` is a path of this machine
    (the directory snakemake runs in), not one of the image's, so Charliecloud needs a mount point for it.

    :raises AllocstackError: ``prerequisite`` for a path the runtime cannot bind or a mount target a directory
        image lacks, ``config`` for a value ch-run cannot pass unchanged.
    """
    for bind in mounts:
        if any(char in f"{bind.host}{bind.target}" for char in ":,"):
            raise AllocstackError("prerequisite", f"{bind.host} -> {bind.target}: a path with ':' or ',' cannot be "
                                                  f"bound by {PROGRAMS[runtime]}")
    unique = list(dict.fromkeys(binds))
    if runtime == "apptainer":
        argv = [PROGRAMS["apptainer"], "exec", *args, "--pwd", cwd]
        for path in unique:
            argv += ["--bind", f"{path}:{path}"]
        for bind in mounts:
            argv += ["--bind", f"{bind.host}:{bind.target}{':ro' if bind.read_only else ''}"]
        return [*argv, image], {f"{APPTAINER_ENV_PREFIX}{name}": value for name, value in env.items()}
    check_mount_targets(image, mounts)
    private.mkdir(mode=0o700, parents=True, exist_ok=True)
    tree = private / "mounts"
    host_paths = [*unique, cwd] if host_cwd else list(unique)
    check_mount_points(image, mount_tops(host_paths))
    for directory in mount_tree_dirs(unique, cwd if host_cwd else None, tree):
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    env_file = private / "environment"
    env_file.write_text("".join(f"{name}={charliecloud_value(name, value)}\n" for name, value in env.items()),
                        encoding="utf-8")
    env_file.chmod(0o600)
    views: list[tuple[str, str]] = []
    argv = [PROGRAMS["charliecloud"], "--unset-env=*", f"--set-env=PATH={BASE_PATH}"]
    if Path(image).is_dir() and (Path(image) / "ch" / "environment").is_file():
        argv.append(f"--set-env={Path(image) / 'ch' / 'environment'}")
    argv += [*args, f"--set-env={env_file}", "--private-tmp", f"--cd={cwd}"]
    for top in sorted(mount_tops(host_paths) - set(whole_tops(unique))):
        argv.append(f"--bind={tree / top}:/{top}")
    for path in sorted(unique):
        argv.append(f"--bind={path}:{path}")
    for index, bind in enumerate(mounts):
        source = bind.host
        if bind.read_only:
            view = private / f"read-only-{index}"
            if Path(bind.host).is_dir():
                view.mkdir(mode=0o700, exist_ok=True)
            else:
                view.touch(mode=0o600, exist_ok=True)
            views.append((bind.host, str(view)))
            source = str(view)
        argv.append(f"--bind={source}:{bind.target}")
    argv += [image, "--"]
    if views:
        # ch-run inside a user namespace whose root is this user: it runs the program as this user again
        argv[1:1] = [f"--uid={os.getuid()}", f"--gid={os.getgid()}"]
        wrapper = ["unshare", "--user", "--map-root-user", "--mount", "--propagation", "private", "--",
                   "/bin/sh", "-c", READ_ONLY_SCRIPT, "allocstack-read-only"]
        argv = [*wrapper, *(part for view in views for part in view), "--", *argv]
    return argv, {}


def check_mount_targets(image: str, mounts: list[Bind]) -> None:
    """A directory image must have each mount's target (ch-run binds only onto paths the image has, and
    cannot create one in a read-only image); a SquashFS image cannot be looked into before ch-run mounts it.

    :raises AllocstackError: ``prerequisite`` naming the missing path and the fix.
    """
    if not Path(image).is_dir():
        return
    for bind in mounts:
        inside = Path(image) / bind.target.lstrip("/")
        wanted_dir = Path(bind.host).is_dir()
        if not (inside.is_dir() if wanted_dir else inside.is_file()):
            kind = "directory" if wanted_dir else "file"
            raise AllocstackError(
                "prerequisite", f"image {image} has no {kind} {bind.target} to mount {bind.host} onto: ch-run binds "
                                f"only onto paths the image has; create it in the image (as a Dockerfile's VOLUME "
                                f"{bind.target} does), or run with Apptainer")


def deliverer(runtime: str, image: str | None) -> Callable[[Any, int], None]:
    """How a supervisor passes a stop signal to a program of yours that ``runtime`` runs in ``image``: to the
    runtime's process, except a SquashFS image under ch-run, which stays as the image's server: to its child."""
    forked = bool(image) and forks_component(runtime, image or "")

    def deliver(child: Any, signum: int) -> None:
        if forked:
            targets = forked_components([child.pid])
            for pid in targets:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signum)
            if targets:
                return
        child.send_signal(signum)

    return deliver
