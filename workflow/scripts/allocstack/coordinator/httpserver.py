"""An asyncio HTTP/1.1 server for JSON APIs on loopback, parsing with h11.

The wire format is h11's (the state machine under httpx and uvicorn): what it
refuses is answered with the status RFC 9112 asks for and the connection is
closed; no request is parsed twice or half. On top of h11 this module adds
what a coordinator on a shared node needs:

* **Admission before the body.** ``admit`` sees each request's head (method,
  path, headers) before any body byte is read; a refusal (401) is answered
  and the connection closed, so a stranger's body never reaches memory.
* **Bounds.** Headers above ``max_header_bytes`` -> 431; a body above
  ``max_body_bytes`` -> 413; more than ``max_connections`` at once, or bodies
  that would take the buffered request bytes of all connections above
  ``max_buffered_bytes`` -> 503 with ``Retry-After`` (and one log line while it
  lasts). A connection that sends nothing (or reads nothing) for
  ``idle_timeout`` seconds is closed.
* **Strictness h11 leaves to us.** Obsolete line folding -> 400 (RFC 9112
  5.2); Content-Length together with Transfer-Encoding -> 400 (6.1); chunked
  not the final transfer coding -> 400 (6.3), another coding -> 501 (6.1);
  an HTTP version other than 1.0/1.1 -> 505. ``Expect: 100-continue`` is
  answered with 100 once the head is admitted.
* **An honest error path.** A handler raises :class:`ClientError` for what
  the client got wrong (4xx) or :class:`HttpError` for an expected failure of
  its own (507: no room to store); the connection stays open. A handler that
  has no answer to give (a relay whose coordinator went away) raises
  :class:`ConnectionError`: the connection is closed unanswered, which the
  client takes for the connection error it is and retries. Anything else is
  a bug: 500, its traceback on stderr (the component's log), the connection
  closed; the server keeps serving.

Speed: each response is ONE write and sockets have TCP_NODELAY (a keep-alive
client otherwise hits Nagle + delayed ACK, ~40 ms a request); timeouts are a
deadline per connection checked by one sweeper task, not a timer per read.
``start(host, port, ssl=...)`` takes an SSL context: the coordinator's listener for the other
nodes (more than one node) is TLS; every bound above holds there too (h11 is sans-IO: it
parses what the TLS transport decrypted).
"""

from __future__ import annotations

import asyncio
import functools
import json
import math
import re
import socket
import ssl as ssl_module
import sys
import time
import traceback
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from http import HTTPStatus
from typing import Any
from urllib.parse import urlsplit

import h11

from ..common.jsonio import loads_bytes

READ_CHUNK = 64 * 1024
#: The end of a request head (h11 accepts bare LF line ends, RFC 9112 2.2).
_HEAD_END = re.compile(rb"\n\r?\n")
#: A field line continued on the next line (obs-fold).
_OBS_FOLD = re.compile(rb"\n[ \t]")
_TRANSFER_ENCODING = re.compile(rb"(?im)^transfer-encoding[ \t]*:(.*?)\r?$")


class HttpError(Exception):
    """An expected failure a handler answers with ``status`` and ``{"error": message}``; the connection stays."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class ClientError(HttpError):
    """What the client got wrong (400 unless said otherwise); never a blanket ValueError."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(status, message)


@dataclass(slots=True)
class Request:
    method: str
    path: str
    query: str
    headers: dict[str, str]
    body: bytes = b""

    def json(self) -> Any:
        """Decode the body.

        :raises ClientError: 400 when it is not UTF-8 JSON (or nests too deep, or has a huge integer).
        """
        try:
            return loads_bytes(self.body) if self.body else None
        except (ValueError, RecursionError) as exc:  # JSONDecodeError, UnicodeDecodeError, int digit limit
            raise ClientError(f"body is not valid JSON: {str(exc)[:200]}") from exc


#: Compact JSON text of a document (a response body's encoder).
encode_json = json.JSONEncoder(separators=(",", ":")).encode


@dataclass(slots=True)
class Response:
    status: int
    body: bytes = b""
    content_type: str = "application/json"
    headers: dict[str, str] = field(default_factory=dict)
    #: Close the connection after this response.
    close: bool = False

    @classmethod
    def json(cls, status: int, document: Any, **extra: Any) -> Response:
        return cls(status, encode_json(document).encode("utf-8"), **extra)

    @classmethod
    def error(cls, status: int, message: str, **extra: Any) -> Response:
        return cls.json(status, {"error": message}, **extra)


