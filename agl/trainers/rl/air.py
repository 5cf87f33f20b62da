"""AIR (automatic intermediate rewards): rules that turn observed spans into small rewards; sparse tasks learn faster.

A rule is any callable ``rule(span) -> float | None`` (None = the rule does not apply to this span). ``AirRules``
sums the rules that fire. The core applies it when spans become trajectories: each value lands on the LLM call the
span followed (``Transition.reward``), where credit assignment picks it up. Pure functions, no I/O.

Example (reward tool calls that ran, punish failing ones, and reward an SQL query that executed a bit more)::

    rules = AirRules(rules=[tool_ok(0.1), tool_error(-0.1), tool_ok(0.2, tools=["execute_sql"])])
    LightningRL(LightningRLConfig(model_dir=..., air=rules))
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from agl.core.types import ATTR_OUTPUT_MESSAGES, ATTR_TOOL_NAME, Span

AirRule = Callable[[Span], float | None]

DEFAULT_TOOL_OK = 0.1
"""Default reward of ``tool_ok``: small next to a final reward in [0, 1], so it shapes but never dominates."""
DEFAULT_TOOL_ERROR = -0.1
"""Default reward of ``tool_error``: the mirror image of ``tool_ok``."""
DEFAULT_FORMAT_OK = 0.1
"""Default reward of ``format_ok``."""


def tool_name(span: Span) -> str:
    """The tool a ``tool`` span ran: its ``gen_ai.tool.name`` attribute, else the span name."""
    value = span.attributes.get(ATTR_TOOL_NAME)
    return str(value) if value else span.name


@dataclass(frozen=True)
class ToolOk:
    """``reward`` for a ``tool`` span that finished with status ok (only the named ``tools`` when given)."""

    reward: float = DEFAULT_TOOL_OK
    tools: frozenset[str] | None = None

    def __call__(self, span: Span) -> float | None:
        if span.kind != "tool" or span.status != "ok":
            return None
        if self.tools is not None and tool_name(span) not in self.tools:
            return None
        return self.reward


@dataclass(frozen=True)
class ToolError:
    """``reward`` (negative) for a ``tool`` span with status error, and for ``exception`` spans when ``exceptions``.

    ``tools`` restricts the tool spans it judges. A failing tool is punished once: the ``exception`` span an
    integration records under the failed tool's span is the same failure, and the adapter
    (``agl.core.adapter.build_trajectory``) does not show it to AIR. Other exception spans (an agent step that
    raised, ``emit_exception``) carry no tool name and are judged regardless of ``tools``.
    """

    reward: float = DEFAULT_TOOL_ERROR
    tools: frozenset[str] | None = None
    exceptions: bool = True

    def __call__(self, span: Span) -> float | None:
        if span.kind == "exception":
            return self.reward if self.exceptions else None
        if span.kind != "tool" or span.status != "error":
            return None
        if self.tools is not None and tool_name(span) not in self.tools:
            return None
        return self.reward


@dataclass(frozen=True)
class FormatOk:
    """``reward`` for an ``llm`` span whose response text matches ``pattern`` (``re.search``; anchor it for a full
    match), optionally only for the named ``agents``."""

    pattern: re.Pattern[str]
    reward: float = DEFAULT_FORMAT_OK
    agents: frozenset[str] | None = None

    def __call__(self, span: Span) -> float | None:
        if span.kind != "llm" or span.status != "ok":
            return None
        if self.agents is not None and span.agent not in self.agents:
            return None
        return self.reward if self.pattern.search(response_text(span)) else None


def response_text(span: Span) -> str:
    """The text content of an ``llm`` span's (last) response message; ``""`` when it has none."""
    messages = span.attributes.get(ATTR_OUTPUT_MESSAGES)
    if not isinstance(messages, list) or not messages or not isinstance(messages[-1], dict):
        return ""
    content = messages[-1].get("content")
    return content if isinstance(content, str) else ""


def _names(values: Sequence[str] | None) -> frozenset[str] | None:
    return frozenset(values) if values is not None else None


def tool_ok(reward: float = DEFAULT_TOOL_OK, tools: Sequence[str] | None = None) -> ToolOk:
    """A tool call that ran without error earns ``reward``. ``tools=["execute_sql"]`` makes it "an SQL query ran"."""
    return ToolOk(reward, _names(tools))


def tool_error(
    reward: float = DEFAULT_TOOL_ERROR, tools: Sequence[str] | None = None, *, exceptions: bool = True
) -> ToolError:
    """A tool call that failed (or, with ``exceptions``, an exception recorded outside a failed tool call) earns
    ``reward`` (negative); a failing tool is punished once, not once for its span and again for its exception."""
    return ToolError(reward, _names(tools), exceptions)


def format_ok(pattern: str, reward: float = DEFAULT_FORMAT_OK, agents: Sequence[str] | None = None) -> FormatOk:
    """An LLM response whose text matches the regular expression ``pattern`` earns ``reward``."""
    try:
        compiled = re.compile(pattern)
    except re.error as exc:
        raise ValueError(f"format_ok: {pattern!r} is not a valid regular expression ({exc})") from exc
    return FormatOk(compiled, reward, _names(agents))


@dataclass
class AirRules:
    """A set of AIR rules plus an optional user hook; the reward of a span is the sum of those that fire.

    Args:
        rules: built-in or custom rules (callables ``span -> float | None``). Empty by default: AIR is off and the
            rewards are exactly what the agent emitted. ``AirRules.defaults()`` gives ``tool_ok`` + ``tool_error``.
        air_rule: a user hook with the same signature, applied after the rules (e.g. parse a tool's output).

    Returns None when no rule fired, so spans that no rule is about add no reward entry to the trajectory.
    """

    rules: list[AirRule] = field(default_factory=list)
    air_rule: AirRule | None = None

    @classmethod
    def defaults(cls) -> AirRules:
        """``tool_ok(+0.1)`` and ``tool_error(-0.1)``: reward tool calls that ran, punish failed ones and exceptions."""
        return cls(rules=[tool_ok(), tool_error()])

    def __call__(self, span: Span) -> float | None:
        total: float | None = None
        for rule in [*self.rules, *([self.air_rule] if self.air_rule is not None else [])]:
            value = rule(span)
            if value is not None:
                total = (total or 0.0) + float(value)
        return total
