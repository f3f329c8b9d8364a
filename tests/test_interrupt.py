"""Interrupted is not failed: Ctrl-C ends a run with INTERRUPTED, what was done and the one command that
resumes it; no job's error, no traceback, exit 130, nothing left running; the same command resumes.

Real Snakemake runs and real signals: SIGINT to the process group (as a terminal sends it; the real terminal
is in test_terminal.py), SIGINT to Snakemake's pid alone (``kill -INT PID``: its jobs get nothing from the
terminal), a second one, your own stack (services and long-running workers), and allocstack used as a
Snakemake module (no rerun-incomplete there). The handler itself with stand-ins for Snakemake
(allocstack/status/interrupt.py).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from test_faults import journaled, slow_run, wait_for

from conftest import pids_mentioning, write_json
from workflow_helpers import MODULE_USER, SNAKEMAKE, copy_project, snakemake

#: What Snakemake says about the jobs the interruption ended, and never may after Ctrl-C.
NOISE = ("Error in rule", "RuleException", "CalledProcessError", "Traceback", "WorkflowError", "Removing output files",
         "Exiting because a job execution failed", "FAILED")


def started(project: Path, *args: str) -> subprocess.Popen:
    """Snakemake in its own process group, as a terminal starts a command (no ``timeout`` around it: it would pass
    a SIGINT to its group on to Snakemake a second time). Each test ends it within its own bounds."""
    return subprocess.Popen([SNAKEMAKE, *args], cwd=project, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True, env={**os.environ, "TMPDIR": str(project / "tmp")})


def sigint(pid: int) -> None:
    """Ctrl-C to Snakemake alone (its jobs hear only what allocstack passes on)."""
    os.kill(pid, signal.SIGINT)


def sigint_group(pid: int) -> None:
    """Ctrl-C to Snakemake's process group, as a terminal sends it."""
    os.killpg(pid, signal.SIGINT)


def interrupted(project: Path, args: tuple[str, ...], ready: Callable[[], bool],
                interrupt: Callable[[int], None] = sigint) -> tuple[str, int]:
    """Start Snakemake (:func:`started`), ``interrupt`` it once ``ready()``, and return its output and exit code
    (killed with its group should it not end within 120 s)."""
    proc = started(project, *args)
    try:
        wait_for(ready)
        interrupt(proc.pid)
        output, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    return output, proc.returncode


def assert_interrupted(output: str, code: int, run: str, command: str, by: str = "Ctrl-C") -> None:
    assert code == {"Ctrl-C": 130, "SIGTERM": 143}[by], output[-4000:]
    lines = output.splitlines()
    assert (f"allocstack: interrupted ({by}): stopping the run's jobs; what is done stays done, and the same command "
            "resumes") in lines, output[-3000:]
    verdict = next(line for line in lines if line.startswith(f"allocstack: run {run} "))
    assert verdict.startswith(f"allocstack: run {run} INTERRUPTED"), verdict
    # the command as typed; its program by name alone where PATH finds that very program (common.smk this_command)
    assert any(line in (f"  resume      {command}", f"  resume      snakemake {command.split(' ', 1)[1]}")
               for line in lines), output[-2000:]
    for noise in NOISE:
        assert noise not in output, (noise, output[-4000:])


def nothing_left(project: Path) -> None:
    """No process of the run is left once Snakemake exited (timeout's children included)."""
    left = pids_mentioning(str(project))
    assert not left, [Path(f"/proc/{pid}/cmdline").read_bytes() for pid in left]


