"""LangChain / LangGraph capture: agents, tools, model calls and errors of a rollout, with no change to agent code.

What is recorded (only while an agl rollout is current; outside one every hook is a no-op):

- ``agent`` span per LangGraph node run (name = node name), parent of everything that node does.
- ``tool`` span per tool run: ``gen_ai.tool.name``, ``gen_ai.tool.call.id``, ``gen_ai.tool.call.arguments``,
  ``gen_ai.tool.call.result``; status ``error`` (with ``error.type`` / ``error.message``) when the tool raised.
- one span per chat-model call, named ``langchain.chat_model``. When the call went through agl's gateway, the
  gateway's own ``llm`` span (exact token ids) is THE record of the call, so this span is kind ``custom``: the
  framework's view (agent, parsed response incl. ``invalid_tool_calls``, usage) joined to the gateway span by
  ``agl.call_id`` (= the LangChain run id) and by being its parent. When the call did not reach the gateway (another
  provider, a hard-coded URL), this span is kind ``llm`` with request messages, tool definitions and the response,
  so capture still sees the call and training reports its missing token ids as a capture failure.
- ``exception`` span for each error raised in a model call, tool or node (once per exception object).
  LangGraph's control-flow signals (interrupts, ``Command`` to a parent graph) are not errors.

Agent naming rule (the ``agent`` of every span above, and the ``x-agl-agent`` the gateway stores on its span):

1. an explicit ``agl.agent_scope(name)`` around the code wins;
2. else ``lc_agent_name`` (set by ``langchain.agents.create_agent(name=...)``);
3. else the LangGraph node path: the node names of ``langgraph_checkpoint_ns`` from the outermost graph in, joined
   with ``/``: a node ``writer`` of the top graph is ``writer``; node ``critic`` of a subgraph added as node
   ``solver`` is ``solver/critic``. ``agl.agent_path`` always holds this path.

``Trainer(agents=...)`` matches that name: ``["writer", "solver/critic"]`` selects single nodes; a regex such as
``"solver(/.*)?"`` selects a whole subgraph agent.

Joining with the gateway. While a chat-model run is open, ``on_chat_model_start`` (run inline, in the caller's
context) pushes the call onto a ContextVar; agl wraps ``httpx``/``httpx2`` ``Client.send`` and ``AsyncClient.send``
once per process, and a request to the CURRENT rollout's gateway route (``/gw/<rollout>/<attempt>/``) made in that
context takes the open call and gets ``x-agl-agent``, ``x-agl-call-id`` and ``x-agl-parent-span`` headers. The
gateway tags its span from them; no token is ever re-computed. Other HTTP requests are never touched.

Concurrency model: the recorder is one process-wide object; its run table (run id → open run) is guarded by one
lock, so callbacks from any thread or event loop are safe. Which call an HTTP request belongs to never comes from
shared state: it comes from the request's own context. LangGraph runs parallel branches in threads or asyncio tasks
with COPIED contexts, ``ainvoke`` / ``astream`` send the request from the context (or a copy of the context) where
the call started, and nothing else can run in one context between a call's start and its request, so concurrent
calls of different agents cannot see each other's call. (One ``generate`` call with several prompts starts them all
first, then sends them in order: they are matched in that order.) The handler is ``run_inline`` so async callback
managers do not move it to an executor with a copied context. End callbacks may run elsewhere (LangChain shields them
in a copied context): they only look runs up by run id. Errors inside the integration are logged, never raised into
the agent.

Zero config: :func:`install` registers a LangChain configure hook that adds :class:`AglCallbackHandler` to every
runnable while a rollout is current in this process (like the rollout itself, this covers the agent's plain threads
too), and tells :mod:`agl.core.emit` how to find the running node, so ``agl.emit_reward`` inside a node or tool
carries that node's agent name. Runners call :func:`activate` around each rollout. Passing ``AglCallbackHandler()``
explicitly as well records nothing twice: the hook skips managers that already hold one, and every handler feeds the
same recorder, which keeps one record per run id.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, cast
from uuid import UUID

from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.messages import BaseMessage, convert_to_openai_messages
from langchain_core.outputs import LLMResult
from langchain_core.runnables.config import var_child_runnable_config
from langchain_core.tracers.context import register_configure_hook

from agl.core.emit import (
    RolloutContext,
    current_agent,
    current_rollout,
    record_exception,
    register_scope_resolver,
)
from agl.core.types import (
    ATTR_CALL_ID,
    ATTR_FINISH_REASONS,
    ATTR_INPUT_MESSAGES,
    ATTR_INPUT_TOKENS,
    ATTR_MODEL,
    ATTR_OUTPUT_MESSAGES,
    ATTR_OUTPUT_TOKENS,
    ATTR_TOOLS,
    SpanKind,
    new_id,
)
from agl.integrations._http import CallTag, gateway_marker, register_tagger
from agl.core.jsonsafe import jsonable

__all__ = [
    "ATTR_AGENT_NAME",
    "ATTR_AGENT_PATH",
    "AglCallbackHandler",
    "activate",
    "agent_name",
    "agent_path",
    "install",
]

log = logging.getLogger("agl.integrations.langchain")

ATTR_AGENT_PATH = "agl.agent_path"
ATTR_AGENT_NAME = "gen_ai.agent.name"
ATTR_OPERATION = "gen_ai.operation.name"
ATTR_PROVIDER = "gen_ai.provider.name"
ATTR_RESPONSE_MODEL = "gen_ai.response.model"
ATTR_TOOL_NAME = "gen_ai.tool.name"
ATTR_TOOL_CALL_ID = "gen_ai.tool.call.id"
ATTR_TOOL_ARGUMENTS = "gen_ai.tool.call.arguments"
ATTR_TOOL_RESULT = "gen_ai.tool.call.result"
ATTR_VIA_GATEWAY = "agl.via_gateway"
ATTR_INVALID_TOOL_CALLS = "langchain.invalid_tool_calls"
ATTR_NODE = "langgraph.node"
ATTR_STEP = "langgraph.step"

CHAT_SPAN_NAME = "langchain.chat_model"

#: Exceptions LangGraph raises to steer the graph (interrupt, Command(graph=PARENT)), not failures.
_CONTROL_FLOW = frozenset({"GraphBubbleUp", "GraphInterrupt", "NodeInterrupt", "ParentCommand"})
#: Header values are ASCII: everything but printable ASCII (and ``%`` itself) is percent-encoded.


# ------------------------------------------------------------------------------------------------------- naming


def agent_path(metadata: dict[str, Any]) -> str | None:
    """The LangGraph node path of a run: node names of ``langgraph_checkpoint_ns``, outermost first, ``/``-joined.

    >>> agent_path({"langgraph_node": "critic", "langgraph_checkpoint_ns": "solver:1f2e|critic:9a8b"})
    'solver/critic'
    """
    ns = metadata.get("langgraph_checkpoint_ns")
    if isinstance(ns, str) and ns:
        names = [segment.split(":", 1)[0] for segment in ns.split("|")]
        path = "/".join(n for n in names if n)
        if path:
            return path
    node = metadata.get("langgraph_node")
    return node if isinstance(node, str) and node else None


def agent_name(metadata: dict[str, Any]) -> str | None:
    """The agent a run belongs to: explicit ``agl.agent_scope``, else ``lc_agent_name``, else its node path."""
    explicit = current_agent()
    if explicit is not None:
        return explicit
    named = metadata.get("lc_agent_name")
    if isinstance(named, str) and named:
        return named
    return agent_path(metadata)


# --------------------------------------------------------------------------------------------------- run table


@dataclass(eq=False)
class _Call:
    """An open chat-model call as the HTTP hook sees it."""

    run_id: str
    ctx: RolloutContext
    span_id: str
    agent: str | None
    open: bool = True
    sent: bool = False


@dataclass(eq=False)
class _Run:
    """What is known about one open LangChain run, from its start callback."""

    ctx: RolloutContext
    kind: Literal["pass", "node", "tool", "model"]
    scope_span: str | None  # the span its children attach to: its own, or its nearest recorded ancestor's
    node_ns: str | None  # checkpoint namespace of the enclosing LangGraph node run
    parent_span: str | None = None
    span_id: str | None = None
    name: str = ""
    agent: str | None = None
    start: float = 0.0
    attrs: dict[str, Any] = field(default_factory=dict)
    call: _Call | None = None
    messages: list[Any] = field(default_factory=list)
    tools: Any = None
    gateway_url: bool = False


#: The chat-model calls started in this context and maybe not yet sent (a tuple: contexts copy it safely).
_calls: contextvars.ContextVar[tuple[_Call, ...]] = contextvars.ContextVar("agl_lc_calls", default=())


class _Recorder:
    """Turns LangChain callbacks into spans of the current rollout. One per process; every handler feeds it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._runs: dict[UUID, _Run] = {}

    # bookkeeping ------------------------------------------------------------------------------------------------
    def _open(self, run_id: UUID, run: _Run) -> bool:
        """Register a run; False when another handler already did (the run is recorded once)."""
        with self._lock:
            if run_id in self._runs:
                return False
            self._runs[run_id] = run
            return True

    def _close(self, run_id: UUID) -> _Run | None:
        with self._lock:
            return self._runs.pop(run_id, None)

    def _parent(self, parent_run_id: UUID | None) -> _Run | None:
        if parent_run_id is None:
            return None
        with self._lock:
            return self._runs.get(parent_run_id)

    def scope_span(self, run_id: UUID) -> str | None:
        """The span a run's children attach to (None when the run is unknown)."""
        with self._lock:
            run = self._runs.get(run_id)
        return run.scope_span if run is not None else None

    def discard(self, ctx: RolloutContext) -> None:
        """Forget runs of a finished rollout that never ended (abandoned generators, killed threads)."""
        with self._lock:
            for run_id in [r for r, run in self._runs.items() if run.ctx is ctx]:
                run = self._runs.pop(run_id)
                if run.call is not None:
                    run.call.open = False

    def _new_run(
        self,
        parent: _Run | None,
        kind: Literal["pass", "node", "tool", "model"],
        ctx: RolloutContext,
        name: str,
        metadata: dict[str, Any],
        node_ns: str | None = None,
    ) -> _Run:
        """A run under ``parent``; "pass" runs (plain chains) record nothing and only relay their parent's scope."""
        parent_span = parent.scope_span if parent is not None else None
        inherited_ns = parent.node_ns if parent is not None else None
        if kind == "pass":
            return _Run(ctx, kind, parent_span, inherited_ns, agent=parent.agent if parent is not None else None)
        span_id = new_id("sp")
        run = _Run(
            ctx,
            kind,
            span_id,
            node_ns if node_ns is not None else inherited_ns,
            parent_span=parent_span,
            span_id=span_id,
            name=name,
            agent=agent_name(metadata),
            start=time.time(),
        )
        path = agent_path(metadata)
        if path is not None:
            run.attrs[ATTR_AGENT_PATH] = path
            run.attrs[ATTR_NODE] = metadata.get("langgraph_node")
            run.attrs[ATTR_STEP] = metadata.get("langgraph_step")
        if run.agent is not None:
            run.attrs[ATTR_AGENT_NAME] = run.agent
        return run

    def _record(self, run: _Run, kind: SpanKind, status: str = "ok") -> None:
        run.ctx.record(
            kind,
            run.name,
            run.attrs,
            agent=run.agent,
            parent_id=run.parent_span,
            start_time=run.start,
            status=status,
            span_id=run.span_id,
        )

    def _record_error(self, run: _Run, exc: BaseException) -> None:
        """Mark the run's span failed and add one ``exception`` span for the error (unless already reported)."""
        run.attrs["error.type"] = type(exc).__name__
        run.attrs["error.message"] = str(exc)
        if isinstance(exc, Exception):
            record_exception(run.ctx, exc, agent=run.agent, parent_id=run.scope_span)

    # chains and LangGraph nodes ---------------------------------------------------------------------------------
    def chain_start(self, run_id: UUID, parent_run_id: UUID | None, metadata: dict[str, Any], name: str) -> None:
        ctx = current_rollout()
        if ctx is None:
            return
        node = metadata.get("langgraph_node")
        ns = metadata.get("langgraph_checkpoint_ns")
        parent = self._parent(parent_run_id)
        is_node = node is not None and node == name and (parent is None or parent.node_ns != ns)
        if is_node:
            run = self._new_run(parent, "node", ctx, name, metadata, node_ns=ns if isinstance(ns, str) else name)
            run.attrs[ATTR_OPERATION] = "invoke_agent"
        else:
            run = self._new_run(parent, "pass", ctx, name, metadata)
        self._open(run_id, run)

    def chain_end(self, run_id: UUID, error: BaseException | None = None) -> None:
        run = self._close(run_id)
        if run is None:
            return
        if error is not None and _is_error(error):
            self._record_error(run, error)
            if run.kind == "node":
                self._record(run, "agent", "error")
        elif run.kind == "node":
            self._record(run, "agent")

    # tools ------------------------------------------------------------------------------------------------------
    def tool_start(
        self,
        run_id: UUID,
        parent_run_id: UUID | None,
        metadata: dict[str, Any],
        serialized: dict[str, Any] | None,
        input_str: str,
        inputs: Any,
        tool_call_id: str | None,
        name: str | None,
    ) -> None:
        ctx = current_rollout()
        if ctx is None:
            return
        tool_name = name or (serialized or {}).get("name") or "tool"
        run = self._new_run(self._parent(parent_run_id), "tool", ctx, tool_name, metadata)
        run.attrs[ATTR_OPERATION] = "execute_tool"
        run.attrs[ATTR_TOOL_NAME] = tool_name
        if tool_call_id is not None:
            run.attrs[ATTR_TOOL_CALL_ID] = tool_call_id
        run.attrs[ATTR_TOOL_ARGUMENTS] = jsonable(inputs if inputs is not None else input_str)
        self._open(run_id, run)

    def tool_end(self, run_id: UUID, output: Any = None, error: BaseException | None = None) -> None:
        run = self._close(run_id)
        if run is None:
            return
        if error is not None:
            if _is_error(error):
                self._record_error(run, error)
            self._record(run, "tool", "error")
            return
        if isinstance(output, BaseMessage):
            status = getattr(output, "status", "success")
            run.attrs[ATTR_TOOL_RESULT] = jsonable(output.content)
            if status == "error":
                run.attrs["error.message"] = str(output.content)
                self._record(run, "tool", "error")
                return
        else:
            run.attrs[ATTR_TOOL_RESULT] = jsonable(output)
        self._record(run, "tool")

    # model calls ------------------------------------------------------------------------------------------------
    def model_start(
        self,
        run_id: UUID,
        parent_run_id: UUID | None,
        metadata: dict[str, Any],
        serialized: dict[str, Any] | None,
        messages: list[Any],
        invocation_params: dict[str, Any],
    ) -> None:
        ctx = current_rollout()
        if ctx is None:
            return
        run = self._new_run(self._parent(parent_run_id), "model", ctx, CHAT_SPAN_NAME, metadata)
        call = _Call(str(run_id), ctx, cast(str, run.span_id), run.agent)
        run.call = call
        run.messages = messages
        run.tools = invocation_params.get("tools") or invocation_params.get("functions")
        model = invocation_params.get("model") or invocation_params.get("model_name") or metadata.get("ls_model_name")
        run.attrs[ATTR_OPERATION] = "chat"
        run.attrs[ATTR_CALL_ID] = call.run_id
        if model is not None:
            run.attrs[ATTR_MODEL] = str(model)
        if metadata.get("ls_provider"):
            run.attrs[ATTR_PROVIDER] = metadata["ls_provider"]
        base_url = _base_url(serialized)
        run.gateway_url = base_url is not None and gateway_marker(ctx) in base_url
        if not self._open(run_id, run):
            return
        _calls.set((*(c for c in _calls.get() if c.open), call))

    def model_end(self, run_id: UUID, response: LLMResult | None = None, error: BaseException | None = None) -> None:
        run = self._close(run_id)
        if run is None or run.call is None:
            return
        run.call.open = False
        via_gateway = run.call.sent or run.gateway_url
        attrs = run.attrs
        attrs[ATTR_VIA_GATEWAY] = via_gateway
        if not via_gateway:
            attrs[ATTR_INPUT_MESSAGES] = _openai_messages(run.messages)
            if run.tools is not None:
                attrs[ATTR_TOOLS] = jsonable(run.tools)
        if response is not None:
            _describe_response(response, attrs)
        kind: SpanKind = "custom" if via_gateway else "llm"
        if error is not None:
            if _is_error(error):
                self._record_error(run, error)
            self._record(run, kind, "error")
        else:
            self._record(run, kind)

    # the HTTP side ----------------------------------------------------------------------------------------------
    def claim(self, ctx: RolloutContext) -> _Call | None:
        """The open chat-model call of THIS context that a gateway request belongs to (marked as sent)."""
        calls = _calls.get()
        if not calls:
            return None
        with self._lock:
            chosen = next((c for c in calls if c.open and not c.sent), None)
            if chosen is None:  # a retry of a call already sent
                chosen = next((c for c in reversed(calls) if c.open), None)
            if chosen is None or chosen.ctx is not ctx:
                return None
            chosen.sent = True
            return chosen


