"""Whether this node lets a user without privileges make user namespaces, and so a network namespace of the stack's own.

A private network per stack (issue 32: what Compose gives every stack) is made as ``unshare --user --net``
makes one. Centers turn that off in the kernel's settings: ``user.max_user_namespaces`` 0, Debian's and
Ubuntu's ``kernel.unprivileged_userns_clone`` 0, or Ubuntu's AppArmor restriction
(``kernel.apparmor_restrict_unprivileged_userns`` 1: the namespace is made, without the capabilities a
network in it needs). The settings are read, never changed.
"""

from __future__ import annotations

from collections.abc import Callable

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


def user_namespaces(read: Read = read_setting) -> tuple[bool, str]:
    """Whether a user without privileges may make user namespaces (with a network in them), and why, in the
    settings' own words (pure, given ``read``)."""
    limit = read("user.max_user_namespaces")
    if limit is None:
        return False, "this kernel has no user namespaces (no user.max_user_namespaces)"
    if not limit.isdigit() or int(limit) == 0:
        return False, f"user.max_user_namespaces is {limit}"
    if read("kernel.unprivileged_userns_clone") == "0":
        return False, "kernel.unprivileged_userns_clone is 0"
    if read("kernel.apparmor_restrict_unprivileged_userns") == "1":
        return False, "kernel.apparmor_restrict_unprivileged_userns is 1 (AppArmor denies them a network)"
    return True, f"user.max_user_namespaces is {limit}"


def isolation_fact(host: str, read: Read = read_setting) -> str:
    """The decision record's line: could ``host`` give the stack a network of its own."""
    possible, why = user_namespaces(read)
    if possible:
        return (f"possible on {host} ({why}; unprivileged user namespaces allowed), not made yet: the stack runs on "
                "the node's own network")
    return f"not possible on {host} ({why}): the stack runs on the node's own network"
