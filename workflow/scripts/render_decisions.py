#!/usr/bin/env python3
"""Render the run's decision record (config ``decisions``) as Markdown.

The seed's "Adapt it" exercise, made reviewable: for each of the five things
(allocation, startup order, runtime state, access to the service, accelerators)
who owns it and how, beside the allocstack setting that implements it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from allocstack.common.cli import ArgumentParser, run
from allocstack.common.errors import EXIT_OK
from allocstack.common.jsonio import atomic_write_text

THINGS = {
    "allocation": ("Allocation", ("profiles/slurm/config.yaml `default-resources`; config `workers`, `nodes`, "
                                  "`*.cpus`, `slurm.max_cpus`")),
    "startup_order": ("Startup order", ("workflow/rules: serve_coordinator, serve_service (services) -> "
                                        "await_readiness, await_service (and await_network on each other node) -> "
                                        "run_worker (-> run_check); config `readiness`, `services`")),
    "runtime_state": ("Runtime state", "config `scratch` (job-scoped, 0700; `volumes` in it) and `state_dir` (journal)"),
    "service_access": ("Access to the service", ("127.0.0.1 + bearer token; `status.py --url` and an SSH tunnel; with "
                                                 "`nodes` above 1 config `network.interface` and `network.tls` (TLS, "
                                                 "pinned per-run certificate)")),
    "accelerators": ("Accelerators", "config `worker.gpus`, `services.<name>.gpus` -> sbatch/srun `--gpus`; `--nv` and CUDA_VISIBLE_DEVICES in the image"),
}


def render(run: str, decisions: dict[str, dict[str, str]], facts: dict[str, Any]) -> str:
    """The decision record (pure)."""
    lines = [
        f"# Decision record: run `{run}`",
        "",
        "| what | owner | how | where allocstack implements it |",
        "|---|---|---|---|",
    ]
    for key, (title, where) in THINGS.items():
        decision = decisions[key]
        lines.append(f"| {title} | {decision['owner']} | {decision['how']} | {where} |")
    lines += ["", "Run facts:", ""]
    lines += [f"- {name}: `{value}`" for name, value in facts.items()]
    return "\n".join(lines) + "\n"


#: What collect.py adds to the record once the stack ran on the node's own network (network.isolation: none): each
#: program seen listening beyond loopback, as its warning said it (allocstack/launch/exposure.py).
SEEN = "Seen listening beyond loopback while the stack ran (reachable by the node's other users and other nodes):"


def with_seen(record: str, warnings: list[str]) -> str:
    """``record`` with its :data:`SEEN` list of ``warnings``, an earlier attempt's replaced (pure)."""
    kept = record.split(f"\n{SEEN}\n", 1)[0].rstrip("\n") + "\n"
    return kept + (f"\n{SEEN}\n\n" + "".join(f"- {warning}\n" for warning in warnings) if warnings else "")


def parse_args(argv: list[str] | None):
    parser = ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", required=True)
    parser.add_argument("--decisions-json", type=json.loads, required=True, help="config `decisions` as JSON")
    parser.add_argument("--facts-json", type=json.loads, default={}, help="run facts to list under the table")
    parser.add_argument("--output", type=Path, required=True)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    atomic_write_text(args.output, render(args.run, args.decisions_json, args.facts_json), 0o644)
    print(f"render_decisions: wrote {args.output}", flush=True)
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(run(main))
