"""Compose's secrets and configs read where Compose puts them, by programs of a stack imported as a user brings it.

The stack is tests/stacks/secrets: two worker replicas and a check, each in the test image (Debian's python3 and
nothing at /run/secrets), with ``secrets: [token]`` (a file, so at /run/secrets/token) and a config with a
``target:`` (/srv/app/settings.ini). The workers read both (the secret at the path ``$TOKEN_FILE`` names, as Docker
Hub's images take a ``_FILE`` variable; the config at the path on their command line) and write what they read to
the named volume; the check reads both itself and passes only when every worker read the same. Imported with
``import_compose.py --images DIR`` (the directory where the test images are, with their sidecars), it runs
unchanged in its image under Apptainer and under Charliecloud, and without an image, where the import's path
rewriting gives the programs the files' own paths.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from pathlib import Path

import pytest
from test_program_images import replica
from test_stack_images import NO_APPTAINER_PATH, project  # noqa: F401 (a fixture)

from conftest import run_script
from real_parts import require_apptainer, require_charliecloud, require_charliecloud_squashfs
from workflow_helpers import ROOT, snakemake

STACK = ROOT / "tests" / "stacks" / "secrets"
#: What the check says when every worker read the secret and the config: the paths they read them at.
SAID = ("check: 2 workers read the secret at {token} (sha256 {digest}) and the config at {settings}: greeting = "
        "hello from a Compose config")


def import_secrets(workdir: Path, run: str, images: Path | None, runtime: str = "apptainer") -> str:
    """Copy tests/stacks/secrets into the project in ``workdir`` and import it, its images expected in ``images``
    (the test image's directory); the config's path."""
    shutil.copytree(STACK, workdir / "stacks" / "secrets")
    extra = ["--runtime", runtime, *(["--images", str(images)] if images else [])]
    done = run_script("import_compose.py", "stacks/secrets/compose.yaml", "--output", f"config/{run}.yaml",
                      "--run", run, *extra, cwd=workdir)
    assert done.returncode == 0 and "0 gap(s)" in done.stdout, done.stdout + done.stderr
    config = (workdir / f"config/{run}.yaml").read_text()
    assert "target: /run/secrets/token" in config and "target: /srv/app/settings.ini" in config
    return f"config/{run}.yaml"


def check_read(workdir: Path, run: str, token: str, settings: str) -> None:
    """The run verified, and the check says every worker read the secret and the config at these paths."""
    assert json.loads((workdir / f"results/{run}/result.json").read_text())["status"] == "success"
    digest = hashlib.sha256((STACK / "token.txt").read_bytes()).hexdigest()[:12]
    log = (workdir / f"logs/run_check/{run}.log").read_text()
    assert SAID.format(token=token, digest=digest, settings=settings) in log, log[-3000:]
    assert (STACK / "token.txt").read_text() not in log  # the secret itself is never logged


@pytest.mark.apptainer
def test_secrets_and_configs_are_read_at_their_compose_paths_with_apptainer(project):  # noqa: F811
    image = Path(require_apptainer())
    config = import_secrets(project, "secrets", image.parent)
    started = time.monotonic()
    done = snakemake(project, "--cores", "4", "--sdm", "apptainer", "--configfile", config)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    print(f"secrets stack with Apptainer: {time.monotonic() - started:.1f} s")
    check_read(project, "secrets", "/run/secrets/token", "/srv/app/settings.ini")
    worker_log = (project / "logs/run_worker/secrets/worker-01.log").read_text()
    binds = f"secrets/token.txt:/run/secrets/token:ro --bind {project}/stacks/secrets/settings.ini:/srv/app/settings.ini:ro"
    assert binds in worker_log and f"{image.name} python3 /opt/app/read.py" in worker_log


@pytest.mark.charliecloud
def test_secrets_and_configs_are_read_at_their_compose_paths_with_charliecloud(project):  # noqa: F811
    """The test image has no /run/secrets and no /srv/app: ch-run (0.31) binds only onto paths an image has, so
    each program gets a private /run (the image's directories there made again) and a private /srv (empty in the
    image); the secret is read-only there too."""
    image = Path(require_charliecloud())
    assert not (image / "run/secrets").exists() and not any((image / "srv").iterdir())
    config = import_secrets(project, "secrets-ch", image.parent, "charliecloud")
    started = time.monotonic()
    done = snakemake(project, "--cores", "4", "--configfile", config, env={"PATH": NO_APPTAINER_PATH})
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    print(f"secrets stack with Charliecloud: {time.monotonic() - started:.1f} s")
    check_read(project, "secrets-ch", "/run/secrets/token", "/srv/app/settings.ini")
    worker_log = (project / "logs/run_worker/secrets-ch/worker-01.log").read_text()
    tree = "/programs/worker-01/mounts"
    assert f"{tree}/run:/run --bind=" in worker_log and f"{tree}/srv:/srv --bind=" in worker_log
    assert "/read-only-2:/run/secrets/token --bind=" in worker_log  # a read-only view: a write there fails


def test_secrets_and_configs_are_read_at_their_files_without_an_image(project):  # noqa: F811
    """Without an image the import's path rewriting gives the programs the files' own paths, in the variable that
    names the secret and on the command line that names the config."""
    config = import_secrets(project, "secrets-host", None)
    started = time.monotonic()
    done = snakemake(project, "--cores", "4", "--configfile", config)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    print(f"secrets stack without an image: {time.monotonic() - started:.1f} s")
    here = project / "stacks" / "secrets"
    check_read(project, "secrets-host", str(here / "token.txt"), str(here / "settings.ini"))
    worker_log = (project / "logs/run_worker/secrets-host/worker-01.log").read_text()
    assert "in its image" not in worker_log and f"python3 {here}/app/read.py exited 0" in worker_log


@pytest.mark.charliecloud
def test_a_secret_in_a_squashfs_image_and_a_config_no_private_directory_can_hold(tmp_path):
    """A SquashFS image cannot be looked into before ch-run mounts it: /run is made private all the same, and the
    secret is read there, read-only. A config whose directory holds the image's own files (/etc) cannot have a
    private one in its place without hiding them: one line naming the path, before the program starts."""
    token = tmp_path / "token.txt"
    token.write_text("s3cret\n")
    program = ("import sys\nprint(open('/run/secrets/token').read().strip() == 's3cret', file=sys.stderr)\n"
               "try:\n    open('/run/secrets/token', 'w')\nexcept OSError as exc:\n    print(exc.strerror, file=sys.stderr)\n")
    secret = {"target": "/run/secrets/token", "source": str(token), "read_only": True}
    done = replica(tmp_path, "charliecloud", require_charliecloud_squashfs(), "--command-json",
                   json.dumps(["python3", "-c", program]), "--mounts-json", json.dumps([secret]))
    assert done.returncode == 0, done.stderr[-2000:]
    assert "True\nRead-only file system\n" in done.stderr
    image = require_charliecloud()
    config = {"target": "/etc/app.ini", "source": str(token), "read_only": True}
    refused = replica(tmp_path, "charliecloud", image, "--command-json", json.dumps(["true"]),
                      "--mounts-json", json.dumps([config]))
    assert refused.returncode == 69
    said = (f"allocstack: error [prerequisite]: image {image} has no file /etc/app.ini to mount {token} onto: ch-run "
            "binds only onto paths the image has, and a private /etc would hide what the image keeps there")
    assert said in refused.stderr and "in its image" not in refused.stderr
