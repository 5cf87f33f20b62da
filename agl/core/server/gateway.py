"""The OpenAI-compatible LLM gateway: an agent's chat completions go to its rollout's LLM resource, the backend is
asked for exact token ids and logprobs, and every call becomes one ``llm`` span.

Acknowledged means stored: a call's span is durable in the store before its answer reaches the agent. A
non-streaming answer is held until the span's write commits; a stream is held back at the bytes that complete its
``[DONE]`` event (or at its end when the backend sends none). The span pipeline writes as soon as anything is pending
(group commit), so concurrent calls share one transaction and no call waits for a timer. When the span cannot be
stored the agent gets no success: a non-streaming call is answered 503 naming the cause, and a stream ends with an
error event in place of ``[DONE]`` (OpenAI clients raise ``APIError`` on it). A call whose client left mid-stream is
still recorded, without waiting.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import OrderedDict
from collections.abc import AsyncIterator
from typing import Any, Literal
from urllib.parse import unquote

import httpx
from fastapi import Request
from fastapi.responses import Response, StreamingResponse
from pydantic import TypeAdapter, ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException

from agl.core.jsonsafe import INT64_MAX, json_problem
from agl.core.server.errors import error, parse_body, read_body
from agl.core.span_pipeline import SpanPipeline
from agl.core.store.base import NotFound, Store
from agl.core.types import (
    ATTR_BACKEND_URL,
    ATTR_CALL_ID,
    ATTR_ERROR_MESSAGE,
    ATTR_FINISH_REASONS,
    ATTR_HTTP_STATUS,
    ATTR_INPUT_MESSAGES,
    ATTR_INPUT_TOKENS,
    ATTR_LOGPROBS,
    ATTR_MODEL,
    ATTR_OUTPUT_MESSAGES,
    ATTR_OUTPUT_TOKENS,
    ATTR_PROMPT_IDS,
    ATTR_RESOURCE,
    ATTR_RESPONSE_IDS,
    ATTR_STREAM,
    ATTR_TOOLS,
    ATTR_WEIGHTS_VERSION,
    HEADER_AGENT,
    HEADER_CALL_ID,
    HEADER_PARENT_SPAN,
    HEADER_SEQUENCE,
    LLM,
    JsonData,
    ResourceSet,
    Span,
)

log = logging.getLogger("agl.server")

#: The longest an answer waits for its span to be stored before the agent is told it could not be.
SPAN_ACK_TIMEOUT_S = 30.0

_CHAT_BODY: TypeAdapter[Any] = TypeAdapter(JsonData)


def parse_sequence(value: str | None) -> int | None:
    """The runner's sequence number from header ``x-agl-sequence``; HTTP 400 naming the header when it is not one."""
    if value is None:
        return None
    if len(value) <= 32 and value.isascii() and value.isdigit() and int(value) <= INT64_MAX:
        return int(value)
    raise HTTPException(
        400, f"gateway: header {HEADER_SEQUENCE} must be an integer from 0 to 2**63-1, got {value[:40]!r}"
    )


class _LLMCall:
    """Everything known about one gateway call; becomes one ``llm`` span."""

    def __init__(
        self,
        request: Request,
        body: dict[str, Any],
        rollout_id: str,
        attempt_id: str,
        resource: str,
        backend: str,
        sequence: int | None,
    ) -> None:
        self.start = time.time()
        self.rollout_id = rollout_id
        self.attempt_id = attempt_id
        self.sequence = sequence or 0
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
        """The call as a span. What the backend sent that JSON cannot hold (a NaN logprob, ...) is left out, named in
        ``error.message``, and the span marked ``error``: the call is recorded, never with values that cannot be read
        back."""
        fields: dict[str, Any] = {
            "rollout_id": self.rollout_id,
            "attempt_id": self.attempt_id,
            "parent_id": self.parent_id,
            "sequence": self.sequence,
            "kind": "llm",
            "name": "chat.completions",
            "agent": self.agent,
            "start_time": self.start,
            "end_time": time.time(),
            "status": self.status,
            "attributes": self.attrs,
        }
        try:
            return Span(**fields)
        except ValidationError:
            left_out = {key: problem for key, value in self.attrs.items() if (problem := json_problem(value))}
            if not left_out:
                raise
            attrs = {key: value for key, value in self.attrs.items() if key not in left_out}
            named = "; ".join(f"{key}{problem.path}: {problem.problem}" for key, problem in left_out.items())
            attrs[ATTR_ERROR_MESSAGE] = f"gateway: left out what JSON cannot hold: {named}"
            return Span(**{**fields, "status": "error", "attributes": attrs})


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


def _error_event(message: str) -> bytes:
    """An SSE event OpenAI clients raise ``APIError`` on."""
    body = {"error": {"message": message, "type": "agl_span_not_stored", "code": 503}}
    return b"data: " + json.dumps(body).encode() + b"\n\n"


