"""The policy server's side of OpenAI's chat-completions format: a request's fields checked one by one (a
``RequestError`` names the field), the validated request (``ChatRequest``), and the reply's message and usage built
from the engine's finished event."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from agl.serving._requests import SamplingParams, _Finished
from agl.serving.chat_format import RequestError, parse_tool_calls


@dataclass(frozen=True)
class ChatRequest:
    """A validated chat-completions request: the tokenized prompt plus what the response must contain."""

    model: str
    adapter: str | None
    prompt_ids: list[int]
    params: SamplingParams
    stream: bool
    include_usage: bool
    return_token_ids: bool
    tool_mode: bool


def is_number(value: Any) -> bool:
    """A JSON number (a bool is not one)."""
    return isinstance(value, int | float) and not isinstance(value, bool)


def optional_number(body: Mapping[str, Any], name: str, default: float, low: float, high: float) -> float:
    """``body[name]``, a number in ``[low, high]``; ``default`` when absent or null."""
    value = body.get(name)
    if value is None:
        return default
    if not is_number(value) or not low <= float(value) <= high:
        raise RequestError(name, f"must be a number between {low} and {high}")
    return float(value)


def optional_int(body: Mapping[str, Any], name: str, low: int) -> int | None:
    """``body[name]``, an integer >= ``low``; None when absent or null."""
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise RequestError(name, f"must be an integer >= {low}")
    return value


def optional_bool(body: Mapping[str, Any], name: str, default: bool = False) -> bool:
    """``body[name]``, true or false; ``default`` when absent or null."""
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise RequestError(name, "must be true or false")
    return value


def stop_strings(value: Any) -> tuple[str, ...]:
    """The ``stop`` field: one non-empty string or a list of them; none when absent or null."""
    if value is None:
        return ()
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(s, str) and s for s in items):
        raise RequestError("stop", "must be a non-empty string or a list of non-empty strings")
    return tuple(items)


def assistant_message(chat: ChatRequest, event: _Finished) -> tuple[dict[str, Any], str]:
    """The assistant message and finish reason; in tool mode ``<tool_call>`` blocks become ``tool_calls``."""
    if not chat.tool_mode:
        return {"role": "assistant", "content": event.text}, event.finish_reason
    parsed = parse_tool_calls(event.text)
    message: dict[str, Any] = {"role": "assistant", "content": parsed.content}
    finish_reason = event.finish_reason
    if parsed.tool_calls:
        message["tool_calls"] = parsed.tool_calls
        if finish_reason == "stop":
            finish_reason = "tool_calls"
    return message, finish_reason


def usage(chat: ChatRequest, event: _Finished) -> dict[str, int]:
    """The reply's ``usage`` (prompt, completion and total tokens)."""
    completion = len(event.token_ids)
    return {
        "prompt_tokens": len(chat.prompt_ids),
        "completion_tokens": completion,
        "total_tokens": len(chat.prompt_ids) + completion,
    }
