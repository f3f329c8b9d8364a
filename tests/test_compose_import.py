"""import_compose.py: the seed's Compose file; each row of the mapping (images per service, mounts at their container
paths, the image's own command, working_dir, interpolation and its sources, secrets from the environment, secrets
and configs, !reset/!override, hostnames, ports, EXPOSE); every feature it refuses by name; the config it writes
passes the workflow's schema first."""

from __future__ import annotations

import copy
import json
import os

import import_compose
import pytest
import yaml

from conftest import ROOT, run_script

SEED = "config/examples/seed"


def test_the_seeds_compose_file_imports_as_written(tmp_path):
    """The seed's workers and check have no command: in their image they run its own; the paths stay the
    container's (mounts), one image for the one build context; a run without the image stops with one line."""
    done = run_script("import_compose.py", f"{SEED}/compose.yaml", "--output", tmp_path / "seed.yaml", cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert "0 gap(s)" in done.stdout
    assert "note: worker: no command: in its image it runs the image's own (ENTRYPOINT + CMD" in done.stdout
    assert "to get: build: . (coordinator, worker, verify) -> images/seed.sif:" in done.stdout
    config = yaml.safe_load((tmp_path / "seed.yaml").read_text())
    assert config["tasks"] is None and config["workers"] == 2 and config["worker"]["mode"] == "long-running"
    assert config["worker"]["command"] is None and config["verify"]["command"] is None
    assert config["worker"]["image"] == config["verify"]["image"] == "images/seed.sif"
    coordinator = config["services"]["coordinator"]
    assert coordinator["image"] == "images/seed.sif"
    assert coordinator["command"] == ["python3", "/opt/bssw/bin/coordinator.py", "--input", "/in/tasks.json",
                                      "--results", "/work/results.json", "--endpoint-file", "/work/endpoint.json"]
    assert "/opt/bssw/bin/coordinator.py is inside the image" in done.stdout
    # named volume work at /work, ./inputs at /in (read-only), as the Compose file mounts them
    assert coordinator["mounts"] == [{"target": "/work", "volume": "work"},
                                     {"target": "/in", "source": f"{SEED}/inputs", "read_only": True}]
    gate = coordinator["readiness"]
    assert gate["mode"] == "command" and gate["timeout"] == 900  # 30 retries x the default 30 s interval
    assert "open('/work/endpoint.json')" in gate["command"][2]
    assert config["volumes"] == ["work"]
    # Without the image (no --sdm apptainer) nothing would run the workers: one line, before anything starts.
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

#: Compose features allocstack refuses: (where, what is added to BASE) -> the start of the message, and whether
#: it is one of what cannot run here at all (the corpus counts those apart).
REFUSED = {
    "privileged": (("services", "db", "privileged"), True, "services.db.privileged: needs root", True),
    "host network": (("services", "db", "network_mode"), "host",
                     "services.db.network_mode: host: shares the host's or another container's network", True),
    "cap_add": (("services", "db", "cap_add"), ["NET_ADMIN"], "services.db.cap_add: adds Linux capabilities", True),
    "devices": (("services", "db", "devices"), ["/dev/fuse"], "services.db.devices: maps host devices", True),
    "the docker socket": (("services", "db", "volumes"), ["/var/run/docker.sock:/var/run/docker.sock"],
                          "services.db.volumes[0]: /var/run/docker.sock is a container daemon's socket", True),
    "the podman socket": (("services", "db", "volumes"), [{"type": "bind", "source": "/run/podman/podman.sock",
                                                          "target": "/var/run/docker.sock"}],
                          "services.db.volumes[0]: /run/podman/podman.sock is a container daemon's socket", True),
    "a privileged port": (("services", "db", "expose"), ["80"], "services.db: port 80 is privileged", True),
    "an unset variable": (("services", "db", "command"), "db --port ${PORT}",
                          ("services.db.command: variable PORT is not set (in .env, an --env-file or the environment) "
                           "and has no default"), False),
    "a required variable": (("services", "db", "command"), "db --port ${PORT:?give the port}",
                            "services.db.command: ${PORT} is required but not set: give the port", False),
    "an unclosed ${": (("services", "db", "command"), "db --port ${PORT",
                       "services.db.command: invalid interpolation format '${PORT': no closing '}'", False),
    "an external volume": (("volumes",), {"data": {"external": True}}, "volumes.data: external", False),
    "an external secret": (("secrets",), {"key": {"external": True}}, "secrets.key: external", False),
    "a config from a variable": (("configs",), {"conf": {"environment": "CONF"}}, "configs.conf: environment", False),
    "a secret that is not declared": (("services", "db", "secrets"), ["nope"],
                                      "services.db.secrets[0]: 'nope' is not declared under the top-level secrets",
                                      False),
    "two services on one port": (("services", "cache"), {"image": "c:1", "command": "cache", "expose": ["5000"]},
                                 "services.db: services cache, db all listen on port 5000", False),
    "not an image reference": (("services", "db", "image"), "Db:Latest:1",
                               "services.db.image: 'Db:Latest:1' is not an image reference", False),
    "a second check": (("services", "db", "depends_on"), {"worker": {"condition": "service_completed_successfully"}},
                       ("services.db.depends_on: check, db each wait for the workers (worker) to complete: "
                        "allocstack runs one check"), False),
    "placement": (("services", "db", "deploy"), {"placement": {"constraints": ["node.role==manager"]}},
                  "services.db.deploy.placement: placement constraints", False),
    "a UDP port": (("services", "db", "ports"), ["5000/udp"], "services.db.ports[0]: '5000/udp': only single TCP",
                   False),
    "a relative working_dir": (("services", "db", "working_dir"), "srv",
                               "services.db.working_dir: 'srv' must be an absolute path", False),
    "an external network": (("networks",), {"shared": {"external": True}}, "networks.shared: external", False),
    "a dependency cycle": (("services", "db", "depends_on"), ["cache"], "services: depends_on has a cycle: ", False),
    "GPUs without a count": (("services", "db", "gpus"), [{"count": "some"}],
                             "services.db.gpus: [{'count': 'some'}]: say how many GPUs it needs", False),
    "a key allocstack does not know": (("services", "db", "frobnicate"), 1,
                                       "services.db.frobnicate: not a Compose service key allocstack knows", False),
}


def write_compose(tmp_path, document, name: str = "compose.yaml") -> str:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(document) if not isinstance(document, str) else document)
    return str(path)


def import_document(tmp_path, document, *extra: str, env: dict[str, str] | None = None, monkeypatch=None):
    """import_compose.main on ``document`` in ``tmp_path``: (exit code, the config or None, stdout, stderr lines)."""
    if monkeypatch is not None:
        monkeypatch.setattr(import_compose.os, "environ", {**(env or {})})
    output = tmp_path / "stack.yaml"
    files = [document] if not isinstance(document, list) else document
    paths = [write_compose(tmp_path, item, f"compose{index or ''}.yaml") for index, item in enumerate(files)]
    code = import_compose.main([*paths, "--output", str(output), "--project-dir", str(tmp_path), *extra])
    return code, yaml.safe_load(output.read_text()) if output.exists() else None, output


