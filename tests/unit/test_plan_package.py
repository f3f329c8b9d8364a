"""The plan's package: what it imports, that it alone spells the run's layout, and this directory's guard."""

from __future__ import annotations

import ast
import logging
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from allocstack.plan import layout
from allocstack.status.terminal import TerminalFilter

from .conftest import ProcessStarted
from .plans import ROOT, SCRIPTS

PACKAGE = SCRIPTS / "allocstack"


def module_imports(path: Path) -> set[str]:
    """The modules ``path`` imports when it is imported (not inside functions), as absolute names."""
    package = ".".join(path.relative_to(SCRIPTS).with_suffix("").parts[:-1])
    if path.name == "__init__.py":
        package = ".".join(path.parent.relative_to(SCRIPTS).parts)
    found = set()
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
            module = f"{base}.{node.module}" if node.level and node.module else (node.module or base)
            found.add(module)
            found |= {f"{module}.{alias.name}" for alias in node.names}  # ``from . import slurm``
    return found


def closure(start: str) -> set[str]:
    """Every module ``start`` imports, followed through allocstack's own modules."""
    seen, todo = set(), [start]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        path = SCRIPTS / Path(*name.split("."))
        source = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
        if name.split(".")[0] == "allocstack" and source.is_file():
            todo += sorted(module_imports(source))
    return seen


def test_the_plan_starts_no_process_and_needs_no_snakemake():
    imported = {name.split(".")[0] for name in closure("allocstack.plan")}
    assert not imported & {"subprocess", "snakemake", "multiprocessing", "asyncio"}, imported
    assert not {name.split(".")[0] for name in closure("allocstack.plan.layout")} - {
        "__future__", "allocstack", "collections", "dataclasses", "functools", "pathlib", "re", "typing", "os",
        "copy", "json", "signal", "time", "sys"}  # the layout: the standard library (components read it too)


def test_only_the_layout_spells_the_runs_paths():
    """One place for results/<run>/...: the rules, the summary and the commands ask plan/layout.py."""
    spelled = re.compile(r"""["'](?:results|state)/""")
    sources = [ROOT / "Snakefile", *(ROOT / "workflow" / "rules").glob("*.smk"), *SCRIPTS.rglob("*.py")]
    places = sorted(str(path.relative_to(ROOT)) for path in sources if spelled.search(path.read_text(encoding="utf-8")))
    assert places == [], places
    assert layout.Layout("r", "s").journal == "s/r/journal.jsonl" and layout.Layout("r").marker == "results/r/result.json"


def test_one_topological_sort():
    """The plan's start order is the import's too (compose.py asks plan/order.py)."""
    defining = [str(path.relative_to(SCRIPTS)) for path in SCRIPTS.rglob("*.py")
                if re.search(r"^def start_order\(", path.read_text(encoding="utf-8"), flags=re.MULTILINE)]
    assert defining == ["allocstack/plan/order.py"]


def test_a_unit_test_that_starts_a_process_fails(no_processes):
    with pytest.raises(ProcessStarted):
        subprocess.run([sys.executable, "-c", "pass"], check=False)
    with pytest.raises(ProcessStarted):
        os.system("true")  # noqa: S605
    assert len(no_processes) == 2
    no_processes.clear()  # (else this test fails at teardown, as it should anywhere else)


def test_the_terminal_drops_the_wait_for_a_service_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    service = Path(layout.Layout("r").coordinator_service)
    service.parent.mkdir(parents=True)
    service.touch()
    waiting = f"Waiting at most 5 seconds for missing files:\n{service} (missing locally)"
    record = logging.LogRecord("snakemake", logging.INFO, "", 0, waiting, None, None)
    assert TerminalFilter().filter(record) is False
    other = logging.LogRecord("snakemake", logging.INFO, "", 0, "Waiting at most 5 seconds for missing files:\n"
                              "results/r/inputs.json", None, None)
    assert TerminalFilter().filter(other) is True
