"""OpenAI Agents SDK capture: agents, handoffs, tools, model calls and errors of a rollout, no change to agent code.

What is recorded (only for SDK spans started while an agl rollout is current; outside one the processor is a no-op),
from the SDK's own tracing (a ``TracingProcessor``):

- ``agent`` span per agent run (``AgentSpanData``; name = the agent's name, ``gen_ai.agent.name``), with the tool
  and handoff names it offered and its output type. Everything the agent does hangs under it.
- ``tool`` span per function-tool execution (``FunctionSpanData``): ``gen_ai.tool.name``,
  ``gen_ai.tool.call.arguments`` (parsed JSON when it parses), ``gen_ai.tool.call.result``; status ``error`` with
  ``error.message`` when the tool failed, also when the SDK turned the error into a message for the model.
- ``custom`` span ``handoff`` per handoff (``openai_agents.handoff.from_agent`` / ``to_agent``), ``guardrail`` per
  guardrail check (``openai_agents.guardrail.triggered``), and one per ``agents.custom_span``.
- one span per model call (``GenerationSpanData`` for the Chat Completions model, ``ResponseSpanData`` for the
  Responses model), named ``openai_agents.generation`` / ``openai_agents.response``. When the call went through
  agl's gateway, the gateway's own ``llm`` span (exact token ids, request tools, response) is THE record of the
  call, so this span is kind ``custom``: the SDK's view (agent, response message incl. tool calls, usage) joined to
  the gateway span by ``agl.call_id`` (= the SDK span id) and by being its parent. When the call did not reach the
  gateway, this span is kind ``llm`` with the request messages, the tools offered (names only: the SDK's trace
  carries no schemas; handoff targets in ``openai_agents.agent.handoffs``), the response message with its tool
  calls and usage, so capture still sees the call and training reports its missing token ids as a capture failure.
  Messages are in Chat Completions format; a streamed or Responses-API output is converted to it.
- ``exception`` span for each error that propagated out of a tool, model call, handoff or agent (once per exception
  object, under the span it left first). An error the SDK handled (a tool's default ``failure_error_function``
  answers the model with an error message) marks the tool span ``error`` but raises nothing and fails nothing.

Task and turn spans record nothing; their children attach to the nearest recorded ancestor. Inputs and outputs are
only there when the SDK traces data (``RunConfig.trace_include_sensitive_data``, on by default). With tracing
disabled (``RunConfig(tracing_disabled=True)``, ``set_tracing_disabled(True)``, ``OPENAI_AGENTS_DISABLE_TRACING``)
the SDK creates no spans: agl then only has the gateway's ``llm`` spans, without agent names. Inside agl nothing is
exported to OpenAI, so there is no reason to disable tracing.

Agent naming rule (the ``agent`` of every span above, and the ``x-agl-agent`` the gateway stores on its span): an
explicit ``agl.agent_scope(name)`` around the code wins; else the ``name`` of the SDK ``Agent`` whose run the span
belongs to (for a handoff, the agent handing off; for an agent used as a tool, the inner agent). ``Trainer(agents=
["triage", "solver"])`` selects agents by those names.

Joining with the gateway. The SDK keeps its current span in a ContextVar and sends a model request from inside the
generation span (``with generation_span(...)``, then ``await client.chat.completions.create(...)`` in the same
task). agl wraps ``httpx``/``httpx2`` ``send`` once per process (:mod:`agl.integrations._http`); a request to the
CURRENT rollout's gateway route asks this module's tagger, which reads ``agents.tracing.get_current_span()`` in the
request's own context: a generation/response span gives ``x-agl-agent`` (its agent), ``x-agl-call-id`` (its SDK span
id) and ``x-agl-parent-span`` (its agl span); any other recorded span (a raw client call inside a tool) gives that
span's agent and parent. The gateway tags its ``llm`` span from them; no token is ever re-computed.

Concurrency model: the processor is one process-wide object; its table (SDK span id → open span) is guarded by one
lock, so SDK callbacks from any thread or event loop are safe. Which call an HTTP request belongs to never comes from
shared state: it comes from the SDK span current in the request's context. ``Runner.run`` / ``run_streamed`` /
``run_sync`` each run in their own task or thread with their own copy of that ContextVar, so two agents running
concurrently (``asyncio.gather`` of two runs, two threads) each see only their own generation span. Errors inside
the integration are logged, never raised into the agent.

No export to OpenAI. The SDK's default processor batches every span to OpenAI's trace ingest endpoint (using
``OPENAI_API_KEY`` or the key of ``set_default_openai_client``). :func:`install` adds agl's processor with
``add_trace_processor`` semantics and removes THAT default processor from the provider (other processors the user
added stay), each time a rollout starts, so nothing agl runs is sent to OpenAI and the process never tries. A
process that called :func:`install` (every agl runner) keeps the default exporter off, also outside rollouts; to
export there anyway, register your own ``BatchTraceProcessor(BackendSpanExporter())``. A custom ``TraceProvider``
is left alone: agl's processor is registered with it once.

Zero config: runners enter :func:`activate` around each rollout (entry point ``agents`` in group
``agl.integrations``). :func:`install` also tells :mod:`agl.core.emit` how to find the running agent and tool, so
``agl.emit_reward`` inside a tool carries that agent's name and hangs under the tool's span.
"""

