"""The corpus of real public Compose files (tests/compose_corpus/): each imports without a crash, its origin and
licence are on record, and the counts (clean / gaps / refused / crash, refusals ranked by cause) are printed.

The importer runs in-process (import_compose.load -> compose.combine -> compose.import_stack, then
import_compose.main writing into tmp_path). Its own refusal is a result, not a failure: refused files are counted.
A crash is any other exception. What the importer gets wrong is marked ``xfail(strict=True)`` with the bug named,
so that whoever fixes it sees the mark flip (none today: every such check passes); the mutation fuzz test asserts
that no mutation crashes it.
"""

from __future__ import annotations

import copy
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import import_compose
import jsonschema
import pytest
import yaml
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from allocstack.common.errors import EXIT_DATA, EXIT_OK, AllocstackError
from allocstack.compose.interpolation import Interpolator, Variables, read_env_file
from allocstack.compose.mapping import Imported, combine, import_stack, normalized, reserved, unique
from conftest import ROOT

CORPUS = ROOT / "tests" / "compose_corpus"
MANIFEST = yaml.safe_load((CORPUS / "MANIFEST.yaml").read_text(encoding="utf-8"))["entries"]
NAMES = [entry["name"] for entry in MANIFEST]
SCHEMA = yaml.safe_load((ROOT / "workflow" / "schemas" / "config.schema.yaml").read_text(encoding="utf-8"))
SPDX = {"MIT", "BSD-2-Clause", "BSD-3-Clause", "Apache-2.0", "MPL-2.0", "AGPL-3.0-only", "GPL-3.0-only",
        "LGPL-3.0-only", "CC0-1.0", "CC-BY-SA-4.0"}
KINDS = {"worker-stack", "serving", "database-app", "data-platform", "notebook", "compute-cluster",
         "workflow-platform", "monitoring"}

#: Corpus files the importer crashes on today: name -> the bug. None: every crash found so far needs an edit of a
#: corpus file (MUTATIONS below). A file added here is imported under xfail(strict=True).
CRASHES_TODAY: dict[str, str] = {}


# ---------------------------------------------------------------- importing one document


@dataclass
class Outcome:
    """What the importer made of one document: clean, gaps, impossible (refused only for what cannot run here at
    all: root, host devices, a daemon's socket, a port below 1024), refused or crash."""

    status: str
    refusals: list[str] = field(default_factory=list)
    impossible: list[str] = field(default_factory=list)
    gaps: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    imported: Imported | None = None
    crash: str = ""


def corpus_variables(folder: Path) -> Variables:
    """What ``${VAR}`` reads for a corpus file: its .env, and of an environment only PWD (the shell sets it, and
    several files use it), so the counts do not depend on the machine's environment."""
    dotenv = folder / ".env"
    return Variables(corpus_environment(folder), [(".env", read_env_file(dotenv))] if dotenv.is_file() else [])


def corpus_environment(folder: Path) -> dict[str, str]:
    return {"PWD": str(folder)}


def outcome_of(document: dict[str, Any], folder: Path, name: str) -> Outcome:
    """Import a parsed Compose document as import_compose.main does, and render the config it would write.

    :raises Exception: whatever the importer raises besides its own refusal (a crash; the caller decides).
    """
    try:
        imported = import_stack(combine([document]), folder, ROOT, name, variables=corpus_variables(folder))
        report = imported.report
        if not report.refusals:
            yaml.safe_load(import_compose.render_config(imported, [f"{name}/compose.yaml"], folder / "x.yaml"))
    except AllocstackError as error:
        return Outcome("refused", refusals=[error.message])
    refusals, impossible = unique(report.refusals), unique(report.impossible)
    status = ("impossible" if set(refusals) <= set(impossible) else "refused") if refusals else \
        "gaps" if report.gaps else "clean"
    return Outcome(status, refusals, impossible, unique(report.gaps), unique(report.notes), imported)


