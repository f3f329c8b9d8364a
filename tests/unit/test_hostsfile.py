"""The stack's hosts file (allocstack/launch/hostsfile.py): its content from the services' names and the node's own
/etc/hosts (pure), written once; the launcher's options for it (plan/argv.py); how a program without an image
gets it (privatenames.mode). Bound and resolved for real in tests/test_stack_names.py."""

from __future__ import annotations

import pytest

from allocstack.launch import hostsfile, privatenames
from allocstack.launch.containers import container_prefix, hosts_binds
from allocstack.plan import argv

from .plans import plan_of

NODE = "127.0.0.1 localhost\n10.0.0.7 node07.cluster node07 # this node\n10.0.0.9 redis lic-server\n\n# a comment\n"


def test_every_service_name_and_alias_is_at_loopback_before_the_nodes_own_lines():
    text = hostsfile.hosts_text({"redis": ["cache"], "db": ["postgres", "database"]}, NODE)
    lines = [line for line in text.splitlines() if not line.startswith("#")]
    assert lines[:3] == ["127.0.0.1\tlocalhost", "127.0.0.1\tredis cache", "127.0.0.1\tdb postgres database"]
    assert "::1\tlocalhost ip6-localhost ip6-loopback" in lines
    # the node's own lines follow (its hostname line as the node has it), comments dropped
    assert "10.0.0.7\tnode07.cluster node07" in lines and "127.0.0.1\tlocalhost" in lines[4:]
    # a stack's name is answered by the stack alone: the node's other meaning of `redis` is dropped, its line kept
    assert "10.0.0.9\tlic-server" in lines and not any(line.startswith("10.0.0.9") and "redis" in line
                                                        for line in lines)


def test_a_name_is_listed_once_whichever_service_names_it_first():
    text = hostsfile.hosts_text({"a": ["shared", "A"], "b": ["Shared", "b2"]}, "")
    assert "127.0.0.1\ta shared\n" in text and "127.0.0.1\tb b2\n" in text


@pytest.mark.parametrize("bad", ["bad name", "-x", "a:b", ""])
def test_a_name_a_hosts_file_cannot_hold_is_refused_naming_it(bad):
    with pytest.raises(ValueError, match="cannot be a hostname"):
        hostsfile.hosts_text({"svc": [bad]}, "")


def test_it_is_written_once_and_whole(tmp_path):
    path = tmp_path / "hosts"
    assert hostsfile.write_once(path, "first\n")
    assert not hostsfile.write_once(path, "second\n")
    assert path.read_text() == "first\n" and [p.name for p in tmp_path.iterdir()] == ["hosts"]
    assert hostsfile.existing_hosts(tmp_path) == path and hostsfile.existing_hosts(None) is None


def test_the_launchers_options_carry_each_service_and_its_names():
    plan = plan_of("tasks: null\nexpected: null\nworker: {mode: long-running, command: [w]}\nverify: {command: [c]}\n"
                   "services: {kv: {command: [kv], hostnames: [keyvalue, queue]}, db: {command: [db]}}\n")
    assert argv.hosts_names(plan) == ["kv=keyvalue,queue", "db="]
    assert hostsfile.parse_names(argv.hosts_names(plan)) == {"kv": ["keyvalue", "queue"], "db": []}
    launched = argv.launch(plan, "service", "run", service="kv")
    assert "--hosts-name=kv=keyvalue,queue" in launched and "--hosts-name=db=" in launched


def test_it_is_bound_at_etc_hosts_in_either_runtime(tmp_path):
    hosts = tmp_path / "hosts"
    assert hosts_binds("apptainer", hosts) == ["--bind", f"{hosts}:/etc/hosts:ro"]
    assert hosts_binds("charliecloud", hosts) == [f"--bind={hosts}:/etc/hosts"]
    assert hosts_binds("apptainer", None) == []
    prefix = container_prefix("apptainer", "img.sif", [], [], {}, "/", None, hosts)
    assert prefix[-3:] == ["--bind", f"{hosts}:/etc/hosts:ro", "img.sif"]


def test_without_an_image_root_gets_a_mount_namespace_a_user_one_where_the_kernel_allows_it():
    assert privatenames.mode(0, (False, "x"))[0] == "mount"
    assert privatenames.mode(1000, (True, "user.max_user_namespaces is 96362"))[0] == "user"
    how, why = privatenames.mode(1000, (False, "user.max_user_namespaces is 0"))
    assert how is None and "user.max_user_namespaces is 0" in why and "do not resolve" in why
