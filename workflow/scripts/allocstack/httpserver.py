"""A small asyncio HTTP/1.1 server for JSON APIs on loopback.

Why not ``http.server``: it writes headers and body in separate sends, which with
a keep-alive client hits Nagle + delayed ACK (~40 ms a request), and its
thread-per-connection design needs locks around shared state. Here one event loop
owns all state; each response is ONE write; sockets have TCP_NODELAY.

Supported: Content-Length bodies, keep-alive, HTTP/1.0 and 1.1. Refused with a
clear status: oversized headers (431) or bodies (413), chunked bodies (411),
malformed request lines (400). Slow or idle connections are closed after
``idle_timeout``; the server itself keeps serving.
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any

MAX_HEADER_BYTES = 16 * 1024


@dataclass
class Request:
    method: str
    path: str
    query: str
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        """Decode the body; raises ValueError with a short reason when it is not JSON."""
        try:
            return json.loads(self.body.decode("utf-8")) if self.body else None
        except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
            raise ValueError(f"body is not valid JSON: {str(exc)[:200]}") from exc


@dataclass
class Response:
    status: int
    body: bytes = b""
    content_type: str = "application/json"
    headers: dict[str, str] = field(default_factory=dict)

    @classmethod
    def json(cls, status: int, document: Any) -> Response:
        return cls(status, json.dumps(document, separators=(",", ":")).encode("utf-8"))

    def encode(self, keep_alive: bool) -> bytes:
        reason = HTTPStatus(self.status).phrase
        lines = [
            f"HTTP/1.1 {self.status} {reason}",
            f"Content-Type: {self.content_type}",
            f"Content-Length: {len(self.body)}",
            "Cache-Control: no-store",
            f"Connection: {'keep-alive' if keep_alive else 'close'}",
        ]
        lines += [f"{name}: {value}" for name, value in self.headers.items()]
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + self.body


Handler = Callable[[Request], Awaitable[Response]]


def _error(status: int, message: str) -> Response:
    return Response.json(status, {"error": message})


class HttpServer:
    """Serve ``handler`` on ``host:port`` (port 0 = any free port)."""

    def __init__(
        self, handler: Handler, *, max_body_bytes: int = 1 << 20, idle_timeout: float = 60.0
    ) -> None:
        self.handler = handler
        self.max_body_bytes = max_body_bytes
        self.idle_timeout = idle_timeout
        self.server: asyncio.base_events.Server | None = None
        self.connections: set[asyncio.Task[None]] = set()
        self.requests = 0
        self.internal_errors = 0

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> int:
        self.server = await asyncio.start_server(self._serve, host, port, limit=MAX_HEADER_BYTES, backlog=512)
        return self.server.sockets[0].getsockname()[1]

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()
        for task in list(self.connections):
            task.cancel()
        if self.connections:
            await asyncio.gather(*self.connections, return_exceptions=True)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:  # always, inside a connection's handler
            self.connections.add(task)
        sock = writer.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            while True:
                request, early = await self._read_request(reader)
                if request is None and early is None:
                    break
                keep_alive = request is not None and self._keep_alive(request)
                response = early if request is None else await self._dispatch(request)
                writer.write(response.encode(keep_alive))
                await writer.drain()
                if not keep_alive:
                    break
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            self.connections.discard(task)
            writer.close()

    async def _dispatch(self, request: Request) -> Response:
        self.requests += 1
        try:
            return await self.handler(request)
        except ValueError as exc:
            return _error(400, str(exc))
        except Exception as exc:  # noqa: BLE001  (a bug must cost one request, never the server)
            self.internal_errors += 1
            print(f"http: internal error on {request.method} {request.path}: {type(exc).__name__}: {exc}", flush=True)
            return _error(500, "internal error")

    @staticmethod
    def _keep_alive(request: Request) -> bool:
        connection = request.headers.get("connection", "").lower()
        if request.headers.get(":version") == "HTTP/1.0":
            return connection == "keep-alive"
        return connection != "close"

    async def _read_request(self, reader: asyncio.StreamReader) -> tuple[Request | None, Response | None]:
        """Read one request. Returns (request, None), (None, error response) or (None, None) at EOF."""
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), self.idle_timeout)
        except asyncio.LimitOverrunError:
            return None, _error(431, "request headers too large")
        except (TimeoutError, asyncio.IncompleteReadError, ConnectionError):
            return None, None
        try:
            request_line, *header_lines = head[:-4].decode("latin-1").split("\r\n")
            method, target, version = request_line.split(" ")
        except ValueError:
            return None, _error(400, "malformed request line")
        if version not in ("HTTP/1.0", "HTTP/1.1"):
            return None, _error(400, "unsupported HTTP version")
        headers = {":version": version}
        for line in header_lines:
            name, sep, value = line.partition(":")
            if not sep or not name.strip():
                return None, _error(400, "malformed header line")
            headers[name.strip().lower()] = value.strip()
        if "chunked" in headers.get("transfer-encoding", "").lower():
            return None, _error(411, "chunked bodies are not supported; send Content-Length")
        try:
            length = int(headers.get("content-length", "0"))
        except ValueError:
            return None, _error(400, "malformed Content-Length")
        if length < 0:
            return None, _error(400, "malformed Content-Length")
        if length > self.max_body_bytes:
            return None, _error(413, f"body of {length} bytes exceeds {self.max_body_bytes}")
        try:
            body = await asyncio.wait_for(reader.readexactly(length), self.idle_timeout) if length else b""
        except (TimeoutError, asyncio.IncompleteReadError, ConnectionError):
            return None, None
        path, _, query = target.partition("?")
        return Request(method, path, query, headers, body), None
