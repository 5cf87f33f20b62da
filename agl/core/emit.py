"""The emit API and the current-rollout context that agent code (and integrations) report into.

Concurrency model: the active rollout lives in a ContextVar, so asyncio tasks started inside the agent inherit it; a
process-wide fallback covers plain threads (a runner process runs one rollout at a time). Spans go through a
``SpanSink`` (the runner side of ``agl.core.span_pipeline``), which writes them to the store in batches from a
background thread; ``flush()`` makes them durable. Values are made JSON-safe (or refused) where the span is recorded,
so one bad value never costs the rollout its other spans. Outside a rollout every emit function is a cheap no-op, so
the same agent code runs unchanged without agl.
"""

from __future__ import annotations

import contextlib
import contextvars
import itertools
import math
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from agl.core.jsonsafe import jsonable
from agl.core.span_pipeline import SpanPipeline, SpansNotStored, SpanTarget
from agl.core.types import ATTR_ERROR_MESSAGE, ATTR_ERROR_TYPE, ATTR_REWARD, Span, SpanKind, new_id


class SpanSink:
    """The spans of one attempt on their way to the store: a ``SpanPipeline`` that reports what it lost.

    Spans are written every ``interval`` seconds, at once when ``batch_size`` are waiting, and on ``flush``/``close``;
    a failed write is retried with backoff. When ``max_pending`` spans wait, ``add`` blocks the agent up to ``block``
    seconds, then drops the span. ``flush`` and ``close`` raise ``SpansNotStored`` once any span of the attempt was
    dropped (``dropped`` counts them), so an attempt that lost spans is never reported complete.
    """

    def __init__(
        self,
        writer: SpanTarget,
        batch_size: int = 256,
        interval: float = 0.2,
        *,
        max_pending: int = 10_000,
        block: float = 5.0,
    ) -> None:
        self._pipeline = SpanPipeline(
            writer, interval=interval, max_batch=batch_size, max_pending=max_pending, block=block, name="agl-span-sink"
        )

    def add(self, span: Span) -> None:
        """Queue one span (raises ``TypeError``/``ValueError`` for a span that can never be stored)."""
        self._pipeline.add(span)

    @property
    def dropped(self) -> int:
        """How many spans of this sink could not be stored."""
        return self._pipeline.dropped

    def flush(self, timeout: float | None = None) -> None:
        """Wait until every span added so far is stored; raises ``SpansNotStored`` if any could not be."""
        if not self._pipeline.flush(timeout):
            raise TimeoutError(f"spans were still being written after {timeout:g}s")
        self._raise_if_dropped()

    def close(self, timeout: float | None = None) -> None:
        """Write what is pending and stop; raises ``SpansNotStored`` if any span of this sink could not be stored."""
        if not self._pipeline.close(timeout):
            raise TimeoutError(f"spans were still being written after {timeout:g}s")
        self._raise_if_dropped()

    def _raise_if_dropped(self) -> None:
        if self._pipeline.dropped:
            raise SpansNotStored(self._pipeline.dropped, self._pipeline.last_error)


@dataclass
class RolloutContext:
    """The rollout an agent is running now: where its spans go and what it was handed."""

    rollout_id: str
    attempt_id: str
    sink: SpanSink
    resources: dict[str, Any] = field(default_factory=dict)
    task: Any = None
    _seq: Iterator[int] = field(default_factory=lambda: itertools.count(1))

    def next_sequence(self) -> int:
        return next(self._seq)

    def record(
        self,
        kind: SpanKind,
        name: str,
        attributes: dict[str, Any] | None = None,
        *,
        agent: str | None = None,
        parent_id: str | None = None,
        start_time: float | None = None,
        end_time: float | None = None,
        status: str = "ok",
        span_id: str | None = None,
    ) -> Span:
        """Add one finished span to this rollout (agent/parent default to the current scope).

        Attribute values JSON cannot hold (NaN, objects, integers beyond 64 bits, ...) are stored as ``jsonable``
        makes them; other invalid fields raise ``ValidationError`` here, in the code that recorded the span.
        """
        now = time.time()
        if agent is None or parent_id is None:
            scope_agent, scope_parent = current_scope()
            agent = agent if agent is not None else scope_agent
            parent_id = parent_id if parent_id is not None else scope_parent
        fields: dict[str, Any] = {
            "span_id": span_id or new_id("sp"),
            "rollout_id": self.rollout_id,
            "attempt_id": self.attempt_id,
            "parent_id": parent_id,
            "sequence": self.next_sequence(),
            "kind": kind,
            "name": name,
            "agent": agent,
            "start_time": start_time if start_time is not None else now,
            "end_time": end_time if end_time is not None else now,
            "status": "error" if status == "error" else "ok",
            "attributes": attributes or {},
        }
        try:
            span = Span(**fields)
        except ValidationError as exc:
            if any(e["loc"][:1] != ("attributes",) for e in exc.errors()):
                raise
            span = Span(**{**fields, "attributes": jsonable(fields["attributes"])})  # made safe here, never sent bad
        self.sink.add(span)
        return span


_current: contextvars.ContextVar[RolloutContext | None] = contextvars.ContextVar("agl_rollout", default=None)
_current_agent: contextvars.ContextVar[str | None] = contextvars.ContextVar("agl_agent", default=None)
_current_parent: contextvars.ContextVar[str | None] = contextvars.ContextVar("agl_parent_span", default=None)
_process_rollout: RolloutContext | None = None

