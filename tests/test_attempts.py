"""Runs never share scratch, a second start of a live run is refused in one line naming the first, and a
later attempt of a command does not repeat an earlier attempt's failure that it cannot change.

Real Snakemake runs, real launchers and processes; the Slurm ones on the test cluster
(tests/cluster/slurm.sh), where each attempt is a new allocation (the profile's ``retries``).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from allocstack.common import attempts
from allocstack.common.attempts import COMMAND_ENV, Command
from conftest import SCRIPTS, write_json
from conftest import wait_for as poll
from real_parts import require_multinode, require_slurm
from workflow_helpers import SNAKEMAKE, copy_project, snakemake

# -- the records, with real processes --------------------------------------------------------------------

def test_a_run_counts_as_live_only_while_its_command_or_its_job_lives(tmp_path):
    first = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        command = Command(attempts.host(), first.pid, attempts.process_start(first.pid))
        attempts.claim(tmp_path, "baseline", command)
        asked: list[str] = []
        who = attempts.live_elsewhere(tmp_path, None, lambda job: asked.append(job))
        assert who.startswith(f"snakemake pid {first.pid} on {attempts.host()} since ") and not asked
        assert attempts.live_elsewhere(tmp_path, command, lambda job: True) is None  # its own launchers
        attempts.claim(tmp_path, "baseline", command, "4242", "mn1")
        assert attempts.live_elsewhere(tmp_path, None, lambda job: None).endswith(", Slurm job 4242 on mn1")
    finally:
        first.kill()
        first.wait()
    assert attempts.live_elsewhere(tmp_path, None, lambda job: False) is None  # its command and its job ended
    assert "Slurm job 4242" in attempts.live_elsewhere(tmp_path, None, lambda job: True)  # its job goes on
    elsewhere = Command("login2", first.pid, 1)  # another host: only its Slurm job can tell
    attempts.claim(tmp_path, "baseline", elsewhere, "4243", "mn2")
    assert "Slurm job 4243 on mn2" in attempts.live_elsewhere(tmp_path, None, lambda job: job == "4243")
    assert attempts.live_elsewhere(tmp_path, None, lambda job: False) is None
    assert attempts.live_elsewhere(tmp_path, None, lambda job: None) is None  # Slurm forgot it: ended


LASTING = ("import sys; print('allocstack: error [config]: services.kv.port: 99999 is not a port', file=sys.stderr); "
           "sys.exit(78)")
PASSING = "import sys; print('allocstack: error [coordinator-exit]: gone', file=sys.stderr); sys.exit(70)"


def launch(tmp_path: Path, code: str, command: str, *, job: str = "", component: str = "kv") -> subprocess.CompletedProcess:
    """One attempt's launcher of a component running ``code`` (its stderr a log file, as in a rule)."""
    ran = tmp_path / "ran"
    ran.unlink(missing_ok=True)
    script = tmp_path / "component.py"
    script.write_text(f"import pathlib; pathlib.Path({str(ran)!r}).touch()\n{code}\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "ALLOCSTACK_"))}
    env[COMMAND_ENV] = command
    if job:
        env["SLURM_JOB_ID"] = job
    log = tmp_path / "component.log"
    with open(log, "w") as stderr:
        done = subprocess.run([sys.executable, str(SCRIPTS / "launch.py"), f"--component={component}", "--run=r",
                               f"--scratch-root={tmp_path / 'root'}", f"--run-state={tmp_path / 'state'}", "--",
                               str(script)], cwd=tmp_path, stderr=stderr, env=env, timeout=60, check=False)
    done.stderr = log.read_text()
    done.ran = ran.exists()
    return done


def test_a_later_attempt_ends_at_once_with_an_earlier_attempts_lasting_failure(tmp_path):
    first = launch(tmp_path, LASTING, "login:100:5")
    assert first.returncode == 78 and first.ran
    record = json.loads((tmp_path / "state" / attempts.LASTING_FAILURE).read_text())
    assert record["line"] == "allocstack: error [config]: services.kv.port: 99999 is not a port"
    started = time.monotonic()
    again = launch(tmp_path, "print('should not run')", "login:100:5")
    assert again.returncode == 78 and not again.ran
    assert again.stderr.splitlines()[-2:] == [
        (f"launch: kv: not started: an earlier attempt of this command (on {attempts.host()}) failed in a way another "
         "attempt cannot change:"),
        "allocstack: error [config]: services.kv.port: 99999 is not a port"]
    print(f"later attempt ended after {time.monotonic() - started:.2f} s")
    # Another command (the user fixed the cause and ran again) is not held back by it.
    fixed = launch(tmp_path, "", "login:200:9")
    assert fixed.returncode == 0 and fixed.ran


def test_a_siblings_lasting_failure_in_the_same_attempt_is_not_called_an_earlier_attempts(tmp_path):
    """Components of one attempt start side by side: the first to meet a lasting failure records it, and the
    others meet it themselves (each says it in its own log), never "an earlier attempt" that was none."""
    assert launch(tmp_path, LASTING, "login:100:5", job="41").returncode == 78
    sibling = launch(tmp_path, "", "login:100:5", job="41", component="worker-01")
    assert sibling.returncode == 0 and sibling.ran and "earlier attempt" not in sibling.stderr
    retry = launch(tmp_path, "print('should not run')", "login:100:5", job="42", component="worker-01")
    assert retry.returncode == 78 and not retry.ran  # the next allocation is another attempt: it ends at once
    assert "an earlier attempt of this command (Slurm job 41 on " in retry.stderr


def test_a_failure_another_attempt_may_not_meet_is_not_recorded(tmp_path):
    assert launch(tmp_path, PASSING, "login:100:5").returncode == 70
    assert not (tmp_path / "state" / attempts.LASTING_FAILURE).exists()
    again = launch(tmp_path, "", "login:100:5")
    assert again.returncode == 0 and again.ran


def test_a_lasting_failure_of_the_launcher_itself_is_recorded_too(tmp_path, broken_root):
    """A read-only scratch root: the launcher's own [scratch] line, then every later attempt's launchers end."""
    env_root = broken_root("read-only")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "ALLOCSTACK_"))}
    env[COMMAND_ENV] = "login:100:5"
    argv = [sys.executable, str(SCRIPTS / "launch.py"), "--component=coordinator", "--run=r",
            f"--scratch-root={env_root}", f"--run-state={tmp_path / 'state'}", "--", "true"]
    first = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60, check=False)
    assert first.returncode == 69
    again = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60, check=False)
    assert again.returncode == 69
    assert again.stderr.splitlines()[-1] == first.stderr.strip()
    assert "is read-only" in first.stderr


