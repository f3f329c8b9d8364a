"""What a person sees on the terminal: the live progress line, the end-of-run summary, one-line errors.

The terminal tests run Snakemake in a real terminal (tmux) and read the screen back
with ``tmux capture-pane``: what a pipe would show is not what a person watching sees.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from conftest import pids_mentioning, run_script
from real_parts import unavailable
from workflow_helpers import SNAKEMAKE, snakemake

LIVE = re.compile(r"^allocstack: (\d+)/(\d+) tasks done \(\d+%\), \d+ leased, [\d,]+ tasks/s, .*, \d+/\d+ workers$")


class Terminal:
    """A detached tmux session of a fixed size running one command, on a tmux server of its own.

    Its own server (``tmux -L``), not the user's default one: the server process carries the command line
    that started it (this test's project path), so on a shared server one test's leftover check would find,
    and kill, the server every other test's session runs on (it did, in CI: two terminal tests at once)."""

    def __init__(self, name: str, command: str, cwd: Path) -> None:
        if shutil.which("tmux") is None:
            unavailable("tmux is not installed (tests/cluster/prepare.sh installs it, as root)")
        self.name = name
        label = f"allocstack-test-{os.getpid()}-{name}"
        self.server = ["tmux", "-L", label]
        self.socket = Path(os.environ.get("TMUX_TMPDIR") or "/tmp") / f"tmux-{os.getuid()}" / label
        subprocess.run([*self.server, "kill-server"], capture_output=True, check=False)
        subprocess.run([*self.server, "new-session", "-d", "-s", name, "-x", "160", "-y", "50", "-c", str(cwd),
                        f"{command}; echo EXIT=$?; sleep 600"], check=True)

    def screen(self) -> list[str]:
        """Every line of the scrollback, as the terminal shows it (escape sequences applied)."""
        done = subprocess.run([*self.server, "capture-pane", "-p", "-J", "-S", "-", "-t", self.name],
                              capture_output=True, text=True, check=True)
        return done.stdout.rstrip("\n").splitlines()

    def close(self) -> None:
        """End the session and its server, and wait until both have gone: tmux's kill-server only sends SIGHUP
        and SIGTERM, and the leftover check of the project fixture runs right after (it once found the shell
        still alive)."""
        shown = subprocess.run([*self.server, "display-message", "-p", "-t", self.name, "#{pane_pid} #{pid}"],
                               capture_output=True, text=True, check=False).stdout.split()
        subprocess.run([*self.server, "kill-server"], capture_output=True, check=False)
        for pid in (int(value) for value in shown if value.isdigit()):
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and alive(pid):
                time.sleep(0.02)
        self.socket.unlink(missing_ok=True)  # a killed server leaves it


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie has ended: its parent reaps it)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text(errors="replace").split(") ", 1)[1][:1]
    except (OSError, IndexError):
        return False
    return state != "Z"


@pytest.fixture
def terminal(project):
    opened: list[Terminal] = []

    def open_terminal(command: str) -> Terminal:
        term = Terminal(f"allocstack-test-{project.parent.name}", command, project)
        opened.append(term)
        return term

    yield open_terminal
    for term in opened:
        term.close()


