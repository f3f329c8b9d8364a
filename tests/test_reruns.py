"""Reruns recompute what changed: the developer's loop of write a worker, run, fix, run again.

The run's identity (allocstack/common/identity.py: the task set, the worker program and the files
under the project its argv names, its settings, the image) is in inputs.json, the journal's header,
the coordinator's end record, the success marker and provenance.json. A rerun whose identity
differs starts a fresh journal (the old one kept aside, named in one line); Snakemake reruns the
stack when a file the program names changes (an input of validate_inputs) or its argv or settings
do (a param); ``--forcerun serve_coordinator`` is a clean start. Real Snakemake runs.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from conftest import write_json
from workflow_helpers import snakemake

#: A program of one's own with the usual first mistake: print() adds a newline the expected outputs lack.
WITH_NEWLINE = 'import json, sys\nn = json.load(sys.stdin)["n"]\nprint(n * n)\n'
FIXED = 'import json, sys\nn = json.load(sys.stdin)["n"]\nsys.stdout.write(str(n * n))\n'


def squares(project: Path, run: str, count: int, program: str = WITH_NEWLINE) -> Path:
    """A task set of ``count`` numbers, their squares as expected outputs, a program and a config naming them."""
    (project / "apps").mkdir(exist_ok=True)
    write_json(project / "apps/tasks.json",
               {"schemaVersion": 1, "tasks": [{"id": f"n-{n}", "payload": {"n": n}} for n in range(count)]})
    import hashlib

    write_json(project / "apps/expected.json", {"schemaVersion": 1, "results": [
        {"taskId": f"n-{n}", "output": str(n * n), "sha256": hashlib.sha256(str(n * n).encode()).hexdigest()}
        for n in range(count)]})
    (project / "apps/sq.py").write_text(program)
    config = project / f"apps/{run}.yaml"
    config.write_text(f"run: {run}\ntasks: apps/tasks.json\nexpected: apps/expected.json\n"
                      "worker:\n  command: [python3, apps/sq.py]\n")
    return config


def computed(project: Path, run: str) -> int:
    """Tasks the workers of the last run computed (their records)."""
    return sum(json.loads(path.read_text())["tasksCompleted"] for path in (project / f"results/{run}/workers").glob("*.json"))


def record(project: Path, run: str, name: str) -> dict:
    return json.loads((project / f"results/{run}/{name}").read_text())


def test_a_fixed_program_is_run_again_by_the_same_command(project):
    config = squares(project, "sq", 30)
    first = snakemake(project, "--cores", "4", "--configfile", str(config))
    output = first.stdout + first.stderr
    assert first.returncode == 1, output[-3000:]
    # got vs expected, and what a newline at the end means
    assert ("allocstack: error [verification]: result for n-0: output '0\\n' differs from the expected '0' (the "
            "output ends with a newline the expected output does not have: print() adds one;") in first.stdout
    identity_before = record(project, "sq", "inputs.json")["identity"]
    assert identity_before["files"] == {"apps/sq.py": identity_before["files"]["apps/sq.py"]}
    assert (project / "state/sq/journal.jsonl").exists()  # a failed run keeps its journal

    (project / "apps/sq.py").write_text(FIXED)
    second = snakemake(project, "--cores", "4", "--configfile", str(config))
    output = second.stdout + second.stderr
    assert second.returncode == 0, output[-3000:]
    assert "Updated input files: apps/sq.py" in output  # Snakemake sees the program as an input
    [aside] = (project / "state/sq").glob("journal.jsonl.stale-*")
    assert (f"  journal     started afresh: the worker program changed: apps/sq.py; the earlier one is kept as "
            f"state/sq/{aside.name}") in second.stdout
    end = record(project, "sq", "coordinator.json")
    assert end["restored"] == 0 and computed(project, "sq") == 30  # every task computed again, none restored
    assert end["journalSetAside"] == {"path": f"state/sq/{aside.name}",
                                      "because": "the worker program changed: apps/sq.py"}
    identity = record(project, "sq", "inputs.json")["identity"]
    assert identity["sha256"] != identity_before["sha256"]
    assert identity["taskSetSha256"] == identity_before["taskSetSha256"] and identity["command"] == [
        "python3", "apps/sq.py"]
    # every record of the run names what produced it
    assert end["identity"] == record(project, "sq", "result.json")["identity"] == identity["sha256"]
    assert record(project, "sq", "provenance.json")["identity"] == identity
    # the old journal is kept, whole: its results stay readable
    assert aside.read_text().count('"kind":"result"') == 30


def test_the_same_program_resumes_and_a_forced_rerun_starts_over(project):
    config = squares(project, "again", 12)
    first = snakemake(project, "--cores", "4", "--configfile", str(config))
    assert first.returncode == 1, (first.stdout + first.stderr)[-3000:]

    # nothing changed: Snakemake reruns verification alone, and the summary does not claim nothing was written
    same = snakemake(project, "--cores", "4", "--configfile", str(config))
    assert same.returncode == 1
    assert "localrule validate_inputs" not in same.stdout + same.stderr
    assert "allocstack: run again FAILED\n" in same.stdout and "nothing was written" not in same.stdout

    forced = snakemake(project, "--cores", "4", "--configfile", str(config), "--forcerun", "serve_coordinator")
    output = forced.stdout + forced.stderr
    assert forced.returncode == 1, output[-3000:]
    [aside] = (project / "state/again").glob("journal.jsonl.stale-*")
    assert (f"allocstack: run again starts over (a forced rerun): every task is computed again; the earlier journal "
            f"is kept as state/again/{aside.name}") in output
    assert record(project, "again", "coordinator.json")["restored"] == 0 and computed(project, "again") == 12

    # a dry run of the same starts nothing over
    dry = snakemake(project, "--dry-run", "--configfile", str(config), "--forcerun", "serve_coordinator")
    assert dry.returncode == 0 and "starts over" not in dry.stdout + dry.stderr
    assert len(list((project / "state/again").glob("journal.jsonl.stale-*"))) == 1


def test_a_changed_setting_is_another_identity(project):
    """worker.environment is a param of validate_inputs: Snakemake reruns the stack, and the coordinator does not
    resume the journal the other setting produced (an unchanged one resumes: test_faults.py)."""
    config = squares(project, "env", 10)
    config.write_text(config.read_text() + "  environment: {MODE: one}\n")
    assert snakemake(project, "--cores", "4", "--configfile", str(config)).returncode == 1  # the newline: a journal
    config.write_text(config.read_text().replace("MODE: one", "MODE: two"))
    changed = snakemake(project, "--cores", "4", "--configfile", str(config))
    output = changed.stdout + changed.stderr
    assert changed.returncode == 1, output[-3000:]
    assert re.search(r"Job \d+: validate_inputs: .*\nReason: .*Params have changed", output), output[-4000:]
    assert record(project, "env", "coordinator.json")["restored"] == 0 and computed(project, "env") == 10
    assert "  journal     started afresh: worker.environment changed; the earlier one is kept as" in changed.stdout


def test_what_the_identity_sees(tmp_path, monkeypatch):
    from allocstack.common import identity

    (tmp_path / "apps").mkdir()
    (tmp_path / "apps/run.py").write_text("x")
    (tmp_path / "model.bin").write_text("m")
    outside = tmp_path.parent / f"{tmp_path.name}-outside.py"
    outside.write_text("o")
    (tmp_path / "link.py").symlink_to(outside)
    argv = ["python3", "apps/run.py", "--model=model.bin", "./apps/run.py", str(tmp_path / "model.bin"),
            str(outside), "link.py", "${ALLOCSTACK_DB_HOST}/x", "apps", "-c", "print(1)"]
    assert identity.named_files(argv, str(tmp_path)) == ["apps/run.py", "model.bin"]
    assert identity.named_files(None, str(tmp_path)) == []
    monkeypatch.chdir(tmp_path)
    files = identity.file_digests(["apps/run.py"])
    one = identity.identity("t" * 64, "command", ["python3", "apps/run.py"], files, {"A": "1"}, None, None)
    assert one == identity.identity("t" * 64, "command", ["python3", "apps/run.py"], files, {"A": "1"}, None, None)
    assert len(one["sha256"]) == 64
    secret = identity.identity("t" * 64, "command", ["x"], {}, {"TOKEN": "s3cr3t"}, None, None)
    assert "s3cr3t" not in json.dumps(secret)  # environment values are not written, their digest is
    changes = {
        "the task set changed": identity.identity("u" * 64, "command", ["python3", "apps/run.py"], files, {"A": "1"},
                                                  None, None),
        "worker.command changed": identity.identity("t" * 64, "command", ["python3", "-u", "apps/run.py"], files,
                                                    {"A": "1"}, None, None),
        "the worker program changed: apps/run.py": identity.identity(
            "t" * 64, "command", ["python3", "apps/run.py"], {"apps/run.py": "0" * 64}, {"A": "1"}, None, None),
        "worker.environment changed": identity.identity("t" * 64, "command", ["python3", "apps/run.py"], files,
                                                        {"A": "2"}, None, None),
        "the image changed": identity.identity("t" * 64, "command", ["python3", "apps/run.py"], files, {"A": "1"},
                                               "i" * 64, "apptainer"),
    }
    for why, other in changes.items():
        assert other["sha256"] != one["sha256"]
        assert identity.what_changed(one, other) == why
    assert identity.what_changed(None, one).startswith("it does not say which program produced it")
    journal = tmp_path / "journal.jsonl"
    assert identity.set_aside(journal) is None
    journal.write_text("{}\n")
    aside = identity.set_aside(journal)
    assert aside is not None and aside.read_text() == "{}\n" and not journal.exists()
    journal.write_text("x\n")
    assert identity.set_aside(journal) not in (None, aside)  # a second one the same second: its own name


def test_a_journal_of_another_identity_is_not_resumed(tmp_path):
    """The coordinator's check reads the journal's header alone; one of the same identity is resumed as before."""
    import asyncio

    from allocstack.coordinator.journal import Journal, produced_otherwise, replay

    path = tmp_path / "journal.jsonl"
    produced = {"sha256": "a" * 64, "taskSetSha256": "in", "files": {"apps/x.py": "1" * 64}}

    async def write() -> None:
        journal = Journal(path, "in", identity=produced)
        await journal.append([{"taskId": "t1", "workerId": "w", "output": "x", "sha256": "b" * 64}])
        journal.close()

    asyncio.run(write())
    assert json.loads(path.read_text().splitlines()[0])["identity"] == produced
    assert produced_otherwise(path, "in", produced) is None
    assert produced_otherwise(path, "in", None) is None  # a coordinator run without a summary: as before
    assert produced_otherwise(path, "in", {**produced, "sha256": "c" * 64, "files": {"apps/x.py": "2" * 64}}) == (
        "the worker program changed: apps/x.py")
    assert produced_otherwise(path, "other input", {**produced, "sha256": "c" * 64}) is None  # replay sets it aside
    results, note = replay(path, "in")
    assert [r["taskId"] for r in results] == ["t1"] and note == "resumed 1 results"
