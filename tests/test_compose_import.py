"""import_compose.py: the seed's Compose file, the mapping's rewrites, and every feature it refuses by name."""

from __future__ import annotations

import copy

import import_compose
import pytest
import yaml

from conftest import ROOT, run_script

SEED = "config/examples/seed"


def test_the_seeds_compose_file_imports_and_names_its_gaps(tmp_path):
    done = run_script("import_compose.py", f"{SEED}/compose.yaml", "--output", tmp_path / "seed.yaml", cwd=ROOT)
    assert done.returncode == 0, done.stderr
    # The seed leaves out the workers' and the check's commands: both named, with the way to supply them.
    gaps = [line for line in done.stdout.splitlines() if line.startswith("gap: ")]
    assert len(gaps) == 2, done.stdout
    assert gaps[0].startswith("gap: worker: no command: the workers (worker.command)")
    assert gaps[1].startswith("gap: verify: no command: the check (verify.command)")
    assert "add `command:` to worker in the Compose file" in gaps[0]
    config = yaml.safe_load((tmp_path / "seed.yaml").read_text())
    assert config["tasks"] is None and config["workers"] == 2 and config["worker"]["mode"] == "long-running"
    assert config["worker"]["command"] is None and config["verify"]["command"] is None
    coordinator = config["services"]["coordinator"]
    assert coordinator["command"][:2] == ["python3", "/opt/bssw/bin/coordinator.py"]  # a path in the seed's image
    assert "/opt/bssw/bin/coordinator.py is inside the image" in done.stdout
    # named volume work -> job-scoped scratch; ./inputs bind -> the directory beside the Compose file
    assert coordinator["command"][3:] == [f"{SEED}/inputs/tasks.json", "--results",
                                          "${ALLOCSTACK_VOLUME_WORK}/results.json", "--endpoint-file",
                                          "${ALLOCSTACK_VOLUME_WORK}/endpoint.json"]
    gate = coordinator["readiness"]
    assert gate["mode"] == "command" and gate["timeout"] == 900  # 30 retries x the default 30 s interval
    assert "open('${ALLOCSTACK_VOLUME_WORK}/endpoint.json')" in gate["command"][2]
    assert config["volumes"] == ["work"] and config["apptainer"]["binds"] == [f"{SEED}/expected", f"{SEED}/inputs"]
    assert config["charliecloud"]["binds"] == config["apptainer"]["binds"]  # whichever runtime the center has
    assert "# GAPS - supply these before running:" in (tmp_path / "seed.yaml").read_text()
    # The gap stops the run with one line naming the key, before anything starts.
    project = tmp_path / "project"
    from workflow_helpers import copy_project, snakemake

    copy_project(project)
    (project / "config/seed.yaml").write_text((tmp_path / "seed.yaml").read_text())
    dry = snakemake(project, "--dry-run", "--configfile", "config/seed.yaml", timeout=120)
    assert dry.returncode != 0
    assert "allocstack: error [config]: worker.mode is long-running but worker.command is not set" in dry.stdout + dry.stderr


def test_the_committed_example_is_the_import_of_the_seed_and_its_override_and_the_import_is_stable(project):
    """config/examples/seed/config.yaml is what the import writes; importing again gives the same bytes."""
    args = (f"{SEED}/compose.yaml", f"{SEED}/compose.override.yaml", "--output", f"{SEED}/config.yaml")
    for _ in range(2):
        done = run_script("import_compose.py", *args, cwd=project)
        assert done.returncode == 0, done.stderr
        assert "0 gap(s)" in done.stdout
        for name in ("config.yaml", "config.decision-record.md"):
            assert (project / SEED / name).read_bytes() == (ROOT / SEED / name).read_bytes(), name


BASE = {
    "services": {
        "db": {"image": "db:1", "command": "db --port 5000", "expose": ["5000"]},
        "worker": {"image": "app:1", "command": ["work"], "deploy": {"replicas": 2}},
        "check": {"image": "app:1", "command": ["check"],
                  "depends_on": {"worker": {"condition": "service_completed_successfully"}}},
    },
}

