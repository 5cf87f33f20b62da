"""Chat formatting for the local policy server: OpenAI messages in, template-ready messages out, tool calls parsed back.

Pure functions and one small stateful helper (:class:`StreamingContent`, owned by one request); no torch, no I/O, no
shared state, so everything here is safe to call from any thread.

Tools. When the tokenizer's chat template understands ``tools`` (it mentions the variable), messages are passed
through in the Hugging Face convention and the template renders the tools itself. Otherwise (SmolLM2's ChatML template,
for one) the documented fallback applies:

* the tool JSON schemas are rendered into the system message (appended to an existing one, or a new one first) with an
  instruction to answer with ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks;
* assistant messages that carry ``tool_calls`` are rendered as their content followed by such blocks;
* ``tool`` messages become a ``user`` turn holding ``<tool_response>{"name": ..., "content": ...}</tool_response>``
  blocks (consecutive tool messages share one turn), text any model can read.

Either way the model's output is searched for ``<tool_call>`` blocks (:func:`parse_tool_calls`), the format the
fallback asks for and the one Hermes/Qwen-style native templates use.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from agl.core.jsonsafe import parsed_or_text

TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"

_TOOL_CALL_RE = re.compile(r"<tool_call>(.*?)(?:</tool_call>|\Z)", re.DOTALL)
_ROLES = ("system", "developer", "user", "assistant", "tool")


class RequestError(ValueError):
    """A client mistake in a request; ``field`` names the offending field (``messages[1].content``)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


@dataclass(frozen=True)
class ParsedOutput:
    """The assistant output split into visible text and OpenAI-shaped ``tool_calls`` (empty when none)."""

    content: str | None
    tool_calls: list[dict[str, Any]] = field(default_factory=list)


def template_supports_tools(chat_template: str | None) -> bool:
    """Whether a Jinja chat template renders a ``tools`` argument itself (the usual Hugging Face heuristic)."""
    return bool(chat_template) and re.search(r"\btools\b", chat_template or "") is not None