from __future__ import annotations

import contextlib
import json
import logging
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal, cast

from agents.tracing import (
    AgentSpanData,
    CustomSpanData,
    FunctionSpanData,
    GenerationSpanData,
    GuardrailSpanData,
    HandoffSpanData,
    ResponseSpanData,
    Span,
    Trace,
    TracingProcessor,
    get_current_span,
    get_trace_provider,
)
from agents.tracing.processors import default_processor
from agents.tracing.provider import DefaultTraceProvider

from agl.core.emit import RolloutContext, current_agent, current_rollout, record_exception, register_scope_resolver
from agl.core.types import (
    ATTR_CALL_ID,
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
    "GENERATION_SPAN_NAME",
    "RESPONSE_SPAN_NAME",
    "AglTracingProcessor",
    "activate",
    "install",
]

log = logging.getLogger("agl.integrations.openai_agents")

ATTR_AGENT_NAME = "gen_ai.agent.name"
ATTR_OPERATION = "gen_ai.operation.name"
ATTR_PROVIDER = "gen_ai.provider.name"
ATTR_RESPONSE_ID = "gen_ai.response.id"
ATTR_TOOL_NAME = "gen_ai.tool.name"
ATTR_TOOL_ARGUMENTS = "gen_ai.tool.call.arguments"
ATTR_TOOL_RESULT = "gen_ai.tool.call.result"
ATTR_VIA_GATEWAY = "agl.via_gateway"
ATTR_SDK_SPAN_ID = "openai_agents.span_id"
ATTR_AGENT_TOOLS = "openai_agents.agent.tools"
ATTR_AGENT_HANDOFFS = "openai_agents.agent.handoffs"
ATTR_OUTPUT_TYPE = "openai_agents.agent.output_type"
ATTR_HANDOFF_FROM = "openai_agents.handoff.from_agent"
ATTR_HANDOFF_TO = "openai_agents.handoff.to_agent"
ATTR_GUARDRAIL_TRIGGERED = "openai_agents.guardrail.triggered"
ATTR_ERROR_DATA = "openai_agents.error.data"

GENERATION_SPAN_NAME = "openai_agents.generation"
RESPONSE_SPAN_NAME = "openai_agents.response"

_Kind = Literal["pass", "agent", "model", "tool", "custom"]


@dataclass(eq=False)
class _Open:
    """An SDK span started inside a rollout, until it ends."""

    ctx: RolloutContext
    kind: _Kind
    agent: str | None
    scope_span: str | None  # the agl span its children attach to: its own, or its nearest recorded ancestor's
    parent_span: str | None = None
    span_id: str | None = None
    agent_data: AgentSpanData | None = None  # the SDK agent span this span belongs to (tools offered)
    start: float = 0.0
    gateway_url: bool = False
    sent: bool = False