@pytest.mark.parametrize("feature", sorted(REFUSED))
def test_a_feature_that_cannot_map_is_refused_by_name(tmp_path, capsys, monkeypatch, feature):
    where, value, message, impossible = REFUSED[feature]
    document = copy.deepcopy(BASE)
    if feature == "a dependency cycle":
        document["services"]["cache"] = {"image": "c:1", "command": "cache", "expose": ["6000"], "depends_on": ["db"]}
    if feature == "an external volume":
        document["services"]["db"]["volumes"] = ["data:/data"]
    if feature == "an external secret":
        document["services"]["db"]["secrets"] = ["key"]
    target = document
    for key in where[:-1]:
        target = target.setdefault(key, {})
    target[where[-1]] = value
    code, _, output = import_document(tmp_path, document, env={}, monkeypatch=monkeypatch)
    lines = capsys.readouterr().err.splitlines()
    assert code == 65 and not output.exists()  # nothing written
    refused = [line for line in lines if line.startswith("allocstack: error [compose]: ")]
    assert any(f": {message}" in line for line in refused), lines
    assert len(refused) == len(set(refused)), "one refusal per cause"
    from allocstack.compose.mapping import combine, import_stack
    report = import_stack(combine([document]), tmp_path, tmp_path, "x").report
    assert any(message in line for line in report.impossible) == impossible


#: Compose features that map with a difference, said in a note (never dropped silently) or named as a gap.
SAID = {
    "depends_on restart": (("services", "worker", "depends_on"), {"db": {"condition": "service_healthy",
                                                                         "restart": True}},
                           "note: worker: depends_on db restart: true: not applied"),
    "user": (("services", "db", "user"), "999", "note: db: user ignored: your programs run as you"),
    "extra_hosts": (("services", "db", "extra_hosts"), ["db2:10.0.0.2"], "note: db: extra_hosts ignored"),
    "stop_signal": (("services", "db", "stop_signal"), "SIGINT",
                    "note: db: stop_signal SIGINT: allocstack stops it with SIGTERM"),
    "an environment name without a value, unset": (("services", "db", "environment"), ["TOKEN"],
                                                    "note: db: environment TOKEN has no value and is not set: left out"),
    "all the GPUs": (("services", "db", "gpus"), "all", ("gap: db: asks for all the GPUs (services.db.gpus: all), "
                     "but a Slurm job asks for a number: set services.db.gpus")),
    "all the GPUs for the workers": (("services", "worker", "deploy"), {"replicas": 2, "resources": {"reservations": {
        "devices": [{"capabilities": ["gpu"], "count": "all"}]}}}, "set worker.gpus in the written config"),
    "GPUs for the check": (("services", "check", "gpus"), [{"count": 1}], ("gap: check: asks for GPUs, which the "
                                                                          "check does not get")),
    "container_name": (("services", "db", "container_name"), "db-1", "note: db: container_name ignored"),
    "mem_limit": (("services", "db", "mem_limit"), "1g", "note: db: mem_limit ignored"),
}


#: Compose's restart policies -> config restart (what is added to BASE's services -> db's restart, the workers').
RESTARTS = {
    "restart: always": ({"db": {"restart": "always"}}, {"condition": "any", "delay": 0.1, "max_attempts": None,
                                                        "window": 0}, None),
    "restart: unless-stopped": ({"db": {"restart": "unless-stopped"}}, {"condition": "any", "delay": 0.1,
                                                                        "max_attempts": None, "window": 0}, None),
    "restart: on-failure:3": ({"db": {"restart": "on-failure:3"}}, {"condition": "on-failure", "delay": 0.1,
                                                                    "max_attempts": 3, "window": 0}, None),
    "restart: on-failure": ({"db": {"restart": "on-failure"}}, {"condition": "on-failure", "delay": 0.1,
                                                                "max_attempts": None, "window": 0}, None),
    "restart: no": ({"db": {"restart": "no"}}, None, None),
    "deploy.restart_policy": ({"db": {"deploy": {"restart_policy": {"condition": "on-failure", "delay": "5s",
                                                                    "max_attempts": 3, "window": "2m"}}}},
                              {"condition": "on-failure", "delay": 5, "max_attempts": 3, "window": 120}, None),
    "deploy.restart_policy's defaults": ({"db": {"deploy": {"restart_policy": {}}}},
                                         {"condition": "any", "delay": 0, "max_attempts": None, "window": 0}, None),
    "deploy.restart_policy replaces restart": ({"db": {"restart": "always",
                                                       "deploy": {"restart_policy": {"condition": "none"}}}}, None, None),
    "the workers' restart: always, without main": ({"worker": {"restart": "always"}}, {
        "worker": {"condition": "on-failure", "delay": 0.1, "max_attempts": None, "window": 0}},
        "note: worker: restart any as on-failure: the stack ends when every worker ended"),
    "the workers' restart_policy": ({"worker": {"deploy": {"replicas": 2, "restart_policy": {
        "condition": "on-failure", "max_attempts": 2}}}}, {"worker": {"condition": "on-failure", "delay": 0,
                                                                      "max_attempts": 2, "window": 0}}, None),
    "the check's restart": ({"check": {"restart": "on-failure"}}, None,
                            "note: check: restart on-failure not applied: the check runs once and its end decides"),
}


@pytest.mark.parametrize("case", sorted(RESTARTS))
def test_restart_and_deploy_restart_policy_map_to_the_restart_policy(tmp_path, capsys, monkeypatch, case):
    added, expected, said = RESTARTS[case]
    document = copy.deepcopy(BASE)
    for name, keys in added.items():
        document["services"][name].update(keys)
    code, config, _ = import_document(tmp_path, document, env={}, monkeypatch=monkeypatch)
    out = capsys.readouterr().out
    assert code == 0, out
    if isinstance(expected, dict) and "worker" in expected:
        assert config["worker"]["restart"] == expected["worker"]
    else:
        assert config["services"]["db"].get("restart") == expected
        assert "restart" not in config["worker"] and "restart" not in config["verify"]
    assert "not applied" not in out or said is not None, out  # a mapping, not a note
    if said:
        assert said in out, out


