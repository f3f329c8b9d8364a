"""Job-scoped scratch: keyed per run, made and checked once on the host, used as given by the components.

Real processes and, as root, real read-only and full filesystems (tmpfs mounts). The same
places under Apptainer, Charliecloud and the Slurm test cluster: tests/test_tmpdir_matrix.py.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from scratch_helpers import require_root

from allocstack.common.errors import AllocstackError
from allocstack.common.scratch import (
    MIN_FREE_BYTES,
    make_private,
    prepare,
    root_source,
    run_key,
    run_scratch,
    runs_in,
    scratch_of,
)
from conftest import SCRIPTS, make_tasks, write_json


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_a_runs_scratch_is_its_own_per_checkout_run_and_slurm_job(tmp_path):
    one, other = tmp_path / "clone-1", tmp_path / "clone-2"
    keys = {run_key("baseline", one, None), run_key("baseline", other, None), run_key("baseline", one, "41"),
            run_key("baseline", one, "42"), run_key("mine", one, None)}
    assert len(keys) == 5  # two clones, two jobs, two runs: never the same directory
    assert run_key("baseline", one, None) == run_key("baseline", tmp_path / "x" / ".." / "clone-1", None)
    scratch = run_scratch(tmp_path, "base.line-2", one, "42", uid=1000)
    assert scratch.parent == tmp_path / "allocstack-1000" and scratch.name.startswith("base.line-2.")
    scratch.mkdir(parents=True)
    run_scratch(tmp_path, "other", other, None, uid=1000).mkdir()
    assert runs_in(tmp_path / "allocstack-1000", one) == {"base.line-2": [scratch]}  # only this clone's
    assert scratch_of(tmp_path, "r", {"SLURM_JOB_ID": "7"}).name.endswith(".7")
    assert root_source(None, {"SLURM_TMPDIR": "/s", "TMPDIR": "/t"}) == "$SLURM_TMPDIR"
    assert root_source("/x", {"TMPDIR": "/t"}) == "config scratch"


def test_the_launcher_makes_the_levels_private_and_closes_an_open_one_on_the_host(tmp_path):
    scratch = run_scratch(tmp_path / "root", "run", tmp_path)
    scratch.parent.mkdir(parents=True, mode=0o755)
    os.chmod(scratch.parent, 0o755)  # noqa: S103  (too open: closed again, on the host where it is the real one)
    assert prepare(scratch, "$TMPDIR") == scratch
    assert mode(scratch) == mode(scratch.parent) == 0o700


@pytest.mark.parametrize("kind, words", [("read-only", "is read-only"), ("full", "is full: 0 bytes free")])
def test_a_read_only_or_full_root_is_one_line_naming_it_and_where_it_came_from(tmp_path, broken_root, kind, words):
    root = broken_root(kind)
    with pytest.raises(AllocstackError) as raised:
        prepare(run_scratch(root, "run", tmp_path), "$SLURM_TMPDIR")
    assert raised.value.diag == "scratch"
    assert raised.value.line().startswith(f"allocstack: error [scratch]: scratch root {root} ($SLURM_TMPDIR) {words}")
    assert MIN_FREE_BYTES == 1 << 20


def launcher(tmp_path: Path, root: Path, *extra: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """launch.py starting a component that only says it ran (in its own process: no image, no Slurm)."""
    ran = tmp_path / "ran"
    script = tmp_path / "component.py"
    script.write_text(f"import pathlib; pathlib.Path({str(ran)!r}).write_text('ran')\n")
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "ALLOCSTACK_"))}
    return subprocess.run([sys.executable, str(SCRIPTS / "launch.py"), "--component=coordinator", "--run=run",
                           f"--scratch-root={root}", *extra, "--", str(script)], capture_output=True, text=True,
                          cwd=tmp_path, env={**environ, **(env or {})}, timeout=60, check=False)


@pytest.mark.parametrize("kind", ["read-only", "full"])
def test_the_launcher_refuses_such_a_root_in_one_line_before_the_component_starts(tmp_path, broken_root, kind):
    done = launcher(tmp_path, broken_root(kind))
    assert done.returncode == 69
    [line] = done.stderr.splitlines()
    assert line.startswith("allocstack: error [scratch]: scratch root ") and "config scratch" in line
    assert not (tmp_path / "ran").exists()


def test_a_component_uses_the_directory_it_is_given_and_judges_nothing_above_it(tmp_path, start_coordinator):
    """Inside a container the level above the run's scratch is the runtime's placeholder: another owner's,
    mode 0755, read-only. The coordinator uses its directory and leaves that level as it is."""
    require_root("a directory owned by another user")
    placeholder = tmp_path / "placeholder"
    placeholder.mkdir(mode=0o755)
    scratch = placeholder / "run"
    scratch.mkdir(mode=0o700)
    os.chown(placeholder, 65534, 65534)
    os.chmod(placeholder, 0o755)  # noqa: S103  (what Apptainer's mount-point placeholder looks like)
    coordinator = start_coordinator(make_tasks(2), scratch=scratch)
    assert json.loads(coordinator.endpoint_file.read_text())["endpoint"].startswith("http://127.0.0.1:")
    assert (os.stat(placeholder).st_uid, mode(placeholder)) == (65534, 0o755)
    assert coordinator.stop() == 75


def test_what_a_component_makes_in_its_scratch_is_private_and_a_failure_one_line(tmp_path, broken_root):
    made = make_private(tmp_path / "scratch" / "services")
    assert mode(made) == 0o700
    with pytest.raises(AllocstackError, match=r"^cannot make .*/events in the run's scratch: Read-only file system$"):
        make_private(broken_root("read-only") / "events")


def test_an_oserror_at_the_coordinators_start_is_one_line_and_its_end_record(tmp_path, broken_root):
    """The coordinator's scratch itself on a read-only filesystem (what the launcher checks on the host, here
    given to the coordinator directly): one line and the end record the gate reads, never a traceback."""
    tasks = write_json(tmp_path / "tasks.json", make_tasks(1))
    end = tmp_path / "end.json"
    done = subprocess.run([sys.executable, str(SCRIPTS / "coordinator.py"), "--input", str(tasks), "--results",
                           str(tmp_path / "results.json"), "--scratch", str(broken_root("read-only")), "--end-record",
                           str(end), "--journal", str(tmp_path / "state/journal.jsonl")],
                          capture_output=True, text=True, timeout=60, check=False)
    [line] = done.stderr.splitlines()
    assert line.startswith("allocstack: error [") and "Read-only file system" in line, done.stderr
    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert json.loads(end.read_text())["status"] == "failed"


def removal_while_a_component_writes(tmp_path: Path) -> tuple[Path, threading.Thread, list[bool]]:
    """A scratch directory of many files and a thread that, once their removal has begun (the listing is taken),
    writes a component's late end record into it: what a launcher still ending does while collect removes it."""
    scratch = tmp_path / "scratch"
    scratch.mkdir(parents=True)
    for index in range(3000):
        (scratch / f"event-{index:04d}").write_text("x")
    wrote: list[bool] = []

    def late_writer() -> None:
        first = scratch / "event-0000"
        while first.exists():
            pass
        try:
            (scratch / "ended.json").write_text("{}")  # in the directory itself, which goes last
            wrote.append(True)
        except OSError:
            wrote.append(False)  # too late: the directory was gone already

    return scratch, threading.Thread(target=late_writer), wrote


