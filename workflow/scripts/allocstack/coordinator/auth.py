"""Who may do what on the coordinator: decided from a request's head, before its body is read.

Two per-run secrets, both in the 0600 endpoint file: the worker ``token`` (every
request but ``/health``, as ``Authorization: Bearer``) and the read-only
``view_token`` (``GET /status`` and ``GET /ui`` only, also as ``?token=``, since a
browser cannot send a header through a tunnel URL). Compared in constant time.
"""

from __future__ import annotations

import hmac
import secrets
from dataclasses import dataclass, field
from urllib.parse import parse_qs

from .httpserver import Request, Response

#: Paths anyone on the node may read: the seed's health contract.
PUBLIC = frozenset({"/health"})
#: Paths the view token may GET (or HEAD).
VIEWABLE = frozenset({"/status", "/ui"})

UNAUTHORIZED = Response(401, b'{"error":"missing or wrong bearer token"}', headers={"WWW-Authenticate": "Bearer"},
                        close=True)


def _same(supplied: str, expected: bytes) -> bool:
    return hmac.compare_digest(supplied.encode("utf-8", "replace"), expected)


@dataclass(frozen=True)
class Tokens:
    token: str = field(default_factory=lambda: secrets.token_urlsafe(32))
    view_token: str = field(default_factory=lambda: secrets.token_urlsafe(24))

    @property
    def bearer(self) -> bytes:
        return f"Bearer {self.token}".encode()

    def authorized(self, request: Request) -> bool:
        """The worker token is in the Authorization header."""
        return _same(request.headers.get("authorization", ""), self.bearer)

    def may_view(self, request: Request) -> bool:
        """The view token in ``?token=``, or the worker token."""
        supplied = parse_qs(request.query).get("token", [""])[0]
        return _same(supplied, self.view_token.encode("utf-8")) or self.authorized(request)

    def admit(self, request: Request) -> Response | None:
        """None when ``request`` may proceed to its body; else the 401 that closes the connection."""
        if request.path in PUBLIC:
            return None
        if request.method in ("GET", "HEAD") and request.path in VIEWABLE:
            return None if self.may_view(request) else UNAUTHORIZED
        return None if self.authorized(request) else UNAUTHORIZED
