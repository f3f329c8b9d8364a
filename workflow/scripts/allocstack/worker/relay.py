"""A job step's few connections to the coordinator, shared by its workers: the relay.

A job step of several workers (``worker_block.py``) runs this in its own process, on its node.
Each worker speaks the coordinator's protocol as ever, to the relay on the node's loopback
(its endpoint document, 0600 in the run's private scratch, names the relay's port and the
run's token); the relay keeps :data:`allocstack.plan.connections.PER_STEP` connections to the
coordinator (pinned TLS off the first node), so the coordinator holds a few connections per
step however many workers it runs, and a node's TLS handshakes are a few, not one a worker.

* **A batch per round trip.** Each connection carries one request at a time. What the
  workers asked while it was busy goes out as ONE ``POST /batch`` (at most
  :data:`MAX_BATCH` requests, :data:`MAX_BATCH_BYTES` bytes), each answered as if it had come
  alone; a lone request goes as it is. So under load the coordinator pays its per-request
  cost (HTTP, the event loop, a journal fsync) once for many workers, and an idle step adds
  no wait.
* **The same front door.** The local listener is the coordinator's own HTTP server
  (:class:`allocstack.coordinator.httpserver.HttpServer`): the token is checked before any body
  byte (a stranger on the node gets 401 and reaches nothing), connections are capped at two a
  worker (its claims and its heartbeats) and a margin, bodies and buffered bytes bounded,
  idle connections closed; 503 only for strangers and overload.
* **Nothing hidden.** A request whose body is not JSON goes alone, so the coordinator's 400
  reaches that worker only. When the coordinator cannot be reached (or a connection breaks
  mid-request), the workers' connections are closed unanswered: each worker sees the
  connection error it would have seen talking to the coordinator itself, and retries within
  its ``--connect-timeout``.
"""

from __future__ import annotations

import asyncio
import hmac
import socket
import ssl
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

import h11

from ..common.endpoint import Endpoint
from ..common.jsonio import dumps_compact, loads_bytes, msgspec
from ..common.tls import client_context
from ..coordinator.api import BATCHED
from ..coordinator.httpserver import HttpServer, Limits, Request, Response
from .httpclient import READ_CHUNK, Answer, AnswerReader, Stale

#: Requests one /batch carries at most.
MAX_BATCH = 32
#: Body bytes one /batch carries at most (a request larger than that goes alone).
MAX_BATCH_BYTES = 8 << 20
#: Local connections the relay takes beyond two per worker (the status command, a reconnect, a stranger's few).
LOCAL_MARGIN = 64
#: The largest body a worker may send (the coordinator's own bound, ``--max-body-bytes``).
MAX_BODY_BYTES = 32 << 20
#: Seconds a local connection may stay idle (the coordinator's ``--connection-timeout``).
IDLE_SECONDS = 120.0
_JSON = (b"content-type", b"application/json")
UNAUTHORIZED = Response(401, b'{"error":"missing or wrong bearer token"}', headers={"WWW-Authenticate": "Bearer"},
                        close=True)


@dataclass(slots=True)
class Pending:
    """A worker's request waiting for its turn, and where its answer goes."""

    request: Request
    answer: asyncio.Future[Response]
    batchable: bool

    @property
    def size(self) -> int:
        return len(self.request.body)


def batchable(request: Request) -> bool:
    """Whether ``request`` may ride in a /batch: a worker's POST whose body is JSON (anything else goes alone)."""
    if request.method != "POST" or request.path not in BATCHED or request.query:
        return False
    try:
        loads_bytes(request.body)
    except (ValueError, RecursionError):
        return False
    return True


def batch_body(parts: list[Pending]) -> bytes:
    """The /batch body of ``parts`` (their bodies as the workers sent them, checked to be JSON)."""
    return b'{"requests":[' + b",".join(b'{"path":%s,"body":%s}' % (dumps_compact(part.request.path), part.request.body)
                                        for part in parts) + b"]}"


def answer_of(answer: Answer) -> Response:
    """The coordinator's answer as the relay gives it to the worker (its status, body, type and Retry-After)."""
    headers = {name: answer.header(name.lower().encode("latin-1")) or "" for name in ("Retry-After", "WWW-Authenticate")}
    return Response(answer.status, answer.body, content_type=answer.header(b"content-type") or "application/json",
                    headers={name: value for name, value in headers.items() if value})


if msgspec is not None:
    class _Part(msgspec.Struct, gc=False):
        status: int
        body: msgspec.Raw

    class _Parts(msgspec.Struct, gc=False):
        responses: list[_Part]

    _PARTS = msgspec.json.Decoder(_Parts)