@pytest.mark.parametrize("to", ["group", "snakemake alone", "twice", "sigterm alone"])
def test_an_interrupted_run_says_interrupted_and_the_same_command_resumes(project, to):
    """The process group (a terminal's Ctrl-C), Snakemake's pid alone (its jobs hear only what allocstack passes
    on), a second SIGINT while the first one's stop is under way, and SIGTERM to Snakemake's pid alone (``kill
    PID``: Snakemake's own graceful stop would wait for jobs that never end)."""
    config = slow_run(project, "stop", tasks=24, seconds=0.3)
    args = ("--cores", "4", "--configfile", str(config))

    def interrupt(pid: int) -> None:
        if to == "group":
            os.killpg(pid, signal.SIGINT)
        elif to == "sigterm alone":
            os.kill(pid, signal.SIGTERM)
        else:
            os.kill(pid, signal.SIGINT)
            if to == "twice":
                time.sleep(0.2)
                os.kill(pid, signal.SIGINT)

    output, code = interrupted(project, args, lambda: journaled(project, "stop") >= 4, interrupt)
    assert_interrupted(output, code, "stop", f"{SNAKEMAKE} {' '.join(args)}",
                       "SIGTERM" if to == "sigterm alone" else "Ctrl-C")
    if to == "twice":
        assert "allocstack: interrupted already: waiting for the run's jobs to stop" in output
    nothing_left(project)
    done = journaled(project, "stop")
    assert (f"allocstack: run stop INTERRUPTED: {done} of 24 tasks done, kept in the journal "
            f"(state/stop/journal.jsonl); {24 - done} to do") in output
    assert not (project / "results/stop/result.json").exists()
    logs = "".join(path.read_text() for path in (project / "logs").rglob("*.log"))
    assert "Traceback" not in logs

    rerun = snakemake(project, *args)
    assert rerun.returncode == 0, (rerun.stdout + rerun.stderr)[-3000:]
    assert json.loads((project / "results/stop/coordinator.json").read_text())["restored"] == done


OWN_STACK = """\
run: own
tasks: null
expected: null
workers: 2
services:
  web:
    command: [python3, -m, http.server, --bind, 127.0.0.1, "${ALLOCSTACK_WEB_PORT}"]
    readiness: {mode: tcp}
worker:
  mode: long-running
  command: [python3, -c, "import time; time.sleep(120)"]
verify:
  command: [python3, -c, "pass"]
"""


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["sigint", "sigterm"])
def test_your_own_stack_is_interrupted_too(project, signum):
    """Services of yours and long-running workers (no built-in coordinator): SIGINT or SIGTERM to Snakemake alone
    stops them all, and the run says INTERRUPTED; the summary names no task count it does not have."""
    # The workers' command names this test's project: the search for them is machine-wide, and other tests run
    # `time.sleep(120)` side by side (one such match once had Snakemake interrupted before the stack started).
    marker = str(project / "own-worker")
    (project / "config/own.yaml").write_text(OWN_STACK.replace(
        'command: [python3, -c, "import time; time.sleep(120)"]',
        f'command: [python3, -c, "import time; time.sleep(120)", "{marker}"]'))
    args = ("--cores", "4", "--configfile", "config/own.yaml")
    output, code = interrupted(project, args, lambda: len(pids_mentioning(marker)) >= 2,
                                lambda pid: os.kill(pid, signum))
    assert_interrupted(output, code, "own", f"{SNAKEMAKE} {' '.join(args)}",
                       "SIGTERM" if signum == signal.SIGTERM else "Ctrl-C")
    assert "allocstack: run own INTERRUPTED: the stack was stopped" in output
    nothing_left(project)


def test_your_own_stack_interrupted_then_the_same_command_runs_it_again_to_verified(project):
    """Ctrl-C in the middle of your own stack (a service, two long-running workers, your check), then the same
    command: the stack runs again from its start, as an interrupted `docker compose up` does, and verifies."""
    seconds = project / "inputs/worker-seconds.txt"  # how long each worker works: a file the rerun finds changed
    seconds.write_text("120")
    (project / "config/again.yaml").write_text(OWN_STACK.replace("run: own", "run: again").replace(
        'command: [python3, -c, "import time; time.sleep(120)"]',
        f'command: [python3, -c, "import sys, time; time.sleep(float(open(sys.argv[1]).read()))", "{seconds}"]'))
    args = ("--cores", "4", "--configfile", "config/again.yaml")
    output, code = interrupted(project, args, lambda: len(pids_mentioning(str(seconds))) >= 2)  # both workers at work
    assert_interrupted(output, code, "again", f"{SNAKEMAKE} {' '.join(args)}")
    nothing_left(project)
    assert not (project / "results/again/result.json").exists()
    seconds.write_text("0.5")
    again = snakemake(project, *args, env={"TMPDIR": str(project / "tmp")})
    output = again.stdout + again.stderr
    assert again.returncode == 0, output[-4000:]
    assert json.loads((project / "results/again/result.json").read_text())["status"] == "success"
    assert "allocstack: run again VERIFIED" in output, output[-3000:]
    nothing_left(project)


