"""Restart policies end to end (issue 25, point 3): real Snakemake runs (``--cores 4``, no images, no cluster),
real processes, a real ``kill -9`` and real TCP on loopback.

The stack: a service ``kv`` (a TCP server that answers ``pong N``, N its start) with a restart policy; one
long-running worker that talks to it, kills it with SIGKILL (its pid from the volume) and waits for it to
answer again on the same port; a check that reads what they wrote in the volume.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from real_parts import require_slurm
from workflow_helpers import assert_run_failed, snakemake

PYTHON = json.dumps(sys.executable)
#: The service: notes "pid port" in the volume at each start (a line each), says so on stderr, answers every
#: connection with its start's number.
KV = ("import os, socket, sys; e = os.environ; out = e['ALLOCSTACK_VOLUME_OUT']; port = int(e['ALLOCSTACK_KV_PORT']);"
      " starts = os.path.join(out, 'kv.starts'); server = socket.create_server(('127.0.0.1', port));"
      " open(starts, 'a').write(f'{os.getpid()} {port}\\n'); n = len(open(starts).read().splitlines());"
      " print(f'kv: serving on {port} (start {n})', file=sys.stderr, flush=True)\n"
      "while True:\n"
      "    conn, _ = server.accept(); conn.sendall(f'pong {n}\\n'.encode()); conn.close()")
#: The worker: for each start 1..argv[1], waits for kv's answer from that start, then kills it with SIGKILL (its pid
#: from the volume); then (argv[2] == 'wait') waits for the next start's answer, on the same port. Notes what it saw.
WORKER = ("import os, signal, socket, sys, time; e = os.environ; out = e['ALLOCSTACK_VOLUME_OUT'];"
          " address = (e['ALLOCSTACK_KV_HOST'], int(e['ALLOCSTACK_KV_PORT'])); seen = []\n"
          "def answer_of(start):\n"
          "    for _ in range(1200):\n"
          "        try:\n"
          "            with socket.create_connection(address, timeout=5) as c: answer = c.makefile().readline().strip()\n"
          "            if answer == f'pong {start}': return answer\n"
          "        except OSError: pass\n"
          "        time.sleep(0.05)\n"
          "    sys.exit(f'worker: kv start {start} did not answer')\n"
          "kills = int(sys.argv[1])\n"
          "for start in range(1, kills + 1):\n"
          "    seen.append(answer_of(start))\n"
          "    pid = int(open(os.path.join(out, 'kv.starts')).read().splitlines()[start - 1].split()[0])\n"
          "    os.kill(pid, signal.SIGKILL)\n"
          "if sys.argv[2] == 'wait': seen.append(answer_of(kills + 1))\n"
          "open(os.path.join(out, 'worker'), 'w').write(', '.join(seen)); print('worker: saw', seen, file=sys.stderr)")
#: The check: kv started as often as argv[1] says, on one port; the worker saw each start.
CHECK = ("import os, sys; out = os.environ['ALLOCSTACK_VOLUME_OUT'];"
         " starts = [line.split() for line in open(os.path.join(out, 'kv.starts')).read().splitlines()];"
         " seen = open(os.path.join(out, 'worker')).read();"
         " print(f'check: {len(starts)} starts on ports {sorted({p for _, p in starts})}; worker saw {seen}');"
         " sys.exit(len(starts) != int(sys.argv[1]) or len({p for _, p in starts}) != 1)")


def run_stack(project, run: str, restart: str, kills: int, wait: bool, starts: int, *how: str):
    (project / f"config/{run}.yaml").write_text(textwrap.dedent(f"""
        run: {run}
        tasks: null
        expected: null
        workers: 1
        worker: {{mode: long-running, command: [{PYTHON}, -c, {json.dumps(WORKER)}, "{kills}",
                  "{'wait' if wait else 'no'}"]}}
        services:
          kv: {{command: [{PYTHON}, -c, {json.dumps(KV)}], readiness: {{mode: tcp}}, restart: {restart}}}
        volumes: [out]
        verify: {{command: [{PYTHON}, -c, {json.dumps(CHECK)}, "{starts}"]}}
    """))
    return snakemake(project, *(how or ("--cores", "4")), "--configfile", f"config/{run}.yaml", timeout=600)


def events_of(project, run: str) -> list[dict]:
    return [json.loads(line) for line in (project / f"results/{run}/events.jsonl").read_text().splitlines()]


def test_a_service_killed_mid_run_is_restarted_on_its_port_and_the_run_verifies(project):
    done = run_stack(project, "restarted", "{condition: on-failure, max_attempts: 2, delay: 0.2}", kills=1, wait=True,
                     starts=2)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    assert json.loads((project / "results/restarted/result.json").read_text())["status"] == "success"
    check = (project / "logs/run_check/restarted.log").read_text()
    assert re.search(r"check: 2 starts on ports \['\d+'\]; worker saw pong 1, pong 2", check), check
    restarts = [e for e in events_of(project, "restarted") if e["event"] == "service-restart"]
    assert [(e["service"], e["attempt"], e["exitCode"]) for e in restarts] == [("kv", 1, -9)]
    assert restarts[0]["how"].startswith("killed by SIGKILL: kv: serving on ")
    log = (project / "logs/serve_service/restarted/kv.log").read_text()
    assert "service kv: killed by SIGKILL: kv: serving on" in log
    assert "starting it again in 0.2 s (restart 1 of at most 2; restart: on-failure" in log
    services = json.loads((project / "results/restarted/services.json").read_text())["services"]
    assert services["kv"]["status"] == "stopped" and services["kv"]["restarts"] == 1
    assert "services    kv stopped (restarted 1 time)" in output  # the end-of-run summary
    assert ">restart kv (1)</text>" in (project / "results/restarted/timeline.svg").read_text()


def test_past_max_attempts_the_run_fails_naming_the_service_and_its_last_line(project):
    done = run_stack(project, "exhausted", "{condition: on-failure, max_attempts: 1}", kills=2, wait=False, starts=2)
    output = done.stdout + done.stderr
    assert done.returncode != 0
    line = re.search(r"allocstack: error \[service-exit\]: service kv ended by itself before the stack was done "
                     r"\(killed by SIGKILL: kv: serving on (\d+) \(start 2\); restarted 1 time \(restart: on-failure, "
                     r"at most 1 restart, 0 s apart\): not restarted again\)", output)
    assert line, output[-4000:]
    assert not (project / "results/exhausted/result.json").exists()


def test_restart_any_does_not_keep_the_stack_alive_after_verification(project):
    done = run_stack(project, "always", "{condition: any}", kills=0, wait=True, starts=1)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    assert json.loads((project / "results/always/result.json").read_text())["status"] == "success"
    assert not [e for e in events_of(project, "always") if e["event"] == "service-restart"]
    services = json.loads((project / "results/always/services.json").read_text())["services"]
    assert services["kv"]["status"] == "stopped" and services["kv"]["restarts"] == 0
    # and the project fixture finds no process of the run left once snakemake returned


#: A worker replica SIGKILLed on its first start (it kills itself: to its supervisor, a kill from outside); its
#: second start does the work.
DIES_ONCE = ("import os, signal, sys; e = os.environ; out = e['ALLOCSTACK_VOLUME_OUT']; w = e['ALLOCSTACK_WORKER_ID'];"
             " first = not os.path.exists(os.path.join(out, 'tried-' + w)); open(os.path.join(out, 'tried-' + w), 'a')"
             ".write('x'); print(f'{w}: start', file=sys.stderr, flush=True);"
             " first and os.kill(os.getpid(), signal.SIGKILL); open(os.path.join(out, 'done-' + w), 'w').write('done')")
CHECK_TRIES = ("import os, sys; out = os.environ['ALLOCSTACK_VOLUME_OUT'];"
               " tries = {n: len(open(os.path.join(out, n)).read()) for n in sorted(os.listdir(out)) if n.startswith('tried-')};"
               " done = sorted(n for n in os.listdir(out) if n.startswith('done-'));"
               " print(f'check: tries {tries}, done {done}'); sys.exit(done != ['done-worker-01', 'done-worker-02'])")


def run_restarting_replicas(project: Path, run: str, workers: int, program: str) -> subprocess.CompletedProcess:
    """Run ``run``: no tasks, ``workers`` long-running workers that run the Python ``program`` and are restarted
    once on failure, then the check that counts their tries."""
    (project / f"config/{run}.yaml").write_text(textwrap.dedent(f"""
        run: {run}
        tasks: null
        expected: null
        workers: {workers}
        worker: {{mode: long-running, command: [{PYTHON}, -c, {json.dumps(program)}],
                  restart: {{condition: on-failure, max_attempts: 1}}}}
        volumes: [out]
        verify: {{command: [{PYTHON}, -c, {json.dumps(CHECK_TRIES)}]}}
    """))
    return snakemake(project, "--cores", "4", "--configfile", f"config/{run}.yaml")


def test_a_worker_replica_killed_from_outside_is_restarted_in_its_step_and_the_run_verifies(project):
    done = run_restarting_replicas(project, "replicas", 2, DIES_ONCE)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    assert json.loads((project / "results/replicas/result.json").read_text())["status"] == "success"
    assert "check: tries {'tried-worker-01': 2, 'tried-worker-02': 2}" in \
        (project / "logs/run_check/replicas.log").read_text()
    restarts = sorted((e["worker"], e["attempt"], e["exitCode"]) for e in events_of(project, "replicas")
                      if e["event"] == "worker-restart")
    assert restarts == [("worker-01", 1, -9), ("worker-02", 1, -9)]
    record = json.loads((project / "results/replicas/workers/worker-01.json").read_text())
    assert (record["status"], record["restarts"]) == ("done", 1)
    assert "workers     2: worker-01 exited 0 (restarted 1 time), worker-02 exited 0 (restarted 1 time)" in output


def test_a_worker_replica_past_max_attempts_fails_the_run_naming_it_and_its_last_line(project):
    dies = DIES_ONCE.replace("first and os.kill", "os.kill")  # killed at every start
    done = run_restarting_replicas(project, "replicadies", 1, dies)
    line = (f"allocstack: error [worker-exit]: worker-01 ({sys.executable} -c) killed by SIGKILL: worker-01: start; "
            "restarted 1 time (restart: on-failure, at most 1 restart, 0 s apart): not restarted again")
    assert_run_failed(project, "replicadies", done, line)


#: A daemon worker (never ends by itself; exits 0 on SIGTERM), a producer as main, a check of the producer's note.
DAEMON = ("import os, signal, sys, time; out = os.environ['ALLOCSTACK_VOLUME_OUT'];"
          " signal.signal(signal.SIGTERM, lambda *_: sys.exit(0));"
          " open(os.path.join(out, 'up-' + os.environ['ALLOCSTACK_WORKER_ID']), 'a').write('x')\n"
          "while True: time.sleep(0.1)")
PRODUCER = ("import os, time; out = os.environ['ALLOCSTACK_VOLUME_OUT'];"
            " [time.sleep(0.05) for _ in range(1200) if len([n for n in os.listdir(out) if n.startswith('up-')]) < 2];"
            " open(os.path.join(out, 'produced'), 'w').write('42')")
CHECK_MAIN = ("import os, sys; out = os.environ['ALLOCSTACK_VOLUME_OUT'];"
              " ups = {n: open(os.path.join(out, n)).read() for n in sorted(os.listdir(out)) if n.startswith('up-')};"
              " print(f'check: produced {open(os.path.join(out, \"produced\")).read()}, started {ups}')")


def test_restart_any_never_keeps_the_stack_alive_after_main_ended(project):
    (project / "config/mainstop.yaml").write_text(textwrap.dedent(f"""
        run: mainstop
        tasks: null
        expected: null
        workers: 2
        worker: {{mode: long-running, command: [{PYTHON}, -c, {json.dumps(DAEMON)}], restart: {{condition: any}}}}
        services:
          kv: {{command: [{PYTHON}, -c, {json.dumps(KV)}], readiness: {{mode: tcp}}, restart: {{condition: any}}}}
          producer: {{command: [{PYTHON}, -c, {json.dumps(PRODUCER)}], depends_on: [kv]}}
        main: producer
        volumes: [out]
        verify: {{command: [{PYTHON}, -c, {json.dumps(CHECK_MAIN)}]}}
    """))
    done = snakemake(project, "--cores", "4", "--configfile", "config/mainstop.yaml")
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    assert json.loads((project / "results/mainstop/result.json").read_text())["status"] == "success"
    # each daemon started once: stopped when main ended, never started again
    assert "check: produced 42, started {'up-worker-01': 'x', 'up-worker-02': 'x'}" in \
        (project / "logs/run_check/mainstop.log").read_text()
    events = events_of(project, "mainstop")
    assert not [e for e in events if e["event"] in ("service-restart", "worker-restart")]
    assert sorted(e["status"] for e in events if e["event"] == "worker-end") == ["stopped", "stopped"]


SLURM = ["--profile", "profiles/slurm", "--default-resources", "slurm_account=allocstack", "slurm_partition=debug",
         "mem_mb=300", "runtime=10", "--config", "image=null"]


@pytest.mark.slurm
def test_under_slurm_the_service_is_restarted_inside_its_own_job_step(project):
    """The same kill -9 under the Slurm profile: kv is started again by its supervisor inside its job step (one step
    kv in sacct, COMPLETED), on the same port, and the run verifies."""
    require_slurm()
    done = run_stack(project, "slurmrestart", "{condition: on-failure, max_attempts: 2}", 1, True, 2, *SLURM)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    assert json.loads((project / "results/slurmrestart/result.json").read_text())["status"] == "success"
    jobs = re.findall(r"submitted with SLURM jobid (\d+)", output)
    assert len(jobs) == 1, output[-4000:]
    restarts = [e for e in events_of(project, "slurmrestart") if e["event"] == "service-restart"]
    assert [(e["service"], e["attempt"], e["exitCode"]) for e in restarts] == [("kv", 1, -9)]
    for _ in range(20):  # accounting records a step when it ends
        steps = subprocess.run(["sacct", "-j", jobs[0], "--noheader", "--parsable2", "--format=JobName,State"],
                               capture_output=True, text=True, timeout=30, check=False).stdout.split()
        kv = [line for line in steps if line.startswith("kv|")]
        if kv:
            break
        time.sleep(0.5)
    assert kv == ["kv|COMPLETED"], steps
