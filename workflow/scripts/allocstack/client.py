"""HTTP client of the coordinator's protocol (workers, the status command, tests, benchmarks)."""

from __future__ import annotations

import time
from typing import Any

import requests
from requests.adapters import HTTPAdapter
from urllib3.util import SKIP_HEADER

from .errors import AllocstackError
from .jsonio import dumps_compact, loads_bytes
from .tls import client_context

_JSON = {"Content-Type": "application/json"}


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
    """One keep-alive session to the coordinator; not thread-safe (one per thread)."""

    def __init__(self, url: str, token: str, timeout: float = 30.0, fingerprint: str | None = None) -> None:
        self.url = url
        self.timeout = timeout
        self.session = loopback_session(fingerprint)
        # Only the headers the coordinator reads (plus Host and the body's): each header costs both
        # sides time on every request, one a task at batch 1. SKIP_HEADER keeps urllib3's defaults out.
        self.session.headers.clear()
        self.session.headers.update({"Authorization": f"Bearer {token}", "User-Agent": SKIP_HEADER,
                                     "Accept-Encoding": SKIP_HEADER})

    def close(self) -> None:
        self.session.close()

    def _post(self, path: str, body: dict[str, Any], ok: tuple[int, ...] = (200,)) -> tuple[int, dict[str, Any]]:
        deadline = time.monotonic() + self.timeout
        while True:
            response = self.session.post(self.url + path, data=dumps_compact(body), headers=_JSON, timeout=self.timeout)
            # 503: the coordinator is at its connection or buffered-bytes cap for a moment
            if response.status_code != 503 or time.monotonic() >= deadline:
                return self._decode(path, response, ok)
            time.sleep(min(float(response.headers.get("Retry-After", 1)), max(0.0, deadline - time.monotonic())))

    def _decode(self, path: str, response: requests.Response, ok: tuple[int, ...]) -> tuple[int, dict[str, Any]]:
        if response.status_code == 401:
            raise AllocstackError("auth", f"the coordinator refused our token on {path}")
        if response.status_code == 507:
            raise AllocstackError("worker-exit", f"the coordinator cannot store results: "
                                                 f"{response.json().get('error', '')[:300]}")
        if response.status_code not in ok:
            raise AllocstackError(
                "worker-exit", f"{path} answered {response.status_code}: {response.text[:200]}"
            )
        try:
            return response.status_code, loads_bytes(response.content)
        except ValueError:  # not JSON: requests' own error (a RequestException), as callers expect
            return response.status_code, response.json()

    def health(self) -> dict[str, Any]:
        response = self.session.get(self.url + "/health", timeout=self.timeout)
        return self._decode("/health", response, (200,))[1]

    def status(self) -> dict[str, Any]:
        response = self.session.get(self.url + "/status", timeout=self.timeout)
        return self._decode("/status", response, (200,))[1]

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
