"""The one child supervisor (allocstack/launch/supervise.py) and the one runner of your programs (program.run_program).

Real child processes and real signals. The supervisor takes over SIGTERM, SIGINT and
SIGHUP of the process it runs in, so every test gives pytest's handlers back.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from allocstack.common.errors import AllocstackError
from allocstack.launch.program import ProgramError, run_program
from allocstack.launch.supervise import Outcome, Supervised, exit_status
from conftest import SCRIPTS

# Each child touches the file named by its argument once its SIGTERM handler is in place.
DRAINS = ("import pathlib, signal, sys, time\n"
          "signal.signal(signal.SIGTERM, lambda *_: (print('drained', file=sys.stderr, flush=True), sys.exit(0)))\n"
          "pathlib.Path(sys.argv[1]).touch()\n"
          "time.sleep(60)\n")
IGNORES_TERM = ("import pathlib, signal, sys, time\n"
                "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                "pathlib.Path(sys.argv[1]).touch()\n"
                "time.sleep(60)\n")


#: A supervisor in this process (tests/conftest.py: no launcher's lifeline, its signal handlers undone after).
pytestmark = pytest.mark.usefixtures("supervisor_in_this_process")


def start_and_signal(supervised: Supervised, code: str, ready: Path, grace: float | None = None) -> Outcome:
    """Start ``python -c code READY``; once READY exists, send SIGTERM to this process (the supervisor)."""

    def signal_when_ready() -> None:
        deadline = time.monotonic() + 60
        while not ready.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        os.kill(os.getpid(), signal.SIGTERM)

    supervised.start([sys.executable, "-c", code, str(ready)], dict(os.environ), grace)
    threading.Thread(target=signal_when_ready, daemon=True).start()
    return supervised.wait()


def test_a_forwarded_signal_is_remembered_and_the_stderr_tail_kept(capfd, tmp_path):
    outcome = start_and_signal(Supervised("drains"), DRAINS, tmp_path / "ready")
    assert outcome.code == 0 and outcome.stopped_by == signal.SIGTERM
    assert outcome.forwarded == frozenset({signal.SIGTERM}) and outcome.clean_stop and not outcome.killed
    assert outcome.tail == ["drained"] and outcome.how() == "exited 0: drained"
    assert "drained" in capfd.readouterr().err  # copied to the component's log as well


def test_a_child_killed_from_outside_is_not_ended_by_us():
    supervised = Supervised("victim")
    supervised.start([sys.executable, "-c", "import time; time.sleep(60)"], dict(os.environ))
    threading.Timer(0.3, supervised.child.kill).start()  # kill -9 from outside: nothing forwarded
    outcome = supervised.wait()
    assert outcome.code == -signal.SIGKILL and not outcome.ended_by_us and outcome.stopped_by is None
    assert outcome.status == 128 + signal.SIGKILL == exit_status(outcome.code)
    assert outcome.how() == "killed by SIGKILL"



def test_a_stop_signal_handled_after_the_child_died_of_it_is_still_ours():
    """SIGTERM to the job's whole process group: a child without a handler dies of it at once, and the supervisor's
    own handler may run only after the child was reaped (it then has nothing to pass it on to). The stop is
    remembered: launch.py must not take it for a kill from outside (tolerated, exit 0: Snakemake would then take
    an interrupted stack's outputs as complete)."""
    supervised = Supervised("worker-01")
    supervised.start([sys.executable, "-c", "import time; time.sleep(60)"], dict(os.environ))
    supervised.child.send_signal(signal.SIGTERM)  # the child's copy of the group's signal
    supervised.child.wait()  # reaped before this process handles its own copy
    os.kill(os.getpid(), signal.SIGTERM)  # the supervisor's copy, handled now
    outcome = supervised.wait()
    assert outcome.code == -signal.SIGTERM and outcome.forwarded == frozenset()
    assert outcome.received == frozenset({signal.SIGTERM}) and outcome.ended_by_us
    # a service ended this way was stopped by allocstack, cleanly (app_service.py's end record says "stopped")
    assert outcome.stop_signal == signal.SIGTERM and outcome.clean_stop


@pytest.mark.parametrize(("code", "received", "stop_signal", "clean"), [
    (-signal.SIGTERM, {signal.SIGTERM}, signal.SIGTERM, True),  # died of the group's signal first
    (0, {signal.SIGTERM}, signal.SIGTERM, True),  # its own handler ended it with 0
    (128 + signal.SIGTERM, {signal.SIGTERM}, signal.SIGTERM, True),  # ... or with 128 + N, as a shell does
    (-signal.SIGINT, {signal.SIGHUP, signal.SIGINT}, signal.SIGINT, True),
    (1, {signal.SIGTERM}, None, False),  # a crash is not a stop, whatever arrived at the same time
    (-signal.SIGKILL, {signal.SIGTERM}, None, False),  # kill -9 / the OOM killer from outside
    (-signal.SIGTERM, set(), None, False),  # a SIGTERM we never got: someone else's
])
def test_the_stop_signal_of_a_child_that_ended_before_it_was_passed_on(code, received, stop_signal, clean):
    outcome = Outcome(code, received=frozenset(received))
    assert outcome.stop_signal == stop_signal and outcome.clean_stop is clean


def test_a_passed_on_signal_is_the_stop_whatever_else_arrived():
    outcome = Outcome(-signal.SIGTERM, stopped_by=signal.SIGTERM, forwarded=frozenset({signal.SIGTERM}),
                      received=frozenset({signal.SIGTERM, signal.SIGINT}))
    assert outcome.stop_signal == signal.SIGTERM and outcome.clean_stop
    assert not Outcome(-signal.SIGKILL, stopped_by=signal.SIGTERM, killed=True).clean_stop

def test_a_forwarded_signal_goes_through_deliver_and_grace_ends_a_child_that_ignores_it(tmp_path):
    delivered: list[int] = []

    def deliver(child: subprocess.Popen[bytes], signum: int) -> None:  # launch.py: scancel --signal to the step
        delivered.append(signum)
        child.send_signal(signum)

    outcome = start_and_signal(Supervised("stubborn", deliver), IGNORES_TERM, tmp_path / "ready", grace=0.5)
    assert delivered == [signal.SIGTERM]
    assert outcome.killed and outcome.code == -signal.SIGKILL and not outcome.clean_stop


def test_without_keep_tail_stderr_is_not_piped():
    supervised = Supervised("plain", keep_tail=False)
    supervised.start([sys.executable, "-c", "import sys; sys.stderr.write('to the log\\n')"], dict(os.environ))
    assert supervised.child.stderr is None
    outcome = supervised.wait()
    assert outcome.code == 0 and outcome.tail == []


def test_a_program_that_cannot_start_is_a_prerequisite_error():
    with pytest.raises(AllocstackError) as error:
        Supervised("service db").start(["/nonexistent/db"], {})
    assert error.value.diag == "prerequisite" and "cannot start service db (/nonexistent/db)" in error.value.message


def test_run_program_gets_exactly_its_environment_stdin_and_a_bound():
    env = {"PATH": os.environ.get("PATH", ""), "ALLOCSTACK_TASK_ID": "t1"}
    code = "import os, sys; print(sorted(k for k in os.environ if k.startswith('ALLOCSTACK')), sys.stdin.read())"
    done = run_program([sys.executable, "-c", code], env, stdin=b"payload")
    assert done.returncode == 0 and done.stdout.decode().split() == ["['ALLOCSTACK_TASK_ID']", "payload"]
    failed = run_program([sys.executable, "-c", "import sys; sys.exit('no good')"], env)
    assert failed.returncode == 1 and failed.tail(100) == "no good"
    with pytest.raises(ProgramError, match=r"timed out after 0\.5 s"):
        run_program([sys.executable, "-c", "import time; time.sleep(30)"], env, timeout=0.5)
    with pytest.raises(ProgramError, match="cannot run /nonexistent/check"):
        run_program(["/nonexistent/check"], env)


# A component whose Ctrl-C cleanup runs a finalizer (a worker closing its connection pool) when the
# second copy of Ctrl-C (its launcher passes it on) arrives.
TWICE = """
import os, signal, sys, weakref
sys.path.insert(0, sys.argv[1])
from allocstack.common.cli import run

class Pool:
    pass

def close_connections():
    os.kill(os.getpid(), signal.SIGINT)  # the launcher's copy of Ctrl-C, arriving now
    sum(range(100_000))

def main():
    pool = Pool()
    weakref.finalize(pool, close_connections)
    try:
        os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C from the terminal
        while True:
            pass
    finally:
        del pool

sys.exit(run(main))
"""


def test_a_second_ctrl_c_during_the_cleanup_of_the_first_prints_no_traceback():
    # Ctrl-C as in a terminal: a run started in the background by a shell (`cmd &`) inherits SIGINT ignored
    done = subprocess.run([sys.executable, "-c", TWICE, str(SCRIPTS)], capture_output=True, text=True, timeout=30,
                          check=False, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert done.returncode == 130
    assert "Traceback" not in done.stderr and done.stderr.strip().endswith("interrupted (SIGINT)"), done.stderr


def test_a_stop_request_passes_one_sigterm_to_the_child_alone(monkeypatch, tmp_path):
    """launch.py asks a service's supervisor in a job step to stop through a file (``$ALLOCSTACK_STOP_REQUEST``):
    the supervisor itself gets no signal, and its child gets exactly one SIGTERM, as Compose sends it."""
    request, ready, seen = tmp_path / "stop" / "kv", tmp_path / "ready", tmp_path / "seen"
    counts = ("import pathlib, signal, sys, time\n"
              "got = []\n"
              "signal.signal(signal.SIGTERM, lambda *_: got.append(1))\n"
              "pathlib.Path(sys.argv[1]).touch()\n"
              "while not got: time.sleep(0.01)\n"
              "time.sleep(0.5)\n"
              "pathlib.Path(sys.argv[2]).write_text(str(len(got)))\n")
    monkeypatch.setenv("ALLOCSTACK_STOP_REQUEST", str(request))
    supervised = Supervised("kv")
    supervised.start([sys.executable, "-c", counts, str(ready), str(seen)], dict(os.environ), grace=10)

    def ask_when_ready() -> None:
        deadline = time.monotonic() + 60
        while not ready.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        request.parent.mkdir()
        request.touch()

    threading.Thread(target=ask_when_ready, daemon=True).start()
    bound = threading.Timer(30, lambda: supervised.child.poll() is None and supervised.child.kill())  # never asked
    bound.start()
    outcome = supervised.wait()
    bound.cancel()
    assert seen.exists() and seen.read_text() == "1", outcome.how()
    assert outcome.code == 0 and outcome.stopped_by == signal.SIGTERM and outcome.clean_stop
    assert outcome.forwarded == frozenset({signal.SIGTERM}) and not outcome.killed


def test_a_program_of_yours_is_not_given_the_stop_request():
    from allocstack.launch.program import program_environment

    env = program_environment({"ALLOCSTACK_STOP_REQUEST": "/scratch/stop/kv", "HOME": "/home/you"}, {}, {}, "kv")
    assert env == {"HOME": "/home/you"}