def test_live_progress_line_and_end_of_run_summary_in_a_real_terminal(project, terminal):
    run_script("make_tasks.py", "20", cwd=project).check_returncode()
    (project / "config/slow.yaml").write_text("simulate: {task_seconds: 0.25}\n")
    term = terminal(f"TMPDIR={project / 'tmp'} {SNAKEMAKE} --cores 4 --configfile config/slow.yaml --config "
                    "tasks=inputs/tasks-20.json expected=expected/results-20.json run=live")
    seen_midway: set[int] = set()
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        screen = term.screen()
        for line in screen:
            match = LIVE.match(line)
            if match and 0 < int(match[1]) < 20:
                seen_midway.add(int(match[1]))
        if any(line.startswith("EXIT=") for line in screen):
            break
        time.sleep(0.1)
    screen = term.screen()
    assert "EXIT=0" in screen, "\n".join(screen[-40:])
    # the live line was redrawn in place while tasks completed ...
    assert seen_midway, "no live progress line seen during the run:\n" + "\n".join(screen)
    # ... and stays once, finished, on a line of its own: no Snakemake message glued to it
    live_lines = [line for line in screen if line.startswith("allocstack: ") and "tasks done" in line]
    assert live_lines == ["allocstack: 20/20 tasks done (100%), 0 leased, " + live_lines[0].split(" leased, ")[1]]
    assert LIVE.match(live_lines[0])
    assert not any("coordinator: progress" in line for line in screen)  # the 5-second lines stay in the log
    assert "coordinator: progress 20/20 done" in (project / "logs/serve_coordinator/live.log").read_text()
    assert not any("Waiting at most" in line for line in screen)
    # the summary: verdict, counts, wall time, where the marker and the report are
    start = screen.index("allocstack: run live VERIFIED: 20 of 20 tasks correct")
    summary = screen[start:start + 8]
    assert summary[1].startswith("  tasks       20 of 20 done, 0 failed;")
    assert re.match(r"  workers     2: worker-01 \d+ tasks, worker-02 \d+ tasks$", summary[2])
    assert re.match(r"  wall time   [\d.]+ s for this command; the stack [\d.]+ s", summary[3])
    assert summary[4] == "  marker      results/live/result.json"
    assert "  report      snakemake --report report.html" in summary[7]
    assert len(screen) - start < 14  # at the end: only Snakemake's log hint and elapsed time follow


def test_ctrl_c_in_a_real_terminal_is_interrupted_not_failed_and_the_same_command_resumes(project, terminal):
    """Ctrl-C, then Ctrl-C again, typed into a real terminal mid-run: one line each, the summary says INTERRUPTED,
    what was done and the one command that resumes; no job's error or traceback on the screen, exit 130,
    nothing of the run left running. That command then finishes the run from the journal."""
    from test_faults import journaled, slow_run

    config = slow_run(project, "intr", tasks=24, seconds=0.3)
    command = f"{SNAKEMAKE} --cores 4 --configfile {config}"
    term = terminal(f"TMPDIR={project / 'tmp'} {command}")
    deadline = time.monotonic() + 120
    while journaled(project, "intr") < 4 and time.monotonic() < deadline:
        time.sleep(0.05)
    subprocess.run([*term.server, "send-keys", "-t", term.name, "C-c"], check=True)
    time.sleep(0.3)
    subprocess.run([*term.server, "send-keys", "-t", term.name, "C-c"], check=True)
    while not any(line.startswith("EXIT=") for line in term.screen()) and time.monotonic() < deadline:
        time.sleep(0.1)
    screen = term.screen()
    text = "\n".join(screen)
    assert "EXIT=130" in screen, text[-4000:]
    done = journaled(project, "intr")
    assert 4 <= done < 24
    assert ("allocstack: run intr INTERRUPTED: "
            f"{done} of 24 tasks done, kept in the journal (state/intr/journal.jsonl); {24 - done} to do") in screen
    # the command as typed; its program by name alone when the terminal's PATH finds that very program
    assert any(line in (f"  resume      {command}", f"  resume      snakemake {command.split(' ', 1)[1]}")
               for line in screen), text[-3000:]
    assert any(line.endswith("allocstack: interrupted (Ctrl-C): stopping the run's jobs; what is done stays done, "
                             "and the same command resumes") for line in screen), text[-3000:]
    assert "allocstack: interrupted already: waiting for the run's jobs to stop" in screen
    for noise in ("Error in rule", "Traceback", "RuleException", "WorkflowError", "FAILED", "Logfile"):
        assert noise not in text, (noise, text[-4000:])
    # the summary ends the screen: only Snakemake's log hint and elapsed time follow it (and the line of the second
    # Ctrl-C, where it arrived while the summary was written: a loaded machine, CI of 95a4894)
    tail = screen[next(i for i, line in enumerate(screen) if "INTERRUPTED" in line):]
    assert len([line for line in tail if "interrupted already" not in line]) <= 7, tail
    running = [pid for pid in pids_mentioning(str(project))
               if b"launch.py" in Path(f"/proc/{pid}/cmdline").read_bytes() or
               b"snakemake" in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0]]
    assert not running

    resumed = snakemake(project, "--cores", "4", "--configfile", str(config))
    assert resumed.returncode == 0, (resumed.stdout + resumed.stderr)[-3000:]
    assert json.loads((project / "results/intr/coordinator.json").read_text())["restored"] == done


