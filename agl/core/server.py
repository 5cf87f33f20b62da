"""The agl HTTP server: the Store API under ``/api`` and an OpenAI-compatible LLM gateway under ``/gw``.

Concurrency model: one asyncio event loop (uvicorn) serves every request; synchronous store calls run in the
threadpool (the store is thread-safe and serialises its own writes); the gateway streams through one shared
``httpx.AsyncClient``; gateway spans go to the store through one background ``SpanWriter`` thread, which is flushed
before ``complete_attempt`` and ``wait`` answer, so a rollout is never reported finished before its spans are durable.
Spans posted to ``/api/spans`` are written before the response, so an acknowledged batch survives a restart.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import threading
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from contextlib import asynccontextmanager
from typing import Any, Literal
from urllib.parse import unquote

import httpx
import uvicorn
from fastapi import FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException

from agl.core.store.base import NotFound, Store, StoreError
from agl.core.types import (
    ATTR_CALL_ID,
    ATTR_FINISH_REASONS,
    ATTR_INPUT_MESSAGES,
    ATTR_INPUT_TOKENS,
    ATTR_LOGPROBS,
    ATTR_MODEL,
    ATTR_OUTPUT_MESSAGES,
    ATTR_OUTPUT_TOKENS,
    ATTR_PROMPT_IDS,
    ATTR_RESOURCE,
    ATTR_RESPONSE_IDS,
    ATTR_TOOLS,
    ATTR_WEIGHTS_VERSION,
    HEADER_AGENT,
    HEADER_CALL_ID,
    HEADER_PARENT_SPAN,
    LLM,
    Attempt,
    AttemptStatus,
    Record,
    Resource,
    ResourceSet,
    Rollout,
    RolloutRequest,
    Span,
)

log = logging.getLogger(__name__)

#: Span attributes the gateway writes besides the ``ATTR_*`` keys of ``agl.core.types``.
ATTR_STREAM = "agl.stream"
ATTR_BACKEND_URL = "agl.backend_url"
ATTR_ERROR_MESSAGE = "error.message"
ATTR_HTTP_STATUS = "http.status_code"

#: The longest one ``/api/rollouts/wait`` request blocks; clients loop for longer waits.
MAX_WAIT_S = 30.0

_SPANS = TypeAdapter(list[Span])
_ROLLOUTS = TypeAdapter(list[Rollout])


# ------------------------------------------------------------------------------------------------- API models


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


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


class ErrorOut(_Body):
    error: str


# ------------------------------------------------------------------------------------------------- span writer


class SpanWriter:
    """Writes spans to the store in batches from one background thread.

    ``put`` never blocks on the store; the thread writes whatever is pending every ``interval`` seconds, or at once
    when ``max_batch`` spans are waiting or someone calls ``flush``. ``flush`` returns once every span put before the
    call is stored; ``close`` flushes and stops the thread.
    """

    def __init__(self, store: Store, *, max_batch: int = 256, interval: float = 0.05, retries: int = 3) -> None:
        self._store = store
        self._max_batch = max_batch
        self._interval = interval
        self._retries = retries
        self._cond = threading.Condition()
        self._pending: list[Span] = []
        self._submitted = 0
        self._done = 0
        self._flush_asked = False
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="agl-span-writer", daemon=True)
        self._thread.start()

    def put(self, span: Span) -> None:
        with self._cond:
            if self._closed:  # a straggler after shutdown: write it through rather than lose it
                self._write([span])
                return
            self._pending.append(span)
            self._submitted += 1
            if len(self._pending) >= self._max_batch:
                self._cond.notify_all()

    def flush(self, timeout: float = 60.0) -> bool:
        """Block until every span put so far is stored (or dropped after failed retries); False on timeout."""
        with self._cond:
            target = self._submitted
            self._flush_asked = True
            self._cond.notify_all()
            return self._cond.wait_for(lambda: self._done >= target, timeout)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join()

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._closed or bool(self._pending))
                self._cond.wait_for(
                    lambda: self._closed or self._flush_asked or len(self._pending) >= self._max_batch,
                    self._interval,
                )
                batch, self._pending = self._pending, []
                self._flush_asked = False
                closed = self._closed
            if batch:
                self._write(batch)
            with self._cond:
                self._done += len(batch)
                self._cond.notify_all()
            if closed and not batch:
                return

    def _write(self, batch: list[Span]) -> None:
        for attempt in range(self._retries):
            try:
                self._store.add_spans(batch)
                return
            except Exception:
                if attempt == self._retries - 1:
                    log.exception(
                        "agl span writer: dropped %d gateway spans after %d failed writes", len(batch), self._retries
                    )
                    return
                time.sleep(0.1 * 2**attempt)


# ------------------------------------------------------------------------------------------------- errors


def _where(loc: tuple[int | str, ...] | list[int | str], root: str = "") -> str:
    """``("body", "spans", 3, "kind")`` → ``spans[3].kind``; query/path parameters are named as such."""
    parts = list(loc)
    label = ""
    if parts and parts[0] in ("query", "path", "header"):
        label = f"{parts.pop(0)} parameter "
    elif parts and parts[0] == "body":
        parts.pop(0)
    text = root
    for p in parts:
        text += f"[{p}]" if isinstance(p, int) else (f".{p}" if text else str(p))
    return label + (text or "body")


def format_validation_errors(errors: list[Any], root: str = "") -> tuple[int, str]:
    """Turn pydantic/FastAPI errors into (status, one message naming each field and its problem)."""
    for e in errors:
        if e.get("type") == "json_invalid":
            detail = (e.get("ctx") or {}).get("error") or e.get("msg", "")
            loc = e.get("loc") or ()
            pos = f" at position {loc[-1]}" if loc and isinstance(loc[-1], int) else ""
            return 400, f"malformed JSON body{pos}: {detail}"
    shown = [f"{_where(e.get('loc', ()), root)}: {e.get('msg', 'invalid')}" for e in errors[:5]]
    more = f" (and {len(errors) - 5} more errors)" if len(errors) > 5 else ""
    return 422, "; ".join(shown) + more


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


def _is_json(request: Request) -> bool:
    media = request.headers.get("content-type", "").split(";")[0].strip().lower()
    return media == "application/json" or media.endswith("+json")


def _not_json(request: Request) -> JSONResponse:
    got = request.headers.get("content-type")
    return _error(
        415, f"send the body as JSON with header Content-Type: application/json (got {got or 'no Content-Type'})"
    )


class _BodyLimit:
    """ASGI middleware: refuse bodies over ``max_bytes`` by Content-Length, and by counting what actually arrives."""

    def __init__(self, app: Callable[..., Awaitable[None]], max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(
        self,
        scope: MutableMapping[str, Any],
        receive: Callable[[], Awaitable[MutableMapping[str, Any]]],
        send: Callable[[MutableMapping[str, Any]], Awaitable[None]],
    ) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.max_bytes
        for name, value in scope.get("headers", ()):
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    await _error(400, f"Content-Length {value.decode(errors='replace')!r} is not a number")(
                        scope, receive, send
                    )
                    return
                if declared > limit:
                    await _error(413, f"request body of {declared} bytes is over the limit of {limit} bytes")(
                        scope, receive, send
                    )
                    return
        seen = 0

        async def counted() -> MutableMapping[str, Any]:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    raise HTTPException(413, f"request body is over the limit of {limit} bytes")
            return message

        await self.app(scope, counted, send)


# ------------------------------------------------------------------------------------------------- gateway


class _LLMCall:
    """Everything known about one gateway call; becomes one ``llm`` span."""

    def __init__(
        self, request: Request, body: dict[str, Any], rollout_id: str, attempt_id: str, resource: str, backend: str
    ) -> None:
        self.start = time.time()
        self.rollout_id = rollout_id
        self.attempt_id = attempt_id
        agent = request.headers.get(HEADER_AGENT)
        self.agent = unquote(agent) if agent is not None else None  # percent-encoded UTF-8 (headers are ASCII)
        self.parent_id = request.headers.get(HEADER_PARENT_SPAN)
        self.attrs: dict[str, Any] = {
            ATTR_INPUT_MESSAGES: body.get("messages"),
            ATTR_MODEL: body.get("model"),
            ATTR_RESOURCE: resource,
            ATTR_STREAM: bool(body.get("stream")),
            ATTR_BACKEND_URL: backend,
        }
        if body.get("tools") is not None:
            self.attrs[ATTR_TOOLS] = body["tools"]
        call_id = request.headers.get(HEADER_CALL_ID)
        if call_id is not None:
            self.attrs[ATTR_CALL_ID] = call_id
        self.status: Literal["ok", "error"] = "ok"
        # streaming assembly
        self._fields: dict[str, str] = {}
        self._role = "assistant"
        self._tool_calls: dict[int, dict[str, Any]] = {}
        self._token_ids: list[int] | None = None
        self._logprobs: list[float] | None = None
        self._finish: dict[int, str | None] = {}
        self._usage: dict[str, Any] | None = None
        self._chunks = 0

    def fail(self, status_code: int, message: str) -> None:
        self.status = "error"
        self.attrs[ATTR_HTTP_STATUS] = status_code
        self.attrs[ATTR_ERROR_MESSAGE] = message

    def _top_level(self, data: dict[str, Any]) -> None:
        if data.get("prompt_token_ids") is not None:
            self.attrs[ATTR_PROMPT_IDS] = data["prompt_token_ids"]
        if data.get("agl_weights_version") is not None:
            self.attrs[ATTR_WEIGHTS_VERSION] = data["agl_weights_version"]
        if data.get("model") is not None:
            self.attrs["gen_ai.response.model"] = data["model"]
        if data.get("id") is not None:
            self.attrs["gen_ai.response.id"] = data["id"]
        if data.get("usage"):
            self._usage = data["usage"]

    def response(self, data: dict[str, Any]) -> None:
        """Record a non-streaming chat completion."""
        self._top_level(data)
        choices = data.get("choices") or []
        self.attrs[ATTR_FINISH_REASONS] = [c.get("finish_reason") for c in choices]
        if choices:
            first = choices[0]
            self.attrs[ATTR_OUTPUT_MESSAGES] = [first.get("message")]
            if first.get("token_ids") is not None:
                self.attrs[ATTR_RESPONSE_IDS] = first["token_ids"]
            content = (first.get("logprobs") or {}).get("content")
            if content is not None:
                self.attrs[ATTR_LOGPROBS] = [e.get("logprob") for e in content]
        self._set_usage()

    def chunk(self, data: dict[str, Any]) -> None:
        """Fold one streamed chunk into the assembled response."""
        self._chunks += 1
        self._top_level(data)
        for choice in data.get("choices") or []:
            index = choice.get("index", 0)
            if choice.get("finish_reason") is not None or index not in self._finish:
                self._finish[index] = choice.get("finish_reason")
            if index != 0:
                continue
            for key, value in (choice.get("delta") or {}).items():
                if key == "role" and value:
                    self._role = value
                elif key == "tool_calls" and value:
                    self._merge_tool_calls(value)
                elif isinstance(value, str):
                    self._fields[key] = self._fields.get(key, "") + value
            if choice.get("token_ids") is not None:
                self._token_ids = (self._token_ids or []) + list(choice["token_ids"])
            content = (choice.get("logprobs") or {}).get("content")
            if content is not None:
                self._logprobs = (self._logprobs or []) + [e.get("logprob") for e in content]

    def _merge_tool_calls(self, deltas: list[dict[str, Any]]) -> None:
        for delta in deltas:
            call = self._tool_calls.setdefault(
                delta.get("index", 0), {"id": None, "type": "function", "function": {"name": "", "arguments": ""}}
            )
            if delta.get("id"):
                call["id"] = delta["id"]
            if delta.get("type"):
                call["type"] = delta["type"]
            fn = delta.get("function") or {}
            if fn.get("name"):
                call["function"]["name"] += fn["name"]
            if fn.get("arguments"):
                call["function"]["arguments"] += fn["arguments"]

    def finish_stream(self) -> None:
        """Write the assembled streamed message into the attributes (called once, when the stream ends)."""
        if not self._chunks:
            return
        message: dict[str, Any] = {"role": self._role, "content": self._fields.pop("content", None)}
        message.update(self._fields)
        if self._tool_calls:
            message["tool_calls"] = [self._tool_calls[i] for i in sorted(self._tool_calls)]
        self.attrs[ATTR_OUTPUT_MESSAGES] = [message]
        self.attrs[ATTR_FINISH_REASONS] = [self._finish[i] for i in sorted(self._finish)]
        if self._token_ids is not None:
            self.attrs[ATTR_RESPONSE_IDS] = self._token_ids
        if self._logprobs is not None:
            self.attrs[ATTR_LOGPROBS] = self._logprobs
        self._set_usage()

    def _set_usage(self) -> None:
        if self._usage:
            if self._usage.get("prompt_tokens") is not None:
                self.attrs[ATTR_INPUT_TOKENS] = self._usage["prompt_tokens"]
            if self._usage.get("completion_tokens") is not None:
                self.attrs[ATTR_OUTPUT_TOKENS] = self._usage["completion_tokens"]

    def span(self) -> Span:
        return Span(
            rollout_id=self.rollout_id,
            attempt_id=self.attempt_id,
            parent_id=self.parent_id,
            kind="llm",
            name="chat.completions",
            agent=self.agent,
            start_time=self.start,
            end_time=time.time(),
            status=self.status,
            attributes=self.attrs,
        )


class _SSEParser:
    """Incremental Server-Sent-Events parser: feed raw bytes, get the ``data`` payload of each complete event."""

    def __init__(self) -> None:
        self._buf = b""
        self._data: list[bytes] = []

    def feed(self, raw: bytes) -> list[bytes]:
        self._buf += raw
        events: list[bytes] = []
        while (nl := self._buf.find(b"\n")) >= 0:
            line, self._buf = self._buf[:nl].rstrip(b"\r"), self._buf[nl + 1 :]
            if not line:
                if self._data:
                    events.append(b"\n".join(self._data))
                    self._data = []
            elif line.startswith(b"data:"):
                self._data.append(line[5:].lstrip(b" "))
        return events


class Gateway:
    """OpenAI-compatible proxy that records one ``llm`` span per call and always asks the backend for exact tokens."""

    def __init__(self, store: Store, writer: SpanWriter, timeout: float, cache_size: int = 10_000) -> None:
        self.store = store
        self.writer = writer
        self.timeout = timeout
        self._cache: OrderedDict[tuple[str, str], LLM] = OrderedDict()
        self._cache_size = cache_size
        self._client: httpx.AsyncClient | None = None

    @property
    def client(self) -> httpx.AsyncClient:
        """One shared client, created on first use inside the server's event loop."""
        if self._client is None:
            self._client = httpx.AsyncClient(
                timeout=httpx.Timeout(self.timeout, connect=min(self.timeout, 10.0)),
                limits=httpx.Limits(max_connections=1000, max_keepalive_connections=200),
            )
        return self._client

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    async def resolve(self, rollout_id: str, name: str) -> LLM:
        """The LLM resource ``name`` of the resources version the rollout runs with (cached: versions are immutable)."""
        key = (rollout_id, name)
        llm = self._cache.get(key)
        if llm is not None:
            self._cache.move_to_end(key)
            return llm
        try:
            rollout = await run_in_threadpool(self.store.get_rollout, rollout_id)
        except NotFound:
            raise HTTPException(404, f"gateway: unknown rollout {rollout_id!r}") from None
        resources: ResourceSet = await run_in_threadpool(self.store.get_resources, rollout.resources_version)
        resource = resources.resources.get(name)
        if resource is None:
            raise HTTPException(
                404,
                f"gateway: resources version {resources.version} of rollout {rollout_id!r} has no resource {name!r} "
                f"(it has: {', '.join(sorted(resources.resources)) or 'none'})",
            )
        if not isinstance(resource, LLM):
            raise HTTPException(404, f"gateway: resource {name!r} is a {resource.kind}, not an LLM")
        self._cache[key] = resource
        if len(self._cache) > self._cache_size:
            self._cache.popitem(last=False)
        return resource

    @staticmethod
    def _headers(llm: LLM) -> dict[str, str]:
        return {"authorization": f"Bearer {llm.api_key}", "content-type": "application/json"}

    async def models(self, rollout_id: str, name: str) -> Response:
        llm = await self.resolve(rollout_id, name)
        url = llm.base_url.rstrip("/") + "/models"
        try:
            resp = await self.client.get(url, headers=self._headers(llm))
        except httpx.HTTPError as exc:
            return _error(502, f"gateway: LLM backend {llm.base_url} unreachable: {type(exc).__name__}: {exc}")
        return Response(resp.content, resp.status_code, media_type=resp.headers.get("content-type"))

    async def chat(self, request: Request, rollout_id: str, attempt_id: str, name: str) -> Response:
        for what, value, most in (
            ("attempt id", attempt_id, 128),
            (f"header {HEADER_PARENT_SPAN}", request.headers.get(HEADER_PARENT_SPAN, ""), 128),
            (f"header {HEADER_AGENT}", request.headers.get(HEADER_AGENT, ""), 512),
        ):
            if len(value) > most:
                return _error(400, f"gateway: {what} is {len(value)} characters long; at most {most} allowed")
        llm = await self.resolve(rollout_id, name)
        if not _is_json(request):
            return _not_json(request)
        raw = await request.body()
        try:
            body = json.loads(raw)
        except ValueError as exc:
            return _error(400, f"malformed JSON body: {exc}")
        if not isinstance(body, dict):
            return _error(400, f"chat completion body must be a JSON object, not {type(body).__name__}")
        for key, value in llm.sampling.items():
            body.setdefault(key, value)
        body.setdefault("model", llm.model)
        body["return_token_ids"] = True
        body["logprobs"] = True
        call = _LLMCall(request, body, rollout_id, attempt_id, name, llm.base_url)
        if llm.weights_version is not None:
            # Backends that cannot report it (vLLM) serve exactly the published version; one that reports
            # ``agl_weights_version`` (agl's policy server) overrides this with what it actually served.
            call.attrs[ATTR_WEIGHTS_VERSION] = llm.weights_version
        url = llm.base_url.rstrip("/") + "/chat/completions"
        upstream = self.client.build_request("POST", url, content=json.dumps(body), headers=self._headers(llm))
        try:
            resp = await self.client.send(upstream, stream=True)
        except httpx.HTTPError as exc:
            message = f"gateway: LLM backend {llm.base_url} unreachable: {type(exc).__name__}: {exc}"
            call.fail(502, message)
            self.writer.put(call.span())
            return _error(502, message)
        if resp.status_code >= 300 or not body.get("stream"):
            return await self._whole(resp, call)
        return StreamingResponse(self._relay(resp, call), status_code=resp.status_code, media_type="text/event-stream")

    async def _whole(self, resp: httpx.Response, call: _LLMCall) -> Response:
        try:
            content = await resp.aread()
        except httpx.HTTPError as exc:
            message = f"gateway: LLM backend failed mid-response: {type(exc).__name__}: {exc}"
            call.fail(502, message)
            self.writer.put(call.span())
            return _error(502, message)
        finally:
            await resp.aclose()
        if resp.status_code >= 300:
            call.fail(resp.status_code, content.decode(errors="replace")[:4000])
        else:
            try:
                data = json.loads(content)
                call.response(data if isinstance(data, dict) else {})
            except ValueError:
                call.fail(502, "LLM backend returned a non-JSON body")
        self.writer.put(call.span())
        return Response(content, resp.status_code, media_type=resp.headers.get("content-type", "application/json"))

    async def _relay(self, resp: httpx.Response, call: _LLMCall) -> AsyncIterator[bytes]:
        """Forward the backend's SSE bytes as they arrive while assembling the span; record it however it ends.

        The span is handed to the writer *before* the ``[DONE]`` event reaches the client: clients stop reading
        there, and a ``complete_attempt`` that follows must find the span when it flushes the writer.
        """
        parser = _SSEParser()
        recorded = False

        def record() -> None:
            nonlocal recorded
            if not recorded:
                recorded = True
                call.finish_stream()
                self.writer.put(call.span())

        try:
            async for raw in resp.aiter_bytes():
                for event in parser.feed(raw):
                    if event == b"[DONE]":
                        record()
                        continue
                    try:
                        data = json.loads(event)
                    except ValueError:
                        continue
                    if isinstance(data, dict):
                        call.chunk(data)
                yield raw
        except httpx.HTTPError as exc:
            call.fail(502, f"gateway: LLM backend stream broke: {type(exc).__name__}: {exc}")
        except BaseException:
            if not recorded:
                call.fail(499, "client disconnected before the stream ended")
            raise
        finally:
            record()
            await asyncio.shield(resp.aclose())


