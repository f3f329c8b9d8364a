"""The plan of a stack's private network (config ``network.isolation: private``): who is refused, and what each
component's command is (the job stack_network on the host, every other component entered into its namespace).
The real namespace, its probes and its way out: tests/test_private_network.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from allocstack.launch.portsockets import SUN_PATH, socket_path
from allocstack.launch.stacknet import Held, join_prefix, pasta_argv

from .plans import plan_of, refusal

PRIVATE = "network: {isolation: private}\n"
#: A node that lets users make user namespaces, with pasta on PATH.
ABLE = {"sysctl": {"user.max_user_namespaces": "96553"}.get, "which": {"pasta": "/usr/bin/pasta"}.get}


@pytest.mark.parametrize("config, facts, words", [
    ("nodes: 3\nworkers: 3", ABLE, ("network.isolation is private with nodes 3: a private network across nodes is not "
                                   "built yet; set nodes: 1, or network.isolation: none")),
    ("", {**ABLE, "sysctl": {"user.max_user_namespaces": "0"}.get, "hostname": "node07"},
     ("network.isolation is private but node07 does not let users make user namespaces (user.max_user_namespaces "
     "is 0): set network.isolation: none")),
    ("", {**ABLE, "sysctl": {"user.max_user_namespaces": "100", "kernel.unprivileged_userns_clone": "0"}.get},
     "(kernel.unprivileged_userns_clone is 0)"),
    ("", {**ABLE, "which": lambda program: None},
     "network.isolation is private but pasta is not on PATH (Debian and Ubuntu: package passt"),
])
def test_a_private_network_this_node_or_this_plan_cannot_have_is_one_line(config, facts, words):
    refused = refusal(PRIVATE + config, **facts)
    assert refused.diag == "config"
    assert words in refused.message, refused.message


def test_root_needs_no_user_namespaces_of_users():
    plan = plan_of(PRIVATE, **{**ABLE, "sysctl": {"user.max_user_namespaces": "0"}.get, "user": "root"})
    assert plan.private_network


def test_every_component_but_the_network_itself_is_entered_into_it():
    plan = plan_of(PRIVATE, **ABLE)
    for component, wildcards in (("coordinator", {}), ("readiness", {}), ("worker", {"worker": "worker-01"})):
        assert "--network-namespace" in plan.launch(component, run="baseline", **wildcards), component
    holder = plan.launch("network", run="baseline")
    assert "--network-namespace" not in holder and "--image" not in " ".join(holder)
    assert plan.args("network", run="baseline") == ["--pasta=/usr/bin/pasta", "--publish=coordinator"]
    assert plan.stack_network("baseline") == ["results/baseline/stack-network.service"]


def test_with_isolation_none_nothing_changes():
    plan = plan_of("", **ABLE)
    assert not plan.private_network and plan.stack_network("baseline") == []
    assert "--network-namespace" not in plan.launch("coordinator", run="baseline")


def test_a_component_joins_the_user_namespace_unless_it_is_root_and_pasta_forwards_nothing():
    assert join_prefix(Held(41, 7, user=True)) == ["nsenter", "--target=41", "--user", "--preserve-credentials",
                                                   "--net", "--"]
    assert join_prefix(Held(41, 7, user=False)) == ["nsenter", "--target=41", "--net", "--"]
    argv = pasta_argv("/usr/bin/pasta", 41, 1000, "/s/pasta.pid")
    for option in ("--tcp-ports", "--udp-ports", "--tcp-ns", "--udp-ns"):
        assert argv[argv.index(option) + 1] == "none", option  # pasta's default, auto, would publish every port
    assert "--runas" not in argv and pasta_argv("pasta", 41, 0, "p")[4:6] == ["--runas", "0"]


def test_a_published_socket_lives_in_scratch_unless_its_path_is_too_long_for_a_socket():
    short = Path("/scratch/allocstack-1000/run.abc")
    assert socket_path(short, "web") == short / "ports" / "web.sock"
    long = Path("/lustre/projects/a-very-long-project-name/users/someone/allocstack-1000/" + "r" * 40)
    moved = socket_path(long, "web")
    assert moved.parent.parent == Path("/tmp") and moved.name == "web.sock" and len(str(moved)) <= SUN_PATH
    assert socket_path(long, "web") == moved != socket_path(long.with_name("other"), "web")  # one a run
