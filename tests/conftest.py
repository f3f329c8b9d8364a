"""Shared fixtures: real coordinators on ephemeral loopback ports, real subprocesses."""

from __future__ import annotations

import hashlib
import json
import os
import pwd
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "workflow" / "scripts"
sys.path.insert(0, str(SCRIPTS))
PYTHON = sys.executable
# The runs' Python processes (Snakemake's jobs, launchers, gates: about 30 in a run) write their bytecode into the
# project, a throwaway copy, as a user's usually do. An environment that says not to (this machine's CI does) makes
# each of them compile allocstack's modules again: 13 % of a baseline run's CPU, measured (issue 29). The
# components in images keep their own setting (workflow/scripts/launch.py).
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)

from make_tasks import expected_for, make_tasks  # noqa: E402, F401  (the users' command makes the tests' tasks too)

from real_parts import multinode_set  # noqa: E402


@pytest.fixture(autouse=True)
def signal_handlers_as_they_were():
    """A test that runs a component's main() in the test process may leave SIGINT ignored (its cli.run
    ignores a second Ctrl-C): every process a later test starts would inherit SIG_IGN through exec and
    never see a Ctrl-C. Each test finds, and leaves, SIGINT and SIGTERM as they were before it."""
    before = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
    yield
    for signum, handler in before.items():
        if handler is not None and signal.getsignal(signum) is not handler:
            signal.signal(signum, handler)


@pytest.fixture
def supervisor_in_this_process(monkeypatch):
    """A supervisor (allocstack/launch/supervise.py) run in the test process: no launcher's lifeline in its
    environment, and the handlers it installs for the signals that end a job undone after the test."""
    from allocstack.launch.lifeline import ENV, FORWARDED_SIGNALS

    monkeypatch.delenv(ENV, raising=False)
    saved = {signum: signal.getsignal(signum) for signum in FORWARDED_SIGNALS}
    yield
    for signum, handler in saved.items():
        signal.signal(signum, handler)


def multinode_scope(nodeid: str) -> str | None:
    """The scope a multi-node test runs in, None for any other test. The multi-node tests need their nodes idle
    (and some crash one): under ``pytest -n`` (make test) each set of namespaced nodes has one scope, whose tests run
    one after another on one process, beside the rest (real_parts.multinode_set says which set). They are told by
    their id (the process that hands out the tests sees ids only): their file or their name says ``multinode``."""
    if "multinode" not in nodeid.split("[", 1)[0]:
        return None
    return f"multinode-{multinode_set(nodeid)}"


def pytest_collection_modifyitems(config, items):
    """A test marked multinode whose id does not say so would run beside the others: refused."""
    strays = [item.nodeid for item in items if item.get_closest_marker("multinode") and not multinode_scope(item.nodeid)]
    if strays:
        raise pytest.UsageError(f"marked multinode but 'multinode' is not in its file or name: {strays[0]}")
    # The multi-node scopes first (the suite's longest chains), then the rest as collected. Measured and left: the
    # runs under Slurm all first (ci-71: they queued on the default node while the machine's CPUs were 20-60 % busy
    # for 13 minutes), and spread evenly among the local tests (ci-73: most of the time every process waited in one,
    # the suite 59 % done where file order had 68 %).
    items.sort(key=lambda item: multinode_scope(item.nodeid) is None)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """pytest-xdist's loadgroup reads its groups into the tests' ids, which pytest 9 no longer lets it change:
    load scheduling, each set of multi-node tests as one scope (one process, one after another)."""
    if config.getvalue("dist") not in ("load", "loadgroup"):
        return None  # a distribution asked for by name: xdist's own
    from xdist.scheduler import LoadScopeScheduling

    class MultinodeTogether(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return multinode_scope(nodeid) or nodeid

    return MultinodeTogether(config, log)


def wait_for(predicate: Callable[[], Any], timeout: float = 60, what: str = "it", interval: float = 0.05) -> Any:
    """Poll ``predicate`` every ``interval`` seconds until it returns something true, and return that; fail
    naming ``what`` after ``timeout`` seconds (a bound, not a speed)."""
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(interval)
    return value


def write_json(path: Path, document) -> Path:
    path.write_text(json.dumps(document), encoding="utf-8")
    return path


def write_tasks_and_expected(project: Path, run: str, tasks: dict, output_of: Callable[[dict], str]) -> None:
    """Write ``tasks`` to ``inputs/<run>.json`` and their results, each output ``output_of(payload)``, to
    ``expected/<run>.json``."""
    results = []
    for task in tasks["tasks"]:
        output = output_of(task["payload"])
        results.append({"taskId": task["id"], "output": output, "sha256": hashlib.sha256(output.encode()).hexdigest()})
    write_json(project / f"inputs/{run}.json", tasks)
    write_json(project / f"expected/{run}.json", {"schemaVersion": 1, "results": results})


def run_script(name: str, *args: str, env: dict | None = None, timeout: float = 60, cwd: Path | None = None):
    return subprocess.run(
        [PYTHON, str(SCRIPTS / name), *map(str, args)],
        capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})}, cwd=cwd, check=False
    )


