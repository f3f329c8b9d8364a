#!/usr/bin/env python3
"""The published ports of a stack in its private network as owner-only Unix sockets (allocstack/launch/portsockets.py).

Started by stack_network.py inside the namespace it holds: ``port_sockets.py --scratch SCRATCH --publish NAME...``
makes ``SCRATCH/ports/NAME.sock`` for each NAME (``coordinator``: the built-in coordinator's status page; else a
service of yours), and with ``--inbound NAME=ADDRESS:PORT`` ``SCRATCH/ports/in-NAME.sock`` for each listener the other
nodes use; prints ``ready`` once they all exist, and carries each connection to NAME's loopback port (or to that
address and port) until SIGTERM. With ``--front PORT=REPLICA,...`` (a service whose replicas listen in namespaces of
their own) it listens on that port and carries each connection to the next replica in turn; with ``--relay
NAME=FILE`` (more than one node) it also relays that front to the other nodes over TLS, published in FILE.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from allocstack.common import names
from allocstack.common.cli import ENDING_SIGNALS, ArgumentParser, run
from allocstack.common.endpoint import shared_token, write_endpoint
from allocstack.common.errors import EXIT_OK, AllocstackError, report
from allocstack.common.loopsignals import ending_quietly
from allocstack.common.scratch import make_private, private_level
from allocstack.launch import portsockets
from allocstack.launch.tunnel import relay_service


def inbound(text: str) -> tuple[str, tuple[str, int]]:
    """``NAME=ADDRESS:PORT`` as ``(NAME, (ADDRESS, PORT))``."""
    name, _, where = text.partition("=")
    address, _, port = where.rpartition(":")
    if not name or not address or not port.isdigit():
        raise ValueError(f"{text!r} is not NAME=ADDRESS:PORT")
    return name, (address, int(port))


def front(text: str) -> tuple[int, list[str]]:
    """``PORT=INSTANCE,...`` as ``(PORT, [INSTANCE, ...])``."""
    port, _, instances = text.partition("=")
    if not port.isdigit() or not instances:
        raise ValueError(f"{text!r} is not PORT=REPLICA,...")
    return int(port), instances.split(",")


def relayed(text: str) -> tuple[str, Path]:
    """``NAME=FILE`` as ``(NAME, FILE)``."""
    name, _, path = text.partition("=")
    if not name or not path:
        raise ValueError(f"{text!r} is not NAME=FILE")
    return name, Path(path)


def relay_front(scratch: Path, name: str, published: Path, where: tuple[str, int], port: int, plain: bool) -> None:
    """The other nodes' way to the front of ``name`` (its replicas, each in a network of its own): a TLS relay on
    ``where`` (the address and port the gateway carries in) to ``port`` here, for connections that open with the
    service's key, published in ``published`` for the other nodes, as a service's supervisor publishes its own
    (app_service.py ``relay_for_other_nodes``); the token is the one its replicas share.

    :raises AllocstackError: ``network`` when it cannot listen there.
    """
    services = scratch / names.SERVICES
    make_private(services)
    private_level(published.parent, "prerequisite")
    published.unlink(missing_ok=True)
    token = shared_token(services, name)
    url, fingerprint = relay_service("", where[0], plain, services, name, port, token, where[1])
    write_endpoint(published, url, token, "", tls=fingerprint is not None, fingerprint=fingerprint, service_port=port)
    # (stderr: its first line on stdout is "ready", which stack_network.py waits for)
    print(f"port_sockets: the front of {name} relayed to the other nodes on {url}", file=sys.stderr, flush=True)


def parse_args(argv: list[str] | None):
    parser = ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scratch", type=Path, required=True, help="the run's job-scoped scratch on this node")
    parser.add_argument("--publish", action="append", default=[], metavar="NAME", help="a published port (repeatable)")
    parser.add_argument("--inbound", action="append", default=[], type=inbound, metavar="NAME=ADDRESS:PORT",
                        help="a listener the other nodes use, at that address and port (repeatable)")
    parser.add_argument("--front", action="append", default=[], type=front, metavar="PORT=REPLICA,...",
                        help="a service whose replicas each listen in a namespace of their own: its port here, each "
                             "connection carried to the next replica in turn (repeatable)")
    parser.add_argument("--relay", action="append", default=[], type=relayed, metavar="NAME=FILE",
                        help="with more than one node: the front of service NAME (its --inbound listener and its "
                             "--front port) relayed to the other nodes over TLS, published in FILE (repeatable)")
    parser.add_argument("--no-tls", action="store_true", help="--relay in plain text (config network.tls: false)")
    args = parser.parse_args(argv)
    fronted, carried_in = {instances[0] for _, instances in args.front}, {name for name, _ in args.inbound}
    for name, _ in args.relay:
        if name not in fronted or name not in carried_in:
            parser.error(f"--relay {name}=FILE needs --front PORT={name},... and --inbound {name}=ADDRESS:PORT")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    fronts = {instances[0]: port for port, instances in args.front}
    try:
        for name, published in args.relay:
            relay_front(args.scratch, name, published, dict(args.inbound)[name], fronts[name], args.no_tls)
    except AllocstackError as error:
        return report(error)

    async def until_stopped() -> None:
        task = asyncio.ensure_future(portsockets.serve(args.scratch, args.publish,
                                                       lambda: print("ready", flush=True), dict(args.inbound),
                                                       dict(args.front)))
        loop = asyncio.get_running_loop()
        for signum in ENDING_SIGNALS:
            loop.add_signal_handler(signum, task.cancel)
        try:
            await task
        except asyncio.CancelledError:
            pass

    try:
        asyncio.run(ending_quietly(until_stopped(), ENDING_SIGNALS))
    finally:
        for _, published in args.relay:
            published.unlink(missing_ok=True)
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(run(main))