@pytest.mark.parametrize(("value", "line"), [
    ({"restart": "sometimes"}, "services.db.restart: 'sometimes' is not no, always, unless-stopped or on-failure[:N]"),
    ({"restart": "always:3"}, "services.db.restart: 'always:3' is not no, always"),
    ({"deploy": {"restart_policy": {"condition": "maybe"}}},
     "services.db.deploy.restart_policy.condition: 'maybe' is not none, on-failure or any"),
    ({"deploy": {"restart_policy": {"delay": "soon"}}},
     "services.db.deploy.restart_policy.delay: 'soon' is not a duration"),
])
def test_a_restart_policy_that_cannot_map_is_refused_by_name(tmp_path, capsys, monkeypatch, value, line):
    document = copy.deepcopy(BASE)
    document["services"]["db"].update(value)
    code, _, _ = import_document(tmp_path, document, env={}, monkeypatch=monkeypatch)
    assert code == 65 and line in capsys.readouterr().err


def test_the_main_programs_restart_is_not_applied(tmp_path, capsys, monkeypatch):
    document = copy.deepcopy(BASE)
    del document["services"]["check"]
    document["services"]["producer"] = {"image": "app:1", "command": ["produce"], "restart": "on-failure",
                                        "depends_on": {"worker": {"condition": "service_started"}}}
    document["services"]["worker"]["restart"] = "always"
    code, config, _ = import_document(tmp_path, document, "--exit-code-from", "producer", env={},
                                      monkeypatch=monkeypatch)
    out = capsys.readouterr().out
    assert code == 0 and config["main"] == "producer", out
    assert "restart" not in config["services"]["producer"]
    assert "note: producer: restart on-failure not applied: the main program runs once" in out
    assert config["worker"]["restart"]["condition"] == "any"  # with main, the workers are stopped when it ends


@pytest.mark.parametrize("feature", sorted(SAID))
def test_what_maps_with_a_difference_is_said_never_dropped(tmp_path, capsys, monkeypatch, feature):
    where, value, line = SAID[feature]
    document = copy.deepcopy(BASE)
    target = document
    for key in where[:-1]:
        target = target.setdefault(key, {})
    target[where[-1]] = value
    code, config, _ = import_document(tmp_path, document, env={}, monkeypatch=monkeypatch)
    out = capsys.readouterr().out
    assert code == 0 and config is not None
    assert line in out, out


@pytest.mark.parametrize("asked", [
    {"deploy": {"resources": {"reservations": {"devices": [{"capabilities": ["gpu"], "count": 2}]}}}},
    {"gpus": [{"driver": "nvidia", "count": 2}]},
    {"gpus": [{"count": 1}, {"count": "1"}]},
])
def test_gpus_for_a_service_are_its_job_steps(tmp_path, capsys, monkeypatch, asked):
    """A service's GPUs (deploy.resources.reservations.devices, or Compose's gpus: with a count) are its
    services.<name>.gpus: its job step's --gpus, summed into the allocation; a service without any writes none."""
    document = copy.deepcopy(BASE)
    document["services"]["db"].update(asked)
    code, config, _ = import_document(tmp_path, document, env={}, monkeypatch=monkeypatch)
    assert code == 0 and config["services"]["db"]["gpus"] == 2, capsys.readouterr()
    assert "gpus" not in config["worker"] or config["worker"]["gpus"] == 0


def test_names_are_rewritten_where_they_are_hostnames_only_and_paths_are_left_as_written(tmp_path, capsys, monkeypatch):
    """A service name in a URL's host, a host:port or a variable that holds a host is its ${ALLOCSTACK_<NAME>_HOST};
    a user name, a database name, a URL's user, an image tag and a path are left alone; mount paths stay as written
    (the run mounts them there)."""
    document = copy.deepcopy(BASE)
    (tmp_path / "data").mkdir()
    listen_everywhere = "0.0.0.0"  # noqa: S104 (what a Compose service listens on, and the import rewrites)
    document["services"]["db"].update(command=["db", "--bind", listen_everywhere, "--dir", "/var/db", "--peer", "cache:6000"],
                                      volumes=["./data:/var/db", "scratch:/work"], image="postgres:12")
    document["services"]["cache"] = {"image": "cache:6000", "command": "cache", "expose": ["6000"]}
    document["services"]["worker"].update(
        volumes=["scratch:/work"],
        environment={"DB_URL": "postgresql://db:secret@db:5000/db", "DB_HOST": "db", "POSTGRES_USER": "db",
                     "POSTGRES_DB": "db", "FILE": "/work/db/out", "BROKERS": "db:5000,cache:6000"})
    document["volumes"] = {"scratch": {}}
    code, config, _ = import_document(tmp_path, document, env={}, monkeypatch=monkeypatch)
    assert code == 0, capsys.readouterr().err
    db = config["services"]["db"]
    assert db["command"] == ["db", "--bind", "${ALLOCSTACK_DB_HOST}", "--dir", "/var/db", "--peer",
                             "${ALLOCSTACK_CACHE_HOST}:6000"]
    assert db["depends_on"] == ["cache"]  # it names cache as a hostname: it starts after cache's gate
    assert db["port"] == 5000 and db["readiness"] == {"mode": "tcp"}  # not 12, postgres:12's tag
    assert db["image"] == "images/postgres-12.sif" and config["services"]["cache"]["image"] == "images/cache-6000.sif"
    assert db["mounts"] == [{"target": "/var/db", "source": "data"}, {"target": "/work", "volume": "scratch"}]
    assert config["worker"]["environment"] == {
        "DB_URL": "postgresql://db:secret@${ALLOCSTACK_DB_HOST}:5000/db", "DB_HOST": "${ALLOCSTACK_DB_HOST}",
        "POSTGRES_USER": "db", "POSTGRES_DB": "db", "FILE": "/work/db/out",
        "BROKERS": "${ALLOCSTACK_DB_HOST}:5000,${ALLOCSTACK_CACHE_HOST}:6000"}
    assert config["volumes"] == ["scratch"]


def test_hostnames_can_be_left_as_written(tmp_path, capsys, monkeypatch):
    """--no-hostnames: values stay as written (the names resolve through the stack's hosts file, and the import says
    so); a service's Compose hostname and network aliases are its ``hostnames`` either way."""
    document = copy.deepcopy(BASE)
    document["services"]["worker"]["environment"] = {"DB_URL": "http://db:5000/x"}
    document["services"]["db"].update(hostname="database", networks={"default": {"aliases": ["pg", "database"]}})
    code, config, _ = import_document(tmp_path, document, "--no-hostnames", env={}, monkeypatch=monkeypatch)
    out = capsys.readouterr().out
    assert code == 0, out
    assert config["worker"]["environment"] == {"DB_URL": "http://db:5000/x"}
    assert config["services"]["db"]["command"] == ["db", "--port", "5000"]
    assert config["services"]["db"]["hostnames"] == ["database", "pg"]
    assert "through the stack's hosts file at /etc/hosts" in out and "values are left as written (--no-hostnames)" in out


