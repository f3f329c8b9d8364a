"""Command-line plumbing shared by the components."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, NoReturn, TypeVar

from . import names
from .errors import EXIT_USAGE, AllocstackError, report

#: What Slurm, Snakemake or a user sends to end a component (the job's end or scancel, Ctrl-C, a closed session).
ENDING_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)

_Json = TypeVar("_Json", list[Any], dict[str, Any])


class ArgumentParser(argparse.ArgumentParser):
    """argparse that exits with 64 (the seed's "bad arguments") and a one-line message."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"allocstack: error [usage]: {self.prog}: {message}\n")


def positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {text}")
    return value


def non_negative_float(text: str) -> float:
    value = float(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must not be negative, got {text}")
    return value


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {text}")
    return value


def argv_list(text: str) -> list[str]:
    """argparse type: a JSON argv list (a user's program, never a shell string)."""
    rule = "must be a non-empty JSON list of strings, the first (the program) not empty"
    value = _json_of(text, list, rule)
    if not value or not all(isinstance(arg, str) for arg in value) or not value[0]:
        raise argparse.ArgumentTypeError(rule)
    return value


def json_object(text: str) -> dict[str, Any]:
    """argparse type: a JSON object (e.g. a program's environment values)."""
    return _json_of(text, dict, "must be a JSON object")


def _json_of(text: str, kind: type[_Json], rule: str) -> _Json:
    """``text`` parsed as JSON, which must be a ``kind``.

    :raises argparse.ArgumentTypeError: not JSON (what the parser says), or not a ``kind`` (``rule``).
    """
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not JSON: {exc.msg}") from exc
    if not isinstance(value, kind):
        raise argparse.ArgumentTypeError(rule)
    return value


def add_program_arguments(parser: argparse.ArgumentParser, what: str, required: bool = True) -> None:
    """The options of a component that runs a program of yours: a service, a worker, the check."""
    parser.add_argument("--command-json", type=argv_list, required=required, default=None,
                        help=f"{what} as a JSON argv list (never a shell string); none: its image's own")
    parser.add_argument("--environment-json", type=json_object, default={},
                        help="more variables for it, a JSON object (${ALLOCSTACK_...} in a value is expanded)")
    parser.add_argument("--uses", action="append", default=[],
                        help="a service of yours whose ALLOCSTACK_<NAME>_* variables it gets (repeatable)")
    parser.add_argument("--scratch", type=Path, default=os.environ.get("ALLOCSTACK_SCRATCH") or None,
                        help="job-scoped scratch (default $ALLOCSTACK_SCRATCH): endpoints, events, volumes")


def add_placement_arguments(parser: argparse.ArgumentParser) -> None:
    """Where a program of yours runs (allocstack/launch/program.py ``Placement``): its image, mounts, working directory."""
    parser.add_argument("--image", default="", help="the program's image ('' = none: it runs on this machine)")
    parser.add_argument("--runtime", choices=["apptainer", "charliecloud"], default="apptainer",
                        help="the container runtime of --image")
    parser.add_argument("--runtime-arg", action="append", default=[],
                        help="argument for apptainer exec or ch-run (repeatable)")
    parser.add_argument("--bind", action="append", default=[],
                        help="a host path the program sees at the same place in its image (repeatable)")
    parser.add_argument("--mounts-json", type=json_list, default=[],
                        help="its mounts, a JSON list of {target, source or volume, read_only} (config mounts)")
    parser.add_argument("--working-dir", default=None, help="its working directory in the image (config working_dir)")
    parser.add_argument("--entrypoint-json", type=argv_list, default=None,
                        help="Compose's entrypoint as a JSON argv list: replaces the image's ENTRYPOINT and CMD")


def json_list(text: str) -> list[Any]:
    """argparse type: a JSON list."""
    return _json_of(text, list, "must be a JSON list")


def add_gate_arguments(parser: argparse.ArgumentParser) -> None:
    """The gate records a component waits for before it starts (the sentinels after the readiness gates)."""
    parser.add_argument("--gate-record", type=Path, action="append", default=[],
                        help="start only once this gate record says ready (repeatable)")
    parser.add_argument("--gate-timeout", type=positive_float, default=60.0, help="bound on waiting for the gates")


def add_started_arguments(parser: argparse.ArgumentParser) -> None:
    """The services a program of yours waits for only until they have started (depends_on ``service_started``)."""
    parser.add_argument("--started", action="append", default=[], metavar="NAME",
                        help="start only once service NAME has started (its endpoint file in scratch: not its gate; "
                             "repeatable), within --gate-timeout with the gates")


def scratch_defaults(args: argparse.Namespace) -> None:
    """With ``args.scratch`` set, default ``endpoint_file`` and ``events`` to the files in it."""
    if args.scratch:
        args.endpoint_file = args.endpoint_file or os.path.join(args.scratch, names.ENDPOINT)
        args.events = args.events or os.path.join(args.scratch, names.EVENTS)


def os_release() -> str:
    """PRETTY_NAME from /etc/os-release as seen by this process (inside a container: the image's)."""
    try:
        with open("/etc/os-release", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("PRETTY_NAME="):
                    return line.split("=", 1)[1].strip().strip('"')
    except OSError:
        pass
    return "unknown"


def container_image() -> str | None:
    """The image this process runs in, as its runtime says: Apptainer names it; inside Charliecloud
    (``$CH_RUNNING`` is set by ch-run itself) launch.py names it in ``$ALLOCSTACK_CONTAINER``."""
    named = os.environ.get("APPTAINER_CONTAINER") or os.environ.get("SINGULARITY_CONTAINER")
    if not named and os.environ.get("CH_RUNNING"):
        named = os.environ.get("ALLOCSTACK_CONTAINER")
    return named or None


def runtime_facts() -> dict[str, Any]:
    """Where this component runs: recorded in its start event for the run's provenance."""
    import platform
    import socket

    return {
        "host": socket.gethostname(),
        "python": sys.executable,
        "pythonVersion": platform.python_version(),
        "osRelease": os_release(),
        "container": container_image(),
        "slurmJobId": os.environ.get("SLURM_JOB_ID"),
        "slurmStepId": os.environ.get("SLURM_STEP_ID"),
    }


#: Exit code of a component ended by Ctrl-C (SIGINT), as a shell reports it: 128 + 2.
EXIT_INTERRUPTED = 130


def silence_stdout() -> None:
    """Point stdout at /dev/null: its reader is gone (``| head`` exited, ``tee`` was killed)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass
    finally:
        os.close(devnull)


def echo(line: str) -> None:
    """Print ``line`` on stdout; if nobody reads stdout any more, drop it and carry on.

    A long-running component (the coordinator's progress lines) must not die because the
    terminal's pipe closed: the line is lost, the run is not.
    """
    try:
        print(line, flush=True)
    except BrokenPipeError:
        silence_stdout()


def interrupt_once(signum: int, frame: object) -> NoReturn:
    """SIGINT in a component: ignore every further SIGINT, then raise KeyboardInterrupt.

    Ctrl-C reaches a component twice: from the terminal's process group, and passed on by
    its launcher. The second must not land in the cleanup the first one started (a worker
    closing its connections, where it surfaced as a traceback from a finalizer).
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    raise KeyboardInterrupt


def run(main: Callable[[], int]) -> int:
    """A component's entry point: ``main()``, ending quietly on Ctrl-C and on a closed stdout.

    Ctrl-C reaches every process in the terminal's process group: a component ends with one
    line and exit code 130 instead of a traceback (a second Ctrl-C is ignored from the first
    on: :func:`interrupt_once`; components that pass signals on install their own handler).
    A stdout whose reader is gone is pointed at /dev/null, also for the final flush at exit.
    An AllocstackError that escapes ``main`` and an OSError nothing expected are one line each, with the
    error's exit code (``io`` for the OSError): never a traceback as the answer.
    """
    name = os.path.basename(sys.argv[0]) or "allocstack"
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, interrupt_once)
    try:
        code = main()
    except AllocstackError as error:  # raised before main's own handling (its arguments' checks)
        code = report(error)
    except KeyboardInterrupt:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            print(f"allocstack: {name}: interrupted (SIGINT)", file=sys.stderr, flush=True)
        except OSError:
            pass
        code = EXIT_INTERRUPTED
    except BrokenPipeError:
        silence_stdout()
        code = 0
    except OSError as exc:  # what the system refused where no step expected it: one line, never a traceback
        code = report(AllocstackError("io", f"{name}: {exc}"))
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        silence_stdout()
    return code


def tool_version(argv: list[str], env: Mapping[str, str] | None = None) -> str | None:
    """First line of ``argv``'s output (``apptainer --version``), or None when the tool is missing or hangs.

    ``env``: its whole environment (None: ours; ch-run needs ``$USER``, see :func:`containers.runtime_environ`).
    """
    import subprocess  # here: most components never ask a tool for its version

    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=20, check=False,
                              env=None if env is None else dict(env))
    except (OSError, subprocess.TimeoutExpired):
        return None
    text = (done.stdout or done.stderr).strip().splitlines()
    return text[0] if text else None


def add_network_options(parser: argparse.ArgumentParser) -> None:
    """The options of a service of the first node that also listens for the other nodes (config ``nodes`` > 1)."""
    parser.add_argument("--network-endpoint-file", type=Path,
                        help="also listen on this node's network address, for workers on other nodes, and publish "
                             "that endpoint here (0600)")
    parser.add_argument("--interface", default="",
                        help="network policy: bind this interface's IPv4 address ('' = the hostname's address)")
    parser.add_argument("--address", default="",
                        help="bind exactly this address for the other nodes, unchecked (tests and benchmarks: TLS on "
                             "loopback); overrides --interface")
    parser.add_argument("--no-tls", action="store_true",
                        help="plain text on the network address (only where the center's config says so)")
