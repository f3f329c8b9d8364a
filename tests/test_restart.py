"""Restart policies (issue 25, point 3): the policy as pure functions, and the one supervisor restarting real
child processes by it (allocstack/launch/restart.py, allocstack/launch/supervise.py).

The supervisor takes over SIGTERM, SIGINT and SIGHUP of the process it runs in, so every test gives pytest's
handlers back.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

import pytest

from allocstack.launch.restart import RestartPolicy, counted, exhausted, restart_after
from allocstack.launch.supervise import Outcome, Supervised

ON_FAILURE = RestartPolicy("on-failure", delay=2.5, max_attempts=2)


#: A supervisor in this process (tests/conftest.py: no launcher's lifeline, its signal handlers undone after).
pytestmark = pytest.mark.usefixtures("supervisor_in_this_process")


# -- the policy, pure ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("condition", "code", "restarted"), [
    ("none", 1, False), ("none", -9, False),
    ("on-failure", 0, False), ("on-failure", 1, True), ("on-failure", -9, True), ("on-failure", 137, True),
    ("any", 0, True), ("any", 3, True), ("any", -9, True),
])
def test_the_condition_decides_which_ends_are_restarted(condition, code, restarted):
    pause = restart_after(RestartPolicy(condition, delay=1.5), code, False, [], 100.0)
    assert pause == (1.5 if restarted else None)


@pytest.mark.parametrize("condition", ["on-failure", "any"])
def test_a_program_we_stopped_is_never_restarted(condition):
    assert restart_after(RestartPolicy(condition), -15, True, [], 100.0) is None
    assert restart_after(RestartPolicy(condition), 0, True, [], 100.0) is None
    assert exhausted(RestartPolicy(condition), -15, True, 0) is None


def test_max_attempts_counts_every_restart_without_a_window():
    assert restart_after(ON_FAILURE, 1, False, [10.0], 1000.0) == 2.5
    assert restart_after(ON_FAILURE, 1, False, [10.0, 20.0], 1000.0) is None
    assert restart_after(RestartPolicy("any"), 1, False, [float(t) for t in range(500)], 1000.0) == 0.0  # no limit


def test_with_a_window_only_the_restarts_within_it_count():
    policy = RestartPolicy("on-failure", max_attempts=2, window=60)
    assert counted(policy, [10.0, 50.0, 95.0], 100.0) == 2  # 10 s is more than 60 s ago
    assert restart_after(policy, 1, False, [10.0, 50.0, 95.0], 100.0) is None
    assert restart_after(policy, 1, False, [10.0, 50.0, 95.0], 111.0) == 0.0  # 50 s has left the window


def test_the_line_of_a_program_whose_restarts_are_used_up():
    assert exhausted(ON_FAILURE, -9, False, 2) == ("restarted 2 times (restart: on-failure, at most 2 restarts, "
                                                   "2.5 s apart): not restarted again")
    assert exhausted(ON_FAILURE, 0, False, 0) is None  # on-failure: exit 0 is no failure
    assert exhausted(RestartPolicy(), 1, False, 0) is None


def test_a_policy_from_the_config_and_back_as_options():
    policy = RestartPolicy.from_config({"condition": "on-failure", "delay": 1, "max_attempts": 3, "window": 30})
    assert policy == RestartPolicy("on-failure", 1.0, 3, 30.0)
    assert policy.options() == [("--restart", "on-failure"), ("--restart-delay", 1.0), ("--restart-window", 30.0),
                                ("--restart-max-attempts", 3)]
    assert RestartPolicy.from_config({}).options() == [] == RestartPolicy.from_config(None).options()
    with pytest.raises(ValueError, match="not one of"):
        RestartPolicy("always")


# -- the supervisor, with real processes --------------------------------------------------------------------------

#: Exits with the code argv[2] gives for each start (counted in the file argv[1]), after a line of stderr.
COUNTS_STARTS = ("import pathlib, sys; f = pathlib.Path(sys.argv[1]); n = len(f.read_text()) if f.exists() else 0;"
                 " f.write_text('x' * (n + 1)); codes = sys.argv[2].split(',');"
                 " print(f'start {n + 1}', file=sys.stderr, flush=True); sys.exit(int(codes[min(n, len(codes) - 1)]))")


def restarts_seen() -> tuple[list[tuple[int, int, int]], object]:
    seen: list[tuple[int, int, int]] = []
    return seen, lambda attempt, ended, pid: seen.append((attempt, ended.code, pid))


def test_a_child_that_fails_is_started_again_until_it_succeeds(tmp_path, capfd):
    seen, on_restart = restarts_seen()
    supervised = Supervised("flaky")
    first = supervised.start([sys.executable, "-c", COUNTS_STARTS, str(tmp_path / "starts"), "3,1,0"],
                             dict(os.environ))
    outcome = supervised.wait(restart=RestartPolicy("on-failure", max_attempts=5), on_restart=on_restart)
    assert (outcome.code, outcome.restarts, outcome.tail[-1]) == (0, 2, "start 3")
    assert [(attempt, code) for attempt, code, _ in seen] == [(1, 3), (2, 1)]
    assert len({first, *(pid for *_, pid in seen)}) == 3  # a new process each time
    log = capfd.readouterr().err
    assert "flaky: exited 3: start 1; starting it again in 0 s (restart 1 of at most 5; restart: on-failure" in log
    assert "flaky: exited 1: start 2; starting it again in 0 s (restart 2 of at most 5;" in log


def test_a_child_killed_from_outside_is_restarted_until_max_attempts_then_its_end_stands(tmp_path):
    seen, on_restart = restarts_seen()
    supervised = Supervised("victim")
    started = tmp_path / "started"
    code = ("import os, pathlib, sys, time; f = pathlib.Path(sys.argv[1]);"
            " f.write_text(f.read_text() + f'{os.getpid()}\\n' if f.exists() else f'{os.getpid()}\\n');"
            " print('serving', file=sys.stderr, flush=True); time.sleep(60)")

    def kill_each_start() -> None:  # kill -9 from outside, each of the first two starts
        for n in (1, 2):
            while not started.exists() or len(started.read_text().split()) < n:
                time.sleep(0.02)
            os.kill(int(started.read_text().split()[n - 1]), signal.SIGKILL)

    supervised.start([sys.executable, "-c", code, str(started)], dict(os.environ))
    threading.Thread(target=kill_each_start, daemon=True).start()
    outcome = supervised.wait(restart=RestartPolicy("on-failure", max_attempts=1), on_restart=on_restart)
    assert (outcome.code, outcome.restarts, outcome.ended_by_us) == (-signal.SIGKILL, 1, False)
    assert [(attempt, code) for attempt, code, _ in seen] == [(1, -signal.SIGKILL)]
    assert outcome.how() == "killed by SIGKILL: serving"


def test_a_child_ended_by_our_stop_signal_is_not_restarted_even_with_restart_any(tmp_path):
    seen, on_restart = restarts_seen()
    ready = tmp_path / "ready"
    supervised = Supervised("stopped")
    supervised.start([sys.executable, "-c", ("import pathlib, sys, time; pathlib.Path(sys.argv[1]).touch(); "
                      "time.sleep(60)"), str(ready)], dict(os.environ))

    def stop_when_ready() -> None:
        while not ready.exists():
            time.sleep(0.02)
        os.kill(os.getpid(), signal.SIGTERM)  # the stack's end: the supervisor gets SIGTERM

    threading.Thread(target=stop_when_ready, daemon=True).start()
    outcome = supervised.wait(restart=RestartPolicy("any"), on_restart=on_restart)
    assert seen == [] and outcome.restarts == 0
    assert outcome.code == -signal.SIGTERM and outcome.ended_by_us and outcome.clean_stop


def test_a_stop_during_the_delay_cancels_the_restart_and_counts_as_a_clean_stop(tmp_path, capfd):
    seen, on_restart = restarts_seen()
    supervised = Supervised("waiting")
    supervised.start([sys.executable, "-c", "import sys; print('bye', file=sys.stderr); sys.exit(1)"],
                     dict(os.environ))

    def stop_once_waiting() -> None:
        while not supervised.waiting_restart:
            time.sleep(0.02)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=stop_once_waiting, daemon=True).start()
    outcome: Outcome = supervised.wait(restart=RestartPolicy("any", delay=600), on_restart=on_restart)
    assert seen == [] and outcome.restarts == 0 and outcome.cancelled_restart
    assert outcome.stop_signal == signal.SIGTERM and outcome.clean_stop and outcome.code == 1
    assert "waiting: not started again: the stack is stopping" in capfd.readouterr().err


def test_stop_when_during_the_delay_cancels_the_restart():
    """``main`` ended while a worker waited for its restart: it is not started again."""
    seen, on_restart = restarts_seen()
    supervised = Supervised("replica")
    supervised.start([sys.executable, "-c", "raise SystemExit(2)"], dict(os.environ))
    outcome = supervised.wait(stop_when=lambda: supervised.waiting_restart, restart=RestartPolicy("any", delay=600),
                              on_restart=on_restart)
    assert seen == [] and outcome.cancelled_restart and outcome.stopped_by == signal.SIGTERM and outcome.clean_stop


# -- where a restart is seen ----------------------------------------------------------------------------------------

def test_each_restart_is_a_mark_on_the_timeline():
    from plot_timeline import render

    events = [{"t": 1.0, "event": "service-started", "service": "kv"},
              {"t": 2.0, "event": "service-restart", "service": "kv", "attempt": 1, "exitCode": -9},
              {"t": 2.5, "event": "worker-start", "worker": "worker-01"},
              {"t": 3.0, "event": "worker-restart", "worker": "worker-01", "attempt": 2, "exitCode": 1},
              {"t": 4.0, "event": "worker-end", "worker": "worker-01", "status": "done"}]
    svg = render(events)
    assert ">restart kv (1)</text>" in svg and ">restart worker-01 (2)</text>" in svg


def test_the_summary_counts_the_restarts_of_services_and_workers(tmp_path):
    from allocstack.status.summary import RunRecords, services_line, worker_line

    records = RunRecords(run="r", directory=tmp_path)
    records.documents["services"] = {"services": {"kv": {"status": "stopped", "restarts": 2},
                                                  "db": {"status": "stopped", "restarts": 0}}}
    records.workers = {"worker-01": {"mode": "long-running", "exitCode": 0, "restarts": 1}}
    assert services_line(records) == "db stopped, kv stopped (restarted 2 times)"
    assert worker_line(records) == "1: worker-01 exited 0 (restarted 1 time)"