def normalize_content(content: Any, field_name: str) -> str:
    """Turn an OpenAI message ``content`` (string, ``None`` or a list of text parts) into one string."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts: list[str] = []
        for i, part in enumerate(content):
            if not isinstance(part, Mapping) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise RequestError(
                    f"{field_name}[{i}]", "only text parts ({'type': 'text', 'text': ...}) are supported"
                )
            texts.append(part["text"])
        return "".join(texts)
    raise RequestError(field_name, "must be a string, null or a list of text parts")


def validate_tools(tools: Any) -> list[dict[str, Any]]:
    """Check an OpenAI ``tools`` list (function tools only) and return it as plain dicts."""
    if tools is None:
        return []
    if not isinstance(tools, list):
        raise RequestError("tools", "must be a list of function tools")
    checked: list[dict[str, Any]] = []
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        if not isinstance(tool, Mapping) or tool.get("type", "function") != "function":
            raise RequestError(where, "must be {'type': 'function', 'function': {...}}")
        function = tool.get("function")
        if not isinstance(function, Mapping) or not isinstance(function.get("name"), str) or not function["name"]:
            raise RequestError(f"{where}.function.name", "must be a non-empty string")
        parameters = function.get("parameters")
        if parameters is not None and not isinstance(parameters, Mapping):
            raise RequestError(f"{where}.function.parameters", "must be a JSON schema object")
        checked.append({"type": "function", "function": dict(function)})
    return checked


def validate_tool_choice(tool_choice: Any, tools: Sequence[Mapping[str, Any]]) -> str | dict[str, Any]:
    """Check ``tool_choice`` ("none" | "auto" | "required" | a named function) against the tools given."""
    if tool_choice is None:
        return "auto"
    if isinstance(tool_choice, str):
        if tool_choice not in ("none", "auto", "required"):
            raise RequestError("tool_choice", "must be 'none', 'auto', 'required' or a named function")
        if tool_choice == "required" and not tools:
            raise RequestError("tool_choice", "'required' needs a non-empty tools list")
        return tool_choice
    if isinstance(tool_choice, Mapping):
        function = tool_choice.get("function")
        name = function.get("name") if isinstance(function, Mapping) else None
        if not isinstance(name, str):
            raise RequestError("tool_choice.function.name", "must be a string")
        if name not in {t["function"]["name"] for t in tools}:
            raise RequestError("tool_choice.function.name", f"no tool named {name!r} in tools")
        return {"type": "function", "function": {"name": name}}
    raise RequestError("tool_choice", "must be a string or {'type': 'function', 'function': {'name': ...}}")


def render_tools_prompt(tools: Sequence[Mapping[str, Any]], tool_choice: str | Mapping[str, Any] = "auto") -> str:
    """The fallback system-prompt text describing ``tools`` and the ``<tool_call>`` answer format."""
    schemas = "\n".join(json.dumps(dict(tool), ensure_ascii=False, sort_keys=True) for tool in tools)
    lines = [
        "# Tools",
        "",
        "You may call one or more functions to assist with the user query.",
        "",
        "You are provided with function signatures within <tools></tools> XML tags:",
        "<tools>",
        schemas,
        "</tools>",
        "",
        "For each function call, return a json object with function name and arguments within "
        "<tool_call></tool_call> XML tags:",
        "<tool_call>",
        '{"name": <function-name>, "arguments": <args-json-object>}',
        "</tool_call>",
    ]
    if tool_choice == "required":
        lines += ["", "You must call at least one function."]
    elif isinstance(tool_choice, Mapping):
        lines += ["", f"You must call the function {tool_choice['function']['name']!r}."]
    return "\n".join(lines)


def _validated_tool_calls(raw: Any, where: str) -> list[dict[str, Any]]:
    if not isinstance(raw, list):
        raise RequestError(where, "must be a list")
    calls: list[dict[str, Any]] = []
    for j, call in enumerate(raw):
        function = call.get("function") if isinstance(call, Mapping) else None
        if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
            raise RequestError(f"{where}[{j}].function.name", "must be a string")
        calls.append(
            {
                "id": str(call.get("id") or ""),
                "name": function["name"],
                "arguments": parsed_or_text(function.get("arguments", {})),
            }
        )
    return calls


def format_tool_call(name: str, arguments: Any) -> str:
    """One ``<tool_call>`` block as the fallback format writes it."""
    payload = json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)
    return f"{TOOL_CALL_OPEN}\n{payload}\n{TOOL_CALL_CLOSE}"


def prepare_messages(
    messages: Any,
    *,
    tools: Sequence[Mapping[str, Any]] = (),
    tool_choice: str | Mapping[str, Any] = "auto",
    native_tools: bool = False,
) -> list[dict[str, Any]]:
    """Validate OpenAI chat ``messages`` and return the list to hand to ``apply_chat_template``.

    With ``native_tools`` the template renders tools itself: messages keep their roles, assistant ``tool_calls`` get
    dict arguments (the Hugging Face convention) and ``tools`` are passed separately by the caller. Without it the
    fallback described in the module docstring is applied. ``tool_choice == "none"`` hides the tools from the model.
    """
    if not isinstance(messages, list) or not messages:
        raise RequestError("messages", "must be a non-empty list")
    active_tools = [] if tool_choice == "none" else list(tools)
    names_by_id: dict[str, str] = {}
    out: list[dict[str, Any]] = []
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, Mapping):
            raise RequestError(where, "must be an object with 'role' and 'content'")
        role = message.get("role")
        if role not in _ROLES:
            raise RequestError(f"{where}.role", f"must be one of {', '.join(_ROLES)}")
        content = normalize_content(message.get("content"), f"{where}.content")
        if role == "developer":
            role = "system"
        if role == "assistant" and message.get("tool_calls"):
            calls = _validated_tool_calls(message["tool_calls"], f"{where}.tool_calls")
            names_by_id.update({c["id"]: c["name"] for c in calls if c["id"]})
            if native_tools:
                out.append(
                    {
                        "role": "assistant",
                        "content": content,
                        "tool_calls": [
                            {
                                "id": c["id"],
                                "type": "function",
                                "function": {"name": c["name"], "arguments": c["arguments"]},
                            }
                            for c in calls
                        ],
                    }
                )
            else:
                blocks = "\n".join(format_tool_call(c["name"], c["arguments"]) for c in calls)
                out.append({"role": "assistant", "content": f"{content}\n{blocks}" if content else blocks})
            continue
        if role == "tool":
            call_id = message.get("tool_call_id")
            name = message.get("name") or (names_by_id.get(call_id) if isinstance(call_id, str) else None)
            if native_tools:
                entry: dict[str, Any] = {"role": "tool", "content": content}
                if call_id is not None:
                    entry["tool_call_id"] = call_id
                if name:
                    entry["name"] = name
                out.append(entry)
                continue
            payload = json.dumps(
                {"name": name, "content": content} if name else {"content": content}, ensure_ascii=False
            )
            block = f"<tool_response>\n{payload}\n</tool_response>"
            if out and out[-1].get("_tool_turn"):
                out[-1]["content"] += f"\n{block}"
            else:
                out.append({"role": "user", "content": block, "_tool_turn": True})
            continue
        out.append({"role": role, "content": content})
    for entry in out:
        entry.pop("_tool_turn", None)
    if active_tools and not native_tools:
        tools_text = render_tools_prompt(active_tools, tool_choice)
        if out[0]["role"] == "system":
            out[0] = {
                "role": "system",
                "content": f"{out[0]['content']}\n\n{tools_text}" if out[0]["content"] else tools_text,
            }
        else:
            out.insert(0, {"role": "system", "content": tools_text})
    return out


def _new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def parse_tool_calls(text: str) -> ParsedOutput:
    """Split model output into content and OpenAI ``tool_calls`` from its ``<tool_call>{...}</tool_call>`` blocks.

    A block must hold a JSON object with a string ``name``; ``arguments`` (an object, or a JSON string) becomes the
    JSON-string ``function.arguments`` OpenAI clients expect. A final block missing its closing tag (the model stopped
    right after the JSON) still counts. Blocks that do not parse are left in the content untouched, so nothing the
    model wrote is lost. The remaining content is stripped; ``None`` when nothing remains.
    """
    calls: list[dict[str, Any]] = []
    kept: list[str] = []
    position = 0
    for match in _TOOL_CALL_RE.finditer(text):
        call = _parse_block(match.group(1))
        if call is None:
            continue
        kept.append(text[position : match.start()])
        position = match.end()
        calls.append(call)
    kept.append(text[position:])
    content = "".join(kept).strip()
    return ParsedOutput(content=content or None, tool_calls=calls)


def _parse_block(body: str) -> dict[str, Any] | None:
    try:
        payload = json.loads(body.strip())
    except json.JSONDecodeError:
        return None
    if not isinstance(payload, dict) or not isinstance(payload.get("name"), str) or not payload["name"]:
        return None
    arguments = payload.get("arguments", payload.get("parameters", {}))
    if isinstance(arguments, str):
        arguments = parsed_or_text(arguments)
    return {
        "id": _new_call_id(),
        "type": "function",
        "function": {"name": payload["name"], "arguments": json.dumps(arguments, ensure_ascii=False)},
    }


def first_stop(text: str, stop: Sequence[str]) -> int | None:
    """Index of the earliest occurrence of any stop string in ``text``, or ``None``."""
    found = [i for i in (text.find(s) for s in stop) if i != -1]
    return min(found) if found else None


def releasable_length(text: str, holdback: Sequence[str]) -> int:
    """Length of the prefix of ``text`` that can be streamed without ever having to be taken back.

    Excludes everything from the first complete ``holdback`` marker on, a trailing part that could still grow into a
    marker, and trailing U+FFFD characters (an incomplete UTF-8 sequence the next token may complete).
    """
    cut = len(text)
    for marker in holdback:
        index = text.find(marker)
        if index != -1:
            cut = min(cut, index)
        for k in range(min(len(marker) - 1, len(text)), 0, -1):
            if text.endswith(marker[:k]):
                cut = min(cut, len(text) - k)
                break
    while cut > 0 and text[cut - 1] == "\ufffd":
        cut -= 1
    return cut


class StreamingContent:
    """Turns the growing decoded text of one streamed response into ``delta.content`` pieces.

    Guarantees that the pieces concatenate to exactly the content of the equivalent non-streamed response: text that
    may still become a stop string is held back, and in tool mode everything from ``<tool_call>`` on is held back and
    outer whitespace is released only once followed by more text (non-streamed tool-mode content is stripped).
    """

    def __init__(self, stop: Sequence[str], tool_mode: bool) -> None:
        self._holdback = [*stop, TOOL_CALL_OPEN] if tool_mode else list(stop)
        self._tool_mode = tool_mode
        self._released = ""

    def update(self, text: str) -> str:
        """Feed the full text decoded so far; return the newly releasable piece (possibly empty)."""
        stable = text[: releasable_length(text, self._holdback)]
        if self._tool_mode:
            stable = stable.strip()
        if len(stable) <= len(self._released) or not stable.startswith(self._released):
            return ""
        delta = stable[len(self._released) :]
        self._released = stable
        return delta