# -- whole runs --------------------------------------------------------------------------------------------

def slow_config(project: Path, seconds: float = 2.0) -> str:
    write_json(project / "config/slow.json", {"simulate": {"task_seconds": seconds}})
    return "config/slow.json"


def start(project: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    return subprocess.Popen(["timeout", "-k", "10", "600", SNAKEMAKE, *args], cwd=project, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            env={**os.environ, "TMPDIR": str(project / "tmp"), **(env or {})})


def wait_for(predicate, timeout: float = 180, what: str = "it"):
    return poll(predicate, timeout, what, interval=0.1)


def endpoint_of(project: Path, tmp: Path) -> Path | None:
    return next(iter(tmp.glob("allocstack-*/baseline.*/endpoint.json")), None)


def parent_of(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def test_a_second_start_of_a_live_run_is_refused_in_one_line_naming_the_first(project):
    first = start(project, "--cores", "4", "--configfile", slow_config(project))
    wait_for(lambda: endpoint_of(project, project / "tmp"), what="the first run's coordinator")
    second = snakemake(project, "--cores", "4")
    output = second.stdout + second.stderr
    [line] = [text for text in output.splitlines() if text.startswith("allocstack: error")]
    named = re.fullmatch(r"allocstack: error \[already-running\]: run baseline is already running from this checkout "
                         r"\(snakemake pid (\d+) on (\S+) since \d\d:\d\d:\d\d\): a second start would take over its "
                         r"scratch, results and journal; wait for it to end, or start this one under another run name "
                         r"\(--config run=NAME\)", line)
    assert named and second.returncode == 75, output
    assert named[2] == attempts.host() and parent_of(int(named[1])) == first.pid  # the first one's snakemake
    assert "Traceback" not in output and not (project / "logs/validate_inputs/baseline.log").stat().st_mtime > \
        (project / "results/baseline/coordinator.service").stat().st_mtime  # nothing of the first one was redone
    first_output = first.communicate(timeout=300)[0]
    assert first.returncode == 0, first_output[-3000:]
    assert "allocstack: run baseline VERIFIED: 4 of 4 tasks correct" in first_output  # it never noticed


def test_two_clones_at_once_each_use_their_own_scratch_and_both_succeed(tmp_path):
    """Two experiments from two clones, the same run name, the same $TMPDIR, the second 1.5 s after the first."""
    shared = tmp_path / "shared-tmp"
    shared.mkdir()
    clones = [copy_project(tmp_path / f"clone-{n}") for n in (1, 2)]
    runs = []
    for clone in clones:
        runs.append(start(clone, "--cores", "4", "--configfile", slow_config(clone, 1.0), env={"TMPDIR": str(shared)}))
        time.sleep(1.5)
    outputs = [run.communicate(timeout=300)[0] for run in runs]
    for run, output in zip(runs, outputs, strict=True):
        assert run.returncode == 0, output[-3000:]
        assert "allocstack: run baseline VERIFIED: 4 of 4 tasks correct" in output
    used = [json.loads((clone / "results/baseline/provenance.json").read_text())["scratch"]["path"] for clone in clones]
    assert used[0] != used[1] and all(Path(path).parent == shared / f"allocstack-{os.getuid()}" for path in used)
    assert not any(Path(path).exists() for path in used)  # each removed its own, and only its own


# -- the Slurm test cluster --------------------------------------------------------------------------------

def slurm_args(partition: str = "debug", *resources: str) -> list[str]:
    """The Slurm profile's run on the test cluster's ``partition``, with more default ``resources``."""
    return ["--profile", "profiles/slurm", "--default-resources", "slurm_account=allocstack",
            f"slurm_partition={partition}", "mem_mb=300", "runtime=10", *resources, "--config", "image=null"]


SLURM_ARGS = slurm_args()


def submitted(output: str) -> list[str]:
    return re.findall(r"submitted with SLURM jobid (\d+)", output)


def elapsed_seconds(job: str) -> int:
    line = subprocess.run(["sacct", "-j", job, "-X", "--noheader", "--parsable2", "--format=ElapsedRaw"],
                          capture_output=True, text=True, timeout=30, check=False).stdout.split()
    return int(line[0]) if line else -1


@pytest.mark.slurm
def test_retries_under_slurm_do_not_repeat_a_failure_they_cannot_change(tmp_path, broken_root):
    """config scratch on a read-only filesystem, the profile's 3 retries: the first allocation fails with the
    [scratch] line; each later one finds its record and ends at once with that line."""
    require_slurm()
    project = copy_project(tmp_path / "project")
    root = broken_root("read-only", tmp_path / "ro-scratch")
    done = snakemake(project, *SLURM_ARGS, f"scratch={root}", timeout=600)
    output = done.stdout + done.stderr
    assert done.returncode != 0
    jobs = submitted(output)
    assert len(jobs) == 4, output[-4000:]  # the first attempt and the profile's 3 retries
    line = f"allocstack: error [scratch]: scratch root {root} (config scratch) is read-only"
    assert line in output
    record = json.loads((project / "state/baseline" / attempts.LASTING_FAILURE).read_text())
    assert record["job"] == jobs[0] and record["line"].startswith(line)
    logs = "".join(path.read_text() for path in (project / "logs").rglob("*.log"))
    assert logs.count(f"an earlier attempt of this command (Slurm job {jobs[0]} on ") >= 3
    times = [elapsed_seconds(job) for job in jobs]
    print(f"attempts' sacct elapsed (s): {times}")


def scratch_used(project: Path) -> Path:
    return Path(json.loads((project / "results/baseline/provenance.json").read_text())["scratch"]["path"])


def job_span(job: str) -> tuple[str, str, str]:
    """(start, end, node list) as accounting records the job."""
    line = subprocess.run(["sacct", "-j", job, "-X", "--noheader", "--parsable2", "--format=Start,End,NodeList"],
                          capture_output=True, text=True, timeout=30, check=False).stdout.strip()
    start, end, nodes = line.split("|")
    return start, end, nodes


@pytest.mark.slurm
@pytest.mark.multinode
def test_two_slurm_jobs_on_one_multinode_node_with_the_same_tmpdir_keep_to_their_own_scratch(tmp_path):
    """Two clones, each its own sbatch job, on one node of the test cluster at the same time, both with the same
    $TMPDIR (a node's shared /var/tmp): the run name is the same, the scratch is not. On a namespaced node of the
    multi-node tests' (16 CPUs, idle while this test runs: their chain runs one test at a time): on the default node
    another test's job made Slurm run the two one after the other (CI, stop 35), so it ran alone after the suite."""
    layout = require_multinode()
    node = min(layout["nodes"])
    on_the_node = slurm_args(layout["partition"], f"slurm_extra='--no-kill --nodelist={node}'")
    shared = Path(tempfile.mkdtemp(prefix="allocstack-shared-tmp-", dir="/var/tmp"))
    try:
        clones = [copy_project(tmp_path / f"clone-{n}") for n in (1, 2)]
        runs = [start(clone, "--configfile", slow_config(clone, 2.0), *on_the_node, env={"TMPDIR": str(shared)})
                for clone in clones]
        outputs = [run.communicate(timeout=600)[0] for run in runs]
        for run, output in zip(runs, outputs, strict=True):
            assert run.returncode == 0, output[-4000:]
            assert "allocstack: run baseline VERIFIED: 4 of 4 tasks correct" in output
        jobs = [submitted(output)[0] for output in outputs]
        spans = [job_span(job) for job in jobs]
        assert spans[0][2] == spans[1][2] == node  # one node
        assert spans[0][0] < spans[1][1] and spans[1][0] < spans[0][1], spans  # at the same time
        used = [scratch_used(clone) for clone in clones]
        assert [path.parent for path in used] == [shared / f"allocstack-{os.getuid()}"] * 2
        assert used[0] != used[1] and [path.name.rsplit(".", 1)[1] for path in used] == jobs
    finally:
        shutil.rmtree(shared, ignore_errors=True)


@pytest.mark.slurm
def test_a_second_start_of_a_run_live_in_a_slurm_job_names_the_job(tmp_path):
    require_slurm()
    project = copy_project(tmp_path / "project")
    first = start(project, "--configfile", slow_config(project, 3.0), *SLURM_ARGS)

    def live_job() -> str | None:
        record = attempts.read_record(project / "state/baseline" / attempts.LIVE_RECORD) or {}
        return record.get("job")

    job = wait_for(live_job, timeout=300, what="the first run's job to start")
    second = snakemake(project, *SLURM_ARGS)
    output = second.stdout + second.stderr
    assert second.returncode == 75, output[-3000:]
    [line] = [text for text in output.splitlines() if text.startswith("allocstack: error")]
    assert line.startswith("allocstack: error [already-running]: run baseline is already running from this checkout "
                           "(snakemake pid ") and f", Slurm job {job} on " in line, line
    assert not submitted(output)  # nothing was submitted
    first_output = first.communicate(timeout=600)[0]
    assert first.returncode == 0, first_output[-3000:]
    assert "allocstack: run baseline VERIFIED: 4 of 4 tasks correct" in first_output
