"""Every config refusal, in-process: ONE line naming the key, before anything is planned.

Three of them also run through Snakemake (tests/test_config_errors.py): that the adapter turns a
refusal into that one line and its exit code.
"""

from __future__ import annotations

import pytest

from allocstack import plan
from allocstack.plan.config import defaults

from .plans import configured, plan_of, refusal, world

#: Your own stack, for the refusals of config main.
OWN = "tasks: null\nexpected: null\nworker: {mode: long-running, command: [w]}\nverify: {command: [c]}\n"

BAD = {
    "worker.command empty": ("worker: {command: []}", "worker.command"),
    "worker.command a shell string": ("worker: {command: 'python3 x.py'}", "worker.command"),
    "worker.task_timeout negative": ("worker: {task_timeout: -1}", "worker.task_timeout"),
    "worker.gpus negative": ("worker: {gpus: -1}", "worker.gpus"),
    "workers zero": ("workers: 0", "workers: 0 is less than the minimum of 1"),
    "a misspelled key": ("wrokers: 3", "wrokers: there is no key 'wrokers'; did you mean 'workers'?"),
    "a misspelled nested key": ("worker: {comand: [x]}", ("worker.comand: worker has no key 'comand'; did you mean "
                                                         "'command'?")),
    "an unknown key like none": ("colour: blue", "colour: there is no key 'colour' (every key: config/README.md)"),
    "a misspelled value": ("runtime: apptaner", ("runtime: 'apptaner' is not one of 'apptainer', 'charliecloud'; "
                                                "did you mean 'apptainer'?")),
    "a command as a shell string": ("worker: {command: python3 apps/x.py}",
                                    ('worker.command: "python3 apps/x.py" is text, not a list: write an argv list, one '
                                     'word per item, in a file given with --configfile: worker: {command: ["python3", '
                                     '"apps/x.py"]}')),
    "a number in quotes": ("workers: 'three'", ('workers: "three" is text, not a whole number: write a number, '
                                               "without quotes: workers: 3")),
    "a flag as a number": ("coordinator: {stop_claims_before_end: 1}",
                           ("coordinator.stop_claims_before_end: 1 is a whole number, not true or false: write "
                            "coordinator: {stop_claims_before_end: true} or coordinator: {stop_claims_before_end: "
                            "false}")),
    "an environment as a list": ("worker: {environment: [A=1]}",
                                 ('worker.environment: ["A=1"] is a list, not a mapping: write a mapping, in a file '
                                  "given with --configfile: worker: {environment: {NAME: VALUE}}")),
    "verify.command not a list": ("verify: {command: check.sh}", "verify.command"),
    "service.readiness.mode unknown": ("service: {command: [x], readiness: {mode: ping}}", "service.readiness.mode"),
    "service.readiness.path relative": ("service: {command: [x], readiness: {path: health}}", "service.readiness.path"),
    "service command mode without a command": ("service: {command: [x], readiness: {mode: command}}",
                                               "service.readiness.mode is command but service.readiness.command is null"),
    "services command mode without a command": ("services: {db: {command: [x], readiness: {mode: command}}}",
                                                ("services.db.readiness.mode is command but services.db.readiness."
                                                "command is null")),
    "service and services.app": ("service: {command: [x]}\nservices: {app: {command: [y]}}",
                                 "service.command and services.app are both set"),
    "decisions owner unknown": ("decisions: {accelerators: {owner: vendor, how: x}}", "decisions.accelerators.owner"),
    "decisions missing how": ("decisions: {allocation: {owner: launch script}}", "decisions.allocation"),
    "decisions owner not one of four": ("decisions: {allocation: {owner: me, how: x}}",
                                        "decisions.allocation.owner: 'me' is not one of"),
    "coordinator.max_attempts zero": ("coordinator: {max_attempts: 0}", "coordinator.max_attempts"),
    "apptainer.binds not a list": ("apptainer: {binds: /data}", "apptainer.binds"),
    "expected and verify.command both null": ("expected: null", ("expected is null and verify.command is not set: "
                                                                "nothing would say whether")),
    "unknown nested key": ("worker: {comand: [x]}", "comand"),
    "network.interface not an interface name": ("network: {interface: 'eth0; rm -rf /'}", "network.interface"),
    "services.depends_on unknown": ("services: {api: {command: [x], depends_on: [db]}}",
                                    "services.api.depends_on: 'db' is not one of services (api)"),
    "services.depends_on a cycle": ("services: {a: {command: [x], depends_on: [b]}, b: {command: [x], depends_on: [a]}}",
                                    "services: depends_on has a cycle: a -> b -> a"),
    "a service named like a worker": ("services: {worker-01: {command: [x]}}",
                                      "services.worker-01: the name is allocstack's own"),
    "a service named like a gate": ("services: {db-readiness: {command: [x]}}",
                                    "services.db-readiness: the name is allocstack's own"),
    "a service named coordinator beside the built-in one": ("services: {coordinator: {command: [x]}}",
                                                            ("services.coordinator: the name is the built-in "
                                                            "coordinator's (tasks is set)")),
    "two services with one variable prefix": ("services: {my-db: {command: [x]}, my_db: {command: [y]}}",
                                              "services.my-db and services.my_db would both be ALLOCSTACK_MY_DB_*"),
    "a service without a command": ("services: {db: {port: 5000}}", "services.db.command is not set"),
    "long-running workers without a command": ("worker: {mode: long-running}",
                                               "worker.mode is long-running but worker.command is not set"),
    "tasks null with per-task workers": ("tasks: null\nexpected: null\nverify: {command: [x]}",
                                         "tasks is null (no built-in coordinator) but worker.mode is per-task"),
    "a port from the image without an image": ("services: {db: {command: [x], port: image}}",
                                               ("services.db.port is image (the port its image EXPOSEs) but it runs "
                                               "without an image")),
    "main not one of services": (OWN + "services: {db: {command: [x]}}\nmain: app",
                                 "main: app is not one of services (db)"),
    "a service depends on main": (OWN + "services: {app: {command: [x]}, ui: {command: [y], depends_on: [app]}}\n"
                                        "main: app",
                                  "main: app runs once and ends the stack, but services.ui depends on it"),
    "max_lifetime for per-task workers": ("worker: {max_lifetime: 60}",
                                          "worker.max_lifetime is for long-running workers"),
    "an init job that is not a service": (OWN + "services: {db: {command: [x]}}\ninit_jobs: [migrate]",
                                          "init_jobs: migrate is not one of services (db)"),
    "an init job that is main": (OWN + "services: {app: {command: [x]}}\nmain: app\ninit_jobs: [app]",
                                 "init_jobs: app is main: an init job runs once before what depends on it"),
    "service_completed_successfully on a service": (
        OWN + "services: {db: {command: [x]}, api: {command: [y], depends_on: {db: service_completed_successfully}}}",
        ("services.api.depends_on.db is service_completed_successfully, but db is not an init job: list it in "
        "init_jobs")),
    "an init job waited for to start": (
        OWN + "services: {migrate: {command: [x]}, api: {command: [y], depends_on: {migrate: service_started}}}\n"
              "init_jobs: [migrate]",
        ("services.api.depends_on.migrate is service_started, but migrate is an init job: what depends on it waits "
        "for its exit 0; write service_completed_successfully")),
    "main waits for an init job to be healthy": (
        OWN + "services: {migrate: {command: [x]}, app: {command: [y], depends_on: {migrate: service_healthy}}}\n"
              "init_jobs: [migrate]\nmain: app",
        "services.app.depends_on.migrate is service_healthy, but migrate is an init job"),
    "a condition that is not Compose's": ("services: {db: {command: [x]}, api: {command: [y], depends_on: {db: up}}}",
                                          "services.api.depends_on"),
    "main with a task document": ("services: {app: {command: [x]}}\nmain: app",
                                  "main: app with a task document (tasks)"),
    "a kept volume not one of volumes": ("volumes: [a]\nkeep_volumes: [b]", "keep_volumes: b is not one of `volumes`"),
    "a mount's volume not one of volumes": ("services: {db: {command: [x], mounts: [{target: /d, volume: nope}]}}",
                                            "services.db.mounts: /d: volume nope is not one of `volumes`"),
    "per-task workers with mounts": ("worker: {mounts: [{target: /d, source: config}]}",
                                     "worker.mounts is for long-running workers (your own stack)"),
    "${env:NAME} unset": ("services: {db: {command: [x, '${env:ALLOCSTACK_TEST_UNSET}']}}",
                          "services.db: ${env:ALLOCSTACK_TEST_UNSET} is not set in the environment snakemake runs in"),
    "a mount a schema refuses (relative target)": ("services: {db: {command: [x], mounts: [{target: d, source: c}]}}",
                                                   "services.db.mounts.0.target"),
    "tasks null with expected": ("tasks: null\nworker: {mode: long-running, command: [x]}",
                                 "expected is set but tasks is null: there are no task results to compare"),
    "a restart condition misspelled": ("services: {db: {command: [x], restart: {condition: always}}}",
                                       "services.db.restart.condition: 'always' is not one of"),
    "a restart policy on main": (OWN + "services: {app: {command: [x], restart: {condition: on-failure}}}\nmain: app",
                                 "services.app.restart: main: app runs once and its end ends the stack"),
    "a restart window without max_attempts": ("services: {db: {command: [x], restart: {condition: any, window: 60}}}",
                                              ("services.db.restart.window is set but services.db.restart.max_attempts "
                                              "is null")),
    "a restart policy for per-task workers": ("worker: {restart: {condition: on-failure}}",
                                              "worker.restart is for long-running workers"),
    "workers restarted after exit 0 without main": (OWN + "worker: {mode: long-running, command: [w], "
                                                          "restart: {condition: any}}",
                                                    ("worker.restart.condition is any, but without main the stack ends "
                                                    "when every worker ended")),
    "replicas zero": ("services: {c: {command: [x], readiness: {mode: started}, replicas: 0}}",
                      "services.c.replicas: 0 is less than the minimum of 1"),
    "replicas of a service with a port on the node's network": (
        OWN + "network: {isolation: none}\nservices: {db: {command: [x], port: 6379, readiness: {mode: started}, "
              "replicas: 2}}",
        ("services.db.replicas is 2, but db: it has port 6379: each replica listens on it in a network of its own, "
         "which needs network.isolation: private (else they would share the node's one loopback, and its port); run "
         "one copy, or write each copy as a service of its own on a port of its own")),
    "replicas of a service whose gate probes a port chosen when it starts": (
        OWN + "services: {db: {command: [x], replicas: 3}}",
        ("services.db.replicas is 3, but db: its readiness gate (http) probes a port chosen when it starts (port: "
         "null): write the port it listens on (services.db.port), which each replica listens on in a network of its "
         "own")),
    "replicas of main": (OWN + "services: {p: {command: [x], readiness: {mode: started}, replicas: 2}}\nmain: p",
                         "services.p.replicas is 2, but p: it is main: it runs once and its end ends the stack"),
    "replicas of an init job": (OWN + "services: {m: {command: [x], readiness: {mode: started}, replicas: 2}}\n"
                                      "init_jobs: [m]",
                                "services.m.replicas is 2, but m: it is an init job"),
    "a service named as another's replica": (OWN + "services: {c: {command: [x], readiness: {mode: started}, "
                                                    "replicas: 2}, c-replica-2: {command: [y], readiness: {mode: started}}}",
                                              ("services.c.replicas is 2, but services.c-replica-2 is the name of its "
                                               "replica 2: rename that service")),
    "replicas of a global service": (OWN + "services: {g: {command: [x], readiness: {mode: started}, mode: global, "
                                           "replicas: 2}}",
                                     "services.g.replicas is 2, but g: its mode is global"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_bad_config_is_one_line_naming_the_key(case):
    text, words = BAD[case]
    refused = refusal(text)
    assert refused.diag == "config" and refused.exit_code == 78
    assert words in refused.message, refused.message
    assert "\n" not in refused.line() and refused.line().startswith("allocstack: error [config]: ")


@pytest.mark.parametrize("key", ["tasks", "expected"])
def test_a_missing_input_file_is_one_line_naming_its_key(key):
    refused = refusal(f"{key}: inputs/nope.json")
    assert (refused.diag, refused.exit_code) == ("input", 65)
    assert refused.message == f"{key} file inputs/nope.json does not exist (config key '{key}')"


def test_the_config_as_snakemake_read_it_is_not_changed():
    config = configured("workers: 3")
    before = repr(config)
    planned = plan.load(config, world())
    assert repr(config) == before  # the plan's config is its own, complete copy
    assert planned.config["workers"] == 3 and planned.config["worker"]["batch"] == 64


def test_null_on_the_command_line_means_null_where_the_schema_allows_it():
    """``--config expected=null`` arrives as the string "null"."""
    config = configured("verify: {command: [python3, -c, pass]}")
    config["expected"] = "null"
    assert plan.load(config, world()).config["expected"] is None
    config = configured()
    config["run"] = "null"  # run may not be null: the text stays text
    assert plan.load(config, world()).run == "null"
    config["expected"] = "null"
    with pytest.raises(plan.PlanError, match=r"expected is null and verify\.command is not set"):
        plan.load(config, world())


def test_the_older_service_block_is_the_service_app_with_the_services_defaults():
    planned = plan_of("service: {command: [python3, app.py], readiness: {mode: tcp}}")
    assert "service" not in planned.config  # migrated once: nothing after reads it
    assert planned.services == {"app": {
        "command": ["python3", "app.py"], "image": None, "entrypoint": None, "working_dir": None, "mounts": [],
        "port": None, "depends_on": [], "mode": "replicated", "replicas": 1, "cpus": 1, "gpus": 0, "environment": {},
        "stop_grace_period": 10, "hostnames": [],
        "restart": {"condition": "none", "delay": 0, "max_attempts": None, "window": 0},
        "readiness": {"mode": "tcp", "path": "/health", "expect": {}, "command": None, "timeout": None,
                      "interval": None, "probe_timeout": 1}}}
    assert plan_of("service: {command: null}").services == {}


def test_a_modules_skip_validation_skips_the_schema_and_its_defaults():
    """As snakemake.utils.validate: the module's user gives the whole config."""
    config = {**defaults(), "workers": 0}  # the schema would refuse 0
    assert plan.load(config, world(skip_validation=True)).config["workers"] == 0
    with pytest.raises(KeyError):
        plan.load({"run": "x", "tasks": None, "workers": 1}, world(skip_validation=True))


#: Your own stack whose programs have no command: in their images they run the image's own.
OWN_COMMANDS = ("tasks: null\nexpected: null\nworker: {mode: long-running, image: app.sif}\n"
                "verify: {image: app.sif}\nservices: {db: {image: db.sif, port: image}}\n")


def test_programs_without_a_command_run_their_images_own_and_without_images_are_refused():
    """With images on (--sdm apptainer, or runtime charliecloud) a program of yours without a command runs its
    image's own, and a port may come from the image; without images the same config is one line."""
    installed = {"which": lambda program: f"/usr/bin/{program}"}
    planned = plan_of(OWN_COMMANDS, deployment=frozenset({"apptainer"}), **installed)
    assert planned.images_on and not planned.use_image  # no top-level image: allocstack's own run on the host
    assert plan_of(OWN_COMMANDS + "runtime: charliecloud\n", **installed).images_on
    refused = refusal(OWN_COMMANDS)
    assert "services.db.command is not set" in refused.message and "run it in its image" in refused.message
    missing = refusal(OWN_COMMANDS, deployment=frozenset({"apptainer"}))
    assert missing.diag == "prerequisite" and "apptainer is not on PATH" in missing.message


def test_a_mount_source_that_does_not_exist_and_a_set_env_reference():
    refused = refusal("services: {db: {command: [x], mounts: [{target: /d, source: no/such/dir}]}}")
    assert refused.diag == "input" and "services.db.mounts: /d: its source no/such/dir does not exist" in refused.message
    planned = plan_of("services: {db: {command: [x, '${env:DB_PASSWORD}']}}", environ={"DB_PASSWORD": "s3cret"})
    assert planned.services["db"]["command"] == ["x", "${env:DB_PASSWORD}"]  # read when it starts, not here


def test_replicas_of_a_service_that_listens_for_nobody_are_planned():
    """A consumer with no port and no gate of its own (ready once started, nothing depends on it) may be copied."""
    planned = plan_of(OWN + "services: {c: {command: [x], readiness: {mode: started}, replicas: 3}}")
    assert planned.replicas("c") == [1, 2, 3] and planned.replicated == ["c-replica-2", "c-replica-3"]
    assert planned.ungated == ["c"] and planned.gated == []
    assert planned.service_files("baseline") == [planned.layout.service_file("c"), planned.layout.replica_file("c", 2),
                                                 planned.layout.replica_file("c", 3)]
    assert planned.shape.cpus == 3 + 2 and planned.shape.components == 2 + 2 + 4
    assert plan_of(OWN + "services: {db: {command: [x], port: 6379}}").replicated == []  # one: the default


def test_replicas_of_a_service_that_listens_are_planned_each_in_a_network_of_its_own():
    """A web server of three replicas on port 8000: each its own gate, in its own network (launch.py
    --network-space), given the stack's services it may use; the front on 8000 in the stack's network; what depends
    on it waits for every replica's gate, and its start for every replica's."""
    from allocstack.plan import argv

    planned = plan_of(OWN + "services: {store: {command: [s], port: 8100, readiness: {mode: tcp}}, "
                            "web: {command: [w], port: 8000, depends_on: [store], replicas: 3}, "
                            "api: {command: [a], depends_on: {web: service_started}}, "
                            "ui: {command: [u], depends_on: [web]}}")
    instances = ["web", "web-replica-2", "web-replica-3"]
    assert planned.fronted == {"web": 8000} and planned.replica_spaces == instances
    assert planned.gated_replicas == ["web-replica-2", "web-replica-3"]
    assert planned.gates("r", ["web"]) == [planned.files("r").service_gate(name) for name in instances]
    assert planned.started({"web": "service_started"}) == instances
    assert set(planned.service_gates("r")) >= {planned.files("r").service_gate(name) for name in instances}
    network = argv.stack_network(planned, "r")
    assert "--front=8000=web,web-replica-2,web-replica-3" in network
    assert [a for a in network if a.startswith("--replica-space")] == [f"--replica-space={n}" for n in instances]
    assert "--network-space=web-replica-2" in argv.launch(planned, "replica", "r", service="web", replica="2")
    assert "--network-space=web-replica-2" in argv.launch(planned, "replica_gate", "r", service="web", replica="2")
    assert "--network-space=web" in argv.launch(planned, "service_gate", "r", service="web")
    assert not [a for a in argv.launch(planned, "service", "r", service="api") if a.startswith("--network-space")]
    replica = argv.replica(planned, "r", service="web", replica="3")
    assert {"--own-network", "--forward=store=8100", "--instance=web-replica-3"} <= set(replica)
    assert not [a for a in argv.service(planned, "r", service="store") if a.startswith(("--own", "--forward"))]
    assert "--record=" + planned.files("r").service_gate("web-replica-3") in argv.replica_gate(
        planned, "r", service="web", replica="3")


def test_on_more_than_one_node_the_front_of_a_service_s_replicas_is_relayed_to_the_other_nodes():
    """The stack's network job relays the front (port_sockets.py --relay), published where a service's supervisor
    publishes its relay; the replicas relay nothing themselves; the other nodes forward the service as any other."""
    from allocstack.plan import argv

    planned = plan_of("nodes: 3\nworkers: 6\nnetwork: {tls: false}\n"
                      "services: {web: {command: [w], port: 8000, replicas: 2, readiness: {mode: tcp}}}")
    network = argv.stack_network(planned, "r")
    assert f"--relay=web={planned.files('r').shared_service_endpoint('web')}" in network and "--no-tls" in network
    assert "--inbound=web" in network and "--front=8000=web,web-replica-2" in network
    for args in (argv.service(planned, "r", service="web"), argv.replica(planned, "r", service="web", replica="2")):
        assert not [a for a in args if a.startswith("--network-endpoint-file")]
    assert "--forward=web" in argv.stack_network(planned, "r", node="2")


def test_replicas_of_a_service_whose_port_is_its_images_are_refused():
    """Its front listens on the port before any replica started: the port must be written."""
    refused = refusal(OWN_COMMANDS.replace("port: image}", "port: image, replicas: 2}"),
                      deployment=frozenset({"apptainer"}), which=lambda program: f"/usr/bin/{program}")
    assert refused.message == ("services.db.replicas is 2, but db: its port is image: its replicas' front listens on "
                               "the port before any replica started; write the port it listens on (services.db.port)")


def test_replicas_of_a_service_with_a_gate_and_no_port_share_the_stacks_network():
    """No port: nothing of theirs can collide; each replica has its own gate (its healthcheck command), what
    depends on the service waits for them all, and no replica gets a network of its own."""
    from allocstack.plan import argv

    planned = plan_of(OWN + "network: {isolation: none}\nservices: {c: {command: [x], readiness: {mode: command, "
                            "command: [ok]}, replicas: 2}, api: {command: [y], depends_on: {c: service_healthy}}}")
    assert planned.fronted == {} and planned.gated_replicas == ["c-replica-2"]
    assert "--gate-record=" + planned.files("r").service_gate("c-replica-2") in argv.service(planned, "r", service="api")
    assert not [a for a in argv.launch(planned, "replica", "r", service="c", replica="2") if "network-space" in a]