Handler = Callable[[Request], Awaitable[Response]]
#: Sees a request's head (``body`` still empty); a Response refuses it and closes the connection.
Admit = Callable[[Request], "Response | None"]


@dataclass(frozen=True)
class Limits:
    max_body_bytes: int = 1 << 20
    idle_timeout: float = 60.0
    max_connections: int = 512
    max_buffered_bytes: int = 256 << 20
    max_header_bytes: int = 16 * 1024


@functools.lru_cache(maxsize=1024)
def _response_event(status: int, content_type: str, length: int, close: bool,
                    extra: tuple[tuple[str, str], ...]) -> h11.Response:
    """The head of a response (h11 events are immutable: the common ones are built and checked once)."""
    headers = [(b"content-type", content_type.encode("latin-1")), (b"content-length", str(length).encode("ascii")),
               (b"cache-control", b"no-store")]
    headers += [(name.encode("latin-1"), value.encode("latin-1")) for name, value in extra]
    if close:
        headers.append((b"connection", b"close"))
    return h11.Response(status_code=status, headers=headers, reason=HTTPStatus(status).phrase.encode("ascii"))


def _log_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


class _Refused(Exception):
    """Answer ``response`` and close the connection (raised while reading a request)."""

    def __init__(self, response: Response) -> None:
        super().__init__(response.status)
        self.response = response


@dataclass(slots=True)
class _Connection:
    writer: asyncio.StreamWriter
    #: loop.time() after which the sweeper closes the connection (inf while a handler runs).
    deadline: float = math.inf
    #: Bytes of the budget this connection's current request holds.
    reserved: int = 0


_TOO_MANY = b'{"error":"too many connections; retry"}'
#: Written as it is to a connection over the cap (no request is read from it).
_CONNECTION_REFUSED = (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
                       b"Content-Length: %d\r\nRetry-After: 1\r\nConnection: close\r\n\r\n%s"
                       % (len(_TOO_MANY), _TOO_MANY))


