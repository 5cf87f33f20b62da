"""One gateway call as data: what the agent asked, what the backend answered (whole, or a stream's chunks folded in
as they pass), and the ``llm`` span it becomes; with the SSE framing a stream is read and cut with."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Sequence
from typing import Any, Literal
from urllib.parse import unquote

from fastapi import Request
from pydantic import ValidationError

from agl.core.jsonsafe import json_problem
from agl.core.types import (
    ATTR_BACKEND_URL,
    ATTR_CALL_ID,
    ATTR_ERROR_MESSAGE,
    ATTR_FINISH_REASONS,
    ATTR_HTTP_STATUS,
    ATTR_INPUT_MESSAGES,
    ATTR_INPUT_TOKENS,
    ATTR_LOGPROBS,
    ATTR_MODEL,
    ATTR_OUTPUT_MESSAGES,
    ATTR_OUTPUT_TOKENS,
    ATTR_PROMPT_IDS,
    ATTR_RESOURCE,
    ATTR_RESPONSE_ID,
    ATTR_RESPONSE_IDS,
    ATTR_RESPONSE_MODEL,
    ATTR_STREAM,
    ATTR_TEMPERATURE,
    ATTR_TOKEN_IDS,
    ATTR_TOOLS,
    ATTR_WEIGHTS_VERSION,
    HEADER_AGENT,
    HEADER_CALL_ID,
    HEADER_PARENT_SPAN,
    Span,
)


def agent_of(request: Request) -> str | None:
    """The agent that made a call, from the integration's header (percent-encoded UTF-8: headers are ASCII)."""
    agent = request.headers.get(HEADER_AGENT)
    return unquote(agent) if agent is not None else None


