"""HTTP clients of the coordinator: its protocol (:class:`CoordinatorClient`: workers, the status
command, tests, benchmarks) over :mod:`.httpclient`; and the ``requests`` sessions of the readiness
gate (:func:`loopback_session`), which pin the same way."""

from __future__ import annotations

import time
from typing import Any

import requests
from requests.adapters import HTTPAdapter

from .errors import AllocstackError
from .httpclient import Answer, HttpConnection
from .jsonio import dumps_compact, loads_bytes
from .tls import client_context

_JSON = [(b"content-type", b"application/json")]


def _json_or_none(body: bytes) -> Any:
    """The JSON document in ``body``, or None when it is not JSON."""
    try:
        return loads_bytes(body)
    except (ValueError, RecursionError):
        return None


class PinnedAdapter(HTTPAdapter):
    """https that accepts exactly one certificate: the one with SHA-256 ``fingerprint``.

    The coordinator's certificate is made at start and signed by no CA (see ``tls``), so CA
    verification is off and the pin is the check: urllib3 compares the fingerprint of the
    certificate the server presents during the handshake, before any request (and its token)
    is sent, and fails the request with ``requests.exceptions.SSLError`` on a mismatch.
    One TLS context serves every connection: left to itself urllib3 makes one per connection
    and loads the system's CA bundle into it (~35 ms a connection, measured), for nothing.
    """

    def __init__(self, fingerprint: str, **kwargs: Any) -> None:
        self.fingerprint = fingerprint  # read by init_poolmanager, which HTTPAdapter.__init__ calls
        self.context = client_context()
        super().__init__(**kwargs)

    def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
        kwargs.update(assert_fingerprint=self.fingerprint, ssl_context=self.context)
        super().init_poolmanager(*args, **kwargs)

    def send(self, request: requests.PreparedRequest, **kwargs: Any) -> requests.Response:  # type: ignore[override]
        kwargs["verify"] = False  # no CA to verify against: the pin is the verification
        return super().send(request, **kwargs)


def loopback_session(fingerprint: str | None = None) -> requests.Session:
    """A keep-alive session that ignores the environment's proxy settings; https only with ``fingerprint`` pinned.

    Centers often set ``http_proxy`` on login and compute nodes; without ``no_proxy`` covering
    127.0.0.1, requests would send loopback traffic to that proxy (ProxyError, or worse, a
    token sent off the node). ``trust_env = False`` also skips requests' scan of the whole
    environment (proxies, netrc) on every request, which was a fifth of a worker's time at batch 1.
    Off-node endpoints (more than one node) are https with the run's certificate, pinned by
    ``fingerprint`` (:class:`PinnedAdapter`); without one, https is refused outright.
    """
    session = requests.Session()
    session.trust_env = False
    session.mount("https://", PinnedAdapter(fingerprint) if fingerprint else NoHttps())
    return session


class NoHttps(HTTPAdapter):
    """https without a pinned certificate: refused (never a CA-verified or unverified connection)."""

    def send(self, request: requests.PreparedRequest, **kwargs: Any) -> requests.Response:  # type: ignore[override]
        raise requests.exceptions.SSLError(f"https to {request.url} needs the run's certificate fingerprint to pin")


class CoordinatorClient:
    """The coordinator's protocol over one keep-alive connection (:class:`HttpConnection`, h11 on a plain
    or pinned-TLS socket: no proxy, https only with ``fingerprint``); not thread-safe (one per thread).

    :raises TransportError: from every call when no readable answer came (``ConnectFailed``,
        ``CertificateRefused``, ``TimedOut``); an HTTP status the caller does not expect is an
        :class:`AllocstackError` (``auth`` for 401, else ``worker-exit``).
    """

    def __init__(self, url: str, token: str, timeout: float = 30.0, fingerprint: str | None = None) -> None:
        self.url = url
        self.timeout = timeout
        # Only the headers the coordinator reads (plus Host and Content-Length): each header costs
        # both sides time on every request, one a task at batch 1.
        self.connection = HttpConnection(url, timeout, fingerprint,
                                         [(b"authorization", f"Bearer {token}".encode("latin-1"))])

    def close(self) -> None:
        self.connection.close()

    def _post(self, path: str, body: dict[str, Any], ok: tuple[int, ...] = (200,)) -> tuple[int, dict[str, Any]]:
        deadline = time.monotonic() + self.timeout
        target = path.encode("ascii")
        while True:
            answer = self.connection.request(b"POST", target, dumps_compact(body), _JSON)
            # 503: the coordinator is at its connection or buffered-bytes cap for a moment
            if answer.status != 503 or time.monotonic() >= deadline:
                return self._decode(path, answer, ok)
            time.sleep(min(float(answer.header(b"retry-after") or 1), max(0.0, deadline - time.monotonic())))

    def _get(self, path: str) -> dict[str, Any]:
        return self._decode(path, self.connection.request(b"GET", path.encode("ascii")), (200,))[1]

    def _decode(self, path: str, answer: Answer, ok: tuple[int, ...]) -> tuple[int, dict[str, Any]]:
        """(status, JSON body) of an expected answer.

        :raises AllocstackError: ``auth`` on 401, ``worker-exit`` on 507 or another unexpected status,
            or a body that is not JSON.
        """
        if answer.status == 401:
            raise AllocstackError("auth", f"the coordinator refused our token on {path}")
        if answer.status == 507:
            error = _json_or_none(answer.body)
            message = error.get("error", "") if isinstance(error, dict) else answer.body.decode("utf-8", "replace")
            raise AllocstackError("worker-exit", f"the coordinator cannot store results: {str(message)[:300]}")
        if answer.status not in ok:
            raise AllocstackError(
                "worker-exit", f"{path} answered {answer.status}: {answer.body.decode('utf-8', 'replace')[:200]}"
            )
        document = _json_or_none(answer.body)
        if document is None:
            raise AllocstackError("worker-exit", f"{path} answered {answer.status} with a body that is not JSON: "
                                                 f"{answer.body[:100]!r}")
        return answer.status, document

    def health(self) -> dict[str, Any]:
        return self._get("/health")

    def status(self) -> dict[str, Any]:
        return self._get("/status")

    def claim(self, worker: str, max_tasks: int, results: list[dict[str, Any]] | None = None,
              node: str | None = None) -> dict[str, Any]:
        body: dict[str, Any] = {"workerId": worker, "max": max_tasks}
        if results:
            body["results"] = results
        if node:
            body["node"] = node
        return self._post("/claim", body)[1]

    def post_result(self, worker: str, result: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        return self._post("/result", {"workerId": worker, **result}, ok=(201, 400, 409))

    def post_results(self, worker: str, results: list[dict[str, Any]]) -> dict[str, Any]:
        return self._post("/results", {"workerId": worker, "results": results})[1]

    def fail(self, worker: str, task_id: str, reason: str) -> dict[str, Any]:
        return self._post("/fail", {"workerId": worker, "taskId": task_id, "reason": reason}, ok=(200, 409))[1]

    def heartbeat(self, worker: str, task_ids: list[str]) -> list[str]:
        return self._post("/heartbeat", {"workerId": worker, "taskIds": task_ids})[1]["held"]
