"""agl spans → OpenTelemetry spans (plain data): the GenAI semantic conventions plus OpenInference attributes.

Pure functions, no OpenTelemetry import: ``export.py`` turns ``OtelSpan`` values into the SDK's spans (OTLP/HTTP)
and ``otlp_json`` into an OTLP JSON document. One attempt is one trace: its id is derived from the rollout and attempt
ids, so exporting the same attempt twice yields the same trace and span ids (a receiver sees the same spans again,
never a second copy under new ids). A root span per attempt (the rollout) carries the task, the rewards and the
status; a span whose parent is not in the attempt hangs under that root.

Secrets: resources are exported only as ``agl.core.server.auth.redact`` shows them (no LLM ``api_key``), and URLs
lose any user:password part.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from agl.core.adapter import is_tie_break
from agl.core.jsonsafe import parsed_or_text
from agl.core.net import shown_url
from agl.core.types import (
    ATTR_AGENT_NAME,
    ATTR_BACKEND_URL,
    ATTR_ERROR_MESSAGE,
    ATTR_ERROR_TYPE,
    ATTR_FINISH_REASONS,
    ATTR_INPUT_MESSAGES,
    ATTR_INPUT_TOKENS,
    ATTR_MODEL,
    ATTR_OPERATION,
    ATTR_OUTPUT_MESSAGES,
    ATTR_OUTPUT_TOKENS,
    ATTR_PROVIDER,
    ATTR_RESPONSE_ID,
    ATTR_RESPONSE_MODEL,
    ATTR_REWARD,
    ATTR_TOOL_ARGUMENTS,
    ATTR_TOOL_CALL_ID,
    ATTR_TOOL_NAME,
    ATTR_TOOL_RESULT,
    ATTR_TOOLS,
    Attempt,
    ResourceSet,
    Rollout,
    Span,
)

#: A primitive or a homogeneous list of primitives: what an OpenTelemetry attribute value may be.
AttrValue = str | bool | int | float | list[str] | list[bool] | list[int] | list[float]

#: OpenInference span kinds agl's span kinds map to.
OPENINFERENCE_KIND = {
    "llm": "LLM",
    "tool": "TOOL",
    "agent": "AGENT",
    "reward": "EVALUATOR",
    "message": "CHAIN",
    "exception": "CHAIN",
    "custom": "CHAIN",
}
#: GenAI ``gen_ai.operation.name`` of the span kinds that have one.
GEN_AI_OPERATION = {"llm": "chat", "tool": "execute_tool", "agent": "invoke_agent"}
#: Where agl writes the ids it exports (so an exported trace can be imported back to the same rollout).
ATTR_ROLLOUT_ID = "agl.rollout_id"
ATTR_ATTEMPT_ID = "agl.attempt_id"
ATTR_SPAN_ID = "agl.span_id"
ATTR_SPAN_KIND = "agl.span_kind"
ATTR_TASK_ID = "agl.task_id"
ATTR_FINAL_REWARD = "agl.final_reward"
ATTR_REWARDS = "agl.rewards"
ATTR_ROOT = "agl.rollout"

#: The OpenInference and GenAI keys agl writes beside its own ``ATTR_*`` ones, and reads back on import: one spelling
#: for the exporter and the importer.
OI_SPAN_KIND = "openinference.span.kind"
OI_INPUT_VALUE = "input.value"
OI_INPUT_MIME = "input.mime_type"
OI_OUTPUT_VALUE = "output.value"
OI_OUTPUT_MIME = "output.mime_type"
OI_MODEL_NAME = "llm.model_name"
OI_INPUT_MESSAGES = "llm.input_messages"
OI_OUTPUT_MESSAGES = "llm.output_messages"
OI_TOKENS_PROMPT = "llm.token_count.prompt"
OI_TOKENS_COMPLETION = "llm.token_count.completion"
OI_TOKENS_TOTAL = "llm.token_count.total"
OI_TOOLS = "llm.tools"
OI_TOOL_SCHEMA = "tool.json_schema"
GEN_AI_TOOL_TYPE = "gen_ai.tool.type"


@dataclass
class OtelSpan:
    """One OpenTelemetry span as plain data (ids as ints, times in nanoseconds since the epoch)."""

    trace_id: int
    span_id: int
    parent_span_id: int | None
    name: str
    start_ns: int
    end_ns: int
    attributes: dict[str, AttrValue]
    error: str | None = None
    events: list[tuple[str, int, dict[str, AttrValue]]] = field(default_factory=list)
    client: bool = False  # an outgoing call to a model (span kind CLIENT); everything else is INTERNAL


def _digest(text: str, size: int) -> int:
    value = int.from_bytes(hashlib.sha256(text.encode()).digest()[:size], "big")
    return value or 1  # 0 is the invalid id in OpenTelemetry


def trace_id_of(rollout_id: str, attempt_id: str) -> int:
    """The trace id of one attempt: 128 bits of a hash of the two ids (the same on every export)."""
    return _digest(f"agl-trace\0{rollout_id}\0{attempt_id}", 16)


def span_id_of(span_id: str) -> int:
    """The OpenTelemetry span id of an agl span id (64 bits of a hash)."""
    return _digest(f"agl-span\0{span_id}", 8)


def root_span_id_of(attempt_id: str) -> int:
    """The span id of an attempt's root span."""
    return _digest(f"agl-root\0{attempt_id}", 8)


