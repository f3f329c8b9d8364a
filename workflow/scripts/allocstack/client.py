"""HTTP client of the coordinator's protocol (workers, the status command, tests, benchmarks)."""

from __future__ import annotations

import time
from typing import Any

import requests
from urllib3.util import SKIP_HEADER

from .errors import AllocstackError
from .jsonio import dumps_compact, loads_bytes

_JSON = {"Content-Type": "application/json"}


def loopback_session() -> requests.Session:
    """A keep-alive session for loopback endpoints that ignores the environment's proxy settings.

    Centers often set ``http_proxy`` on login and compute nodes; without ``no_proxy`` covering
    127.0.0.1, requests would send loopback traffic to that proxy (ProxyError, or worse, a
    token sent off the node). ``trust_env = False`` also skips requests' scan of the whole
    environment (proxies, netrc) on every request, which was a fifth of a worker's time at batch 1.
    """
    session = requests.Session()
    session.trust_env = False
    return session


class CoordinatorClient:
    """One keep-alive session to the coordinator; not thread-safe (one per thread)."""

    def __init__(self, url: str, token: str, timeout: float = 30.0) -> None:
        self.url = url
        self.timeout = timeout
        self.session = loopback_session()
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

    def claim(self, worker: str, max_tasks: int, results: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        body: dict[str, Any] = {"workerId": worker, "max": max_tasks}
        if results:
            body["results"] = results
        return self._post("/claim", body)[1]

    def post_result(self, worker: str, result: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        return self._post("/result", {"workerId": worker, **result}, ok=(201, 400, 409))

    def post_results(self, worker: str, results: list[dict[str, Any]]) -> dict[str, Any]:
        return self._post("/results", {"workerId": worker, "results": results})[1]

    def fail(self, worker: str, task_id: str, reason: str) -> dict[str, Any]:
        return self._post("/fail", {"workerId": worker, "taskId": task_id, "reason": reason}, ok=(200, 409))[1]

    def heartbeat(self, worker: str, task_ids: list[str]) -> list[str]:
        return self._post("/heartbeat", {"workerId": worker, "taskIds": task_ids})[1]["held"]