_RECORDER = _Recorder()


def _is_error(exc: BaseException) -> bool:
    return not any(cls.__name__ in _CONTROL_FLOW for cls in type(exc).__mro__)


def _base_url(serialized: dict[str, Any] | None) -> str | None:
    kwargs = (serialized or {}).get("kwargs")
    if not isinstance(kwargs, dict):
        return None
    url = kwargs.get("openai_api_base") or kwargs.get("base_url")
    return url if isinstance(url, str) else None


def _openai_messages(messages: Sequence[Any]) -> list[dict[str, Any]]:
    try:
        return cast(list[dict[str, Any]], jsonable(convert_to_openai_messages(list(messages))))
    except Exception:
        return [cast(dict[str, Any], jsonable(m)) for m in messages]


def _describe_response(response: LLMResult, attrs: dict[str, Any]) -> None:
    """The response message (OpenAI format), usage, finish reason and model of a model call."""
    generations = response.generations[0] if response.generations else []
    if not generations:
        return
    generation = generations[0]
    message = getattr(generation, "message", None)
    if message is None:
        attrs[ATTR_OUTPUT_MESSAGES] = [{"role": "assistant", "content": generation.text}]
        return
    attrs[ATTR_OUTPUT_MESSAGES] = _openai_messages([message])
    invalid = getattr(message, "invalid_tool_calls", None)
    if invalid:
        attrs[ATTR_INVALID_TOOL_CALLS] = jsonable(invalid)
    usage = getattr(message, "usage_metadata", None)
    if usage:
        attrs[ATTR_INPUT_TOKENS] = usage.get("input_tokens")
        attrs[ATTR_OUTPUT_TOKENS] = usage.get("output_tokens")
    meta = getattr(message, "response_metadata", None) or {}
    if meta.get("finish_reason") is not None:
        attrs[ATTR_FINISH_REASONS] = [meta["finish_reason"]]
    if meta.get("model_name") is not None:
        attrs[ATTR_RESPONSE_MODEL] = meta["model_name"]


