"""Failed rollouts as text for the optimizer: the task, each LLM call's new messages (tool results included) and
response, the error and the reward. Pure functions over ``Trajectory``.

Agents usually resend the whole conversation on every call, so each call shows only the messages that the previous
call's request did not already contain; long failures are cut in the middle to a character budget.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from agl.core.types import Trajectory


def _content(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, list):
        content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
    text = str(content) if content is not None else ""
    calls = message.get("tool_calls")
    if calls:
        rendered = [
            f"{(c.get('function') or {}).get('name', '?')}({(c.get('function') or {}).get('arguments', '')})"
            for c in calls
            if isinstance(c, dict)
        ]
        text = (text + "\n" if text else "") + "tool calls: " + "; ".join(rendered)
    return text


def _message_line(message: dict[str, Any]) -> str:
    role = message.get("role", "?")
    name = message.get("name") or message.get("tool_call_id")
    label = f"{role}:{name}" if role == "tool" and name else str(role)
    return f"  [{label}] {_content(message)}"


def shorten(text: str, limit: int) -> str:
    """``text`` cut in the middle to at most about ``limit`` characters, saying how much was cut."""
    if len(text) <= limit:
        return text
    keep = max(limit - 40, 2)
    head, tail = text[: keep // 2], text[len(text) - keep // 2 :]
    return f"{head}\n  …[{len(text) - 2 * (keep // 2)} characters cut]…\n{tail}"


def render_rollout(trajectory: Trajectory, reward: float, limit: int) -> str:
    """One rollout as text (see the module docstring)."""
    lines = [f"Task: {json.dumps(trajectory.task, default=str, ensure_ascii=False)}"]
    previous: list[dict[str, Any]] = []
    for i, t in enumerate(trajectory.transitions, 1):
        request = list(t.request_messages)
        new = request[len(previous) :] if request[: len(previous)] == previous else request
        if previous and new and new[0].get("role") == "assistant":
            new = new[1:]
        lines.append(f"LLM call {i}" + (f" (agent {t.agent})" if t.agent else "") + ":")
        lines.extend(_message_line(m) for m in new)
        response = _message_line(t.response_message).strip() if t.response_message else "(none)"
        lines.append(f"  → response {response}")
        previous = request
    if not trajectory.transitions:
        lines.append("(no LLM call was recorded)")
    if trajectory.error:
        lines.append(f"Error: {trajectory.error}")
    lines.append(f"Reward: {reward:g}")
    return shorten("\n".join(lines), limit)


def render_failures(failures: Sequence[tuple[Trajectory, float]], limit_each: int) -> str:
    """Numbered failures, each rendered by ``render_rollout``."""
    return "\n\n".join(
        f"### Failure {i}\n{render_rollout(traj, reward, limit_each)}" for i, (traj, reward) in enumerate(failures, 1)
    )
