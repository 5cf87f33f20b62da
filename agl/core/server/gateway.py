"""The OpenAI-compatible LLM gateway: an agent's chat completions go to its rollout's LLM resource, the backend is
asked for exact token ids and logprobs, and every call becomes one ``llm`` span.

Acknowledged means stored: a call's span is durable in the store before its answer reaches the agent. A
non-streaming answer is held until the span's write commits; a stream is held back at the bytes that complete its
``[DONE]`` event (or at its end when the backend sends none). The span pipeline writes as soon as anything is pending
(group commit), so concurrent calls share one transaction and no call waits for a timer. When the span cannot be
stored the agent gets no success: a non-streaming call is answered 503 naming the cause, and a stream ends with an
error event in place of ``[DONE]`` (OpenAI clients raise ``APIError`` on it). A call whose client left mid-stream is
still recorded, without waiting.

Token capture (``LLM.token_ids``): ``auto`` adds ``return_token_ids`` (and ``logprobs`` unless the agent set it) for
backends that accept them. A backend that refuses one of them (400/422 naming the field: the hosted OpenAI API says
"Unrecognized request argument supplied: return_token_ids") gets the call again without agl's fields, once, and is
remembered (per base_url and model, bounded) so later calls go without them; such spans carry ``agl.token_ids``
("unsupported"; "missing" when a backend ignored the fields, "off" when the setting is off). ``require`` always asks
and fails a call that cannot get ids (400 naming the setting); ``off`` never asks. The agent's own body is otherwise
forwarded unchanged: its explicit ``logprobs`` is never overridden. A non-streamed answer reaches the agent without
what only agl's added fields made the backend send (token ids, logprobs it did not ask for: the span keeps them), so
the agent gets the answer it asked for and parses no more than that; a stream is relayed byte for byte.

Safety: a call is forwarded only for a ``running`` rollout's live attempt (checked on every call: one indexed read;
resources are cached by version, which is immutable), else 409 naming rollout and attempt. With ``allow_backends``
only backends matching a pattern (``BackendPattern``) are published or called. Backend answers are capped
(``max_response_bytes``: a larger answer is a 502, a longer stream is cut with an error event); a non-streaming call
is bounded by ``timeout`` as a whole (504), a stream per read; a non-streaming call whose client left is cancelled
upstream (its connection closed) and recorded as 499.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import math
import re
import time
from collections import OrderedDict
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from fnmatch import fnmatchcase
from http.cookiejar import CookieJar, DefaultCookiePolicy
from typing import Any, Literal
from urllib.parse import unquote

import httpx
from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import TypeAdapter, ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException

from agl.core.jsonsafe import INT64_MAX, json_problem
from agl.core.server.errors import Receive, Scope, Send, error, parse_body, read_body, unavailable
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
    ATTR_POLICY,
    ATTR_POLICY_ROUTE,
    ATTR_PROMPT_IDS,
    ATTR_RESOURCE,
    ATTR_RESPONSE_IDS,
    ATTR_STREAM,
    ATTR_TEMPERATURE,
    ATTR_TOKEN_IDS,
    ATTR_TOOLS,
    ATTR_WEIGHTS_VERSION,
    HEADER_AGENT,
    HEADER_CALL_ID,
    HEADER_PARENT_SPAN,
    HEADER_SEQUENCE,
    LLM,
    JsonData,
    Resource,
    ResourceSet,
    Span,
)

log = logging.getLogger("agl.server")

#: The longest an answer waits for its span to be stored before the agent is told it could not be.
SPAN_ACK_TIMEOUT_S = 30.0

#: The request fields agl adds to ask a backend for exact tokens (vLLM's OpenAI server understands both).
CAPTURE_FIELDS: tuple[str, ...] = ("return_token_ids", "logprobs")

#: The default cap on one backend answer (a whole body, or the total bytes of a stream).
DEFAULT_MAX_RESPONSE_BYTES = 32 * 2**20

#: Statuses OpenAI-compatible servers refuse an unknown request argument with (400: OpenAI, vLLM; 422: FastAPI).
_ARGUMENT_REFUSED = (400, 422)

#: How many (backend, model) pairs the gateway remembers as not accepting the capture fields.
_NO_IDS_CACHE = 1024

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


_DEFAULT_PORTS = {"http": 80, "https": 443}
_WILDCARD = re.compile(r"[*?\[]")
_PATTERN = re.compile(r"^(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*)://(?P<netloc>[^/?#@]+)(?P<path>(?:/[^?#]*)?)$")
_NETLOC = re.compile(r"^(?:\[(?P<v6>(?=[^\]]*:)[^\]]+)\]|(?P<host>[^:]+))(?::(?P<port>[^:]+))?$")


def _url_parts(url: str) -> tuple[str, str, int, str] | None:
    """(scheme, host, port, path) of ``url`` as the gateway's HTTP client will connect to it; None when it is no
    http(s) URL with a host. User info is not part of the host (``http://a@b/`` is host ``b``); dot segments are
    resolved and the trailing slash dropped."""
    try:
        parsed = httpx.URL(url)
    except (httpx.InvalidURL, TypeError, ValueError):
        return None
    scheme = parsed.scheme.lower()
    if scheme not in _DEFAULT_PORTS or not parsed.host:
        return None
    return scheme, parsed.host.lower(), parsed.port or _DEFAULT_PORTS[scheme], parsed.path.rstrip("/")


def _host_matches(host: str, pattern: str) -> bool:
    """Whether ``host`` matches the host ``pattern`` label by label (``.``; ``:`` for IPv6), so that no wildcard
    reaches across a dot into a name the pattern's owner does not control."""
    sep = ":" if ":" in pattern else "."
    labels, wanted = host.split(sep), pattern.split(sep)
    return len(labels) == len(wanted) and all(
        (label or sep == ":") and fnmatchcase(label, want) for label, want in zip(labels, wanted, strict=True)
    )


@dataclass(frozen=True)
class BackendPattern:
    """One allowed-backend pattern (``agl server --allow-backend PATTERN``): ``scheme://host[:port][/path]``.

    Scheme, host, port and path are matched separately against the backend URL as the gateway connects to it, so a
    wildcard never reaches across parts (``https://*.example.com`` does not admit ``https://evil.com/x.example.com``).
    Host, port and path take fnmatch wildcards (``*``, ``?``, ``[...]``). In a host a wildcard stays within one label
    (one octet of an IPv4 address, one group of an IPv6 one): ``http://10.0.0.*:8000`` admits ``10.0.0.7``, never
    ``10.0.0.7.attacker.example``, and ``*.example.com`` admits ``eu.example.com``, not ``a.b.example.com``. No port
    means the scheme's default (``:*`` for any). A path without wildcards is a prefix at a ``/`` boundary
    (``https://api.openai.com`` admits every path there; ``https://h/v1`` admits ``/v1`` and ``/v1/...``, not
    ``/v10``); a path with wildcards must match the whole path.
    """

    text: str
    scheme: str
    host: str
    port: str
    path: str

    @classmethod
    def parse(cls, text: str) -> BackendPattern:
        """The pattern ``text``; ValueError saying what is wrong when it is not one."""
        match = _PATTERN.match(text.strip())
        netloc = _NETLOC.match(match["netloc"]) if match else None
        if match is None or netloc is None:
            raise ValueError(
                f"allowed backend {text!r} is not a pattern scheme://host[:port][/path] (no user info, query or "
                "fragment), e.g. https://api.openai.com/v1 or http://10.0.0.*:8000"
            )
        scheme = match["scheme"].lower()
        if scheme not in _DEFAULT_PORTS:
            raise ValueError(f"allowed backend {text!r}: the scheme must be http or https, not {scheme!r}")
        host = (netloc["v6"] or netloc["host"]).lower()
        return cls(text, scheme, host, netloc["port"] or str(_DEFAULT_PORTS[scheme]), match["path"].rstrip("/"))

    def matches(self, scheme: str, host: str, port: int, path: str) -> bool:
        if scheme != self.scheme or not _host_matches(host, self.host) or not fnmatchcase(str(port), self.port):
            return False
        if _WILDCARD.search(self.path):
            return fnmatchcase(path, self.path)
        return not self.path or path == self.path or path.startswith(self.path + "/")


class AllowedBackends:
    """The backends a server forwards to: URLs matching any of ``patterns`` (none: no backend at all)."""

    def __init__(self, patterns: Sequence[str]) -> None:
        self.patterns = [BackendPattern.parse(p) for p in patterns]

    def allows(self, url: str) -> bool:
        parts = _url_parts(url)
        if parts is None or any(segment in (".", "..") for segment in parts[3].split("/")):
            return False
        return any(p.matches(*parts) for p in self.patterns)

    def __str__(self) -> str:
        return ", ".join(p.text for p in self.patterns) or "none"


class _Refused(Exception):
    """A gateway call refused before anything is forwarded; answered with ``x-should-retry: false`` (OpenAI clients
    retry a 409 by default, and a refused call would only be refused again)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message

    def response(self) -> JSONResponse:
        return _refusal(self.status, self.message)


#: What stands in for the backend's API key where the backend's own words repeat it.
_KEY_SCRUBBED = b"<api_key withheld by agl>"


def _scrubbed(content: bytes, llm: LLM) -> bytes:
    """``content`` from the backend without the key agl sent it: hosted APIs repeat a wrong key in their 401 body
    (``Incorrect API key provided: sk-...``), which would otherwise reach the agent and every reader of the span.
    Keys under 8 characters (``EMPTY``, ``none``) are placeholders, not secrets, and are left alone."""
    key = llm.api_key.encode()
    return content.replace(key, _KEY_SCRUBBED) if len(key) >= 8 and key in content else content


def _refusal(status: int, message: str) -> JSONResponse:
    answer = error(status, message)
    answer.headers["x-should-retry"] = "false"
    return answer


class _RelayResponse(StreamingResponse):
    """A relayed SSE stream that runs ``ended`` however its response ends, after closing the relay (Starlette leaves
    a relay it stopped iterating suspended, and never starts one whose client left before the first byte)."""

    def __init__(self, relay: AsyncGenerator[bytes, None], ended: Callable[[], Awaitable[None]], status: int) -> None:
        super().__init__(relay, status_code=status, media_type="text/event-stream")
        self._relay = relay
        self._ended = ended

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await asyncio.shield(self._close())

    async def _close(self) -> None:
        await self._relay.aclose()
        await self._ended()


class _TooLarge(Exception):
    """A backend answer over the gateway's cap."""


def _agent_of(request: Request) -> str | None:
    """The agent that made a call, from the integration's header (percent-encoded UTF-8: headers are ASCII)."""
    agent = request.headers.get(HEADER_AGENT)
    return unquote(agent) if agent is not None else None


async def _disconnected(request: Request) -> None:
    """Return once the client of ``request`` (whose body was read) has disconnected; never, when that cannot be
    told (a disconnect is never assumed)."""
    try:
        while True:
            message = await request.receive()
            if message["type"] == "http.disconnect":
                return
            if not message.get("body") and not message.get("more_body"):
                await asyncio.sleep(0.05)  # a server that answers at once after the body: do not spin
    except Exception as exc:
        log.debug("gateway: cannot watch the client for a disconnect: %s: %s", type(exc).__name__, exc)
    await asyncio.Event().wait()


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
        token_ids: Literal["auto", "require", "off"] = "auto",
    ) -> None:
        self.start = time.time()
        self.backend = backend
        self.token_ids = token_ids
        self.recorded = False  # the span went to the pipeline (it must not go twice)
        self.added: list[str] = []  # the capture fields agl added to the agent's request
        self.rollout_id = rollout_id
        self.attempt_id = attempt_id
        self.sequence = sequence or 0
        self.agent = _agent_of(request)
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
        temperature = body.get("temperature")
        if isinstance(temperature, int | float) and not isinstance(temperature, bool) and math.isfinite(temperature):
            self.attrs[ATTR_TEMPERATURE] = float(temperature)  # the trainer scores the tokens at this temperature
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

    def ids_problem(self) -> str | None:
        """After a successful answer: why it fails ``LLM.token_ids='require'`` (None when it does not); an ``auto``
        call that asked for ids and got none is marked ``missing``."""
        if self.status != "ok" or self.attrs.get(ATTR_RESPONSE_IDS) is not None:
            return None
        if self.token_ids == "require":
            return (
                f"gateway: LLM.token_ids='require' but the backend {self.backend} answered without token ids; use a "
                "backend that returns them (vLLM, agl's policy server) or set token_ids='auto' to run without them"
            )
        if self.token_ids == "auto" and ATTR_TOKEN_IDS not in self.attrs:
            self.attrs[ATTR_TOKEN_IDS] = "missing"
        return None

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

    @property
    def chunks(self) -> int:
        """How many chat completion chunks of a stream were read."""
        return self._chunks

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