def import_corpus_file(name: str) -> Outcome:
    """One corpus file, from its bytes on disk; a crash is caught and recorded (for the counts)."""
    folder = CORPUS / name
    try:
        return outcome_of(import_compose.load(folder / "compose.yaml"), folder, name)
    except AllocstackError as error:
        return Outcome("refused", refusals=[error.message])
    except Exception as error:  # noqa: BLE001  (a crash is what this counts)
        return Outcome("crash", crash=f"{type(error).__name__}: {error}")


@pytest.fixture(scope="module")
def outcomes() -> dict[str, Outcome]:
    return {name: import_corpus_file(name) for name in NAMES}


# ---------------------------------------------------------------- refusals by cause

#: A refusal's cause: the first pattern that matches it names it; otherwise the key it is about
#: (``services.*.user``, ``secrets``).
CAUSES = [
    (r"is not set \(in \.env", "${VAR} with neither a value (.env, the environment) nor a default"),
    (r"has no healthcheck", "a service with no healthcheck and no port that others wait for"),
    (r"port \d+ is privileged", "a port below 1024 inside the image (impossible: root)"),
    (r"container daemon's socket", "a container daemon's socket (impossible: a daemon, root)"),
    (r"privileged: needs root|maps host devices|capabilities: needs root|kernel parameters|namespace",
     "privileged, devices, cap_add, sysctls, the host's namespaces (impossible: root)"),
    (r"mount target .* must be an absolute path", "mount target not absolute"),
    (r"depends_on has a cycle", "depends_on cycle"),
    (r"each wait for a service to complete|which allocstack reads as the",
     "init jobs (service_completed_successfully before the services start: issue 25)"),
    (r"all listen on port", "two services on one port (on one node they cannot share it)"),
    (r"is not an image reference", "an image that is not an image reference"),
    (r"only single TCP ports map", "ports entry that is not a single TCP port"),
    (r"is not declared under the top-level", "a volume, secret or config that is not declared"),
]


def cause(refusal: str) -> str:
    for pattern, label in CAUSES:
        if re.search(pattern, refusal):
            return label
    where = refusal.partition(": ")[0]
    where = re.sub(r"\[\d+\]", "", re.sub(r"^services\.[^.]+", "services.*", where))
    return ".".join(where.split(".")[:3])


STATUSES = ("clean", "gaps", "impossible", "refused", "crash")
#: The importer's target (issue 24): these make at least 80% of the corpus.
RUNNABLE = ("clean", "gaps", "impossible")


def counts_table(results: dict[str, Outcome]) -> str:
    """The table the test prints: statuses, refusal causes by files and occurrences, one line per file."""
    statuses = Counter(outcome.status for outcome in results.values())
    files: Counter[str] = Counter()
    occurrences: Counter[str] = Counter()
    for outcome in results.values():
        causes = [cause(refusal) for refusal in outcome.refusals]
        occurrences.update(causes)
        files.update(set(causes))
    lines = [f"Compose corpus: {len(results)} public files imported by the importer (allocstack/compose/mapping.py)"]
    for status in STATUSES:
        names = [name for name, outcome in results.items() if outcome.status == status]
        lines.append(f"  {status:10} {statuses[status]:3}  {', '.join(names)}".rstrip())
    runs = sum(statuses[status] for status in RUNNABLE)
    lines.append(f"  => {runs} of {len(results)} ({100 * runs / len(results):.0f}%) with no refusal but what cannot "
                 "run here at all (clean + gaps + impossible)")
    lines.append("Refusals ranked by cause (files | occurrences | cause):")
    lines += [f"  {count:5} | {occurrences[label]:5} | {label}"
              for label, count in sorted(files.items(), key=lambda item: (-item[1], -occurrences[item[0]], item[0]))]
    lines.append("Per file (status, refusals, gaps, its causes):")
    for name, outcome in results.items():
        causes = Counter(cause(refusal) for refusal in outcome.refusals)
        detail = outcome.crash or "; ".join(f"{label} x{n}" for label, n in causes.most_common())
        lines.append(f"  {name:24} {outcome.status:10} {len(outcome.refusals):4} {len(outcome.gaps):3}  {detail}")
    return "\n".join(lines)


# ---------------------------------------------------------------- the manifest


