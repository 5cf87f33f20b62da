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
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, Literal

from fastapi import FastAPI, Path, Query, Request
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter
from starlette.concurrency import run_in_threadpool

from agl.core.jsonsafe import INT64_MAX, INT64_MIN
from agl.core.server.errors import ErrorOut, install, parse_body, read_body
from agl.core.server.gateway import Gateway
from agl.core.span_pipeline import SpanPipeline
from agl.core.store.base import Store
from agl.core.types import (
    Attempt,
    AttemptStatus,
    Record,
    Resource,
    ResourceSet,
    Rollout,
    RolloutRequest,
    Span,
)

#: The longest one ``/api/rollouts/wait`` request blocks; clients loop for longer waits.
MAX_WAIT_S = 30.0

_REF = "#/components/schemas/{model}"


# ------------------------------------------------------------------------------------------------- API models


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class EnqueueBody(_Body):
    requests: list[RolloutRequest]


class LeaseBody(_Body):
    worker_id: str = Field(min_length=1, max_length=256)


class Leased(_Body):
    rollout: Rollout
    attempt: Attempt


class CompleteBody(_Body):
    status: AttemptStatus
    final_reward: float | None = None
    error: str | None = None


class RolloutIdsBody(_Body):
    rollout_ids: list[str]


class WaitBody(_Body):
    rollout_ids: list[str]
    timeout: float = Field(ge=0, description=f"Seconds to block; the server caps one request at {MAX_WAIT_S:g}s.")
    poll: float = Field(default=0.05, gt=0, le=5)


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
_ROLLOUTS = TypeAdapter(list[Rollout])
_ENQUEUE = TypeAdapter(EnqueueBody)
_LEASE = TypeAdapter(LeaseBody)
_COMPLETE = TypeAdapter(CompleteBody)
_IDS = TypeAdapter(RolloutIdsBody)
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


# ------------------------------------------------------------------------------------------------- the app


