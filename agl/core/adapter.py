"""Spans → Trajectories: one Transition per LLM call of the selected agents, rewards attached where they landed.

Pure functions over data already fetched from the store; no I/O. Capture problems (nothing recorded, calls without
token ids) are returned as ``CaptureFailure`` values so the caller decides whether they are errors.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from agl.core.types import (
    ATTR_INPUT_MESSAGES,
    ATTR_LOGPROBS,
    ATTR_OUTPUT_MESSAGES,
    ATTR_PROMPT_IDS,
    ATTR_RESPONSE_IDS,
    ATTR_REWARD,
    ATTR_WEIGHTS_VERSION,
    Rollout,
    Span,
    Trajectory,
    Transition,
)

AgentSelector = Callable[[str | None], bool]
#: Automatic intermediate rewards: a reward for a span (a tool call that ran, a query that executed), or None.
AirFn = Callable[[Span], float | None]


def _with_parents(name: str) -> list[str]:
    """An agent name and the names of the agents it is nested in: ``"a/b/c"`` → ``["a/b/c", "a/b", "a"]``."""
    parts = name.split("/")
    return ["/".join(parts[:i]) for i in range(len(parts), 0, -1)]


def select_agents(agents: str | Sequence[str] | None) -> AgentSelector:
    """Which agents' LLM calls become transitions: None = all; a list = those names; a string = a regex (full match).

    Names are paths for nested agents (``"solver/critic"``: node ``critic`` of subgraph ``solver``); selecting an
    agent selects everything nested in it, so ``["solver"]`` (or the regex ``"solver"``) takes all of ``solver/*``.

    >>> select_agents("sql_(writer|rewriter)")("sql_writer")
    True
    >>> select_agents(["solver"])("solver/critic")
    True
    """
    if agents is None:
        return lambda name: True
    if isinstance(agents, str):
        try:
            pattern = re.compile(agents)
        except re.error as exc:
            raise ValueError(f"agents: {agents!r} is not a valid regular expression ({exc})") from exc
        return lambda name: name is not None and any(pattern.fullmatch(n) for n in _with_parents(name))
    names = set(agents)
    if not all(isinstance(n, str) for n in names):
        raise ValueError(f"agents: expected names (str), got {sorted(map(repr, names))}")
    return lambda name: name is not None and any(n in names for n in _with_parents(name))


@dataclass(frozen=True)
class CaptureFailure:
    """A finished rollout whose recording cannot be trained or evaluated as the user expects."""

    rollout_id: str
    reason: str

    def __str__(self) -> str:
        return f"{self.rollout_id}: {self.reason}"


def _transition(span: Span, step: int) -> Transition:
    a = span.attributes
    out = a.get(ATTR_OUTPUT_MESSAGES) or [{}]
    return Transition(
        span_id=span.span_id,
        agent=span.agent,
        step=step,
        prompt_ids=list(a.get(ATTR_PROMPT_IDS) or []),
        response_ids=list(a.get(ATTR_RESPONSE_IDS) or []),
        response_logprobs=[float(x) for x in a.get(ATTR_LOGPROBS) or []],
        weights_version=a.get(ATTR_WEIGHTS_VERSION),
        request_messages=list(a.get(ATTR_INPUT_MESSAGES) or []),
        response_message=dict(out[-1]) if isinstance(out, list) and out else {},
    )


def _rewards(ordered: Sequence[Span], air: AirFn | None) -> list[tuple[float, float]]:
    """(time, value) of every intermediate reward: emitted ``reward`` spans, plus AIR's verdict on other spans."""
    out: list[tuple[float, float]] = []
    for s in ordered:
        if s.kind == "reward":
            out.append((s.start_time, float(s.attributes.get(ATTR_REWARD, 0.0))))
        elif air is not None:
            value = air(s)
            if value is not None:
                out.append((s.end_time if s.end_time is not None else s.start_time, float(value)))
    out.sort(key=lambda tv: tv[0])
    return out


def build_trajectory(
    rollout: Rollout,
    spans: Sequence[Span],
    selector: AgentSelector,
    attempt_id: str | None = None,
    air: AirFn | None = None,
) -> Trajectory:
    """Turn the spans of one attempt into a Trajectory.

    Transitions are the successful ``llm`` spans of selected agents in call order (start time). Each intermediate
    reward (emitted, or derived from a span by the ``air`` rules at the span's end) attaches to the last selected
    transition that started before it (to the first one if it came earlier).
    """
    ordered = sorted(spans, key=lambda s: (s.start_time, s.sequence))
    calls = [s for s in ordered if s.kind == "llm" and s.status == "ok" and selector(s.agent)]
    transitions = [_transition(s, i) for i, s in enumerate(calls)]
    rewards: list[float] = []
    for at, value in _rewards(ordered, air):
        rewards.append(value)
        if not transitions:
            continue
        target = 0
        for i, call in enumerate(calls):
            if call.start_time <= at:
                target = i
        transitions[target].reward += value
    return Trajectory(
        rollout_id=rollout.rollout_id,
        attempt_id=attempt_id,
        task_id=rollout.task_id,
        task=rollout.task,
        mode=rollout.mode,
        resources_version=rollout.resources_version,
        status=rollout.status,
        final_reward=rollout.final_reward,
        transitions=transitions,
        rewards=rewards,
        error=rollout.error,
        metadata=rollout.metadata,
    )


def check_capture(trajectory: Trajectory, spans: Sequence[Span], require_token_ids: bool) -> CaptureFailure | None:
    """Why a succeeded rollout's recording is unusable, or None when it is fine."""
    if trajectory.status != "succeeded":
        return None
    llm = [s for s in spans if s.kind == "llm"]
    if not llm:
        return CaptureFailure(
            trajectory.rollout_id,
            "the rollout succeeded but no LLM call was captured: the agent must call the model through the base_url "
            "of the LLM resource it was handed (agl's gateway)",
        )
    if not trajectory.transitions:
        seen = sorted({s.agent or "<unnamed>" for s in llm})
        return CaptureFailure(
            trajectory.rollout_id, f"none of the {len(llm)} LLM calls came from the selected agents (seen: {seen})"
        )
    if require_token_ids:
        missing = [t.step for t in trajectory.transitions if not t.has_token_ids]
        if missing:
            return CaptureFailure(
                trajectory.rollout_id,
                f"{len(missing)} of {len(trajectory.transitions)} selected LLM calls have no token ids (steps "
                f"{missing[:5]}): the backend must return them (vLLM or agl.serving with return_token_ids)",
            )
    return None