else:
    _PARTS = None


def split_answers(answer: Answer, count: int) -> list[Response]:
    """A /batch answer's responses, in order.

    :raises ConnectionError: when the coordinator did not answer the batch as a batch (it is then not known what
        each worker's request did: each worker retries).
    """
    if answer.status == 503:  # overload: each worker backs off as the coordinator asks
        return [answer_of(answer)] * count
    if answer.status != 200:
        raise ConnectionResetError(f"the coordinator answered the batch {answer.status}")
    try:
        if _PARTS is not None:  # each body as the coordinator wrote it, not decoded
            parts = [(part.status, bytes(part.body)) for part in _PARTS.decode(answer.body).responses]
        else:
            parts = [(int(part["status"]), dumps_compact(part["body"])) for part in loads_bytes(answer.body)["responses"]]
        if len(parts) != count:
            raise ValueError(f"{len(parts)} answers to {count} requests")
    except (ValueError, KeyError, TypeError, RecursionError) as exc:  # msgspec's errors are ValueErrors
        raise ConnectionResetError(f"the coordinator's answer to a batch is not one: {exc}") from exc
    return [Response(status, body) for status, body in parts]


class Upstream:
    """One keep-alive connection to the coordinator, opened when first needed: h11 over asyncio streams, pinned
    TLS where the endpoint has a fingerprint (as :class:`~allocstack.worker.httpclient.HttpConnection`, whose
    rules it follows: no proxy, the certificate compared before a byte is sent, a reused connection that fails
    before any answer byte tried once more on a fresh one).

    :raises ConnectionError: from :meth:`request` when no answer came (within ``timeout`` for each step).
    """

    def __init__(self, endpoint: Endpoint, timeout: float) -> None:
        parts = urlsplit(endpoint.url)
        if parts.scheme not in ("http", "https") or not parts.hostname or parts.port is None:
            raise ValueError(f"{endpoint.url!r} must look like http(s)://HOST:PORT")
        self.url, self.host, self.port = endpoint.url, parts.hostname, parts.port
        self.fingerprint = endpoint.fingerprint if parts.scheme == "https" else None
        self.context = client_context() if parts.scheme == "https" else None
        self.timeout = timeout
        self.headers = [(b"host", parts.netloc.encode("ascii")),
                        (b"authorization", f"Bearer {endpoint.token}".encode("latin-1"))]
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None
        self.conn: h11.Connection | None = None

    def close(self) -> None:
        if self.writer is not None:
            self.writer.transport.abort()
        self.reader = self.writer = self.conn = None

    async def _open(self) -> None:
        if self.context is not None and not self.fingerprint:
            raise ConnectionRefusedError(f"https to {self.url} needs the run's certificate fingerprint to pin")
        if self.context is not None and self.fingerprint:
            from ..launch.tunnel import pinned_connection

            self.reader, self.writer = await pinned_connection(self.host, self.port, self.fingerprint, self.context)
        else:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port, limit=READ_CHUNK)
        sock = self.writer.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.conn = h11.Connection(h11.CLIENT)

    async def request(self, method: bytes, target: bytes, body: bytes) -> Answer:
        """Send one request and read its whole answer."""
        if self.reader is not None and self.reader.at_eof():
            self.close()  # the coordinator closed it meanwhile (its idle timeout)
        reused = self.writer is not None
        try:
            try:
                if self.writer is None:
                    await asyncio.wait_for(self._open(), self.timeout)
                return await asyncio.wait_for(self._exchange(method, target, body, reused), self.timeout)
            except Stale:
                self.close()
                await asyncio.wait_for(self._open(), self.timeout)
                return await asyncio.wait_for(self._exchange(method, target, body, False), self.timeout)
        except (OSError, ssl.SSLError, h11.ProtocolError, Stale) as exc:  # TimeoutError is an OSError
            self.close()
            raise ConnectionResetError(f"{self.url}: {type(exc).__name__}: {exc}") from exc

    async def _exchange(self, method: bytes, target: bytes, body: bytes, reused: bool) -> Answer:
        conn, reader, writer = self.conn, self.reader, self.writer
        if conn is None or reader is None or writer is None:
            raise ConnectionResetError("not connected")
        fields = [*self.headers, (b"content-length", str(len(body)).encode("ascii"))]
        if body:
            fields.append(_JSON)
        data = conn.send(h11.Request(method=method, target=target, headers=fields))
        if body:
            data += conn.send(h11.Data(data=body))
        writer.write(data + conn.send(h11.EndOfMessage()))
        incoming = AnswerReader(conn, self.url, reused, closed=ConnectionResetError)
        try:
            while not incoming.complete():
                incoming.feed(await reader.read(READ_CHUNK))
        except ConnectionError:
            if reused and not incoming.received:
                raise Stale from None
            raise
        if not incoming.keep_alive():  # Connection: close
            self.close()
        return incoming.answer()