#: Returns (agent, parent span id) from a framework's own context, e.g. the LangGraph node whose code is running.
ScopeResolver = Callable[[], tuple[str | None, str | None]]
_scope_resolvers: list[ScopeResolver] = []


def current_rollout() -> RolloutContext | None:
    """The rollout this code runs in (also from threads the agent started), or None outside agl."""
    return _current.get() or _process_rollout


def current_agent() -> str | None:
    """The agent name set by the innermost ``agent_scope`` (or an integration), if any."""
    return _current_agent.get()


def register_scope_resolver(resolver: ScopeResolver) -> None:
    """Let an integration name the agent and parent span of spans emitted inside framework code.

    ``emit_reward`` called in a LangGraph node then carries that node's agent name with no ``agent_scope``. An
    explicit ``agent_scope`` / ``span_scope`` still wins. Registering the same resolver again changes nothing.
    """
    if resolver not in _scope_resolvers:
        _scope_resolvers.append(resolver)


def current_scope() -> tuple[str | None, str | None]:
    """(agent, parent span id) a span recorded here gets: explicit scopes first, then the integrations' resolvers."""
    agent, parent = _current_agent.get(), _current_parent.get()
    for resolver in _scope_resolvers:
        if agent is not None and parent is not None:
            break
        try:
            found_agent, found_parent = resolver()
        except Exception:  # a broken integration must not break the agent's emit call
            continue
        agent = agent if agent is not None else found_agent
        parent = parent if parent is not None else found_parent
    return agent, parent


@contextmanager
def rollout_scope(ctx: RolloutContext) -> Iterator[RolloutContext]:
    """Make ``ctx`` the current rollout for this context and, as a fallback, for threads of this process."""
    global _process_rollout
    token = _current.set(ctx)
    previous, _process_rollout = _process_rollout, ctx
    try:
        yield ctx
    finally:
        _current.reset(token)
        _process_rollout = previous


@contextmanager
def agent_scope(name: str) -> Iterator[None]:
    """Attribute spans emitted inside this block to agent ``name`` (integrations set it for you)."""
    token = _current_agent.set(name)
    try:
        yield
    finally:
        _current_agent.reset(token)


@contextmanager
def span_scope(
    kind: SpanKind, name: str, attributes: dict[str, Any] | None = None, *, agent: str | None = None
) -> Iterator[dict[str, Any]]:
    """Record a span around a block; spans emitted inside become its children. Yields the (mutable) attributes.

    An exception inside the block marks the span ``error`` and propagates. Outside a rollout it records nothing.
    """
    attrs: dict[str, Any] = dict(attributes or {})
    ctx = current_rollout()
    if ctx is None:
        yield attrs
        return
    span_id = new_id("sp")
    start = time.time()
    parent = _current_parent.get()
    token = _current_parent.set(span_id)
    agent_token = _current_agent.set(agent) if agent is not None else None
    status = "ok"
    try:
        yield attrs
    except BaseException as exc:
        status = "error"
        attrs.setdefault(ATTR_ERROR_TYPE, type(exc).__name__)
        attrs.setdefault(ATTR_ERROR_MESSAGE, str(exc))
        raise
    finally:
        if agent_token is not None:
            _current_agent.reset(agent_token)
        _current_parent.reset(token)
        ctx.record(kind, name, attrs, agent=agent, parent_id=parent, start_time=start, status=status, span_id=span_id)


def emit_reward(value: float, name: str | None = None, *, agent: str | None = None) -> Span | None:
    """Record an intermediate reward; it attaches to the LLM call it follows. No-op outside a rollout."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"emit_reward: value must be a finite number, got {value!r}")
    ctx = current_rollout()
    if ctx is None:
        return None
    return ctx.record("reward", name or "reward", {ATTR_REWARD: float(value)}, agent=agent)


def emit_message(message: str, **attributes: Any) -> Span | None:
    """Record a free-text message (a log line worth keeping with the rollout)."""
    ctx = current_rollout()
    if ctx is None:
        return None
    return ctx.record("message", "message", {"agl.message": str(message), **attributes})


def record_exception(
    ctx: RolloutContext,
    exc: BaseException,
    *,
    agent: str | None = None,
    parent_id: str | None = None,
    **attributes: Any,
) -> Span | None:
    """Record ``exc`` once: an error bubbling through nested scopes (tool → node → graph → runner) is one span."""
    if getattr(exc, "__agl_recorded__", False):
        return None
    with contextlib.suppress(AttributeError, TypeError):
        exc.__agl_recorded__ = True  # type: ignore[attr-defined]
    stack = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    attrs = {"exception.type": type(exc).__name__, "exception.message": str(exc), "exception.stacktrace": stack}
    return ctx.record(
        "exception", type(exc).__name__, {**attrs, **attributes}, agent=agent, parent_id=parent_id, status="error"
    )


def emit_exception(exc: BaseException, **attributes: Any) -> Span | None:
    """Record an exception with its type, message and traceback (once per exception object)."""
    ctx = current_rollout()
    if ctx is None:
        return None
    return record_exception(ctx, exc, **attributes)


def emit_object(name: str, obj: Any, **attributes: Any) -> Span | None:
    """Record an object under ``name`` (kind ``custom``): JSON data as is, anything else as ``jsonable`` makes it."""
    ctx = current_rollout()
    if ctx is None:
        return None
    return ctx.record("custom", name, {"agl.object": jsonable(obj), **attributes})
