"""``requests`` sessions for the readiness gate (``readiness.py``), which probes any HTTP service:
no proxy, and https only with the run's certificate pinned (the workers' client,
:mod:`.httpclient`, keeps the same guarantees without ``requests``)."""

from __future__ import annotations

from typing import Any

import requests
from requests.adapters import HTTPAdapter

from ..common.tls import client_context


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
    environment (proxies, netrc) on every request, which was a fifth of a request's time.
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
