"""The docs are part of the product: they must match the code, and every link in them must lead somewhere."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from allocstack.common.errors import DIAGNOSTICS
from conftest import ROOT, make_tasks

#: The README is the front page: what it is, a quick start, your own program, then links.
README_MAX_LINES = 300
#: Every page whose links are checked.
PAGES = ["README.md", *sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "docs").glob("*.md")),
         "config/README.md", "container/README.md"]
FENCE = re.compile(r"^[ \t]*(`{3,}|~{3,}).*?^[ \t]*\1[^\n]*$", flags=re.MULTILINE | re.DOTALL)
HEADING = re.compile(r"^(#{1,6})[ \t]+(.+?)[ \t]*#*[ \t]*$", flags=re.MULTILINE)
LINK = re.compile(r"\]\(([^()\s]+)(?:\s+\"[^\"]*\")?\)")
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")


def section(page: str, heading: str) -> str:
    """The text of ``page`` under ``heading`` (a whole heading line), up to the next heading of its level or above."""
    text = (ROOT / page).read_text()
    level = len(heading) - len(heading.lstrip("#"))
    start = text.index(f"\n{heading}\n") + len(heading) + 2
    end = re.search(rf"^#{{1,{level}}} ", text[start:], flags=re.MULTILINE)
    return text[start:start + end.start()] if end else text[start:]


def prose(text: str) -> str:
    """``text`` without its fenced code blocks and code spans: what links and headings are read from."""
    text = FENCE.sub("", text)
    return re.sub(r"``.*?``|`[^`]*`", "", text, flags=re.DOTALL)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: the rendered text, lower-cased, without punctuation, spaces as hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).replace("`", "").replace("*", "")
    return re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading anchor of a Markdown file, the second of a name as ``name-1`` (as GitHub numbers them)."""
    seen: dict[str, int] = {}
    found = set()
    for match in HEADING.finditer(FENCE.sub("", path.read_text())):
        name = slug(match.group(2))
        found.add(f"{name}-{seen[name]}" if name in seen else name)
        seen[name] = seen.get(name, 0) + 1
    return found


def broken_links(path: Path, root: Path = ROOT) -> list[str]:
    """The relative links of the page at ``path`` that lead to no file, or to no heading of the file they name."""
    broken = []
    for target in LINK.findall(prose(path.read_text())):
        if SCHEME.match(target):
            continue
        file, _, anchor = target.partition("#")
        destination = (path.parent / file).resolve() if file else path
        if not destination.exists():
            broken.append(f"{target}: no such file")
        elif anchor and destination.suffix == ".md" and anchor not in anchors(destination):
            broken.append(f"{target}: no heading #{anchor} in {destination.relative_to(root)}")
    return broken


def test_the_diagnostics_table_matches_the_code():
    rows = re.findall(r"^\| `([a-z-]+)` \| (\d+) \| (.+?) \|$", section("docs/failures.md", "## Diagnostics"),
                      flags=re.MULTILINE)
    assert {diag: (int(code), meaning) for diag, code, meaning in rows} == DIAGNOSTICS


def test_every_refused_input_names_a_diagnostic_or_an_http_status():
    table = section("docs/failures.md", "## Inputs that are refused")
    ids = re.findall(r"^\|.*\| (\S[^|]*?) \|$", table, flags=re.MULTILINE)[2:]  # after the header and its rule
    assert len(ids) > 40
    for cell in ids:
        named = re.match(r"`([a-z-]+)`", cell)
        assert (named and named.group(1) in DIAGNOSTICS) or re.match(r"[1-5]\d\d\b", cell), cell