class HttpServer:
    """Serve ``handler`` on ``host:port`` (port 0 = any free port); see the module docstring."""

    def __init__(self, handler: Handler, *, admit: Admit | None = None, limits: Limits = Limits(),
                 log: Callable[[str], None] = _log_stderr) -> None:
        self.handler = handler
        self.admit = admit
        self.limits = limits
        self.log = log
        self.servers: list[asyncio.base_events.Server] = []
        self.connections: dict[asyncio.Task[None], _Connection] = {}
        self.requests = 0
        self.internal_errors = 0
        self.buffered = 0
        self.refused_connections = 0
        self.refused_bodies = 0
        self._last_warning: dict[str, float] = {}
        self._sweeper: asyncio.Task[None] | None = None

    async def start(self, host: str = "127.0.0.1", port: int = 0,
                    ssl: ssl_module.SSLContext | None = None) -> int:
        """Listen on ``host:port`` (with TLS when ``ssl`` is given); return the bound port.

        Callable more than once (the coordinator listens on loopback and, with more than one
        node, on the network address with TLS): every listener shares the one set of bounds.
        A TLS handshake not done within ``idle_timeout`` is abandoned (before any request).
        """
        server = await asyncio.start_server(self._serve, host, port, limit=READ_CHUNK, backlog=512, ssl=ssl,
                                            ssl_handshake_timeout=self.limits.idle_timeout if ssl else None)
        self.servers.append(server)
        if self._sweeper is None:
            self._sweeper = asyncio.get_running_loop().create_task(self._sweep())
        return server.sockets[0].getsockname()[1]

    async def close(self) -> None:
        for server in self.servers:
            server.close()
        if self._sweeper is not None:
            self._sweeper.cancel()
        for task in list(self.connections):
            task.cancel()
        if self.connections:
            await asyncio.gather(*self.connections, return_exceptions=True)

    # -- bounds --------------------------------------------------------------
    def _warn(self, what: str, line: str) -> None:
        """Log ``line`` when a bound is hit, at most once every 10 s per bound."""
        now = time.monotonic()
        if now - self._last_warning.get(what, -math.inf) >= 10.0:
            self._last_warning[what] = now
            self.log(line)

    async def _sweep(self) -> None:
        """Close connections past their deadline (idle, or too slow to send or read)."""
        loop = asyncio.get_running_loop()
        period = min(1.0, self.limits.idle_timeout / 4)
        while True:
            await asyncio.sleep(period)
            now = loop.time()
            for state in list(self.connections.values()):
                if state.deadline < now:
                    state.writer.transport.abort()

    def _reserve(self, state: _Connection, size: int) -> None:
        """Count ``size`` more buffered request bytes against the budget, or refuse with 503."""
        if self.buffered + size > self.limits.max_buffered_bytes:
            self.refused_bodies += 1
            self._warn("buffered", f"http: buffered request bytes would exceed {self.limits.max_buffered_bytes} "
                                   f"({self.buffered} held): refusing a body with 503 "
                                   f"({self.refused_bodies} refused so far)")
            raise _Refused(Response.error(503, "the server holds too many request bytes; retry",
                                          headers={"Retry-After": "1"}, close=True))
        self.buffered += size
        state.reserved += size

    def _release(self, state: _Connection) -> None:
        self.buffered -= state.reserved
        state.reserved = 0

    # -- one connection ------------------------------------------------------
    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if len(self.connections) >= self.limits.max_connections:
            self.refused_connections += 1
            self._warn("connections", f"http: {len(self.connections)} connections open, the cap: refusing new "
                                      f"ones with 503 ({self.refused_connections} refused so far)")
            writer.write(_CONNECTION_REFUSED)
            writer.close()
            return
        task = asyncio.current_task()
        if task is None:  # never: a connection is served by its own task
            return
        state = self.connections[task] = _Connection(writer)
        sock = writer.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn = h11.Connection(h11.SERVER, max_incomplete_event_size=self.limits.max_header_bytes)
        try:
            while await self._exchange(conn, reader, writer, state):
                conn.start_next_cycle()
        except (ConnectionError, asyncio.CancelledError):
            pass
        except Exception:  # noqa: BLE001  (a bug in this module must cost one connection, never the server)
            self.internal_errors += 1
            self.log(f"http: internal error, connection closed:\n{traceback.format_exc().rstrip()}")
        finally:
            self._release(state)
            del self.connections[task]
            writer.close()

    async def _exchange(self, conn: h11.Connection, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                        state: _Connection) -> bool:
        """Read one request, answer it; True when the connection stays open for the next."""
        loop = asyncio.get_running_loop()
        state.deadline = loop.time() + self.limits.idle_timeout
        leftover, closed = conn.trailing_data
        raw: list[bytes] = [leftover] if leftover else []
        head_only = False  # a HEAD request: its answer has no body
        try:
            if not raw and not closed:  # nothing buffered: h11 could only say NEED_DATA
                raw.append(await reader.read(READ_CHUNK))
                conn.receive_data(raw[0])
            event = await self._next_event(conn, reader, raw)
            if type(event) is h11.ConnectionClosed:
                return False
            head_only = event.method == b"HEAD"
            request = self._head(event, raw)
            if self.admit is not None:
                refusal = self.admit(request)
                if refusal is not None:
                    raise _Refused(refusal if refusal.close else replace(refusal, close=True))
            state.deadline = loop.time() + self.limits.idle_timeout
            request.body = await self._body(conn, reader, writer, state, request)
        except h11.RemoteProtocolError as exc:
            if conn.trailing_data[1]:
                return False  # the client went away mid-request: nobody to answer
            await self._send(conn, writer, state, self._protocol_error(exc, raw), head_only)
            return False
        except _Refused as refused:
            await self._send(conn, writer, state, refused.response, head_only)
            return False
        state.deadline = math.inf  # the handler may wait for a journal fsync: that is not the client's delay
        raw.clear()  # the bytes as read need not wait with it (the request holds its body)
        response = await self._dispatch(request)
        self._release(state)
        await self._send(conn, writer, state, response, head_only)
        return conn.our_state is h11.DONE and conn.their_state is h11.DONE

    async def _next_event(self, conn: h11.Connection, reader: asyncio.StreamReader, raw: list[bytes] | None) -> Any:
        while True:
            event = conn.next_event()
            if event is not h11.NEED_DATA:
                return event
            data = await reader.read(READ_CHUNK)
            if raw is not None:
                raw.append(data)
            conn.receive_data(data)

    def _head(self, event: h11.Request, raw: list[bytes]) -> Request:
        """The request's head as a :class:`Request`; raises _Refused for what h11 lets through."""
        head = raw[0] if len(raw) == 1 else b"".join(raw)
        end = _HEAD_END.search(head)
        if (end.end() if end is not None else len(head)) > self.limits.max_header_bytes:
            # h11 bounds only a head still incomplete; one that arrived whole is measured here
            raise _Refused(Response.error(431, "request headers too large", close=True))
        if end is not None and _OBS_FOLD.search(head, 0, end.start() + 1):
            raise _Refused(Response.error(400, "obsolete line folding is not accepted (RFC 9112 5.2)", close=True))
        if event.http_version not in (b"1.1", b"1.0"):
            raise _Refused(Response.error(505, f"HTTP/{event.http_version.decode()} is not supported", close=True))
        headers: dict[str, str] = {}
        for name, value in event.headers:
            key = name.decode("ascii")
            text = value.decode("latin-1")
            headers[key] = f"{headers[key]}, {text}" if key in headers else text
        if "transfer-encoding" in headers and "content-length" in headers:
            raise _Refused(Response.error(400, "Content-Length and Transfer-Encoding together (RFC 9112 6.1)",
                                          close=True))
        target = event.target.decode("ascii")
        if not target.startswith("/"):  # absolute-form (RFC 9112 3.2.2)
            parts = urlsplit(target)
            target = f"{parts.path}?{parts.query}" if parts.query else parts.path or target
        path, _, query = target.partition("?")
        return Request(event.method.decode("ascii"), path, query, headers)

    async def _body(self, conn: h11.Connection, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                    state: _Connection, request: Request) -> bytes:
        """Read the admitted request's body within the bounds (after a 100 Continue if it waits for one)."""
        # h11 checked the framing: a Transfer-Encoding is "chunked", a Content-Length is digits.
        announced = None if "transfer-encoding" in request.headers else int(request.headers.get("content-length", 0))
        limit = self.limits.max_body_bytes
        if announced is not None:
            if announced > limit:
                raise _Refused(Response.error(413, f"body of {announced} bytes exceeds {limit}", close=True))
            self._reserve(state, announced)
        if conn.they_are_waiting_for_100_continue:
            writer.write(conn.send(h11.InformationalResponse(status_code=100, headers=[], reason=b"Continue")))
        chunks: list[bytes] = []
        size = 0
        while True:
            event = await self._next_event(conn, reader, None)
            if type(event) is h11.Data:
                size += len(event.data)
                if size > limit:
                    raise _Refused(Response.error(413, f"body exceeds {limit} bytes", close=True))
                if announced is None:  # chunked: counted as it comes
                    self._reserve(state, len(event.data))
                chunks.append(event.data)
            elif type(event) is h11.EndOfMessage:
                return chunks[0] if len(chunks) == 1 else b"".join(chunks)
            else:  # ConnectionClosed mid-body
                raise ConnectionResetError("connection closed mid-body")

    def _protocol_error(self, exc: h11.RemoteProtocolError, raw: list[bytes]) -> Response:
        status = exc.error_status_hint
        message = str(exc)
        if status == 501:  # h11 refuses every Transfer-Encoding but "chunked": tell 400 from 501 (RFC 9112 6.1, 6.3)
            head = b"".join(raw)
            values = b",".join(_TRANSFER_ENCODING.findall(head))
            codings = [coding.strip().lower() for coding in values.split(b",") if coding.strip()]
            if codings and codings[-1] != b"chunked":
                status, message = 400, "chunked must be the final transfer coding (RFC 9112 6.3)"
            else:
                message = f"transfer coding {b', '.join(codings).decode('latin-1')!r} is not implemented"
        return Response.error(status, message[:200], close=True)

    async def _dispatch(self, request: Request) -> Response:
        self.requests += 1
        try:
            return await self.handler(request)
        except HttpError as exc:
            return Response.error(exc.status, exc.message)
        except ConnectionError:  # no answer to give: the connection is closed unanswered (see above)
            raise
        except Exception:  # noqa: BLE001  (a bug must cost one request, never the server: 500, traceback logged)
            self.internal_errors += 1
            self.log(f"http: internal error on {request.method} {request.path}; connection closed:\n"
                     f"{traceback.format_exc().rstrip()}")
            return Response.error(500, "internal error", close=True)

    async def _send(self, conn: h11.Connection, writer: asyncio.StreamWriter, state: _Connection,
                    response: Response, head_only: bool = False) -> None:
        """Write ``response`` in one write (its headers only for HEAD); with ``close`` the caller closes."""
        if conn.our_state not in (h11.IDLE, h11.SEND_RESPONSE):
            return
        event = _response_event(response.status, response.content_type, len(response.body), response.close,
                                tuple(response.headers.items()))
        data = conn.send(event)
        if response.body and not head_only:
            data += conn.send(h11.Data(data=response.body))
        data += conn.send(h11.EndOfMessage())
        writer.write(data)
        if writer.transport.get_write_buffer_size():
            state.deadline = asyncio.get_running_loop().time() + self.limits.idle_timeout
            await writer.drain()
