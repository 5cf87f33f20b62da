"""Import traces of an agent that ran without agl (OpenInference / OTel GenAI conventions) into a store as rollouts.

One trace becomes one finished rollout with one attempt: its spans become agl spans (``llm`` / ``tool`` / ``agent``
/ ``custom``) with the request and response messages, model, token counts and tools in agl's attributes, the agent
name from the span attributes (``gen_ai.agent.name``, ``agent.name``, LangGraph's node in ``metadata``, else the
nearest ``AGENT`` span above), and rewards from annotations (Phoenix), feedback (MLflow) or ``agl.*`` reward
attributes (a trace agl exported). Spans are numbered in start-time order (one source, one clock), so rewards land
after the call they judge.

Sources: an OTLP JSON file (``read_otlp_json``), a Phoenix server's REST API (``read_phoenix``) and an MLflow
tracking store read with MLflow's own client (``read_mlflow``). Writing is idempotent: a trace already imported (same
rollout id) is skipped. The importer leases its rollouts from the store, so it refuses a store with queued rollouts
(a trainer's runners would race it for them).
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agl.core.jsonsafe import jsonable, parsed_or_text
from agl.core.net import shown_url
from agl.core.store.base import NotFound, Store
from agl.core.types import (
    ATTR_AGENT_NAME,
    ATTR_FINISH_REASONS,
    ATTR_INPUT_MESSAGES,
    ATTR_INPUT_TOKENS,
    ATTR_MODEL,
    ATTR_OPERATION,
    ATTR_OUTPUT_MESSAGES,
    ATTR_OUTPUT_TOKENS,
    ATTR_REWARD,
    ATTR_TOOL_ARGUMENTS,
    ATTR_TOOL_CALL_ID,
    ATTR_TOOL_NAME,
    ATTR_TOOL_RESULT,
    ATTR_TOOLS,
    AttemptStatus,
    PromptTemplate,
    RolloutRequest,
    Span,
    SpanKind,
)
from agl.otel.mapping import (
    ATTR_FINAL_REWARD,
    ATTR_ROOT,
    ATTR_SPAN_KIND,
    ATTR_TASK_ID,
    OI_INPUT_MESSAGES,
    OI_INPUT_VALUE,
    OI_MODEL_NAME,
    OI_OUTPUT_MESSAGES,
    OI_OUTPUT_VALUE,
    OI_SPAN_KIND,
    OI_TOKENS_COMPLETION,
    OI_TOKENS_PROMPT,
    OI_TOOL_SCHEMA,
    OI_TOOLS,
)

#: Where an imported rollout says where it came from (``Rollout.metadata``): source, trace id.
IMPORTED = "agl.imported"
WORKER_ID = "agl-import"


@dataclass
class ForeignSpan:
    """A span as a receiver or file holds it: ids as hex strings, times in seconds, attributes flat."""

    trace_id: str
    span_id: str
    parent_id: str | None
    name: str
    start: float
    end: float
    attributes: dict[str, Any]
    error: str | None = None
    annotations: dict[str, float] = field(default_factory=dict)  # name → score (feedback on this span)


@dataclass
class ImportReport:
    """What one import wrote: new rollouts, traces skipped because they were imported before, spans written."""

    rollouts: int = 0
    skipped: int = 0
    spans: int = 0
    rollout_ids: list[str] = field(default_factory=list)


# -------------------------------------------------------------------------------------------- reading: OTLP JSON


def _hex_id(raw: Any, where: str) -> str:
    """An OTLP JSON id: hex per the OTLP spec, or base64 (protobuf's JSON mapping of bytes)."""
    if not isinstance(raw, str) or not raw:
        raise ValueError(f"{where}: expected an id string, got {raw!r}")
    if re.fullmatch(r"[0-9a-fA-F]{16}|[0-9a-fA-F]{32}", raw):
        return raw.lower()
    try:
        return base64.b64decode(raw, validate=True).hex()
    except (binascii.Error, ValueError):
        raise ValueError(f"{where}: {raw!r} is neither a hex nor a base64 id") from None


def _any(value: dict[str, Any]) -> Any:
    """An OTLP JSON ``AnyValue`` as a Python value."""
    if "stringValue" in value:
        return value["stringValue"]
    if "boolValue" in value:
        return bool(value["boolValue"])
    if "intValue" in value:
        return int(value["intValue"])
    if "doubleValue" in value:
        return float(value["doubleValue"])
    if "arrayValue" in value:
        return [_any(v) for v in value["arrayValue"].get("values", [])]
    if "kvlistValue" in value:
        return {kv["key"]: _any(kv.get("value", {})) for kv in value["kvlistValue"].get("values", [])}
    if "bytesValue" in value:
        return value["bytesValue"]
    return None


def _otlp_span(raw: dict[str, Any], where: str) -> ForeignSpan:
    for key in ("traceId", "spanId", "name", "startTimeUnixNano"):
        if key not in raw:
            raise ValueError(f"{where}: span has no {key!r}")
    status = raw.get("status") or {}
    code = status.get("code")
    failed = code in (2, "STATUS_CODE_ERROR")
    parent = raw.get("parentSpanId")
    start = int(raw["startTimeUnixNano"]) / 1e9
    return ForeignSpan(
        trace_id=_hex_id(raw["traceId"], f"{where}.traceId"),
        span_id=_hex_id(raw["spanId"], f"{where}.spanId"),
        parent_id=_hex_id(parent, f"{where}.parentSpanId") if parent else None,
        name=str(raw["name"]),
        start=start,
        end=int(raw.get("endTimeUnixNano") or raw["startTimeUnixNano"]) / 1e9,
        attributes={kv["key"]: _any(kv.get("value", {})) for kv in raw.get("attributes", [])},
        error=(status.get("message") or "error") if failed else None,
    )


def read_otlp_json(path: str | Path) -> list[ForeignSpan]:
    """The spans of an OTLP JSON file: one ``ExportTraceServiceRequest`` object, or one per line (JSON Lines, as an
    OpenTelemetry collector's file exporter writes). ``ValueError`` naming the line and field for a malformed one."""
    text = Path(path).read_text(encoding="utf-8")
    try:
        documents = [json.loads(text)]
    except json.JSONDecodeError:
        documents = []
        for number, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    documents.append(json.loads(line))
                except json.JSONDecodeError as exc:
                    raise ValueError(f"{path}: line {number} is not JSON ({exc.msg})") from None
    spans: list[ForeignSpan] = []
    for d, doc in enumerate(documents):
        if not isinstance(doc, dict) or "resourceSpans" not in doc:
            raise ValueError(f"{path}: document {d + 1} has no 'resourceSpans' (not OTLP JSON traces)")
        for r, resource in enumerate(doc["resourceSpans"]):
            for s, scope in enumerate(resource.get("scopeSpans") or resource.get("instrumentationLibrarySpans") or []):
                for i, raw in enumerate(scope.get("spans", [])):
                    spans.append(_otlp_span(raw, f"resourceSpans[{r}].scopeSpans[{s}].spans[{i}]"))
    return spans


# ---------------------------------------------------------------------------------------------- reading: Phoenix


def _iso(text: str) -> float:
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def _flatten(value: Any, prefix: str, out: dict[str, Any]) -> None:
    """Phoenix answers attributes nested (``{"llm": {"model_name": ...}}``): flatten them to OTel's dotted keys;
    lists of objects become indexed keys (``llm.input_messages.0.message.role``) as OpenInference writes them."""
    if isinstance(value, dict):
        for k, v in value.items():
            _flatten(v, f"{prefix}.{k}" if prefix else str(k), out)
    elif isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
        for i, v in enumerate(value):
            _flatten(v, f"{prefix}.{i}", out)
    else:
        out[prefix] = value


def read_phoenix(url: str, project: str = "default", *, headers: dict[str, str] | None = None) -> list[ForeignSpan]:
    """Every span of a Phoenix project (REST API ``/v1/projects/{project}/spans``, paged) with the scores of their
    span annotations."""
    import httpx

    base = url.rstrip("/")
    spans: list[ForeignSpan] = []
    with httpx.Client(base_url=base, headers=headers, timeout=30.0) as client:
        cursor: str | None = None
        while True:
            params: dict[str, Any] = {"limit": 1000}
            if cursor:
                params["cursor"] = cursor
            reply = client.get(f"/v1/projects/{project}/spans", params=params)
            if reply.status_code == 404:
                raise NotFound(f"Phoenix at {base} has no project {project!r}")
            reply.raise_for_status()
            body = reply.json()
            for raw in body.get("data", []):
                attrs: dict[str, Any] = {}
                _flatten(raw.get("attributes") or {}, "", attrs)
                if raw.get("span_kind") and OI_SPAN_KIND not in attrs:
                    attrs[OI_SPAN_KIND] = raw["span_kind"]  # Phoenix answers it beside the attributes
                context = raw.get("context") or {}
                failed = raw.get("status_code") == "ERROR"
                spans.append(
                    ForeignSpan(
                        trace_id=str(context["trace_id"]),
                        span_id=str(context["span_id"]),
                        parent_id=raw.get("parent_id") or None,
                        name=str(raw.get("name", "")),
                        start=_iso(raw["start_time"]),
                        end=_iso(raw.get("end_time") or raw["start_time"]),
                        attributes=attrs,
                        error=(raw.get("status_message") or "error") if failed else None,
                    )
                )
            cursor = body.get("next_cursor")
            if not cursor:
                break
        by_id = {s.span_id: s for s in spans}
        ids = list(by_id)
        for i in range(0, len(ids), 100):
            reply = client.get(
                f"/v1/projects/{project}/span_annotations", params={"span_ids": ids[i : i + 100], "limit": 1000}
            )
            reply.raise_for_status()
            for note in reply.json().get("data", []):
                score = (note.get("result") or {}).get("score")
                span = by_id.get(note.get("span_id"))
                if span is not None and isinstance(score, int | float):
                    span.annotations[str(note.get("name"))] = float(score)
    return spans


# ----------------------------------------------------------------------------------------------- reading: MLflow

#: MLflow span types as the OpenInference kinds ``trace_to_rollout`` reads (other types stay ``custom``).
_MLFLOW_KINDS = {"LLM": "LLM", "CHAT_MODEL": "LLM", "TOOL": "TOOL", "AGENT": "AGENT"}


def _mlflow_message(raw: dict[str, Any]) -> dict[str, Any]:
    """An MLflow chat message (OpenAI's shape, unset fields as None) without the unset fields; ``content`` stays."""
    return {k: v for k, v in raw.items() if v is not None or k == "content"}


def _mlflow_chat(inputs: Any, outputs: Any, attrs: dict[str, Any]) -> dict[str, Any]:
    """agl's LLM attributes from an MLflow LLM / CHAT_MODEL span: MLflow's chat format is OpenAI's (request
    ``messages``, ``model``, ``tools``; response ``choices[].message``, ``usage``), token usage in
    ``mlflow.chat.tokenUsage``, the model in ``mlflow.llm.model``."""
    out: dict[str, Any] = {}
    request = inputs if isinstance(inputs, dict) else {}
    response = outputs if isinstance(outputs, dict) else {}
    messages = request.get("messages", inputs)
    if isinstance(messages, list) and all(isinstance(m, dict) for m in messages):
        out[ATTR_INPUT_MESSAGES] = [_mlflow_message(m) for m in messages]
    choices = response.get("choices")
    if isinstance(choices, list) and all(isinstance(c, dict) and isinstance(c.get("message"), dict) for c in choices):
        out[ATTR_OUTPUT_MESSAGES] = [_mlflow_message(c["message"]) for c in choices]
        reasons = [c["finish_reason"] for c in choices if c.get("finish_reason")]
        if reasons:
            out[ATTR_FINISH_REASONS] = reasons
    elif isinstance(response.get("role"), str):
        out[ATTR_OUTPUT_MESSAGES] = [_mlflow_message(response)]
    elif isinstance(outputs, str):
        out[ATTR_OUTPUT_MESSAGES] = [{"role": "assistant", "content": outputs}]
    model = attrs.get("mlflow.llm.model") or request.get("model") or response.get("model")
    if isinstance(model, str) and model:
        out[ATTR_MODEL] = model
    usage = attrs.get("mlflow.chat.tokenUsage")
    raw_usage = response.get("usage")
    if not isinstance(usage, dict) and isinstance(raw_usage, dict):
        usage = {"input_tokens": raw_usage.get("prompt_tokens"), "output_tokens": raw_usage.get("completion_tokens")}
    if isinstance(usage, dict):
        for agl_key, key in ((ATTR_INPUT_TOKENS, "input_tokens"), (ATTR_OUTPUT_TOKENS, "output_tokens")):
            if isinstance(usage.get(key), int):
                out[agl_key] = usage[key]
    tools = attrs.get("mlflow.chat.tools") or request.get("tools")
    if isinstance(tools, list) and tools:
        out[ATTR_TOOLS] = tools
    return out


def _mlflow_feedback(assessments: Sequence[Any]) -> dict[str | None, dict[str, float]]:
    """Numeric (or yes/no as 1/0) feedback per span id (None: on the whole trace), the latest per name; feedback
    that is an error, overridden (``valid=False``) or not a number is left out, as are expectations."""
    notes: dict[str | None, dict[str, float]] = {}
    for note in sorted(assessments, key=lambda a: a.create_time_ms or 0):
        feedback = getattr(note, "feedback", None)
        if feedback is None or feedback.error is not None or note.valid is False:
            continue
        value = feedback.value
        if isinstance(value, bool) or (isinstance(value, str) and value.lower() in ("yes", "no")):
            score = 1.0 if value is True or str(value).lower() == "yes" else 0.0
        elif isinstance(value, int | float):
            score = float(value)
        else:
            continue
        notes.setdefault(note.span_id, {})[str(note.name)] = score
    return notes


def _mlflow_trace(trace: Any) -> list[ForeignSpan]:
    """One MLflow ``Trace`` (info + spans) as ``ForeignSpan``s: kind from ``mlflow.spanType``, ``input.value`` /
    ``output.value`` from the span's inputs and outputs (the task, a tool's arguments and result), chat messages,
    model and tokens of LLM spans in agl's attributes, feedback as annotations (trace-level on the root span)."""
    trace_id = str(trace.info.trace_id)
    if re.fullmatch(r"tr-[0-9a-f]{32}", trace_id):
        trace_id = trace_id[3:]  # MLflow's id is the OpenTelemetry trace id behind a prefix
    notes = _mlflow_feedback(trace.info.assessments or [])
    spans: list[ForeignSpan] = []
    for span in trace.data.spans:
        attrs: dict[str, Any] = dict(span.attributes)
        kind = _MLFLOW_KINDS.get(str(span.span_type or "").upper())
        if kind is not None:
            attrs[OI_SPAN_KIND] = kind
        inputs, outputs = span.inputs, span.outputs
        if inputs is not None:
            attrs[OI_INPUT_VALUE] = json.dumps(jsonable(inputs))
        if outputs is not None:
            attrs[OI_OUTPUT_VALUE] = json.dumps(jsonable(outputs))
        if kind == "LLM":
            attrs.update(_mlflow_chat(inputs, outputs, attrs))
        failed = str(getattr(span.status.status_code, "value", span.status.status_code)) == "ERROR"
        start = span.start_time_ns / 1e9
        spans.append(
            ForeignSpan(
                trace_id=trace_id,
                span_id=str(span.span_id),
                parent_id=span.parent_id or None,
                name=str(span.name),
                start=start,
                end=span.end_time_ns / 1e9 if span.end_time_ns is not None else start,
                attributes=attrs,
                error=(span.status.description or "error") if failed else None,
                annotations=dict(notes.get(str(span.span_id), {})),
            )
        )
    roots = [s for s in spans if s.parent_id is None]
    if roots and None in notes:
        root = min(roots, key=lambda s: s.start)
        root.annotations = {**root.annotations, **notes[None]}
    return spans


def read_mlflow(tracking_uri: str, experiment: str | None = None, *, page_size: int = 100) -> list[ForeignSpan]:
    """Every span of the traces in an MLflow tracking store (``sqlite:///mlflow.db``, ``http://host:port``, ...):
    of ``experiment`` (a name), else of every active experiment; read with MLflow's own client (extra ``mlflow``),
    with the numeric feedback logged on each trace or span (``mlflow.log_feedback``)."""
    try:
        from mlflow import MlflowClient
        from mlflow.exceptions import MlflowException
    except ImportError:
        raise ImportError("reading MLflow traces needs MLflow: pip install 'agl[mlflow]'") from None

    shown = shown_url(tracking_uri)
    client = MlflowClient(tracking_uri=tracking_uri)
    spans: list[ForeignSpan] = []
    try:
        if experiment is not None:
            found = client.get_experiment_by_name(experiment)
            if found is None:
                raise NotFound(f"MLflow at {shown} has no experiment {experiment!r}")
            ids = [str(found.experiment_id)]
        else:
            ids, token = [], None
            while True:
                page = client.search_experiments(max_results=1000, page_token=token)
                ids += [str(e.experiment_id) for e in page]
                token = page.token
                if not token:
                    break
        if not ids:
            return spans
        token = None
        while True:
            traces = client.search_traces(locations=ids, max_results=page_size, page_token=token, include_spans=True)
            for trace in traces:
                spans.extend(_mlflow_trace(trace))
            token = traces.token
            if not token:
                break
    except MlflowException as exc:
        raise ValueError(f"MLflow at {shown}: {exc.message}") from None
    return spans


# ------------------------------------------------------------------------------------------- converting to agl


def _indexed(attrs: dict[str, Any], prefix: str) -> list[dict[str, Any]]:
    """``prefix.{i}.rest = v`` keys as a list of ``{rest: v}`` dicts, by index."""
    found: dict[int, dict[str, Any]] = {}
    pattern = re.compile(re.escape(prefix) + r"\.(\d+)\.(.+)")
    for key, value in attrs.items():
        m = pattern.fullmatch(key)
        if m:
            found.setdefault(int(m.group(1)), {})[m.group(2)] = value
    return [found[i] for i in sorted(found)]


def _openinference_messages(attrs: dict[str, Any], prefix: str) -> list[dict[str, Any]]:
    """OpenInference ``llm.input_messages.{i}.message.*`` attributes as OpenAI chat messages."""
    messages = []
    for entry in _indexed(attrs, prefix):
        message: dict[str, Any] = {"role": entry.get("message.role", "user"), "content": entry.get("message.content")}
        if entry.get("message.tool_call_id"):
            message["tool_call_id"] = entry["message.tool_call_id"]
        if entry.get("message.name"):
            message["name"] = entry["message.name"]
        calls = _indexed({k: v for k, v in entry.items()}, "message.tool_calls")
        if calls:
            message["tool_calls"] = [
                {
                    "id": c.get("tool_call.id"),
                    "type": "function",
                    "function": {
                        "name": c.get("tool_call.function.name"),
                        "arguments": c.get("tool_call.function.arguments", ""),
                    },
                }
                for c in calls
            ]
        messages.append(message)
    return messages


def _genai_messages(value: Any) -> list[dict[str, Any]] | None:
    """GenAI ``gen_ai.input.messages`` (role + parts) as OpenAI chat messages; None when it is not that shape."""
    data = parsed_or_text(value)
    if not isinstance(data, list) or not all(isinstance(m, dict) for m in data):
        return None
    if not any("parts" in m for m in data):
        return data  # already OpenAI-shaped
    out = []
    for m in data:
        message: dict[str, Any] = {"role": m.get("role", "user")}
        texts, calls = [], []
        for part in m.get("parts") or []:
            kind = part.get("type")
            if kind == "text":
                texts.append(str(part.get("content", "")))
            elif kind == "tool_call":
                args = part.get("arguments")
                calls.append(
                    {
                        "id": part.get("id"),
                        "type": "function",
                        "function": {
                            "name": part.get("name"),
                            "arguments": json.dumps(args) if args is not None else "",
                        },
                    }
                )
            elif kind == "tool_call_response":
                message["role"] = "tool"
                message["tool_call_id"] = part.get("id")
                response = part.get("response")
                texts.append(response if isinstance(response, str) else json.dumps(response))
        message["content"] = "".join(texts) if texts else None
        if calls:
            message["tool_calls"] = calls
        out.append(message)
    return out


_LLM_OPERATIONS = {"chat", "text_completion", "generate_content"}


def _kind(attrs: dict[str, Any]) -> SpanKind:
    own = attrs.get(ATTR_SPAN_KIND)
    if own in ("llm", "tool", "agent", "reward", "message", "exception", "custom"):
        return own
    oi = str(attrs.get(OI_SPAN_KIND, "")).upper()
    op = attrs.get(ATTR_OPERATION)
    if oi == "LLM" or op in _LLM_OPERATIONS:
        return "llm"
    if oi == "TOOL" or op == "execute_tool":
        return "tool"
    if oi == "AGENT" or op in ("invoke_agent", "create_agent"):
        return "agent"
    return "custom"


def _own_agent(attrs: dict[str, Any]) -> str | None:
    for key in (ATTR_AGENT_NAME, "agent.name"):
        if isinstance(attrs.get(key), str) and attrs[key]:
            return str(attrs[key])
    metadata = parsed_or_text(attrs.get("metadata"))
    node = metadata.get("langgraph_node") if isinstance(metadata, dict) else attrs.get("metadata.langgraph_node")
    return node if isinstance(node, str) and node else None


def _normalized(kind: SpanKind, name: str, attrs: dict[str, Any]) -> dict[str, Any]:
    """``attrs`` plus agl's attributes for an ``llm`` / ``tool`` span (what the adapter and trainers read)."""
    out = dict(attrs)
    if kind == "llm":
        inputs = _genai_messages(attrs.get(ATTR_INPUT_MESSAGES)) or _openinference_messages(attrs, OI_INPUT_MESSAGES)
        outputs = _genai_messages(attrs.get(ATTR_OUTPUT_MESSAGES)) or _openinference_messages(attrs, OI_OUTPUT_MESSAGES)
        out[ATTR_INPUT_MESSAGES] = inputs
        out[ATTR_OUTPUT_MESSAGES] = outputs
        model = attrs.get(ATTR_MODEL) or attrs.get(OI_MODEL_NAME)
        if model:
            out[ATTR_MODEL] = model
        for agl_key, oi_key in (
            (ATTR_INPUT_TOKENS, OI_TOKENS_PROMPT),
            (ATTR_OUTPUT_TOKENS, OI_TOKENS_COMPLETION),
        ):
            value = attrs.get(agl_key, attrs.get(oi_key))
            if isinstance(value, int):
                out[agl_key] = value
        tools = parsed_or_text(attrs.get(ATTR_TOOLS))
        if not isinstance(tools, list):
            tools = [parsed_or_text(t.get(OI_TOOL_SCHEMA)) for t in _indexed(attrs, OI_TOOLS)] or None
        if tools:
            out[ATTR_TOOLS] = tools
        reasons = attrs.get(ATTR_FINISH_REASONS)
        if isinstance(reasons, list):
            out[ATTR_FINISH_REASONS] = reasons
    elif kind == "tool":
        out[ATTR_OPERATION] = "execute_tool"
        out[ATTR_TOOL_NAME] = attrs.get(ATTR_TOOL_NAME) or attrs.get("tool.name") or name
        if ATTR_TOOL_ARGUMENTS not in attrs and OI_INPUT_VALUE in attrs:
            out[ATTR_TOOL_ARGUMENTS] = parsed_or_text(attrs[OI_INPUT_VALUE])
        if ATTR_TOOL_RESULT not in attrs and OI_OUTPUT_VALUE in attrs:
            out[ATTR_TOOL_RESULT] = parsed_or_text(attrs[OI_OUTPUT_VALUE])
        if attrs.get(ATTR_TOOL_CALL_ID) is not None:
            out[ATTR_TOOL_CALL_ID] = str(attrs[ATTR_TOOL_CALL_ID])
    return jsonable(out)


@dataclass
class ImportedTrace:
    """One trace ready to store: the rollout to enqueue, its spans (attempt id filled in when leased), its outcome."""

    request: RolloutRequest
    spans: list[Span]
    final_reward: float | None
    error: str | None


def _score(annotations: dict[str, float], reward: str | None) -> float | None:
    if reward is not None:
        return annotations.get(reward)
    return next(iter(annotations.values()), None) if len(annotations) == 1 else None


def trace_to_rollout(trace: Sequence[ForeignSpan], source: str, reward: str | None = None) -> ImportedTrace:
    """One trace as a rollout: its root span gives the task (``input.value``), the status and the final reward (an
    annotation named ``reward``, the only annotation when ``reward`` is None, or ``agl.final_reward``); annotations
    on other spans become intermediate ``reward`` spans right after the span they judge."""
    trace_id = trace[0].trace_id
    rollout_id = f"ro-otel-{trace_id}"
    ids = {s.span_id for s in trace}
    roots = [s for s in trace if s.parent_id not in ids]
    root = min(roots, key=lambda s: s.start)
    agl_root = root.attributes.get(ATTR_ROOT) is True
    kids: dict[str | None, list[ForeignSpan]] = {}
    for s in trace:
        kids.setdefault(s.parent_id if s.parent_id in ids else None, []).append(s)
    agents: dict[str, str | None] = {}

    def assign(parent: str | None, inherited: str | None) -> None:
        for s in kids.get(parent, []):
            agent = _own_agent(s.attributes) or (s.name if _kind(s.attributes) == "agent" else None) or inherited
            agents[s.span_id] = agent
            assign(s.span_id, agent)

    assign(None, None)
    moments: list[tuple[float, int, Span]] = []
    for order, s in enumerate(trace):
        if agl_root and s is root:
            continue
        kind = _kind(s.attributes)
        span_id = f"sp-otel-{trace_id[:16]}-{s.span_id}"
        parent = s.parent_id if s.parent_id in ids and not (agl_root and s.parent_id == root.span_id) else None
        moments.append(
            (
                s.start,
                order,
                Span(
                    span_id=span_id,
                    rollout_id=rollout_id,
                    attempt_id="pending",
                    parent_id=f"sp-otel-{trace_id[:16]}-{parent}" if parent else None,
                    kind=kind,
                    name=s.name[:512],
                    agent=agents.get(s.span_id),
                    start_time=s.start,
                    end_time=s.end,
                    status="error" if s.error is not None else "ok",
                    attributes=_normalized(kind, s.name, s.attributes),
                ),
            )
        )
        if s is not root:
            for name, score in s.annotations.items():
                note = Span(
                    span_id=f"{span_id}-{name.replace('/', '_')}"[:128],
                    rollout_id=rollout_id,
                    attempt_id="pending",
                    parent_id=span_id,
                    kind="reward",
                    name=name[:512],
                    agent=agents.get(s.span_id),
                    start_time=s.end,
                    end_time=s.end,
                    attributes={ATTR_REWARD: score},
                )
                moments.append((s.end, len(trace) + order, note))
    spans = [
        span.model_copy(update={"sequence": number})
        for number, (_, _, span) in enumerate(sorted(moments, key=lambda m: (m[0], m[1])), 1)
    ]
    final = _score(root.annotations, reward)
    if final is None and isinstance(root.attributes.get(ATTR_FINAL_REWARD), int | float):
        final = float(root.attributes[ATTR_FINAL_REWARD])
    task = parsed_or_text(root.attributes.get(OI_INPUT_VALUE))
    task_id = root.attributes.get(ATTR_TASK_ID)
    request = RolloutRequest(
        task=jsonable(task),
        task_id=str(task_id) if task_id is not None else trace_id,
        rollout_id=rollout_id,
        max_attempts=1,
        metadata={IMPORTED: {"source": source, "trace_id": trace_id, "root": root.name}},
    )
    return ImportedTrace(request, spans, final, root.error)


def group_traces(spans: Iterable[ForeignSpan]) -> list[list[ForeignSpan]]:
    """Spans grouped by trace, traces in the order their first span came."""
    traces: dict[str, list[ForeignSpan]] = {}
    for s in spans:
        traces.setdefault(s.trace_id, []).append(s)
    return list(traces.values())


# ---------------------------------------------------------------------------------------------- writing


def import_traces(
    store: Store, spans: Iterable[ForeignSpan], source: str, *, reward: str | None = None
) -> ImportReport:
    """Write each trace of ``spans`` to ``store`` as a finished rollout (see ``trace_to_rollout``).

    A trace already in the store is skipped. Import into a store no runner is attached to: the importer enqueues
    each trace and takes it back with ``lease`` to store its spans, so an idle runner of the same store can lease an
    imported rollout first (and run the agent on its input; the import then fails naming the rollouts it could not
    lease). Refused (``ValueError``) while the store has queued rollouts (a trainer is using it); an idle runner
    leaves no trace in the store, so it cannot be detected.
    """
    traces = [trace_to_rollout(t, source, reward) for t in group_traces(spans)]
    report = ImportReport()
    if not traces:
        return report
    queued = store.list_rollouts(status="queued", limit=1)
    if queued:
        raise ValueError(
            f"import: the store has queued rollouts (e.g. {queued[0].rollout_id}); import into a store no trainer is "
            "using at the moment"
        )
    try:
        store.get_resources()
    except NotFound:
        # a rollout needs a resources version; a store with none gets one that says what its rollouts are
        store.publish_resources({IMPORTED: PromptTemplate(template="traces imported from outside agl")})
    stored = {r.rollout_id: r for r in store.enqueue([t.request for t in traces])}
    todo = {t.request.rollout_id: t for t in traces if stored[str(t.request.rollout_id)].status == "queued"}
    report.skipped = len(traces) - len(todo)
    while todo:
        leased = store.lease(WORKER_ID)
        if leased is None:
            raise ValueError(f"import: {len(todo)} imported rollouts could not be leased (taken by another worker?)")
        rollout, attempt = leased
        trace = todo.pop(rollout.rollout_id, None)
        if trace is None:
            store.complete_attempt(attempt.attempt_id, "lost", error="leased by agl import by mistake")
            raise ValueError(f"import: leased {rollout.rollout_id}, which is not an imported trace; it was requeued")
        spans_ = [s.model_copy(update={"attempt_id": attempt.attempt_id}) for s in trace.spans]
        report.spans += store.add_spans(spans_)
        status: AttemptStatus = "failed" if trace.error is not None else "succeeded"
        store.complete_attempt(attempt.attempt_id, status, final_reward=trace.final_reward, error=trace.error)
        report.rollouts += 1
        report.rollout_ids.append(rollout.rollout_id)
    return report