def test_as_a_module_ctrl_c_then_the_same_command_resumes(tmp_path):
    """A workflow of yours that uses allocstack as a module has no rerun-incomplete (allocstack's profile is not
    its): Snakemake ends the jobs the interruption stopped as it ends failed ones, so the rerun finds no
    incomplete files (before: IncompleteFilesException) and resumes from the journal."""
    allocstack = copy_project(tmp_path / "allocstack")
    outer = tmp_path / "outer"
    outer.mkdir()
    (outer / "tmp").mkdir()
    config = slow_run(allocstack, "mine", tasks=24, seconds=0.3)
    (outer / "data").mkdir()
    for name in ("inputs/mine.json", "expected/mine.json"):
        (outer / "data" / Path(name).name.replace("mine", Path(name).parent.name)).write_bytes((allocstack / name).read_bytes())
    text = config.read_text().replace("inputs/mine.json", "data/inputs.json").replace("expected/mine.json",
                                                                                      "data/expected.json")
    (outer / "config.yaml").write_text("allocstack:\n" + "".join(f"  {line}\n" for line in text.splitlines()))
    (outer / "Snakefile").write_text(MODULE_USER)
    args = ("--cores", "4")
    output, code = interrupted(outer, args, lambda: journaled(outer, "mine") >= 4, sigint_group)
    assert code == 130, output[-3000:]
    assert "Error in rule" not in output and "Traceback" not in output
    done = journaled(outer, "mine")
    rerun = snakemake(outer, *args)
    output = rerun.stdout + rerun.stderr
    assert rerun.returncode == 0, output[-3000:]
    assert "IncompleteFilesException" not in output
    assert json.loads((outer / "results/mine/coordinator.json").read_text())["restored"] == done
    assert not pids_mentioning(str(tmp_path))


# -- the handler, with stand-ins for Snakemake -------------------------------------------------------------------

@pytest.fixture
def fresh_state(monkeypatch):
    from allocstack.status import interrupt

    monkeypatch.setattr(interrupt, "STATE", interrupt.Interruption())
    monkeypatch.setattr(sys, "exit", sys.exit)
    return interrupt


def test_the_first_sigint_passes_on_and_stops_scheduling_the_next_ones_only_say_so(fresh_state):
    interrupt = fresh_state
    job = subprocess.Popen([sys.executable, "-c", "import time; print('ready', flush=True); time.sleep(60)"],
                           preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # not ignored, as a job's
                           stdout=subprocess.PIPE, text=True)
    stopped, written = threading.Event(), []
    try:
        # past Python's start: a SIGINT while it imports its site module is a fatal error (exit 1), not SIGINT's death
        # (CI, under load: ci-68)
        assert job.stdout.readline() == "ready\n"
        snakemake = interrupt.Snakemake(jobs=lambda: [job.pid, 999_999_999], scheduling=lambda: True,
                                        stop=stopped.set, local=lambda: True)
        on_sigint = interrupt.handler(snakemake, write=lambda fd, data: written.append(data) or len(data),
                                      clock=lambda: 1234.5)
        on_sigint(signal.SIGINT, None)
        assert stopped.wait(10) and job.wait(10) == -signal.SIGINT  # the job got SIGINT; a gone pid is skipped
        assert interrupt.STATE.at == 1234.5 and interrupt.STATE.count == 1
        on_sigint(signal.SIGINT, None)  # no second KeyboardInterrupt: it would land in Snakemake's cleanup
        assert interrupt.STATE.count == 2 and interrupt.STATE.at == 1234.5
        assert [data.decode().lstrip("\r\x1b[K") for data in written] == [interrupt.FIRST, interrupt.AGAIN]
        # Snakemake's exit(1) (jobs did not complete: the interrupted ones) is 130; the hook is used once
        with pytest.raises(SystemExit) as ended:
            sys.exit(1)
        assert ended.value.code == 130
        with pytest.raises(SystemExit) as ended:
            sys.exit(1)
        assert ended.value.code == 1
    finally:
        job.kill()
        job.wait()
        job.stdout.close()


