"""One keep-alive HTTP/1.1 connection to a coordinator: h11 over a plain or pinned-TLS socket.

What a worker needs on its hot path and nothing else (a worker at batch 1 makes one request
per task): the request is built by h11 (the same sans-IO parser the server uses) and written
in one ``sendall``; the answer is read until h11 says it is complete. ``requests`` cost a
worker ~3x the CPU per task at batch 1 (sessions, adapters, urllib3's pool, header merging).

* **Keep-alive.** One socket for every request. Before a request reuses it, a zero-timeout
  poll checks that the server has not closed it meanwhile (its idle timeout); a reused
  connection that still fails before the first byte of an answer (closed while the request
  was on its way) is replaced by a fresh one and the request sent once more. A connection
  the server asks to close (``Connection: close``), or that failed or timed out, is dropped
  and the next request opens a new one.
* **No proxy.** The socket goes to the URL's address, whatever ``http_proxy`` says (centers
  set it on nodes; loopback traffic and the token must never go to a proxy).
* **Pinned TLS.** An ``https`` URL needs the SHA-256 ``fingerprint`` of the run's certificate
  (``tls``): the handshake runs without CA verification, then the certificate presented is
  compared with the pin *before any byte of a request (and its token) is sent*; another
  certificate raises :class:`CertificateRefused` and the socket is closed. ``https`` without
  a fingerprint is refused before connecting.
* **Bounded.** ``timeout`` bounds the connect, the handshake and each wait for the server
  (each send and each read), like ``requests``' timeout: :class:`TimedOut`.

Errors: :class:`TransportError` (no readable answer) and its kinds; an HTTP status is an
answer, never an exception here.
"""

from __future__ import annotations

import select
import socket
import ssl
from dataclasses import dataclass
from urllib.parse import urlsplit

import h11

from ..common.tls import certificate_matches, client_context

#: Below malloc's mmap threshold (128 KiB): a larger recv buffer costs an mmap and a munmap per read.
READ_CHUNK = 64 * 1024


class TransportError(Exception):
    """The request got no readable HTTP answer (connection, timeout, TLS or protocol failure)."""


class ConnectFailed(TransportError):
    """Could not connect, or the connection was lost (or spoke no HTTP) before a whole answer."""


class CertificateRefused(ConnectFailed):
    """An https server that does not present the pinned certificate (no request was sent)."""


class TimedOut(TransportError):
    """The server did not accept, answer or read within the timeout."""


class Stale(Exception):
    """A reused connection failed before any answer byte: the request may be sent once more, fresh."""


@dataclass(frozen=True, slots=True)
class Answer:
    status: int
    #: Header names in lower case (h11 normalizes them), values as sent.
    headers: list[tuple[bytes, bytes]]
    body: bytes

    def header(self, name: bytes, default: str | None = None) -> str | None:
        for key, value in self.headers:
            if key == name:
                return value.decode("latin-1")
        return default


class AnswerReader:
    """The answer to one request, taken from h11 as its bytes arrive. Sans-IO: the worker's blocking
    socket (:class:`HttpConnection`) and the relay's asyncio stream read it the same way::

        incoming = AnswerReader(conn, url, reused, closed=ConnectFailed)
        while not incoming.complete():
            incoming.feed(sock.recv(READ_CHUNK))

    :param reused: the connection carried a request before: its closing before any answer byte is :class:`Stale`.
    :param closed: the error raised when the server closes the connection before a whole answer.
    """

    __slots__ = ("chunks", "closed", "conn", "received", "response", "reused", "url")

    def __init__(self, conn: h11.Connection, url: str, reused: bool, closed: type[Exception]) -> None:
        self.conn, self.url, self.reused, self.closed = conn, url, reused, closed
        #: Whether any byte (or the end) of the answer arrived.
        self.received = False
        self.response: h11.Response | None = None
        self.chunks: list[bytes] = []

    def complete(self) -> bool:
        """Take the events h11 holds: True at the answer's end, False when it needs more bytes (:meth:`feed`).

        :raises closed: the server closed the connection before the answer's end.
        """
        while True:
            event = self.conn.next_event()
            if event is h11.NEED_DATA:
                return False
            kind = type(event)
            if kind is h11.Response:
                self.response = event
            elif kind is h11.Data:
                self.chunks.append(event.data)
            elif kind is h11.EndOfMessage:
                return True
            elif kind is h11.ConnectionClosed or event is h11.PAUSED:
                raise self.closed(f"{self.url} closed the connection before answering")
            # h11.InformationalResponse (100 Continue): the answer follows

    def feed(self, chunk: bytes) -> None:
        """Hand h11 the bytes read (``b""``: the server closed the connection).

        :raises Stale: a reused connection closed before any answer byte.
        """
        if not chunk and self.reused and not self.received:
            raise Stale
        self.received = True
        self.conn.receive_data(chunk)

    def keep_alive(self) -> bool:
        """Ready the connection for the next request; False when it must close (``Connection: close``, HTTP/1.0)."""
        if self.response is None or not (self.conn.our_state is h11.DONE and self.conn.their_state is h11.DONE):
            return False
        self.conn.start_next_cycle()
        return True

    def answer(self) -> Answer:
        """The whole answer (once :meth:`complete`).

        :raises closed: h11 gave no status line (never: it reads an answer's head before its end).
        """
        if self.response is None:
            raise self.closed(f"{self.url} answered without a status line")
        chunks = self.chunks
        return Answer(self.response.status_code, list(self.response.headers),
                      chunks[0] if len(chunks) == 1 else b"".join(chunks))


