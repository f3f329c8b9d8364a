"""The coordinator's protocol for its clients (workers, the status command, tests, benchmarks), over
one keep-alive connection (:mod:`.httpclient`). No ``requests`` here: a worker does not import it
(60 ms of CPU at each start); the readiness gate's ``requests`` sessions are in :mod:`.sessions`."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import Any

from ..common.errors import AllocstackError
from ..common.jsonio import dumps_compact, loads_bytes
from .httpclient import Answer, HttpConnection

_JSON = [(b"content-type", b"application/json")]
#: Seconds a refused request (503) waits at most before it is sent again.
MAX_BACKOFF = 8.0


def backoff(retry_after: float, attempt: int, draw: Callable[[], float] = random.random) -> float:
    """Seconds to wait before sending a refused (503) request again, the ``attempt``-th time (0 first): the
    server's ``Retry-After``, doubled each time it refuses again (at most :data:`MAX_BACKOFF`), spread over half to
    one and a half of that, so clients refused together do not all come back together."""
    return min(MAX_BACKOFF, retry_after * 2 ** attempt) * (0.5 + draw())


def _json_or_none(body: bytes) -> Any:
    """The JSON document in ``body``, or None when it is not JSON."""
    try:
        return loads_bytes(body)
    except (ValueError, RecursionError):
        return None


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
        attempt = 0
        while True:
            answer = self.connection.request(b"POST", target, dumps_compact(body), _JSON)
            # 503: the coordinator is at its connection or buffered-bytes cap for a moment (overload)
            if answer.status != 503 or time.monotonic() >= deadline:
                return self._decode(path, answer, ok)
            wait = backoff(float(answer.header(b"retry-after") or 1), attempt)
            time.sleep(min(wait, max(0.0, deadline - time.monotonic())))
            attempt += 1

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
