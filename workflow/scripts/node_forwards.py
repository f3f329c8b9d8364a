#!/usr/bin/env python3
"""Off the first node, in the stack's private network: each service of yours on its own port at this node's loopback.

Started by stack_network.py (the job node_network) inside the namespace it holds on its node::

    node_forwards.py --scratch SCRATCH --published STATE/RUN/services --forward NAME...

It prints ``ready`` at once; then, for each NAME, once the service is published for the other nodes
(``STATE/RUN/services/NAME.json``, written when it started on the first node), it listens on the service's own
port at the namespace's loopback (free there: the namespace is the stack's alone) and carries each connection
through the service's keyed TLS tunnel to the first node (allocstack/launch/tunnel.py), and says so in
``SCRATCH/forwards/NAME.HOST.json``, which the workers on this node wait for. So an address written as
``NAME:PORT`` (a config file, the hosts file's name at 127.0.0.1) works on every node as on the first. It runs
until SIGTERM.
"""

from __future__ import annotations

import signal
import sys
import threading
from pathlib import Path

from allocstack.common.cli import ENDING_SIGNALS, ArgumentParser, run
from allocstack.common.errors import EXIT_OK, AllocstackError
from allocstack.launch.tunnel import forward


def parse_args(argv: list[str] | None):
    parser = ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scratch", type=Path, required=True, help="the run's job-scoped scratch on this node")
    parser.add_argument("--published", type=Path, required=True,
                        help="the directory of your services as published for the other nodes (STATE/RUN/services)")
    parser.add_argument("--forward", action="append", default=[], metavar="NAME",
                        help="a service of yours to forward to on its own port (repeatable)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    stopped = threading.Event()
    for signum in ENDING_SIGNALS:
        signal.signal(signum, lambda *_: stopped.set())

    def one(name: str) -> None:
        try:
            local = forward(args.published, name, args.scratch)
        except (OSError, AllocstackError) as exc:
            print(f"node_forwards: cannot forward service {name} on this node: {exc}", file=sys.stderr, flush=True)
            return
        print(f"node_forwards: {name} on {local.url}", flush=True)

    for name in args.forward:
        threading.Thread(target=one, args=(name,), name=f"forward-{name}", daemon=True).start()
    print("ready", flush=True)
    stopped.wait()
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(run(main))
