"""What the decision record says about the run beside its five decisions, and the one line of a dry run."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..common import names
from .layout import Layout

#: The five decisions (config ``decisions``), as a dry run names them.
DECISIONS = {
    "allocation": "allocation",
    "startup_order": "startup order",
    "runtime_state": "runtime state",
    "service_access": "access",
    "accelerators": "accelerators",
}


def summary(config: Mapping[str, Any]) -> str:
    """One line for --dry-run: who owns each of the five things."""
    mode = ("mode: serve (your services until the time limit, scancel, Ctrl-C or main; no workers, no check); "
            if config["mode"] == "serve" else "")
    return mode + "decisions: " + "; ".join(f"{label}: {config['decisions'][key]['owner']}"
                                            for key, label in DECISIONS.items())


def facts(config: Mapping[str, Any], layout: Layout, order: Sequence[str], image: str | None, runtime: str | None,
          in_slurm: bool, image_written: str | None) -> dict[str, str]:
    """The run's settings that the decision record lists under its table, each as words (never Python's
    ``None`` or ``True``).

    :param order: the services in their start order.
    :param image: the image components run in (None: none), ``runtime`` its container runtime.
    :param image_written: config ``image`` as written (``auto``, a path, None): why there is none.
    :param in_slurm: the stack runs in a Slurm allocation (submitted by the profile, or Snakemake runs in one).
    """
    builtin = bool(config["tasks"])
    listed: dict[str, Any] = {
        "image": image if image is not None else f"none ({no_image(image_written, config['runtime'])})",
        "container runtime": runtime or "none",
        "scratch": config["scratch"] or "$SLURM_TMPDIR, else $TMPDIR",
        "state_dir": config["state_dir"],
        "job steps": (("yes: each component its own Slurm job step" if config["slurm"]["job_steps"] else
                       "no (slurm.job_steps: false)") if in_slurm else "not in Slurm: processes on this machine"),
        "mode": ("serve: your services run until the allocation's time limit, scancel, Ctrl-C or main's end; an end "
                 "after every gate passed (up) is a success" if config["mode"] == "serve" else
                 "batch: the stack ends when its work ends, then it is verified"),
        "built-in coordinator": "yes" if builtin else "no (tasks: null: your own stack)",
        "workers": f"{config['workers']} ({config['worker']['mode']})" if config["mode"] != "serve" else "none",
        "nodes": config["nodes"],
        "services": ", ".join(order) or "none",
        **({"init jobs (run once, before what depends on them)": ", ".join(config["init_jobs"])}
           if config["init_jobs"] else {}),
        "volumes": ", ".join(config["volumes"]) or "none",
    }
    if config["network"]["isolation"] == "private":
        listed["your programs' network"] = (
            "the stack's own (network.isolation: private): every component runs in a user and network namespace "
            "of the stack's, pasta its way out with no port forwarded in; what a program listens on, 0.0.0.0 "
            "included, is reachable by the stack alone")
    elif order or config["main"] or config["worker"]["mode"] == "long-running":
        listed["your programs' network"] = (
            "the node's own: what a service, long-running worker or main program of yours listens on beyond "
            "loopback (0.0.0.0, ::, the node's address) is reachable by the node's other users and by other nodes; "
            "allocstack names each one it sees (a warning in its log, in the end-of-run summary and below in this "
            "record, event listening-exposed)")
    if config["nodes"] > 1:
        interface = config["network"]["interface"]
        listed["bind address (network.interface)"] = (
            f"the IPv4 address of interface {interface} on the first node" if interface
            else "the address the first node's hostname resolves to")
        listed["off-node encryption (network.tls)"] = (
            "TLS, certificate made at start for this run, clients pin its SHA-256 fingerprint" if config["network"]["tls"]
            else "NONE: plain text with the bearer token only (network.tls: false)")
        if config["services"]:
            listed["your services across nodes"] = (
                "on the first node's loopback, relayed to the other nodes over TLS with their own per-run "
                "certificates, pinned (allocstack/launch/tunnel.py)")
        per_node = [name for name, spec in config["services"].items() if spec["mode"] == "global"]
        if per_node:
            listed["one instance per node (mode: global)"] = (
                f"{', '.join(per_node)}: each node's programs use their node's instance on its loopback")
        listed["how other nodes get the endpoint and token"] = (
            f"{layout.shared_endpoint} (and {names.SERVICES}/NAME.json), mode 0600 in a 0700 directory on the "
            "filesystem the nodes share; never in the environment, a command line or a Slurm RPC (not encrypted by "
            "Slurm)")
    return {name: words(value) for name, value in listed.items()}


def words(value: Any) -> str:
    """A fact as the record writes it: ``none``, ``yes``/``no``, or the value's text."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value)


def no_image(written: str | None, runtime: str) -> str:
    """Why a run has no image, in the words of its config (``image`` as written, ``runtime``)."""
    if written is None:
        return "image: null"
    if runtime == "apptainer":
        return "no --sdm apptainer: the Slurm profile sets it"
    return "image: auto is Apptainer's; give charliecloud an image"
