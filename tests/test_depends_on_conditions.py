"""depends_on's conditions as Compose has them (issue 25, point 4b): a dependent that waits for a service with
``service_started`` (Compose's short form) starts once that service's program has started, before its gate passes;
one that waits with ``service_healthy`` starts only after the gate. A real Snakemake run, real processes on loopback.
"""

from __future__ import annotations

import json
import sys
import textwrap

from workflow_helpers import long_running_head, snakemake

PYTHON = json.dumps(sys.executable)
#: How long the database takes before its port accepts (its tcp gate passes only then): generous, the machine is
#: loaded; the order of events is asserted, not seconds.
OPENS_AFTER = 6
#: The database: notes when it started, opens its port only OPENS_AFTER s later (notes when), then serves.
DB = ("import os, socket, sys, time; t = open(sys.argv[1], 'w'); t.write(f'{time.time()!r}\\n'); t.flush();"
      " time.sleep(float(sys.argv[2])); s = socket.socket();"
      " s.bind(('127.0.0.1', int(os.environ['ALLOCSTACK_DB_PORT']))); s.listen(); t.write(f'{time.time()!r}\\n');"
      " t.close()\nwhile True: time.sleep(0.1)")
#: A dependent: notes when its program started and the database's port it was given, then serves on its own port
#: (variable argv[2]; its tcp gate is the workers' sign that it is up).
DEPENDENT = ("import json, os, socket, sys, time; open(sys.argv[1], 'w').write(json.dumps({'t': time.time(),"
             " 'port': os.environ['ALLOCSTACK_DB_PORT']})); s = socket.socket();"
             " s.bind(('127.0.0.1', int(os.environ[sys.argv[2]]))); s.listen()\nwhile True: time.sleep(0.1)")
#: A worker: reaches the database once.
WORKER = ("import os, socket; socket.create_connection((os.environ['ALLOCSTACK_DB_HOST'],"
          " int(os.environ['ALLOCSTACK_DB_PORT'])), 5).close()")
#: The check: the service_started dependent started before the database's port opened, the service_healthy one
#: after; both were given the database's port.
CHECK = ("import json, os, sys; db = [float(line) for line in open(sys.argv[1]).read().split()];"
         " early, late = (json.load(open(path)) for path in sys.argv[2:4]); port = os.environ['ALLOCSTACK_DB_PORT'];"
         " print(f'check: db started {db[0]:.3f}, listening {db[1]:.3f}; early {early[\"t\"]:.3f}, late {late[\"t\"]:.3f}');"
         " sys.exit(not (db[0] <= early['t'] < db[1] <= late['t'] and early['port'] == late['port'] == port))")


def test_service_started_starts_before_the_gate_passes_and_service_healthy_after(project):
    db, early, late = (project / name for name in ("db-times", "early-started.json", "late-started.json"))
    (project / "config/started.yaml").write_text(long_running_head("started", 1, WORKER) + textwrap.dedent(f"""
        services:
          db:
            command: [{PYTHON}, -c, {json.dumps(DB)}, {json.dumps(str(db))}, "{OPENS_AFTER}"]
            readiness: {{mode: tcp, timeout: 120}}
          early:
            command: [{PYTHON}, -c, {json.dumps(DEPENDENT)}, {json.dumps(str(early))}, ALLOCSTACK_EARLY_PORT]
            readiness: {{mode: tcp}}
            depends_on: {{db: service_started}}
          late:
            command: [{PYTHON}, -c, {json.dumps(DEPENDENT)}, {json.dumps(str(late))}, ALLOCSTACK_LATE_PORT]
            readiness: {{mode: tcp}}
            depends_on: {{db: service_healthy}}
        verify:
          command: [{PYTHON}, -c, {json.dumps(CHECK)}, {json.dumps(str(db))}, {json.dumps(str(early))},
                    {json.dumps(str(late))}]
    """))
    done = snakemake(project, "--cores", "4", "--configfile", "config/started.yaml")
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-3000:]
    assert json.loads((project / "results/started/result.json").read_text())["status"] == "success"
    db_started, db_listening = (float(line) for line in db.read_text().split())
    early_started, late_started = json.loads(early.read_text())["t"], json.loads(late.read_text())["t"]
    assert db_started <= early_started < db_listening <= late_started
    gate = json.loads((project / "results/started/services/db-readiness.json").read_text())
    assert gate["status"] == "ready"
    assert "check: db started" in (project / "logs/run_check/started.log").read_text()
    early_log = (project / "logs/serve_service/started/early.log").read_text()
    late_log = (project / "logs/serve_service/started/late.log").read_text()
    assert "readiness gate" not in early_log and "waiting for the readiness gate" in late_log
