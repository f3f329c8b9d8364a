"""Init jobs (issue 25, point 4c; Compose: a service others wait for with service_completed_successfully): config
init_jobs run once, before what depends on them, and must exit 0; a failing one stops the stack before its
dependents start and names itself. Real Snakemake runs, real processes on loopback."""

from __future__ import annotations

import json
import shutil
import sys
import textwrap

import yaml
from test_compose_stacks import free_port  # outside the ephemeral range (CI of fa8d86d: a port taken meanwhile)

from conftest import ROOT, run_script
from workflow_helpers import long_running_head, snakemake

PYTHON = json.dumps(sys.executable)
#: A database-like service: listens on its port until stopped.
DB = ("import os, socket, time; s = socket.socket(); s.bind(('127.0.0.1', int(os.environ['ALLOCSTACK_DB_PORT'])));"
      " s.listen()\nwhile True: time.sleep(0.1)")
#: The migration: reaches the database, writes the schema into the volume, exits with argv[1].
MIGRATE = ("import os, socket, sys; e = os.environ; 'ALLOCSTACK_DB_HOST' in e and socket.create_connection("
           "(e['ALLOCSTACK_DB_HOST'], int(e['ALLOCSTACK_DB_PORT'])), 5).close(); code = int(sys.argv[1]);"
           " code or open(os.path.join(os.environ['ALLOCSTACK_VOLUME_OUT'], 'schema'), 'w').write('v7');"
           " code and print('migrate: relation users already exists', file=sys.stderr); sys.exit(code)")
#: The API: notes that it started (argv[1], a file of the project), reads the schema the migration wrote (it
#: fails if there is none), then serves on its port.
API = ("import os, socket, sys, time; open(sys.argv[1], 'w').write('started');"
       " out = os.environ['ALLOCSTACK_VOLUME_OUT']; schema = open(os.path.join(out, 'schema')).read();"
       " open(os.path.join(out, 'api-saw'), 'w').write(schema); s = socket.socket();"
       " s.bind(('127.0.0.1', int(os.environ['ALLOCSTACK_API_PORT']))); s.listen()\nwhile True: time.sleep(0.1)")
#: A worker that uses the API once and ends.
WORKER = ("import os, socket; socket.create_connection((os.environ['ALLOCSTACK_API_HOST'],"
          " int(os.environ['ALLOCSTACK_API_PORT'])), 5).close()")
#: The check: the API read the schema the init job wrote.
CHECK = ("import os, sys; saw = open(os.path.join(os.environ['ALLOCSTACK_VOLUME_OUT'], 'api-saw')).read();"
         " print(f'check: the api saw schema {saw}'); sys.exit(saw != 'v7')")


def run_init_stack(project, run: str, code: int, migrate_needs_db: bool = True):
    started = project / f"{run}-api-started"
    depends = "[db]" if migrate_needs_db else "[]"
    (project / f"config/{run}.yaml").write_text(long_running_head(run, 2, WORKER) + textwrap.dedent(f"""
        services:
          db: {{command: [{PYTHON}, -c, {json.dumps(DB)}], readiness: {{mode: tcp}}}}
          migrate: {{command: [{PYTHON}, -c, {json.dumps(MIGRATE)}, "{code}"], depends_on: {depends}}}
          api:
            command: [{PYTHON}, -c, {json.dumps(API)}, {json.dumps(str(started))}]
            readiness: {{mode: tcp}}
            depends_on: [db, migrate]
        init_jobs: [migrate]
        volumes: [out]
        verify: {{command: [{PYTHON}, -c, {json.dumps(CHECK)}]}}
    """))
    return snakemake(project, "--cores", "4", "--configfile", f"config/{run}.yaml"), started


def events_of(project, run: str) -> list[dict]:
    return [json.loads(line) for line in (project / f"results/{run}/events.jsonl").read_text().splitlines()]


def test_an_init_job_runs_before_its_dependent_which_reads_what_it_wrote(project):
    done, started = run_init_stack(project, "initok", 0)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    assert json.loads((project / "results/initok/result.json").read_text())["status"] == "success"
    assert "check: the api saw schema v7" in (project / "logs/run_check/initok.log").read_text()
    assert started.read_text() == "started"
    record = json.loads((project / "results/initok/init/migrate.json").read_text())
    assert record["status"] == "ready" and record["exitCode"] == 0
    events = events_of(project, "initok")
    init_end = next(e["t"] for e in events if e["event"] == "init-end" and e["service"] == "migrate")
    api_start = next(e["t"] for e in events if e["event"] == "service-started" and e["service"] == "api")
    assert init_end <= api_start
    assert "init job " in (project / "logs/run_init/initok/migrate.log").read_text()


def test_a_failing_init_job_stops_the_stack_before_its_dependents_start_and_names_itself(project):
    done, started = run_init_stack(project, "initfails", 1)
    output = done.stdout + done.stderr
    assert done.returncode != 0
    line = (f"allocstack: error [init-exit]: init job migrate ({sys.executable} -c) exited 1: migrate: relation users "
            "already exists: what depends on it does not start, and the stack stops")
    assert line in output, output[-3000:]
    assert not started.exists()  # the api's program never ran
    assert not (project / "results/initfails/init/migrate.json").exists()
    assert not (project / "results/initfails/result.json").exists()


