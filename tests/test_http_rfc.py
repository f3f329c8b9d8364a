"""Hostile and malformed requests on a raw socket, each answered as RFC 9112 / 9110 say (a table).

Against one real coordinator process, on its loopback listener and on the TLS
listener it opens for the other nodes (more than one node; bound to 127.0.0.1 here):
the same answers both ways. Each row: the bytes sent, the status of the first
response, whether the server closes the connection after it, and the statuses of
every response on the connection (so a smuggled second request would show up as
an extra one).
"""

from __future__ import annotations

import json
import re
import socket
import ssl
import time
from contextlib import contextmanager

import pytest

from conftest import RunningCoordinator, make_tasks

TOKEN = "@TOKEN@"  # noqa: S105  (a placeholder: exchange() puts the run's token there)


def claim_body(worker: str = "rfc") -> bytes:
    return json.dumps({"workerId": worker}).encode()


def post(extra_headers: bytes, body: bytes = b"", path: bytes = b"/claim", host: bytes = b"Host: x\r\n") -> bytes:
    return (b"POST " + path + b" HTTP/1.1\r\n" + host + b"Authorization: Bearer " + TOKEN.encode() + b"\r\n"
            + extra_headers + b"\r\n" + body)


BODY = claim_body()
LENGTH = str(len(BODY)).encode()
SMUGGLED = b"GET /status HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + TOKEN.encode() + b"\r\n\r\n"

