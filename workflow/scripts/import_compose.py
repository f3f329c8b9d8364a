#!/usr/bin/env python3
"""Import a Compose file: write the allocstack config (and a decision-record draft) that runs the same stack.

    python workflow/scripts/import_compose.py compose.yaml [compose.override.yaml ...] --output config/mystack.yaml

Several files are merged in order, as ``docker compose -f a -f b`` merges them (``!reset`` removes
a key, ``!override`` replaces one without merging). ``${VAR}`` is interpolated as Compose does:
from the environment, then the ``.env`` file beside the first Compose file (or, instead, each
``--env-file`` in order); a value from the environment whose name looks secret (PASSWORD, TOKEN,
SECRET, KEY) is not written: the config says ``${env:NAME}`` and the run reads it when the program
starts. Each service keeps its own image: the config expects it under ``--images`` (one file per
image, for ``--runtime``), and the import prints how to get each one. Run it from the directory you
run snakemake in: paths in the config are relative to it (``--project-dir``). The mapping is
allocstack/compose/mapping.py's. What cannot map is refused, one line per feature naming it and why, and
nothing is written; what is still missing (a gap: e.g. a worker without a command) is named, and
written into the config's header, so the run stops with a line naming the key until you supply it.
Before anything is written the config goes through the workflow's own plan (allocstack/plan: its
schema and its refusals, the gaps supplied): a config that the run would refuse is refused here. Running the import twice gives the same files.

Exit codes: 0 written (gaps, if any, listed); 65 refused (nothing written); 64 bad arguments.
"""

from __future__ import annotations

import argparse
import copy
import os
import re
import sys
from pathlib import Path
from typing import Any

import yaml
from render_decisions import render

from allocstack import plan
from allocstack.common.cli import ArgumentParser, run
from allocstack.common.errors import EXIT_OK, AllocstackError, report
from allocstack.common.images import ImageMeta, read_meta
from allocstack.common.jsonio import atomic_write_text
from allocstack.compose.interpolation import Variables, read_env_file
from allocstack.compose.mapping import (
    RESET,
    Imported,
    Override,
    Up,
    combine,
    draft_decisions,
    import_stack,
    unique,
    variable_sources,
)
from allocstack.launch.containers import PROGRAMS
from allocstack.plan.programs import env_references


class ComposeLoader(yaml.SafeLoader):
    """YAML as Compose reads it: ``!reset`` and ``!override`` tags for merging over an earlier file."""


def _reset(loader: ComposeLoader, node: yaml.Node) -> object:
    return RESET


def _override(loader: ComposeLoader, node: yaml.Node) -> Override:
    if isinstance(node, yaml.MappingNode):
        return Override(loader.construct_mapping(node, deep=True))
    if isinstance(node, yaml.SequenceNode):
        return Override(loader.construct_sequence(node, deep=True))
    return Override(loader.construct_scalar(node))


ComposeLoader.add_constructor("!reset", _reset)
ComposeLoader.add_constructor("!override", _override)


def load(path: Path) -> dict[str, Any]:
    """One Compose file.

    :raises AllocstackError: ``compose`` when it cannot be read or is not a Compose mapping.
    """
    try:
        document = yaml.load(path.read_text(encoding="utf-8"), Loader=ComposeLoader)  # noqa: S506 (a SafeLoader)
    except OSError as exc:
        raise AllocstackError("compose", f"{path}: cannot read it: {exc.strerror}") from exc
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise AllocstackError("compose", f"{path}: not YAML: {' '.join(str(exc).split())[:300]}") from exc
    if not isinstance(document, dict):
        raise AllocstackError("compose", f"{path}: not a Compose file (the top level must be a mapping)")
    return document


def variables(env_files: list[Path], compose_dir: Path, environ: dict[str, str]) -> Variables:
    """What ``${VAR}`` reads: the environment, then the env files (``--env-file``s, else ``.env`` beside the file).

    :raises AllocstackError: ``compose`` for an env file that cannot be read or parsed.
    """
    files: list[tuple[str, dict[str, str]]] = []
    paths = [(path, f"--env-file {path}") for path in env_files] if env_files else \
        [(compose_dir / ".env", ".env")] if (compose_dir / ".env").is_file() else []
    for path, label in paths:
        try:
            files.append((label, read_env_file(path, Variables(environ, list(files)), label)))
        except OSError as exc:
            raise AllocstackError("compose", f"{path}: cannot read it: {exc.strerror}") from exc
        except ValueError as exc:
            raise AllocstackError("compose", f"{path}: {exc}") from exc
    return Variables(environ, files)


