"""Running the real workflow in a temporary copy of the project."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SNAKEMAKE = str(Path(sys.executable).parent / "snakemake")
PROJECT_PARTS = ["Snakefile", "workflow", "config", "inputs", "expected", "profiles", "container"]

#: The Snakefile of a workflow of yours (beside a copy of allocstack in ../allocstack) that uses allocstack as
#: a module, its config under the key ``allocstack``: what you add goes after it.
MODULE_USER = '''\
configfile: "config.yaml"


module allocstack:
    snakefile:
        "../allocstack/Snakefile"
    config:
        config["allocstack"]


use rule * from allocstack as allocstack_*
'''


def long_running_head(run: str, workers: int, program: str) -> str:
    """The first lines of the config of run ``run``: no tasks, ``workers`` long-running workers that each run the
    Python ``program`` (``python -c``); the test adds its services, volumes and check below them."""
    return textwrap.dedent(f"""\
        run: {run}
        tasks: null
        expected: null
        workers: {workers}
        worker: {{mode: long-running, command: [{json.dumps(sys.executable)}, -c, {json.dumps(program)}]}}
    """)


def assert_run_failed(project: Path, run: str, done: subprocess.CompletedProcess, line: str) -> None:
    """Snakemake's run ``run`` failed, said ``line``, and wrote no result."""
    output = done.stdout + done.stderr
    assert done.returncode != 0
    assert line in output, output[-4000:]
    assert not (project / f"results/{run}/result.json").exists()


def copy_project(destination: Path) -> Path:
    """Copy what a user clones (no results, logs or .snakemake) to ``destination``."""
    destination.mkdir(parents=True, exist_ok=True)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.sif")
    for part in PROJECT_PARTS:
        source = ROOT / part
        if source.is_dir():
            shutil.copytree(source, destination / part, ignore=ignore)
        elif source.exists():
            shutil.copy2(source, destination / part)
    (destination / "tmp").mkdir()
    return destination


@contextlib.contextmanager
def killed_at_the_end(run: subprocess.Popen) -> Iterator[subprocess.Popen]:
    """``run`` (started with ``start_new_session=True``), whose whole process group is killed if it still runs
    when the block ends: a test that failed half-way leaves nothing running."""
    try:
        yield run
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)


def snakemake(workdir: Path, *args: str, timeout: float = 300, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run snakemake exactly as a user would, in ``workdir``, bounded by ``timeout``.

    With the venv active (``. .venv/bin/activate``, as the README says): a command of yours
    that names ``python3`` (the seed's Compose stack runs the coordinator that way) gets the
    venv's Python and its pinned packages (requests, h11), as it would for a user.
    """
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    environment = {**os.environ, "PATH": path, "TMPDIR": str(workdir / "tmp"), **(env or {})}
    return subprocess.run(
        ["timeout", "-k", "10", str(timeout), SNAKEMAKE, *args],
        cwd=workdir, capture_output=True, text=True, env=environment, check=False
    )


#: The system's interpreter: what another user runs Snakemake with (the venv's own may live where only its owner
#: can reach it, a pyenv under /root), with the venv's packages on PYTHONPATH (:func:`user_environment`).
SYSTEM_PYTHON = "/usr/bin/python3"


def venv_site_packages() -> str:
    return next(p for p in sys.path if p.startswith(sys.prefix) and p.endswith("site-packages"))


def user_environment(user: str, home: Path, tmpdir: Path, path: str) -> dict[str, str]:
    """The whole environment of Snakemake run by another user: their HOME, USER, TMPDIR and PATH, the venv's
    packages."""
    return {"PATH": path, "HOME": str(home), "USER": user, "TMPDIR": str(tmpdir), "LANG": "C.UTF-8",
            "PYTHONPATH": venv_site_packages()}


def snakemake_as(user: str, project: Path, *args: str, env: dict[str, str], timeout: float = 300
                 ) -> subprocess.CompletedProcess:
    """Snakemake in ``project`` as ``user`` (root only: ``runuser``), with exactly the environment ``env``
    (:func:`user_environment`), bounded by ``timeout``."""
    return subprocess.run(["runuser", "-u", user, "--", "env", "-i", *(f"{k}={v}" for k, v in env.items()),
                           "timeout", "-k", "10", str(timeout), SYSTEM_PYTHON, "-m", "snakemake", *args],
                          cwd=project, capture_output=True, text=True, timeout=timeout + 30, check=False)


def project_for_another_user(prefix: str) -> tuple[Path, Path, Path]:
    """A directory in /tmp that another user may traverse, holding a copy of the project and a home (both still
    root's: chown them to the user): ``(base, project, home)``; remove ``base`` after the test."""
    import tempfile

    base = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    os.chmod(base, 0o755)  # noqa: S103  (the other user must reach the project)
    project = copy_project(base / "project")
    home = base / "home"
    home.mkdir()
    return base, project, home


def tunnel_target(line: str) -> tuple[str, str]:
    """``ssh [-J hop] -N -L LOCAL:TARGET user@NODE`` -> (TARGET, NODE): TARGET the service's owner-only socket in the
    stack's private network (the default), ``127.0.0.1:PORT`` on the node's own (network.isolation none)."""
    found = re.search(r"-N -L (\d+):(\S+) \S+@(\S+)$", line)
    assert found, line
    return found.group(2), found.group(3)


class _UnixHTTPConnection(http.client.HTTPConnection):
    """HTTP over a Unix socket (a service's owner-only socket: what ``ssh -L PORT:SOCKET`` forwards to)."""

    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self.socket_path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self.socket_path)


def ask(target: str, path: str, payload: dict | None = None, timeout: float = 30) -> tuple[int, bytes]:
    """A service at ``target`` (a tunnel line's: its socket's path, or ``HOST:PORT``): a JSON POST of ``payload`` to
    ``path``, or a GET; the answer's status code and body."""
    if target.startswith("/"):
        connection: http.client.HTTPConnection = _UnixHTTPConnection(target, timeout)
    else:
        connection = http.client.HTTPConnection(target, timeout=timeout)
    try:
        body = None if payload is None else json.dumps(payload).encode()
        connection.request("GET" if body is None else "POST", path, body=body,
                           headers={"Content-Type": "application/json"})
        answer = connection.getresponse()
        data = answer.read()
    finally:
        connection.close()
    return answer.status, data


def ask_json(target: str, path: str, payload: dict | None = None, timeout: float = 30) -> dict:
    """:func:`ask`, the answer's JSON (a status other than 2xx fails the test)."""
    status, data = ask(target, path, payload, timeout)
    assert 200 <= status < 300, (status, data[:500])
    return json.loads(data)