class RunningCoordinator:
    """A real coordinator process; ``url``/``token`` come from its endpoint file."""

    def __init__(self, tmp: Path, tasks: dict, *extra: str, scratch: Path | None = None,
                 env: dict[str, str] | None = None) -> None:
        self.tmp = tmp
        self.scratch = scratch or tmp / "scratch"
        self.tasks_path = write_json(tmp / "tasks.json", tasks)
        self.results = tmp / "results.json"
        self.end_record = tmp / "end.json"
        self.journal = tmp / "state" / "journal.jsonl"
        self.log = open(tmp / "coordinator.log", "w")  # noqa: SIM115  (the process's log, closed by stop())
        self.proc = subprocess.Popen(
            [PYTHON, str(SCRIPTS / "coordinator.py"), "--input", str(self.tasks_path), "--results", str(self.results),
             "--scratch", str(self.scratch), "--end-record", str(self.end_record), "--journal", str(self.journal),
             "--progress-interval", "3600", *extra],
            stdout=self.log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})},
        )
        endpoint = self.scratch / "endpoint.json"
        deadline = time.monotonic() + 15
        while not endpoint.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"coordinator did not start: {(tmp / 'coordinator.log').read_text()}")
            time.sleep(0.01)
        document = json.loads(endpoint.read_text())
        self.url, self.token = document["endpoint"], document["token"]
        self.endpoint_file = endpoint

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 15) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        code = self.proc.wait(timeout=timeout)
        self.log.close()
        return code

    def log_text(self) -> str:
        return (self.tmp / "coordinator.log").read_text()


@pytest.fixture
def start_coordinator(tmp_path):
    started: list[RunningCoordinator] = []

    def start(tasks: dict | None = None, *extra: str, scratch: Path | None = None,
              env: dict[str, str] | None = None) -> RunningCoordinator:
        coordinator = RunningCoordinator(tmp_path, tasks or make_tasks(4), *extra, scratch=scratch, env=env)
        started.append(coordinator)
        return coordinator

    yield start
    for coordinator in started:
        if coordinator.proc.poll() is None:
            coordinator.proc.kill()
            coordinator.proc.wait()


def memory_mb(pid: int, field: str = "VmRSS") -> float:
    """A memory figure of ``pid`` from /proc/PID/status in MB: ``VmRSS`` (now) or ``VmHWM`` (its peak); 0 if absent."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith(f"{field}:"):
                return int(line.split()[1]) / 1024
    return 0.0


def pids_mentioning(text: str) -> list[int]:
    """PIDs of live processes whose command line contains ``text`` (leftover-process checks)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode("utf-8", "replace")
            state = (entry / "stat").read_text().split(") ", 1)[1].split(" ", 1)[0]
        except (OSError, IndexError):
            continue
        if text in cmdline and state != "Z":
            found.append(int(entry.name))
    return found


def pids_of_run(workdir: Path, *helpers: str) -> list[int]:
    """PIDs of live processes of the run in ``workdir``: its path on their command line, or one of
    ``helpers`` (say "Apptainer runtime parent") on their command line and the path in their
    environment (every process of a test's run inherits TMPDIR=WORKDIR/tmp). Other runs on a shared
    machine are not touched."""
    found = set(pids_mentioning(str(workdir)))
    for pid in {pid for helper in helpers for pid in pids_mentioning(helper)} - found:
        try:
            environment = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            continue
        if str(workdir).encode() in environment:
            found.add(pid)
    return sorted(found)


@pytest.fixture
def project(tmp_path):
    """A fresh copy of the project to run Snakemake in; fails if any process of the run is left."""
    from workflow_helpers import copy_project

    workdir = copy_project(tmp_path / "project")
    yield workdir
    leftovers = pids_mentioning(str(workdir))
    for pid in leftovers:
        os.kill(pid, signal.SIGKILL)
    assert not leftovers, f"processes left running: {leftovers}"


OTHER_USER = "allocstack-other"


def local_user(name: str) -> pwd.struct_passwd:
    """The unprivileged local user ``name``, created once without a home or a shell (root only: skipped elsewhere)."""
    if os.geteuid() != 0:
        pytest.skip("creating a second local user needs root (CI runs this as root)")
    try:
        return pwd.getpwnam(name)
    except KeyError:
        made = subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name],
                              capture_output=True, text=True, check=False)
        # 9: another test process made it meanwhile (make test runs several)
        assert made.returncode in (0, 9), made.stderr
    return pwd.getpwnam(name)


def ensure_other_user() -> str:
    """A second, unprivileged local user (root only: skipped elsewhere), for "nobody else gets in" tests."""
    user = local_user(OTHER_USER).pw_name
    if not os.path.exists("/usr/bin/python3"):
        pytest.skip("no system /usr/bin/python3 for the other user")
    return user


@pytest.fixture
def other_user() -> str:
    return ensure_other_user()


@pytest.fixture
def broken_root(tmp_path):
    """``broken_root(kind)``: a scratch root that is ``read-only`` or ``full`` (a real filesystem: root only);
    unmounted after the test."""
    from scratch_helpers import ROOTS, unmount

    made: list[Path] = []

    def make(kind: str, path: Path | None = None) -> Path:
        root = ROOTS[kind](path or tmp_path / f"{kind}-root")
        made.append(root)
        return root

    yield make
    for root in reversed(made):
        unmount(root)