class AglTracingProcessor(TracingProcessor):
    """Records OpenAI Agents SDK spans into the current agl rollout (see the module docs for what and how).

    One per process (:func:`install` registers it); spans started outside a rollout are ignored.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open: dict[str, _Open] = {}

    # SDK callbacks ----------------------------------------------------------------------------------------------
    def on_trace_start(self, trace: Trace) -> None:
        """Traces are not recorded: a trace's top-level spans attach to the rollout's current scope."""

    def on_trace_end(self, trace: Trace) -> None:
        """Traces are not recorded."""

    def on_span_start(self, span: Span[Any]) -> None:
        ctx = current_rollout()
        if ctx is None:
            return
        try:
            self._start(ctx, span)
        except Exception:
            log.warning("agl OpenAI Agents capture failed at a span start", exc_info=True)

    def on_span_end(self, span: Span[Any]) -> None:
        with self._lock:
            entry = self._open.pop(span.span_id, None)
        if entry is None or entry.kind == "pass":
            return
        try:
            self._end(entry, span, sys.exc_info()[1])
        except Exception:
            log.warning("agl OpenAI Agents capture failed at a span end", exc_info=True)

    def shutdown(self) -> None:
        """Nothing to release: spans go to the rollout's sink as they end."""

    def force_flush(self) -> None:
        """Nothing buffered here: the rollout's sink flushes."""

    # bookkeeping ------------------------------------------------------------------------------------------------
    def lookup(self, span_id: str) -> _Open | None:
        """The open entry of an SDK span (None when it is unknown or ended)."""
        with self._lock:
            return self._open.get(span_id)

    def discard(self, ctx: RolloutContext) -> None:
        """Forget spans of a finished rollout that never ended (abandoned streams)."""
        with self._lock:
            for span_id in [s for s, entry in self._open.items() if entry.ctx is ctx]:
                del self._open[span_id]

    def claim(self, span_id: str, ctx: RolloutContext) -> _Open | None:
        """The open entry of the SDK span a gateway request is sent from (a model call is marked as sent)."""
        with self._lock:
            entry = self._open.get(span_id)
            if entry is None or entry.ctx is not ctx:
                return None
            if entry.kind == "model":
                entry.sent = True
            return entry

    # start / end ------------------------------------------------------------------------------------------------
    def _start(self, ctx: RolloutContext, span: Span[Any]) -> None:
        parent = self.lookup(span.parent_id) if span.parent_id else None
        data = span.span_data
        agent = parent.agent if parent is not None else None
        agent_data = parent.agent_data if parent is not None else None
        kind: _Kind = "pass"
        if isinstance(data, AgentSpanData):
            kind, agent, agent_data = "agent", data.name, data
        elif isinstance(data, GenerationSpanData | ResponseSpanData):
            kind = "model"
        elif isinstance(data, FunctionSpanData):
            kind = "tool"
        elif isinstance(data, HandoffSpanData):
            kind, agent = "custom", data.from_agent or agent
        elif isinstance(data, GuardrailSpanData | CustomSpanData):
            kind = "custom"
        elif data.type == "turn":  # TurnSpanData (newer SDKs): one model turn of an agent
            agent = getattr(data, "agent_name", None) or agent
        explicit = current_agent()
        if explicit is not None:
            agent = explicit
        parent_scope = parent.scope_span if parent is not None else None
        if kind == "pass":
            entry = _Open(ctx, kind, agent, parent_scope, agent_data=agent_data)
        else:
            span_id = new_id("sp")
            entry = _Open(
                ctx,
                kind,
                agent,
                span_id,
                parent_span=parent_scope,
                span_id=span_id,
                agent_data=agent_data,
                start=time.time(),
            )
            if isinstance(data, GenerationSpanData):
                base_url = (data.model_config or {}).get("base_url")
                entry.gateway_url = isinstance(base_url, str) and gateway_marker(ctx) in base_url
        with self._lock:
            self._open[span.span_id] = entry

    def _end(self, entry: _Open, span: Span[Any], exc: BaseException | None) -> None:
        data = span.span_data
        attrs: dict[str, Any] = {ATTR_SDK_SPAN_ID: span.span_id}
        if entry.agent is not None:
            attrs[ATTR_AGENT_NAME] = entry.agent
        kind: SpanKind
        name: str
        if isinstance(data, AgentSpanData):
            kind, name = "agent", data.name
            attrs[ATTR_OPERATION] = "invoke_agent"
            attrs[ATTR_AGENT_TOOLS] = list(data.tools or [])
            attrs[ATTR_AGENT_HANDOFFS] = list(data.handoffs or [])
            if data.output_type is not None:
                attrs[ATTR_OUTPUT_TYPE] = data.output_type
        elif isinstance(data, FunctionSpanData):
            kind, name = "tool", data.name
            attrs[ATTR_OPERATION] = "execute_tool"
            attrs[ATTR_TOOL_NAME] = data.name
            if data.input is not None:
                attrs[ATTR_TOOL_ARGUMENTS] = _arguments(data.input)
            if data.output is not None:
                attrs[ATTR_TOOL_RESULT] = jsonable(data.output)
        elif isinstance(data, GenerationSpanData | ResponseSpanData):
            kind, name = self._model_call(entry, span.span_id, data, attrs)
        elif isinstance(data, HandoffSpanData):
            kind, name = "custom", "handoff"
            attrs[ATTR_HANDOFF_FROM] = data.from_agent
            attrs[ATTR_HANDOFF_TO] = data.to_agent
        elif isinstance(data, GuardrailSpanData):
            kind, name = "custom", "guardrail"
            attrs["openai_agents.guardrail.name"] = data.name
            attrs[ATTR_GUARDRAIL_TRIGGERED] = data.triggered
        else:
            kind, name = "custom", str(getattr(data, "name", data.type))
            attrs["agl.object"] = jsonable(getattr(data, "data", None))
        status = "ok"
        error = span.error
        if error is not None:
            status = "error"
            attrs["error.message"] = error.get("message")
            if error.get("data"):
                attrs[ATTR_ERROR_DATA] = jsonable(error["data"])
            if isinstance(exc, Exception):  # the error is propagating out of this span (not one the SDK handled)
                attrs["error.type"] = type(exc).__name__
                record_exception(entry.ctx, exc, agent=entry.agent, parent_id=entry.span_id)
        entry.ctx.record(
            kind,
            name,
            attrs,
            agent=entry.agent,
            parent_id=entry.parent_span,
            start_time=entry.start,
            status=status,
            span_id=entry.span_id,
        )

    def _model_call(
        self, entry: _Open, call_id: str, data: GenerationSpanData | ResponseSpanData, attrs: dict[str, Any]
    ) -> tuple[SpanKind, str]:
        """Attributes of a model call; kind ``custom`` when the gateway recorded it, else ``llm``."""
        via_gateway = entry.sent or entry.gateway_url
        attrs[ATTR_OPERATION] = "chat"
        attrs[ATTR_CALL_ID] = call_id
        attrs[ATTR_VIA_GATEWAY] = via_gateway
        usage: dict[str, Any] | None
        output: list[Any]
        messages: Any
        if isinstance(data, GenerationSpanData):
            name = GENERATION_SPAN_NAME
            if data.model is not None:
                attrs[ATTR_MODEL] = data.model
            output = list(data.output or [])
            messages = data.input
            usage = data.usage
        else:
            name = RESPONSE_SPAN_NAME
            response = data.response
            output = [response] if response is not None else []
            messages = data.input
            usage = jsonable(response.usage) if response is not None and response.usage is not None else None
            if response is not None:
                attrs[ATTR_MODEL] = response.model
                attrs[ATTR_RESPONSE_ID] = response.id
        attrs[ATTR_PROVIDER] = "openai"
        if output:
            attrs[ATTR_OUTPUT_MESSAGES] = [m for item in output for m in _chat_messages(jsonable(item))]
        if usage:
            attrs[ATTR_INPUT_TOKENS] = usage.get("input_tokens")
            attrs[ATTR_OUTPUT_TOKENS] = usage.get("output_tokens")
        if not via_gateway:
            if messages is not None:
                attrs[ATTR_INPUT_MESSAGES] = jsonable(messages)
            offered = entry.agent_data
            if offered is not None and offered.tools:
                attrs[ATTR_TOOLS] = [{"type": "function", "function": {"name": t}} for t in offered.tools]
            if offered is not None and offered.handoffs:
                attrs[ATTR_AGENT_HANDOFFS] = list(offered.handoffs)
        return ("custom" if via_gateway else "llm"), name


