"""Without an image, the nearest thing to a container's ``/etc/hosts``: a mount namespace of the program's own
in which the stack's hosts file (:mod:`allocstack.launch.hostsfile`) is bound over ``/etc/hosts``.

Done in the program's process between fork and exec (:func:`entering`, a ``preexec_fn``), so the program keeps
its pid, its parent and its signals, and nothing else on the node sees the bind:

* as root: ``unshare(CLONE_NEWNS)``, ``/`` made a slave of the node's mounts (mounts made later on the node
  still appear, none of the program's leave), then the bind;
* as a user: the same in a user namespace that maps the user's own uid and gid to themselves (as
  ``unshare --user --map-current-user`` does), where the kernel allows unprivileged user namespaces
  (:func:`allocstack.common.namespaces.user_namespaces`); inside it other users' files show as ``nobody``;
* otherwise (:func:`mode` is None): nothing; the import's rewriting of service names in commands and
  environment values still works, and the program's log says once why names in its files do not resolve.

The parent-death signal (:func:`allocstack.launch.supervise.die_with_parent`) is set after the namespace is
entered: a change of credentials (a user namespace) clears it.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from ..common.namespaces import CLONE_NEWNS, CLONE_NEWUSER, LIBC, checked, unshare_mapped_to_self, user_namespaces

MS_BIND = 4096
MS_REC = 16384
MS_SLAVE = 1 << 19
#: Where the hosts file is bound.
ETC_HOSTS = b"/etc/hosts"


def mode(euid: int | None = None, allowed: tuple[bool, str] | None = None) -> tuple[str | None, str]:
    """How a program without an image gets the stack's names here: ``"mount"`` (root: a mount namespace),
    ``"user"`` (a user and mount namespace) or None, and why (pure, given ``euid`` and ``allowed``)."""
    euid = os.geteuid() if euid is None else euid
    if euid == 0:
        return "mount", "as root: a mount namespace of its own"
    possible, why = user_namespaces() if allowed is None else allowed
    if possible:
        return "user", f"a user and mount namespace of its own ({why})"
    return None, (f"no namespace of its own ({why}): service names in its files do not resolve; names in its command "
                  "and environment do where the import rewrote them")


def names_fact(host: str, in_images: bool, how: tuple[str | None, str]) -> str:
    """The decision record's line: whether the stack's service names resolve in its programs' files, and how
    (pure; ``how`` is :func:`mode` on ``host``)."""
    if in_images:
        return ("resolve in every program as in Compose: the stack's hosts file (SCRATCH/hosts: each service's name, "
                "hostname and aliases at 127.0.0.1) bound at /etc/hosts in each image")
    way, why = how
    if way is None:
        return (f"do NOT resolve in your programs' files on {host}: {why}; the import's rewriting of names in "
                "commands and environment values still works")
    return (f"resolve in every program as in Compose: the stack's hosts file (SCRATCH/hosts) bound at /etc/hosts in "
            f"{why} (read on {host})")


def enter(hosts: Path, how: str) -> None:
    """In the child, before exec: a mount namespace (``how`` ``"user"``: in a user namespace of the same ids) in
    which ``hosts`` is bound over /etc/hosts.

    :raises OSError: when a step fails (the child then stays in whatever it entered).
    """
    unshare_mapped_to_self(CLONE_NEWNS | (CLONE_NEWUSER if how == "user" else 0))
    checked(LIBC.mount(b"none", b"/", None, MS_REC | MS_SLAVE, None), "making / a slave mount")
    checked(LIBC.mount(os.fsencode(hosts), ETC_HOSTS, None, MS_BIND, None), "binding the hosts file at /etc/hosts")


def entering(hosts: Path | None, how: str | None, then: Callable[[], None]) -> Callable[[], None]:
    """A ``preexec_fn``: :func:`enter` (when there is a hosts file and a way), then ``then`` (the parent-death
    signal). A failure is said on the program's stderr, and the program starts without the names."""
    if hosts is None or how is None:
        return then

    def preexec() -> None:
        try:
            enter(hosts, how)
        except OSError as exc:
            os.write(2, f"allocstack: the stack's names are not bound at /etc/hosts ({exc.strerror})\n".encode())
        then()

    return preexec
