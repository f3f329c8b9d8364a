#!/usr/bin/env python3
"""Your own long-running service (config ``services``), run like the coordinator.

A key-value store, a database, a model server, an API: each gets the same
treatment as the built-in coordinator. This supervisor writes the Snakemake
service file first thing, waits for the gates of the services it depends on
(their gate records; for those it waits for with ``service_started``, ``--started``, only
until their endpoint files exist: their programs have started), takes its port (``--port``, or a free one on 127.0.0.1),
then runs your command with the variables of its dependencies and its own
(``ALLOCSTACK_<NAME>_HOST``, ``_PORT``, ``_ENDPOINT``, ``_TOKEN``, see
allocstack/launch/program.py), and publishes ``SCRATCH/services/<name>.json``
(``{"schemaVersion": 1, "endpoint", "token", "pid", "pidStartedAt"}``, mode 0600) for its gate and its users.
Your service must listen on ``$ALLOCSTACK_<NAME>_HOST`` at that port (and may require the token); what it
listens on beyond loopback is named in a warning, while it runs (allocstack/launch/exposure.py).
With an image of its own (``--image``) this supervisor runs beside it on the node and starts it
in the image (allocstack/launch/program.py ``prepare``): the image's own command when ``--command-json``
is not given, its mounts at their targets, its working directory; ``--port-from-image`` takes
the port the image EXPOSEs.

SIGTERM/SIGINT/SIGHUP are passed on; when the stack is done Snakemake stops it,
and it stops by itself if its launcher is gone. A service still running
``--stop-grace`` seconds after that signal is killed. How it ended goes to
``SCRATCH/services/<name>.end.json``: ``stopped`` (by allocstack, cleanly),
``unclean`` (stopped by allocstack, but not with exit 0 or that signal),
``killed`` (after the grace period) or ``exited`` (by itself, before the stack
was done). Snakemake never checks a service's exit status: verification does, from this record.

With a restart policy (``--restart``, config ``services.<name>.restart``: allocstack/launch/restart.py) a
program that ended by itself is started again in this same job step, after the policy's delay, with the
same command, environment, port and token (its users and its published endpoint stay valid); each restart
is a ``service-restart`` event (attempt, exit code, how it ended) and a line in this log. One that ends once
its restarts are used up ends as ``exited``, its line saying how many restarts it had. Stopped by
allocstack (the stack's end), it is never restarted.

With ``--replicas N`` (config ``services.<name>.replicas``, Compose ``deploy.replicas``/``--scale``) the service
runs N copies, each this same supervisor in a job step of its own (``--replica K``; replicas 2.. with
``--instance NAME-replica-K``: their own files, log, restart policy and end record, as a global service's
instance has). One step per replica rather than one step supervising N (as worker_block.py does for a pool of
per-task workers): a replica is then supervised exactly as one service is, by this one code path (restart
policy, stop request, end record, exposure watch), and Snakemake stops each as it stops a service; replicas are
few (a consumer or two of another kind), a pool of thousands is what the workers are for. Each replica's
program gets ``ALLOCSTACK_REPLICA`` (K) and ``ALLOCSTACK_REPLICAS`` (N), as a Compose replica tells itself apart
by its hostname. All replicas share one token (the first to make it: allocstack/common/endpoint.py
``shared_token``), as their users
get one. Replicas of a service with a port (``--own-network``, config ``network.isolation: private``) each run in a
namespace of their own on that same port (launch.py ``--network-space``), reached through the service's front in the
stack's namespace (allocstack/launch/portsockets.py): this supervisor carries the front's connections to its
program there, and puts each service of the stack that it may use (``--forward NAME[=PORT]``) on its port there.
Without a port they share the stack's namespace (nothing of theirs can collide).

With ``--network-endpoint-file`` (config ``nodes`` above 1; not for replicas in networks of their own, whose front
port_sockets.py relays) the service still listens on
127.0.0.1, and this supervisor also relays it to this node's network address over TLS
with a certificate of its own (``allocstack.launch.tunnel``), published there for the workers
on the other nodes: neither your service nor your workers' program changes.

Exit code: 0 when stopped cleanly, else your command's.
"""

