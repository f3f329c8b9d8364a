#!/usr/bin/env python3
"""What the way between nodes costs a service of yours (issue 32, point 3): a Redis-like request loop and a bulk
transfer, straight to the server and through allocstack's keyed TLS tunnel, on this node's loopback.

    .venv/bin/python benchmarks/relay.py [--requests 5000] [--megabytes 256]

The tunnel is the one a worker off the first node uses to reach your service: its local end
(``LocalForward``: TLS pinned to the run's certificate, the run's key sent first) and the relay on the service's
node (``relay_to_loopback``: checks the key, then carries bytes to the service's loopback port). With the stack's
private network (``network.isolation: private``) a connection from another node also passes that node's pasta, and
on the first node the gateway and its socket into the namespace (port_sockets.py): the same relays again, carried
by one more hop each (docs/performance.md gives pasta's own cost). Here both ends of the tunnel run in this one
process (two threads, one interpreter lock), which a real run never does: an upper bound on its cost.
"""

from __future__ import annotations

import argparse
import logging
import os
import socket
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "workflow" / "scripts"))

from allocstack.common.tls import tls_context
from allocstack.launch.tunnel import LocalForward, relay_key, relay_to_loopback

CHUNK = 64 * 1024


def serve(listener: socket.socket) -> None:
    """A Redis-like server: ``PING`` -> ``+PONG``; ``BULK n`` -> n bytes; one thread a connection."""

    def one(conn: socket.socket) -> None:
        with conn, conn.makefile("rb") as lines:
            for line in lines:
                if line.startswith(b"PING"):
                    conn.sendall(b"+PONG\r\n")
                elif line.startswith(b"BULK"):
                    left = int(line.split()[1])
                    block = b"x" * CHUNK
                    while left > 0:
                        conn.sendall(block[:left])
                        left -= CHUNK

    while True:
        conn, _ = listener.accept()
        threading.Thread(target=one, args=(conn,), daemon=True).start()


def request_loop(port: int, requests: int) -> list[float]:
    """Each request's round trip (ms), one connection, one request at a time (as a Redis client's loop)."""
    times = []
    with socket.create_connection(("127.0.0.1", port)) as conn, conn.makefile("rb") as replies:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for _ in range(requests):
            began = time.perf_counter()
            conn.sendall(b"PING\r\n")
            replies.readline()
            times.append((time.perf_counter() - began) * 1000)
    return times


def bulk(port: int, megabytes: int) -> float:
    """MB/s of one transfer of ``megabytes``."""
    size = megabytes * 1024 * 1024
    with socket.create_connection(("127.0.0.1", port)) as conn:
        began = time.perf_counter()
        conn.sendall(f"BULK {size}\r\n".encode())
        got = 0
        while got < size:
            data = conn.recv(CHUNK)
            if not data:
                raise SystemExit("the transfer ended early")
            got += len(data)
        return megabytes / (time.perf_counter() - began)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=5000)
    parser.add_argument("--megabytes", type=int, default=256)
    args = parser.parse_args(argv)
    logging.getLogger("asyncio").setLevel(logging.CRITICAL)  # each closed connection's relay task, said at exit
    listener = socket.create_server(("127.0.0.1", 0))
    threading.Thread(target=serve, args=(listener,), daemon=True).start()
    server_port = listener.getsockname()[1]
    private = Path(tempfile.mkdtemp(prefix="allocstack-relay-bench-"))
    context, fingerprint = tls_context("127.0.0.1", "allocstack-bench", private)
    token = "bench-" + os.urandom(8).hex()
    relay_port = relay_to_loopback("127.0.0.1", context, server_port, relay_key(token))
    tunnel = LocalForward("127.0.0.1", relay_port, fingerprint, relay_key(token))
    paths = {"straight to the server": server_port, "through the keyed TLS tunnel": tunnel.port}
    print(f"{'path':32} {'requests':>8} {'median ms':>10} {'p99 ms':>8} {'bulk MB/s':>10}")
    for label, port in paths.items():
        request_loop(port, 200)  # warm-up
        times = sorted(request_loop(port, args.requests))
        rate = bulk(port, args.megabytes)
        print(f"{label:32} {args.requests:>8} {statistics.median(times):>10.3f} "
              f"{times[int(len(times) * 0.99) - 1]:>8.3f} {rate:>10.0f}", flush=True)
    os._exit(0)  # the tunnel's threads serve until the process ends, as in a worker


if __name__ == "__main__":
    sys.exit(main())
