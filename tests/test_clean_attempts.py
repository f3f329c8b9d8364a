"""Every attempt starts clean (issue 25, point 5): a rerun of an own stack after a failed attempt finds its named
volumes empty (a volume in ``keep_volumes`` carried), reads no record of the earlier attempt, and an attempt that
fails leaves no success marker, an earlier one included. Real Snakemake runs, real processes."""

from __future__ import annotations

import json
import sys
import textwrap

from workflow_helpers import long_running_head, snakemake

PYTHON = json.dumps(sys.executable)
#: Each replica leaves a file of its own in the fresh volume and a line in the kept one; it fails while the
#: project holds ``fail-workers``.
WORKER = ("import os, sys, uuid; e = os.environ; sys.exit('worker fails on purpose') if os.path.exists('fail-workers')"
          " else None; open(os.path.join(e['ALLOCSTACK_VOLUME_OUT'], uuid.uuid4().hex), 'w').close();"
          " open(os.path.join(e['ALLOCSTACK_VOLUME_TALLY'], 'lines'), 'a').write('x\\n')")
#: The check: this attempt's two files alone in the fresh volume, and the kept tally as argv[1] says; fails (once)
#: while the project holds ``fail-check``.
CHECK = ("import os, sys; e = os.environ; out = os.listdir(e['ALLOCSTACK_VOLUME_OUT']);"
         " lines = open(os.path.join(e['ALLOCSTACK_VOLUME_TALLY'], 'lines')).read().count('x');"
         " print(f'check: {len(out)} file(s) in out, {lines} line(s) in tally');"
         " os.path.exists('fail-check') and (os.remove('fail-check'), sys.exit('check fails on purpose'));"
         " sys.exit(len(out) != 2 or lines != int(sys.argv[1]))")


def write_config(project, tally: int) -> None:
    (project / "config/clean.yaml").write_text(long_running_head("clean", 2, WORKER) + textwrap.dedent(f"""
        volumes: [out, tally]
        keep_volumes: [tally]
        verify: {{command: [{PYTHON}, -c, {json.dumps(CHECK)}, "{tally}"]}}
    """))


def test_a_rerun_after_a_failed_attempt_starts_with_fresh_volumes_and_no_earlier_marker(project):
    write_config(project, 2)
    (project / "fail-check").touch()
    first = snakemake(project, "--cores", "4", "--configfile", "config/clean.yaml")
    assert first.returncode != 0, (first.stdout + first.stderr)[-3000:]
    assert "check: 2 file(s) in out, 2 line(s) in tally" in (project / "logs/run_check/clean.log").read_text()
    assert list((project / "tmp").glob("allocstack-*/clean.*/volumes/out/*"))  # the failed attempt's, left

    # the rerun: the same command; its volume `out` is empty again, `tally` (kept) carries the first attempt's lines
    write_config(project, 4)
    second = snakemake(project, "--cores", "4", "--configfile", "config/clean.yaml")
    assert second.returncode == 0, (second.stdout + second.stderr)[-3000:]
    assert "check: 2 file(s) in out, 4 line(s) in tally" in (project / "logs/run_check/clean.log").read_text()
    assert json.loads((project / "results/clean/result.json").read_text())["status"] == "success"
    assert (project / "state/clean/volumes/tally/lines").read_text() == "x\n" * 4  # kept, in the state directory

    # a later attempt that fails before verification: the earlier success marker does not outlive its start
    (project / "fail-workers").touch()
    third = snakemake(project, "--cores", "4", "--configfile", "config/clean.yaml", "--forceall")
    assert third.returncode != 0
    assert "worker fails on purpose" in third.stdout + third.stderr
    assert not (project / "results/clean/result.json").exists()
