"""The test machine's install scripts (tests/cluster/*.sh): the functions a first start runs,
run for real in bash under the scripts' own ``set -Eeuo pipefail``.

The whole first start (every script from nothing, after ``prepare.sh purge``) is what
``.ci/run`` runs every time; these catch the same faults in a second, on any machine.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

CLUSTER = Path(__file__).resolve().parent / "cluster"


def run_sourced(script: str, body: str, state: Path) -> subprocess.CompletedProcess[str]:
    """Source ``script`` (it defines its functions and runs nothing when sourced), then run ``body``."""
    program = f'set -Eeuo pipefail; . "{CLUSTER / script}"; {body}'
    env = {**os.environ, "ALLOCSTACK_SLURM_STATE": str(state), "ALLOCSTACK_LEDGER_DIR": str(state / "ledger")}
    return subprocess.run(["bash", "-c", program], capture_output=True, text=True, env=env, timeout=60, check=False)


def test_the_configuration_digest_of_a_first_start_is_taken_before_any_configuration_exists(tmp_path):
    """A fresh machine has none of the files `start` compares before and after: the digest is
    still taken (it failed at 0 s under pipefail: `cat` of a missing file), and it changes once
    a file appears."""
    first = run_sourced("slurm.sh", "conf_digest", tmp_path)
    assert first.returncode == 0, first.stderr
    assert re.fullmatch(r"[0-9a-f]{64}  -\n", first.stdout)
    (tmp_path / "multi").mkdir()
    (tmp_path / "multi" / "slurm.conf").write_text("NodeName=mn1\n")
    second = run_sourced("slurm.sh", "conf_digest", tmp_path)
    assert second.returncode == 0, second.stderr
    assert second.stdout != first.stdout


def test_six_namespaced_nodes_in_two_sets_are_two_partitions_and_two_sets_in_the_layout(tmp_path):
    """`start --nodes 6 --sets 2` (what prepare.sh starts): slurmctld's configuration has every node and one
    partition per set of three, and the layout file the tests read names each set's partition, nodes and scratch,
    with the first set's at the top and the arguments of `start` that bring it all back."""
    result = run_sourced("slurm.sh", 'mkdir -p "$MULTI_DIR"; write_layout 6 2; multi_node_lines 6 2 | '
                                     'tee "$CONTROLLER_CONF"', tmp_path)
    assert result.returncode == 0, result.stderr
    assert [line for line in result.stdout.splitlines() if line.startswith("PartitionName=")] == [
        "PartitionName=multi Nodes=mn1,mn2,mn3 MaxTime=INFINITE State=UP",
        "PartitionName=multi2 Nodes=mn4,mn5,mn6 MaxTime=INFINITE State=UP"]
    assert sum(line.startswith("NodeName=mn") for line in result.stdout.splitlines()) == 6
    layout = json.loads((tmp_path / "multi" / "layout.json").read_text())
    assert layout["start"] == ["--nodes", "6", "--sets", "2"]
    assert [(part["partition"], sorted(part["nodes"])) for part in layout["sets"]] == [
        ("multi", ["mn1", "mn2", "mn3"]), ("multi2", ["mn4", "mn5", "mn6"])]
    assert layout["sets"][1]["nodes"]["mn5"] == "10.254.1.15"
    assert layout["sets"][1]["scratchDirs"]["mn4"] == str(tmp_path / "multi" / "mn4" / "scratch")
    assert (layout["partition"], layout["nodes"]) == ("multi", layout["sets"][0]["nodes"])
    partitions = run_sourced("slurm.sh", "multi_partitions", tmp_path)
    assert partitions.stdout == "multi,multi2\n", partitions.stderr


def test_sets_of_unequal_size_are_refused_in_one_line(tmp_path):
    result = subprocess.run(["bash", str(CLUSTER / "slurm.sh"), "start", "--nodes", "5", "--sets", "2"],
                            capture_output=True, text=True, timeout=30, check=False)
    assert result.returncode != 0
    assert result.stderr.strip().splitlines()[-1] == ("slurm.sh: error: --nodes 5 --sets 2: each set needs the same "
                                                      "number of nodes, at least 2")