class LLMCall:
    """Everything known about one gateway call; becomes one ``llm`` span."""

    def __init__(
        self,
        request: Request,
        body: dict[str, Any],
        rollout_id: str,
        attempt_id: str,
        resource: str,
        backend: str,
        sequence: int | None,
        token_ids: Literal["auto", "require", "off"] = "auto",
    ) -> None:
        self.start = time.time()
        self.backend = backend
        self.token_ids = token_ids
        self.recorded = False  # the span went to the pipeline (it must not go twice)
        self.added: list[str] = []  # the capture fields agl added to the agent's request
        self.rollout_id = rollout_id
        self.attempt_id = attempt_id
        self.sequence = sequence or 0
        self.agent = agent_of(request)
        self.parent_id = request.headers.get(HEADER_PARENT_SPAN)
        self.attrs: dict[str, Any] = {
            ATTR_INPUT_MESSAGES: body.get("messages"),
            ATTR_MODEL: body.get("model"),
            ATTR_RESOURCE: resource,
            ATTR_STREAM: bool(body.get("stream")),
            ATTR_BACKEND_URL: backend,
        }
        if body.get("tools") is not None:
            self.attrs[ATTR_TOOLS] = body["tools"]
        temperature = body.get("temperature")
        if isinstance(temperature, int | float) and not isinstance(temperature, bool) and math.isfinite(temperature):
            self.attrs[ATTR_TEMPERATURE] = float(temperature)  # the trainer scores the tokens at this temperature
        call_id = request.headers.get(HEADER_CALL_ID)
        if call_id is not None:
            self.attrs[ATTR_CALL_ID] = call_id
        self.status: Literal["ok", "error"] = "ok"
        # streaming assembly
        self._fields: dict[str, str] = {}
        self._role = "assistant"
        self._tool_calls: dict[int, dict[str, Any]] = {}
        self._token_ids: list[int] | None = None
        self._logprobs: list[float] | None = None
        self._finish: dict[int, str | None] = {}
        self._usage: dict[str, Any] | None = None
        self._chunks = 0

    def fail(self, status_code: int, message: str) -> None:
        self.status = "error"
        self.attrs[ATTR_HTTP_STATUS] = status_code
        self.attrs[ATTR_ERROR_MESSAGE] = message

    def ids_problem(self) -> str | None:
        """After a successful answer: why it fails ``LLM.token_ids='require'`` (None when it does not); an ``auto``
        call that asked for ids and got none is marked ``missing``."""
        if self.status != "ok" or self.attrs.get(ATTR_RESPONSE_IDS) is not None:
            return None
        if self.token_ids == "require":
            return (
                f"gateway: LLM.token_ids='require' but the backend {self.backend} answered without token ids; use a "
                "backend that returns them (vLLM, agl's policy server) or set token_ids='auto' to run without them"
            )
        if self.token_ids == "auto" and ATTR_TOKEN_IDS not in self.attrs:
            self.attrs[ATTR_TOKEN_IDS] = "missing"
        return None

    def _top_level(self, data: dict[str, Any]) -> None:
        if data.get("prompt_token_ids") is not None:
            self.attrs[ATTR_PROMPT_IDS] = data["prompt_token_ids"]
        if data.get("agl_weights_version") is not None:
            self.attrs[ATTR_WEIGHTS_VERSION] = data["agl_weights_version"]
        if data.get("model") is not None:
            self.attrs[ATTR_RESPONSE_MODEL] = data["model"]
        if data.get("id") is not None:
            self.attrs[ATTR_RESPONSE_ID] = data["id"]
        if data.get("usage"):
            self._usage = data["usage"]

    def response(self, data: dict[str, Any]) -> None:
        """Record a non-streaming chat completion."""
        self._top_level(data)
        choices = data.get("choices") or []
        self.attrs[ATTR_FINISH_REASONS] = [c.get("finish_reason") for c in choices]
        if choices:
            first = choices[0]
            self.attrs[ATTR_OUTPUT_MESSAGES] = [first.get("message")]
            if first.get("token_ids") is not None:
                self.attrs[ATTR_RESPONSE_IDS] = first["token_ids"]
            content = (first.get("logprobs") or {}).get("content")
            if content is not None:
                self.attrs[ATTR_LOGPROBS] = [e.get("logprob") for e in content]
        self._set_usage()

    def chunk(self, data: dict[str, Any]) -> None:
        """Fold one streamed chunk into the assembled response."""
        self._chunks += 1
        self._top_level(data)
        for choice in data.get("choices") or []:
            index = choice.get("index", 0)
            if choice.get("finish_reason") is not None or index not in self._finish:
                self._finish[index] = choice.get("finish_reason")
            if index != 0:
                continue
            for key, value in (choice.get("delta") or {}).items():
                if key == "role" and value:
                    self._role = value
                elif key == "tool_calls" and value:
                    self._merge_tool_calls(value)
                elif isinstance(value, str):
                    self._fields[key] = self._fields.get(key, "") + value
            if choice.get("token_ids") is not None:
                self._token_ids = (self._token_ids or []) + list(choice["token_ids"])
            content = (choice.get("logprobs") or {}).get("content")
            if content is not None:
                self._logprobs = (self._logprobs or []) + [e.get("logprob") for e in content]

    def _merge_tool_calls(self, deltas: list[dict[str, Any]]) -> None:
        for delta in deltas:
            call = self._tool_calls.setdefault(
                delta.get("index", 0), {"id": None, "type": "function", "function": {"name": "", "arguments": ""}}
            )
            if delta.get("id"):
                call["id"] = delta["id"]
            if delta.get("type"):
                call["type"] = delta["type"]
            fn = delta.get("function") or {}
            if fn.get("name"):
                call["function"]["name"] += fn["name"]
            if fn.get("arguments"):
                call["function"]["arguments"] += fn["arguments"]

    @property
    def chunks(self) -> int:
        """How many chat completion chunks of a stream were read."""
        return self._chunks

    def finish_stream(self) -> None:
        """Write the assembled streamed message into the attributes (called once, when the stream ends)."""
        if not self._chunks:
            return
        message: dict[str, Any] = {"role": self._role, "content": self._fields.pop("content", None)}
        message.update(self._fields)
        if self._tool_calls:
            message["tool_calls"] = [self._tool_calls[i] for i in sorted(self._tool_calls)]
        self.attrs[ATTR_OUTPUT_MESSAGES] = [message]
        self.attrs[ATTR_FINISH_REASONS] = [self._finish[i] for i in sorted(self._finish)]
        if self._token_ids is not None:
            self.attrs[ATTR_RESPONSE_IDS] = self._token_ids
        if self._logprobs is not None:
            self.attrs[ATTR_LOGPROBS] = self._logprobs
        self._set_usage()

    def _set_usage(self) -> None:
        if self._usage:
            if self._usage.get("prompt_tokens") is not None:
                self.attrs[ATTR_INPUT_TOKENS] = self._usage["prompt_tokens"]
            if self._usage.get("completion_tokens") is not None:
                self.attrs[ATTR_OUTPUT_TOKENS] = self._usage["completion_tokens"]

    def span(self) -> Span:
        """The call as a span. What the backend sent that JSON cannot hold (a NaN logprob, ...) is left out, named in
        ``error.message``, and the span marked ``error``: the call is recorded, never with values that cannot be read
        back."""
        fields: dict[str, Any] = {
            "rollout_id": self.rollout_id,
            "attempt_id": self.attempt_id,
            "parent_id": self.parent_id,
            "sequence": self.sequence,
            "kind": "llm",
            "name": "chat.completions",
            "agent": self.agent,
            "start_time": self.start,
            "end_time": time.time(),
            "status": self.status,
            "attributes": self.attrs,
        }
        try:
            return Span(**fields)
        except ValidationError:
            left_out = {key: problem for key, value in self.attrs.items() if (problem := json_problem(value))}
            if not left_out:
                raise
            attrs = {key: value for key, value in self.attrs.items() if key not in left_out}
            named = "; ".join(f"{key}{problem.path}: {problem.problem}" for key, problem in left_out.items())
            attrs[ATTR_ERROR_MESSAGE] = f"gateway: left out what JSON cannot hold: {named}"
            return Span(**{**fields, "status": "error", "attributes": attrs})