_PROCESSOR = AglTracingProcessor()


# --------------------------------------------------------------------------------------------------- formats


def _arguments(raw: Any) -> Any:
    """Tool arguments as the SDK traced them (a JSON string): parsed when they parse."""
    if isinstance(raw, str):
        try:
            return jsonable(json.loads(raw))
        except ValueError:
            return raw
    return jsonable(raw)


def _chat_messages(item: Any) -> list[Any]:
    """Chat Completions messages of one traced model output: a chat message as is; a Responses-API ``Response``
    (what the SDK traces for streamed chat completions and for the Responses model) converted."""
    if not isinstance(item, dict):
        return [item]
    if not isinstance(item.get("output"), list):  # a chat message: drop the fields it leaves empty
        return [{k: v for k, v in item.items() if v is not None or k == "content"}]
    text: list[str] = []
    calls: list[dict[str, Any]] = []
    for out in item["output"]:
        if not isinstance(out, dict):
            continue
        if out.get("type") == "message":
            text.extend(str(p.get("text", "")) for p in out.get("content") or [] if isinstance(p, dict))
        elif out.get("type") == "function_call":
            function = {"name": out.get("name"), "arguments": out.get("arguments")}
            calls.append({"id": out.get("call_id"), "type": "function", "function": function})
    message: dict[str, Any] = {"role": "assistant", "content": "".join(text) if text else None}
    if calls:
        message["tool_calls"] = calls
    return [message]


