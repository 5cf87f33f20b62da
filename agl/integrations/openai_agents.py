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
exported to OpenAI (see "No export to OpenAI" below), so there is no reason to disable tracing.

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
is left alone: agl's processor is registered with it once. ``AGL_KEEP_FRAMEWORK_TELEMETRY=1`` keeps the default
processor in place (see :mod:`agl.core.telemetry`). The processor list is the SDK's private
``provider._multi_processor._processors``: where a changed SDK no longer has it, :func:`install` refuses
(``RuntimeError``) rather than capture with the exporter on.

Zero config: runners enter :func:`activate` around each rollout of an agent that uses the SDK (imports ``agents``;
entry point ``agents`` in group ``agl.integrations``). :func:`install` also tells :mod:`agl.core.emit` how to find
the running agent and tool, so ``agl.emit_reward`` inside a tool carries that agent's name and hangs under the
tool's span.
"""

from __future__ import annotations

import logging
import sys
from contextlib import AbstractContextManager
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

from agl.core.emit import RolloutContext, current_agent, current_rollout
from agl.core.jsonsafe import jsonable, parsed_or_text
from agl.core.telemetry import keep_framework_telemetry
from agl.core.types import (
    ATTR_AGENT_NAME,
    ATTR_CALL_ID,
    ATTR_ERROR_MESSAGE,
    ATTR_INPUT_MESSAGES,
    ATTR_INPUT_TOKENS,
    ATTR_MODEL,
    ATTR_OPERATION,
    ATTR_OUTPUT_MESSAGES,
    ATTR_OUTPUT_TOKENS,
    ATTR_PROVIDER,
    ATTR_TOOL_RESULT,
    ATTR_TOOLS,
    SpanKind,
)
from agl.integrations._capture import Integration, OpenCall, SpanTable
from agl.integrations._http import CallTag, gateway_marker
from agl.integrations._patch import Verified

__all__ = [
    "GENERATION_SPAN_NAME",
    "RESPONSE_SPAN_NAME",
    "AglTracingProcessor",
    "activate",
    "install",
]

log = logging.getLogger("agl.integrations.openai_agents")

ATTR_RESPONSE_ID = "gen_ai.response.id"
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


@dataclass(eq=False, kw_only=True)
class _Open(OpenCall):
    """An SDK span started inside a rollout, until it ends ("pass": one that records nothing, such as a task or turn
    span; "model": a model call, which a gateway request joins by the SDK span id)."""

    kind: _Kind
    agent_data: AgentSpanData | None = None  # the SDK agent span this span belongs to (tools offered)


class AglTracingProcessor(TracingProcessor):
    """Records OpenAI Agents SDK spans into the current agl rollout (see the module docs for what and how).

    One per process (:func:`install` registers it); spans started outside a rollout are ignored.
    """

    def __init__(self) -> None:
        self._open: SpanTable[str, _Open] = SpanTable()

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
        entry = self._open.pop(span.span_id)
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
        return self._open.get(span_id)

    def discard(self, ctx: RolloutContext) -> None:
        """Forget spans of a finished rollout that never ended (abandoned streams)."""
        self._open.discard(ctx)

    def tag(self, span_id: str, ctx: RolloutContext) -> CallTag | None:
        """The tag of a gateway request sent from inside SDK span ``span_id``: its model call (marked as sent), or
        the tool / agent making a raw client call."""
        with self._open.lock:
            entry = self._open.get(span_id)
            if entry is None or entry.ctx is not ctx:
                return None
            if entry.kind == "model":
                return entry.take()
        return CallTag(agent=entry.agent, parent_span=entry.scope)

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
        parent_scope = parent.scope if parent is not None else None
        if kind == "pass":
            entry = _Open(ctx=ctx, kind=kind, agent=agent, parent=parent_scope, agent_data=agent_data, span_id=None)
        else:
            entry = _Open(ctx=ctx, kind=kind, agent=agent, parent=parent_scope, agent_data=agent_data)
            if kind == "model":
                entry.call_id = span.span_id
            if isinstance(data, GenerationSpanData):
                base_url = (data.model_config or {}).get("base_url")
                entry.gateway_url = isinstance(base_url, str) and gateway_marker(ctx) in base_url
        self._open.add(span.span_id, entry, replace=True)

    def _end(self, entry: _Open, span: Span[Any], exc: BaseException | None) -> None:
        data = span.span_data
        attrs = entry.attrs
        attrs[ATTR_SDK_SPAN_ID] = span.span_id
        if entry.agent is not None:
            attrs[ATTR_AGENT_NAME] = entry.agent
        kind: SpanKind
        if isinstance(data, AgentSpanData):
            kind, entry.name = "agent", data.name
            attrs[ATTR_OPERATION] = "invoke_agent"
            attrs[ATTR_AGENT_TOOLS] = list(data.tools or [])
            attrs[ATTR_AGENT_HANDOFFS] = list(data.handoffs or [])
            if data.output_type is not None:
                attrs[ATTR_OUTPUT_TYPE] = data.output_type
        elif isinstance(data, FunctionSpanData):
            kind, entry.name = "tool", data.name
            entry.describe_tool(data.name, parsed_or_text(data.input))
            if data.output is not None:
                attrs[ATTR_TOOL_RESULT] = jsonable(data.output)
        elif isinstance(data, GenerationSpanData | ResponseSpanData):
            kind = self._model_call(entry, data)
        elif isinstance(data, HandoffSpanData):
            kind, entry.name = "custom", "handoff"
            attrs[ATTR_HANDOFF_FROM] = data.from_agent
            attrs[ATTR_HANDOFF_TO] = data.to_agent
        elif isinstance(data, GuardrailSpanData):
            kind, entry.name = "custom", "guardrail"
            attrs["openai_agents.guardrail.name"] = data.name
            attrs[ATTR_GUARDRAIL_TRIGGERED] = data.triggered
        else:
            kind, entry.name = "custom", str(getattr(data, "name", data.type))
            attrs["agl.object"] = jsonable(getattr(data, "data", None))
        error = span.error
        if error is not None:
            if isinstance(exc, Exception):  # the error is propagating out of this span (not one the SDK handled)
                entry.fail(exc)
            attrs[ATTR_ERROR_MESSAGE] = error.get("message")  # the SDK's own description of it
            if error.get("data"):
                attrs[ATTR_ERROR_DATA] = jsonable(error["data"])
        entry.finish(kind, "ok" if error is None else "error")

    def _model_call(self, entry: _Open, data: GenerationSpanData | ResponseSpanData) -> SpanKind:
        """Name and attributes of a model call; kind ``custom`` when the gateway recorded it, else ``llm``."""
        attrs = entry.attrs
        attrs[ATTR_OPERATION] = "chat"
        attrs[ATTR_CALL_ID] = entry.call_id
        kind = entry.gateway_kind()
        usage: dict[str, Any] | None
        output: list[Any]
        messages: Any
        if isinstance(data, GenerationSpanData):
            entry.name = GENERATION_SPAN_NAME
            if data.model is not None:
                attrs[ATTR_MODEL] = data.model
            output = list(data.output or [])
            messages = data.input
            usage = data.usage
        else:
            entry.name = RESPONSE_SPAN_NAME
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
        if kind == "llm":
            if messages is not None:
                attrs[ATTR_INPUT_MESSAGES] = jsonable(messages)
            offered = entry.agent_data
            if offered is not None and offered.tools:
                attrs[ATTR_TOOLS] = [{"type": "function", "function": {"name": t}} for t in offered.tools]
            if offered is not None and offered.handoffs:
                attrs[ATTR_AGENT_HANDOFFS] = list(offered.handoffs)
        return kind


_PROCESSOR = AglTracingProcessor()


# --------------------------------------------------------------------------------------------------- formats


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
    return _PROCESSOR.tag(span.span_id, ctx) if span is not None else None


def _framework_scope() -> tuple[str | None, str | None]:
    """(agent, parent span) of the SDK agent / tool whose code is running here, for ``agl.emit_*``."""
    span = get_current_span()
    entry = _PROCESSOR.lookup(span.span_id) if span is not None else None
    if entry is None or entry.ctx is not current_rollout():
        return None, None
    return entry.agent, entry.scope


# --------------------------------------------------------------------------------------------- activation

_registered_with: object | None = None


def _ensure_processor() -> None:
    """agl's processor on the SDK's trace provider, and the default (OpenAI-exporting) processor off it (unless
    ``AGL_KEEP_FRAMEWORK_TELEMETRY`` keeps it)."""
    global _registered_with
    provider = get_trace_provider()
    multi = getattr(provider, "_multi_processor", None)
    current = getattr(multi, "_processors", None)
    keep = keep_framework_telemetry()
    if isinstance(provider, DefaultTraceProvider) and not isinstance(current, tuple) and not keep:
        raise RuntimeError(
            f"agl cannot take the OpenAI Agents SDK's exporter off: its trace provider no longer keeps the processor "
            f"list agl edits (openai-agents {_VERIFIED.installed}, verified {_VERIFIED.range}), and capturing with it "
            "on would send every rollout's spans to OpenAI; install a verified version, or set "
            "AGL_KEEP_FRAMEWORK_TELEMETRY=1 to capture with the SDK's exporter on"
        )
    if not isinstance(provider, DefaultTraceProvider) or not isinstance(current, tuple):
        if _registered_with is not provider:  # a provider of the user's own: register once, change nothing else
            provider.register_processor(_PROCESSOR)
            _registered_with = provider
        return
    exporter = None if keep else default_processor()
    wanted = [p for p in current if p is not exporter]
    if _PROCESSOR not in wanted:
        wanted.append(_PROCESSOR)
    if tuple(wanted) != current:
        provider.set_processors(cast(list[TracingProcessor], wanted))


_VERIFIED = Verified("openai-agents", "0.24", "0.25")
_INTEGRATION = Integration(
    verified=_VERIFIED,
    recheck=_ensure_processor,
    scope_resolver=_framework_scope,
    tagger=_agents_tag,
    forget=_PROCESSOR.discard,
)


def install() -> None:
    """Record OpenAI Agents SDK spans into the current rollout; keep the SDK from exporting to OpenAI. Idempotent.

    Registers the processor (and removes the SDK's default exporter, see the module docs), the ``agl.emit_*`` scope
    resolver and the gateway tagger. Cheap to call again: the processor list is re-checked each time.
    """
    _INTEGRATION.install()


def activate() -> AbstractContextManager[None]:
    """Capture the OpenAI Agents SDK for the rollout current when entered; what runners wrap each agent call in.

    Enter it inside ``rollout_scope``; on exit, spans of that rollout that never ended are forgotten.
    """
    return _INTEGRATION.activate()
