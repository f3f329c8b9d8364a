#!/usr/bin/env python3
"""The published ports of a stack in its private network as owner-only Unix sockets (allocstack/launch/portsockets.py).

Started by stack_network.py inside the namespace it holds: ``port_sockets.py --scratch SCRATCH --publish NAME...``
makes ``SCRATCH/ports/NAME.sock`` for each NAME (``coordinator``: the built-in coordinator's status page; else a
service of yours), and with ``--inbound NAME=ADDRESS:PORT`` ``SCRATCH/ports/in-NAME.sock`` for each listener the other
nodes use; prints ``ready`` once they all exist, and carries each connection to NAME's loopback port (or to that
address and port) until SIGTERM. With ``--front PORT=REPLICA,...`` (a service whose replicas listen in namespaces of
their own) it listens on that port and carries each connection to the next replica in turn.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from allocstack.common.cli import ENDING_SIGNALS, ArgumentParser, run
from allocstack.common.errors import EXIT_OK
from allocstack.common.loopsignals import ending_quietly
from allocstack.launch import portsockets


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


def parse_args(argv: list[str] | None):
    parser = ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scratch", type=Path, required=True, help="the run's job-scoped scratch on this node")
    parser.add_argument("--publish", action="append", default=[], metavar="NAME", help="a published port (repeatable)")
    parser.add_argument("--inbound", action="append", default=[], type=inbound, metavar="NAME=ADDRESS:PORT",
                        help="a listener the other nodes use, at that address and port (repeatable)")
    parser.add_argument("--front", action="append", default=[], type=front, metavar="PORT=REPLICA,...",
                        help="a service whose replicas each listen in a namespace of their own: its port here, each "
                             "connection carried to the next replica in turn (repeatable)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)

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

    asyncio.run(ending_quietly(until_stopped(), ENDING_SIGNALS))
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(run(main))