# --------------------------------------------------------------------------------------------- gateway / emit


def _agents_tag(ctx: RolloutContext) -> CallTag | None:
    """The SDK span current in the request's context: the model call a gateway request belongs to, or the tool /
    agent making a raw client call."""
    span = get_current_span()
    if span is None:
        return None
    entry = _PROCESSOR.claim(span.span_id, ctx)
    if entry is None:
        return None
    if entry.kind == "model":
        return CallTag(agent=entry.agent, call_id=span.span_id, parent_span=entry.span_id)
    return CallTag(agent=entry.agent, parent_span=entry.scope_span)


def _framework_scope() -> tuple[str | None, str | None]:
    """(agent, parent span) of the SDK agent / tool whose code is running here, for ``agl.emit_*``."""
    span = get_current_span()
    entry = _PROCESSOR.lookup(span.span_id) if span is not None else None
    if entry is None or entry.ctx is not current_rollout():
        return None, None
    return entry.agent, entry.scope_span


# --------------------------------------------------------------------------------------------- activation

_install_lock = threading.Lock()
_installed = False
_registered_with: object | None = None


def _ensure_processor() -> None:
    """agl's processor on the SDK's trace provider, and the default (OpenAI-exporting) processor off it."""
    global _registered_with
    provider = get_trace_provider()
    multi = getattr(provider, "_multi_processor", None)
    current = getattr(multi, "_processors", None)
    if not isinstance(provider, DefaultTraceProvider) or not isinstance(current, tuple):
        if _registered_with is not provider:  # a provider of the user's own: register once, change nothing else
            provider.register_processor(_PROCESSOR)
            _registered_with = provider
        return
    exporter = default_processor()
    wanted = [p for p in current if p is not exporter]
    if _PROCESSOR not in wanted:
        wanted.append(_PROCESSOR)
    if tuple(wanted) != current:
        provider.set_processors(cast(list[TracingProcessor], wanted))


def install() -> None:
    """Record OpenAI Agents SDK spans into the current rollout; keep the SDK from exporting to OpenAI. Idempotent.

    Registers the processor (and removes the SDK's default exporter, see the module docs), the ``agl.emit_*`` scope
    resolver and the gateway tagger. Cheap to call again: the processor list is re-checked each time.
    """
    global _installed
    with _install_lock:
        _ensure_processor()
        if _installed:
            return
        register_scope_resolver(_framework_scope)
        register_tagger(_agents_tag)
        _installed = True


@contextlib.contextmanager
def activate() -> Iterator[None]:
    """Capture the OpenAI Agents SDK for the rollout current when entered; what runners wrap each agent call in.

    Enter it inside ``rollout_scope``; on exit, spans of that rollout that never ended are forgotten.
    """
    install()
    ctx = current_rollout()
    try:
        yield
    finally:
        if ctx is not None:
            _PROCESSOR.discard(ctx)