class Relay:
    """The relay of ``workers`` workers to the coordinator at ``endpoint`` over ``connections`` connections.

    :param timeout: bound on connecting to the coordinator and on each answer (the workers' ``--connect-timeout``).
    """

    def __init__(self, endpoint: Endpoint, workers: int, connections: int, timeout: float,
                 log: Callable[[str], None]) -> None:
        self.endpoint = endpoint
        self.bearer = f"Bearer {endpoint.token}".encode()
        self.connections = [Upstream(endpoint, timeout) for _ in range(connections)]
        #: What the workers asked, in order, and the signal that there is some.
        self.waiting: deque[Pending] = deque()
        self.arrived = asyncio.Event()
        self.log = log
        limits = Limits(max_body_bytes=MAX_BODY_BYTES, idle_timeout=IDLE_SECONDS,
                        max_connections=2 * workers + LOCAL_MARGIN)
        self.server = HttpServer(self.handle, admit=self.admit, limits=limits, log=log)
        self.tasks: list[asyncio.Task[None]] = []
        #: Round trips to the coordinator, and the requests they carried (the batching's effect, logged at the end).
        self.round_trips = 0
        self.relayed = 0
        self.unanswered = 0

    async def start(self) -> int:
        """Listen on the node's loopback; return the port."""
        port = await self.server.start("127.0.0.1", 0)
        self.start_carrying()
        return port

    def start_carrying(self) -> None:
        """Start the loop of each connection to the coordinator (what :meth:`handle` hands them is carried)."""
        self.tasks = [asyncio.create_task(self.carry(connection)) for connection in self.connections]

    async def close(self) -> None:
        await self.server.close()
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        for connection in self.connections:
            connection.close()

    def admit(self, request: Request) -> Response | None:
        """The run's token before any body byte (``/health`` is public, as on the coordinator)."""
        if request.path == "/health":
            return None
        supplied = request.headers.get("authorization", "").encode("utf-8", "replace")
        return None if hmac.compare_digest(supplied, self.bearer) else UNAUTHORIZED

    async def handle(self, request: Request) -> Response:
        """A worker's request: queued for the next free connection; its answer when it came.

        :raises ConnectionError: when the coordinator could not be asked (the worker's connection is closed unanswered).
        """
        return await self.submit(request, batchable(request))

    async def submit(self, request: Request, can_batch: bool) -> Response:
        """:meth:`handle` of a request whose :func:`batchable` is known (``can_batch``): queued for the next free
        connection; its answer when it came.

        :raises ConnectionError: when the coordinator could not be asked.
        """
        pending = Pending(request, asyncio.get_running_loop().create_future(), can_batch)
        self.waiting.append(pending)
        self.arrived.set()
        return await pending.answer

    async def take(self) -> list[Pending]:
        """The first request waiting (once there is one) and what waits behind it that may ride in the same batch."""
        while not self.waiting:
            self.arrived.clear()
            await self.arrived.wait()
        first = self.waiting.popleft()
        parts, size = [first], first.size
        while first.batchable and self.waiting and len(parts) < MAX_BATCH:
            following = self.waiting[0]
            if not following.batchable or size + following.size > MAX_BATCH_BYTES:
                break
            parts.append(self.waiting.popleft())
            size += following.size
        return parts

    async def carry(self, connection: Upstream) -> None:
        """One connection's loop: take what is queued, send it (a batch, or a lone request as it is), answer each."""
        while True:
            parts = await self.take()
            try:
                if len(parts) == 1:
                    request = parts[0].request
                    target = (request.path + (f"?{request.query}" if request.query else "")).encode("ascii")
                    answers = [answer_of(await connection.request(request.method.encode(), target, request.body))]
                else:
                    answer = await connection.request(b"POST", b"/batch", batch_body(parts))
                    answers = split_answers(answer, len(parts))
            except ConnectionError as exc:
                connection.close()
                self.unanswered += len(parts)
                self.log(f"relay: {len(parts)} request(s) unanswered, their workers retry: {exc}")
                for part in parts:
                    if not part.answer.done():
                        part.answer.set_exception(ConnectionResetError(str(exc)))
                continue
            self.round_trips += 1
            self.relayed += len(parts)
            for part, response in zip(parts, answers, strict=True):
                if not part.answer.done():  # the worker may have gone meanwhile
                    part.answer.set_result(response)