def test_each_interpolation_form_and_where_its_value_came_from(tmp_path, capsys, monkeypatch):
    """$VAR, ${VAR}, ${VAR:-d}, ${VAR-d}, ${VAR:?m}, ${VAR?m}, ${VAR:+r}, ${VAR+r}, $$, a default holding ${...};
    .env beside the file; the environment over .env; --env-file instead of .env, a later one over an earlier one.
    The decision-record draft names each variable's source."""
    (tmp_path / ".env").write_text("FROM_DOTENV=dotenv\nOVERRIDDEN=dotenv\nEMPTY=\nQUOTED=\"a b\" # comment\n"
                                   "export LITERAL='${NOT_EXPANDED}'\nCHAINED=${FROM_DOTENV}-x\n")
    document = copy.deepcopy(BASE)
    document["services"]["worker"]["environment"] = {
        "A": "$FROM_DOTENV", "B": "${OVERRIDDEN}", "C": "${UNSET:-fallback}", "D": "${EMPTY:-fallback}",
        "E": "${EMPTY-kept}", "F": "${FROM_DOTENV:?needed}", "G": "${EMPTY?needed}", "H": "${FROM_DOTENV:+yes}",
        "I": "${UNSET+yes}", "J": "$$HOME and $${X}", "K": "${UNSET:-${FROM_DOTENV}/d}", "L": "${QUOTED}",
        "M": "${LITERAL}", "N": "${CHAINED}", "O": "${ALLOCSTACK_DB_HOST}"}
    code, config, output = import_document(tmp_path, document, env={"OVERRIDDEN": "environment"},
                                           monkeypatch=monkeypatch)
    assert code == 0, capsys.readouterr().err
    assert config["worker"]["environment"] == {
        "A": "dotenv", "B": "environment", "C": "fallback", "D": "fallback", "E": "", "F": "dotenv", "G": "",
        "H": "yes", "I": "", "J": "$HOME and ${X}", "K": "dotenv/d", "L": "a b", "M": "${NOT_EXPANDED}",
        "N": "dotenv-x", "O": "${ALLOCSTACK_DB_HOST}"}
    record = output.with_name("stack.decision-record.md").read_text()
    for fact in ("FROM_DOTENV (.env)", "OVERRIDDEN (the environment)", "UNSET (default)",
                 "EMPTY (default (EMPTY is empty))"):
        assert fact in record, record
    # --env-file replaces .env; a later file overrides an earlier one
    (tmp_path / "one.env").write_text("FROM_DOTENV=one\nOVERRIDDEN=one\n")
    (tmp_path / "two.env").write_text("FROM_DOTENV=two\n")
    document["services"]["worker"]["environment"] = {"A": "$FROM_DOTENV", "B": "${OVERRIDDEN}"}
    code, config, output = import_document(tmp_path, document, "--env-file", str(tmp_path / "one.env"), "--env-file",
                                           str(tmp_path / "two.env"), env={"EMPTY": ""}, monkeypatch=monkeypatch)
    assert code == 0, capsys.readouterr().err
    assert config["worker"]["environment"]["A"] == "two" and config["worker"]["environment"]["B"] == "one"
    assert "FROM_DOTENV (--env-file " in output.with_name("stack.decision-record.md").read_text()


def test_a_secret_from_the_environment_is_never_written(tmp_path, capsys, monkeypatch):
    """A value from the environment whose name looks secret is referenced by name (${env:NAME}), in the config and
    the decision record; the same name from .env is written (the file is yours); elsewhere than a command or an
    environment value it is refused."""
    secret = "s3cr3t-from-the-shell"  # noqa: S105 (what the test keeps out of every file)
    document = copy.deepcopy(BASE)
    document["services"]["db"]["environment"] = {"POSTGRES_PASSWORD": "${DB_PASSWORD}", "API_TOKEN": None,
                                                 "URL": "postgres://u:${DB_PASSWORD}@db:5000/x"}
    document["services"]["db"]["command"] = "db --port 5000 --password ${DB_PASSWORD}"
    code, config, output = import_document(tmp_path, document, env={"DB_PASSWORD": secret, "API_TOKEN": secret},
                                           monkeypatch=monkeypatch)
    assert code == 0, capsys.readouterr().err
    written = output.read_text() + output.with_name("stack.decision-record.md").read_text()
    assert secret not in written
    db = config["services"]["db"]
    assert db["environment"] == {"POSTGRES_PASSWORD": "${env:DB_PASSWORD}", "API_TOKEN": "${env:API_TOKEN}",
                                 "URL": "postgres://u:${env:DB_PASSWORD}@${ALLOCSTACK_DB_HOST}:5000/x"}
    assert db["command"][-1] == "${env:DB_PASSWORD}"
    assert "DB_PASSWORD (the environment, kept out of the config" in written
    document["services"]["db"]["working_dir"] = "/srv/${DB_PASSWORD}"
    code, config, output = import_document(tmp_path, document, env={"DB_PASSWORD": secret}, monkeypatch=monkeypatch)
    err = capsys.readouterr().err
    assert code == 65 and "services.db.working_dir: uses $DB_PASSWORD from your environment" in err and secret not in err


