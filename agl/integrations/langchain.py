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

Telemetry: LangChain and LangGraph send nothing anywhere by themselves. LangSmith tracing is opt-in
(``LANGSMITH_TRACING`` / ``LANGCHAIN_TRACING_V2`` with a key) and stays as the user set it; agl's capture does not
depend on it. See :mod:`agl.core.telemetry`.
"""

from __future__ import annotations

import contextvars
import functools
import logging
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, Literal, cast
from uuid import UUID

from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.messages import BaseMessage, convert_to_openai_messages
from langchain_core.outputs import LLMResult
from langchain_core.runnables.config import var_child_runnable_config
from langchain_core.tracers.context import register_configure_hook

from agl.core.emit import RolloutContext, current_agent, current_rollout
from agl.core.jsonsafe import jsonable
from agl.core.types import (
    ATTR_AGENT_NAME,
    ATTR_CALL_ID,
    ATTR_ERROR_MESSAGE,
    ATTR_FINISH_REASONS,
    ATTR_INPUT_MESSAGES,
    ATTR_INPUT_TOKENS,
    ATTR_MODEL,
    ATTR_OPERATION,
    ATTR_OUTPUT_MESSAGES,
    ATTR_OUTPUT_TOKENS,
    ATTR_PROVIDER,
    ATTR_TOOL_RESULT,
    ATTR_TOOLS,
)
from agl.integrations._capture import CallStack, Integration, OpenCall, SpanTable
from agl.integrations._http import CallTag, gateway_marker
from agl.integrations._patch import Verified

__all__ = [
    "ATTR_AGENT_PATH",
    "AglCallbackHandler",
    "activate",
    "agent_name",
    "agent_path",
    "install",
]

log = logging.getLogger("agl.integrations.langchain")

ATTR_AGENT_PATH = "agl.agent_path"
ATTR_RESPONSE_MODEL = "gen_ai.response.model"
ATTR_INVALID_TOOL_CALLS = "langchain.invalid_tool_calls"
ATTR_NODE = "langgraph.node"
ATTR_STEP = "langgraph.step"

CHAT_SPAN_NAME = "langchain.chat_model"

#: Exceptions LangGraph raises to steer the graph (interrupt, Command(graph=PARENT)), not failures.
_CONTROL_FLOW = frozenset({"GraphBubbleUp", "GraphInterrupt", "NodeInterrupt", "ParentCommand"})


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


@dataclass(eq=False, kw_only=True)
class _Run(OpenCall):
    """What is known about one open LangChain run, from its start callback. A "pass" run (a plain chain) records
    nothing and relays its parent's scope; a model run is also the call a gateway request joins."""

    kind: Literal["pass", "node", "tool", "model"]
    node_ns: str | None  # checkpoint namespace of the enclosing LangGraph node run
    messages: list[Any] = field(default_factory=list)
    tools: Any = None


#: The chat-model calls started in this context and maybe not yet sent.
_calls: CallStack[_Run] = CallStack("agl_lc_calls")


