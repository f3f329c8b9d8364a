"""The workers' HTTP client (allocstack.worker.httpclient, allocstack.worker.client) against real servers on loopback:
keep-alive, reconnecting after the server closed, the pinned TLS certificate, timeouts."""

from __future__ import annotations

import asyncio
import hashlib
import socket
import ssl
import threading

import pytest

from allocstack.common.errors import AllocstackError
from allocstack.common.tls import tls_context
from allocstack.coordinator.httpserver import HttpServer, Limits, Request, Response
from allocstack.worker.client import CoordinatorClient
from allocstack.worker.httpclient import CertificateRefused, ConnectFailed, HttpConnection, TimedOut, TransportError


class ThreadServer:
    """The project's HttpServer in its own event loop thread; each answer names its connection."""

    def __init__(self, tmp_path, tls: bool = False, limits: Limits | None = None) -> None:
        self.seen: list[Request] = []
        self.tasks: list[asyncio.Task] = []
        self.busy = 0  # 503 answers still to give
        self.loop = asyncio.new_event_loop()
        self.http = HttpServer(self.handle, limits=limits or Limits(), log=lambda line: None)
        context, self.fingerprint = tls_context("127.0.0.1", "test", tmp_path) if tls else (None, None)
        started = threading.Event()

        def run() -> None:
            asyncio.set_event_loop(self.loop)
            self.port = self.loop.run_until_complete(self.http.start("127.0.0.1", 0, ssl=context))
            started.set()
            self.loop.run_forever()

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()
        assert started.wait(10)
        self.url = f"{'https' if tls else 'http'}://127.0.0.1:{self.port}"

    async def handle(self, request: Request) -> Response:
        self.seen.append(request)
        task = asyncio.current_task()  # one task serves one connection (held: an id is never reused)
        if task not in self.tasks:
            self.tasks.append(task)
        connection = self.tasks.index(task)
        if request.path == "/busy" and self.busy:
            self.busy -= 1
            return Response.error(503, "at the cap", headers={"Retry-After": "0.01"})
        if request.path == "/text":
            return Response(200, b"not json", content_type="text/plain")
        return Response.json(200, {"connection": connection, "path": request.path, "bytes": len(request.body),
                                   "authorization": request.headers.get("authorization")},
                             close=request.path == "/close")

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self.http.close(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@pytest.fixture
def server(tmp_path):
    running = ThreadServer(tmp_path)
    yield running
    running.stop()


def get_json(connection: HttpConnection, path: bytes, body: bytes = b"") -> dict:
    import json

    answer = connection.request(b"POST", path, body, [(b"content-type", b"application/json")])
    assert answer.status == 200, answer
    return json.loads(answer.body)


def test_one_connection_serves_every_request_with_the_token(server):
    client = CoordinatorClient(server.url, "secret", timeout=5)
    answers = [client._post("/claim", {"workerId": "w", "i": i})[1] for i in range(20)]
    assert len({a["connection"] for a in answers}) == 1 and len(server.http.connections) == 1
    assert {a["authorization"] for a in answers} == {"Bearer secret"}
    assert server.seen[0].headers["content-type"] == "application/json" and server.seen[0].body.startswith(b"{")
    big = client._post("/results", {"workerId": "w", "output": "x" * 300_000})[1]  # more than one read
    assert big["bytes"] > 300_000 and big["connection"] == answers[0]["connection"]
    client.close()


def test_a_connection_the_server_closed_is_replaced(tmp_path):
    server = ThreadServer(tmp_path, limits=Limits(idle_timeout=0.2))
    try:
        connection = HttpConnection(server.url, 5)
        first = get_json(connection, b"/a")
        # Connection: close in an answer: the next request opens another connection
        closing = get_json(connection, b"/close")
        after_close = get_json(connection, b"/a")
        assert closing["connection"] == first["connection"] != after_close["connection"]
        # closed by the server's idle timeout between two requests: noticed before sending
        deadline = threading.Event()
        while server.http.connections:
            deadline.wait(0.05)
        after_idle = get_json(connection, b"/a")
        assert after_idle["connection"] != after_close["connection"]
        assert [r.path for r in server.seen] == ["/a", "/close", "/a", "/a"]  # each request once
    finally:
        server.stop()


class RawServer:
    """A raw socket server. ``mode`` "once": answers the first request of each connection, then closes it
    without answering the second (a server that closed a kept-alive connection as the request arrived);
    "close": closes every connection unanswered; "silent": holds it and answers nothing."""

    def __init__(self, mode: str = "once") -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.requests: list[bytes] = []
        self.mode = mode
        threading.Thread(target=self.serve, daemon=True).start()

    def serve(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self.one, args=(conn,), daemon=True).start()

    def one(self, conn: socket.socket) -> None:
        with conn:
            data = b""
            while b"\r\n\r\n" not in data:
                chunk = conn.recv(65536)
                if not chunk:
                    return
                data += chunk
            self.requests.append(data.split(b"\r\n", 1)[0])
            if self.mode == "silent":
                conn.recv(1)  # until the client goes
            elif self.mode == "once":
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")
                second = conn.recv(65536)  # the second request: closed unanswered
                if second:
                    self.requests.append(second.split(b"\r\n", 1)[0])

    def __enter__(self) -> RawServer:
        return self

    def __exit__(self, *exc) -> None:
        self.listener.close()


def test_a_request_on_a_connection_closed_under_it_is_sent_once_more_on_a_new_one():
    with RawServer("once") as server:
        connection = HttpConnection(server.url, 5)
        assert connection.request(b"GET", b"/one").status == 200
        assert connection.request(b"GET", b"/two").status == 200
    # /two reached the first connection, which closed without a byte; the new one answered it
    assert server.requests == [b"GET /one HTTP/1.1", b"GET /two HTTP/1.1", b"GET /two HTTP/1.1"]


def test_a_new_connection_closed_unanswered_is_an_error_not_a_retry():
    with RawServer("close") as server, pytest.raises(ConnectFailed, match=r"closed the connection|connection lost"):
        HttpConnection(server.url, 5).request(b"POST", b"/claim", b"{}")
    assert server.requests == [b"POST /claim HTTP/1.1"]  # sent once: only a reused connection retries


def test_timeouts_and_refused_connections_are_transport_errors():
    with RawServer("silent") as silent, pytest.raises(TimedOut, match=r"did not answer within 0\.3 s"):
        HttpConnection(silent.url, 0.3).request(b"GET", b"/x")
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]  # bound, not listening: connection refused
        with pytest.raises(ConnectFailed, match="cannot connect"):
            HttpConnection(f"http://127.0.0.1:{port}", 1).request(b"GET", b"/x")
    assert issubclass(TimedOut, TransportError) and issubclass(ConnectFailed, TransportError)