def test_reset_and_override_in_a_later_file(tmp_path, capsys, monkeypatch):
    """!reset removes what an earlier file said (here working_dir and a port), !override replaces a list instead of
    merging it (here the volumes), as `docker compose -f a -f b` does."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    document = copy.deepcopy(BASE)
    document["services"]["db"].update(working_dir="/srv", volumes=["./a:/a", "./b:/b"], ports=["5001:5000"])
    override = ("services:\n  db:\n    working_dir: !reset null\n    ports: !reset []\n"
                "    volumes: !override [./b:/only]\n")
    code, config, _ = import_document(tmp_path, [document, override], env={}, monkeypatch=monkeypatch)
    assert code == 0, capsys.readouterr().err
    db = config["services"]["db"]
    assert db["working_dir"] is None and db["mounts"] == [{"target": "/only", "source": "b"}]
    assert db["port"] == 5000  # from expose alone now
    merged = ("services:\n  db:\n    volumes: [./b:/only]\n")
    code, config, _ = import_document(tmp_path, [document, merged], env={}, monkeypatch=monkeypatch)
    assert [m["target"] for m in config["services"]["db"]["mounts"]] == ["/a", "/b", "/only"]  # merged by target


def test_images_mounts_working_dir_entrypoint_secrets_and_configs_as_compose_writes_them(tmp_path, capsys, monkeypatch):
    """Each service its own image file (one per image, one per build context), what to run as written (none: the
    image's own), working_dir, every kind of mount at its container path (:ro kept), a secret at
    /run/secrets/<name> and a config at its target, read-only; and how to get each image, for both runtimes."""
    for path in ("app", "conf/app.conf", "key.txt"):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).mkdir() if path == "app" else (tmp_path / path).write_text("x")
    document = copy.deepcopy(BASE)
    document["services"]["db"] = {"image": "redis:7", "command": ["redis-server", "--save", ""],
                                  "volumes": ["data:/data", {"type": "tmpfs", "target": "/cache"}, "/scratch"],
                                  "healthcheck": {"test": ["CMD", "redis-cli", "ping"], "interval": "1s",
                                                  "retries": 5}}
    document["services"]["worker"].update(build="./app", command=None, working_dir="/app",
                                          entrypoint=["python3", "-m", "work"], volumes=["./app:/app:ro"],
                                          secrets=["key"], configs=[{"source": "conf", "target": "/etc/app.conf"}])
    del document["services"]["worker"]["image"]
    document["services"]["check"].update(build="./app", command=None)
    del document["services"]["check"]["image"]
    document.update(volumes={"data": {}}, secrets={"key": {"file": "./key.txt"}},
                    configs={"conf": {"file": "./conf/app.conf"}})
    code, config, _ = import_document(tmp_path, document, "--run", "demo", env={}, monkeypatch=monkeypatch)
    out = capsys.readouterr().out
    assert code == 0, out
    db, worker, check = config["services"]["db"], config["worker"], config["verify"]
    assert db["image"] == "images/redis-7.sif" and db["command"] == ["redis-server", "--save", ""]
    assert db["mounts"] == [{"target": "/data", "volume": "data"}, {"target": "/cache", "volume": "db-cache"},
                            {"target": "/scratch", "volume": "db-scratch"}]
    assert worker["image"] == check["image"] == "images/demo-app.sif"  # one build context, one image
    assert worker["entrypoint"] == ["python3", "-m", "work"] and worker["command"] is None
    assert worker["working_dir"] == "/app" and check["command"] is None and check["entrypoint"] is None
    assert worker["mounts"] == [{"target": "/app", "source": "app", "read_only": True},
                                {"target": "/run/secrets/key", "source": "key.txt", "read_only": True},
                                {"target": "/etc/app.conf", "source": "conf/app.conf", "read_only": True}]
    assert "note: check: no command: in its image it runs the image's own (ENTRYPOINT + CMD" in out
    assert "to get: image: redis:7 (db) -> images/redis-7.sif: apptainer build images/redis-7.sif docker://redis:7" \
           in out and "sha256sum images/redis-7.sif > images/redis-7.sif.sha256" in out
    assert "docker-archive://demo-app.tar" in out
    assert ("podman save --format oci-archive demo-app -o demo-app.oci.tar, then apptainer build images/demo-app.sif "
            "oci-archive://demo-app.oci.tar") in out
    assert "apptainer build images/redis-7.sif oci-archive://x.oci.tar" in out
    code, config, _ = import_document(tmp_path, document, "--run", "demo", "--runtime", "charliecloud", "--images",
                                      "ch", env={}, monkeypatch=monkeypatch)
    out = capsys.readouterr().out
    assert code == 0 and config["runtime"] == "charliecloud" and config["services"]["db"]["image"] == "ch/redis-7"
    assert "ch-image pull redis:7 && ch-convert redis:7 ch/redis-7" in out
    assert "python3 workflow/scripts/image_digest.py ch/redis-7" in out


def test_a_port_from_the_images_expose(tmp_path, capsys, monkeypatch):
    """A service others wait for, with no healthcheck and no port: its image's EXPOSE gives the tcp gate (read at
    import when the image is there, else when the stack starts: port image); an image that EXPOSEs none is refused."""
    document = copy.deepcopy(BASE)
    document["services"]["db"] = {"image": "redis:7"}
    document["services"]["worker"]["depends_on"] = ["db"]
    code, config, _ = import_document(tmp_path, document, "--runtime", "charliecloud", env={},
                                      monkeypatch=monkeypatch)
    assert code == 0, capsys.readouterr().err
    assert config["services"]["db"]["port"] == "image" and config["services"]["db"]["readiness"] == {"mode": "tcp"}
    image = tmp_path / "images" / "redis-7"  # a Charliecloud directory image, as ch-image pull leaves it
    (image / "ch").mkdir(parents=True)
    (image / "ch" / "config.pulled.json").write_text(json.dumps(
        {"config": {"ExposedPorts": {"6379/tcp": {}}, "Cmd": ["redis-server"]}}))
    code, config, _ = import_document(tmp_path, document, "--runtime", "charliecloud", env={},
                                      monkeypatch=monkeypatch)
    assert code == 0 and config["services"]["db"]["port"] == 6379
    assert "note: db: port 6379 from its image's EXPOSE (/ch/config.pulled.json)" in capsys.readouterr().out
    (image / "ch" / "config.pulled.json").write_text(json.dumps({"config": {"Cmd": ["redis-server"]}}))
    code, config, _ = import_document(tmp_path, document, "--runtime", "charliecloud", env={},
                                      monkeypatch=monkeypatch)
    # Neither a port nor a healthcheck, the worker waiting for its start alone (depends_on's short form): ready once
    # started, as Compose's service_started; the note says how to wait until it serves.
    assert code == 0 and config["services"]["db"]["readiness"] == {"mode": "started"}
    assert ("note: db: no healthcheck, no port and no image that EXPOSEs one; worker wait(s) for it to start "
            "(Compose's service_started): ready once started") in capsys.readouterr().out
    document["services"]["worker"]["depends_on"] = {"db": {"condition": "service_healthy"}}
    code, config, _ = import_document(tmp_path, document, "--runtime", "charliecloud", env={},
                                      monkeypatch=monkeypatch)
    assert code == 65
    assert "services.db: has no healthcheck and no port, but worker wait(s) for it to be healthy" in \
        capsys.readouterr().err
    del document["services"]["worker"]["depends_on"]  # nothing waits for it: ready once started
    code, config, _ = import_document(tmp_path, document, "--runtime", "charliecloud", env={},
                                      monkeypatch=monkeypatch)
    assert code == 0 and config["services"]["db"]["readiness"] == {"mode": "started"}


def test_the_written_config_passes_the_workflows_schema_and_plan_first(tmp_path, capsys, monkeypatch):
    """An empty argument is a valid argv element (redis-server --save ""); what the schema refuses is refused by the
    import, naming the key, and nothing is written."""
    document = copy.deepcopy(BASE)
    document["services"]["db"]["command"] = ["db", "--port", "5000", "--save", ""]
    code, config, output = import_document(tmp_path, document, env={}, monkeypatch=monkeypatch)
    assert code == 0 and config["services"]["db"]["command"][-1] == ""
    output.unlink()
    # an anonymous volume is named after its service and path: a name the schema's pattern refuses (over 63)
    document["services"]["db"]["tmpfs"] = ["/var/lib/" + "a-very-long-directory-name/" * 3]
    code, config, output = import_document(tmp_path, document, env={}, monkeypatch=monkeypatch)
    err = capsys.readouterr().err
    assert code == 65 and config is None
    assert "allocstack would refuse the config: volumes.0: 'db-var-lib-a-very-long" in err
    # what the plan refuses beyond the schema (its own rules), refused here too: two services, one variable prefix
    document = {"services": {"my-db": {"image": "postgres:16", "expose": ["5432"]},
                             "my_db": {"image": "postgres:16", "expose": ["5433"]},
                             "job": {"image": "x:1", "command": ["run"], "deploy": {"replicas": 2},
                                     "depends_on": ["my-db", "my_db"]}}}
    code, config, output = import_document(tmp_path, document, env={}, monkeypatch=monkeypatch)
    err = capsys.readouterr().err
    assert code == 65 and config is None
    assert ("allocstack would refuse the config: services.my-db and services.my_db would both be ALLOCSTACK_MY_DB_*"
            in err)


def test_hostnames_that_would_close_a_cycle_compose_has_not_are_left_as_written(tmp_path, capsys, monkeypatch):
    """db waits for cache; cache names db in a URL: making cache wait for db would close a cycle, so db's name is
    left as written there (Compose itself starts them in depends_on order only)."""
    document = copy.deepcopy(BASE)
    document["services"]["db"]["depends_on"] = ["cache"]
    document["services"]["cache"] = {"image": "c:1", "command": "cache", "expose": ["6000"],
                                     "environment": {"DB_URL": "http://db:5000"}}
    code, config, _ = import_document(tmp_path, document, env={}, monkeypatch=monkeypatch)
    out = capsys.readouterr().out
    assert code == 0
    assert config["services"]["cache"]["environment"] == {"DB_URL": "http://db:5000"}
    assert config["services"]["cache"]["depends_on"] == []
    assert "note: cache: db left as written" in out


#: A Compose file written for a machine with a Docker daemon and root: what docs/compose.md's HPC override is for.
DAEMON_STACK = """\
services:
  db:
    image: postgres:16
    privileged: true
    cap_add: [SYS_ADMIN]
    ports: ["5432:5432"]
    restart: unless-stopped
  app:
    image: example/app:1
    command: ["serve", "--port", "80"]
    volumes: [./data:/data, /var/run/docker.sock:/var/run/docker.sock]
    restart: unless-stopped
    depends_on: [db]
    deploy: {replicas: 2}