def _ns(seconds: float) -> int:
    return round(seconds * 1e9)


def _json(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)


def _value(value: Any) -> AttrValue | None:
    """``value`` as an attribute value: primitives and homogeneous primitive lists as they are, the rest as JSON."""
    if value is None:
        return None
    if isinstance(value, str | bool | int | float):
        return value
    if isinstance(value, list) and value:
        kinds = {type(v) for v in value}
        if len(kinds) == 1 and kinds <= {str, bool, int, float}:
            return list(value)
    return _json(value)


# ------------------------------------------------------------------------------------------------- messages


def _text(content: Any) -> str | None:
    """The text of an OpenAI message ``content`` (a string or a list of parts)."""
    if content is None:
        return None
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return str(content)


def genai_message(message: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
    """An OpenAI chat message in the GenAI conventions' shape: role + parts (text, tool_call, tool_call_response)."""
    role = str(message.get("role", "user"))
    parts: list[dict[str, Any]] = []
    text = _text(message.get("content"))
    if role == "tool":
        parts.append({"type": "tool_call_response", "id": message.get("tool_call_id"), "response": text})
    elif text:
        parts.append({"type": "text", "content": text})
    for call in message.get("tool_calls") or []:
        fn = call.get("function") or {}
        parts.append(
            {
                "type": "tool_call",
                "id": call.get("id"),
                "name": fn.get("name"),
                "arguments": parsed_or_text(fn.get("arguments")),
            }
        )
    out: dict[str, Any] = {"role": role, "parts": parts}
    if finish_reason is not None:
        out["finish_reason"] = finish_reason
    return out


def _openinference_messages(prefix: str, messages: Sequence[Any], attrs: dict[str, AttrValue]) -> None:
    """``llm.input_messages.{i}.message.*`` (or output) attributes of OpenAI chat messages."""
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            continue
        key = f"{prefix}.{i}.message"
        attrs[f"{key}.role"] = str(m.get("role", ""))
        text = _text(m.get("content"))
        if text is not None:
            attrs[f"{key}.content"] = text
        if m.get("name"):
            attrs[f"{key}.name"] = str(m["name"])
        if m.get("tool_call_id"):
            attrs[f"{key}.tool_call_id"] = str(m["tool_call_id"])
        for j, call in enumerate(m.get("tool_calls") or []):
            fn = call.get("function") or {}
            call_key = f"{key}.tool_calls.{j}.tool_call"
            if call.get("id"):
                attrs[f"{call_key}.id"] = str(call["id"])
            attrs[f"{call_key}.function.name"] = str(fn.get("name", ""))
            attrs[f"{call_key}.function.arguments"] = _json(fn.get("arguments", ""))


# ---------------------------------------------------------------------------------------------------- spans


def _llm_attributes(a: dict[str, Any], out: dict[str, AttrValue]) -> str:
    """GenAI + OpenInference attributes of an ``llm`` span; returns the span's name (``chat {model}``)."""
    model = a.get(ATTR_MODEL)
    response_model = a.get(ATTR_RESPONSE_MODEL) or model
    inputs = a.get(ATTR_INPUT_MESSAGES) or []
    outputs = a.get(ATTR_OUTPUT_MESSAGES) or []
    reasons = a.get(ATTR_FINISH_REASONS) or []
    out[ATTR_PROVIDER] = "openai"
    if model:
        out[ATTR_MODEL] = str(model)
    if response_model:
        out[ATTR_RESPONSE_MODEL] = str(response_model)
        out[OI_MODEL_NAME] = str(response_model)
    if isinstance(inputs, list):
        out[ATTR_INPUT_MESSAGES] = _json([genai_message(m) for m in inputs if isinstance(m, dict)])
        _openinference_messages(OI_INPUT_MESSAGES, inputs, out)
        out[OI_INPUT_VALUE] = _json({"messages": inputs})
        out[OI_INPUT_MIME] = "application/json"
    if isinstance(outputs, list):
        out[ATTR_OUTPUT_MESSAGES] = _json(
            [
                genai_message(m, reasons[i] if i < len(reasons) and isinstance(reasons[i], str) else None)
                for i, m in enumerate(outputs)
                if isinstance(m, dict)
            ]
        )
        _openinference_messages(OI_OUTPUT_MESSAGES, outputs, out)
        last = outputs[-1] if outputs and isinstance(outputs[-1], dict) else {}
        text = _text(last.get("content"))
        out[OI_OUTPUT_VALUE] = text if text and not last.get("tool_calls") else _json(last)
        out[OI_OUTPUT_MIME] = "text/plain" if text and not last.get("tool_calls") else "application/json"
    if reasons:
        out[ATTR_FINISH_REASONS] = [str(r) for r in reasons]
    tokens_in, tokens_out = a.get(ATTR_INPUT_TOKENS), a.get(ATTR_OUTPUT_TOKENS)
    if isinstance(tokens_in, int):
        out[ATTR_INPUT_TOKENS] = tokens_in
        out[OI_TOKENS_PROMPT] = tokens_in
    if isinstance(tokens_out, int):
        out[ATTR_OUTPUT_TOKENS] = tokens_out
        out[OI_TOKENS_COMPLETION] = tokens_out
    if isinstance(tokens_in, int) and isinstance(tokens_out, int):
        out[OI_TOKENS_TOTAL] = tokens_in + tokens_out
    tools = a.get(ATTR_TOOLS)
    if isinstance(tools, list):
        out[ATTR_TOOLS] = _json(tools)
        for i, tool in enumerate(tools):
            out[f"{OI_TOOLS}.{i}.{OI_TOOL_SCHEMA}"] = _json(tool)
    if a.get(ATTR_RESPONSE_ID):
        out[ATTR_RESPONSE_ID] = str(a[ATTR_RESPONSE_ID])
    return f"chat {model}" if model else "chat"


def _tool_attributes(span: Span, a: dict[str, Any], out: dict[str, AttrValue]) -> str:
    name = str(a.get(ATTR_TOOL_NAME) or span.name)
    out[ATTR_TOOL_NAME] = name
    out["tool.name"] = name
    out[GEN_AI_TOOL_TYPE] = "function"
    if a.get(ATTR_TOOL_CALL_ID) is not None:
        out[ATTR_TOOL_CALL_ID] = str(a[ATTR_TOOL_CALL_ID])
    if ATTR_TOOL_ARGUMENTS in a:
        out[ATTR_TOOL_ARGUMENTS] = _json(a[ATTR_TOOL_ARGUMENTS])
        out[OI_INPUT_VALUE] = _json(a[ATTR_TOOL_ARGUMENTS])
    if ATTR_TOOL_RESULT in a:
        out[ATTR_TOOL_RESULT] = _json(a[ATTR_TOOL_RESULT])
        out[OI_OUTPUT_VALUE] = _json(a[ATTR_TOOL_RESULT])
    return f"execute_tool {name}"


def to_otel_span(span: Span, trace_id: int, parent: int) -> OtelSpan:
    """One agl span as an OpenTelemetry span of trace ``trace_id`` under span ``parent`` (when its own parent is
    not in the trace). Every agl attribute is kept (as JSON text when it is not a primitive)."""
    a = span.attributes
    out: dict[str, AttrValue] = {}
    for key, raw in a.items():
        if (value := _value(raw)) is not None:
            out[key] = value
    if isinstance(a.get(ATTR_BACKEND_URL), str):
        out[ATTR_BACKEND_URL] = shown_url(a[ATTR_BACKEND_URL])
    out[ATTR_SPAN_ID] = span.span_id
    out[ATTR_SPAN_KIND] = span.kind
    out[ATTR_ROLLOUT_ID] = span.rollout_id
    out[ATTR_ATTEMPT_ID] = span.attempt_id
    out[OI_SPAN_KIND] = OPENINFERENCE_KIND[span.kind]
    if span.agent:
        out[ATTR_AGENT_NAME] = span.agent
        out["agent.name"] = span.agent
    operation = GEN_AI_OPERATION.get(span.kind)
    if operation is not None:
        out[ATTR_OPERATION] = operation
    name = span.name
    if span.kind == "llm":
        name = _llm_attributes(a, out)
    elif span.kind == "tool":
        name = _tool_attributes(span, a, out)
    elif span.kind == "agent":
        name = f"invoke_agent {span.agent or span.name}"
    elif span.kind == "reward":
        out[OI_OUTPUT_VALUE] = _json(a.get(ATTR_REWARD))
    elif span.kind == "message" and "agl.message" in a:
        out[OI_OUTPUT_VALUE] = str(a["agl.message"])
    events: list[tuple[str, int, dict[str, AttrValue]]] = []
    error = None
    end = span.end_time if span.end_time is not None else span.start_time
    if span.status == "error":
        error = str(a.get(ATTR_ERROR_MESSAGE) or a.get("exception.message") or a.get(ATTR_ERROR_TYPE) or "error")
        if span.kind == "exception":
            exc: dict[str, AttrValue] = {
                k: str(a[k]) for k in ("exception.type", "exception.message", "exception.stacktrace") if k in a
            }
            events.append(("exception", _ns(end), dict(exc)))
    return OtelSpan(
        trace_id=trace_id,
        span_id=span_id_of(span.span_id),
        parent_span_id=parent,
        name=name,
        start_ns=_ns(span.start_time),
        end_ns=_ns(end),
        attributes=out,
        error=error,
        events=events,
        client=span.kind == "llm",
    )


def root_span(rollout: Rollout, attempt: Attempt, spans: Sequence[Span], resources: ResourceSet | None) -> OtelSpan:
    """The span of the rollout itself: task, task id, status, final reward and intermediate rewards (tie-break scores
    are not rewards: they keep their own spans only), the resources version (redacted: pass what
    ``agl.core.server.auth.redact`` returns)."""
    rewards = [float(s.attributes.get(ATTR_REWARD, 0.0)) for s in spans if s.kind == "reward" and not is_tie_break(s)]
    final = rollout.final_reward if attempt.status == "succeeded" or rollout.status == "succeeded" else None
    attrs: dict[str, AttrValue] = {
        ATTR_ROOT: True,
        OI_SPAN_KIND: "CHAIN",
        ATTR_ROLLOUT_ID: rollout.rollout_id,
        ATTR_ATTEMPT_ID: attempt.attempt_id,
        "agl.attempt.number": attempt.number,
        "agl.attempt.status": attempt.status,
        "agl.attempt.worker_id": attempt.worker_id,
        "agl.rollout.status": rollout.status,
        "agl.mode": rollout.mode,
        "agl.resources_version": rollout.resources_version,
        OI_INPUT_VALUE: _json(rollout.task),
        OI_INPUT_MIME: "application/json",
    }
    if rollout.task_id is not None:
        attrs[ATTR_TASK_ID] = rollout.task_id
    if final is not None:
        attrs[ATTR_FINAL_REWARD] = final
        attrs[OI_OUTPUT_VALUE] = _json({"final_reward": final})
        attrs[OI_OUTPUT_MIME] = "application/json"
    if rewards:
        attrs[ATTR_REWARDS] = rewards
    if rollout.metadata:
        attrs["metadata"] = _json(rollout.metadata)
    if resources is not None:
        attrs["agl.resources"] = _json({k: v.model_dump() for k, v in resources.resources.items()})
    agents = sorted({s.agent for s in spans if s.agent})
    if len(agents) == 1:
        attrs[ATTR_AGENT_NAME] = agents[0]
    start = min([attempt.started_at, *(s.start_time for s in spans)])
    end = max([attempt.ended_at or attempt.heartbeat_at, *((s.end_time or s.start_time) for s in spans)])
    error = None
    if attempt.status != "succeeded":
        error = attempt.error or rollout.error or attempt.status
    return OtelSpan(
        trace_id=trace_id_of(rollout.rollout_id, attempt.attempt_id),
        span_id=root_span_id_of(attempt.attempt_id),
        parent_span_id=None,
        name=f"rollout {rollout.task_id or rollout.rollout_id}",
        start_ns=_ns(start),
        end_ns=_ns(end),
        attributes=attrs,
        error=error,
    )


def attempt_trace(
    rollout: Rollout, attempt: Attempt, spans: Sequence[Span], resources: ResourceSet | None
) -> list[OtelSpan]:
    """One attempt as one trace: its root span first, then every span of the attempt with its parent link."""
    trace = trace_id_of(rollout.rollout_id, attempt.attempt_id)
    root = root_span(rollout, attempt, spans, resources)
    ids = {s.span_id for s in spans}
    out = [root]
    for s in spans:
        parent = span_id_of(s.parent_id) if s.parent_id in ids and s.parent_id is not None else root.span_id
        out.append(to_otel_span(s, trace, parent))
    return out


# ----------------------------------------------------------------------------------------------- OTLP JSON


def _any_value(value: AttrValue) -> dict[str, Any]:
    if isinstance(value, bool):
        return {"boolValue": value}
    if isinstance(value, int):
        return {"intValue": str(value)}
    if isinstance(value, float):
        return {"doubleValue": value}
    if isinstance(value, str):
        return {"stringValue": value}
    return {"arrayValue": {"values": [_any_value(v) for v in value]}}


def _key_values(attrs: dict[str, AttrValue]) -> list[dict[str, Any]]:
    return [{"key": k, "value": _any_value(v)} for k, v in attrs.items()]


def otlp_json(spans: Sequence[OtelSpan], service_name: str = "agl") -> dict[str, Any]:
    """An OTLP ``ExportTraceServiceRequest`` in the OTLP JSON encoding (hex ids, nanosecond times as strings)."""
    encoded = []
    for s in spans:
        item: dict[str, Any] = {
            "traceId": f"{s.trace_id:032x}",
            "spanId": f"{s.span_id:016x}",
            "name": s.name,
            "kind": 3 if s.client else 1,
            "startTimeUnixNano": str(s.start_ns),
            "endTimeUnixNano": str(s.end_ns),
            "attributes": _key_values(s.attributes),
            "events": [{"name": n, "timeUnixNano": str(t), "attributes": _key_values(a)} for n, t, a in s.events],
            "status": {"code": 2, "message": s.error} if s.error is not None else {"code": 1},
        }
        if s.parent_span_id is not None:
            item["parentSpanId"] = f"{s.parent_span_id:016x}"
        encoded.append(item)
    return {
        "resourceSpans": [
            {
                "resource": {"attributes": _key_values({"service.name": service_name})},
                "scopeSpans": [{"scope": {"name": "agl"}, "spans": encoded}],
            }
        ]
    }