class Gateway:
    """OpenAI-compatible proxy that records one ``llm`` span per call and always asks the backend for exact tokens.

    ``spans`` is the pipeline the spans are stored through; ``ack_timeout`` bounds how long an answer waits for its
    span to be stored.
    """

    def __init__(
        self,
        store: Store,
        spans: SpanPipeline,
        timeout: float,
        *,
        ack_timeout: float = SPAN_ACK_TIMEOUT_S,
        cache_size: int = 10_000,
    ) -> None:
        self.store = store
        self.spans = spans
        self.timeout = timeout
        self.ack_timeout = ack_timeout
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
            return error(502, f"gateway: LLM backend {llm.base_url} unreachable: {type(exc).__name__}: {exc}")
        return Response(resp.content, resp.status_code, media_type=resp.headers.get("content-type"))

    async def chat(self, request: Request, rollout_id: str, attempt_id: str, name: str) -> Response:
        for what, value, most in (
            ("attempt id", attempt_id, 128),
            (f"header {HEADER_PARENT_SPAN}", request.headers.get(HEADER_PARENT_SPAN, ""), 128),
            (f"header {HEADER_AGENT}", request.headers.get(HEADER_AGENT, ""), 512),
        ):
            if len(value) > most:
                return error(400, f"gateway: {what} is {len(value)} characters long; at most {most} allowed")
        sequence = parse_sequence(request.headers.get(HEADER_SEQUENCE))
        llm = await self.resolve(rollout_id, name)
        body = parse_body(await read_body(request), _CHAT_BODY)
        if not isinstance(body, dict):
            return error(400, f"chat completion body must be a JSON object, not {type(body).__name__}")
        for key, value in llm.sampling.items():
            body.setdefault(key, value)
        body.setdefault("model", llm.model)
        body["return_token_ids"] = True
        body["logprobs"] = True
        call = _LLMCall(request, body, rollout_id, attempt_id, name, llm.base_url, sequence)
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
            return await self._answer(call, error(502, message))
        if resp.status_code >= 300 or not body.get("stream"):
            return await self._whole(resp, call)
        return StreamingResponse(self._relay(resp, call), status_code=resp.status_code, media_type="text/event-stream")

    async def _stored(self, call: _LLMCall) -> str | None:
        """Store the call's span and wait until it is durable: None, or why it could not be stored."""
        try:
            done = self.spans.put(call.span())
        except (TypeError, ValueError) as exc:
            return f"{type(exc).__name__}: {exc}"
        try:
            await asyncio.wait_for(asyncio.wrap_future(done), self.ack_timeout)
        except TimeoutError:
            return f"the store did not confirm it within {self.ack_timeout:g}s"
        except Exception as exc:
            return f"{type(exc).__name__}: {exc}"
        return None

    def _put_unwaited(self, call: _LLMCall) -> None:
        """Store the span of a call nobody waits for any more (its client left); a failure is only logged."""
        try:
            self.spans.put(call.span())
        except (TypeError, ValueError) as exc:
            log.error("gateway: the span of a call to rollout %s could not be recorded: %s", call.rollout_id, exc)

    async def _answer(self, call: _LLMCall, response: Response) -> Response:
        """``response`` once the call's span is stored; a success whose span could not be stored becomes a 503."""
        problem = await self._stored(call)
        if problem is None or response.status_code >= 300:
            return response
        return error(
            503,
            f"gateway: the LLM answered but the call could not be recorded ({problem}); the answer is withheld so "
            "that no answered call goes unrecorded; retry the call",
        )

    async def _whole(self, resp: httpx.Response, call: _LLMCall) -> Response:
        try:
            content = await resp.aread()
        except httpx.HTTPError as exc:
            message = f"gateway: LLM backend failed mid-response: {type(exc).__name__}: {exc}"
            call.fail(502, message)
            return await self._answer(call, error(502, message))
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
        media_type = resp.headers.get("content-type", "application/json")
        return await self._answer(call, Response(content, resp.status_code, media_type=media_type))

    async def _relay(self, resp: httpx.Response, call: _LLMCall) -> AsyncIterator[bytes]:
        """Forward the backend's SSE bytes as they arrive while assembling the span; record it however it ends.

        The bytes that complete the ``[DONE]`` event (or, without one, the end of the stream) are sent only once the
        span is stored; if it cannot be, an error event takes the place of ``[DONE]``.
        """
        parser = _SSEParser()
        recorded = False

        async def record() -> bytes | None:
            """Store the span and wait for it: None when stored, else the error event to send instead."""
            nonlocal recorded
            recorded = True
            call.finish_stream()
            problem = await self._stored(call)
            if problem is None:
                return None
            return _error_event(f"gateway: the call could not be recorded ({problem}); retry the call")

        try:
            async for raw in resp.aiter_bytes():
                events = parser.feed(raw)
                done = False
                for event in events:
                    if event == b"[DONE]":
                        done = True
                        continue
                    try:
                        data = json.loads(event)
                    except ValueError:
                        continue
                    if isinstance(data, dict):
                        call.chunk(data)
                if done and not recorded:
                    failure = await record()
                    if failure is not None:
                        cut = raw.find(b"data: [DONE]")
                        yield (raw[:cut] if cut >= 0 else b"") + failure
                        return
                yield raw
        except httpx.HTTPError as exc:
            call.fail(502, f"gateway: LLM backend stream broke: {type(exc).__name__}: {exc}")
        except BaseException:
            if not recorded:  # the client left (or the server is stopping): record without waiting
                recorded = True
                call.fail(499, "client disconnected before the stream ended")
                call.finish_stream()
                self._put_unwaited(call)
            raise
        finally:
            await asyncio.shield(resp.aclose())
        if not recorded:
            failure = await record()
            if failure is not None:
                yield failure
