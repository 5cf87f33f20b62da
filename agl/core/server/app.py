"""The routes: the Store API under ``/api`` and the LLM gateway under ``/gw``, as one ASGI app over a store.

Concurrency model: one asyncio event loop (uvicorn) serves every request; synchronous store calls run in the
threadpool (the store is thread-safe and serialises its own writes); gateway spans go to the store through one
``SpanPipeline`` in group-commit mode, and each gateway answer waits for its span to be durable (see
``agl.core.server.gateway``). ``complete_attempt`` and ``wait`` flush the pipeline before they answer, so a rollout is
never reported finished before its spans are stored. Spans posted to ``/api/spans`` are written before the response.

Every JSON body is parsed strictly against the model the OpenAPI schema shows (``errors.parse_body``), so what the
schema does not allow changes nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Sequence
from contextlib import asynccontextmanager
from typing import Annotated, Any, Literal, cast

from fastapi import FastAPI, Path, Query, Request
from fastapi.responses import Response
from fastapi.routing import APIRoute
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException

from agl.core import routes
from agl.core.jsonsafe import INT64_MAX, INT64_MIN
from agl.core.server.auth import (
    OPEN_KEY,
    Tokens,
    attempt_of_request,
    install_auth,
    install_host_guard,
    keep_secrets,
    redact,
)
from agl.core.server.errors import ErrorOut, install, parse_body, read_body
from agl.core.server.gateway import DEFAULT_MAX_RESPONSE_BYTES, Gateway
from agl.core.span_pipeline import SpanPipeline
from agl.core.store.base import MAX_CANCEL_REASON, Store
from agl.core.types import (
    MAX_BODY_LIST,
    Attempt,
    AttemptStatus,
    Record,
    Resource,
    ResourceSet,
    Rollout,
    RolloutRequest,
    Span,
    path_safe_id,
)

#: The longest one ``/api/rollouts/wait`` request blocks; clients loop for longer waits.
MAX_WAIT_S = 30.0
#: The shortest poll interval of ``/api/rollouts/wait`` (a shorter one would only keep the store busy).
MIN_POLL_S = 0.01
#: ``GET /api/spans``: spans per page when no ``limit`` is given, and the most one page may hold.
SPANS_PAGE = 1000
MAX_SPANS_PAGE = 10_000

_REF = "#/components/schemas/{model}"
#: A waiting lease looks at the store again at least this often (then less often, up to ``LEASE_POLL_MAX_S``) for
#: rollouts queued by other processes; rollouts queued through this server's store wake it at once.
LEASE_POLL_MIN_S = 0.05
LEASE_POLL_MAX_S = 0.5


class Wakeups:
    """The store's change notifications (``Store.events``) as wake-ups on the server's event loop, so a waiting
    request neither holds a thread nor polls the store in a tight loop; and the server's draining flag."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.draining = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._events: dict[str, asyncio.Event] = {"queued": asyncio.Event(), "finished": asyncio.Event()}
        self._unsubscribe: Callable[[], None] | None = None

    def start(self) -> None:
        """Subscribe (from the server's event loop, at startup)."""
        self._loop = asyncio.get_running_loop()
        self._unsubscribe = self.store.events.subscribe(self._notified)

    def stop(self) -> None:
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None
        self._loop = None

    def _notified(self, event: str) -> None:
        loop = self._loop
        if loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                loop.call_soon_threadsafe(self._wake, event)

    def _wake(self, event: str) -> None:
        fired, self._events[event] = self._events[event], asyncio.Event()
        fired.set()

    def current(self, event: str) -> asyncio.Event:
        """The event set at the next notification of ``event`` (take it before looking at the store)."""
        return self._events[event]

    async def wait(self, event: asyncio.Event, timeout: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(event.wait(), max(0.0, timeout))

    def drain(self, on: bool = True) -> None:
        """Lease nothing from now on, and answer waiting leases at once (their runners are being stopped);
        ``on=False`` leases again."""
        self.draining = on
        loop = self._loop
        if on and loop is not None:
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(self._wake, "queued")


# ------------------------------------------------------------------------------------------------- API models


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class EnqueueBody(_Body):
    requests: list[RolloutRequest] = Field(max_length=MAX_BODY_LIST)


class LeaseBody(_Body):
    worker_id: str = Field(min_length=1, max_length=256)
    wait: float = Field(
        default=0.0,
        ge=0,
        le=MAX_WAIT_S,
        description="Seconds to wait for a rollout to be queued when none is (answered at once when one is).",
    )


class Leased(_Body):
    rollout: Rollout
    attempt: Attempt
    attempt_key: str = Field(
        description="The key the attempt's agent sends the gateway as its bearer token (its LLM api_key)."
    )


class CompleteBody(_Body):
    status: AttemptStatus
    final_reward: float | None = None
    error: str | None = None


class RolloutIdsBody(_Body):
    rollout_ids: list[str] = Field(max_length=MAX_BODY_LIST)


class CancelBody(_Body):
    rollout_ids: list[str] = Field(max_length=MAX_BODY_LIST)
    reason: str | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_CANCEL_REASON,
        description="Why they are cancelled: kept as each rollout's error (the failure taxonomy reports it).",
    )


