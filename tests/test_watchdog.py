"""The watchdog beside each supervised child (allocstack/launch/watchdog.py): what the child's own children leave
running is stopped when the child ends or its supervisor dies (SIGKILL included), never a process that merely got
a recorded pid later. Real processes, real signals, a real Snakemake run.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from allocstack.launch import watchdog
from allocstack.launch.containers import runtime_environ
from allocstack.launch.supervise import Supervised
from conftest import SCRIPTS
from workflow_helpers import snakemake

#: Started by the child: ignores SIGHUP (and, with argv[2] == "stubborn", SIGTERM), notes its pid in argv[1].
GRANDCHILD = textwrap.dedent("""
    import os, signal, sys, time
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    if sys.argv[2] == "stubborn":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    with open(sys.argv[1] + ".tmp", "w") as note:
        note.write(str(os.getpid()))
    os.rename(sys.argv[1] + ".tmp", sys.argv[1])
    time.sleep(300)
""")
#: The child (a file beside GRANDCHILD's): starts the grandchild and does not wait for it; then sleeps (argv[3]
#: "stay") or exits 0 once the watchdog has had time to see the grandchild (argv[3] "leave").
CHILD = textwrap.dedent("""
    import os, subprocess, sys, time
    grandchild = os.path.join(os.path.dirname(os.path.abspath(__file__)), "grandchild.py")
    subprocess.Popen([sys.executable, grandchild, sys.argv[1], sys.argv[2]])
    while not os.path.exists(sys.argv[1]):
        time.sleep(0.02)
    time.sleep(300 if sys.argv[3] == "stay" else 4 * float(sys.argv[4]))
""")
#: The supervisor: Supervised runs CHILD (argv: ITS FILE, NOTE MODE stay) with the Python of $PYTHON_ARGV (JSON: a
#: container runtime's command line and the image's python3, or this Python), and waits.
SUPERVISOR = textwrap.dedent("""
    import json, os, sys
    sys.path.insert(0, os.environ["SCRIPTS"])
    from allocstack.launch.supervise import Supervised
    program = Supervised("service web")
    python = json.loads(os.environ["PYTHON_ARGV"])
    program.start([*python, *sys.argv[1:]], dict(os.environ), grace=1)
    sys.exit(program.wait().status)
""")


#: A supervisor in this process (tests/conftest.py: no launcher's lifeline, its signal handlers undone after).
pytestmark = pytest.mark.usefixtures("supervisor_in_this_process")


def environment(python: list[str] | None = None) -> dict[str, str]:
    return {**os.environ, "SCRIPTS": str(SCRIPTS), "PYTHON_ARGV": json.dumps(python or [sys.executable])}


def child_argv(directory: Path, mode: str, end: str) -> list[str]:
    """CHILD's arguments (its file first), its grandchild noting its pid in DIRECTORY/grandchild."""
    (directory / "grandchild.py").write_text(GRANDCHILD)
    (directory / "child.py").write_text(CHILD)
    return [str(directory / "child.py"), str(directory / "grandchild"), mode, end, str(watchdog.SCAN)]


def wait_for(condition, what: str, limit: float = 60) -> None:
    """Poll ``condition`` until it holds; fail naming ``what`` after ``limit`` seconds (a bound, not a speed)."""
    deadline = time.monotonic() + limit
    while not condition():
        assert time.monotonic() < deadline, f"still waiting for {what} after {limit} s"
        time.sleep(0.05)


def noted(note: Path) -> tuple[int, int]:
    """The grandchild's pid and start time."""
    wait_for(note.exists, "the grandchild")
    pid = int(note.read_text())
    start = watchdog.running_start(pid)
    assert start is not None, "the grandchild ended by itself"
    return pid, start


def running(pid: int, start: int) -> bool:
    return watchdog.running_start(pid) == start


def watchdogs_of(parent: int) -> list[int]:
    from allocstack.launch.procfs import child_pids

    return [pid for pid in child_pids(parent) if watchdog.is_watchdog(pid)]