def test_without_a_terminal_progress_is_lines_and_the_summary_still_ends_the_run(project):
    done = snakemake(project, "--cores", "4")
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-3000:]
    assert "coordinator: progress 4/4 done" in output and "\r" not in output
    assert "Waiting at most" not in output
    assert "allocstack: run baseline VERIFIED: 4 of 4 tasks correct" in done.stdout


def test_bad_input_ends_with_its_one_line_and_writes_nothing(project, terminal):
    tasks = json.loads((project / "inputs/tasks.json").read_text())
    tasks["tasks"][1]["id"] = "task-001"
    (project / "inputs/dup.json").write_text(json.dumps(tasks))
    term = terminal(f"TMPDIR={project / 'tmp'} {SNAKEMAKE} --cores 4 --config tasks=inputs/dup.json run=dup")
    deadline = time.monotonic() + 120
    while not any(line.startswith("EXIT=") for line in term.screen()) and time.monotonic() < deadline:
        time.sleep(0.1)
    screen = term.screen()
    assert screen[-1] == "EXIT=1", "\n".join(screen[-30:])
    # the verdict and the one line, at the end (only Snakemake's log hint and its last words follow)
    tail = screen[-10:]
    assert "allocstack: run dup FAILED: nothing was written to results/dup/" in tail, "\n".join(screen[-30:])
    assert "  allocstack: error [input]: tasks inputs/dup.json: task 2: duplicate task id 'task-001'" in tail
    written = [p for p in (project / "results").rglob("*") if p.is_file()] if (project / "results").exists() else []
    assert written == []  # not even the decision record


@pytest.mark.parametrize(("override", "diag", "code"), [
    ("workers=0", "config", 78),
    ("wrokers=3", "config", 78),
    ("tasks=inputs/nope.json", "input", 65),
])
def test_a_config_error_is_one_line_and_its_documented_exit_code(project, override, diag, code):
    done = snakemake(project, "--dry-run", "--config", override)
    output = done.stdout + done.stderr
    assert done.returncode == code, output
    assert len([line for line in output.splitlines() if "allocstack: error" in line]) == 1
    assert f"allocstack: error [{diag}]:" in output
    assert "Traceback" not in output and 'File "' not in output and "WorkflowError" not in output


def test_null_on_the_command_line_means_null(project):
    done = snakemake(project, "--dry-run", "--config", "expected=null")
    output = done.stdout + done.stderr
    assert "expected file null" not in output
    assert done.returncode == 78 and "expected is null and verify.command is not set" in output
    (project / "config/own-check.yaml").write_text("verify: {command: [python3, -c, 'pass']}\n")
    fine = snakemake(project, "--dry-run", "--configfile", "config/own-check.yaml", "--config", "expected=null")
    assert fine.returncode == 0, fine.stdout + fine.stderr
    assert "--expected" not in fine.stdout


def test_new_tasks_with_the_baseline_expected_file_get_a_hint(project):
    run_script("make_tasks.py", "10", cwd=project).check_returncode()
    done = snakemake(project, "--cores", "4", "--config", "tasks=inputs/tasks-10.json", "run=ten")
    output = done.stdout + done.stderr
    assert done.returncode != 0
    line = next(line for line in output.splitlines() if line.startswith("  allocstack: error [input]"))
    assert "expected/results.json (config key 'expected') is not the expected results of inputs/tasks-10.json" in line
    assert "--config expected=PATH" in line and "expected=null with a verify.command" in line


def test_status_shows_a_finished_run_and_picks_the_only_run(project):
    done = snakemake(project, "--cores", "4")
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    env = {"TMPDIR": str(project / "tmp")}
    status = run_script("status.py", cwd=project, env=env)  # no --run: there is one run
    assert status.returncode == 0, status.stderr
    lines = status.stdout.splitlines()
    assert lines[0] == "allocstack: run baseline VERIFIED: 4 of 4 tasks correct"
    # batching shares the work: with as many tasks as workers or more, every worker gets some
    # (how the 4 split depends on which worker asks first: 2+2, 3+1 or 1+3, never 4+0)
    workers_line = next(line for line in lines if line.startswith("  workers     2: "))
    shares = [int(n) for n in re.findall(r"worker-0[12] (\d+) tasks?", workers_line)]
    assert len(shares) == 2 and sum(shares) == 4 and min(shares) >= 1, workers_line
    assert "  marker      results/baseline/result.json" in lines
    ended = run_script("status.py", "--url", cwd=project, env=env)
    assert ended.returncode == 69 and "run 'baseline' has ended: --url needs a running stack" in ended.stderr
    (project / "results/other").mkdir()
    (project / "results/other/inputs.json").write_text("{}")
    several = run_script("status.py", cwd=project, env=env)
    assert several.returncode == 64 and "2 runs: baseline, other, none serving; say which with --run" in several.stderr
    unknown = run_script("status.py", "--run", "nope", cwd=project, env=env)
    assert unknown.returncode == 69 and "no stack is serving on this node" in unknown.stderr