def test_the_manifest_lists_every_folder_with_its_origin_and_licence():
    folders = sorted(path.name for path in CORPUS.iterdir() if path.is_dir())
    assert sorted(NAMES) == folders, "every folder is in MANIFEST.yaml and every entry has its folder"
    assert len(NAMES) == len(set(NAMES)) >= 25
    for entry in MANIFEST:
        folder = CORPUS / entry["name"]
        assert re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9_.-]+", entry["repository"]), entry
        assert re.fullmatch(r"[0-9a-f]{40}", entry["commit"]), entry["name"]
        assert re.fullmatch(r"[0-9a-f]{40}", entry.get("licence_commit", entry["commit"])), entry["name"]
        assert entry["licence"] in SPDX and entry["kind"] in KINDS and entry["note"].strip(), entry["name"]
        assert entry["path"].rsplit("/", 1)[-1].endswith((".yml", ".yaml")), entry["name"]
        assert (folder / "LICENSE").stat().st_size > 100, f"{entry['name']}: the repository's licence text"
        assert yaml.safe_load((folder / "compose.yaml").read_text(encoding="utf-8")).get("services"), entry["name"]
        # Only the Compose file, its .env where the repository has one beside it, and the licence.
        expected = {"compose.yaml", "LICENSE"} | ({".env"} if entry["env"] else set())
        assert {path.name for path in folder.iterdir()} == expected, entry["name"]
        if entry["env"]:
            assert entry["env"] == str(Path(entry["path"]).parent / ".env").removeprefix("./"), entry["name"]
    assert len({entry["kind"] for entry in MANIFEST}) >= 6, "the kinds HPC users bring, not one kind many times"


# ---------------------------------------------------------------- every file, end to end


def crash_marks(name: str) -> list[pytest.MarkDecorator]:
    return [pytest.mark.xfail(strict=True, reason=CRASHES_TODAY[name])] if name in CRASHES_TODAY else []


@pytest.mark.parametrize("name", [pytest.param(name, marks=crash_marks(name)) for name in NAMES])
def test_a_corpus_file_imports_or_is_refused_never_crashes(name, tmp_path, capsys, monkeypatch):
    """import_compose.main as a user runs it: exit 0 with a config the workflow's schema accepts, or exit 65
    with one line per refusal and nothing written; the library's report agrees."""
    monkeypatch.setattr(import_compose.os, "environ", corpus_environment(CORPUS / name))
    output = tmp_path / "config" / f"{name}.yaml"
    code = import_compose.main([str(CORPUS / name / "compose.yaml"), "--output", str(output),
                                "--project-dir", str(ROOT)])
    captured = capsys.readouterr()
    outcome = import_corpus_file(name)
    assert outcome.status != "crash", outcome.crash
    if outcome.status in ("refused", "impossible"):
        assert code == EXIT_DATA and not output.parent.exists()
        lines = [line for line in captured.err.splitlines() if line.startswith("allocstack: error [compose]: ")]
        assert len(lines) == len(outcome.refusals), captured.err
    else:
        assert code == EXIT_OK, captured.err
        config = yaml.safe_load(output.read_text(encoding="utf-8"))
        errors = [error.message for error in jsonschema.Draft202012Validator(SCHEMA).iter_errors(config)]
        assert not errors, f"the import wrote a config the workflow refuses: {errors}"
        taken = [service for service in config["services"] if reserved(service)]
        assert not taken, f"services named as allocstack's own steps, which the workflow refuses: {taken}"
        assert f"{len(outcome.gaps)} gap(s)" in captured.out


def test_the_counts_are_printed(outcomes, capsys):
    """clean / gaps / refused / crash and the refusals ranked by cause, printed with or without -s."""
    table = counts_table(outcomes)
    with capsys.disabled():
        print("\n" + table, flush=True)
    statuses = Counter(outcome.status for outcome in outcomes.values())
    assert sum(statuses.values()) == len(NAMES)
    assert all(cause(refusal) for outcome in outcomes.values() for refusal in outcome.refusals)
    assert all(name in table for name in NAMES)


