"""The plan of a stack's private network (config ``network.isolation: private``): who is refused, and what each
component's command is (the job stack_network on the host, every other component entered into its namespace).
The real namespace, its probes and its way out: tests/test_private_network.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from allocstack.common.endpoint import write_endpoint
from allocstack.launch.portsockets import SUN_PATH, socket_path, target
from allocstack.launch.stacknet import Held, default_route_interface, join_prefix, pasta_argv

from .plans import plan_of, refusal

PRIVATE = "network: {isolation: private}\n"
#: The node's own network (a center without user namespaces; the default is private).
NONE = "network: {isolation: none}\n"
#: A node that lets users make user namespaces, with pasta on PATH.
ABLE = {"sysctl": {"user.max_user_namespaces": "96553"}.get, "which": {"pasta": "/usr/bin/pasta"}.get}


@pytest.mark.parametrize("config, facts, words", [
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


def test_root_is_stopped_by_no_switch_but_the_limit_of_user_namespaces():
    """Debian's and AppArmor's switches are for users without privileges; user.max_user_namespaces 0 stops root's
    unshare(CLONE_NEWUSER) too (ENOSPC), as the stack's network holder makes one."""
    users_off = {"user.max_user_namespaces": "100", "kernel.unprivileged_userns_clone": "0",
                 "kernel.apparmor_restrict_unprivileged_userns": "1"}
    assert plan_of(PRIVATE, **{**ABLE, "sysctl": users_off.get, "user": "root"}).private_network
    refused = refusal(PRIVATE, **{**ABLE, "sysctl": {"user.max_user_namespaces": "0"}.get, "user": "root"})
    assert "(user.max_user_namespaces is 0): set network.isolation: none" in refused.message, refused.message


def test_every_component_but_the_network_itself_is_entered_into_it():
    plan = plan_of(PRIVATE, **ABLE)
    for component, wildcards in (("coordinator", {}), ("readiness", {}), ("worker", {"worker": "worker-01"})):
        assert "--network-namespace" in plan.launch(component, run="baseline", **wildcards), component
    holder = plan.launch("network", run="baseline")
    assert "--network-namespace" not in holder and "--image" not in " ".join(holder)
    assert plan.args("network", run="baseline") == ["--pasta=/usr/bin/pasta", "--publish=coordinator"]
    assert plan.stack_network("baseline") == ["results/baseline/stack-network.service"]


def test_with_isolation_none_nothing_changes():
    plan = plan_of(NONE, **ABLE)
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


def test_a_published_socket_carries_to_where_its_service_listens_now(tmp_path):
    """portsockets.target reads the address from the endpoint the service published (IPv6 too), None before it."""
    assert target(tmp_path, "web") is None
    (tmp_path / "services").mkdir()
    write_endpoint(tmp_path / "services/web.json", "http://127.0.0.1:8080", "t", "v")
    assert target(tmp_path, "web") == ("127.0.0.1", 8080)
    write_endpoint(tmp_path / "endpoint.json", "http://[::1]:9091/", "t", "v")
    assert target(tmp_path, "coordinator") == ("::1", 9091)


def test_across_nodes_each_node_has_its_own_network_and_the_first_forwards_in_only_what_the_others_use():
    """nodes: 3 with a service: a holder on each node (the first node's job stack_network, node N's node_network on
    node N), every job consuming its own node's; the first node's pasta forwards in only the coordinator's listener
    and the service's relay (the status page and the service reach their owner as sockets)."""
    plan = plan_of("nodes: 3\nworkers: 6\nnetwork: {isolation: private, interface: ib0}\n"
                   "services: {kv: {command: [kv]}}\n", environ={"SLURM_JOB_ID": "1"}, **ABLE)
    assert plan.stack_network("r", plan.node_of({"node": "2"})) == ["results/r/network/node-2.service"]
    assert plan.stack_network("r", plan.node_of({"worker": "worker-06"})) == ["results/r/network/node-3.service"]
    assert plan.stack_network("r", plan.node_of({"service": "kv"})) == ["results/r/stack-network.service"]
    first = plan.args("network", run="r")
    assert [arg for arg in first if arg.startswith("--inbound=")] == ["--inbound=coordinator", "--inbound=kv"]
    assert [arg for arg in first if arg.startswith("--publish=")] == ["--publish=coordinator", "--publish=kv"]
    assert "--interface=ib0" in first
    other = plan.args("network", run="r", node="3")
    assert not [arg for arg in other if arg.startswith(("--inbound=", "--publish="))] and "--interface=ib0" in other
    assert "--forward=kv" in other and "--published=state/r/services" in other  # kv on its own port on node 3 too
    holder = plan.launch("network", run="r", node="3")
    assert "--component=stack-network-node-3" in holder and "--node-index=2" in holder
    assert "--network-namespace" not in holder


