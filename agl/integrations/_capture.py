"""What every framework integration builds its capture from: open spans, open model calls, and the wiring into agl.

An integration turns its framework's start and end hooks into spans of the current rollout. What does not depend on
the framework lives here, once:

- :class:`OpenSpan`: a span whose start was seen and whose end is awaited, with what recording it needs (rollout,
  name, agent, parent, id, start time, attributes). An entry without a span id is a pass-through scope (a plain
  LangChain chain, an SDK task span): it records nothing and hands its parent's scope to its children.
- :class:`OpenCall`: an open model call, which a gateway request joins by call id; one record per call
  (:meth:`OpenCall.gateway_kind`).
- :class:`SpanTable`: open spans keyed by the framework's own id for them, safe from any thread.
- :class:`CallStack`: the model calls open in the current context, where a gateway request finds its own call.
- :class:`Integration`: an integration's ``install()`` (its framework hooks, ``agl.emit_*`` scope resolver and
  gateway tagger, once per process) and ``activate()`` (what runners enter around each rollout), with the framework
  versions its capture was verified with (``agl.integrations._patch``).
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import threading
import time
from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from agl.core.emit import RolloutContext, ScopeResolver, current_rollout, record_exception, register_scope_resolver
from agl.core.jsonsafe import jsonable
from agl.core.types import (
    ATTR_ERROR_MESSAGE,
    ATTR_ERROR_TYPE,
    ATTR_OPERATION,
    ATTR_TOOL_ARGUMENTS,
    ATTR_TOOL_CALL_ID,
    ATTR_TOOL_NAME,
    ATTR_VIA_GATEWAY,
    SpanKind,
    new_id,
)
from agl.integrations._http import CallTag, Tagger, register_tagger
from agl.integrations._patch import ATTR_CAPTURE_DEGRADED, Verified

log = logging.getLogger("agl.integrations")

__all__ = ["CallStack", "Integration", "OpenCall", "OpenSpan", "SpanTable"]


def _span_id() -> str | None:
    return new_id("sp")


@dataclass(eq=False, kw_only=True)
class OpenSpan:
    """A span whose start was seen and whose end is awaited.

    ``parent`` is the span it hangs under (None: the rollout's current scope when it is recorded). ``span_id`` None
    makes it a pass-through scope that records nothing; its children attach to ``parent``.
    """

    ctx: RolloutContext
    name: str = ""
    agent: str | None = None
    parent: str | None = None
    span_id: str | None = field(default_factory=_span_id)
    start: float = field(default_factory=time.time)
    attrs: dict[str, Any] = field(default_factory=dict)

    @property
    def scope(self) -> str | None:
        """The span its children attach to: its own, or its parent's for a pass-through scope."""
        return self.span_id if self.span_id is not None else self.parent

    def describe_tool(self, name: str, arguments: Any, call_id: str | None = None) -> None:
        """The attributes of a tool run: operation, tool name, the call id the model gave it, arguments (when known)."""
        self.attrs[ATTR_OPERATION] = "execute_tool"
        self.attrs[ATTR_TOOL_NAME] = name
        if call_id is not None:
            self.attrs[ATTR_TOOL_CALL_ID] = call_id
        if arguments is not None:
            self.attrs[ATTR_TOOL_ARGUMENTS] = jsonable(arguments)

    def fail(self, exc: BaseException) -> None:
        """Describe ``exc`` on this span and record it as one ``exception`` span under it (once per exception
        object: an error bubbling out through several spans is recorded where it was first seen). The caller
        records this span with status ``error``."""
        self.attrs[ATTR_ERROR_TYPE] = type(exc).__name__
        self.attrs[ATTR_ERROR_MESSAGE] = str(exc)
        if isinstance(exc, Exception):
            record_exception(self.ctx, exc, agent=self.agent, parent_id=self.scope)

    def finish(self, kind: SpanKind, status: str = "ok", *, start: float | None = None) -> None:
        """Record the span, ending now (``start`` overrides the start time seen; a pass-through scope records
        nothing)."""
        if self.span_id is None:
            return
        self.ctx.record(
            kind,
            self.name,
            self.attrs,
            agent=self.agent,
            parent_id=self.parent,
            start_time=self.start if start is None else start,
            status=status,
            span_id=self.span_id,
        )


@dataclass(eq=False, kw_only=True)
class OpenCall(OpenSpan):
    """An open model call.

    ``call_id`` is the framework's id for it, which the gateway's ``llm`` span is joined by. ``open`` turns False when
    it ended; ``sent`` when a gateway request took it; ``gateway_url`` says its client points at this rollout's
    gateway route, so it reached the gateway even if no request was seen (a request sent from another context).
    """

    call_id: str | None = None
    open: bool = True
    sent: bool = False
    gateway_url: bool = False

    @property
    def via_gateway(self) -> bool:
        """Whether agl's gateway recorded this call."""
        return self.sent or self.gateway_url

    def gateway_kind(self) -> SpanKind:
        """Note ``agl.via_gateway`` and return the kind of this call's span: one record per call.

        ``custom`` when the call went through the gateway: the gateway's ``llm`` span (exact token ids) is THE record
        of the call, and this one, the framework's view, joins it by call id and by being its parent. ``llm`` when it
        did not: this span is then the only record, holds the request too, and training reports its missing token
        ids as a capture failure.
        """
        via_gateway = self.via_gateway
        self.attrs[ATTR_VIA_GATEWAY] = via_gateway
        return "custom" if via_gateway else "llm"

    def take(self) -> CallTag:
        """Mark the call as sent to the gateway and return the tag of its request."""
        self.sent = True
        return CallTag(agent=self.agent, call_id=self.call_id, parent_span=self.span_id)


K = TypeVar("K", bound=Hashable)
S = TypeVar("S", bound=OpenSpan)
C = TypeVar("C", bound=OpenCall)


class SpanTable(Generic[K, S]):
    """Open spans keyed by the framework's own id for them (a run id, an SDK span id, a task id).

    One reentrant lock guards the table, so hooks may run on any thread or event loop; hold ``lock`` to look an entry
    up and change it as one step. Tables that change together can share a lock.
    """

    def __init__(self, lock: threading.RLock | None = None) -> None:
        self.lock = lock if lock is not None else threading.RLock()
        self._open: dict[K, S] = {}

    def __len__(self) -> int:
        return len(self._open)

    def add(self, key: K, span: S, *, replace: bool = False) -> bool:
        """Register an open span. Without ``replace``, False (and nothing changed) when the key is already open:
        the first hook to see a start owns it, so two handlers fed the same run record it once."""
        with self.lock:
            if not replace and key in self._open:
                return False
            self._open[key] = span
            return True

    def get(self, key: K) -> S | None:
        with self.lock:
            return self._open.get(key)

    def pop(self, key: K) -> S | None:
        """Take the entry out when its end is seen (None when its start was not seen or it already ended)."""
        with self.lock:
            return self._open.pop(key, None)

    def discard(self, ctx: RolloutContext) -> list[S]:
        """Forget, and return, what a finished rollout left open (abandoned generators and streams, killed threads)."""
        with self.lock:
            gone = [key for key, span in self._open.items() if span.ctx is ctx]
            return [self._open.pop(key) for key in gone]


class CallStack(Generic[C]):
    """The model calls started in the current context and maybe not yet sent, innermost last.

    A tuple in a ContextVar: a copied context (a thread, an asyncio task) carries the calls open when it was copied
    and never sees calls started elsewhere, so a gateway request finds its own call however many run at once.
    """

    def __init__(self, name: str) -> None:
        self._calls: contextvars.ContextVar[tuple[C, ...]] = contextvars.ContextVar(name, default=())

    def get(self) -> tuple[C, ...]:
        return self._calls.get()

    def push(self, call: C) -> None:
        """Add a call that starts now (dropping calls that ended)."""
        self._calls.set((*(c for c in self._calls.get() if c.open), call))

    def innermost(self, ctx: RolloutContext) -> C | None:
        """The innermost open call, when it belongs to ``ctx``'s rollout."""
        for call in reversed(self._calls.get()):
            if call.open:
                return call if call.ctx is ctx else None
        return None


class Integration:
    """An integration's wiring into agl: what its ``install()`` and ``activate()`` do.

    ``hook`` hooks the framework (registers callbacks, wraps its functions); it runs once per process, however many
    threads install at once, under ``lock`` (reentrant). ``recheck`` runs on every install, under the lock: what the
    application may have undone since (a processor list it reset). The ``agl.emit_*`` scope resolver names the
    agent and parent span of code running inside the framework; the tagger finds the call a gateway request belongs
    to. ``forget`` drops what a finished rollout left open in the integration's tables. ``verified``: the framework
    versions the capture was checked against; outside them, install warns and every rollout captured gets one
    ``agl.capture.degraded`` span saying so.
    """

    def __init__(
        self,
        *,
        verified: Verified,
        hook: Callable[[], None] | None = None,
        recheck: Callable[[], None] | None = None,
        scope_resolver: ScopeResolver,
        tagger: Tagger,
        forget: Callable[[RolloutContext], object] | None = None,
    ) -> None:
        self._hook = hook
        self._recheck = recheck
        self._scope_resolver = scope_resolver
        self._tagger = tagger
        self._forget = forget
        self.verified = verified
        self.lock = threading.RLock()
        self.installed = False

    def install(self) -> None:
        """Hook the framework and register the scope resolver and tagger, once per process (``recheck``: every time)."""
        with self.lock:
            if self._recheck is not None:
                self._recheck()
            if self.installed:
                return
            degraded = self.verified.degraded()
            if degraded is not None:
                log.warning("agl: %s", degraded)
            if self._hook is not None:
                self._hook()
            register_scope_resolver(self._scope_resolver)
            register_tagger(self._tagger)
            self.installed = True

    def uninstall(self, unhook: Callable[[], None]) -> None:
        """Take the framework hooks out with ``unhook``; the next :meth:`install` hooks again."""
        with self.lock:
            unhook()
            self.installed = False

    @contextlib.contextmanager
    def activate(self) -> Iterator[None]:
        """Install, then capture for the rollout current on entry; on exit, forget what it left open."""
        self.install()
        ctx = current_rollout()
        degraded = self.verified.degraded()
        if ctx is not None and degraded is not None:
            ctx.record("custom", "capture degraded", {ATTR_CAPTURE_DEGRADED: degraded})
        try:
            yield
        finally:
            if ctx is not None and self._forget is not None:
                self._forget(ctx)