# ------------------------------------------------------------------------------------------------- the app


def create_app(store: Store, *, max_body_bytes: int = 64 * 2**20, gateway_timeout: float = 600.0) -> FastAPI:
    """The agl server as an ASGI app over ``store``.

    ``max_body_bytes`` bounds every request body; ``gateway_timeout`` bounds one LLM backend call. The app owns a
    ``SpanWriter`` (``app.state.span_writer``) and a ``Gateway`` (``app.state.gateway``), closed at shutdown.
    """
    writer = SpanWriter(store)
    gateway = Gateway(store, writer, gateway_timeout)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        await gateway.aclose()
        await run_in_threadpool(writer.close)

    app = FastAPI(
        title="agl server",
        description="Store API (rollouts, attempts, spans, resources, records) and OpenAI-compatible LLM gateway.",
        lifespan=lifespan,
        responses={
            400: {"model": ErrorOut},
            404: {"model": ErrorOut},
            409: {"model": ErrorOut},
            413: {"model": ErrorOut},
        },
    )
    app.state.store = store
    app.state.span_writer = writer
    app.state.gateway = gateway
    app.add_middleware(_BodyLimit, max_bytes=max_body_bytes)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        if not _is_json(request) and any(e.get("loc", ())[:1] == ("body",) for e in exc.errors()):
            return _not_json(request)
        return _error(*format_validation_errors(list(exc.errors())))

    @app.exception_handler(HTTPException)
    async def _http(request: Request, exc: HTTPException) -> JSONResponse:
        message = str(exc.detail)
        if exc.status_code == 404 and message == "Not Found":
            message = f"no endpoint {request.method} {request.url.path}"
        elif exc.status_code == 405:
            message = f"method {request.method} not allowed on {request.url.path}"
        return _error(exc.status_code, message)

    @app.exception_handler(NotFound)
    async def _not_found(_: Request, exc: NotFound) -> JSONResponse:
        return _error(404, str(exc))

    @app.exception_handler(StoreError)
    async def _refused(_: Request, exc: StoreError) -> JSONResponse:
        return _error(409, str(exc))

    @app.exception_handler(Exception)
    async def _crash(_: Request, exc: Exception) -> JSONResponse:
        log.exception("agl server: unhandled error")
        return _error(500, f"internal server error: {type(exc).__name__}: {exc}")

    @app.get("/health")
    def health() -> Health:
        return Health()

    @app.get("/api/settings")
    def settings() -> SettingsOut:
        return SettingsOut(
            heartbeat_timeout=store.settings.heartbeat_timeout, attempt_timeout=store.settings.attempt_timeout
        )

    # rollouts ---------------------------------------------------------------------------------------------
    @app.post("/api/rollouts/enqueue")
    def enqueue(body: EnqueueBody) -> list[Rollout]:
        return store.enqueue(body.requests)

    @app.post("/api/lease")
    def lease(body: LeaseBody) -> Leased | None:
        got = store.lease(body.worker_id)
        return None if got is None else Leased(rollout=got[0], attempt=got[1])

    @app.post("/api/attempts/{attempt_id}/heartbeat")
    def heartbeat(attempt_id: str) -> Ok:
        return Ok(ok=store.heartbeat(attempt_id))

    @app.post("/api/attempts/{attempt_id}/complete")
    def complete_attempt(attempt_id: str, body: CompleteBody) -> Ok:
        writer.flush()
        return Ok(ok=store.complete_attempt(attempt_id, body.status, body.final_reward, body.error))

    @app.get("/api/rollouts")
    def list_rollouts(
        status: str | None = None,
        mode: str | None = None,
        limit: int = Query(100, ge=0, le=100_000),
        offset: int = Query(0, ge=0),
    ) -> list[Rollout]:
        return store.list_rollouts(status=status, mode=mode, limit=limit, offset=offset)

    @app.get("/api/rollouts/{rollout_id}")
    def get_rollout(rollout_id: str) -> Rollout:
        return store.get_rollout(rollout_id)

    @app.post("/api/rollouts/get")
    def get_rollouts(body: RolloutIdsBody) -> list[Rollout]:
        return store.get_rollouts(body.rollout_ids)

    @app.get("/api/rollouts/{rollout_id}/attempts")
    def list_attempts(rollout_id: str) -> list[Attempt]:
        return store.list_attempts(rollout_id)

    @app.post("/api/rollouts/cancel")
    def cancel(body: RolloutIdsBody) -> Count:
        return Count(count=store.cancel(body.rollout_ids))

    @app.post("/api/reap")
    def reap() -> Count:
        return Count(count=store.reap())

    @app.post("/api/rollouts/wait", response_model=list[Rollout])
    async def wait(body: WaitBody) -> Response:
        """Block up to ``min(timeout, MAX_WAIT_S)`` seconds without holding a thread; polls the store."""
        await run_in_threadpool(writer.flush)
        deadline = time.monotonic() + min(body.timeout, MAX_WAIT_S)
        while True:
            rollouts = await run_in_threadpool(store.wait, body.rollout_ids, 0.0, body.poll)
            if all(r.finished for r in rollouts) or time.monotonic() >= deadline:
                return Response(_ROLLOUTS.dump_json(rollouts), media_type="application/json")
            await asyncio.sleep(min(body.poll, max(0.0, deadline - time.monotonic())))

    # spans ------------------------------------------------------------------------------------------------
    span_list_schema = _SPANS.json_schema(ref_template="#/components/schemas/{model}")
    span_list_schema.pop("$defs", None)

    @app.post(
        "/api/spans",
        response_model=Count,
        openapi_extra={
            "requestBody": {"required": True, "content": {"application/json": {"schema": span_list_schema}}}
        },
    )
    async def add_spans(request: Request) -> Count | Response:
        """Store a JSON list of spans atomically (idempotent on ``span_id``); one bad span stores none of them."""
        if not _is_json(request):
            return _not_json(request)
        raw = await request.body()

        def ingest() -> int:
            try:
                spans = _SPANS.validate_json(raw)
            except ValidationError as exc:
                status, message = format_validation_errors(exc.errors(), root="spans")
                raise HTTPException(status, message) from None
            return store.add_spans(spans)

        return Count(count=await run_in_threadpool(ingest))

    @app.get("/api/spans", response_model=list[Span])
    def query_spans(
        rollout_id: str | None = None,
        attempt_id: str | None = None,
        kind: str | None = None,
        agent: str | None = None,
        limit: int | None = Query(None, ge=0),
    ) -> Response:
        spans = store.query_spans(rollout_id=rollout_id, attempt_id=attempt_id, kind=kind, agent=agent, limit=limit)
        return Response(_SPANS.dump_json(spans), media_type="application/json")

    # resources and records --------------------------------------------------------------------------------
    @app.post("/api/resources")
    def publish_resources(body: PublishBody) -> ResourceSet:
        return store.publish_resources(body.resources)

    @app.get("/api/resources/latest")
    def latest_resources() -> ResourceSet:
        return store.get_resources(None)

    @app.get("/api/resources/{version}")
    def get_resources(version: int) -> ResourceSet:
        return store.get_resources(version)

    @app.post("/api/records")
    def add_record(record: Record) -> Ok:
        store.add_record(record)
        return Ok(ok=True)

    @app.get("/api/records")
    def list_records(kind: str, key: str | None = None) -> list[Record]:
        return store.list_records(kind, key)

    # gateway ----------------------------------------------------------------------------------------------
    gw = "/gw/{rollout_id}/{attempt_id}/{resource_name}/v1"

    @app.post(gw + "/chat/completions", tags=["gateway"])
    async def chat_completions(request: Request, rollout_id: str, attempt_id: str, resource_name: str) -> Response:
        """OpenAI chat completions (streaming or not) forwarded to the rollout's LLM resource, recorded as a span."""
        return await gateway.chat(request, rollout_id, attempt_id, resource_name)

    @app.get(gw + "/models", tags=["gateway"])
    async def models(rollout_id: str, attempt_id: str, resource_name: str) -> Response:
        return await gateway.models(rollout_id, resource_name)

    return app