from __future__ import annotations

import contextlib
import os
import random
import secrets
import socket
import sys
import time
from pathlib import Path

from allocstack import SCHEMA_VERSION
from allocstack.common import names
from allocstack.common.cli import (
    ArgumentParser,
    add_gate_arguments,
    add_network_options,
    add_placement_arguments,
    add_program_arguments,
    add_started_arguments,
    non_negative_float,
    positive_int,
    run,
    runtime_facts,
)
from allocstack.common.endpoint import (
    LOOPBACK,
    service_end_path,
    service_endpoint_path,
    service_variables,
    services_environment,
    shared_token,
    write_endpoint,
    write_service_file,
)
from allocstack.common.errors import DIAGNOSTICS, AllocstackError, report
from allocstack.common.events import append_event
from allocstack.common.jsonio import atomic_write_json
from allocstack.common.listening import process_start
from allocstack.common.scratch import make_private, private_level
from allocstack.launch import exposure, stacknet
from allocstack.launch.portsockets import serve_replica_network, target
from allocstack.launch.program import (
    Placement,
    await_dependencies,
    describe,
    image_meta,
    prepare,
    program_environment,
    service_problem,
)
from allocstack.launch.restart import RestartPolicy, exhausted
from allocstack.launch.restart import add_arguments as add_restart_arguments
from allocstack.launch.supervise import Outcome, Supervised
from allocstack.launch.tunnel import relay_service

