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
keeps below it is hidden during the run), and the run's paths are bound inside it. A program's own mounts
(Compose's volumes, secrets and configs) whose targets the image lacks get private directories of the same
tree where they hide nothing the image keeps (:func:`check_mount_targets`).

ch-run takes a directory image or a SquashFS file; with the latter it stays behind as
the image's file server and runs the component as its child (:func:`forks_component`),
which is where launch.py sends the stop signals (:func:`forked_components`).
"""

from __future__ import annotations

import contextlib
import os
import pwd
import stat
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
    tree = private / "mounts"
    host_paths = [*unique, cwd] if host_cwd else list(unique)
    tops = sorted(mount_tops(host_paths) - set(whole_tops(unique)))
    check_mount_points(image, mount_tops(host_paths))
    private_dirs = check_mount_targets(image, mounts, [f"/{top}" for top in tops])
    private.mkdir(mode=0o700, parents=True, exist_ok=True)
    for directory in mount_tree_dirs(unique, cwd if host_cwd else None, tree):
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    make_mount_points(tree, private_dirs, mounts, [f"/{top}" for top in tops])
    env_file = private / "environment"
    env_file.write_text("".join(f"{name}={charliecloud_value(name, value)}\n" for name, value in env.items()),
                        encoding="utf-8")
    env_file.chmod(0o600)
    views: list[tuple[str, str]] = []
    argv = [PROGRAMS["charliecloud"], "--unset-env=*", f"--set-env=PATH={BASE_PATH}"]
    if Path(image).is_dir() and (Path(image) / "ch" / "environment").is_file():
        argv.append(f"--set-env={Path(image) / 'ch' / 'environment'}")
    argv += [*args, f"--set-env={env_file}", "--private-tmp", f"--cd={cwd}"]
    for top in tops:
        argv.append(f"--bind={tree / top}:/{top}")
    for entry in private_dirs:  # before what is bound inside it
        argv.append(f"--bind={tree / entry.path.lstrip('/')}:{entry.path}")
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


#: Where Compose puts secrets, and where a system keeps its runtime state (the FHS: emptied at the start of each
#: boot), so nothing an image keeps there is read by a program: below it ch-run gets a private directory.
RUNTIME_DIR = "/run"


@dataclass(frozen=True)
class PrivateDir:
    """A directory of an image that a program under ch-run sees as a private directory of its own, so that each
    mount below it has a path to be bound onto (ch-run 0.31 binds only onto paths the image has, and cannot make
    one in a read-only image): ``path`` in the image, its permission bits there, and the image's directories below
    it (relative path, permission bits), made again, empty."""

    path: str
    mode: int = 0o755
    skeleton: tuple[tuple[str, int], ...] = ()


def within(path: str, directories: Iterable[str]) -> bool:
    """``path`` is one of ``directories`` or below one of them (absolute, normalised paths)."""
    return any(path == directory or path.startswith(directory.rstrip("/") + "/") for directory in directories)


def image_directories(root: Path, stop_at_other: bool = False) -> tuple[list[tuple[str, int]], Path | None]:
    """The directories below ``root`` (relative path, permission bits), and the first entry that is not a
    directory (a file, a symlink, ...) or whose directory cannot be read, None when there is none. Symlinks are never
    followed; with ``stop_at_other`` the walk stops at that first entry."""
    found: list[tuple[str, int]] = []
    other = None
    pending = [root]
    while pending:
        current = pending.pop()
        try:
            with os.scandir(current) as listing:
                entries = sorted(listing, key=lambda entry: entry.name)
        except PermissionError:  # what it holds cannot be seen (another owner's 0700 directory)
            entries, other = [], other or current
            if stop_at_other:
                return sorted(found), other
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                found.append((str(Path(entry.path).relative_to(root)),
                              stat.S_IMODE(entry.stat(follow_symlinks=False).st_mode)))
                pending.append(Path(entry.path))
            elif other is None:
                other = Path(entry.path)
                if stop_at_other:
                    return sorted(found), other
    return sorted(found), other


def deepest_directory(image: Path, target: str) -> tuple[str, str | None]:
    """The deepest directory on ``target``'s path that ``image`` (a directory image) has, walking down from ``/``
    without following symlinks; and, when the walk stops at something else than a missing name, what it is."""
    current = "/"
    for part in Path(target).parts[1:]:
        below = os.path.join(current, part)
        inside = image / below.lstrip("/")
        if inside.is_symlink():
            return current, (f"{below} is a symlink in the image (to {os.readlink(inside)}), which ch-run follows "
                             "on the host's side: mount at the path it names")
        if not inside.exists():
            return current, None
        if not inside.is_dir():
            return current, f"{below} is a file in the image"
        current = below
    return current, None


def check_mount_targets(image: str, mounts: list[Bind], covered: Iterable[str] = ()) -> list[PrivateDir]:
    """Where ch-run needs a private directory in place of the image's so that each mount has a path to be bound
    onto; the one-line refusal where none can do.

    ch-run (0.31) binds only onto paths the image has, and mounts it read-only. A mount whose target a directory
    image has is bound there. Below ``/run`` (every secret, at ``/run/secrets/<name>``) the program gets a
    private ``/run`` with the image's directories there made again: a system's runtime state, which nothing
    reads from an image (also for a SquashFS image, which cannot be looked into before ch-run mounts it; the
    image needs a ``/run``, as Debian's and Docker Hub's all have). Elsewhere a missing target gets a private
    directory in place of the deepest directory of its path the image has, when that directory holds nothing
    but directories (made again): nothing of the image is hidden. ``covered``: directories that are private
    already (the mount-point tree of the run's own paths).

    :raises AllocstackError: ``prerequisite`` naming the missing path, why nothing can make it, and the fix.
    """
    root = Path(image)
    directory_image = root.is_dir()
    private: dict[str, PrivateDir] = {}
    for bind in mounts:
        target = os.path.normpath(bind.target)
        if within(target, [*covered, *private]):
            continue
        wanted_dir = Path(bind.host).is_dir()
        kind = "directory" if wanted_dir else "file"
        missing = (f"image {image} has no {kind} {target} to mount {bind.host} onto: ch-run binds only onto paths "
                   "the image has")
        make = f"VOLUME {target} or RUN mkdir -p {target}" if wanted_dir else \
            f"RUN mkdir -p {os.path.dirname(target)} && touch {target}"
        fix = f"create it in the image (a Dockerfile's {make}), mount it below /run, or run with Apptainer"
        if within(target, [RUNTIME_DIR]):
            if directory_image:
                ancestor, problem = deepest_directory(root, RUNTIME_DIR)
                if ancestor != RUNTIME_DIR:
                    raise AllocstackError("prerequisite", f"{missing}, and no directory {RUNTIME_DIR} to hold it"
                                                          f"{f' ({problem})' if problem else ''}: {fix}")
            private[RUNTIME_DIR] = private_dir(root, RUNTIME_DIR) if directory_image else PrivateDir(RUNTIME_DIR)
            continue
        if not directory_image:
            continue  # a SquashFS image: ch-run says itself what it cannot bind
        inside = root / target.lstrip("/")
        if (inside.is_dir() if wanted_dir else inside.is_file()) and not inside.is_symlink():
            continue
        ancestor, problem = deepest_directory(root, target)
        if problem is None and ancestor == target:
            problem = f"{target} is a {'file' if wanted_dir else 'directory'} in the image"
        if problem:
            raise AllocstackError("prerequisite", f"{missing} ({problem}): {fix}")
        if ancestor == "/":
            raise AllocstackError("prerequisite", f"{missing}, and cannot make one at its top level: {fix}")
        other = image_directories(root / ancestor.lstrip("/"), stop_at_other=True)[1]
        if other is not None:
            held = "/" + str(other.relative_to(root))
            raise AllocstackError("prerequisite", f"{missing}, and a private {ancestor} would hide what the image "
                                                  f"keeps there ({held}): {fix}")
        private[ancestor] = private_dir(root, ancestor)
    return [entry for path, entry in sorted(private.items())
            if not within(path, [other for other in private if other != path])]


def private_dir(image: Path, path: str) -> PrivateDir:
    """The image's directory ``path`` as a private directory: its permission bits and the directories below it."""
    inside = image / path.lstrip("/")
    return PrivateDir(path, stat.S_IMODE(inside.lstat().st_mode), tuple(image_directories(inside)[0]))


def make_mount_points(tree: Path, private: list[PrivateDir], mounts: list[Bind], covered: Iterable[str]) -> None:
    """In ``tree`` (the program's mount-point tree), each private directory with the image's directories there,
    and a mount point for each mount below one of them or below ``covered``: a directory, or an empty file.
    The image's permission bits are given last, once nothing more is made inside, each with the owner's own (the
    user's: allocstack removes the tree with the run's scratch)."""
    modes: dict[Path, int] = {}
    for entry in private:
        base = tree / entry.path.lstrip("/")
        base.mkdir(mode=0o700, parents=True, exist_ok=True)
        modes[base] = entry.mode
        for relative, mode in entry.skeleton:
            (base / relative).mkdir(mode=0o700, parents=True, exist_ok=True)
            modes[base / relative] = mode
    directories = [*covered, *(entry.path for entry in private)]
    for bind in mounts:
        target = os.path.normpath(bind.target)
        if not within(target, directories):
            continue
        point = tree / target.lstrip("/")
        if Path(bind.host).is_dir():
            point.mkdir(mode=0o700, parents=True, exist_ok=True)
        else:
            point.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            point.touch(mode=0o600, exist_ok=True)
    for directory, mode in modes.items():
        directory.chmod(mode | stat.S_IRWXU)


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