#: (case, bytes sent, status of the first answer, closed after it, statuses of every answer)
CASES = [
    ("a valid claim (control)", post(b"Content-Length: " + LENGTH + b"\r\n", BODY), 200, False, [200]),
    ("two different Content-Length headers",
     post(b"Content-Length: " + LENGTH + b"\r\nContent-Length: 99\r\n", BODY), 400, True, [400]),
    ("Content-Length: +N", post(b"Content-Length: +" + LENGTH + b"\r\n", BODY), 400, True, [400]),
    ("Content-Length: 1_6 (Python's int() would take it)", post(b"Content-Length: 1_6\r\n", BODY), 400, True, [400]),
    ("Content-Length: -1", post(b"Content-Length: -1\r\n"), 400, True, [400]),
    ("Transfer-Encoding: gzip (chunked not final: the length is unknown, RFC 9112 6.3)",
     post(b"Transfer-Encoding: gzip\r\n", BODY), 400, True, [400]),
    ("gzip, chunked: a coding we do not implement", post(b"Transfer-Encoding: gzip, chunked\r\n",
                                                          b"0\r\n\r\n"), 501, True, [501]),
    ("chunked then identity (two headers): a desync attempt",
     post(b"Transfer-Encoding: chunked\r\nTransfer-Encoding: identity\r\n", b"0\r\n\r\n" + SMUGGLED), 400, True, [400]),
    ("chunked, identity (one header)",
     post(b"Transfer-Encoding: chunked, identity\r\n", b"0\r\n\r\n" + SMUGGLED), 400, True, [400]),
    ("Content-Length and Transfer-Encoding together",
     post(b"Content-Length: 5\r\nTransfer-Encoding: chunked\r\n", b"0\r\n\r\n" + SMUGGLED), 400, True, [400]),
    ("a chunked body (supported)",
     post(b"Transfer-Encoding: chunked\r\n", b"%x\r\n" % len(BODY) + BODY + b"\r\n0\r\n\r\n"), 200, False, [200]),
    ("a chunk ended by two bytes that are not CRLF (CVE-2025-43859, fixed in h11 0.16.0)",
     post(b"Transfer-Encoding: chunked\r\n", b"%x\r\n" % len(BODY) + BODY + b"XX0\r\n\r\n"), 400, True, [400]),
    ("a malformed chunk size", post(b"Transfer-Encoding: chunked\r\n", b"zz\r\n" + BODY + b"\r\n0\r\n\r\n"),
     400, True, [400]),
    ("obsolete line folding of Authorization",
     b"POST /claim HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer\r\n " + TOKEN.encode()
     + b"\r\nContent-Length: " + LENGTH + b"\r\n\r\n" + BODY, 400, True, [400]),
    ("obsolete line folding of another field",
     post(b"X-Note: a\r\n\tb\r\nContent-Length: " + LENGTH + b"\r\n", BODY), 400, True, [400]),
    ("no Host (HTTP/1.1)", post(b"Content-Length: " + LENGTH + b"\r\n", BODY, host=b""), 400, True, [400]),
    ("two Host fields", post(b"Content-Length: " + LENGTH + b"\r\n", BODY, host=b"Host: x\r\nHost: y\r\n"),
     400, True, [400]),
    ("NUL in a field value", post(b"X-Note: a\x00b\r\nContent-Length: " + LENGTH + b"\r\n", BODY), 400, True, [400]),
    ("0xff in a field name", post(b"X-\xffNote: a\r\nContent-Length: " + LENGTH + b"\r\n", BODY), 400, True, [400]),
    ("0xff in the request target", b"GET /health\xff HTTP/1.1\r\nHost: x\r\n\r\n", 400, True, [400]),
    ("0xff in a field value (obs-text: opaque data, RFC 9110 5.5)",
     b"GET /health HTTP/1.1\r\nHost: x\r\nX-Note: caf\xe9\r\n\r\n", 200, False, [200]),
    ("a lone CR inside the head", b"GET /health HTTP/1.1\r\nHost: x\rX-Evil: 1\r\n\r\n", 400, True, [400]),
    ("bare LF line ends (RFC 9112 2.2: a recipient MAY accept)", b"GET /health HTTP/1.1\nHost: x\n\n",
     200, False, [200]),
    ("a malformed request line", b"GARBAGE\r\n\r\n", 400, True, [400]),
    ("HTTP/2.0 in the request line", b"GET /health HTTP/2.0\r\nHost: x\r\n\r\n", 505, True, [505]),
    ("headers over 16 KiB", b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 20000 + b"\r\n\r\n",
     431, True, [431]),
    ("a body announced over --max-body-bytes", post(b"Content-Length: 40000000\r\n"), 413, True, [413]),
    ("no token, a body announced", b"POST /claim HTTP/1.1\r\nHost: x\r\nContent-Length: 33554432\r\n\r\n"
     + b"x" * 1000, 401, True, [401]),
    ("a wrong token", post(b"Content-Length: " + LENGTH + b"\r\n", BODY).replace(TOKEN.encode(), b"guess"),
     401, True, [401]),
    ("GET on a POST endpoint", b"GET /claim HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + TOKEN.encode()
     + b"\r\n\r\n", 405, False, [405]),
    ("POST on a GET endpoint", b"POST /health HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n", 405, False, [405]),
    ("an unknown path", b"GET /nope HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + TOKEN.encode() + b"\r\n\r\n",
     404, False, [404]),
    ("malformed JSON", post(b"Content-Length: 9\r\n", b"{not json"), 400, False, [400]),
    ("an integer beyond Python's digit limit", post(b"Content-Length: 5008\r\n", b'{"max":' + b"9" * 5000 + b"}"),
     400, False, [400]),
    ("two pipelined requests", b"GET /health HTTP/1.1\r\nHost: x\r\n\r\nGET /health HTTP/1.1\r\nHost: x\r\n\r\n",
     200, False, [200, 200]),
    ("HTTP/1.0 (closed after one answer)", b"GET /health HTTP/1.0\r\n\r\n", 200, True, [200]),
    ("HEAD then GET on one connection", (b"HEAD /health HTTP/1.1\r\nHost: x\r\n\r\n"
                                         b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"), 200, False, [200, 200]),
    ("HEAD on an unknown path", b"HEAD /nope HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + TOKEN.encode()
     + b"\r\n\r\n", 404, False, [404]),
    ("absolute-form request target (RFC 9112 3.2.2)", b"GET http://x/health HTTP/1.1\r\nHost: x\r\n\r\n",
     200, False, [200]),
]


@pytest.fixture(scope="module", params=["loopback", "tls"])
def coordinator(request, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("rfc")
    network = ["--network-endpoint-file", str(tmp / "state" / "endpoint.json"), "--address", "127.0.0.1"]
    started = RunningCoordinator(tmp, make_tasks(1000), "--max-body-bytes", "1000000",
                                 *(network if request.param == "tls" else []))
    started.tls = request.param == "tls"
    url = json.loads((tmp / "state" / "endpoint.json").read_text())["endpoint"] if started.tls else started.url
    started.port = int(url.rsplit(":", 1)[1])
    yield started
    started.stop()


#: The test talks TLS without checking the certificate: what is tested is the HTTP inside.
CLIENT_TLS = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
CLIENT_TLS.check_hostname = False
CLIENT_TLS.verify_mode = ssl.CERT_NONE


@contextmanager
def connect(coordinator):
    """A connection to the listener under test: plain TCP, or TLS over it."""
    raw = socket.create_connection(("127.0.0.1", coordinator.port), timeout=5)
    with CLIENT_TLS.wrap_socket(raw) if coordinator.tls else raw as connection:
        yield connection


def exchange(coordinator, data: bytes, wait: float = 0.4) -> tuple[bytes, bool]:
    """Send ``data``; return everything answered and whether the server closed the connection."""
    received = b""
    with connect(coordinator) as raw:
        try:
            raw.sendall(data.replace(TOKEN.encode(), coordinator.token.encode()))
        except (BrokenPipeError, ConnectionResetError, ssl.SSLEOFError):
            pass
        raw.settimeout(wait)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            try:
                chunk = raw.recv(65536)
            except TimeoutError:
                return received, False
            except (ConnectionResetError, ssl.SSLEOFError, ssl.SSLZeroReturnError):
                return received, True
            if not chunk:
                return received, True
            received += chunk
    return received, False


def statuses(answer: bytes) -> list[int]:
    return [int(code) for code in re.findall(rb"(?:^|\r\n\r\n|\})HTTP/1\.1 (\d{3}) ", answer)]


@pytest.mark.parametrize("case,data,status,closes,every", CASES, ids=[case[0] for case in CASES])
def test_hostile_request(coordinator, case, data, status, closes, every):
    answer, closed = exchange(coordinator, data)
    got = statuses(answer)
    print(f"| {case} | {got[0] if got else 'nothing'} | {'closed' if closed else 'kept open'} |")
    assert got[:1] == [status], answer[:300]
    assert got == every, answer[:600]  # nothing smuggled: one answer per request sent
    assert closed == closes, answer[:300]


def test_405_names_the_allowed_methods(coordinator):
    answer, _ = exchange(coordinator, b"POST /status HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + TOKEN.encode()
                         + b"\r\nContent-Length: 0\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 405 ") and b"\r\nAllow: GET, HEAD\r\n" in answer
    answer, _ = exchange(coordinator, b"GET /result HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + TOKEN.encode()
                         + b"\r\n\r\n")
    assert b"\r\nAllow: POST\r\n" in answer


def test_expect_100_continue_is_answered_before_the_body(coordinator):
    head = (b"POST /claim HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + coordinator.token.encode()
            + b"\r\nExpect: 100-continue\r\nContent-Length: " + LENGTH + b"\r\n\r\n")
    with connect(coordinator) as raw:
        raw.sendall(head)
        assert raw.recv(1000) == b"HTTP/1.1 100 Continue\r\n\r\n"  # at once: no 1 s client wait
        raw.sendall(BODY)
        assert raw.recv(4000).startswith(b"HTTP/1.1 200 ")
    # Without the token: the final answer instead of 100 (RFC 9110 10.1.1), and the connection is closed.
    answer, closed = exchange(coordinator, head.replace(coordinator.token.encode(), b"guess"))
    assert statuses(answer) == [401] and closed


def test_the_coordinator_serves_on_after_every_row(coordinator):
    answer, _ = exchange(coordinator, b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
    assert answer.endswith(b'{"status":"ready","schemaVersion":1,"taskCount":1000}')
    assert "Traceback" not in coordinator.log_text() and "internal error" not in coordinator.log_text()


def test_head_answers_the_headers_of_get_without_the_body(coordinator):
    answer, closed = exchange(coordinator, b"HEAD /health HTTP/1.1\r\nHost: x\r\n\r\n")
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 ") and b"content-length: 53" in head and body == b"" and not closed