#: Where the kernel takes the local ports of outgoing connections from (Linux; "32768 60999" by default).
EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def port_choices(ephemeral_range: Path = EPHEMERAL_RANGE) -> range:
    """The ports a service without a port of its own may be given: the upper half below the ephemeral range
    (16384..32767 by default), so that no outgoing connection on the node takes the port between this choice
    and the program's own bind (a port 0 choice can: CI of 50faa84, ``Address already in use`` on a busy node).
    Empty where the range cannot be read."""
    try:
        low = int(ephemeral_range.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return range(0)
    return range(max(1024, low // 2), low)


def bound_port(port: int) -> int:
    """The port a server could bind on the loopback address now (``port``, or the kernel's choice for 0).

    :raises OSError: when it cannot (``Address already in use``).
    """
    with socket.socket() as probe:
        # As servers bind: connections of an earlier run in TIME_WAIT do not count, a listener does.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind((LOOPBACK, port))
        return probe.getsockname()[1]


def take_port(port: int, choices: range | None = None, tries: int = 64) -> int:
    """``port`` when it is free on the loopback address, or (``port`` 0) a free one of ``choices``
    (:func:`port_choices`), or the kernel's choice where none of ``tries`` random ones is free.

    A fixed port (your program's, e.g. from Compose) is checked first: on a shared node
    another program may hold it, and a gate answered by someone else's server must never pass.

    :raises AllocstackError: ``prerequisite`` when the port is taken.
    """
    choices = port_choices() if choices is None else choices
    for _ in range(tries if port == 0 and choices else 0):
        with contextlib.suppress(OSError):
            return bound_port(random.choice(choices))  # noqa: S311 (a port to try, not a secret)
    try:
        return bound_port(port)
    except OSError as exc:
        raise AllocstackError("prerequisite", f"port {port} on {LOOPBACK} is already in use on this node "
                                              f"({exc.strerror}): another program holds it; choose another "
                                              "port, or port: null and $ALLOCSTACK_<NAME>_PORT") from exc


def replica_variables(replica: int, replicas: int) -> dict[str, str]:
    """What each replica of a service is told: which one it is (1..N) and how many there are."""
    return {"ALLOCSTACK_REPLICA": str(replica), "ALLOCSTACK_REPLICAS": str(replicas)}


def forward_ports(scratch: Path, forwards: list[str]) -> dict[str, int]:
    """``--forward NAME[=PORT]`` as each service's port: the plan's, else the one its endpoint names (a dependency:
    it has started).

    :raises AllocstackError: ``network`` for one that names none yet.
    """
    ports: dict[str, int] = {}
    for spelled in forwards:
        name, _, port = spelled.partition("=")
        found = int(port) if port else (target(scratch, name) or (None, None))[1]
        if found is None:
            raise AllocstackError("network", f"service {name} has published no port yet: a replica in a network of its "
                                             "own cannot be given its way to it")
        ports[name] = found
    return ports


def end_status(outcome: Outcome) -> str:
    if outcome.stop_signal is None:
        return "exited"
    if outcome.killed:
        return "killed"
    return "stopped" if outcome.clean_stop else "unclean"


def parse_args(argv: list[str] | None):
    parser = ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--name", default="app", help="the service's name (config services.<name>)")
    parser.add_argument("--instance", default=None,
                        help="a global service's instance on a node other than the first (NAME-node-N): its files "
                             "(endpoint, end record, events) under this name; its variables stay NAME's")
    parser.add_argument("--replica", type=positive_int, default=1, help="which replica this is (1..--replicas)")
    parser.add_argument("--replicas", type=positive_int, default=1, help="how many replicas of the service run")
    add_program_arguments(parser, "your service", required=False)
    add_placement_arguments(parser)
    parser.add_argument("--port", type=int, default=0, help="the port it listens on (0 = a free one)")
    parser.add_argument("--port-from-image", action="store_true",
                        help="the port its image EXPOSEs (config port: image; needs --image)")
    add_gate_arguments(parser)
    add_started_arguments(parser)
    parser.add_argument("--stop-grace", type=non_negative_float, default=10.0,
                        help="seconds it may take to stop after SIGTERM before it is killed")
    add_restart_arguments(parser)
    parser.add_argument("--own-network", action="store_true",
                        help="this replica runs in a namespace of its own (launch.py --network-space): carry its "
                             "front's connections to its port there")
    parser.add_argument("--forward", action="append", default=[], metavar="NAME[=PORT]",
                        help="with --own-network: a service of the stack on its port in this replica's namespace "
                             "(without PORT, the one its endpoint names; repeatable)")
    parser.add_argument("--service-file", type=Path, help="the Snakemake service output, written first thing")
    add_network_options(parser)
    args = parser.parse_args(argv)
    if args.scratch is None:
        parser.error("--scratch (or $ALLOCSTACK_SCRATCH) is required")
    if not 0 <= args.port <= 65535:
        parser.error("--port must be in 0..65535")
    if args.port_from_image and not args.image:
        parser.error("--port-from-image needs --image")
    if args.replica > args.replicas:
        parser.error("--replica must be in 1..--replicas")
    return args


def image_port(placement: Placement, name: str) -> int:
    """The port ``name``'s image EXPOSEs (its lowest TCP port).

    :raises AllocstackError: ``config`` when it EXPOSEs none.
    """
    exposed = image_meta(placement).exposed
    if not exposed:
        raise AllocstackError("config", f"services.{name}.port is image, but its image {placement.image} EXPOSEs no TCP "
                                        f"port: set services.{name}.port, or give the service a healthcheck")
    return exposed[0]


def relay_for_other_nodes(args, name: str, port: int, token: str) -> tuple[str, str | None] | None:
    """With more than one node: relay ``127.0.0.1:port`` to this node's network address (TLS), for the connections
    that open with the service's key (``token``: allocstack/launch/tunnel.py); (its URL, the certificate's
    fingerprint).

    :raises AllocstackError: ``network`` for a wrong address or one it cannot listen on.
    """
    if args.network_endpoint_file is None:
        return None
    private_level(args.network_endpoint_file.parent, "prerequisite")
    args.network_endpoint_file.unlink(missing_ok=True)
    return relay_service(args.interface, args.address, args.no_tls, args.scratch / names.SERVICES, name, port, token,
                         stacknet.inbound_port(args.scratch, name))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    name = args.name
    files = args.instance or name  # a global service's instance: its own files on the shared scratch
    if args.service_file:
        write_service_file(args.service_file)
    log = lambda message: print(f"{files}: {message}", file=sys.stderr, flush=True)  # noqa: E731
    program = Supervised(f"service {files}")
    try:
        published, ended = service_endpoint_path(args.scratch, files), service_end_path(args.scratch, files)
        events = args.scratch / names.component_events(files)
        make_private(published.parent)
        make_private(events.parent)
        for stale in (published, ended, events):  # what a crashed earlier run left
            stale.unlink(missing_ok=True)
        await_dependencies(args.gate_record, args.started, args.scratch, args.gate_timeout, log)
        placement = Placement.from_args(args)
        wanted = image_port(placement, name) if args.port_from_image else args.port
        port = take_port(wanted)
        token = shared_token(published.parent, name) if args.replicas > 1 else secrets.token_urlsafe(32)
        if args.own_network:
            try:
                serve_replica_network(args.scratch, files, port, forward_ports(args.scratch, args.forward))
            except OSError as exc:
                raise AllocstackError("network", f"{files}: its own network could not carry its port and the stack's "
                                                 f"services ({exc.strerror or exc})") from exc
        relayed = relay_for_other_nodes(args, name, port, token)
        endpoint = f"http://{LOOPBACK}:{port}"
        stack = {**services_environment(args.scratch, args.uses), **service_variables(name, endpoint, token),
                 **replica_variables(args.replica, args.replicas)}
        env = program_environment(os.environ, stack, args.environment_json, f"services.{name}")
        how = prepare(placement, args.command_json, env, set(args.environment_json),
                      args.scratch / names.PROGRAMS / files, f"services.{name}")
        if how.container:
            log(f"in its image: {how.line()}")
        started = time.time()
        pid = program.start(how.argv, how.env, args.stop_grace, how.cwd, how.deliver, how.preexec)
    except AllocstackError as error:  # its gate reads this and fails at once, with the reason
        atomic_write_json(service_end_path(args.scratch, files), {
            "schemaVersion": SCHEMA_VERSION, "service": files, "status": "failed", "how": error.line(),
            "endedAt": time.time()})
        return report(error)
    # its gate looks at what that process listens on
    write_endpoint(published, endpoint, token, "", process=(pid, process_start(pid)))
    if relayed:
        url, fingerprint = relayed
        write_endpoint(args.network_endpoint_file, url, token, "", tls=fingerprint is not None, fingerprint=fingerprint,
                       service_port=port)
        log(f"relayed to the other nodes on {url}")
    append_event(events, "service-started", service=files, endpoint=endpoint, command=how.shown[0],
                 **{**runtime_facts(), **({"container": how.container} if how.container else {})})
    log(f"{describe(how.shown)} started on {endpoint}{f' in {how.container}' if how.container else ''} (pid {pid})")
    policy = RestartPolicy.from_args(args)
    watching = [exposure.watch(pid, "service", name, events)]  # what it listens on beyond loopback

    def restarted(attempt: int, ended: Outcome, pid: int) -> None:  # same command, environment, port and token
        append_event(events, "service-restart", service=files, attempt=attempt, exitCode=ended.code, how=ended.how(),
                     pid=pid, endpoint=endpoint)
        watching[0].set()
        watching[0] = exposure.watch(pid, "service", name, events)

    outcome = program.wait(restart=policy, on_restart=restarted)
    watching[0].set()
    published.unlink(missing_ok=True)
    if relayed:
        args.network_endpoint_file.unlink(missing_ok=True)
    status = end_status(outcome)
    given_up = exhausted(policy, outcome.code, program.stopping, outcome.restarts)
    record = {"schemaVersion": SCHEMA_VERSION, "service": files, "status": status, "exitCode": outcome.code,
              "how": outcome.how() + (f"; {given_up}" if given_up else ""), "startedAt": started,
              "endedAt": time.time(), "restarts": outcome.restarts}
    atomic_write_json(ended, record)
    append_event(events, "service-end", service=files, status=status, exitCode=outcome.code)
    problem = service_problem(files, record)
    if problem is None:
        log(f"{how.shown[0]} stopped cleanly")
        return 0
    report(AllocstackError("service-exit", problem))
    return outcome.code if outcome.code > 0 else DIAGNOSTICS["service-exit"][0]


if __name__ == "__main__":
    sys.exit(run(main))