class WaitBody(_Body):
    rollout_ids: list[str]
    timeout: float = Field(ge=0, description=f"Seconds to block; the server caps one request at {MAX_WAIT_S:g}s.")
    poll: float = Field(default=0.05, ge=MIN_POLL_S, le=5, description="Seconds between checks of the store.")


class PublishBody(_Body):
    resources: dict[str, Resource]


class Ok(_Body):
    ok: bool


class Count(_Body):
    count: int


class SettingsOut(_Body):
    heartbeat_timeout: float
    attempt_timeout: float


class Health(_Body):
    status: Literal["ok"] = "ok"


_SPANS = TypeAdapter(list[Span])
_SPANS_IN = TypeAdapter(Annotated[list[Span], Field(max_length=MAX_BODY_LIST)])
_ROLLOUTS = TypeAdapter(list[Rollout])
_ENQUEUE = TypeAdapter(EnqueueBody)
_LEASE = TypeAdapter(LeaseBody)
_COMPLETE = TypeAdapter(CompleteBody)
_IDS = TypeAdapter(RolloutIdsBody)
_CANCEL = TypeAdapter(CancelBody)
_WAIT = TypeAdapter(WaitBody)
_PUBLISH = TypeAdapter(PublishBody)
_RECORD = TypeAdapter(Record)


class _BodySchemas:
    """OpenAPI ``requestBody`` entries for routes that parse their own body, and the components they refer to."""

    def __init__(self) -> None:
        self.components: dict[str, Any] = {}

    def __call__(self, adapter: TypeAdapter[Any]) -> dict[str, Any]:
        schema = adapter.json_schema(ref_template=_REF)
        self.components.update(schema.pop("$defs", {}))
        if schema.get("type") == "object" and "title" in schema:
            self.components[schema["title"]] = schema
            schema = {"$ref": _REF.format(model=schema["title"])}
        return {"requestBody": {"required": True, "content": {"application/json": {"schema": schema}}}}


class PlainRoute(APIRoute):
    """A route whose endpoint is called with the request and its path parameters as strings, and answers itself.

    FastAPI's own handler solves the endpoint's dependencies and validates a body model on every call (about 0.1 ms
    of CPU, measured); the gateway's routes read their body themselves, so they skip that (FastAPI's documented
    extension point, ``route_class``). The declaration still describes the route in the OpenAPI schema.
    """

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        endpoint = self.endpoint

        async def handle(request: Request) -> Response:
            return cast(Response, await endpoint(request, **request.path_params))

        return handle


# ------------------------------------------------------------------------------------------------- the app