def test_missing_packages_are_named_and_installed_ones_are_not(tmp_path):
    result = run_sourced("packages.sh", "PROG=t; packages_missing bash allocstack-no-such-package", tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["allocstack-no-such-package"]


def test_a_purge_without_a_ledger_removes_no_package(tmp_path):
    """What the machine had before a script installed anything is never in a ledger, so never purged."""
    result = run_sourced("packages.sh", "PROG=t; packages_purge slurm; echo done", tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "done\n" and "purging" not in result.stderr


def test_installing_what_is_installed_writes_no_ledger(tmp_path):
    result = run_sourced("packages.sh", "PROG=t; packages_install slurm bash coreutils", tmp_path)
    assert result.returncode == 0, result.stderr
    assert not (tmp_path / "ledger").exists()


def test_each_script_names_purge_in_its_usage():
    for script in ("slurm.sh", "apptainer.sh", "charliecloud.sh", "prepare.sh"):
        result = subprocess.run(["bash", str(CLUSTER / script), "no-such-command"], capture_output=True,
                                text=True, timeout=30, check=False)
        assert result.returncode != 0
        assert "purge" in result.stderr, (script, result.stderr)


def test_ci_purges_before_it_runs_the_readmes_test_command():
    """Every CI run exercises the first start: the purge comes before `make test`."""
    lines = [line.strip() for line in (CLUSTER.parent.parent / ".ci" / "run").read_text().splitlines()
             if line.strip() and not line.lstrip().startswith("#")]
    purge = lines.index("bash tests/cluster/prepare.sh purge")
    assert lines.index("make test") > purge


CONTAINER = CLUSTER.parent.parent / "container"

#: A stand-in for the `apptainer` that build.sh runs: it says a version (``$FAKE_VERSION``) and, asked to
#: build IMAGE from RECIPE (its last two words), writes a small file as IMAGE and a line to ``$BUILDS``;
#: build.sh's cache is what is tested.
FAKE_APPTAINER = """#!/bin/sh
if [ "$1" = --version ]; then echo "apptainer version $FAKE_VERSION"; exit 0; fi
if [ "$1" = build ]; then
  image=; recipe=
  for word; do image=$recipe; recipe=$word; done
  echo "built $recipe" >>"$BUILDS"
  echo "image of $recipe" >"$image"
  exit 0
fi
exit 2
"""


def test_an_image_is_taken_from_the_cache_until_its_recipe_build_script_or_apptainer_change(tmp_path):
    """`prepare.sh purge` keeps the image cache (CI's runs from nothing then skip ~400 s of builds), which is
    safe only if a change to anything that makes an image builds it again: the recipe, build.sh, Apptainer."""
    tools, builder, cache = tmp_path / "bin", tmp_path / "container", tmp_path / "cache"
    tools.mkdir()
    builder.mkdir()
    (tools / "apptainer").write_text(FAKE_APPTAINER)
    (tools / "apptainer").chmod(0o755)
    for name in ("build.sh", "oci.py"):
        (builder / name).write_bytes((CONTAINER / name).read_bytes())
    recipe = tmp_path / "image.def"
    recipe.write_text("Bootstrap: docker\nFrom: debian:bookworm\n")
    builds = tmp_path / "builds.log"
    builds.touch()

    def build(version: str = "1.4.5") -> str:
        env = {**os.environ, "PATH": f"{tools}:{os.environ['PATH']}", "FAKE_VERSION": version, "BUILDS": str(builds)}
        result = subprocess.run(["bash", str(builder / "build.sh"), "--cache-dir", str(cache), str(recipe),
                                 str(tmp_path / "out.sif")], capture_output=True, text=True, env=env, timeout=60,
                                check=False)
        assert result.returncode == 0, result.stderr
        return result.stdout

    def built() -> int:
        return len(builds.read_text().splitlines())

    assert "built from" in build() and built() == 1
    assert "cache hit" in build() and built() == 1
    with (builder / "build.sh").open("a") as script:
        script.write("# a changed build script\n")
    assert "built from" in build() and built() == 2
    assert "cache hit" in build() and built() == 2
    assert "built from" in build(version="1.4.6") and built() == 3
    recipe.write_text("Bootstrap: docker\nFrom: debian:trixie\n")
    assert "built from" in build(version="1.4.6") and built() == 4
    assert len(list(cache.glob("*.sif"))) == 4
    assert (tmp_path / "out.sif").read_text() == f"image of {recipe}\n"


def test_purge_keeps_the_image_cache_and_purge_all_removes_it():
    """What a purge keeps is said in prepare.sh's own usage and code: the cache by default, nothing with --all."""
    script = (CLUSTER / "prepare.sh").read_text()
    assert 'image_cache=${ALLOCSTACK_IMAGE_CACHE:-/var/cache/allocstack-images}' in script
    assert '--cache-dir "$image_cache"' in script
    assert "apptainer_home/images/cache" not in script  # inside the toolbox's home a purge would remove it