class _Recorder:
    """Turns LangChain callbacks into spans of the current rollout. One per process; every handler feeds it."""

    def __init__(self) -> None:
        self._runs: SpanTable[UUID, _Run] = SpanTable()

    # bookkeeping ------------------------------------------------------------------------------------------------
    def _parent(self, parent_run_id: UUID | None) -> _Run | None:
        return self._runs.get(parent_run_id) if parent_run_id is not None else None

    def scope_span(self, run_id: UUID) -> str | None:
        """The span a run's children attach to (None when the run is unknown)."""
        run = self._runs.get(run_id)
        return run.scope if run is not None else None

    def discard(self, ctx: RolloutContext) -> None:
        """Forget runs of a finished rollout that never ended (abandoned generators, killed threads)."""
        for run in self._runs.discard(ctx):
            run.open = False

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
        parent_scope = parent.scope if parent is not None else None
        inherited_ns = parent.node_ns if parent is not None else None
        if kind == "pass":
            agent = parent.agent if parent is not None else None
            return _Run(ctx=ctx, kind=kind, node_ns=inherited_ns, parent=parent_scope, agent=agent, span_id=None)
        run = _Run(
            ctx=ctx,
            kind=kind,
            node_ns=node_ns if node_ns is not None else inherited_ns,
            parent=parent_scope,
            name=name,
            agent=agent_name(metadata),
        )
        path = agent_path(metadata)
        if path is not None:
            run.attrs[ATTR_AGENT_PATH] = path
            run.attrs[ATTR_NODE] = metadata.get("langgraph_node")
            run.attrs[ATTR_STEP] = metadata.get("langgraph_step")
        if run.agent is not None:
            run.attrs[ATTR_AGENT_NAME] = run.agent
        return run

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
        self._runs.add(run_id, run)

    def chain_end(self, run_id: UUID, error: BaseException | None = None) -> None:
        run = self._runs.pop(run_id)
        if run is None:
            return
        if error is not None and _is_error(error):
            run.fail(error)
            if run.kind == "node":
                run.finish("agent", "error")
        elif run.kind == "node":
            run.finish("agent")

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
        run.describe_tool(tool_name, inputs if inputs is not None else input_str, tool_call_id)
        self._runs.add(run_id, run)

    def tool_end(self, run_id: UUID, output: Any = None, error: BaseException | None = None) -> None:
        run = self._runs.pop(run_id)
        if run is None:
            return
        if error is not None:
            if _is_error(error):
                run.fail(error)
            run.finish("tool", "error")
            return
        if isinstance(output, BaseMessage):
            status = getattr(output, "status", "success")
            run.attrs[ATTR_TOOL_RESULT] = jsonable(output.content)
            if status == "error":
                run.attrs[ATTR_ERROR_MESSAGE] = str(output.content)
                run.finish("tool", "error")
                return
        else:
            run.attrs[ATTR_TOOL_RESULT] = jsonable(output)
        run.finish("tool")

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
        run.call_id = str(run_id)
        run.messages = messages
        run.tools = invocation_params.get("tools") or invocation_params.get("functions")
        model = invocation_params.get("model") or invocation_params.get("model_name") or metadata.get("ls_model_name")
        run.attrs[ATTR_OPERATION] = "chat"
        run.attrs[ATTR_CALL_ID] = run.call_id
        if model is not None:
            run.attrs[ATTR_MODEL] = str(model)
        if metadata.get("ls_provider"):
            run.attrs[ATTR_PROVIDER] = metadata["ls_provider"]
        base_url = _base_url(serialized)
        run.gateway_url = base_url is not None and gateway_marker(ctx) in base_url
        if self._runs.add(run_id, run):
            _calls.push(run)

    def model_end(self, run_id: UUID, response: LLMResult | None = None, error: BaseException | None = None) -> None:
        run = self._runs.pop(run_id)
        if run is None or run.kind != "model":
            return
        run.open = False
        attrs = run.attrs
        kind = run.gateway_kind()
        if kind == "llm":
            attrs[ATTR_INPUT_MESSAGES] = _openai_messages(run.messages)
            if run.tools is not None:
                attrs[ATTR_TOOLS] = jsonable(run.tools)
        if response is not None:
            _describe_response(response, attrs)
        if error is not None:
            if _is_error(error):
                run.fail(error)
            run.finish(kind, "error")
        else:
            run.finish(kind)

    # the HTTP side ----------------------------------------------------------------------------------------------
    def tag(self, ctx: RolloutContext) -> CallTag | None:
        """The tag of the open chat-model call of THIS context that a gateway request belongs to (marked as sent)."""
        calls = _calls.get()
        if not calls:
            return None
        with self._runs.lock:
            chosen = next((c for c in calls if c.open and not c.sent), None)
            if chosen is None:  # a retry of a call already sent
                chosen = next((c for c in reversed(calls) if c.open), None)
            if chosen is None or chosen.ctx is not ctx:
                return None
            return chosen.take()


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


def _hook() -> None:
    register_configure_hook(
        cast(contextvars.ContextVar[Any], _HandlerWhileInRollout()), True, handle_class=AglCallbackHandler
    )


_INTEGRATION = Integration(
    verified=Verified("langchain-core", "1.0", "2"),
    hook=_hook,
    scope_resolver=_framework_scope,
    tagger=_RECORDER.tag,
    forget=_RECORDER.discard,
)


def install() -> None:
    """Make every LangChain runnable report to agl while a rollout is current in this process. Idempotent.

    Registers the configure hook, the ``agl.emit_*`` scope resolver, and the gateway headers on httpx clients.
    """
    _INTEGRATION.install()


def activate() -> AbstractContextManager[None]:
    """Capture LangChain / LangGraph for the rollout current when entered; what runners wrap each agent call in.

    Enter it inside ``rollout_scope``; on exit, runs of that rollout that never ended are forgotten.
    """
    return _INTEGRATION.activate()