class SSEParser:
    """Incremental Server-Sent-Events parser: feed raw bytes, get the ``data`` payload of each complete event."""

    def __init__(self) -> None:
        self._buf = b""
        self._data: list[bytes] = []

    def feed(self, raw: bytes) -> list[bytes]:
        self._buf += raw
        events: list[bytes] = []
        while (nl := self._buf.find(b"\n")) >= 0:
            line, self._buf = self._buf[:nl].rstrip(b"\r"), self._buf[nl + 1 :]
            if not line:
                if self._data:
                    events.append(b"\n".join(self._data))
                    self._data = []
            elif line.startswith(b"data:"):
                self._data.append(line[5:].lstrip(b" "))
        return events


def drop_added(data: dict[str, Any], added: Sequence[str]) -> bool:
    """Take out of a (non-streamed) answer what only the capture fields agl ``added`` to the request made the backend
    send: the agent gets the answer it asked for (the span keeps the ids and logprobs). True when anything changed."""
    changed = False
    choices = [c for c in data.get("choices") or [] if isinstance(c, dict)]
    if "return_token_ids" in added:
        changed = data.pop("prompt_token_ids", None) is not None or changed
        for choice in choices:
            changed = choice.pop("token_ids", None) is not None or changed
    if "logprobs" in added:
        for choice in choices:
            if choice.get("logprobs") is not None:
                choice["logprobs"] = None
                changed = True
    return changed


def error_event(message: str, kind: str = "agl_span_not_stored", code: int = 503) -> bytes:
    """An SSE event OpenAI clients raise ``APIError`` on."""
    body = {"error": {"message": message, "type": kind, "code": code}}
    return b"data: " + json.dumps(body).encode() + b"\n\n"
