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
import logging
from collections import OrderedDict
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping, Sequence
from typing import Any

import aiohttp
from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import TypeAdapter
from pydantic_core import from_json, to_json
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException

from agl.core.jsonsafe import INT64_MAX
from agl.core.server.backends import AllowedBackends
from agl.core.server.errors import Receive, Scope, Send, error, parse_body, read_body, unavailable
from agl.core.server.llm_call import LLMCall, SSEParser, agent_of, drop_added, error_event
from agl.core.span_pipeline import SpanPipeline
from agl.core.store.base import NotFound, Store
from agl.core.types import (
    ATTR_POLICY,
    ATTR_POLICY_ROUTE,
    ATTR_TOKEN_IDS,
    ATTR_WEIGHTS_VERSION,
    HEADER_AGENT,
    HEADER_PARENT_SPAN,
    HEADER_SEQUENCE,
    LLM,
    JsonData,
    Resource,
    ResourceSet,
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


def _redirected(resp: aiohttp.ClientResponse, llm: LLM) -> str | None:
    """Why a 3xx answer of the backend is not the agent's answer (None for any other status): the gateway never
    follows a redirect, which could lead to a host that ``--allow-backend`` does not admit, and says where it led."""
    if not 300 <= resp.status < 400:
        return None
    target = _scrubbed(resp.headers.get("location", "").encode(), llm).decode(errors="replace")[:500]
    return (
        f"gateway: the LLM backend {llm.base_url} answered HTTP {resp.status} redirecting to "
        f"{target or '(no Location)'}; the gateway never follows redirects: publish the URL the backend means as "
        "the resource's base_url"
    )


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
        self._client: aiohttp.ClientSession | None = None

    @property
    def client(self) -> aiohttp.ClientSession:
        """One shared session, created on first use inside the server's event loop. aiohttp, not httpx: a call
        forwarded through it costs the server about half the CPU (measured: ~1.0 vs ~2.0 ms per call)."""
        if self._client is None:
            # Each of aiohttp's defaults that decides where a call goes or what comes back is set here on purpose.
            # Redirects are never followed (``allow_redirects=False`` on every request, ``_redirected``).
            self._client = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=None, connect=min(self.timeout, 10.0), sock_read=self.timeout),
                connector=aiohttp.TCPConnector(limit=1000, limit_per_host=0),
                # no cookie kept: the session is shared by every agent's calls, so a cookie one backend answer set
                # must never ride along on another agent's call
                cookie_jar=aiohttp.DummyCookieJar(),
                # no proxy from the environment (HTTP_PROXY, ...): a call goes straight to the backend the resource
                # names and --allow-backend admits, and no agent's key passes through a host nobody published
                trust_env=False,
                # gzip/deflate answers are decoded before they are parsed and relayed (the relayed answer carries no
                # Content-Encoding), and --gateway-max-response-bytes counts the decoded bytes
                auto_decompress=True,
            )
        return self._client

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.close()
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
        attempt (checked on every call with one read: in place where the store can answer at once,
        ``Store.live_attempt_now``, else ``Store.live_attempt`` off the loop; the resources of a version are cached:
        versions are immutable)."""
        try:
            live = self.store.live_attempt_now(rollout_id)
            if live is None:
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

    async def _read(self, resp: aiohttp.ClientResponse) -> bytes:
        """The whole body of ``resp`` (then released); ``_TooLarge`` past ``max_response_bytes``."""
        try:
            declared = resp.headers.get("content-length", "")
            if declared.isdigit() and int(declared) > self.max_response_bytes:
                raise _TooLarge
            parts: list[bytes] = []
            size = 0
            async for part in resp.content.iter_any():
                size += len(part)
                if size > self.max_response_bytes:
                    raise _TooLarge
                parts.append(part)
            return b"".join(parts)
        finally:
            resp.release()  # back to the pool when read to the end, else its connection is closed

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
            resp = await self.client.get(url, headers=self._headers(llm), allow_redirects=False)
            content = await self._read(resp)
        except _TooLarge:
            return error(502, self._too_large("answer"))
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            return error(502, f"gateway: LLM backend {llm.base_url} unreachable: {type(exc).__name__}: {exc}")
        redirected = _redirected(resp, llm)
        if redirected is not None:
            return error(502, redirected)
        return Response(_scrubbed(content, llm), resp.status, media_type=resp.headers.get("content-type"))

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
        route, routed_by = llm.route(agent_of(request)) if llm.routes else (None, "")
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
        call = LLMCall(request, body, rollout_id, attempt_id, name, llm.base_url, sequence, llm.token_ids)
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

    async def _send(self, llm: LLM, body: dict[str, Any]) -> aiohttp.ClientResponse:
        url = llm.base_url.rstrip("/") + "/chat/completions"
        return await self.client.post(url, data=to_json(body), headers=self._headers(llm), allow_redirects=False)

    async def _exchange(
        self,
        call: LLMCall,
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
            if added and resp.status in _ARGUMENT_REFUSED:
                content = _scrubbed(await self._read(resp), llm)
                said = content.decode(errors="replace")
                named = [field for field in added if field in said]
                if not named:
                    return await self._whole(resp, call, llm, content)
                if llm.token_ids == "require":
                    message = (
                        f"gateway: LLM.token_ids='require' but the backend {backend} refused the field(s) that ask "
                        f"for token ids ({', '.join(named)}): HTTP {resp.status}: {said[:1000]}; use a backend "
                        "that returns token ids (vLLM, agl's policy server) or set token_ids='auto' to run without them"
                    )
                    call.fail(400, message)
                    return await self._answer(call, _refusal(400, message))
                call.attrs[ATTR_TOKEN_IDS] = "unsupported"
                resp = await self._send(llm, {key: value for key, value in body.items() if key not in added})
                if resp.status not in _ARGUMENT_REFUSED:
                    self._no_ids[learned] = said[:1000]
                    if len(self._no_ids) > _NO_IDS_CACHE:
                        self._no_ids.popitem(last=False)
                    log.info(
                        "gateway: backend %s (model %s) does not accept %s; calling it without token capture",
                        backend,
                        learned[1],
                        ", ".join(named),
                    )
            if resp.status >= 300 or not stream:
                return await self._whole(resp, call, llm)
        except _TooLarge:
            message = self._too_large("answer")
            call.fail(502, message)
            return await self._answer(call, error(502, message))
        except (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError) as exc:
            message = f"gateway: LLM backend {backend} unreachable: {type(exc).__name__}: {exc}"
            call.fail(502, message)
            return await self._answer(call, error(502, message))
        except TimeoutError as exc:  # aiohttp's read timeouts are TimeoutErrors
            message = (
                f"gateway: the LLM backend {backend} did not answer within {self.timeout:g}s "
                f"(agl server --gateway-timeout): {type(exc).__name__}"
            )
            call.fail(504, message)
            return await self._answer(call, error(504, message))
        except (aiohttp.ClientError, ValueError) as exc:  # ValueError: a host name DNS cannot take (idna)
            message = f"gateway: LLM backend {backend} failed: {type(exc).__name__}: {exc}"
            call.fail(502, message)
            return await self._answer(call, error(502, message))
        return _RelayResponse(self._relay(resp, call), functools.partial(self._stream_ended, resp, call), resp.status)

    async def _stream_ended(self, resp: aiohttp.ClientResponse, call: LLMCall) -> None:
        """However a relayed stream's response ended: the upstream closed and the call recorded (a client that left
        before the first byte leaves a relay that never ran)."""
        if not call.recorded:
            call.fail(499, "client disconnected before the stream began")
            call.finish_stream()
            self._put_unwaited(call)
        resp.release()

    async def _stored(self, call: LLMCall) -> str | None:
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

    def _put_unwaited(self, call: LLMCall) -> None:
        """Store the span of a call nobody waits for any more (its client left); a failure is only logged."""
        try:
            call.recorded = True
            self.spans.put(call.span())
        except (TypeError, ValueError) as exc:
            log.error("gateway: the span of a call to rollout %s could not be recorded: %s", call.rollout_id, exc)

    async def _answer(self, call: LLMCall, response: Response) -> Response:
        """``response`` once the call's span is stored; a success whose span could not be stored becomes a 503."""
        problem = await self._stored(call)
        if problem is None or response.status_code >= 300:
            return response
        return unavailable(
            f"gateway: the LLM answered but the call could not be recorded ({problem}); the answer is withheld so "
            "that no answered call goes unrecorded; retry the call"
        )

    async def _whole(
        self, resp: aiohttp.ClientResponse, call: LLMCall, llm: LLM, content: bytes | None = None
    ) -> Response:
        """Answer with the backend's whole (non-streaming, or error) answer; ``content`` when it was read already. An
        error answer is relayed and recorded without ``llm``'s key."""
        if content is None:
            try:
                content = await self._read(resp)  # _TooLarge goes to the caller
            except (aiohttp.ClientError, TimeoutError) as exc:
                message = f"gateway: LLM backend failed mid-response: {type(exc).__name__}: {exc}"
                call.fail(502, message)
                return await self._answer(call, error(502, message))
        redirected = _redirected(resp, llm)
        if redirected is not None:
            call.fail(502, redirected)
            return await self._answer(call, error(502, redirected))
        if resp.status >= 300:
            content = _scrubbed(content, llm)
            call.fail(resp.status, content.decode(errors="replace")[:4000])
        else:
            try:
                data = from_json(content)
                call.response(data if isinstance(data, dict) else {})
                if call.added and isinstance(data, dict) and drop_added(data, call.added):
                    content = to_json(data)
            except ValueError:
                call.fail(502, "LLM backend returned a non-JSON body")
            problem = call.ids_problem()
            if problem is not None:
                call.fail(400, problem)
                return await self._answer(call, _refusal(400, problem))
        media_type = resp.headers.get("content-type", "application/json")
        return await self._answer(call, Response(content, resp.status, media_type=media_type))

    async def _relay(self, resp: aiohttp.ClientResponse, call: LLMCall) -> AsyncGenerator[bytes, None]:
        """Forward the backend's SSE bytes as they arrive while assembling the span; record it however it ends.

        The bytes that complete the ``[DONE]`` event (or, without one, the end of the stream) are sent only once the
        span is stored; if it cannot be, an error event takes the place of ``[DONE]``. A stream over
        ``max_response_bytes`` in all is cut with an error event; so is one without the token ids
        ``LLM.token_ids='require'`` asks for, and one the backend broke off before its end.
        """
        parser = SSEParser()
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
                return error_event(missing_ids, "agl_token_ids_required", 400)
            if empty is not None:
                return error_event(empty, "agl_backend_stream_empty", 502)
            if problem is None:
                return None
            return error_event(f"gateway: the call could not be recorded ({problem}); retry the call")

        try:
            async for raw in resp.content.iter_any():
                size += len(raw)
                if size > self.max_response_bytes:
                    message = self._too_large("stream") + "; the stream was cut"
                    call.fail(502, message)
                    await record()
                    yield b"\n\n" + error_event(message, "agl_response_too_large", 502)
                    return
                events = parser.feed(raw)
                done = False
                for event in events:
                    if event == b"[DONE]":
                        done = True
                        continue
                    try:
                        data = from_json(event)
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
        except (aiohttp.ClientError, TimeoutError) as exc:
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
            resp.release()
        if not recorded:
            failure = await record()
            if broke is not None:  # never let a cut stream look like a finished answer
                yield b"\n\n" + (failure or error_event(broke, "agl_backend_stream_broke", 502))
            elif failure is not None:
                yield failure