def create_app(
    store: Store,
    *,
    max_body_bytes: int = 64 * 2**20,
    gateway_timeout: float = 600.0,
    allow_backends: Sequence[str] | None = None,
    gateway_max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
    tokens: Tokens | None = None,
    pages: Callable[[FastAPI, Store], None] | None = None,
    host_names: Sequence[str] | None = None,
) -> FastAPI:
    """The agl server as an ASGI app over ``store``; ``pages(app, store)`` adds read-only pages at ``/`` (the
    dashboard's ``agl.dashboard.add_dashboard``, handed in from above: core never imports the dashboard).

    ``max_body_bytes`` bounds every request body; ``gateway_timeout`` bounds one LLM backend call (a non-streaming
    one as a whole, a stream per read) and ``gateway_max_response_bytes`` one backend answer; with ``allow_backends``
    (patterns, see ``agl.core.server.backends.BackendPattern``) only LLM resources whose ``base_url`` matches one are
    published and called (an empty list allows none). The app owns the
    gateway's ``SpanPipeline`` (``app.state.span_pipeline``) and the ``Gateway`` (``app.state.gateway``), closed at
    shutdown. With ``tokens`` every request needs a bearer token of a role allowed on its route (see
    ``agl.core.server.auth``); without, the app is open. Either way ``LLM`` API keys are redacted from every answer.
    With ``host_names`` (a server bound to loopback) a request whose Host header names neither loopback nor one of
    them is refused (``agl.core.server.auth.HostGuard``).
    """
    spans = SpanPipeline(store, interval=0.0, block=0.0, name="agl-gateway-spans")
    gateway = Gateway(
        store,
        spans,
        gateway_timeout,
        allow_backends=allow_backends,
        max_response_bytes=gateway_max_response_bytes,
    )
    bodies = _BodySchemas()
    wakeups = Wakeups(store)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        wakeups.start()
        try:
            yield
        finally:
            wakeups.stop()
            await gateway.aclose()
            await run_in_threadpool(spans.close)

    app = FastAPI(
        title="agl server",
        description="Store API (rollouts, attempts, spans, resources, records) and OpenAI-compatible LLM gateway.",
        lifespan=lifespan,
        separate_input_output_schemas=False,
        responses={
            status: {"model": ErrorOut}
            for status in (400, *((401, 403) if tokens is not None else ()), 404, 409, 413, 415, 422, 500)
        },
    )
    app.state.store = store
    app.state.span_pipeline = spans
    app.state.gateway = gateway
    app.state.wakeups = wakeups
    install(app, max_body_bytes)
    if tokens is not None:
        install_auth(app, tokens)
    if host_names is not None:
        install_host_guard(app, host_names)

    # gateway (first: its calls are the hot path, and routes are matched in order) ---------------------------
    gw = "/gw/{rollout_id}/{attempt_id}/{resource_name}/v1"

    chat_body = {
        "type": "object",
        "description": "An OpenAI chat completion request, forwarded as it is plus (LLM.token_ids) the fields that "
        "ask the backend for token ids: return_token_ids, and logprobs unless the request sets it.",
    }

    async def chat_completions(request: Request, rollout_id: str, attempt_id: str, resource_name: str) -> Response:
        """OpenAI chat completions (streaming or not) forwarded to the rollout's LLM resource, recorded as a span."""
        return await gateway.chat(request, rollout_id, attempt_id, resource_name)

    async def models(request: Request, rollout_id: str, attempt_id: str, resource_name: str) -> Response:
        return await gateway.models(rollout_id, attempt_id, resource_name)

    app.router.add_api_route(
        gw + "/chat/completions",
        chat_completions,
        methods=["POST"],
        tags=["gateway"],
        openapi_extra={"requestBody": {"required": True, "content": {"application/json": {"schema": chat_body}}}},
        route_class_override=PlainRoute,
    )
    app.router.add_api_route(gw + "/models", models, methods=["GET"], tags=["gateway"], route_class_override=PlainRoute)

    @app.get("/health")
    def health() -> Health:
        return Health()

    @app.get(routes.SETTINGS.path)
    def settings() -> SettingsOut:
        return SettingsOut(
            heartbeat_timeout=store.settings.heartbeat_timeout, attempt_timeout=store.settings.attempt_timeout
        )

    # rollouts ---------------------------------------------------------------------------------------------
    @app.post(routes.ENQUEUE.path, openapi_extra=bodies(_ENQUEUE))
    async def enqueue(request: Request) -> list[Rollout]:
        body = parse_body(await read_body(request), _ENQUEUE)
        return await run_in_threadpool(store.enqueue, body.requests)

    @app.post(routes.LEASE.path, openapi_extra=bodies(_LEASE))
    async def lease(request: Request) -> Leased | None:
        body = parse_body(await read_body(request), _LEASE)
        deadline = time.monotonic() + body.wait
        pause = LEASE_POLL_MIN_S
        got_one_look = False
        while True:
            if wakeups.draining or (got_one_look and await request.is_disconnected()):
                return None  # a runner being stopped, or one gone (a rollout leased to it would wait to be reaped)
            got_one_look = True
            queued = wakeups.current("queued")
            got = await run_in_threadpool(store.lease, body.worker_id)
            left = deadline - time.monotonic()
            if got is not None or left <= 0:
                break
            await wakeups.wait(queued, min(pause, left))
            pause = min(2 * pause, LEASE_POLL_MAX_S)
        if got is None:
            return None
        rollout, attempt = got
        key = OPEN_KEY if tokens is None else tokens.attempt_key(rollout.rollout_id, attempt.attempt_id)
        return Leased(rollout=rollout, attempt=attempt, attempt_key=key)

    @app.post(routes.HEARTBEAT.path)
    def heartbeat(attempt_id: str) -> Ok:
        return Ok(ok=store.heartbeat(attempt_id))

    @app.post(routes.COMPLETE.path, openapi_extra=bodies(_COMPLETE))
    async def complete_attempt(attempt_id: str, request: Request) -> Ok:
        body = parse_body(await read_body(request), _COMPLETE)

        def complete() -> bool:
            spans.flush()
            return store.complete_attempt(attempt_id, body.status, body.final_reward, body.error)

        return Ok(ok=await run_in_threadpool(complete))

    @app.get(routes.LIST_ROLLOUTS.path)
    def list_rollouts(
        status: str | None = None,
        mode: str | None = None,
        limit: int = Query(100, ge=0, le=100_000),
        offset: int = Query(0, ge=0, le=INT64_MAX),
    ) -> list[Rollout]:
        return store.list_rollouts(status=status, mode=mode, limit=limit, offset=offset)

    @app.get(routes.GET_ROLLOUT.path)
    def get_rollout(rollout_id: str) -> Rollout:
        return store.get_rollout(rollout_id)

    @app.post(routes.GET_ROLLOUTS.path, openapi_extra=bodies(_IDS))
    async def get_rollouts(request: Request) -> list[Rollout]:
        body = parse_body(await read_body(request), _IDS)
        return await run_in_threadpool(store.get_rollouts, body.rollout_ids)

    @app.get(routes.LIST_ATTEMPTS.path)
    def list_attempts(rollout_id: str) -> list[Attempt]:
        return store.list_attempts(rollout_id)

    @app.post(routes.CANCEL.path, openapi_extra=bodies(_CANCEL))
    async def cancel(request: Request) -> Count:
        body = parse_body(await read_body(request), _CANCEL)
        return Count(count=await run_in_threadpool(store.cancel, body.rollout_ids, body.reason))

    @app.post(routes.REAP.path)
    def reap() -> Count:
        return Count(count=store.reap())

    @app.post(routes.WAIT.path, response_model=list[Rollout], openapi_extra=bodies(_WAIT))
    async def wait(request: Request) -> Response:
        """Block up to ``min(timeout, MAX_WAIT_S)`` seconds without holding a thread; polls the store."""
        body = parse_body(await read_body(request), _WAIT)
        await run_in_threadpool(spans.flush)
        deadline = time.monotonic() + min(body.timeout, MAX_WAIT_S)
        while True:
            finished = wakeups.current("finished")
            rollouts = await run_in_threadpool(store.wait, body.rollout_ids, 0.0, body.poll)
            if all(r.finished for r in rollouts) or time.monotonic() >= deadline:
                return Response(_ROLLOUTS.dump_json(rollouts), media_type="application/json")
            await wakeups.wait(finished, min(body.poll, deadline - time.monotonic()))

    # spans ------------------------------------------------------------------------------------------------
    @app.post(routes.ADD_SPANS.path, response_model=Count, openapi_extra=bodies(_SPANS_IN))
    async def add_spans(request: Request) -> Count:
        """Store a JSON list of spans atomically (idempotent on ``span_id``); one bad span stores none of them."""
        raw = await read_body(request)
        own = attempt_of_request(request.scope)

        def ingest() -> int:
            received: list[Span] = parse_body(raw, _SPANS_IN, root="spans")
            for i, span in enumerate(received):
                try:
                    path_safe_id(span.span_id)
                except ValueError as exc:
                    raise HTTPException(422, f"spans[{i}].span_id: {exc}") from None
                if own is not None and (span.rollout_id, span.attempt_id) != own:
                    raise HTTPException(
                        403,
                        f"spans[{i}]: an attempt's key writes spans of that attempt only (rollout {own[0]!r}, "
                        f"attempt {own[1]!r}), not of rollout {span.rollout_id!r}, attempt {span.attempt_id!r}",
                    )
            return store.add_spans(received)

        return Count(count=await run_in_threadpool(ingest))

    @app.get(routes.QUERY_SPANS.path, response_model=list[Span])
    def query_spans(
        rollout_id: str | None = None,
        attempt_id: str | None = None,
        kind: str | None = None,
        agent: str | None = None,
        limit: int = Query(SPANS_PAGE, ge=0, le=MAX_SPANS_PAGE, description="Spans in this page."),
        offset: int = Query(0, ge=0, le=INT64_MAX, description="Matching spans to skip (arrival order)."),
    ) -> Response:
        """Matching spans in arrival order, one page at a time: a page shorter than ``limit`` is the last; the next
        page starts at ``offset + limit`` (header ``x-agl-next-offset`` when this page is full). Spans are only ever
        appended, so paging reads each span exactly once."""
        found = store.query_spans(
            rollout_id=rollout_id, attempt_id=attempt_id, kind=kind, agent=agent, limit=limit, offset=offset
        )
        headers = {"x-agl-next-offset": str(offset + limit)} if limit and len(found) == limit else None
        return Response(_SPANS.dump_json(found), media_type="application/json", headers=headers)

    # resources and records --------------------------------------------------------------------------------
    @app.post(routes.PUBLISH.path, openapi_extra=bodies(_PUBLISH))
    async def publish_resources(request: Request) -> ResourceSet:
        body = parse_body(await read_body(request), _PUBLISH)
        gateway.check_backends(body.resources)

        def publish() -> ResourceSet:
            return redact(store.publish_resources(keep_secrets(store, body.resources)))

        return await run_in_threadpool(publish)

    @app.get(routes.LATEST_RESOURCES.path)
    def latest_resources() -> ResourceSet:
        return redact(store.get_resources(None))

    @app.get(routes.GET_RESOURCES.path)
    def get_resources(version: int = Path(ge=INT64_MIN, le=INT64_MAX)) -> ResourceSet:
        return redact(store.get_resources(version))

    @app.post(routes.ADD_RECORD.path, openapi_extra=bodies(_RECORD))
    async def add_record(request: Request) -> Ok:
        record = parse_body(await read_body(request), _RECORD)
        await run_in_threadpool(store.add_record, record)
        return Ok(ok=True)

    @app.get(routes.LIST_RECORDS.path)
    def list_records(kind: str, key: str | None = None) -> list[Record]:
        return store.list_records(kind, key)

    if pages is not None:  # read-only pages at "/" (GET routes: the reader role may call them, see auth.ROUTE_ROLES)
        pages(app, store)

    default_openapi = app.openapi

    def openapi() -> dict[str, Any]:
        """FastAPI's schema plus the models of the bodies the routes parse themselves."""
        if app.openapi_schema is None:
            schema = default_openapi()
            known = schema.setdefault("components", {}).setdefault("schemas", {})
            for name, component in bodies.components.items():
                known.setdefault(name, component)
        return app.openapi_schema or default_openapi()

    app.openapi = openapi  # type: ignore[method-assign]
    return app
