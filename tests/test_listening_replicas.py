"""Replicas of a service that listens (issue 25 point 4b: ``services.<name>.replicas`` with a port, Compose
``deploy.replicas`` / ``--scale web=3`` on a web server): three replicas of one HTTP server, each bound to 0.0.0.0 on
the SAME port (8000) as each Compose replica is in its own container, each in a network of its own; the stack reaches
them by the service's name and port through one front, in turn; each replica reaches the service it depends on
(``store:8100``) by its name from its own network; every replica has its own gate, and the worker starts only once
all three passed. A real Snakemake run, real processes, real namespaces and HTTP on their loopbacks.

Under the Slurm profile and in images: tests/test_public_stacks.py serves testdrivenio/fastapi-celery with its API
scaled to two replicas (``--scale web=2``), each uvicorn in its Apptainer image in a network of its own.
"""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

from workflow_helpers import snakemake

PYTHON = json.dumps(sys.executable)
#: The store the web servers depend on: one answer, "stored", on 127.0.0.1:8100 of the stack's network.
STORE = ("import http.server as h\n"
         "class S(h.BaseHTTPRequestHandler):\n"
         "    def do_GET(self): self.send_response(200); self.end_headers(); self.wfile.write(b'stored')\n"
         "h.HTTPServer(('127.0.0.1', 8100), S).serve_forever()")
#: A web server replica: 0.0.0.0:8000 (every replica the same port); /health for its gate; / answers its replica
#: number and what it got from the store by the store's name.
WEB = ("import http.server as h, json, os, urllib.request\n"
       "k = os.environ['ALLOCSTACK_REPLICA']\n"
       "class W(h.BaseHTTPRequestHandler):\n"
       "    def do_GET(self):\n"
       "        body = json.dumps({'status': 'ok'}) if self.path == '/health' else"
       " k + ':' + urllib.request.urlopen('http://store:8100/', timeout=10).read().decode()\n"
       "        self.send_response(200); self.end_headers(); self.wfile.write(body.encode())\n"
       "h.HTTPServer(('0.0.0.0', 8000), W).serve_forever()")
#: The worker: twelve requests to web:8000, their answers into the volume.
WORKER = ("import os, urllib.request\n"
          "answers = [urllib.request.urlopen('http://web:8000/', timeout=10).read().decode() for _ in range(12)]\n"
          "open(os.path.join(os.environ['ALLOCSTACK_VOLUME_DATA'], 'answers'), 'w').write(' '.join(answers))")
#: The check: every replica answered, four times each (the front takes them in turn), each with the store's word.
CHECK = ("import collections, os, sys\n"
         "answers = open(os.path.join(os.environ['ALLOCSTACK_VOLUME_DATA'], 'answers')).read().split()\n"
         "print('check:', sorted(collections.Counter(answers).items()))\n"
         "sys.exit(collections.Counter(answers) != {f'{k}:stored': 4 for k in (1, 2, 3)})")


def stack(run: str) -> str:
    return textwrap.dedent(f"""
        run: {run}
        tasks: null
        expected: null
        workers: 1
        volumes: [data]
        network: {{isolation: private}}
        worker: {{mode: long-running, command: [{PYTHON}, -c, {json.dumps(WORKER)}]}}
        services:
          store:
            command: [{PYTHON}, -c, {json.dumps(STORE)}]
            port: 8100
            readiness: {{mode: tcp}}
          web:
            command: [{PYTHON}, -c, {json.dumps(WEB)}]
            port: 8000
            depends_on: [store]
            readiness: {{mode: http, path: /health, expect: {{status: ok}}}}
            replicas: 3
        verify:
          command: [{PYTHON}, -c, {json.dumps(CHECK)}]
    """)


REPLICAS = ["web", "web-replica-2", "web-replica-3"]


def assert_each_replica_answered(project: Path, run: str) -> None:
    assert json.loads((project / f"results/{run}/result.json").read_text())["status"] == "success"
    assert "check: [('1:stored', 4), ('2:stored', 4), ('3:stored', 4)]" in (
        project / f"logs/run_check/{run}.log").read_text()
    ends = json.loads((project / f"results/{run}/services.json").read_text())["services"]
    assert {name: ends[name]["status"] for name in REPLICAS} == dict.fromkeys(REPLICAS, "stopped")
    for name in REPLICAS:  # each its own gate, passed, in its own network
        gate = json.loads((project / f"results/{run}/services/{name}-readiness.json").read_text())
        assert gate["status"] == "ready", gate
    network = (project / f"logs/stack_network/{run}.log").read_text()
    for name in REPLICAS:
        assert f"replica {name}: holder" in network, network


def test_three_replicas_on_one_port_each_in_its_own_network_answer_in_turn(project):
    (project / "config/web.yaml").write_text(stack("webreplicas"))
    done = snakemake(project, "--cores", "4", "--configfile", "config/web.yaml")
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-3000:]
    assert_each_replica_answered(project, "webreplicas")