def test_the_protocol_table_lists_every_route_of_the_coordinator(tmp_path):
    from allocstack.common.taskset import parse_tasks
    from allocstack.coordinator.api import CoordinatorApi
    from allocstack.coordinator.journal import Journal
    from allocstack.coordinator.progress import Progress
    from allocstack.coordinator.taskboard import TaskBoard

    api = CoordinatorApi(TaskBoard(parse_tasks(make_tasks(1)), lease_seconds=60), Journal(tmp_path / "j", "in"),
                         Progress(), event=lambda *a, **k: None, on_fault=lambda error: None,
                         on_change=lambda: None, log=lambda line: None)
    documented = re.findall(r"^\| `(GET|POST) (/[a-z]*)", section("docs/protocol.md", "## The coordinator's protocol"),
                            flags=re.MULTILINE)
    assert sorted(documented) == sorted(api.router().routes)


def test_the_readme_is_a_front_page():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= README_MAX_LINES
    for heading in ("## Quick start", "## Run your own program", "## On your cluster", "## From your Compose file"):
        assert f"\n{heading}\n" in readme


def test_the_readme_shows_the_example_it_runs_as_committed():
    """The README's own program is config/examples/primes/, byte for byte (tests/test_examples.py runs it)."""
    readme = (ROOT / "README.md").read_text()
    for name in ("tasks.json", "is_prime.py", "expected.json", "config.yaml"):
        assert (ROOT / "config/examples/primes" / name).read_text() in readme, name
    assert "snakemake --cores 4 --configfile config/examples/primes/config.yaml" in readme


@pytest.mark.parametrize("page", PAGES)
def test_no_link_is_broken(page):
    assert broken_links(ROOT / page) == []


def test_the_link_check_finds_a_broken_link_and_a_missing_heading(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("# A page\n\n## What `x` does, and why?\n\n## Twice\n\n## Twice\n\n"
                                           "```\n# not a heading\n[in code](nowhere.md)\n```\n")
    (tmp_path / "README.md").write_text(
        "[ok](docs/a.md#what-x-does-and-why) [ok](docs/a.md#twice-1) [ok](#x) `[code](nowhere.md)`\n"
        "[gone](docs/b.md) [no heading](docs/a.md#not-a-heading) [third](docs/a.md#twice-2) [site](https://x.org/y)\n"
        "\n# X\n")
    assert broken_links(tmp_path / "README.md", tmp_path) == ["docs/b.md: no such file",
                                         "docs/a.md#not-a-heading: no heading #not-a-heading in docs/a.md",
                                         "docs/a.md#twice-2: no heading #twice-2 in docs/a.md"]
    assert broken_links(tmp_path / "docs" / "a.md", tmp_path) == []


def test_every_config_key_is_documented():
    schema = yaml.safe_load((ROOT / "workflow/schemas/config.schema.yaml").read_text())
    documented = (ROOT / "config/README.md").read_text()

    def keys(properties, prefix=""):
        for name, spec in properties.items():
            if spec.get("type") == "object" and "properties" in spec and "required" not in spec:
                yield from keys(spec["properties"], f"{prefix}{name}.")
            else:
                assert "description" in spec and "default" in spec, name
                yield f"{prefix}{name}"

    for key in keys(schema["properties"]):
        assert f"| `{key}` |" in documented, f"config/README.md does not explain {key}"


def test_the_conventions_of_the_ecosystem_are_kept():
    import subprocess
    import tomllib

    assert (ROOT / "LICENSE").read_text().startswith("MIT License\n")
    catalog = yaml.safe_load((ROOT / ".snakemake-workflow-catalog.yml").read_text())
    deployment = catalog["usage"]["software-stack-deployment"]
    assert set(catalog["usage"]) == {"mandatory-flags", "software-stack-deployment"} and deployment["report"] is True
    ruff = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["ruff"]
    assert {"F", "E", "I", "B", "S", "BLE", "EXE", "PLW1510"} <= set(ruff["lint"]["select"])
    assert re.search(r"^ruff==[0-9.]+$", (ROOT / "requirements.txt").read_text(), flags=re.MULTILINE)
    plan = subprocess.run(["make", "-n", "test"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert ".venv/bin/ruff check ." in plan.splitlines()
    assert plan.index("ruff check") < plan.index("pytest")