def sigkill_the_supervisor(directory: Path, python: list[str] | None = None) -> None:
    """Run SUPERVISOR (its child starts a grandchild that ignores SIGHUP and stays), SIGKILL it once the watchdog
    had time to record the grandchild: the grandchild must end."""
    supervisor = subprocess.Popen([sys.executable, "-c", SUPERVISOR, *child_argv(directory, "calm", "stay")],
                                  env=runtime_environ(environment(python)))  # ch-run wants $USER
    grandchild = None
    try:
        wait_for(lambda: (directory / "grandchild").exists() or supervisor.poll() is not None, "the grandchild")
        assert supervisor.poll() is None, f"the supervisor ended: {supervisor.returncode}"
        grandchild = noted(directory / "grandchild")
        wait_for(lambda: watchdogs_of(supervisor.pid), "the watchdog")
        time.sleep(4 * watchdog.SCAN)  # a few of its records with the grandchild in them
        # the watchdog is in a session of its own: a kill of the job's process group does not reach it
        (guard,) = watchdogs_of(supervisor.pid)
        assert os.getsid(guard) == guard != os.getsid(supervisor.pid)
        assert os.getpgid(grandchild[0]) == os.getpgid(supervisor.pid)  # the child's group as before: Ctrl-C reaches it
        supervisor.kill()  # as Snakemake kills a failed run's other jobs
        supervisor.wait(timeout=30)
        wait_for(lambda: not running(*grandchild), "the grandchild to be stopped")
    finally:
        supervisor.kill()
        supervisor.wait()
        if grandchild is not None and running(*grandchild):  # what this test would otherwise leave running
            os.kill(grandchild[0], signal.SIGKILL)


def test_the_grandchild_is_stopped_when_its_supervisor_is_sigkilled(tmp_path):
    sigkill_the_supervisor(tmp_path)


@pytest.mark.parametrize("runtime", [pytest.param("apptainer", marks=pytest.mark.apptainer),
                                     pytest.param("charliecloud", marks=pytest.mark.charliecloud)])
def test_in_an_image_too_the_grandchild_is_stopped_when_its_supervisor_is_sigkilled(runtime, tmp_path):
    """Apptainer's and ch-run's processes are host processes: the watchdog sees and stops them the same way (the
    parent-death signal reaches the runtime, not the program in the image, let alone its children)."""
    from allocstack.launch.containers import container_prefix, mount_tree_dirs
    from real_parts import require_apptainer, require_charliecloud

    image = require_apptainer() if runtime == "apptainer" else require_charliecloud()
    shared = tmp_path / "shared"
    shared.mkdir()
    tree = tmp_path / "tree"
    for directory in mount_tree_dirs([str(shared)], str(shared), tree):
        directory.mkdir(parents=True, exist_ok=True)
    args = ["--cleanenv", "--contain"] if runtime == "apptainer" else []  # config apptainer.args' default
    prefix = container_prefix(runtime, image, args, [str(shared)], {}, str(shared), tree)
    sigkill_the_supervisor(shared, [*prefix, "python3"])


def test_a_normal_end_stops_what_the_child_left_a_stubborn_process_by_sigkill(tmp_path, capfd):
    program = Supervised("service web")
    program.start([sys.executable, *child_argv(tmp_path, "stubborn", "leave")], environment(), grace=0.5)
    grandchild = noted(tmp_path / "grandchild")
    outcome = program.wait()
    assert outcome.code == 0
    assert not running(*grandchild)  # gone when wait() returns: it waits for the watchdog
    assert program.watchdog is not None and program.watchdog.process.returncode == 0
    line = f"watchdog: stopped 1 leftover process of service web: pids {grandchild[0]} (SIGKILL: {grandchild[0]})"
    assert line in capfd.readouterr().err


def test_a_child_that_leaves_nothing_gets_no_line(capfd):
    program = Supervised("worker-01")
    program.start([sys.executable, "-c", "pass"], dict(os.environ))
    assert program.wait().code == 0
    assert program.watchdog is None or program.watchdog.process.returncode == 0
    assert "watchdog" not in capfd.readouterr().err


def test_a_reused_pid_is_never_signalled(tmp_path):
    assert watchdog.still_running({10: 100, 11: 200, 12: 300}, {10: 100, 11: 999, 12: None}) == [10]
    # a recorded process whose pid now has another start time is dropped, and its "children" are not walked
    children = {1: [10], 10: [20], 11: [21]}  # 11 now belongs to someone else
    starts = {1: 5, 10: 100, 11: 999, 20: 7, 21: 8}
    tree = watchdog.record({1: 5, 11: 200}, starts.get, lambda pid: children.get(pid, []), lambda pid: False)
    assert tree == {1: 5, 10: 100, 20: 7}
    # a real process recorded with another start time (a pid reused since) is left alone
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        wait_for(lambda: watchdog.running_start(sleeper.pid) is not None, "the sleeper")
        start = watchdog.running_start(sleeper.pid)
        assert watchdog.stop({sleeper.pid: start + 1}, 0.1) == ([], [])
        assert sleeper.poll() is None
        assert watchdog.stop({sleeper.pid: start}, 5) == ([sleeper.pid], [])
        assert sleeper.wait(timeout=30) == -signal.SIGTERM
    finally:
        sleeper.kill()
        sleeper.wait()