#: /proc/net/route of a node with a default route, and of a compute node with its cluster network alone.
ROUTED = ("Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n"
          "eth0\t00000000\t0100FE0A\t0003\t0\t0\t0\t00000000\t0\t0\t0\n"
          "eth0\t0001FE0A\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0\n")
UNROUTED = ROUTED.split("\n")[0] + "\n" + ROUTED.split("\n")[2] + "\n"


def test_on_a_node_without_a_default_route_pasta_is_given_the_interface_and_a_gateway():
    """pasta copies the interface of the default route; a compute node without one (the test cluster's namespaced
    nodes) gets the interface that holds the node's address, and that address as the gateway."""
    assert default_route_interface(ROUTED) == "eth0" and default_route_interface(UNROUTED) is None
    argv = pasta_argv("pasta", 41, 0, "p", ("eth0", "10.254.1.12"))
    assert argv[argv.index("--interface") + 1] == "eth0" and argv[argv.index("--gateway") + 1] == "10.254.1.12"
    assert "--gateway" not in pasta_argv("pasta", 41, 0, "p")


def test_a_stack_without_services_runs_as_one_group_in_its_private_network():
    """The network is a service job every component consumes: your workers and check run in its group, where a record
    made inside it is no input of another job there (Snakemake would look for it before that job starts): the check
    and whatever waits for an init job wait for the records themselves."""
    own = ("tasks: null\nexpected: null\nworker: {mode: long-running, command: [w]}\nverify: {command: [c]}\n"
           "init_jobs: [setup]\nservices: {setup: {command: [s]}}\n")
    private, shared = plan_of(own + PRIVATE, **ABLE), plan_of(own + NONE, **ABLE)
    assert private.in_group and not shared.in_group
    assert private.check_inputs("r") == [] and private.init_inputs("r") == []
    assert private.service_dependencies("r", "setup") == [] and private.stack_network("r")  # the network holds it
    assert shared.check_inputs("r") == shared.worker_records("r")
    assert shared.init_inputs("r") == [shared.files("r").init_record("setup")]
    waits = [arg for arg in private.args("check", run="r") if arg.startswith("--wait-for=")]
    assert waits == [f"--wait-for={record}" for record in private.worker_record_files("r")]


def test_verification_after_collection_runs_on_the_nodes_network_the_stack_s_has_ended():
    """verify.command with the built-in coordinator and volumes runs after collect_results, when the stack's
    network is gone: it reads the volumes, and is not entered into a namespace that no longer exists."""
    plan = plan_of(PRIVATE + "volumes: [cache]\nverify: {command: [python3, c.py]}\n", **ABLE)
    assert plan.volumes_after_collect
    verify = plan.launch("verify", run="baseline")
    assert "--no-scratch" not in verify and "--network-namespace" not in verify


def test_open_stack_starts_with_every_service_the_stack_s_group_has():
    """rule open_stack consumes every service file of the stack (its network's, the coordinator's, your services' and
    their replicas'), so Snakemake starts it inside the stack's group, where it ends at once and gives back the thread
    the group's runner holds (workflow/scripts/stack_job.py); a stack that is no group needs nothing of it."""
    own = ("tasks: null\nexpected: null\nworker: {mode: long-running, command: [w]}\nverify: {command: [c]}\n"
           "services: {db: {command: [d]}, cache: {command: [k], replicas: 2, readiness: {mode: started}}}\n")
    plan, files = plan_of(own + PRIVATE, **ABLE), plan_of(own + PRIVATE, **ABLE).files("r")
    assert plan.stack_services("r") == [files.stack_network, files.service_file("db"), files.service_file("cache"),
                                        files.replica_file("cache", 2)]
    builtin = plan_of(NONE, **ABLE)
    assert builtin.stack_services("r") == [builtin.files("r").coordinator_service]
    bare = plan_of("tasks: null\nexpected: null\nworker: {mode: long-running, command: [w]}\n"
                   "verify: {command: [c]}\n" + NONE, **ABLE)
    assert not bare.in_group and bare.stack_services("r") == []


def test_the_stack_job_record_names_the_slurm_node_where_there_is_one():
    from stack_job import stack_job  # workflow/scripts is on sys.path (tests/unit/plans.py)

    inside = stack_job({"SLURMD_NODENAME": "node07", "SLURM_JOB_ID": "42"}, 2, "node07.cluster", 5.0)
    assert (inside["node"], inside["slurmJob"], inside["cpusSeen"], inside["startedAt"]) == ("node07", "42", 2, 5.0)
    here = stack_job({}, 4, "laptop", 1.0)
    assert (here["node"], here["slurmJob"]) == ("laptop", None)
