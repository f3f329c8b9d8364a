"""Routes: (method, path) -> handler, with RFC answers for the rest.

A GET route also answers HEAD (the server sends its headers only, RFC 9110
9.3.2). An unknown path is 404; a known path with another method is 405 with
the ``Allow`` header listing what the path accepts (RFC 9110 15.5.6).
"""

from __future__ import annotations

from .httpserver import Handler, Request, Response


class Router:
    def __init__(self, routes: dict[tuple[str, str], Handler]) -> None:
        self.routes = dict(routes)
        self.allowed: dict[str, list[str]] = {}
        for method, path in self.routes:
            self.allowed.setdefault(path, []).extend(["GET", "HEAD"] if method == "GET" else [method])

    async def dispatch(self, request: Request) -> Response:
        route = self.routes.get(("GET" if request.method == "HEAD" else request.method, request.path))
        if route is not None:
            return await route(request)
        allowed = self.allowed.get(request.path)
        if allowed is None:
            return Response.error(404, f"no such endpoint {request.path[:200]}")
        return Response.error(405, f"{request.method} is not allowed on {request.path}",
                              headers={"Allow": ", ".join(sorted(allowed))})
