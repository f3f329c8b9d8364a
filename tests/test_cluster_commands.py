"""The cluster commands of the README and the docs, each run as written against the test cluster: each run
records its image in provenance.json. Before issue 27 the Slurm profile named the image in its `config:` list,
which any `--config` on the command line replaced: `snakemake --profile profiles/slurm --config run=x` went
through Slurm job steps without the image and said VERIFIED. The image is now config `image` (`auto`:
container/allocstack.sif under the profile's --sdm apptainer), which neither --config nor --configfile erases.

The project copy gets the test cluster's image at container/allocstack.sif (what `container/build.sh
container/allocstack.def container/allocstack.sif` makes on a real cluster; tests/cluster/prepare.sh built it
from container/test.def). The test cluster's account and partition are the profile's own; a command for more
nodes than partition debug has runs in partition multi (its `--default-resources`, appended: nothing else).
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
from pathlib import Path

import pytest
from test_compose_stacks import free_port
from test_multinode import multinode_project  # noqa: F401 (a fixture)
from test_slurm import cluster_project, the_stack_job  # noqa: F401 (a fixture)

from conftest import ROOT, run_script
from workflow_helpers import snakemake

pytestmark = [pytest.mark.slurm, pytest.mark.apptainer]

#: Where the README and the docs show cluster commands.
PAGES = ["README.md", "docs/cluster.md", "docs/multinode.md", "docs/compose.md"]
PROFILE = "snakemake --profile profiles/slurm"
#: Every one of them (a new one in the docs fails test_every_cluster_command_of_the_docs_is_run until it is run here).
COMMANDS = {
    PROFILE: "baseline",
    f"{PROFILE} --dry-run": None,
    f"{PROFILE} --configfile config/examples/primes/config.yaml": "primes",
    f"{PROFILE} --configfile config/mystack.yaml": "kvstack",
    f"{PROFILE} --config nodes=3 workers=6": "baseline",
}
#: The command of issue 27's walk: a --config on the command line.
WALK = f"{PROFILE} --config run=x"
#: Shown in the docs and run as written by another test file (with the test cluster's resources added): command ->
#: that file, which must hold the command's every word.
RUN_ELSEWHERE = {f"{PROFILE} --configfile config/fastapi-celery.yaml": "tests/test_public_stacks.py",
                 f"{PROFILE} --configfile config/flask-celery.yaml": "tests/test_public_stacks.py",
                 f"{PROFILE} --configfile config/fastapi-celery-serve.yaml": "tests/test_public_stacks.py"}


def commands_in_the_docs() -> set[str]:
    """Every `snakemake --profile profiles/slurm ...` line of a code block (or a `(on a cluster: ...)` comment) in
    :data:`PAGES`, its trailing `# comment` cut; not the `$ ` lines of a transcript."""
    found = set()
    for page in PAGES:
        text = (ROOT / page).read_text(encoding="utf-8")
        blocks = re.findall(r"^```[a-z]*\n(.*?)^```", text, flags=re.MULTILINE | re.DOTALL)
        for line in "\n".join(blocks).splitlines():
            line = line.strip()
            if line.startswith("$ "):
                continue  # a transcript's output (docs/cluster.md's long.yaml: test_slurm.py runs it, with retries)
            start = line.find(PROFILE)
            if start == 0 or (start > 0 and "(on a cluster: " in line):
                command = line[start:].split("  #")[0].split(")")[0].strip()
                found.add(command)
    return found


def test_every_cluster_command_of_the_docs_is_run():
    assert commands_in_the_docs() == set(COMMANDS) | set(RUN_ELSEWHERE)
    for command, test_file in RUN_ELSEWHERE.items():
        text = (ROOT / test_file).read_text(encoding="utf-8")
        assert all(f'"{word}"' in text for word in shlex.split(command)[1:]), (command, test_file)


def with_the_image(project: Path, image: str) -> None:
    """container/allocstack.sif and its sidecar: the test cluster's image, where the README's build puts one."""
    (project / "container/allocstack.sif").symlink_to(image)
    (project / "container/allocstack.sif.sha256").symlink_to(f"{image}.sha256")


def run_as_written(project: Path, command: str, *appended: str, timeout: float = 600):
    words = shlex.split(command)
    assert words[0] == "snakemake"
    return snakemake(project, *words[1:], *appended, timeout=timeout)


def assert_the_image_is_recorded(project: Path, run: str, output: str) -> None:
    provenance = json.loads((project / f"results/{run}/provenance.json").read_text())
    sidecar = (project / "container/allocstack.sif.sha256").read_text().split()[0]
    assert provenance["image"] == "container/allocstack.sif" and provenance["imageSha256"] == sidecar, output[-3000:]
    assert provenance["identity"]["imageSha256"] == sidecar
    assert provenance["containerRuntime"]["name"] == "apptainer", provenance["containerRuntime"]
    image = str(project / "container/allocstack.sif")
    assert {name: component["container"] for name, component in provenance["components"].items()} == dict.fromkeys(
        provenance["components"], image)
    assert provenance["slurm"]["jobId"]
    record = (project / f"results/{run}/decision-record.md").read_text()
    assert "- image: `container/allocstack.sif`" in record and "- job steps: `yes: each component its own Slurm job" \
        in record


def test_the_readmes_cluster_commands_as_written_record_the_image(cluster_project):  # noqa: F811
    project, image = cluster_project
    with_the_image(project, image)
    dry = run_as_written(project, f"{PROFILE} --dry-run", timeout=120)
    assert dry.returncode == 0 and "allocstack: error" not in dry.stdout + dry.stderr, (dry.stdout + dry.stderr)[-3000:]

    # the README's Compose section: its import, as written, of a Compose file of one's own (tests/stacks/kv)
    for part in ("app", "jobs"):
        shutil.copytree(ROOT / "tests/stacks/kv" / part, project / part)
    compose = (ROOT / "tests/stacks/kv/compose.yaml").read_text().replace("8080", str(free_port()))
    (project / "compose.yaml").write_text(compose)
    imported = run_script("import_compose.py", "compose.yaml", "--output", "config/mystack.yaml", cwd=project)
    assert imported.returncode == 0, imported.stdout + imported.stderr

    # The import names one image per service (`build: ./app`: images/kvstack-app.sif); the user builds it from
    # ./app. Here the test image stands for that build (python3 on a Debian root, as ./app needs).
    (project / "images").mkdir()
    (project / "images/kvstack-app.sif").symlink_to(image)
    digest = Path(f"{image}.sha256").read_text().split()[0]
    (project / "images/kvstack-app.sif.sha256").write_text(f"{digest}  kvstack-app.sif\n")

    for command, run in [*((c, r) for c, r in COMMANDS.items() if r and "nodes=3" not in c), (WALK, "x")]:
        done = run_as_written(project, command)
        output = done.stdout + done.stderr
        assert done.returncode == 0, (command, output[-4000:])
        the_stack_job(output, project)
        if run == "kvstack":
            assert_the_services_ran_in_their_image(project, run, output)
        else:
            assert_the_image_is_recorded(project, run, output)


def assert_the_services_ran_in_their_image(project: Path, run: str, output: str) -> None:
    """Your Compose stack under the profile: each program of yours in the image its service names."""
    assert json.loads((project / f"results/{run}/result.json").read_text())["status"] == "success", output[-3000:]
    provenance = json.loads((project / f"results/{run}/provenance.json").read_text())
    images = provenance["programImages"]
    assert images and all(entry["image"] == "images/kvstack-app.sif" for entry in images.values()), images
    kv = provenance["components"]["kv"]["container"]
    assert kv == str(project / "images/kvstack-app.sif"), provenance["components"]


def test_the_multinode_command_as_written_records_the_image(multinode_project):  # noqa: F811
    project, image, layout = multinode_project
    with_the_image(project, image)
    [command] = [c for c in COMMANDS if "nodes=3" in c]
    done = run_as_written(project, command, "--default-resources", "slurm_account=allocstack",
                          f"slurm_partition={layout['partition']}", "mem_mb=300", "runtime=10")
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    assert_the_image_is_recorded(project, "baseline", output)
    provenance = json.loads((project / "results/baseline/provenance.json").read_text())
    assert {component["host"] for component in provenance["components"].values()} == set(layout["nodes"])
