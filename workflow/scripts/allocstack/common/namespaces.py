"""Whether this node lets a user without privileges make user namespaces, and so a network namespace of the stack's own.

A private network per stack (issue 32: what Compose gives every stack) is made as ``unshare --user --net``
makes one. Centers turn that off in the kernel's settings: ``user.max_user_namespaces`` 0, Debian's and
Ubuntu's ``kernel.unprivileged_userns_clone`` 0, or Ubuntu's AppArmor restriction
(``kernel.apparmor_restrict_unprivileged_userns`` 1: the namespace is made, without the capabilities a
network in it needs). The settings are read, never changed.

:func:`unshare_mapped_to_self` makes such a namespace in this process (the stack's network holder, a program's
own names): what ``unshare --user --map-current-user`` does.
"""

from __future__ import annotations

import ctypes
import errno
import os
from collections.abc import Callable

CLONE_NEWNS = 0x00020000
CLONE_NEWNET = 0x40000000
CLONE_NEWUSER = 0x10000000


def _libc() -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None


#: Looked up on import, not in a child: a forked child of a threaded process must not load libraries.
LIBC = _libc()


def checked(result: int, what: str) -> None:
    """A C library call's result: an OSError naming ``what`` and errno's words where it failed."""
    if result != 0:
        error = ctypes.get_errno()
        raise OSError(error, f"{what}: {os.strerror(error)}")


def _write(path: str, text: str) -> None:
    # os.open/os.write, no buffered file: safe in a forked child before exec
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def unshare_mapped_to_self(flags: int) -> None:
    """In this (single-threaded, or forked-before-exec) process: new namespaces ``flags``, in a user namespace
    where this process's uid and gid map to themselves, so every program keeps its identity (``flags`` without
    CLONE_NEWUSER: root's, no user namespace). It keeps its capabilities there until it execs.

    :raises OSError: naming the step that failed.
    """
    if LIBC is None:
        raise OSError(errno.ENOSYS, "no C library to call unshare(2) with")
    uid, gid = os.geteuid(), os.getegid()
    checked(LIBC.unshare(flags), "unshare")
    if flags & CLONE_NEWUSER:
        _write("/proc/self/setgroups", "deny")
        _write("/proc/self/uid_map", f"{uid} {uid} 1")
        _write("/proc/self/gid_map", f"{gid} {gid} 1")

#: The settings, as ``/proc/sys`` paths, by their sysctl names.
SETTINGS = {
    "user.max_user_namespaces": "/proc/sys/user/max_user_namespaces",
    "kernel.unprivileged_userns_clone": "/proc/sys/kernel/unprivileged_userns_clone",
    "kernel.apparmor_restrict_unprivileged_userns": "/proc/sys/kernel/apparmor_restrict_unprivileged_userns",
}
#: A setting's value, by its sysctl name; None where this kernel does not have it.
Read = Callable[[str], "str | None"]


def read_setting(name: str) -> str | None:
    """:data:`Read` of this machine: ``/proc/sys``; None for a setting this kernel lacks (or that cannot be read)."""
    try:
        with open(SETTINGS[name], encoding="ascii") as handle:
            return handle.read().strip()
    except OSError:
        return None


def user_namespaces(read: Read = read_setting, privileged: bool = False) -> tuple[bool, str]:
    """Whether a user without privileges (``privileged``: root) may make user namespaces (with a network in them),
    and why, in the settings' own words (pure, given ``read``). ``user.max_user_namespaces`` 0 stops root too;
    the other two settings only users without privileges."""
    limit = read("user.max_user_namespaces")
    if limit is None:
        return False, "this kernel has no user namespaces (no user.max_user_namespaces)"
    if not limit.isdigit() or int(limit) == 0:
        return False, f"user.max_user_namespaces is {limit}"
    if privileged:
        return True, f"user.max_user_namespaces is {limit}"
    if read("kernel.unprivileged_userns_clone") == "0":
        return False, "kernel.unprivileged_userns_clone is 0"
    if read("kernel.apparmor_restrict_unprivileged_userns") == "1":
        return False, "kernel.apparmor_restrict_unprivileged_userns is 1 (AppArmor denies them a network)"
    return True, f"user.max_user_namespaces is {limit}"


def isolation_fact(host: str, read: Read = read_setting) -> str:
    """The decision record's line: could ``host`` give the stack a network of its own."""
    possible, why = user_namespaces(read)
    if possible:
        return f"possible on {host} ({why}; unprivileged user namespaces allowed)"
    return (f"not possible on {host} ({why}): network.isolation private is refused there, none runs the stack on the "
            "node's own network")
