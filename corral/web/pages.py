"""The dashboard's routes: one HTML shell for every page (the JavaScript picks the page from
the path) and the static files beside it. The shell names its base URL, so the pages work
behind a proxy that serves corral under a prefix; every file is revalidated on each load
(a cheap 304), so a browser never runs an old script against a new server."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from string import Template

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import HTMLResponse, RedirectResponse
from fastapi.staticfiles import StaticFiles

STATIC = Path(__file__).with_name("static")

# The pages run only their own files and talk only to this server; no frame may hold them
# (their buttons cancel jobs), and the token in a URL fragment never leaves as a referrer.
HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
                               "connect-src 'self'; base-uri 'self'; form-action 'none'; frame-ancestors 'none'",
    "Referrer-Policy": "no-referrer",
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-cache",
}

router = APIRouter(include_in_schema=False)


@lru_cache(maxsize=1)
def _shell() -> Template:
    return Template((STATIC / "index.html").read_text(encoding="utf-8"))


def _page(request: Request) -> HTMLResponse:
    base = request.scope.get("root_path", "").rstrip("/")
    return HTMLResponse(_shell().substitute(base=base), headers=HEADERS)


@router.get("/ui")
def ui_root(request: Request) -> RedirectResponse:
    return RedirectResponse(request.scope.get("root_path", "").rstrip("/") + "/ui/")


@router.get("/ui/")
@router.get("/ui/nodes")
@router.get("/ui/usage")
def page(request: Request) -> HTMLResponse:
    return _page(request)


@router.get("/ui/jobs/{job}")
def job_page(job: str, request: Request) -> HTMLResponse:
    return _page(request)  # the page itself says when there is no such job


class Assets(StaticFiles):
    async def get_response(self, path: str, scope):  # noqa: ANN001, ANN201 - Starlette's signature
        response = await super().get_response(path, scope)
        response.headers.update({"Cache-Control": "no-cache", "X-Content-Type-Options": "nosniff"})
        return response


def install(app: FastAPI) -> None:
    app.mount("/ui/static", Assets(directory=STATIC), name="ui-static")
    app.include_router(router)