def test_at_least_80_percent_import_with_no_refusal_but_the_impossible(outcomes):
    """Issue 24's target: of the corpus, at least 80% import with no refusal but what cannot run here at all
    (privileged, devices, a daemon socket, a port below 1024 inside the image); gaps name what to supply."""
    runnable = [name for name, outcome in outcomes.items() if outcome.status in RUNNABLE]
    assert len(runnable) >= 0.8 * len(NAMES), counts_table(outcomes)
    for outcome in outcomes.values():  # a refusal is one line per cause: never twice the same
        assert len(outcome.refusals) == len(set(outcome.refusals))


# ---------------------------------------------------------------- what the importer gets wrong on real files


def services_of(name: str) -> dict[str, dict[str, Any]]:
    """The corpus file's services, interpolated, with list environments and depends_on as mappings (as the importer
    sees them)."""
    document = Interpolator(corpus_variables(CORPUS / name)).document(
        combine([import_compose.load(CORPUS / name / "compose.yaml")]))
    return {service: normalized(spec or {}) for service, spec in (document.get("services") or {}).items()}


def ports_used(service: str, outcome: Outcome) -> set[int]:
    """Every port the import took for a service: its gate port, the ports it says it listens on, the ports it refused."""
    ports = set()
    spec = (outcome.imported.config.get("services") or {}).get(service) if outcome.imported else None
    if spec and spec.get("port"):
        ports.add(spec["port"])
    for note in outcome.notes:
        if match := re.match(rf"{re.escape(service)}: listens on \[([\d, ]+)\]", note):
            ports |= {int(port) for port in match.group(1).split(",")}
    for refusal in outcome.refusals:
        if match := re.match(rf"services\.{re.escape(service)}: port (\d+) is privileged", refusal):
            ports.add(int(match.group(1)))
    return ports


def image_tags_read_as_ports(name: str, outcome: Outcome) -> list[str]:
    """``image: postgres:16`` is an image reference, never ``postgres`` listening on 16."""
    found = []
    for service, spec in services_of(name).items():
        image = str(spec.get("image") or "")
        tag = image.rpartition("/")[2].partition(":")[2]
        declared = {str(entry) for entry in [*(spec.get("ports") or []), *(spec.get("expose") or [])]}
        if (number := re.match(r"\d+", tag)) and int(number.group()) in ports_used(service, outcome) \
                and not any(re.search(rf"(^|:){number.group()}(/|$)", entry) for entry in declared):
            found.append(f"{service}: {image} -> port {number.group()}")
    return found


#: Environment keys that hold a user, a password or a database name: a value there is never a hostname.
NOT_A_HOST = re.compile(r"USER|PASSWORD|PASSWD|_PW$|_DB$|DATABASE|_NAME$|SECRET|TOKEN|KEY")


def values_rewritten_as_hosts(name: str, outcome: Outcome) -> list[str]:
    """A value that is not a hostname (a user name, a password, a URL's user) is left as written."""
    found = []
    written = (outcome.imported.config.get("services") or {}) if outcome.imported else {}
    for service, spec in services_of(name).items():
        environment = (written.get(service) or {}).get("environment") or {}
        for key, value in (spec.get("environment") or {}).items():
            if key not in environment or value is None or environment[key] == str(value):
                continue
            userinfo, written_userinfo = (re.match(r"[a-z0-9+.-]+://([^@/]*)@", text)
                                          for text in (str(value), environment[key]))
            if "://" not in str(value) and NOT_A_HOST.search(str(key)):
                found.append(f"{service}: {key}={value} -> {environment[key]}")
            elif userinfo and (not written_userinfo or written_userinfo.group(1) != userinfo.group(1)):
                found.append(f"{service}: {key}: the URL's user {userinfo.group(1)!r} rewritten: {environment[key]}")
    return found


def defaults_split_at_their_colon(name: str, outcome: Outcome) -> list[str]:
    """``${X:-./d}:/t`` is split after the variable's value, not at the ':' inside the braces."""
    return [refusal for refusal in outcome.refusals
            if any("}" in token and "${" not in token for token in re.findall(r"'([^']*)'", refusal))]


def cycles_compose_does_not_have(name: str, outcome: Outcome) -> list[str]:
    """A cycle is refused only where the file's own depends_on has one (none of the corpus files does)."""
    return [refusal for refusal in outcome.refusals if "depends_on has a cycle" in refusal]