"""


def test_the_docs_hpc_override_holds_what_a_cluster_demands_and_nothing_else(tmp_path, capsys, monkeypatch):
    """docs/compose.md's compose.hpc.yaml, taken from the page: the file above is refused for root, capabilities
    and the daemon's socket; merged with the override it imports, and the rest of it is as written."""
    page = (ROOT / "docs" / "compose.md").read_text()
    override = page.split("# compose.hpc.yaml\n", 1)[1].split("```", 1)[0]
    (tmp_path / "data").mkdir()
    code, _, _ = import_document(tmp_path, DAEMON_STACK, env={}, monkeypatch=monkeypatch)
    err = capsys.readouterr().err
    assert code == 65 and all(word in err for word in ("privileged", "cap_add", "docker.sock")), err
    code, config, _ = import_document(tmp_path, [DAEMON_STACK, override], env={}, monkeypatch=monkeypatch)
    assert code == 0, capsys.readouterr().err
    assert config["services"]["db"]["port"] == 5432 and config["services"]["db"]["image"] == "images/postgres-16.sif"
    assert config["worker"]["command"] == ["serve", "--port", "8080"]
    assert config["worker"]["mounts"] == [{"target": "/data", "source": "data"}]


def test_a_service_with_the_name_of_allocstacks_own_steps_is_renamed_and_the_run_takes_it(tmp_path, capsys,
                                                                                          monkeypatch):
    """A Compose service named ``worker`` (a Celery worker the stack's job uses, say) that is one of the services,
    not the workers: ``worker`` is the name of allocstack's own steps, which the workflow refuses for a service. The
    import writes it as ``services.worker-service`` (its depends_on and its variables with it) and says so; the
    workflow then takes the config (a dry run plans it)."""
    document = {"name": "named", "services": {
        "worker": {"image": "example/api:1", "command": ["api", "--port", "5000"], "expose": ["5000"]},
        "job": {"image": "example/job:1", "command": ["job", "--api", "http://worker:5000"],
                "environment": {"API_HOST": "worker"}, "deploy": {"replicas": 2},
                "depends_on": {"worker": {"condition": "service_started"}}},
        "check": {"image": "example/job:1", "command": ["check"],
                  "depends_on": {"job": {"condition": "service_completed_successfully"}}}}}
    code, config, output = import_document(tmp_path, document, env={}, monkeypatch=monkeypatch)
    out = capsys.readouterr().out
    assert code == 0, out
    assert set(config["services"]) == {"worker-service"} and config["services"]["worker-service"]["port"] == 5000
    assert config["worker"]["command"] == ["job", "--api", "http://${ALLOCSTACK_WORKER_SERVICE_HOST}:5000"]
    assert config["worker"]["environment"] == {"API_HOST": "${ALLOCSTACK_WORKER_SERVICE_HOST}"}
    assert "note: worker: services.worker-service in the config (worker is the name of allocstack's own steps)" in out
    assert config["services"]["worker-service"]["hostnames"] == ["worker"]  # still resolved by its Compose name
    from workflow_helpers import copy_project, snakemake

    monkeypatch.undo()  # this environment again
    project = copy_project(tmp_path / "project")
    (project / "config/named.yaml").write_text(output.read_text())
    fake = tmp_path / "bin" / "apptainer"  # a dry run asks only that it is there
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\nexit 0\n")
    fake.chmod(0o755)
    dry = snakemake(project, "--dry-run", "--sdm", "apptainer", "--configfile", "config/named.yaml", timeout=120,
                    env={"PATH": f"{fake.parent}:{os.environ['PATH']}"})
    assert dry.returncode == 0, dry.stdout + dry.stderr
    assert "serve_service" in dry.stdout


def test_a_volume_marked_keep_is_carried_across_attempts_the_others_are_fresh(tmp_path, capsys, monkeypatch):
    document = copy.deepcopy(BASE)
    document["services"]["worker"]["volumes"] = ["cache:/cache", "work:/work"]
    document["volumes"] = {"cache": {"x-allocstack": {"keep": True}}, "work": {}}
    code, config, _ = import_document(tmp_path, document, env={}, monkeypatch=monkeypatch)
    assert code == 0, capsys.readouterr().err
    assert config["volumes"] == ["cache", "work"] and config["keep_volumes"] == ["cache"]