class HttpConnection:
    """A keep-alive HTTP/1.1 connection to ``url`` (``http://HOST:PORT``, or ``https://`` with
    ``fingerprint``) that sends ``headers`` with every request; opened on the first request.
    Not thread-safe: one per thread."""

    def __init__(self, url: str, timeout: float, fingerprint: str | None = None,
                 headers: list[tuple[bytes, bytes]] | None = None) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname or parts.port is None:
            raise ValueError(f"{url!r} must look like http(s)://HOST:PORT")
        self.url = url
        self.address = (parts.hostname, parts.port)
        self.tls = parts.scheme == "https"
        self.fingerprint = fingerprint
        self.timeout = timeout
        self.headers = [(b"host", parts.netloc.encode("ascii")), *(headers or [])]
        self._context = client_context() if self.tls else None
        self._socket: socket.socket | None = None
        self._h11: h11.Connection | None = None

    def close(self) -> None:
        if self._socket is not None:
            self._socket.close()
        self._socket = self._h11 = None

    def request(self, method: bytes, target: bytes, body: bytes = b"",
                headers: list[tuple[bytes, bytes]] | None = None) -> Answer:
        """Send one request and read its whole answer.

        :raises TransportError: :class:`ConnectFailed` (:class:`CertificateRefused`) or :class:`TimedOut`.
        """
        fields = [*self.headers, *(headers or ())]
        if body or method == b"POST":
            fields.append((b"content-length", str(len(body)).encode("ascii")))
        open_now = self._reusable()
        try:
            return self._exchange(*(open_now or self._connect()), method, target, body, fields, open_now is not None)
        except Stale:
            self.close()
            return self._exchange(*self._connect(), method, target, body, fields, False)

    # -- the connection ----------------------------------------------------------
    def _reusable(self) -> tuple[socket.socket, h11.Connection] | None:
        """The open connection when it can take a request (idle, and not closed by the server), else None."""
        sock, conn = self._socket, self._h11
        if sock is None or conn is None:
            return None
        if conn.our_state is h11.IDLE and conn.their_state is h11.IDLE:
            try:
                readable, _, _ = select.select([sock], [], [], 0)
            except (OSError, ValueError):
                readable = [True]
            if not readable:
                return sock, conn  # nothing to read between requests: the server has not closed it
        self.close()  # EOF, or bytes nobody asked for: not a connection to trust with a request
        return None

    def _connect(self) -> tuple[socket.socket, h11.Connection]:
        host, port = self.address
        if self.tls and not self.fingerprint:
            raise CertificateRefused(f"https to {self.url} needs the run's certificate fingerprint to pin")
        try:
            sock = socket.create_connection(self.address, timeout=self.timeout)
        except TimeoutError as exc:
            raise TimedOut(f"connecting to {host}:{port}: timed out after {self.timeout:g} s") from exc
        except OSError as exc:
            raise ConnectFailed(f"cannot connect to {host}:{port}: {exc.strerror or exc}") from exc
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self._context is not None and self.fingerprint is not None:
                sock = self._context.wrap_socket(sock, server_hostname=host)
                if not certificate_matches(sock.getpeercert(binary_form=True), self.fingerprint):
                    raise CertificateRefused(f"{host}:{port} presented a certificate whose SHA-256 fingerprint "
                                             f"is not the pinned one (not this run's coordinator)")
        except TransportError:
            sock.close()
            raise
        except TimeoutError as exc:
            sock.close()
            raise TimedOut(f"TLS handshake with {host}:{port}: timed out after {self.timeout:g} s") from exc
        except (OSError, ssl.SSLError) as exc:  # ssl.SSLError is an OSError; named for the reader
            sock.close()
            raise ConnectFailed(f"TLS handshake with {host}:{port} failed: {exc}") from exc
        self._socket, self._h11 = sock, h11.Connection(h11.CLIENT)
        return sock, self._h11

    def _exchange(self, sock: socket.socket, conn: h11.Connection, method: bytes, target: bytes, body: bytes,
                  fields: list[tuple[bytes, bytes]], reused: bool) -> Answer:
        """Write the request, read the answer (see :meth:`request`); raises ``Stale`` only when ``reused``."""
        data = conn.send(h11.Request(method=method, target=target, headers=fields))
        if body:
            data += conn.send(h11.Data(data=body))
        data += conn.send(h11.EndOfMessage())
        incoming = AnswerReader(conn, self.url, reused, closed=ConnectFailed)
        try:
            sock.sendall(data)
            while not incoming.complete():
                incoming.feed(sock.recv(READ_CHUNK))
        except Stale:
            raise
        except TimeoutError as exc:
            self.close()
            raise TimedOut(f"{self.url} did not answer within {self.timeout:g} s") from exc
        except (OSError, h11.ProtocolError) as exc:
            self.close()
            if reused and not incoming.received and isinstance(exc, OSError):
                raise Stale from exc
            raise ConnectFailed(f"{self.url}: connection lost ({exc})") from exc
        except ConnectFailed:
            self.close()
            raise
        if not incoming.keep_alive():  # Connection: close (or an HTTP/1.0 answer): the next request opens a new one
            self.close()
        return incoming.answer()