def two_refusals_for_one_cause(name: str, outcome: Outcome) -> list[str]:
    """A service refused for its privileged port is not refused again for having 'no healthcheck and no port'."""
    privileged = {match.group(1) for refusal in outcome.refusals
                  if (match := re.match(r"services\.([^:]+): port \d+ is privileged", refusal))}
    return [refusal for refusal in outcome.refusals
            if (match := re.match(r"services\.([^:]+): has no healthcheck", refusal))
            and match.group(1) in privileged]


#: An import's line per image: ``SOURCE (USERS) -> PATH: how to get it`` (compose/mapping.py what_to_build).
TO_GET = re.compile(r"(?P<source>(?:image|build): .+?) \((?P<users>[^()]+)\) -> (?P<path>\S+): ")


def services_without_their_own_image(name: str, outcome: Outcome) -> list[str]:
    """Each service runs in its own image, as in Compose: every service with ``image:`` or ``build:`` (and no
    ``profiles:``: Compose starts those only when asked) is named in
    one line of what to get, one image file per distinct image (the same reference shares its file), and the
    written config gives each service the file of its own line. Of the files that import (a refused file may be
    refused for its image reference)."""
    if outcome.imported is None or outcome.status not in RUNNABLE:
        return []
    found, path_of_user, path_of_source = [], {}, {}
    for line in outcome.imported.report.build:
        match = TO_GET.match(line)
        if not match:
            found.append(f"not a line of what to get: {line[:80]}")
            continue
        if path_of_source.setdefault(match["source"], match["path"]) != match["path"]:
            found.append(f"{match['source']}: two image files")
        for user in match["users"].split(", "):
            path_of_user[user] = match["path"]
    if len(set(path_of_source.values())) != len(path_of_source):
        found.append(f"two images share one file: {path_of_source}")
    for service, spec in services_of(name).items():
        if (spec.get("image") or spec.get("build")) and not spec.get("profiles") and service not in path_of_user:
            found.append(f"{service}: no image to get")
    for service, spec in (outcome.imported.config.get("services") or {}).items():
        own = path_of_user.get(service, path_of_user.get(service.removesuffix("-service")))
        if own is not None and (spec or {}).get("image") != own:
            found.append(f"services.{service}.image: {(spec or {}).get('image')}, not {own}")
    return found


CHECKS = {
    "service-without-its-own-image": services_without_their_own_image,
    "image-tag-as-port": image_tags_read_as_ports,
    "value-rewritten-as-host": values_rewritten_as_hosts,
    "default-split-at-colon": defaults_split_at_their_colon,
    "false-cycle": cycles_compose_does_not_have,
    "one-refusal-per-cause": two_refusals_for_one_cause,
}

#: (check, corpus file) -> the bug, as the importer has it. Each is xfail(strict=True): fixing the bug flips it.
#: Empty: the importer of issue 24 fixed each one found in the corpus (an image tag read as a port, a user name or
#: a URL's user rewritten as a host, ``${X:-default}:/t`` split at the colon inside the braces, a cycle Compose does
#: not have, a privileged port refused twice).
KNOWN_WRONG: dict[tuple[str, str], str] = {}


def check_params() -> list[Any]:
    params = []
    for check in CHECKS:
        for name in NAMES:
            reason = KNOWN_WRONG.get((check, name))
            marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
            params.append(pytest.param(check, name, marks=marks, id=f"{check}-{name}"))
    return params


@pytest.mark.parametrize(("check", "name"), check_params())
def test_the_import_of_a_corpus_file_is_not_wrong(check, name, outcomes):
    """Mistakes the importer makes without a word (refused files included: their config is still assembled)."""
    assert CHECKS[check](name, outcomes[name]) == []


# ---------------------------------------------------------------- realistic edits of corpus files

DELETE = object()