def test_compose_ups_own_flags_exit_code_from_scale_and_profile(tmp_path, capsys, monkeypatch):
    """`import_compose.py FILE --exit-code-from app --scale worker=4 --profile tools`, as `docker compose up` takes
    them: the producer beside daemon workers is config main (it may wait for the workers to start), the workers
    scaled, a service of a profile taken in."""
    document = {"services": {
        "redis": {"image": "redis:7", "expose": ["6379"]},
        "worker": {"image": "app:1", "command": ["rq", "worker"], "depends_on": ["redis"]},
        "app": {"image": "app:1", "command": ["python3", "producer.py"], "depends_on": ["redis", "worker"]},
        "dash": {"image": "dash:1", "command": ["rq-dashboard"], "expose": ["9181"], "profiles": ["tools"]},
    }}
    code, config, _ = import_document(tmp_path, document, "--exit-code-from", "app", "--scale", "worker=4",
                                      env={}, monkeypatch=monkeypatch)
    out = capsys.readouterr()
    assert code == 0, out.err
    # Compose's short form on redis (a tcp gate on its port): app starts once redis has started, as Compose starts it
    assert config["main"] == "app" and config["workers"] == 4
    assert config["services"]["app"]["depends_on"] == {"redis": "service_started"}
    assert ("note: app: depends_on redis (service_started, Compose's short form): starts once it has started, not when "
            "its gate passes, as Compose does (condition: service_healthy would wait for the gate)") in out.out
    assert "dash" not in config["services"] and "a daemon that never ends by itself" not in out.out
    assert "0 gap(s)" in out.out and "no check: app's exit code is the verdict" in out.out  # no check needed
    code, config, _ = import_document(tmp_path, document, "--exit-code-from", "app", "--scale", "worker=2",
                                      "--profile", "tools", env={}, monkeypatch=monkeypatch)
    assert code == 0 and "dash" in config["services"] and config["workers"] == 2
    code, _, _ = import_document(tmp_path, document, "--exit-code-from", "nope", env={}, monkeypatch=monkeypatch)
    assert code == 65 and "--exit-code-from nope: nope is not a service here" in capsys.readouterr().err


def test_a_second_replicated_service_keeps_its_replicas_whether_it_listens_or_not(tmp_path, capsys, monkeypatch):
    """Replicas of a service other than the workers (issue 25): a second kind of consumer (no port, nothing waits for
    it) imports with services.<name>.replicas, from deploy.replicas, scale: or --scale; so does one with a port (each
    replica in a network of its own) or a healthcheck (a gate each). The plan's refusals (main, an init job, global,
    a port without the stack's private network): tests/unit/test_config_refusals.py."""
    document = {"services": {
        "redis": {"image": "redis:7", "command": ["redis-server"], "expose": ["6379"]},
        "worker": {"image": "app:1", "command": ["python3", "w.py"], "depends_on": ["redis"],
                   "deploy": {"replicas": 2}},
        "mailer": {"image": "app:1", "command": ["celery", "-A", "mail", "worker"], "depends_on": ["redis"],
                   "deploy": {"replicas": 3}},
        "check": {"image": "app:1", "command": ["check"],
                  "depends_on": {"worker": {"condition": "service_completed_successfully"}}},
    }}
    code, config, _ = import_document(tmp_path, document, env={}, monkeypatch=monkeypatch)
    out = capsys.readouterr()
    assert code == 0, out.err
    assert config["workers"] == 2 and config["services"]["mailer"]["replicas"] == 3  # the workers stay the workers
    assert config["services"]["mailer"]["readiness"] == {"mode": "started"} and "replicas" not in config["services"][
        "redis"]
    assert "note: mailer: 3 replicas (services.mailer.deploy.replicas): each its own job step" in out.out
    from unit.plans import world

    from allocstack import plan as plans

    assert plans.load(config, world()).replicated == ["mailer-replica-2", "mailer-replica-3"]  # the plan takes it
    del document["services"]["mailer"]["deploy"]
    document["services"]["mailer"]["scale"] = 2
    code, config, _ = import_document(tmp_path, document, "--scale", "mailer=4", env={}, monkeypatch=monkeypatch)
    assert code == 0 and config["services"]["mailer"]["replicas"] == 4, capsys.readouterr().err
    code, config, _ = import_document(tmp_path, document, env={}, monkeypatch=monkeypatch)
    assert code == 0 and config["services"]["mailer"]["replicas"] == 2  # scale:
    capsys.readouterr()
    (tmp_path / "stack.yaml").unlink()
    code, config, _ = import_document(tmp_path, document, "--scale", "redis=2", env={}, monkeypatch=monkeypatch)
    out = capsys.readouterr().out
    assert code == 0 and config["services"]["redis"]["replicas"] == 2  # a service that listens: each in its own network
    assert ("note: redis: 2 replicas (--scale redis=2): each its own job step on the first node, each on port 6379 in a "
            "network of its own, reached in turn through redis:6379") in out
    assert plans.load(config, world()).fronted == {"redis": 6379}
    (tmp_path / "stack.yaml").unlink()
    document["services"]["mailer"]["healthcheck"] = {"test": ["CMD", "celery", "inspect", "ping"]}
    code, config, _ = import_document(tmp_path, document, env={}, monkeypatch=monkeypatch)
    assert code == 0 and config["services"]["mailer"]["replicas"] == 2, capsys.readouterr().err  # a gate each
    assert plans.load(config, world()).gated_replicas == ["mailer-replica-2"]


def test_the_producer_beside_replicated_workers_is_recognised_as_main_where_unambiguous(tmp_path, capsys, monkeypatch):
    document = {"services": {
        "redis": {"image": "redis:7", "expose": ["6379"]},
        "worker": {"image": "app:1", "command": ["python3", "w.py"], "depends_on": ["redis"],
                   "deploy": {"replicas": 3}},
        "app": {"image": "app:1", "command": ["python3", "producer.py"], "depends_on": ["redis", "worker"]},
    }}
    code, config, _ = import_document(tmp_path, document, env={}, monkeypatch=monkeypatch)
    out = capsys.readouterr().out
    assert code == 0 and config["main"] == "app" and config["workers"] == 3
    assert "app: it waits for the workers (worker) to start and nothing waits for it" in out
    document["services"]["ui"] = {"image": "ui:1", "command": ["ui"], "depends_on": ["app"], "expose": ["8080"]}
    code, config, _ = import_document(tmp_path, document, env={}, monkeypatch=monkeypatch)
    out = capsys.readouterr().out
    # something waits for app: not the shape, so app is a service; its plain depends_on on the workers is Compose's
    # start order only, and it starts before them (as flower, the dashboard of testdrivenio/fastapi-celery)
    assert code == 0 and config.get("main") is None
    assert config["services"]["app"]["depends_on"] == {"redis": "service_started"}
    assert config["services"]["ui"]["depends_on"] == {"app": "service_started"}  # app's gate: its image's port
    assert ("app: depends_on worker (service_started) is Compose's start order only; allocstack starts your services "
            "before the workers (they wait for every service's gate), so app starts before them") in out
    document["services"]["app"]["depends_on"] = {"redis": {"condition": "service_started"},
                                                 "worker": {"condition": "service_healthy"}}
    code, _, _ = import_document(tmp_path, document, env={}, monkeypatch=monkeypatch)
    assert code == 65  # waiting for the workers to be healthy: it would start after them, refused as before
    assert "services.app.depends_on: a long-running service that waits for worker" in capsys.readouterr().err


