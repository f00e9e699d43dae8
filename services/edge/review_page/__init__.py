"""The reviewer page (DESIGN §6): ``GET /review`` serves one HTML page, its stylesheet and its
scripts (ES modules under ``/review/``).

Plain files beside this module, no build step. The page needs no key to load: it asks the reviewer
for theirs and calls the ``/v1/reviews`` routes with it. A strict Content-Security-Policy lets it
run only its own scripts and talk only to this origin; the document text it shows is untrusted
input, which the scripts only ever insert as text.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

HERE = Path(__file__).parent
PAGE = "/review"
# name in this folder → the path it is served at and its media type
ASSETS = {
    "index.html": (PAGE, "text/html; charset=utf-8"),
    "review.css": (f"{PAGE}/review.css", "text/css; charset=utf-8"),
    # ES modules: review.js imports the others (no build step)
    **{
        name: (f"{PAGE}/{name}", "text/javascript; charset=utf-8")
        for name in ("review.js", "api.js", "dom.js", "queue.js", "task.js")
    },
}
CONTENT_SECURITY_POLICY = "; ".join(
    [
        "default-src 'none'",
        "script-src 'self'",
        "style-src 'self'",
        "connect-src 'self'",
        "img-src 'self'",
        "form-action 'none'",
        "base-uri 'none'",
        "frame-ancestors 'none'",
    ]
)
HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cross-Origin-Opener-Policy": "same-origin",
    # Small files that change with a release: revalidate rather than serve a stale script.
    "Cache-Control": "no-cache",
}


def _asset(body: bytes, media_type: str) -> Callable[[Request], Awaitable[Response]]:
    async def endpoint(request: Request) -> Response:
        return Response(body, media_type=media_type, headers=HEADERS)

    return endpoint


def review_page_routes() -> list[BaseRoute]:
    """The page's routes; the files are read once, when the edge builds its routes."""
    routes: list[BaseRoute] = []
    for name, (path, media_type) in ASSETS.items():
        label = "review_page" if name == "index.html" else f"review_page_{name.replace('.', '_')}"
        routes.append(
            Route(path, _asset((HERE / name).read_bytes(), media_type), methods=["GET"], name=label)
        )
    return routes