def image_reader(project_dir: Path):
    """Reads an image's metadata (its EXPOSE ports) where the config expects it, when it is there already."""

    def read(path: str) -> ImageMeta | None:
        where = project_dir / path
        if not where.exists():
            return None
        try:
            return read_meta(str(where))
        except (OSError, ValueError):
            return None

    return read


def run_name(document: dict[str, Any], first: Path) -> str:
    """Compose's project name: ``name:``, else the first file's directory; as a run name."""
    name = str(document.get("name") or first.resolve().parent.name)
    return re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip(".-_")[:64] or "compose"


def header(sources: list[str], output: Path, imported: Imported) -> str:
    """The config's leading comment: where it came from, how to run it, what to build, gaps and notes."""
    runtime = imported.config.get("runtime", "apptainer")
    run_line = (f"snakemake --cores 4 --sdm apptainer --configfile {output}" if runtime == "apptainer"
                else f"snakemake --cores 4 --configfile {output}")
    lines = [f"Imported from {' + '.join(sources)} by workflow/scripts/import_compose.py.",
             "Change the Compose file and import again (the import gives the same file every time);",
             "or override keys in a config file of yours given after this one.",
             f"Run it in its images: {run_line}",
             f"  on a cluster: snakemake --profile profiles/slurm --configfile {output}",
             f"  without images (each program on this machine): snakemake --cores 4 --configfile {output}"
             + (" --config runtime=apptainer" if runtime != "apptainer" else "")]
    report = imported.report
    sections = [(f"Images to get ({runtime}; each checked against its .sha256 sidecar before the run):", report.build),
                ("GAPS - supply these before running:", report.gaps),
                ("Notes:", report.notes)]
    for title, items in sections:
        if items:
            lines += ["", title] + [f"- {item}" for item in unique(items)]
    return "".join(f"# {line}".rstrip() + "\n" for line in lines) + "\n"


class ConfigDumper(yaml.SafeDumper):
    """Block mappings, flow lists (a command on one line), no line wrapping."""


def _list(dumper: yaml.SafeDumper, items: list[Any]) -> yaml.Node:
    flat = all(not isinstance(item, (dict, list)) for item in items)
    return dumper.represent_sequence("tag:yaml.org,2002:seq", items, flow_style=flat)


def _mapping(dumper: yaml.SafeDumper, mapping: dict[str, Any]) -> yaml.Node:
    return dumper.represent_mapping("tag:yaml.org,2002:map", mapping, flow_style=not mapping)


ConfigDumper.add_representer(list, _list)
ConfigDumper.add_representer(dict, _mapping)

#: The keys of the written config, in the order a reader wants them.
ORDER = ("run", "mode", "tasks", "expected", "runtime", "workers", "worker", "services", "init_jobs", "main", "volumes",
         "keep_volumes", "verify", "decisions")


#: A command a gap leaves null, as if you had supplied it: the plan judges everything else.
SUPPLIED = ["<your command>"]


def validated_plan(config: dict[str, Any], project_dir: Path) -> plan.Plan:
    """The workflow's plan of ``config``, its gaps supplied: nothing else may be refused.

    :raises allocstack.plan.PlanError: what the plan refuses (the import then writes nothing).
    """
    supplied = copy.deepcopy(config)
    parts = () if supplied.get("mode") == "serve" else ("worker", "verify")  # a serving stack uses neither
    programs = (*(supplied[key] for key in parts), *supplied["services"].values())
    for spec in programs:
        spec["command"] = spec["command"] or SUPPLIED
    # The world the config is written for: its images switched on (--sdm apptainer, or runtime charliecloud),
    # their runtime there, each ${env:NAME} set (the import read it from this environment), each bind source
    # there (a missing one is a gap the import names), a node that lets users make the stack's own network (the
    # run refuses it in one line where its node does not: network.isolation).
    world = plan.Facts(cwd=str(project_dir), deployment=frozenset({"apptainer"}), which=lambda program: program,
                       environ={name: "set" for spec in programs for name in env_references(spec)},
                       exists=lambda path: True, sysctl={"user.max_user_namespaces": "1"}.get)
    return plan.load(supplied, world)


def render_config(imported: Imported, sources: list[str], output: Path) -> str:
    config = dict(imported.config)
    config["decisions"] = draft_decisions(config, imported.order, " + ".join(sources))
    ordered = {key: config[key] for key in ORDER if key in config}
    body = yaml.dump(ordered, Dumper=ConfigDumper, sort_keys=False, width=4096, allow_unicode=True)
    return header(sources, output, imported) + body


