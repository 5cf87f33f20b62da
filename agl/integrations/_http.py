"""Gateway headers on the agent's own HTTP requests: how a framework's view of a call joins the gateway's record.

agl wraps ``send`` of httpx's ``Client`` / ``AsyncClient`` (and httpx2's, used by openai>=3) once per process. A
request bound for the CURRENT rollout's gateway route (``/gw/<rollout>/<attempt>/``) gets ``x-agl-sequence``: the
rollout's next sequence number, taken as the request is sent, so the gateway's ``llm`` span and the spans the runner
records (rewards, tools) are ordered by one counter rather than by the clocks of two hosts. It then asks each
registered tagger, in order, for the call it belongs to (agent name, call id, parent span), and gets ``x-agl-agent``,
``x-agl-call-id`` and ``x-agl-parent-span`` headers; the gateway tags its ``llm`` span from them. Other requests are
never touched.

Concurrency model: taggers read the request's own context (ContextVars), never shared "current call" state, so
concurrent calls of different agents cannot take each other's tag. Errors are logged, never raised into the agent.
"""

from __future__ import annotations

import functools
import importlib
import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from agl.core.emit import RolloutContext, current_rollout, current_scope
from agl.core.types import HEADER_AGENT, HEADER_CALL_ID, HEADER_PARENT_SPAN, HEADER_SEQUENCE
from agl.integrations._patch import Patches

log = logging.getLogger("agl.integrations")

_HEADER_SAFE = "".join(chr(c) for c in range(0x20, 0x7F) if chr(c) != "%")


@dataclass(frozen=True)
class CallTag:
    """Who makes a gateway request: the agent, the framework's id for the call, and the span to hang it under."""

    agent: str | None
    call_id: str | None = None
    parent_span: str | None = None


#: Returns the tag of the call the request being sent belongs to (in the request's context), or None.
Tagger = Callable[[RolloutContext], CallTag | None]
_taggers: list[Tagger] = []
_lock = threading.Lock()
_patched = False
_PATCHES = Patches("httpx")


def register_tagger(tagger: Tagger) -> None:
    """Add a framework's tagger (idempotent) and make sure the HTTP clients are wrapped."""
    with _lock:
        if tagger not in _taggers:
            _taggers.append(tagger)
    patch_http_clients()


def gateway_marker(ctx: RolloutContext) -> str:
    """The path segment every gateway URL of this rollout attempt contains."""
    return f"/gw/{ctx.rollout_id}/{ctx.attempt_id}/"


def header_value(text: str) -> str:
    """Percent-encode what HTTP headers cannot carry (the gateway decodes it)."""
    return quote(text, safe=_HEADER_SAFE)


def _tag(ctx: RolloutContext) -> CallTag:
    for tagger in list(_taggers):
        tag = tagger(ctx)
        if tag is not None:
            return tag
    agent, parent = current_scope()
    return CallTag(agent=agent, parent_span=parent)


def tag_request(request: Any) -> None:
    """Add the sequence / agent / call / parent headers to a request bound for the current rollout's gateway route.

    Every send gets a fresh sequence number (a client's retry of a call is a new request, ordered where it was sent).
    """
    ctx = current_rollout()
    if ctx is None or gateway_marker(ctx) not in request.url.path:
        return
    headers = request.headers
    headers[HEADER_SEQUENCE] = str(ctx.next_sequence())
    tag = _tag(ctx)
    if tag.call_id is not None and HEADER_CALL_ID not in headers:
        headers[HEADER_CALL_ID] = tag.call_id
    if tag.agent is not None and HEADER_AGENT not in headers:
        headers[HEADER_AGENT] = header_value(tag.agent)
    if tag.parent_span is not None and HEADER_PARENT_SPAN not in headers:
        headers[HEADER_PARENT_SPAN] = tag.parent_span


def _tag_safely(request: Any) -> None:
    try:
        tag_request(request)
    except Exception:
        log.warning("agl could not tag an LLM request", exc_info=True)


def _wrap_send(original: Callable[..., Any], is_async: bool) -> Callable[..., Any]:
    if is_async:

        @functools.wraps(original)
        async def asend(self: Any, request: Any, *args: Any, **kwargs: Any) -> Any:
            _tag_safely(request)
            return await original(self, request, *args, **kwargs)

        wrapped: Callable[..., Any] = asend
    else:

        @functools.wraps(original)
        def send(self: Any, request: Any, *args: Any, **kwargs: Any) -> Any:
            _tag_safely(request)
            return original(self, request, *args, **kwargs)

        wrapped = send
    return wrapped


def patch_http_clients() -> None:
    """Wrap ``send`` of httpx's and httpx2's clients once per process (idempotent)."""
    global _patched
    with _lock:
        if _patched:
            return
        for module_name in ("httpx", "httpx2"):
            try:
                module = importlib.import_module(module_name)
            except ImportError:
                continue
            for class_name, is_async in (("Client", False), ("AsyncClient", True)):
                cls = getattr(module, class_name, None)
                if cls is not None:
                    _PATCHES.wrap(cls, "send", functools.partial(_wrap_send, is_async=is_async))
        _patched = True


@contextmanager
def activate() -> Iterator[None]:
    """The capture scope for agents that call the gateway with a plain HTTP client (httpx, the OpenAI SDK).

    Wraps the clients so every gateway request of the rollout carries its sequence number even when no framework
    integration is installed. Nothing to undo on exit: the wrapper acts only on requests of the current rollout.
    """
    patch_http_clients()
    yield
