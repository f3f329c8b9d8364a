"""The coordinator's settings: parsed from its command line into one typed, frozen dataclass."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from ..common import names, slurm
from ..common.cli import ArgumentParser, add_network_options, non_negative_float, positive_float, positive_int
from .journal import MAX_WINDOW


@dataclass(frozen=True)
class CoordinatorSettings:
    input: Path
    results: Path
    endpoint_file: Path
    journal: Path
    scratch: Path | None = None
    events: Path | None = None
    end_record: Path | None = None
    service_file: Path | None = None
    inputs_summary: Path | None = None
    compact_tasks: Path | None = None
    max_attempts: int = 3
    workers: int = 1
    lease_seconds: float = 60.0
    idle_timeout: float = 900.0
    lifetime: float = 0.0
    #: Epoch seconds after which no claim is granted if its lease would outlast it (0 = unknown).
    stop_claims_at: float = 0.0
    drain_seconds: float = 5.0
    #: Seconds a journal flush may wait for the other workers' results (group commit; 0 = none).
    commit_window: float = MAX_WINDOW
    progress_interval: float = 5.0
    #: stdout: "live" (a line redrawn in place), "lines" (one every progress_interval) or "auto".
    progress: str = "auto"
    max_body_bytes: int = 32 << 20
    connection_timeout: float = 120.0
    max_connections: int = 512
    max_buffered_bytes: int = 256 << 20
    #: More than one node: also listen on the network address and publish that endpoint here (None: loopback only).
    network_endpoint_file: Path | None = None
    #: The network policy: the interface whose address to bind ('' = the hostname's address).
    interface: str = ""
    #: Bind exactly this address for the other nodes, unchecked (tests and benchmarks).
    address: str = ""
    #: Plain text on the network address (where the center's config says so).
    no_tls: bool = False


def parse_settings(argv: list[str] | None, description: str = "") -> CoordinatorSettings:
    parser = ArgumentParser(description=description)
    parser.add_argument("--input", required=True, type=Path, help="task document (inputs/tasks.json)")
    parser.add_argument("--results", required=True, type=Path, help="where to write results.json when the run ends")
    parser.add_argument("--scratch", type=Path, default=os.environ.get("ALLOCSTACK_SCRATCH") or None,
                        help=f"job-scoped scratch dir (default $ALLOCSTACK_SCRATCH); holds {names.ENDPOINT} "
                             f"and {names.EVENTS}")
    parser.add_argument("--endpoint-file", type=Path,
                        help=f"where to publish the endpoint and token (default SCRATCH/{names.ENDPOINT})")
    parser.add_argument("--events", type=Path, help=f"event log to append to (default SCRATCH/{names.EVENTS})")
    parser.add_argument("--journal", type=Path, help="durable results journal (default: next to --results)")
    parser.add_argument("--end-record", type=Path, help="where to write the record of how the coordinator ended")
    parser.add_argument("--service-file", type=Path, help="file written once listening (the Snakemake service output)")
    parser.add_argument("--inputs-summary", type=Path,
                        help="validate_inputs' summary: its outputBytes sharpens the up-front disk space check")
    parser.add_argument("--compact-tasks", type=Path,
                        help="validate_inputs' compact copy of the task set (loaded instead of decoding --input again "
                             "while the summary's digests say it is that document's)")
    parser.add_argument("--max-attempts", type=positive_int, default=3,
                        help="a task whose handler fails is handed out again until it failed this many times")
    parser.add_argument("--workers", type=positive_int, default=1,
                        help="expected number of workers: a claim gets at most pending/workers tasks")
    parser.add_argument("--lease-seconds", type=positive_float, default=60.0,
                        help="a claimed task returns to the queue after this")
    parser.add_argument("--idle-timeout", type=non_negative_float, default=900.0,
                        help="stop after this many seconds without a request (0 = never)")
    parser.add_argument("--lifetime", type=non_negative_float, default=0.0,
                        help="stop after this many seconds in all (0 = no limit)")
    parser.add_argument("--stop-claims-at", type=float, default=slurm.end_time_from_env(os.environ),
                        help="epoch seconds after which no claim is granted if a lease would outlast it "
                             "(default: $SLURM_JOB_END_TIME)")
    parser.add_argument("--drain-seconds", type=non_negative_float, default=5.0,
                        help="bound on draining in-flight results at shutdown")
    parser.add_argument("--commit-window", type=non_negative_float, default=MAX_WINDOW,
                        help="seconds an fsync of the journal may wait for more workers' results, at most the last "
                             f"fsync's duration and {MAX_WINDOW} (group commit; 0 = sync each arrival at once)")
    parser.add_argument("--progress-interval", type=positive_float, default=5.0, help="seconds between progress lines")
    parser.add_argument("--progress", choices=["auto", "live", "lines"], default="auto",
                        help="stdout: a live line redrawn in place (live), a line every --progress-interval "
                             "(lines), or live when stdout is a terminal (auto)")
    parser.add_argument("--max-body-bytes", type=positive_int, default=32 << 20, help="largest request body accepted")
    parser.add_argument("--connection-timeout", type=positive_float, default=120.0,
                        help="close a connection that sends (or reads) nothing for this long")
    parser.add_argument("--max-connections", type=positive_int, default=512,
                        help="connections served at once; more are answered 503 and closed")
    parser.add_argument("--max-buffered-bytes", type=positive_int, default=256 << 20,
                        help="request body bytes held at once over all connections; more are answered 503")
    add_network_options(parser)
    args = parser.parse_args(argv)
    scratch = args.scratch
    endpoint_file = args.endpoint_file or (scratch / names.ENDPOINT if scratch else None)
    if endpoint_file is None:
        parser.error("--endpoint-file is required when no --scratch (or $ALLOCSTACK_SCRATCH) is given")
    values = vars(args)
    values.update(endpoint_file=endpoint_file, journal=args.journal or args.results.absolute().parent / names.JOURNAL,
                  events=args.events or (scratch / names.EVENTS if scratch else None))
    return CoordinatorSettings(**values)


def event_directories(settings: CoordinatorSettings) -> list[Path]:
    """Where the other components' event logs are: the run's scratch on this node and, with more than one node,
    the run's state directory beside the journal (``events/<component>.jsonl`` in both)."""
    found = [settings.scratch / names.EVENTS_DIR] if settings.scratch else []
    return [*found, settings.journal.parent / names.EVENTS_DIR]
