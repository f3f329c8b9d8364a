"""The stack ends when its main program ends (issue 25, point 1; Compose's --exit-code-from): config `main` runs
once beside daemon workers; its exit 0 stops them (SIGTERM, their grace, SIGKILL) and the check runs; another exit
code fails the run naming it. Real Snakemake runs, real processes and signals."""

from __future__ import annotations

import json
import sys
import textwrap

from workflow_helpers import snakemake

PYTHON = json.dumps(sys.executable)
#: A daemon worker: never ends by itself; on SIGTERM it notes so in the volume and exits 0 (as celery and rq do).
DAEMON = ("import os, signal, sys, time; e = os.environ; out = e['ALLOCSTACK_VOLUME_OUT'];"
          " signal.signal(signal.SIGTERM, lambda *_: (open(os.path.join(out, e['ALLOCSTACK_WORKER_ID']), 'w')"
          ".write('stopped'), sys.exit(0)));"
          " open(os.path.join(out, 'up-' + e['ALLOCSTACK_WORKER_ID']), 'w').close()\nwhile True: time.sleep(0.1)")
#: A daemon that ignores SIGTERM.
STUBBORN = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN)\nwhile True: time.sleep(0.1)"
#: The producer: waits until every worker is up, writes its output, exits with argv[1].
PRODUCER = ("import os, sys, time; out = os.environ['ALLOCSTACK_VOLUME_OUT'];"
            " [time.sleep(0.05) for _ in range(400) if len([n for n in os.listdir(out) if n.startswith('up-')]) < 2];"
            " open(os.path.join(out, 'produced'), 'w').write('42'); print('producer: 42 jobs done');"
            " code = int(sys.argv[1]); code and print('producer: failing on purpose', file=sys.stderr); sys.exit(code)")
#: The check: the producer's output, and each worker's note that it was stopped.
CHECK = ("import os, sys; out = os.environ['ALLOCSTACK_VOLUME_OUT'];"
         " notes = sorted(n for n in os.listdir(out) if n.startswith('worker-'));"
         " print(f'check: produced {open(os.path.join(out, \"produced\")).read()}, stopped {notes}');"
         " sys.exit(notes != ['worker-01', 'worker-02'])")


def run_main_stack(project, run: str, worker: str, code: int, check: bool = True, grace: float = 10):
    verify = f"verify: {{command: [{PYTHON}, -c, {json.dumps(CHECK)}]}}" if check else ""
    (project / f"config/{run}.yaml").write_text(textwrap.dedent(f"""
        run: {run}
        tasks: null
        expected: null
        workers: 2
        worker: {{mode: long-running, command: [{PYTHON}, -c, {json.dumps(worker)}], stop_grace_period: {grace}}}
        services:
          producer: {{command: [{PYTHON}, -c, {json.dumps(PRODUCER)}, "{code}"]}}
        main: producer
        volumes: [out]
        {verify}
    """))
    return snakemake(project, "--cores", "4", "--configfile", f"config/{run}.yaml")


def events_of(project, run: str) -> list[dict]:
    return [json.loads(line) for line in (project / f"results/{run}/events.jsonl").read_text().splitlines()]


def test_the_main_program_ends_the_stack_its_daemon_workers_are_stopped_and_the_run_verified(project):
    done = run_main_stack(project, "mainstack", DAEMON, 0)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    assert json.loads((project / "results/mainstack/result.json").read_text())["status"] == "success"
    assert "producer: 42 jobs done" in (project / "logs/run_main/mainstack.log").read_text()
    assert "check: produced 42, stopped ['worker-01', 'worker-02']" in \
        (project / "logs/run_check/mainstack.log").read_text()
    records = [json.loads((project / f"results/mainstack/workers/worker-0{i}.json").read_text()) for i in (1, 2)]
    assert [record["status"] for record in records] == ["stopped", "stopped"]
    events = events_of(project, "mainstack")
    main_end = next(e["t"] for e in events if e["event"] == "main-end")
    worker_ends = [e["t"] for e in events if e["event"] == "worker-end"]
    check_start = next(e["t"] for e in events if e["event"] == "check-start")
    assert len(worker_ends) == 2 and main_end <= min(worker_ends) and max(worker_ends) <= check_start
    assert max(worker_ends) - main_end < 5  # stopped at once (SIGTERM), not at a time limit


def test_without_a_check_the_main_programs_exit_0_is_the_verdict(project):
    done = run_main_stack(project, "mainonly", DAEMON, 0, check=False)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    assert json.loads((project / "results/mainonly/result.json").read_text())["status"] == "success"


def test_a_failing_main_program_fails_the_run_naming_its_exit_code(project):
    """As ``docker compose up --exit-code-from producer``: the command exits with the producer's own code."""
    done = run_main_stack(project, "mainfails", DAEMON, 3)
    output = done.stdout + done.stderr
    assert done.returncode == 3, output[-3000:]
    line = (f"allocstack: error [main-exit]: main producer ({sys.executable} -c) exited 3: producer: failing on "
            "purpose: the stack ended with it, and its exit code 3 fails the run")
    assert line in output, output[-3000:]
    assert not (project / "results/mainfails/result.json").exists()


def test_a_worker_that_ignores_sigterm_is_killed_after_its_grace_and_fails_the_run(project):
    done = run_main_stack(project, "stubborn", STUBBORN, 0, grace=1)
    output = done.stdout + done.stderr
    assert done.returncode != 0
    assert "did not stop within its stop_grace_period (1 s) after main producer ended: killed" in output, \
        output[-3000:]
    assert not (project / "results/stubborn/result.json").exists()