@dataclass
class Edit:
    """Corpus file ``name`` with ``changes`` ((key path, new value or DELETE), ...) applied."""

    name: str
    changes: tuple[tuple[tuple[Any, ...], Any], ...]
    bug: str = ""  # what the importer does wrong with it today; empty where it copes

    def document(self) -> dict[str, Any]:
        document = copy.deepcopy(import_compose.load(CORPUS / self.name / "compose.yaml"))
        for path, value in self.changes:
            node = document
            for key in path[:-1]:
                node = node[key]
            if value is DELETE:
                del node[path[-1]]
            else:
                node[path[-1]] = value
        return document


PG = ("services", "postgres")
PROM = ("services", "prometheus")
SCHEDULER = ("services", "scheduler")
NOTEBOOK = ("services", "notebook")
#: Edits a user makes (or a typo makes) to a real file: the importer must refuse or import them, never crash.
EDITS = {
    # the importer crashed on these before issue 24 (port_of's int() of '${X}', a range or None; .get on a list
    # where a mapping belongs; a KeyError for a check waiting for a missing service)
    "port-unset-variable": Edit("postgres-pgadmin", (((*PG, "ports"), ["${PGPORT}"]),)),
    "port-long-syntax-without-target": Edit("postgres-pgadmin", (((*PG, "ports"), [{"published": 5432}]),)),
    "expose-range": Edit("dockprom", (((*PROM, "expose"), ["9090-9091"]),)),
    "expose-variable": Edit("dockprom", (((*PROM, "expose"), ["${PROM_PORT:-9090}"]),)),
    "healthcheck-retries-as-string": Edit("dask-jupyter", (((*SCHEDULER, "healthcheck"),
                                                            {"test": ["CMD", "true"], "retries": "3"}),)),
    "completed-on-a-missing-service": Edit("dask-jupyter", (((*NOTEBOOK, "depends_on"),
                                                             {"nope": {"condition": "service_completed_successfully"}}),)),
    "completed-on-a-profiled-service": Edit("dask-jupyter", (
        ((*NOTEBOOK, "depends_on"), {"worker": {"condition": "service_completed_successfully"}}),
        (("services", "worker", "profiles"), ["debug"]))),
    "top-level-volumes-as-list": Edit("localai", ((("volumes",), ["models"]),)),
    "top-level-networks-as-list": Edit("dask-jupyter", ((("networks",), ["default"]),)),
    "hostname-a-number": Edit("dask-jupyter", (((*SCHEDULER, "hostname"), 5),)),
    "build-as-list": Edit("flower-celery", ((("services", "worker", "build"), ["."]),)),
    "service-as-list": Edit("dask-jupyter", ((NOTEBOOK, ["image: x"]),)),
    "depends-on-list-of-mappings": Edit("dask-jupyter", (((*NOTEBOOK, "depends_on"),
                                                          [{"scheduler": {"condition": "service_healthy"}}]),)),
    "deploy-as-list": Edit("dask-cluster", ((("services", "dask_worker_cpu", "deploy"), ["replicas: 2"]),)),
    # refused or imported before: they stay so
    "port-with-host-address": Edit("postgres-pgadmin", (((*PG, "ports"), ["127.0.0.1:5432:5432"]),)),
    "port-range": Edit("postgres-pgadmin", (((*PG, "ports"), ["5432-5433:5432-5433"]),)),
    "replicas-from-a-variable": Edit("dask-jupyter", ((("services", "worker", "deploy", "replicas"), "${N:-2}"),)),
    "command-with-an-open-quote": Edit("dask-jupyter", (((*SCHEDULER, "command"), "sh -c 'x"),)),
    "volume-of-type-npipe": Edit("dask-jupyter", (((*SCHEDULER, "volumes"),
                                                   [{"type": "npipe", "source": "x", "target": "/x"}]),)),
    "env-file-optional-and-missing": Edit("dask-jupyter", (((*NOTEBOOK, "env_file"),
                                                            [{"path": "nope.env", "required": False}]),)),
    "top-level-include": Edit("dask-jupyter", ((("include",), ["other.yaml"]),)),
    "deploy-mode-global": Edit("dask-jupyter", ((("services", "worker", "deploy", "mode"), "global"),)),
    "service-null": Edit("dask-jupyter", ((NOTEBOOK, None),)),
    "services-as-list": Edit("dask-jupyter", ((("services",), ["scheduler"]),)),
}


