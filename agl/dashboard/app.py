"""The dashboard's routes: server-rendered HTML pages (Jinja2) over a store, read-only, with their assets.

``add_dashboard(app, store)`` adds the pages to an ASGI app: ``agl server`` mounts them at ``/`` (behind its bearer
auth, as ``GET`` routes that the ``reader`` role may call), ``agl dashboard`` serves them alone. Store reads run in
the threadpool like the server's own; no page writes anything. List pages re-fetch themselves every few seconds
(``assets/live.js``) so a running training shows up as it goes.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from importlib import resources as package_files
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, Response
from starlette.concurrency import run_in_threadpool

from agl.core.server.auth import PAGE_HEADERS, install_host_guard
from agl.core.store.base import NotFound, Store
from agl.dashboard import pages

#: The dashboard's page routes (all ``GET``), for the auth tests and the docs.
PAGE_ROUTES = (
    "/",
    "/rollouts",
    "/rollouts/{rollout_id}",
    "/rollouts/{rollout_id}/spans/{span_id}",
    "/curves",
    "/resources",
    "/failures",
    "/assets/{name}",
)
#: Files under ``agl/dashboard/static`` served at ``/assets/{name}`` (a fixed list: nothing else is readable).
ASSETS = {"style.css": "text/css; charset=utf-8", "live.js": "text/javascript; charset=utf-8"}


@functools.cache
def _templates() -> Any:
    """The Jinja2 environment, built on first use (``import agl`` never imports Jinja2)."""
    import jinja2

    from agl.dashboard import filters

    env = jinja2.Environment(
        loader=jinja2.PackageLoader("agl.dashboard", "templates"),
        autoescape=jinja2.select_autoescape(["html"]),
        undefined=jinja2.StrictUndefined,
    )
    env.filters.update(filters.FILTERS)
    return env


@functools.cache
def _asset(name: str) -> bytes:
    return package_files.files("agl.dashboard").joinpath("static", name).read_bytes()


def _page(template: str, context: dict[str, Any], status: int = 200) -> HTMLResponse:
    rendered = _templates().get_template(template).render(**context)
    return HTMLResponse(rendered, status_code=status, headers=PAGE_HEADERS)


async def _render(request: Request, template: str, build: Callable[[], dict[str, Any]]) -> HTMLResponse:
    """Build a page's context in the threadpool (store reads block) and render it; a bad parameter is a 400 page,
    an unknown id a 404 page, both saying what was wrong."""
    try:
        context = await run_in_threadpool(build)
    except pages.PageError as exc:
        return _page("error.html", {"message": str(exc), "path": request.url.path}, 400)
    except NotFound as exc:
        return _page("error.html", {"message": str(exc), "path": request.url.path}, 404)
    return _page(template, {**context, "path": request.url.path})


def _opt(value: str | None) -> str | None:
    return value or None


def add_dashboard(app: FastAPI, store: Store) -> None:
    """Add the dashboard's pages (``PAGE_ROUTES``) to ``app``, reading ``store``."""
    failures_seen = pages.FailureCache()

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    async def runs(request: Request) -> HTMLResponse:
        return await _render(request, "runs.html", lambda: pages.runs_page(store))

    @app.get("/rollouts", response_class=HTMLResponse, include_in_schema=False)
    async def rollouts(
        request: Request,
        status: str | None = None,
        mode: str | None = None,
        agent: str | None = None,
        run: str | None = None,
        page: int = 0,
    ) -> HTMLResponse:
        if status and status not in ("queued", "running", "succeeded", "failed", "cancelled"):
            return _page("error.html", {"message": f"status: unknown status {status!r}", "path": "/rollouts"}, 400)
        if mode and mode not in ("train", "val", "test"):
            return _page("error.html", {"message": f"mode: unknown mode {mode!r}", "path": "/rollouts"}, 400)
        return await _render(
            request,
            "rollouts.html",
            lambda: pages.rollouts_page(store, _opt(status), _opt(mode), _opt(agent), _opt(run), page),
        )

    @app.get("/rollouts/{rollout_id}", response_class=HTMLResponse, include_in_schema=False)
    async def rollout(
        request: Request, rollout_id: str, attempt: str | None = None, agents: str | None = None
    ) -> HTMLResponse:
        return await _render(
            request, "rollout.html", lambda: pages.rollout_page(store, rollout_id, _opt(attempt), _opt(agents))
        )

    @app.get("/rollouts/{rollout_id}/spans/{span_id}", response_class=HTMLResponse, include_in_schema=False)
    async def span(request: Request, rollout_id: str, span_id: str) -> HTMLResponse:
        return await _render(request, "span.html", lambda: pages.span_page(store, rollout_id, span_id))

    @app.get("/curves", response_class=HTMLResponse, include_in_schema=False)
    async def curves(request: Request) -> HTMLResponse:
        return await _render(request, "curves.html", lambda: pages.curves_page(store))

    @app.get("/resources", response_class=HTMLResponse, include_in_schema=False)
    async def resources(request: Request, a: int | None = None, b: int | None = None, page: int = 0) -> HTMLResponse:
        return await _render(request, "resources.html", lambda: pages.resources_page(store, a, b, page))

    @app.get("/failures", response_class=HTMLResponse, include_in_schema=False)
    async def failures(request: Request) -> HTMLResponse:
        return await _render(request, "failures.html", lambda: pages.failures_page(store, failures_seen))

    @app.get("/assets/{name}", include_in_schema=False)
    def asset(name: str) -> Response:
        if name not in ASSETS:
            return Response(f"no asset {name!r}", status_code=404, media_type="text/plain", headers=PAGE_HEADERS)
        headers = {**PAGE_HEADERS, "cache-control": "max-age=3600"}
        return Response(_asset(name), media_type=ASSETS[name], headers=headers)


def create_dashboard_app(store: Store, host_names: Sequence[str] | None = None) -> FastAPI:
    """The dashboard alone over ``store`` (``agl dashboard``): the pages, no store API, no gateway. With
    ``host_names`` the Host header must name loopback or one of them (``agl.core.server.auth.HostGuard``)."""
    app = FastAPI(title="agl dashboard", docs_url=None, redoc_url=None, openapi_url=None)
    add_dashboard(app, store)
    if host_names is not None:
        install_host_guard(app, host_names)
    return app