# ----------------------------------------------------------------------------------------------------- handler


def _safely(method: Callable[..., None]) -> Callable[..., None]:
    """Never let a capture problem reach the agent: log it and carry on."""

    @functools.wraps(method)
    def wrapper(*args: Any, **kwargs: Any) -> None:
        try:
            method(*args, **kwargs)
        except Exception:
            log.warning("agl LangChain capture failed in %s", method.__name__, exc_info=True)

    return wrapper


class AglCallbackHandler(BaseCallbackHandler):
    """Records LangChain / LangGraph runs into the current agl rollout (see the module docs for what and how).

    Not needed inside agl runners (capture is automatic there); pass it as ``callbacks=[AglCallbackHandler()]``
    when running under a rollout context of your own. Any number of instances share one recorder, so a run is
    recorded once however many handlers see it. Outside a rollout it does nothing.
    """

    run_inline = True  # keep the callback in the caller's context (see the module docs)
    raise_error = False

    @_safely
    def on_chain_start(
        self,
        serialized: dict[str, Any] | None,
        inputs: Any,
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        metadata: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        name = kwargs.get("name") or (serialized or {}).get("name") or ""
        _RECORDER.chain_start(run_id, parent_run_id, metadata or {}, name)

    @_safely
    def on_chain_end(self, outputs: Any, *, run_id: UUID, **kwargs: Any) -> None:
        _RECORDER.chain_end(run_id)

    @_safely
    def on_chain_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        _RECORDER.chain_end(run_id, error)

    @_safely
    def on_tool_start(
        self,
        serialized: dict[str, Any] | None,
        input_str: str,
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        metadata: dict[str, Any] | None = None,
        inputs: Any = None,
        **kwargs: Any,
    ) -> None:
        _RECORDER.tool_start(
            run_id,
            parent_run_id,
            metadata or {},
            serialized,
            input_str,
            inputs,
            kwargs.get("tool_call_id"),
            kwargs.get("name"),
        )

    @_safely
    def on_tool_end(self, output: Any, *, run_id: UUID, **kwargs: Any) -> None:
        _RECORDER.tool_end(run_id, output)

    @_safely
    def on_tool_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        _RECORDER.tool_end(run_id, error=error)

    @_safely
    def on_chat_model_start(
        self,
        serialized: dict[str, Any] | None,
        messages: list[list[BaseMessage]],
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        metadata: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        _RECORDER.model_start(
            run_id,
            parent_run_id,
            metadata or {},
            serialized,
            messages[0] if messages else [],
            kwargs.get("invocation_params") or {},
        )

    @_safely
    def on_llm_start(
        self,
        serialized: dict[str, Any] | None,
        prompts: list[str],
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        metadata: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        messages = [{"role": "user", "content": p} for p in prompts[:1]]
        _RECORDER.model_start(
            run_id, parent_run_id, metadata or {}, serialized, messages, kwargs.get("invocation_params") or {}
        )

    @_safely
    def on_llm_end(self, response: LLMResult, *, run_id: UUID, **kwargs: Any) -> None:
        _RECORDER.model_end(run_id, response)

    @_safely
    def on_llm_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        _RECORDER.model_end(run_id, error=error)


_HANDLER = AglCallbackHandler()


def _langchain_tag(ctx: RolloutContext) -> CallTag | None:
    """The open chat-model call of this context that a gateway request belongs to."""
    call = _RECORDER.claim(ctx)
    if call is None:
        return None
    return CallTag(agent=call.agent, call_id=call.run_id, parent_span=call.span_id)


# --------------------------------------------------------------------------------------------- activation


class _HandlerWhileInRollout:
    """Stands in for the ContextVar of ``register_configure_hook``: LangChain only calls ``get()``, which hands out
    the handler while a rollout is current in this process (contextvar or the rollout's thread fallback)."""

    def get(self) -> AglCallbackHandler | None:
        return _HANDLER if current_rollout() is not None else None


def _framework_scope() -> tuple[str | None, str | None]:
    """(agent, parent span) of the LangGraph node or tool whose code is running here, for ``agl.emit_*``."""
    config = var_child_runnable_config.get()
    if not config:
        return None, None
    metadata = config.get("metadata") or {}
    named = metadata.get("lc_agent_name")
    agent = named if isinstance(named, str) and named else agent_path(metadata)
    run_id = getattr(config.get("callbacks"), "parent_run_id", None)
    return agent, _RECORDER.scope_span(run_id) if isinstance(run_id, UUID) else None


_install_lock = threading.Lock()
_installed = False


def install() -> None:
    """Make every LangChain runnable report to agl while a rollout is current in this process. Idempotent.

    Registers the configure hook, the ``agl.emit_*`` scope resolver, and the gateway headers on httpx clients.
    """
    global _installed
    with _install_lock:
        if _installed:
            return
        register_configure_hook(
            cast(contextvars.ContextVar[Any], _HandlerWhileInRollout()), True, handle_class=AglCallbackHandler
        )
        register_scope_resolver(_framework_scope)
        register_tagger(_langchain_tag)
        _installed = True


@contextlib.contextmanager
def activate() -> Iterator[None]:
    """Capture LangChain / LangGraph for the rollout current when entered; what runners wrap each agent call in.

    Enter it inside ``rollout_scope``; on exit, runs of that rollout that never ended are forgotten.
    """
    install()
    ctx = current_rollout()
    try:
        yield
    finally:
        if ctx is not None:
            _RECORDER.discard(ctx)