def edit_params() -> list[Any]:
    return [pytest.param(edit, id=key, marks=[pytest.mark.xfail(strict=True, reason=edit.bug)] if edit.bug else [])
            for key, edit in EDITS.items()]


@pytest.mark.parametrize("edit", edit_params())
def test_an_edited_corpus_file_is_refused_or_imported_never_crashes(edit):
    outcome = outcome_of(edit.document(), CORPUS / edit.name, edit.name)
    assert outcome.status in ("clean", "gaps", "impossible", "refused")


def test_an_empty_argument_imports_into_a_config_the_workflow_accepts():
    edit = Edit("dask-jupyter", (((*SCHEDULER, "command"), ["redis-server", "--save", ""]),))
    outcome = outcome_of(edit.document(), CORPUS / edit.name, edit.name)
    config = yaml.safe_load(import_compose.render_config(outcome.imported, ["x"], Path("x.yaml")))
    assert [error.message for error in jsonschema.Draft202012Validator(SCHEMA).iter_errors(config)] == []


def test_two_services_on_one_port_are_refused_naming_both():
    edit = Edit("dask-jupyter", (((*NOTEBOOK, "ports"), ["8786:8786"]),))
    outcome = outcome_of(edit.document(), CORPUS / edit.name, edit.name)
    assert any("scheduler" in refusal and "notebook" in refusal for refusal in outcome.refusals)


# ---------------------------------------------------------------- mutation fuzz over the corpus

DOCUMENTS = {name: import_compose.load(CORPUS / name / "compose.yaml") for name in NAMES}
#: Strings that mean something to Compose, beside arbitrary text.
COMPOSE_WORDS = ["${X}", "${X:-8080}", "${X:?set it}", "$$HOME", "8080:80", "127.0.0.1::80", "80-81", "9000/udp",
                 "redis:6379", "postgres:16", "service_completed_successfully", "service_healthy", "/data",
                 "./d:/d:ro", "data:/data", "1m30s", "all", "gpu", "CMD-SHELL", "NONE", "no", "always", "host"]
SCALARS = (st.none() | st.booleans() | st.integers(-(2**31), 2**31) | st.floats(allow_nan=False, width=32)
           | st.text(max_size=12) | st.sampled_from(COMPOSE_WORDS))
VALUES = st.recursive(SCALARS, lambda children: st.lists(children, max_size=3)
                      | st.dictionaries(st.text(max_size=8) | st.sampled_from(COMPOSE_WORDS), children, max_size=3),
                      max_leaves=6)


def key_paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    paths = [prefix] if prefix else []
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else []
    for key, child in items:
        paths += key_paths(child, (*prefix, key))
    return paths


@st.composite
def mutated_documents(draw: st.DrawFn) -> tuple[str, dict[str, Any]]:
    """A corpus file with 1-3 mutations: a key deleted, a value replaced (any type), wrapped in a list,
    turned into a string or into a list."""
    name = draw(st.sampled_from(NAMES))
    document = copy.deepcopy(DOCUMENTS[name])
    for _ in range(draw(st.integers(1, 3))):
        paths = key_paths(document)
        if not paths:
            break
        path = draw(st.sampled_from(paths))
        parent = document
        for key in path[:-1]:
            parent = parent[key]
        old = parent[path[-1]]
        operation = draw(st.sampled_from(["delete", "replace", "wrap", "string", "list"]))
        if operation == "delete":
            del parent[path[-1]]
        elif operation == "replace":
            parent[path[-1]] = draw(VALUES)
        elif operation == "wrap":
            parent[path[-1]] = [old]
        elif operation == "string":
            parent[path[-1]] = str(old)
        else:
            parent[path[-1]] = list(old) if isinstance(old, (dict, list, str)) else [old]
    return name, document


@settings(max_examples=400, deadline=None, database=None, derandomize=True, phases=[Phase.explicit, Phase.generate],
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(mutated_documents())
def test_a_mutated_corpus_file_is_refused_or_imported_never_crashes(case):
    name, document = case
    outcome_of(document, CORPUS / name, name)  # the importer's own refusal is a result; anything else propagates