def test_the_tunnel_names_the_real_user_without_user_set():
    import pwd

    from allocstack.common.endpoint import tunnel_command

    command = tunnel_command(43825, {"SLURMD_NODENAME": "node042", "SLURM_SUBMIT_HOST": "login1"})
    name = pwd.getpwuid(os.getuid()).pw_name
    assert command == f"ssh -J {name}@login1 -N -L 8787:127.0.0.1:43825 {name}@node042"
    assert "$USER" not in command


def test_make_tasks_makes_a_task_set_every_worker_shares(project):
    made = run_script("make_tasks.py", "3", "--message", "hello", "--repeat", "3", cwd=project)
    assert made.returncode == 0, made.stderr
    assert "snakemake --cores 4 --config tasks=inputs/tasks-3.json expected=expected/results-3.json run=n3" in made.stdout
    tasks = json.loads((project / "inputs/tasks-3.json").read_text())
    expected = json.loads((project / "expected/results-3.json").read_text())
    assert tasks["tasks"][2] == {"id": "task-000002", "payload": {"message": "hello2", "repeat": 3}}
    assert expected["results"][2]["output"] == "hello2hello2hello2"
    done = snakemake(project, "--cores", "4", "--config", "tasks=inputs/tasks-3.json",
                     "expected=expected/results-3.json", "run=n3", "workers=3")
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    completed = {p.stem: json.loads(p.read_text())["tasksCompleted"] for p in (project / "results/n3/workers").iterdir()}
    assert completed == {"worker-01": 1, "worker-02": 1, "worker-03": 1}  # as many tasks as workers: one each
    bad = run_script("make_tasks.py", "0", cwd=project)
    assert bad.returncode == 64 and bad.stderr.startswith("allocstack: error [usage]:")


@pytest.mark.parametrize("marker", [
    {"schemaVersion": 1, "status": "success", "taskCount": 2, "inputSha256": "a" * 64, "resultsSha256": "b" * 64,
     "results": [{"taskId": "t1", "workerId": "w", "output": "x", "sha256": "c" * 64}] * 2},
    {"schemaVersion": 1, "status": "success", "services": ["app", "db"], "check": "passed"},
    {"status": "failed", "results": "not a list", "taskCount": "2"},
    [1, 2],
    "not json",
    b"\xff\xfe",
])
@pytest.mark.parametrize("with_msgspec", [True, False])
def test_the_summary_reads_the_markers_keys_without_its_results(marker, with_msgspec, tmp_path, monkeypatch):
    """The end-of-run summary reads the success marker's status, taskCount, check and services, never its results
    (a million of them took 1.4 s at the end of every run): the same keys and the same summary as the whole marker."""
    from allocstack.common import jsonio
    from allocstack.status import summary

    if not with_msgspec:
        monkeypatch.setattr(jsonio, "msgspec", None)
    summary._marker_decoder.cache_clear()
    path = tmp_path / "run" / "result.json"
    path.parent.mkdir()
    path.write_bytes(marker if isinstance(marker, bytes) else (json.dumps(marker, indent=2, sort_keys=True).encode()
                                                               if not isinstance(marker, str) else marker.encode()))
    whole = summary._read(path)
    keys = summary._read_marker(path)
    summary._marker_decoder.cache_clear()
    if isinstance(whole, dict):
        assert keys == {key: whole[key] for key in summary.MARKER_KEYS if key in whole}
        assert ("results" in keys) is False
    else:
        assert keys == whole
    records = summary.read_run(tmp_path, "run")
    assert records.get("marker") == keys
    full = summary.RunRecords("run", tmp_path / "run", {"marker": whole})
    assert summary.render_finished(records) == summary.render_finished(full)
