#!/usr/bin/env python3
"""What the front of a service's replicas costs (issue 25 point 4b): requests straight to one program and through
the front to three replicas, on this node's loopback; prints a table.

    .venv/bin/python benchmarks/front.py [--connections 2000] [--requests 5000] [--replicas 3]

The front (allocstack/launch/portsockets.py ``serve_front``, in port_sockets.py in the stack's network) takes each
connection to the next replica in turn, through that replica's carrier (``serve_carrier``, in the replica's
supervisor, in the replica's network), which connects to the program and answers one byte before it relays. Two
shapes of client: a new connection for each request (an HTTP/1.0 client, a health probe: the front's whole cost, its
Unix connection and that byte, paid each time) and one connection for many requests (a Redis or keep-alive HTTP
client: the relays' cost alone). Here the replicas share one network, each on a port of its own, and the front
and carriers run in one process of their own, the programs in another, the client in this one: in a run each
replica is in a network of its own on the same port, which costs nothing more per byte (a namespace changes no
path of a loopback packet).
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import socket
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "workflow" / "scripts"))

from allocstack.launch import portsockets


def programs(count: int, ports: multiprocessing.SimpleQueue) -> None:
    """``count`` programs, each on a free loopback port: ``PING`` -> ``+PONG``, a thread a connection."""

    def one(conn: socket.socket) -> None:
        with conn, conn.makefile("rb") as lines:
            for line in lines:
                conn.sendall(b"+PONG\r\n" if line.startswith(b"PING") else b"-ERR\r\n")

    def serve(listener: socket.socket) -> None:
        while True:
            conn, _ = listener.accept()
            threading.Thread(target=one, args=(conn,), daemon=True).start()

    listeners = []
    for _ in range(count):
        listener = socket.create_server(("127.0.0.1", 0), backlog=512)
        listeners.append(listener)
        threading.Thread(target=serve, args=(listener,), daemon=True).start()
    ports.put([listener.getsockname()[1] for listener in listeners])
    threading.Event().wait()


def front(scratch: str, program_ports: list[int], ports: multiprocessing.SimpleQueue) -> None:
    """The carriers of the replicas and their front, in one event loop (as port_sockets.py runs the front)."""
    instances = ["web", *(f"web-replica-{k}" for k in range(2, len(program_ports) + 1))]

    async def serve() -> None:
        for instance, port in zip(instances, program_ports, strict=True):
            await portsockets.serve_carrier(Path(scratch), instance, port)
        server = await portsockets.serve_front(Path(scratch), 0, instances)
        ports.put(server.sockets[0].getsockname()[1])
        await asyncio.Event().wait()

    asyncio.run(serve())


def new_connections(port: int, count: int) -> list[float]:
    """Each request's time (ms) with a connection of its own: connect, PING, +PONG, close."""
    times = []
    for _ in range(count):
        started = time.perf_counter()
        with socket.create_connection(("127.0.0.1", port)) as conn:
            conn.sendall(b"PING\r\n")
            if conn.recv(64) != b"+PONG\r\n":
                raise SystemExit("front: a wrong answer")
        times.append((time.perf_counter() - started) * 1000)
    return times


def one_connection(port: int, count: int) -> list[float]:
    """Each request's round trip (ms) on one connection."""
    times = []
    with socket.create_connection(("127.0.0.1", port)) as conn, conn.makefile("rb") as replies:
        for _ in range(count):
            started = time.perf_counter()
            conn.sendall(b"PING\r\n")
            if replies.readline() != b"+PONG\r\n":
                raise SystemExit("front: a wrong answer")
            times.append((time.perf_counter() - started) * 1000)
    return times


def row(what: str, times: list[float]) -> str:
    ordered = sorted(times)
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    return (f"| {what} | {len(times):,} | {statistics.median(times):.3f} | {p99:.3f} | "
            f"{len(times) / (sum(times) / 1000):,.0f} |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--connections", type=int, default=2000, help="requests with a connection each (a shape)")
    parser.add_argument("--requests", type=int, default=5000, help="requests on one connection (the other shape)")
    parser.add_argument("--replicas", type=int, default=3)
    args = parser.parse_args(argv)
    context = multiprocessing.get_context("fork")
    queue = context.SimpleQueue()
    with tempfile.TemporaryDirectory(prefix="allocstack-front-") as scratch:
        workers = [context.Process(target=programs, args=(args.replicas, queue), daemon=True)]
        workers[0].start()
        program_ports = queue.get()
        workers.append(context.Process(target=front, args=(scratch, program_ports, queue), daemon=True))
        workers[1].start()
        front_port = queue.get()
        try:
            new_connections(front_port, 50)  # warm both ways up
            new_connections(program_ports[0], 50)
            print(f"front.py: {args.replicas} replicas; ms per request (median, p99) and requests per second, one "
                  "client at a time")
            print("| way | requests | median ms | p99 ms | requests/s |")
            print("|---|---|---|---|---|")
            print(row("a connection each, straight to one program", new_connections(program_ports[0], args.connections)))
            print(row(f"a connection each, through the front to {args.replicas}",
                      new_connections(front_port, args.connections)))
            print(row("one connection, straight to one program", one_connection(program_ports[0], args.requests)))
            print(row("one connection, through the front", one_connection(front_port, args.requests)))
        finally:
            for worker in workers:
                worker.terminate()
                worker.join(5)
    return 0


if __name__ == "__main__":
    sys.exit(main())