#: Compose features allocstack refuses: (where, what is added to BASE) -> the start of the message.
REFUSED = {
    "privileged": (("services", "db", "privileged"), True, "services.db.privileged: needs root"),
    "host network": (("services", "db", "network_mode"), "host",
                     "services.db.network_mode: network_mode: host: the service would listen on the node's real"),
    "cap_add": (("services", "db", "cap_add"), ["NET_ADMIN"], "services.db.cap_add: adds Linux capabilities"),
    "devices": (("services", "db", "devices"), ["/dev/fuse"], "services.db.devices: maps host devices"),
    "a second replicated service": (("services", "db", "deploy"), {"replicas": 2},
                                    "services.db.deploy.replicas: a second replicated service"),
    "restart: always": (("services", "db", "restart"), "always", "services.db.restart: 'always' needs a daemon"),
    "deploy.restart_policy": (("services", "db", "deploy"), {"restart_policy": {"condition": "on-failure"}},
                              "services.db.deploy.restart_policy: condition on-failure needs a daemon"),
    "user": (("services", "db", "user"), "999", "services.db.user: switches the user"),
    "a privileged port": (("services", "db", "expose"), ["80"], "services.db: port 80 is privileged"),
    "variable interpolation": (("services", "db", "command"), "db --port ${PORT}",
                               "services.db.command: variable interpolation ${PORT}"),
    "an external volume": (("volumes",), {"data": {"external": True}}, "volumes.data: external"),
    "secrets": (("secrets",), {"key": {"file": "key.txt"}}, "secrets: not imported"),
    "no healthcheck and no port": (("services", "db", "expose"), [], "services.db: has no healthcheck and no port"),
    "GPUs for a service": (("services", "db", "deploy"),
                           {"resources": {"reservations": {"devices": [{"capabilities": ["gpu"], "count": 1}]}}},
                           "services.db: asks for GPUs: only the workers get GPUs"),
    "a second check": (("services", "db", "depends_on"), {"worker": {"condition": "service_completed_successfully"}},
                       "services.db.depends_on: a second service waits for another to complete"),
    "placement": (("services", "db", "deploy"), {"placement": {"constraints": ["node.role==manager"]}},
                  "services.db.deploy.placement: placement constraints"),
    "extra_hosts": (("services", "db", "extra_hosts"), ["db2:10.0.0.2"], "services.db.extra_hosts: edits /etc/hosts"),
    "an environment value from the shell": (("services", "db", "environment"), ["TOKEN"],
                                            "services.db.environment.TOKEN: has no value"),
    "a UDP port": (("services", "db", "ports"), ["5000/udp"], "services.db.ports[0]: '5000/udp': only single TCP"),
    "working_dir": (("services", "db", "working_dir"), "/srv", "services.db.working_dir: not imported"),
    "depends_on restart": (("services", "worker", "depends_on"), {"db": {"condition": "service_healthy", "restart": True}},
                           "services.worker.depends_on.db.restart: restarts this service when db restarts"),
    "an external network": (("networks",), {"shared": {"external": True}}, "networks.shared: external"),
    "a dependency cycle": (("services", "db", "depends_on"), ["cache"], "services: depends_on has a cycle: "),
    "a key allocstack does not know": (("services", "db", "frobnicate"), 1,
                                       "services.db.frobnicate: not a Compose service key allocstack knows"),
}


def write_compose(tmp_path, document) -> str:
    path = tmp_path / "compose.yaml"
    path.write_text(yaml.safe_dump(document))
    return str(path)


@pytest.mark.parametrize("feature", sorted(REFUSED))
def test_a_feature_that_cannot_map_is_refused_by_name(tmp_path, capsys, feature):
    where, value, message = REFUSED[feature]
    document = copy.deepcopy(BASE)
    if feature == "a dependency cycle":
        document["services"]["cache"] = {"image": "c:1", "command": "cache", "expose": ["6000"], "depends_on": ["db"]}
    if feature == "an external volume":
        document["services"]["db"]["volumes"] = ["data:/data"]
    target = document
    for key in where[:-1]:
        target = target.setdefault(key, {})
    target[where[-1]] = value
    output = tmp_path / "stack.yaml"
    code = import_compose.main([write_compose(tmp_path, document), "--output", str(output),
                                "--project-dir", str(tmp_path)])
    lines = capsys.readouterr().err.splitlines()
    assert code == 65 and not output.exists()  # nothing written
    assert any(line.startswith("allocstack: error [compose]: ") and f": {message}" in line for line in lines), lines


def test_what_has_no_effect_here_is_named_never_dropped(tmp_path, capsys):
    document = copy.deepcopy(BASE)
    document["services"]["db"].update(container_name="db-1", labels={"a": "b"}, mem_limit="1g")
    code = import_compose.main([write_compose(tmp_path, document), "--output", str(tmp_path / "s.yaml"),
                                "--project-dir", str(tmp_path)])
    out = capsys.readouterr().out
    assert code == 0
    for key in ("container_name", "labels", "mem_limit"):
        assert f"note: db: {key} ignored: " in out


def test_names_and_mounts_are_rewritten_where_they_are_hostnames_and_paths_only(tmp_path, capsys):
    document = copy.deepcopy(BASE)
    (tmp_path / "data").mkdir()
    listen_everywhere = "0.0.0.0"  # noqa: S104 (what a Compose service listens on, and the import rewrites)
    document["services"]["db"].update(command=["db", "--bind", listen_everywhere, "--dir", "/var/db", "--peer", "cache:6000"],
                                      volumes=["./data:/var/db", "scratch:/work"])
    document["services"]["cache"] = {"image": "c:1", "command": "cache", "expose": ["6000"]}
    document["services"]["worker"].update(
        volumes=["scratch:/work"],
        environment={"DB_URL": "http://db:5000/x", "DB_HOST": "db", "FILE": "/work/db/out", "OTHER": "/workspace",
                     "PATH_WITH_NAME": "/srv/db/file"})
    document["volumes"] = {"scratch": {}}
    output = tmp_path / "s.yaml"
    assert import_compose.main([write_compose(tmp_path, document), "--output", str(output),
                                "--project-dir", str(tmp_path)]) == 0, capsys.readouterr().err
    config = yaml.safe_load(output.read_text())
    db = config["services"]["db"]
    assert db["command"] == ["db", "--bind", "${ALLOCSTACK_DB_HOST}", "--dir", "data", "--peer",
                             "${ALLOCSTACK_CACHE_HOST}:6000"]
    assert db["depends_on"] == ["cache"]  # it names cache as a hostname: it starts after cache's gate
    assert db["port"] == 5000 and db["readiness"] == {"mode": "tcp"}
    assert config["worker"]["environment"] == {
        "DB_URL": "http://${ALLOCSTACK_DB_HOST}:5000/x", "DB_HOST": "${ALLOCSTACK_DB_HOST}",
        "FILE": "${ALLOCSTACK_VOLUME_SCRATCH}/db/out", "OTHER": "/workspace", "PATH_WITH_NAME": "/srv/db/file"}
    assert config["volumes"] == ["scratch"] and config["apptainer"]["binds"] == ["data"]