def test_removing_scratch_outlasts_a_record_written_while_it_is_removed(tmp_path, monkeypatch):
    """"Directory not empty" while collect removes the scratch (a launcher's late ``ended/`` note) is tried again;
    with one try (as before) the same race is the run's cleanup failure."""
    from allocstack.common import scratch as scratch_module

    for tries, fails in ((1, True), (scratch_module.REMOVE_TRIES, False)):
        monkeypatch.setattr(scratch_module, "REMOVE_TRIES", tries)
        for trial in range(20):  # the writer must land inside the removal; rarely it comes too late
            directory, writer, wrote = removal_while_a_component_writes(tmp_path / f"{tries}-{trial}")
            writer.start()
            try:
                scratch_module.remove_scratch(directory, pause=0.05)
                failed = False
            except AllocstackError as error:
                assert error.diag == "cleanup" and "Directory not empty" in error.message
                failed = True
            writer.join()
            if wrote == [True]:
                break
        assert wrote == [True], "the late record never landed inside the removal"
        assert failed is fails
        if not fails:
            assert not directory.exists()


def test_removing_scratch_outlasts_a_launcher_removing_its_own_tree_meanwhile(tmp_path, monkeypatch):
    """A Charliecloud launcher removes its own mount-point tree in the scratch while collect removes the scratch:
    an entry that vanished meanwhile is gone, as wanted. Before, that FileNotFoundError ended the removal as if
    the whole directory were gone, and a VERIFIED run left its scratch (ci-44: a Charliecloud run under /var/tmp)."""
    from allocstack.common import scratch as scratch_module

    scratch = tmp_path / "baseline.0123456789ab"
    for tree in (".mounts-coordinator", "volumes"):
        (scratch / tree / "a" / "b").mkdir(parents=True)
        (scratch / tree / "a" / "b" / "file").write_text("x")
    real_open = os.open
    vanished: list[str] = []

    def open_after_its_launcher_removed_it(name, flags, *args, **kwargs):
        if name == ".mounts-coordinator" and not vanished:  # rmtree is about to enter it: its launcher is faster
            vanished.append(name)
            shutil.rmtree(scratch / name)
        return real_open(name, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", open_after_its_launcher_removed_it)
    scratch_module.remove_scratch(scratch, pause=0.05)
    monkeypatch.undo()
    assert vanished == [".mounts-coordinator"]
    assert not scratch.exists()
