"""The test machine's install scripts (tests/cluster/*.sh): the functions a first start runs,
run for real in bash under the scripts' own ``set -Eeuo pipefail``.

The whole first start (every script from nothing, after ``prepare.sh purge``) is what
``.ci/run`` runs every time; these catch the same faults in a second, on any machine.
"""

from __future__ import annotations

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