def test_sigterm_is_the_same_interruption_with_its_own_line_and_exit_143(fresh_state):
    interrupt = fresh_state
    stopped, written = threading.Event(), []
    snakemake = interrupt.Snakemake(jobs=list, scheduling=lambda: True, stop=stopped.set, local=lambda: True)
    on_signal = interrupt.handler(snakemake, write=lambda fd, data: written.append(data) or len(data))
    on_signal(signal.SIGTERM, None)
    on_signal(signal.SIGINT, None)
    assert stopped.wait(10) and interrupt.STATE.count == 2
    assert [data.decode().lstrip("\r\x1b[K") for data in written] == [
        interrupt.FIRST.replace("(Ctrl-C)", "(SIGTERM)"), interrupt.AGAIN]
    with pytest.raises(SystemExit) as ended:
        sys.exit(1)
    assert ended.value.code == 143


def test_sigterm_is_taken_over_only_where_sigint_was(fresh_state, monkeypatch):
    """Inside a Slurm job (no SIGINT handler of allocstack's) Snakemake's own SIGTERM handling stays."""
    interrupt = fresh_state
    installed = {}
    monkeypatch.setattr(signal, "signal", lambda signum, handler: installed.__setitem__(signum, handler))
    monkeypatch.setattr(signal, "getsignal", lambda signum: signal.default_int_handler)
    interrupt.take_sigterm()
    assert installed == {}
    ours = interrupt.handler(interrupt.Snakemake(jobs=list, scheduling=bool, stop=lambda: None, local=bool))
    ours.allocstack = True
    monkeypatch.setattr(signal, "getsignal", lambda signum: ours)
    interrupt.take_sigterm()
    assert installed == {signal.SIGTERM: ours}


@pytest.mark.parametrize("local, scheduling", [(False, True), (True, False)])
def test_snakemakes_own_ctrl_c_where_it_must_run(fresh_state, local, scheduling):
    """Jobs submitted elsewhere (Slurm: Snakemake cancels them) or no scheduler yet (nothing runs): its own
    KeyboardInterrupt, once; then the same one line and nothing else."""
    interrupt = fresh_state
    snakemake = interrupt.Snakemake(jobs=lambda: pytest.fail("no job is signalled"), scheduling=lambda: scheduling,
                                    stop=lambda: pytest.fail("no graceful stop"), local=lambda: local)
    on_sigint = interrupt.handler(snakemake, write=lambda fd, data: len(data))
    with pytest.raises(KeyboardInterrupt):
        on_sigint(signal.SIGINT, None)
    on_sigint(signal.SIGINT, None)
    assert interrupt.STATE.count == 2


def test_the_summary_of_an_interrupted_run(tmp_path):
    from allocstack.status.summary import read_run, render_interrupted

    (tmp_path / "results/r").mkdir(parents=True)
    journal = tmp_path / "journal.jsonl"
    journal.write_text('{"kind":"header"}\n' + '{"kind":"result"}\n' * 7 + '{"kind":"res')  # a torn last line
    write_json(tmp_path / "results/r/inputs.json", {"taskCount": 10})
    text = render_interrupted(read_run(tmp_path / "results", "r"), wall_seconds=3.2, command="snakemake --cores 4",
                              journal=journal)
    assert text.splitlines() == [
        f"allocstack: run r INTERRUPTED: 7 of 10 tasks done, kept in the journal ({journal}); 3 to do",
        "  wall time   3.2 s for this command",
        "  resume      snakemake --cores 4",
        "              (the same command: what is done is not done again)"]
    assert render_interrupted(read_run(tmp_path / "results", "none")).startswith(
        "allocstack: run none INTERRUPTED: before the stack started")