# ---------------------------------------------------------------- init jobs (issue 25, point 4c)

#: BASE with a migration the API and the workers wait for with service_completed_successfully.
WITH_INIT = {
    "services": {
        "db": {"image": "db:1", "command": "db --port 5000", "expose": ["5000"]},
        "migrate": {"image": "app:1", "command": ["migrate", "--db", "db:5000"],
                    "depends_on": {"db": {"condition": "service_started"}}},
        "api": {"image": "app:1", "command": ["api"], "expose": ["8000"],
                "depends_on": {"db": {"condition": "service_started"},
                               "migrate": {"condition": "service_completed_successfully"}}},
        "worker": {"image": "app:1", "command": ["work"], "deploy": {"replicas": 2},
                   "depends_on": {"api": {"condition": "service_started"},
                                  "migrate": {"condition": "service_completed_successfully"}}},
        "check": {"image": "app:1", "command": ["check"],
                  "depends_on": {"worker": {"condition": "service_completed_successfully"}}},
    },
}


def test_a_service_waited_for_to_complete_that_is_not_the_workers_is_an_init_job(tmp_path, capsys, monkeypatch):
    code, config, _ = import_document(tmp_path, copy.deepcopy(WITH_INIT), env={}, monkeypatch=monkeypatch)
    out = capsys.readouterr()
    assert code == 0, out.err
    assert config["init_jobs"] == ["migrate"]
    # db's tcp gate is not waited for where Compose waits for its start alone; the init job's exit 0 is
    assert config["services"]["migrate"]["depends_on"] == {"db": "service_started"}
    assert config["services"]["migrate"]["readiness"] == {}
    assert config["services"]["api"]["depends_on"] == {"db": "service_started",
                                                       "migrate": "service_completed_successfully"}
    # the check stays the service that waits for the workers, and the workers the replicated service
    assert config["verify"]["command"] == ["check"] and config["worker"]["command"] == ["work"]
    assert config["workers"] == 2
    note = ("migrate: an init job (others wait for it with service_completed_successfully): it runs once, before "
            "api, worker, and must exit 0 (config init_jobs)")
    assert note in out.out + out.err
    assert "0 gap(s)" in out.out


def test_without_replicas_the_service_only_the_check_waits_for_is_the_workers_and_the_rest_init_jobs(
        tmp_path, capsys, monkeypatch):
    document = copy.deepcopy(WITH_INIT)
    del document["services"]["worker"]["deploy"]
    code, config, _ = import_document(tmp_path, document, env={}, monkeypatch=monkeypatch)
    out = capsys.readouterr()
    assert code == 0, out.err
    assert config["init_jobs"] == ["migrate"] and config["workers"] == 1
    assert config["worker"]["command"] == ["work"] and config["verify"]["command"] == ["check"]


def test_the_check_that_waits_for_the_workers_keeps_todays_meaning(tmp_path, capsys, monkeypatch):
    code, config, _ = import_document(tmp_path, copy.deepcopy(BASE), env={}, monkeypatch=monkeypatch)
    assert code == 0, capsys.readouterr().err
    assert "init_jobs" not in config
    assert config["worker"]["command"] == ["work"] and config["verify"]["command"] == ["check"]


def test_a_check_that_also_waits_for_an_init_job_is_still_the_check(tmp_path, capsys, monkeypatch):
    document = copy.deepcopy(WITH_INIT)
    document["services"]["check"]["depends_on"]["migrate"] = {"condition": "service_completed_successfully"}
    code, config, _ = import_document(tmp_path, document, env={}, monkeypatch=monkeypatch)
    assert code == 0, capsys.readouterr().err
    assert config["init_jobs"] == ["migrate"] and config["verify"]["command"] == ["check"]


def test_services_waited_for_to_complete_with_no_plain_workers_are_refused_by_name(tmp_path, capsys, monkeypatch):
    document = copy.deepcopy(WITH_INIT)
    del document["services"]["worker"]["deploy"]
    document["services"]["check"]["depends_on"] = {"api": {"condition": "service_completed_successfully"}}
    document["services"]["other"] = {"image": "app:1", "command": ["other"],
                                     "depends_on": {"worker": {"condition": "service_completed_successfully"}}}
    code, _, output = import_document(tmp_path, document, env={}, monkeypatch=monkeypatch)
    err = capsys.readouterr().err
    assert code == 65 and not output.exists()
    refusal = ("services.api: api, migrate, worker are waited for to complete (service_completed_successfully), "
               "and none of them is the workers plainly: mark the workers with deploy.replicas")
    assert refusal in err, err


# ---------------------------------------------------------------- depends_on's short form (issue 25, point 4b)

def test_compose_short_form_on_a_gated_service_is_written_as_service_started_and_the_plan_takes_it(
        tmp_path, capsys, monkeypatch):
    """Compose starts a dependent of the short form (service_started) once its dependency's container started: on a
    service with a gate of its own (a port's tcp gate here) the import writes the mapping form, which waits for the
    start alone; service_healthy and a dependency ready once started keep the list form (the same bytes as before).
    A service renamed for allocstack's own names keeps its condition. The plan loads what the import wrote."""
    from allocstack import plan
    from allocstack.plan import Facts

    document = copy.deepcopy(BASE)
    document["services"].update({
        "api": {"image": "app:1", "command": ["api"], "expose": ["8000"], "depends_on": ["db"]},
        "ui": {"image": "ui:1", "command": ["ui"], "expose": ["8080"],
               "depends_on": {"api": {"condition": "service_healthy"}}},
        "readiness": {"image": "probe:1", "command": ["probe"], "expose": ["9000"],
                      "depends_on": {"db": {"condition": "service_started"}, "ui": {"condition": "service_healthy"}}},
    })
    code, config, output = import_document(tmp_path, document, env={}, monkeypatch=monkeypatch)
    out = capsys.readouterr()
    assert code == 0, out.err
    services = config["services"]
    assert services["api"]["depends_on"] == {"db": "service_started"}
    assert services["ui"]["depends_on"] == ["api"]  # service_healthy alone: the list form, as before
    assert services["readiness-service"]["depends_on"] == {"db": "service_started", "ui": "service_healthy"}
    assert "note: api: depends_on db (service_started, Compose's short form): starts once it has started" in out.out
    assert "    depends_on:\n      db: service_started\n" in output.read_text()
    planned = plan.load(config, Facts(cwd=str(tmp_path), is_file=lambda path: True, skip_validation=False,
                                      sysctl={"user.max_user_namespaces": "1"}.get, which=lambda program: program))
    assert planned.started(planned.services["api"]["depends_on"]) == ["db"]
    assert planned.gates(planned.run, planned.services["api"]["depends_on"]) == []