def create_app(store: Store, *, max_body_bytes: int = 64 * 2**20, gateway_timeout: float = 600.0) -> FastAPI:
    """The agl server as an ASGI app over ``store``.

    ``max_body_bytes`` bounds every request body; ``gateway_timeout`` bounds one LLM backend call. The app owns the
    gateway's ``SpanPipeline`` (``app.state.span_pipeline``) and the ``Gateway`` (``app.state.gateway``), closed at
    shutdown.
    """
    spans = SpanPipeline(store, interval=0.0, block=0.0, name="agl-gateway-spans")
    gateway = Gateway(store, spans, gateway_timeout)
    bodies = _BodySchemas()

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        await gateway.aclose()
        await run_in_threadpool(spans.close)

    app = FastAPI(
        title="agl server",
        description="Store API (rollouts, attempts, spans, resources, records) and OpenAI-compatible LLM gateway.",
        lifespan=lifespan,
        separate_input_output_schemas=False,
        responses={status: {"model": ErrorOut} for status in (400, 404, 409, 413, 415, 422, 500)},
    )
    app.state.store = store
    app.state.span_pipeline = spans
    app.state.gateway = gateway
    install(app, max_body_bytes)

    @app.get("/health")
    def health() -> Health:
        return Health()

    @app.get("/api/settings")
    def settings() -> SettingsOut:
        return SettingsOut(
            heartbeat_timeout=store.settings.heartbeat_timeout, attempt_timeout=store.settings.attempt_timeout
        )

    # rollouts ---------------------------------------------------------------------------------------------
    @app.post("/api/rollouts/enqueue", openapi_extra=bodies(_ENQUEUE))
    async def enqueue(request: Request) -> list[Rollout]:
        body = parse_body(await read_body(request), _ENQUEUE)
        return await run_in_threadpool(store.enqueue, body.requests)

    @app.post("/api/lease", openapi_extra=bodies(_LEASE))
    async def lease(request: Request) -> Leased | None:
        body = parse_body(await read_body(request), _LEASE)
        got = await run_in_threadpool(store.lease, body.worker_id)
        return None if got is None else Leased(rollout=got[0], attempt=got[1])

    @app.post("/api/attempts/{attempt_id}/heartbeat")
    def heartbeat(attempt_id: str) -> Ok:
        return Ok(ok=store.heartbeat(attempt_id))

    @app.post("/api/attempts/{attempt_id}/complete", openapi_extra=bodies(_COMPLETE))
    async def complete_attempt(attempt_id: str, request: Request) -> Ok:
        body = parse_body(await read_body(request), _COMPLETE)

        def complete() -> bool:
            spans.flush()
            return store.complete_attempt(attempt_id, body.status, body.final_reward, body.error)

        return Ok(ok=await run_in_threadpool(complete))

    @app.get("/api/rollouts")
    def list_rollouts(
        status: str | None = None,
        mode: str | None = None,
        limit: int = Query(100, ge=0, le=100_000),
        offset: int = Query(0, ge=0, le=INT64_MAX),
    ) -> list[Rollout]:
        return store.list_rollouts(status=status, mode=mode, limit=limit, offset=offset)

    @app.get("/api/rollouts/{rollout_id}")
    def get_rollout(rollout_id: str) -> Rollout:
        return store.get_rollout(rollout_id)

    @app.post("/api/rollouts/get", openapi_extra=bodies(_IDS))
    async def get_rollouts(request: Request) -> list[Rollout]:
        body = parse_body(await read_body(request), _IDS)
        return await run_in_threadpool(store.get_rollouts, body.rollout_ids)

    @app.get("/api/rollouts/{rollout_id}/attempts")
    def list_attempts(rollout_id: str) -> list[Attempt]:
        return store.list_attempts(rollout_id)

    @app.post("/api/rollouts/cancel", openapi_extra=bodies(_IDS))
    async def cancel(request: Request) -> Count:
        body = parse_body(await read_body(request), _IDS)
        return Count(count=await run_in_threadpool(store.cancel, body.rollout_ids))

    @app.post("/api/reap")
    def reap() -> Count:
        return Count(count=store.reap())

    @app.post("/api/rollouts/wait", response_model=list[Rollout], openapi_extra=bodies(_WAIT))
    async def wait(request: Request) -> Response:
        """Block up to ``min(timeout, MAX_WAIT_S)`` seconds without holding a thread; polls the store."""
        body = parse_body(await read_body(request), _WAIT)
        await run_in_threadpool(spans.flush)
        deadline = time.monotonic() + min(body.timeout, MAX_WAIT_S)
        while True:
            rollouts = await run_in_threadpool(store.wait, body.rollout_ids, 0.0, body.poll)
            if all(r.finished for r in rollouts) or time.monotonic() >= deadline:
                return Response(_ROLLOUTS.dump_json(rollouts), media_type="application/json")
            await asyncio.sleep(min(body.poll, max(0.0, deadline - time.monotonic())))

    # spans ------------------------------------------------------------------------------------------------
    @app.post("/api/spans", response_model=Count, openapi_extra=bodies(_SPANS))
    async def add_spans(request: Request) -> Count:
        """Store a JSON list of spans atomically (idempotent on ``span_id``); one bad span stores none of them."""
        raw = await read_body(request)

        def ingest() -> int:
            received: list[Span] = parse_body(raw, _SPANS, root="spans")
            return store.add_spans(received)

        return Count(count=await run_in_threadpool(ingest))

    @app.get("/api/spans", response_model=list[Span])
    def query_spans(
        rollout_id: str | None = None,
        attempt_id: str | None = None,
        kind: str | None = None,
        agent: str | None = None,
        limit: int | None = Query(None, ge=0, le=INT64_MAX),
    ) -> Response:
        found = store.query_spans(rollout_id=rollout_id, attempt_id=attempt_id, kind=kind, agent=agent, limit=limit)
        return Response(_SPANS.dump_json(found), media_type="application/json")

    # resources and records --------------------------------------------------------------------------------
    @app.post("/api/resources", openapi_extra=bodies(_PUBLISH))
    async def publish_resources(request: Request) -> ResourceSet:
        body = parse_body(await read_body(request), _PUBLISH)
        return await run_in_threadpool(store.publish_resources, body.resources)

    @app.get("/api/resources/latest")
    def latest_resources() -> ResourceSet:
        return store.get_resources(None)

    @app.get("/api/resources/{version}")
    def get_resources(version: int = Path(ge=INT64_MIN, le=INT64_MAX)) -> ResourceSet:
        return store.get_resources(version)

    @app.post("/api/records", openapi_extra=bodies(_RECORD))
    async def add_record(request: Request) -> Ok:
        record = parse_body(await read_body(request), _RECORD)
        await run_in_threadpool(store.add_record, record)
        return Ok(ok=True)

    @app.get("/api/records")
    def list_records(kind: str, key: str | None = None) -> list[Record]:
        return store.list_records(kind, key)

    # gateway ----------------------------------------------------------------------------------------------
    gw = "/gw/{rollout_id}/{attempt_id}/{resource_name}/v1"

    chat_body = {
        "type": "object",
        "description": "An OpenAI chat completion request, forwarded with return_token_ids and logprobs set.",
    }

    @app.post(
        gw + "/chat/completions",
        tags=["gateway"],
        openapi_extra={"requestBody": {"required": True, "content": {"application/json": {"schema": chat_body}}}},
    )
    async def chat_completions(request: Request, rollout_id: str, attempt_id: str, resource_name: str) -> Response:
        """OpenAI chat completions (streaming or not) forwarded to the rollout's LLM resource, recorded as a span."""
        return await gateway.chat(request, rollout_id, attempt_id, resource_name)

    @app.get(gw + "/models", tags=["gateway"])
    async def models(rollout_id: str, attempt_id: str, resource_name: str) -> Response:
        return await gateway.models(rollout_id, resource_name)

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
