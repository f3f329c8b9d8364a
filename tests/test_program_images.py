"""A program of yours in its own image, under real Apptainer and real Charliecloud: the supervisor (replica.py,
app_service.py, check.py, readiness.py) runs beside the image and starts the program in it.

The images are the stack images tests/cluster/prepare.sh builds from Debian packages as Docker Hub gives images
(container/stacks/: ``redis``, with no python3 in it; ``python-app``, ENTRYPOINT python3, CMD app.py, WORKDIR
/code): a SIF for Apptainer, a directory laid out as ``ch-image pull`` leaves one for Charliecloud. Each row of
docs/compose.md's mapping that changed is run here: a volume at its container path (a program that opens the
literal path), ``:ro`` enforced (a write fails), the image's own command (and Compose's entrypoint/command rules),
``working_dir``, the port an image EXPOSEs, ``${env:NAME}`` read from the environment when the program starts.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_compose_stacks import free_port

from conftest import PYTHON, SCRIPTS
from real_parts import unavailable

RUNTIMES = ["apptainer", "charliecloud"]


def stack_image(runtime: str, name: str) -> str:
    """The stack image NAME for ``runtime`` (prepare.sh builds them), or skip (in CI: fail) saying why."""
    from real_parts import require_apptainer, require_charliecloud

    if runtime == "apptainer":
        require_apptainer()
        image = Path(os.environ.get("ALLOCSTACK_STACK_IMAGES", "")) / f"{name}.sif"
    else:
        require_charliecloud()
        image = Path(os.environ.get("ALLOCSTACK_STACK_IMAGES_CHARLIECLOUD", "")) / name
    if not image.exists() or not Path(f"{image}.sha256").exists():
        unavailable(f"no stack image {image} (tests/cluster/prepare.sh builds it)")
    return str(image)


def placement(runtime: str, image: str, *extra: str) -> list[str]:
    args = ["--image", image, "--runtime", runtime]
    if runtime == "apptainer":
        args += ["--runtime-arg=--cleanenv", "--runtime-arg=--contain"]
    return [*args, *extra]


def replica(tmp_path: Path, runtime: str, image: str, *extra: str, env: dict[str, str] | None = None,
            volumes: dict[str, Path] | None = None) -> subprocess.CompletedProcess:
    """replica.py (a long-running worker) with its program in ``image``; named volumes as launch.py gives them."""
    scratch = tmp_path / "scratch"
    scratch.mkdir(mode=0o700, exist_ok=True)
    environ = {**os.environ, "USER": os.environ.get("USER") or "root", **(env or {})}
    for name, path in (volumes or {}).items():
        environ[f"ALLOCSTACK_VOLUME_{name.upper()}"] = str(path)
    return subprocess.run([PYTHON, str(SCRIPTS / "replica.py"), "--worker-id", "worker-01", "--index", "0",
                           "--workers", "1", "--scratch", str(scratch), *placement(runtime, image, *extra)],
                          capture_output=True, text=True, timeout=120, env=environ, cwd=tmp_path, check=False)


@pytest.fixture(params=RUNTIMES)
def runtime(request):
    return request.param


def test_a_volume_is_at_its_container_path_and_a_read_only_mount_refuses_writes(tmp_path, runtime):
    """The issue's worker: it writes /work/item-0001.out, the path its Compose file mounts the volume at; a bind
    with :ro is readable and a write there fails."""
    work, inputs = tmp_path / "volume-work", tmp_path / "inputs"
    work.mkdir()
    inputs.mkdir()
    (inputs / "in.txt").write_text("payload\n")
    image = stack_image(runtime, "python-app")  # its image config declares VOLUME /work, as a Dockerfile would
    program = ("import pathlib, sys\n"
               "pathlib.Path('/work/item-0001.out').write_text(open('/mnt/in.txt').read().upper())\n"
               "try:\n    open('/mnt/x', 'w')\nexcept OSError as exc:\n    sys.stderr.write(f'read-only: {exc.strerror}\\n')\n"
               "else:\n    sys.exit('wrote into a read-only mount')\n")
    mounts = [{"target": "/work", "volume": "work"}, {"target": "/mnt", "source": str(inputs), "read_only": True}]
    done = replica(tmp_path, runtime, image, "--command-json", json.dumps(["-c", program]),
                   "--mounts-json", json.dumps(mounts), volumes={"work": work})
    assert done.returncode == 0, done.stderr[-2000:]
    assert (work / "item-0001.out").read_text() == "PAYLOAD\n"
    assert "read-only: Read-only file system" in done.stderr and not (inputs / "x").exists()
    if runtime == "charliecloud":  # ch-run binds only onto a path a directory image has: said before it starts
        missing = replica(tmp_path, runtime, image, "--command-json", json.dumps(["-c", "pass"]),
                          "--mounts-json", json.dumps([{"target": "/in", "source": str(inputs)}]))
        assert missing.returncode == 69
        said = f"image {image} has no directory /in to mount {inputs} onto: ch-run binds only onto paths the image has"
        assert said in missing.stderr


def test_the_images_own_command_and_composes_entrypoint_and_command_rules(tmp_path, runtime):
    """python-app's ENTRYPOINT is python3, its CMD app.py, its WORKDIR /code: no command runs `python3 app.py` in
    /code; a command replaces the CMD only (python3 other.py); an entrypoint replaces both; working_dir moves it."""
    code = tmp_path / "code"
    code.mkdir()
    (code / "app.py").write_text("import os, sys\nprint('app', os.getcwd(), sys.argv[1:], file=sys.stderr)\n")
    (code / "other.py").write_text("import os, sys\nprint('other', os.getcwd(), sys.argv[1:], file=sys.stderr)\n")
    image = stack_image(runtime, "python-app")
    mount = ["--mounts-json", json.dumps([{"target": "/code", "source": str(code), "read_only": True}])]
    own = replica(tmp_path, runtime, image, *mount)
    assert own.returncode == 0 and "app /code []" in own.stderr, own.stderr[-2000:]
    command = replica(tmp_path, runtime, image, *mount, "--command-json", json.dumps(["other.py", "x"]))
    assert command.returncode == 0 and "other /code ['x']" in command.stderr, command.stderr[-2000:]
    entry = replica(tmp_path, runtime, image, *mount, "--entrypoint-json", json.dumps(["python3", "/code/other.py"]),
                    "--working-dir", "/tmp")
    assert entry.returncode == 0 and "other /tmp []" in entry.stderr, entry.stderr[-2000:]  # CMD dropped


def test_an_image_without_python_runs_its_own_command_and_a_secret_comes_from_the_environment(tmp_path, runtime):
    """The redis image has no python3: its supervisor runs beside it. ${env:NAME} is read when the program starts
    and is not on any command line (a process listing would show it to every user of the node)."""
    image = stack_image(runtime, "redis")
    secret = "not-on-a-command-line"  # noqa: S105
    done = replica(tmp_path, runtime, image, "--command-json",
                   json.dumps(["sh", "-c", 'test "$REDIS_PASSWORD" = "$1" && ! command -v python3 && redis-server --version',
                               "sh", "${env:SECRET_FROM_SHELL}"]),
                   "--environment-json", json.dumps({"REDIS_PASSWORD": "${env:SECRET_FROM_SHELL}"}),
                   env={"SECRET_FROM_SHELL": secret})
    assert done.returncode == 0, done.stderr[-2000:]
    assert "Redis server v=7.0" in done.stdout + done.stderr
    unset = replica(tmp_path, runtime, image, "--environment-json", json.dumps({"P": "${env:NOT_SET_ANYWHERE}"}))
    assert unset.returncode == 78
    said = "allocstack: error [config]: worker: environment P: ${env:NOT_SET_ANYWHERE} is not set in the environment"
    assert said in unset.stderr


def test_a_service_in_its_image_behind_a_command_gate_in_the_same_image(tmp_path, runtime):
    """app_service.py starts redis-server from the redis image (a volume at /data, its WORKDIR); readiness.py's
    command gate runs `redis-cli ping` in the same image, as Compose runs a healthcheck in the container."""
    image = stack_image(runtime, "redis")
    scratch, data = tmp_path / "scratch", tmp_path / "volume-data"
    scratch.mkdir(mode=0o700)
    data.mkdir()
    port = free_port()
    env = {**os.environ, "USER": os.environ.get("USER") or "root", "ALLOCSTACK_VOLUME_DATA": str(data)}
    mounts = ["--mounts-json", json.dumps([{"target": "/data", "volume": "data"}])]
    service = subprocess.Popen(
        [PYTHON, str(SCRIPTS / "app_service.py"), "--name", "redis", "--scratch", str(scratch), "--port", str(port),
         "--command-json", json.dumps(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "yes"]),
         *placement(runtime, image, *mounts)],
        stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path)
    try:
        gate = subprocess.run(
            [PYTHON, str(SCRIPTS / "readiness.py"), "--scratch", str(scratch), "--service", "redis", "--mode",
             "command", "--ready-command-json", json.dumps(["redis-cli", "-p", str(port), "ping"]), "--timeout", "60",
             "--interval", "0.25", *placement(runtime, image, *mounts)],
            capture_output=True, text=True, timeout=90, env=env, cwd=tmp_path, check=False)
        assert gate.returncode == 0, gate.stderr[-2000:]
        assert (data / "appendonlydir").is_dir()  # redis wrote its data where /data is mounted
    finally:
        service.terminate()
        assert service.wait(timeout=60) == 0, service.stderr.read()[-2000:]
    end = json.loads((scratch / "services" / "redis.end.json").read_text())
    assert end["status"] == "stopped"
    events = [json.loads(line) for line in (scratch / "events" / "redis.jsonl").read_text().splitlines()]
    assert events[0]["container"] == image and events[0]["command"] == "redis-server"


def test_the_port_its_image_exposes(tmp_path, runtime):
    """port: image -> the lowest TCP port the image EXPOSEs (6379), read from the SIF's oci-config.json or the
    directory's /ch/config.pulled.json; an image that EXPOSEs none is refused with one line."""
    sys.path.insert(0, str(SCRIPTS))
    from app_service import image_port

    from allocstack.common.errors import AllocstackError
    from allocstack.launch.program import Placement

    assert image_port(Placement(stack_image(runtime, "redis"), runtime), "redis") == 6379
    with pytest.raises(AllocstackError) as error:
        image_port(Placement(stack_image(runtime, "python-app"), runtime), "app")
    assert error.value.diag == "config" and "EXPOSEs no TCP port" in error.value.message