def _drop_added(data: dict[str, Any], added: Sequence[str]) -> bool:
    """Take out of a (non-streamed) answer what only the capture fields agl ``added`` to the request made the backend
    send: the agent gets the answer it asked for (the span keeps the ids and logprobs). True when anything changed."""
    changed = False
    choices = [c for c in data.get("choices") or [] if isinstance(c, dict)]
    if "return_token_ids" in added:
        changed = data.pop("prompt_token_ids", None) is not None or changed
        for choice in choices:
            changed = choice.pop("token_ids", None) is not None or changed
    if "logprobs" in added:
        for choice in choices:
            if choice.get("logprobs") is not None:
                choice["logprobs"] = None
                changed = True
    return changed


def _error_event(message: str, kind: str = "agl_span_not_stored", code: int = 503) -> bytes:
    """An SSE event OpenAI clients raise ``APIError`` on."""
    body = {"error": {"message": message, "type": kind, "code": code}}
    return b"data: " + json.dumps(body).encode() + b"\n\n"


class Gateway:
    """OpenAI-compatible proxy that records one ``llm`` span per call and asks the backend for exact tokens.

    ``spans`` is the pipeline the spans are stored through; ``timeout`` bounds a non-streaming call as a whole and
    each read of a stream; ``ack_timeout`` bounds how long an answer waits for its span to be stored;
    ``allow_backends`` (None: any) the backends forwarded to; ``max_response_bytes`` one backend answer.
    """

    def __init__(
        self,
        store: Store,
        spans: SpanPipeline,
        timeout: float,
        *,
        ack_timeout: float = SPAN_ACK_TIMEOUT_S,
        cache_size: int = 10_000,
        allow_backends: Sequence[str] | None = None,
        max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
    ) -> None:
        if not timeout > 0:
            raise ValueError(f"gateway timeout must be a positive number of seconds, got {timeout!r}")
        if max_response_bytes < 1:
            raise ValueError(f"gateway max_response_bytes must be at least 1, got {max_response_bytes!r}")
        self.store = store
        self.spans = spans
        self.timeout = timeout
        self.ack_timeout = ack_timeout
        self.allowed = None if allow_backends is None else AllowedBackends(allow_backends)
        self.max_response_bytes = max_response_bytes
        self._cache: OrderedDict[tuple[int, str], LLM] = OrderedDict()
        self._cache_size = cache_size
        self._no_ids: OrderedDict[tuple[str, str], str] = OrderedDict()
        self._client: httpx.AsyncClient | None = None

    @property
    def client(self) -> httpx.AsyncClient:
        """One shared client, created on first use inside the server's event loop."""
        if self._client is None:
            self._client = httpx.AsyncClient(
                timeout=httpx.Timeout(self.timeout, connect=min(self.timeout, 10.0)),
                limits=httpx.Limits(max_connections=1000, max_keepalive_connections=200),
                # no cookie kept: the client is shared by every agent's calls, so a cookie one backend answer set
                # must never ride along on another agent's call
                cookies=CookieJar(policy=DefaultCookiePolicy(allowed_domains=[])),
            )
        return self._client

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    # ------------------------------------------------------------------------------------------- what to call
    def check_backends(self, resources: Mapping[str, Resource]) -> None:
        """Refuse (422 naming ``resources.<name>.base_url``) LLM resources whose backend is not allowed."""
        if self.allowed is None:
            return
        for name, resource in resources.items():
            if isinstance(resource, LLM) and not self.allowed.allows(resource.base_url):
                raise HTTPException(
                    422,
                    f"resources.{name}.base_url: backend {resource.base_url!r} matches none of this server's allowed "
                    f"backends ({self.allowed}); start agl server with --allow-backend PATTERN to allow it",
                )

    async def resolve(self, rollout_id: str, attempt_id: str, name: str) -> LLM:
        """The LLM resource ``name`` of the rollout, once the rollout is running and ``attempt_id`` is its live
        attempt (checked on every call with one read, ``Store.live_attempt``; the resources of a version are cached:
        versions are immutable)."""
        try:
            live = await run_in_threadpool(self.store.live_attempt, rollout_id)
        except NotFound:
            raise HTTPException(404, f"gateway: unknown rollout {rollout_id!r}") from None
        if live.status != "running":
            raise _Refused(
                409,
                f"gateway: rollout {rollout_id!r} is {live.status}, not running: calls of attempt {attempt_id!r} "
                "are no longer forwarded",
            )
        if live.attempt_id != attempt_id:
            attempts = await run_in_threadpool(self.store.list_attempts, rollout_id)  # only to say why
            attempt = next((a for a in attempts if a.attempt_id == attempt_id), None)
            if attempt is None:
                raise _Refused(
                    409,
                    f"gateway: rollout {rollout_id!r} has no attempt {attempt_id!r}; only its live attempt's calls "
                    "are forwarded",
                )
            raise _Refused(
                409,
                f"gateway: attempt {attempt_id!r} of rollout {rollout_id!r} has ended ({attempt.status}); only the "
                "rollout's live attempt's calls are forwarded",
            )
        return await self._llm(rollout_id, live.resources_version, name)

    async def _llm(self, rollout_id: str, version: int, name: str) -> LLM:
        key = (version, name)
        llm = self._cache.get(key)
        if llm is not None:
            self._cache.move_to_end(key)
            return llm
        resources: ResourceSet = await run_in_threadpool(self.store.get_resources, version)
        resource = resources.resources.get(name)
        if resource is None:
            raise HTTPException(
                404,
                f"gateway: resources version {resources.version} of rollout {rollout_id!r} has no resource "
                f"{name!r} (it has: {', '.join(sorted(resources.resources)) or 'none'})",
            )
        if not isinstance(resource, LLM):
            raise HTTPException(404, f"gateway: resource {name!r} is a {resource.kind}, not an LLM")
        if self.allowed is not None and not self.allowed.allows(resource.base_url):
            raise _Refused(
                403,
                f"gateway: the backend {resource.base_url!r} of resource {name!r} matches none of this server's "
                f"allowed backends ({self.allowed}); nothing was forwarded",
            )
        self._cache[key] = resource
        if len(self._cache) > self._cache_size:
            self._cache.popitem(last=False)
        return resource

    @staticmethod
    def _headers(llm: LLM) -> dict[str, str]:
        return {"authorization": f"Bearer {llm.api_key}", "content-type": "application/json"}

    async def _read(self, resp: httpx.Response) -> bytes:
        """The whole body of ``resp`` (then closed); ``_TooLarge`` past ``max_response_bytes``."""
        try:
            declared = resp.headers.get("content-length", "")
            if declared.isdigit() and int(declared) > self.max_response_bytes:
                raise _TooLarge
            parts: list[bytes] = []
            size = 0
            async for part in resp.aiter_bytes():
                size += len(part)
                if size > self.max_response_bytes:
                    raise _TooLarge
                parts.append(part)
            return b"".join(parts)
        finally:
            await asyncio.shield(resp.aclose())

    def _too_large(self, what: str) -> str:
        return (
            f"gateway: the LLM backend's {what} is over this server's limit of {self.max_response_bytes} bytes "
            "(agl server --gateway-max-response-bytes)"
        )

    async def models(self, rollout_id: str, attempt_id: str, name: str) -> Response:
        try:
            llm = await self.resolve(rollout_id, attempt_id, name)
        except _Refused as refused:
            return refused.response()
        url = llm.base_url.rstrip("/") + "/models"
        try:
            resp = await self.client.send(
                self.client.build_request("GET", url, headers=self._headers(llm)), stream=True
            )
            content = await self._read(resp)
        except _TooLarge:
            return error(502, self._too_large("answer"))
        except httpx.HTTPError as exc:
            return error(502, f"gateway: LLM backend {llm.base_url} unreachable: {type(exc).__name__}: {exc}")
        return Response(_scrubbed(content, llm), resp.status_code, media_type=resp.headers.get("content-type"))

    # ------------------------------------------------------------------------------------------- one call
    async def chat(self, request: Request, rollout_id: str, attempt_id: str, name: str) -> Response:
        for what, value, most in (
            ("attempt id", attempt_id, 128),
            (f"header {HEADER_PARENT_SPAN}", request.headers.get(HEADER_PARENT_SPAN, ""), 128),
            (f"header {HEADER_AGENT}", request.headers.get(HEADER_AGENT, ""), 512),
        ):
            if len(value) > most:
                return error(400, f"gateway: {what} is {len(value)} characters long; at most {most} allowed")
        sequence = parse_sequence(request.headers.get(HEADER_SEQUENCE))
        try:
            llm = await self.resolve(rollout_id, attempt_id, name)
        except _Refused as refused:
            return refused.response()
        body = parse_body(await read_body(request), _CHAT_BODY)
        if not isinstance(body, dict):
            return error(400, f"chat completion body must be a JSON object, not {type(body).__name__}")
        for key, value in llm.sampling.items():
            body.setdefault(key, value)
        body.setdefault("model", llm.model)
        route, routed_by = llm.route(_agent_of(request)) if llm.routes else (None, "")
        if route is not None:
            body["model"] = route.model  # the agent names the shared endpoint; its policy is the route's
        backend = llm.base_url.rstrip("/")
        learned = (backend, str(body["model"]))
        added: list[str] = []
        if llm.token_ids == "require":
            if body.get("return_token_ids") is not True:
                body["return_token_ids"] = True
                added.append("return_token_ids")
            if "logprobs" not in body:
                body["logprobs"] = True
                added.append("logprobs")
        elif llm.token_ids == "auto" and learned not in self._no_ids:
            for field in CAPTURE_FIELDS:
                if field not in body:  # the agent's own value goes as it is
                    body[field] = True
                    added.append(field)
        call = _LLMCall(request, body, rollout_id, attempt_id, name, llm.base_url, sequence, llm.token_ids)
        call.added = added
        if llm.token_ids == "off":
            call.attrs[ATTR_TOKEN_IDS] = "off"
        elif llm.token_ids == "auto" and learned in self._no_ids:
            self._no_ids.move_to_end(learned)
            call.attrs[ATTR_TOKEN_IDS] = "unsupported"
        version = route.weights_version if route is not None else llm.weights_version
        if version is not None:
            # Backends that cannot report it (vLLM) serve exactly the published version; one that reports
            # ``agl_weights_version`` (agl's policy server) overrides this with what it actually served.
            call.attrs[ATTR_WEIGHTS_VERSION] = version
        if routed_by:
            call.attrs[ATTR_POLICY], call.attrs[ATTR_POLICY_ROUTE] = str(body["model"]), routed_by
        stream = bool(body.get("stream"))
        exchange = asyncio.ensure_future(self._exchange(call, llm, body, added, learned, stream))
        gone = asyncio.ensure_future(_disconnected(request))
        try:
            done, _ = await asyncio.wait(
                (exchange, gone), timeout=None if stream else self.timeout, return_when=asyncio.FIRST_COMPLETED
            )
        except BaseException:
            exchange.cancel()
            raise
        finally:
            gone.cancel()
        if exchange in done:
            return exchange.result()
        exchange.cancel()  # the client left, or the call ran out of time: stop waiting on the backend
        try:
            return await exchange  # it finished after all
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if current is not None and current.cancelling():
                raise
        if call.recorded:  # it finished and was being stored when it was cancelled
            return unavailable("gateway: the call ended while its answer was being stored")
        if gone in done:
            call.fail(499, "client disconnected before the LLM backend answered; the backend request was cancelled")
            self._put_unwaited(call)
            return Response(status_code=499)
        message = (
            f"gateway: the LLM backend {backend} did not answer within {self.timeout:g}s (agl server --gateway-timeout)"
        )
        call.fail(504, message)
        return await self._answer(call, error(504, message))

    async def _send(self, llm: LLM, body: dict[str, Any]) -> httpx.Response:
        url = llm.base_url.rstrip("/") + "/chat/completions"
        upstream = self.client.build_request("POST", url, content=json.dumps(body), headers=self._headers(llm))
        return await self.client.send(upstream, stream=True)

    async def _exchange(
        self,
        call: _LLMCall,
        llm: LLM,
        body: dict[str, Any],
        added: list[str],
        learned: tuple[str, str],
        stream: bool,
    ) -> Response:
        """Forward the call (again without agl's capture fields when the backend refuses them) and answer it."""
        backend = llm.base_url
        try:
            resp = await self._send(llm, body)
            if added and resp.status_code in _ARGUMENT_REFUSED:
                content = _scrubbed(await self._read(resp), llm)
                said = content.decode(errors="replace")
                named = [field for field in added if field in said]
                if not named:
                    return await self._whole(resp, call, llm, content)
                if llm.token_ids == "require":
                    message = (
                        f"gateway: LLM.token_ids='require' but the backend {backend} refused the field(s) that ask "
                        f"for token ids ({', '.join(named)}): HTTP {resp.status_code}: {said[:1000]}; use a backend "
                        "that returns token ids (vLLM, agl's policy server) or set token_ids='auto' to run without them"
                    )
                    call.fail(400, message)
                    return await self._answer(call, _refusal(400, message))
                call.attrs[ATTR_TOKEN_IDS] = "unsupported"
                resp = await self._send(llm, {key: value for key, value in body.items() if key not in added})
                if resp.status_code not in _ARGUMENT_REFUSED:
                    self._no_ids[learned] = said[:1000]
                    if len(self._no_ids) > _NO_IDS_CACHE:
                        self._no_ids.popitem(last=False)
                    log.info(
                        "gateway: backend %s (model %s) does not accept %s; calling it without token capture",
                        backend,
                        learned[1],
                        ", ".join(named),
                    )
            if resp.status_code >= 300 or not stream:
                return await self._whole(resp, call, llm)
        except _TooLarge:
            message = self._too_large("answer")
            call.fail(502, message)
            return await self._answer(call, error(502, message))
        except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
            message = f"gateway: LLM backend {backend} unreachable: {type(exc).__name__}: {exc}"
            call.fail(502, message)
            return await self._answer(call, error(502, message))
        except httpx.TimeoutException as exc:
            message = (
                f"gateway: the LLM backend {backend} did not answer within {self.timeout:g}s "
                f"(agl server --gateway-timeout): {type(exc).__name__}"
            )
            call.fail(504, message)
            return await self._answer(call, error(504, message))
        except httpx.HTTPError as exc:
            message = f"gateway: LLM backend {backend} failed: {type(exc).__name__}: {exc}"
            call.fail(502, message)
            return await self._answer(call, error(502, message))
        return _RelayResponse(
            self._relay(resp, call), functools.partial(self._stream_ended, resp, call), resp.status_code
        )

    async def _stream_ended(self, resp: httpx.Response, call: _LLMCall) -> None:
        """However a relayed stream's response ended: the upstream closed and the call recorded (a client that left
        before the first byte leaves a relay that never ran)."""
        if not call.recorded:
            call.fail(499, "client disconnected before the stream began")
            call.finish_stream()
            self._put_unwaited(call)
        await resp.aclose()

    async def _stored(self, call: _LLMCall) -> str | None:
        """Store the call's span and wait until it is durable: None, or why it could not be stored."""
        try:
            call.recorded = True
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
            call.recorded = True
            self.spans.put(call.span())
        except (TypeError, ValueError) as exc:
            log.error("gateway: the span of a call to rollout %s could not be recorded: %s", call.rollout_id, exc)

    async def _answer(self, call: _LLMCall, response: Response) -> Response:
        """``response`` once the call's span is stored; a success whose span could not be stored becomes a 503."""
        problem = await self._stored(call)
        if problem is None or response.status_code >= 300:
            return response
        return unavailable(
            f"gateway: the LLM answered but the call could not be recorded ({problem}); the answer is withheld so "
            "that no answered call goes unrecorded; retry the call"
        )

    async def _whole(self, resp: httpx.Response, call: _LLMCall, llm: LLM, content: bytes | None = None) -> Response:
        """Answer with the backend's whole (non-streaming, or error) answer; ``content`` when it was read already. An
        error answer is relayed and recorded without ``llm``'s key."""
        if content is None:
            try:
                content = await self._read(resp)  # _TooLarge goes to the caller
            except httpx.HTTPError as exc:
                message = f"gateway: LLM backend failed mid-response: {type(exc).__name__}: {exc}"
                call.fail(502, message)
                return await self._answer(call, error(502, message))
        if resp.status_code >= 300:
            content = _scrubbed(content, llm)
            call.fail(resp.status_code, content.decode(errors="replace")[:4000])
        else:
            try:
                data = json.loads(content)
                call.response(data if isinstance(data, dict) else {})
                if call.added and isinstance(data, dict) and _drop_added(data, call.added):
                    content = json.dumps(data).encode()
            except ValueError:
                call.fail(502, "LLM backend returned a non-JSON body")
            problem = call.ids_problem()
            if problem is not None:
                call.fail(400, problem)
                return await self._answer(call, _refusal(400, problem))
        media_type = resp.headers.get("content-type", "application/json")
        return await self._answer(call, Response(content, resp.status_code, media_type=media_type))

    async def _relay(self, resp: httpx.Response, call: _LLMCall) -> AsyncGenerator[bytes, None]:
        """Forward the backend's SSE bytes as they arrive while assembling the span; record it however it ends.

        The bytes that complete the ``[DONE]`` event (or, without one, the end of the stream) are sent only once the
        span is stored; if it cannot be, an error event takes the place of ``[DONE]``. A stream over
        ``max_response_bytes`` in all is cut with an error event; so is one without the token ids
        ``LLM.token_ids='require'`` asks for, and one the backend broke off before its end.
        """
        parser = _SSEParser()
        recorded = False
        broke: str | None = None
        size = 0

        async def record() -> bytes | None:
            """Store the span and wait for it: None when stored, else the error event to send instead."""
            nonlocal recorded
            recorded = True
            call.finish_stream()
            empty = None
            if call.status == "ok" and not call.chunks:
                empty = "gateway: the LLM backend's stream held no chat completion chunk (no JSON data events)"
                call.fail(502, empty)
            missing_ids = call.ids_problem()
            if missing_ids is not None:
                call.fail(400, missing_ids)
            problem = await self._stored(call)
            if missing_ids is not None:
                return _error_event(missing_ids, "agl_token_ids_required", 400)
            if empty is not None:
                return _error_event(empty, "agl_backend_stream_empty", 502)
            if problem is None:
                return None
            return _error_event(f"gateway: the call could not be recorded ({problem}); retry the call")

        try:
            async for raw in resp.aiter_bytes():
                size += len(raw)
                if size > self.max_response_bytes:
                    message = self._too_large("stream") + "; the stream was cut"
                    call.fail(502, message)
                    await record()
                    yield b"\n\n" + _error_event(message, "agl_response_too_large", 502)
                    return
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
            broke = f"gateway: LLM backend stream broke: {type(exc).__name__}: {exc}"
            call.fail(502, broke)
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
            if broke is not None:  # never let a cut stream look like a finished answer
                yield b"\n\n" + (failure or _error_event(broke, "agl_backend_stream_broke", 502))
            elif failure is not None:
                yield failure