def test_an_init_job_that_needs_no_service_fails_before_its_dependent_starts(project):
    done, started = run_init_stack(project, "initalone", 2, migrate_needs_db=False)
    assert done.returncode != 0
    assert "[init-exit]: init job migrate" in done.stdout + done.stderr, (done.stdout + done.stderr)[-3000:]
    assert not started.exists()


#: Without services: the init job writes the schema, each worker reads it.
SEED = "import os; open(os.path.join(os.environ['ALLOCSTACK_VOLUME_OUT'], 'schema'), 'w').write('v7')"
READER = ("import os; out = os.environ['ALLOCSTACK_VOLUME_OUT']; open(os.path.join(out, 'saw-' +"
          " os.environ['ALLOCSTACK_WORKER_ID']), 'w').write(open(os.path.join(out, 'schema')).read())")
READ_CHECK = ("import os, sys; out = os.environ['ALLOCSTACK_VOLUME_OUT'];"
              " saw = sorted(open(os.path.join(out, n)).read() for n in os.listdir(out) if n.startswith('saw-'));"
              " print(f'check: the workers saw {saw}'); sys.exit(saw != ['v7', 'v7'])")


def run_without_services(project, run: str, init: str, extra: str = ""):
    (project / f"config/{run}.yaml").write_text(long_running_head(run, 2, READER) + textwrap.dedent(f"""
        services:
          seed: {{command: [{PYTHON}, -c, {json.dumps(init)}]{extra}}}
        init_jobs: [seed]
        volumes: [out]
        verify: {{command: [{PYTHON}, -c, {json.dumps(READ_CHECK)}]}}
    """))
    return snakemake(project, "--cores", "4", "--configfile", f"config/{run}.yaml")


def test_without_services_the_workers_start_after_the_init_job(project):
    done = run_without_services(project, "initplain", SEED)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    assert "check: the workers saw ['v7', 'v7']" in (project / "logs/run_check/initplain.log").read_text()
    assert json.loads((project / "results/initplain/result.json").read_text())["status"] == "success"


def test_an_init_job_that_outlives_its_readiness_timeout_is_stopped_and_named(project):
    forever = "import time\nwhile True: time.sleep(0.1)"
    done = run_without_services(project, "initlate", forever,
                                ", readiness: {timeout: 1}, stop_grace_period: 1")
    output = done.stdout + done.stderr
    assert done.returncode != 0
    assert (f"[init-exit]: init job seed ({sys.executable} -c) killed by SIGTERM (still running after its "
            "readiness.timeout, 1 s: stopped by allocstack)") in output, output[-3000:]
    assert not list((project / "results/initlate").glob("workers/*.json"))  # no worker ran


def import_migrate_stack(project, fail: str) -> str:
    """tests/stacks/migrate, as a user brings it, with free ports, imported (FAIL_MIGRATION=fail read by the import
    as Compose reads it); the config's path."""
    shutil.copytree(ROOT / "tests/stacks/migrate", project / "stacks/migrate")
    compose = project / "stacks/migrate/compose.yaml"
    compose.write_text(compose.read_text().replace("15432", str(free_port())).replace("18080", str(free_port())))
    done = run_script("import_compose.py", "stacks/migrate/compose.yaml", "--output", "config/migrate.yaml",
                      cwd=project, env={"FAIL_MIGRATION": fail})
    assert done.returncode == 0 and "0 gap(s)" in done.stdout, done.stdout + done.stderr
    assert "migrate: an init job (others wait for it with service_completed_successfully)" in done.stdout + done.stderr
    return "config/migrate.yaml"


def test_an_imported_compose_stack_runs_its_migration_before_the_api(project):
    config = import_migrate_stack(project, "0")
    written = yaml.safe_load((project / config).read_text())
    assert written["init_jobs"] == ["migrate"] and written["workers"] == 2
    assert written["verify"]["command"][1:] == ["/srv/check.py", "--api", "http://${ALLOCSTACK_API_HOST}:"
                                                + written["services"]["api"]["port"].__str__()]
    done = snakemake(project, "--cores", "4", "--configfile", config)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    assert "check: the api serves schema v7" in (project / "logs/run_check/migrate.log").read_text()
    assert "migrate: schema v7 applied" in (project / "logs/run_init/migrate/migrate.log").read_text()
    marker = json.loads((project / "results/migrate/result.json").read_text())
    assert marker["status"] == "success" and marker["services"] == ["api", "db"]


def test_an_imported_stack_whose_migration_fails_stops_before_the_api_starts(project):
    config = import_migrate_stack(project, "1")
    done = snakemake(project, "--cores", "4", "--configfile", config)
    output = done.stdout + done.stderr
    assert done.returncode != 0
    program = project / "stacks/migrate/app/migrate.py"  # /srv/migrate.py, where no image runs it
    line = (f'allocstack: error [init-exit]: init job migrate (python3 {program}) exited 1: migrate: relation "users" '
            "already exists: what depends on it does not start, and the stack stops")
    assert line in output, output[-3000:]
    assert not (project / "stacks/migrate/out/api-started").exists()  # the api never started
    assert not (project / "results/migrate/result.json").exists()