# ------------------------------------------------------------------------------------------------- running it


def _bind(host: str, port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.setblocking(False)
    return sock


def _url(host: str, port: int) -> str:
    shown = "127.0.0.1" if host in ("0.0.0.0", "") else f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}"


def _config(app: FastAPI) -> uvicorn.Config:
    return uvicorn.Config(app, log_config=None, access_log=False, lifespan="on", timeout_graceful_shutdown=5)


class AglServer:
    """The agl server in a background thread, for tests, notebooks and the embedded trainer.

    Example::

        with AglServer(SqliteStore("runs/agl.db")) as server:
            store = HttpStore(server.url)
    """

    def __init__(
        self,
        store: Store,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        max_body_bytes: int = 64 * 2**20,
        gateway_timeout: float = 600.0,
    ) -> None:
        self.store = store
        self.host = host
        self.port = port
        self.max_body_bytes = max_body_bytes
        self.gateway_timeout = gateway_timeout
        self.app: FastAPI | None = None
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return _url(self.host, self.port)

    def start(self, timeout: float = 30.0) -> AglServer:
        """Bind (port 0 picks a free port) and return once the server accepts connections."""
        if self._thread is not None:
            raise RuntimeError(f"AglServer already running at {self.url}")
        sock = _bind(self.host, self.port)
        self.port = sock.getsockname()[1]
        self.app = create_app(self.store, max_body_bytes=self.max_body_bytes, gateway_timeout=self.gateway_timeout)
        server = uvicorn.Server(_config(self.app))
        thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="agl-server", daemon=True)
        thread.start()
        deadline = time.monotonic() + timeout
        while not server.started:
            if not thread.is_alive() or time.monotonic() > deadline:
                server.should_exit = True
                sock.close()
                raise RuntimeError(f"agl server on {self.url} did not start")
            time.sleep(0.005)
        self._server, self._thread = server, thread
        return self

    def flush(self) -> None:
        """Make every gateway span recorded so far durable in the store."""
        if self.app is not None:
            self.app.state.span_writer.flush()

    def stop(self) -> None:
        """Stop serving: finish open requests (up to 5 s), flush gateway spans, release the port."""
        if self._server is None or self._thread is None:
            return
        self._server.should_exit = True
        self._thread.join()
        self._server = self._thread = None

    def __enter__(self) -> AglServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def serve(store_url: str, host: str, port: int) -> None:
    """Run the server in the foreground until interrupted (``agl server --store sqlite:///runs/agl.db``)."""
    from agl.core.store import open_store

    store = open_store(store_url)
    sock = _bind(host, port)
    print(f"agl server listening on {_url(host, sock.getsockname()[1])} (store: {store_url})", flush=True)
    try:
        uvicorn.Server(_config(create_app(store))).run(sockets=[sock])
    finally:
        store.close()