def test_the_client_says_what_the_coordinator_answered(server):
    client = CoordinatorClient(server.url, "t", timeout=5)
    server.busy = 2
    assert client._post("/busy", {"workerId": "w"})[1]["path"] == "/busy"  # 503 + Retry-After: retried
    assert [r.path for r in server.seen] == ["/busy"] * 3
    with pytest.raises(AllocstackError, match=r"/text answered 200 with a body that is not JSON") as error:
        client._get("/text")
    assert error.value.diag == "worker-exit"


def test_only_the_pinned_certificate_gets_a_request(tmp_path):
    server = ThreadServer(tmp_path, tls=True)
    try:
        wrong = CoordinatorClient(server.url, "secret", timeout=5, fingerprint="0" * 64)
        with pytest.raises(CertificateRefused, match="fingerprint"):
            wrong.health()
        with pytest.raises(CertificateRefused, match="fingerprint to pin"):  # https without a pin: never connects
            CoordinatorClient(server.url, "secret", timeout=5).health()
        assert server.seen == []  # the token was never sent
        with pytest.raises(ConnectFailed):  # plain HTTP to the TLS listener
            HttpConnection(server.url.replace("https", "http"), 2).request(b"GET", b"/x")
        right = CoordinatorClient(server.url, "secret", timeout=5, fingerprint=server.fingerprint)
        answers = [right._post("/claim", {"workerId": "w"})[1] for _ in range(5)]
        assert len({a["connection"] for a in answers}) == 1 and answers[0]["authorization"] == "Bearer secret"
        presented = ssl.get_server_certificate(("127.0.0.1", server.port))
        assert hashlib.sha256(ssl.PEM_cert_to_DER_cert(presented)).hexdigest() == server.fingerprint
        right.close()
    finally:
        server.stop()
