"""The HTTP server alone, in this process: the error path, admission, and its bounds."""

from __future__ import annotations

import asyncio
import ssl

from allocstack.common.tls import tls_context
from allocstack.coordinator.httpserver import ClientError, HttpServer, Limits, Request, Response

#: Tests talk TLS without checking the certificate: what is tested is the server behind it.
CLIENT_TLS = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
CLIENT_TLS.check_hostname = False
CLIENT_TLS.verify_mode = ssl.CERT_NONE


class Server:
    """An HttpServer on loopback for one test, with its log lines and the requests its handler saw."""

    def __init__(self, limits: Limits | None = None, admit=None) -> None:
        self.lines: list[str] = []
        self.seen: list[Request] = []
        self.http = HttpServer(self.handle, admit=admit, limits=limits or Limits(), log=self.lines.append)
        self.port = 0

    async def handle(self, request: Request) -> Response:
        self.seen.append(request)
        if request.path == "/bug":
            raise RuntimeError("a bug in a handler")
        if request.path == "/value":
            int("not a number")  # a ValueError from a bug: not the client's fault
        if request.path == "/client":
            raise ClientError("workerId is missing")
        if request.path == "/slow":
            await asyncio.sleep(0.3)
        return Response.json(200, {"path": request.path, "bytes": len(request.body)})

    async def __aenter__(self) -> Server:
        self.port = await self.http.start("127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc) -> None:
        await self.http.close()

    async def connect(self):
        return await asyncio.open_connection("127.0.0.1", self.port)


def request(path: str, body: bytes = b"", method: str = "POST", extra: str = "") -> bytes:
    return (f"{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n{extra}\r\n").encode() + body


async def answer(reader: asyncio.StreamReader) -> tuple[int, bytes, bytes]:
    """(status, head, body) of one response."""
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    length = int(next(line.split(b":")[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")))
    return int(head.split()[1]), head, await reader.readexactly(length)


async def closed(reader: asyncio.StreamReader, within: float = 2.0) -> bool:
    try:
        return await asyncio.wait_for(reader.read(1), within) == b""
    except (TimeoutError, ConnectionError):
        return False


def test_an_unexpected_exception_is_a_500_with_its_traceback_logged_and_the_connection_closed():
    async def scenario():
        async with Server() as server:
            for path in ("/bug", "/value"):
                reader, writer = await server.connect()
                writer.write(request(path))
                status, head, body = await answer(reader)
                assert status == 500 and b"connection: close" in head.lower() and body == b'{"error":"internal error"}'
                assert await closed(reader)
                writer.close()
            assert server.http.internal_errors == 2
            log = "\n".join(server.lines)
            assert "Traceback (most recent call last)" in log and "RuntimeError: a bug in a handler" in log
            assert "ValueError: invalid literal for int()" in log  # a ValueError is a bug, never a 400
            reader, writer = await server.connect()  # the server serves on
            writer.write(request("/ok", b"{}"))
            assert (await answer(reader))[0] == 200
            writer.close()

    asyncio.run(scenario())


def test_a_client_error_is_a_4xx_and_the_connection_stays_open():
    async def scenario():
        async with Server() as server:
            reader, writer = await server.connect()
            writer.write(request("/client"))
            status, _, body = await answer(reader)
            assert status == 400 and body == b'{"error":"workerId is missing"}'
            writer.write(request("/ok"))
            assert (await answer(reader))[0] == 200  # same connection
            writer.close()
            assert not server.lines

    asyncio.run(scenario())


def test_a_refused_head_is_answered_and_closed_before_its_body_is_read():
    refusal = Response(401, b'{"error":"no"}', close=True)

    async def scenario():
        async with Server(limits=Limits(max_body_bytes=64 << 20),
                          admit=lambda r: None if r.headers.get("authorization") == "ok" else refusal) as server:
            reader, writer = await server.connect()
            writer.write(b"POST /ok HTTP/1.1\r\nHost: x\r\nContent-Length: 33554432\r\n\r\n" + b"x" * 100)
            status, _, _ = await answer(reader)
            assert status == 401 and await closed(reader)
            assert server.seen == [] and server.http.buffered == 0
            writer.close()

    asyncio.run(scenario())


def test_the_connection_cap_answers_503_and_says_so_once():
    async def scenario():
        async with Server(limits=Limits(max_connections=2)) as server:
            held = [await server.connect() for _ in range(2)]
            await asyncio.sleep(0.05)
            for _ in range(3):
                reader, writer = await server.connect()
                status, head, _ = await answer(reader)
                assert status == 503 and b"Retry-After: 1" in head and await closed(reader)
                writer.close()
            assert server.http.refused_connections == 3
            assert len([line for line in server.lines if "connections open, the cap" in line]) == 1
            for _, writer in held:
                writer.close()
            await asyncio.sleep(0.05)
            reader, writer = await server.connect()  # a slot is free again
            writer.write(request("/ok"))
            assert (await answer(reader))[0] == 200
            writer.close()

    asyncio.run(scenario())


def test_the_buffered_bytes_budget_refuses_bodies_beyond_it():
    async def scenario():
        async with Server(limits=Limits(max_body_bytes=10_000, max_buffered_bytes=1_000)) as server:
            first_reader, first = await server.connect()
            first.write(b"POST /ok HTTP/1.1\r\nHost: x\r\nContent-Length: 800\r\n\r\n" + b"x" * 100)
            await asyncio.sleep(0.05)
            assert server.http.buffered == 800  # announced, reserved
            reader, writer = await server.connect()
            writer.write(b"POST /ok HTTP/1.1\r\nHost: x\r\nContent-Length: 800\r\n\r\n")
            status, head, body = await answer(reader)
            assert status == 503 and b"Retry-After: 1" in head and b"too many request bytes" in body
            writer.close()
            assert any("buffered request bytes would exceed 1000" in line for line in server.lines)
            first.write(b"x" * 700)
            status, _, body = await answer(first_reader)
            assert status == 200 and body == b'{"path":"/ok","bytes":800}'
            assert server.http.buffered == 0
            first.write(b"POST /ok HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                        b"3e8\r\n" + b"y" * 1000 + b"\r\n3e8\r\n" + b"y" * 1000 + b"\r\n0\r\n\r\n")
            status, _, _ = await answer(first_reader)
            assert status == 503 and await closed(first_reader)  # a chunked body is counted as it comes
            first.close()

    asyncio.run(scenario())


def test_idle_and_stalled_connections_are_closed_but_a_slow_handler_is_not_the_clients_fault():
    async def scenario():
        async with Server(limits=Limits(idle_timeout=0.2)) as server:
            idle_reader, idle = await server.connect()
            stalled_reader, stalled = await server.connect()
            stalled.write(b"POST /ok HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\nabc")
            assert await closed(idle_reader, 1.5) and await closed(stalled_reader, 1.5)
            reader, writer = await server.connect()
            writer.write(request("/slow"))  # 0.3 s in the handler, longer than the idle timeout
            assert (await answer(reader))[0] == 200
            writer.close()
            idle.close()
            stalled.close()

    asyncio.run(scenario())


def test_a_tls_listener_has_the_same_front_door_and_shares_the_bounds(tmp_path):
    """The coordinator's listener for the other nodes (more than one node) is this server with TLS: admission
    before the body holds there, and one connection cap covers both listeners."""
    server_tls, _ = tls_context("127.0.0.1", "test", tmp_path)
    refusal = Response(401, b'{"error":"no"}', close=True)

    async def scenario():
        async with Server(limits=Limits(max_body_bytes=64 << 20, max_connections=2),
                          admit=lambda r: None if r.headers.get("authorization") == "ok" else refusal) as server:
            port = await server.http.start("127.0.0.1", 0, ssl=server_tls)
            reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=CLIENT_TLS)
            writer.write(b"POST /ok HTTP/1.1\r\nHost: x\r\nContent-Length: 33554432\r\n\r\n" + b"x" * 100)
            assert (await answer(reader))[0] == 401 and await closed(reader)
            assert server.seen == [] and server.http.buffered == 0
            writer.close()
            held = [await server.connect(), await asyncio.open_connection("127.0.0.1", port, ssl=CLIENT_TLS)]
            await asyncio.sleep(0.05)
            reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=CLIENT_TLS)
            status, head, _ = await answer(reader)
            assert status == 503 and b"Retry-After: 1" in head  # one loopback + one TLS connection: the cap
            writer.close()
            for _, held_writer in held:
                held_writer.close()

    asyncio.run(scenario())


def test_a_tls_client_that_never_completes_its_handshake_is_dropped(tmp_path):
    server_tls, _ = tls_context("127.0.0.1", "test", tmp_path)

    async def scenario():
        async with Server(limits=Limits(idle_timeout=0.3)) as server:
            port = await server.http.start("127.0.0.1", 0, ssl=server_tls)
            reader, writer = await asyncio.open_connection("127.0.0.1", port)  # TCP only: no ClientHello
            assert await closed(reader, 3.0)
            writer.close()
            assert server.seen == [] and not server.http.connections

    asyncio.run(scenario())