def test_other_watchdogs_and_zombies_are_not_recorded():
    zombie = subprocess.Popen([sys.executable, "-c", "pass"])
    wait_for(lambda: watchdog.running_start(zombie.pid) is None, "the zombie")  # exited, not waited for
    assert os.path.exists(f"/proc/{zombie.pid}")
    zombie.wait()
    guard = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "-m", watchdog.MODULE])
    try:
        wait_for(lambda: watchdog.is_watchdog(guard.pid), "the stand-in watchdog")
        assert watchdog.record({os.getpid(): watchdog.running_start(os.getpid())}).keys().isdisjoint({guard.pid})
    finally:
        guard.kill()
        guard.wait()


# ------------------------------------------------------------------ a real local run that fails

#: A service as uvicorn --reload runs one: the program started serves nothing itself, its multiprocessing
#: ("spawn") child holds the port.
WEB = textwrap.dedent("""
    import json, multiprocessing, os
    from http.server import BaseHTTPRequestHandler, HTTPServer

    class Health(BaseHTTPRequestHandler):
        def do_GET(self):
            body = json.dumps({"status": "ok"}).encode()
            self.send_response(200); self.send_header("Content-Length", str(len(body))); self.end_headers()
            self.wfile.write(body)
        def log_message(self, *args):
            pass

    def serve(port):
        HTTPServer(("127.0.0.1", port), Health).serve_forever()

    if __name__ == "__main__":
        server = multiprocessing.get_context("spawn").Process(target=serve,
                                                              args=(int(os.environ["ALLOCSTACK_WEB_PORT"]),))
        server.start()
        server.join()
""")
#: The main program: runs once the web service's gate passed, and fails.
FAILS = "import sys; print('producer: failing on purpose', file=sys.stderr); sys.exit(3)"
WORKER = "import time\nwhile True: time.sleep(0.1)"


def processes_in(workdir: Path) -> list[int]:
    """Live processes whose working directory or command line is in ``workdir``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid() or watchdog.running_start(int(entry.name)) is None:
            continue
        try:
            cwd = os.readlink(entry / "cwd")
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode("utf-8", "replace")
        except OSError:
            continue
        if cwd == str(workdir) or cwd.startswith(f"{workdir}/") or str(workdir) in cmdline:
            found.append(int(entry.name))
    return found


def test_a_failed_local_run_leaves_no_process_of_its_services_children(project):
    python = json.dumps(sys.executable)
    (project / "apps").mkdir()
    (project / "apps/web.py").write_text(WEB)
    (project / "config/leftover.yaml").write_text(textwrap.dedent(f"""
        run: leftover
        tasks: null
        expected: null
        workers: 1
        worker: {{mode: long-running, command: [{python}, -c, {json.dumps(WORKER)}], stop_grace_period: 2}}
        services:
          web:
            command: [{python}, {json.dumps(str(project / "apps/web.py"))}]
            readiness: {{mode: http, path: /health, expect: {{status: ok}}}}
          producer: {{command: [{python}, -c, {json.dumps(FAILS)}], depends_on: [web]}}
        main: producer
    """))
    done = snakemake(project, "--cores", "4", "--configfile", "config/leftover.yaml")
    output = done.stdout + done.stderr
    assert done.returncode != 0 and "producer: failing on purpose" in output, output[-3000:]
    started = (project / "logs").rglob("*web*")
    assert any("started on http://127.0.0.1:" in path.read_text() for path in started if path.is_file()), output
    try:
        wait_for(lambda: not processes_in(project), "the run's processes to end")
    finally:
        for pid in processes_in(project):  # what this test would otherwise leave running
            os.kill(pid, signal.SIGKILL)
    lines = [line for path in (project / "logs").rglob("*") if path.is_file()
             for line in path.read_text(errors="replace").splitlines() if line.startswith("watchdog: stopped")]
    assert any(line.startswith("watchdog: stopped") and "of service web" in line for line in lines), lines