def parse_args(argv: list[str] | None):
    parser = ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("compose", nargs="+", type=Path, help="Compose file(s), merged in order")
    parser.add_argument("--output", type=Path, required=True, help="the allocstack config to write")
    parser.add_argument("--decisions", type=Path,
                        help="the decision-record draft to write (default: OUTPUT's name with .decision-record.md)")
    parser.add_argument("--project-dir", type=Path, default=Path.cwd(),
                        help="where snakemake runs: paths in the config are relative to it (default: here)")
    parser.add_argument("--run", help="the run's name (default: the Compose project name)")
    parser.add_argument("--env-file", type=Path, action="append", default=[],
                        help="read ${VAR} values from this file instead of the .env beside the Compose file "
                             "(repeatable: a later file overrides an earlier one; the environment overrides both)")
    parser.add_argument("--images", default="images",
                        help="where the config expects each service's image, relative to the project (default: images)")
    parser.add_argument("--runtime", choices=sorted(PROGRAMS), default="apptainer",
                        help="the container runtime the images are for: apptainer (a SIF per image) or charliecloud "
                             "(a directory image per image)")
    parser.add_argument("--exit-code-from", metavar="SERVICE",
                        help="as docker compose up --exit-code-from: the stack ends when SERVICE ends, its exit code "
                             "decides (config main)")
    parser.add_argument("--scale", type=scale, action="append", default=[], metavar="SERVICE=N",
                        help="as docker compose up --scale: N replicas of SERVICE (repeatable)")
    parser.add_argument("--profile", action="append", default=[], metavar="NAME",
                        help="as docker compose --profile: also the services with this profile (repeatable)")
    parser.add_argument("--no-hostnames", action="store_true",
                        help="leave service names used as hostnames as written (do not rewrite them to "
                             "${ALLOCSTACK_<NAME>_HOST})")
    args = parser.parse_args(argv)
    args.decisions = args.decisions or args.output.with_name(f"{args.output.stem}.decision-record.md")
    return args


def scale(text: str) -> tuple[str, int]:
    """``SERVICE=N`` (``--scale``)."""
    name, _, number = text.partition("=")
    if not name or not number.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} is not SERVICE=N")
    return name, int(number)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    sources = [str(path) for path in args.compose]
    project_dir = args.project_dir.resolve()
    try:
        documents = [load(path) for path in args.compose]
        compose = combine(documents)
        compose_dir = args.compose[0].resolve().parent
        imported = import_stack(compose, compose_dir, project_dir, args.run or run_name(compose, args.compose[0]),
                                variables=variables(args.env_file, compose_dir, dict(os.environ)),
                                images_dir=args.images, runtime=args.runtime, image_meta=image_reader(project_dir),
                                hostnames=not args.no_hostnames,
                                up=Up(args.exit_code_from, tuple(args.scale), frozenset(args.profile)))
        refusals = unique(imported.report.refusals)
        if not refusals:
            try:
                text = render_config(imported, sources, args.output)
                config = yaml.safe_load(text)
                validated_plan(config, project_dir)
            except plan.PlanError as refusal:
                refusals = [f"allocstack would refuse the config: {refusal.message}"]
        if refusals:
            for refusal in refusals:
                report(AllocstackError("compose", f"{' + '.join(sources)}: {refusal}"))
            return AllocstackError("compose", "").exit_code
        for path in (args.output, args.decisions):
            path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(args.output, text, 0o644)
        atomic_write_text(args.decisions, render(config["run"], config["decisions"], {
            "imported from": " + ".join(sources), "services": ", ".join(imported.order) or "none",
            "workers": config["workers"] if config.get("mode") != "serve" else "none (mode: serve)", "volumes": ", ".join(config["volumes"]) or "none",
            "variables": variable_sources(imported.variables)}), 0o644)
    except AllocstackError as error:
        return report(error)
    gaps = unique(imported.report.gaps)
    print(f"import_compose: wrote {args.output} and {args.decisions}: services {', '.join(imported.order) or 'none'}; "
          f"{config['workers'] if config.get('mode') != 'serve' else 'no (mode: serve)'} workers; {len(gaps)} gap(s)", flush=True)
    for gap in gaps:
        print(f"gap: {gap}", flush=True)
    for item in unique(imported.report.build):
        print(f"to get: {item}", flush=True)
    for note in unique(imported.report.notes):
        print(f"note: {note}", flush=True)
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(run(main))
