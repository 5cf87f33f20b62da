"""Spans → trajectories: call order, agent selection, reward attribution, capture failures."""

from __future__ import annotations

from typing import Literal

import pytest

from agl.core.adapter import build_trajectory, check_capture, select_agents
from agl.core.types import Rollout, Span

RO = Rollout(
    rollout_id="ro",
    task={"q": 1},
    task_id="t1",
    resources_version=1,
    created_at=0,
    status="succeeded",
    final_reward=1.0,
)


def llm(t: float, agent: str | None, ids: bool = True, status: Literal["ok", "error"] = "ok") -> Span:
    attrs = {"agl.prompt_token_ids": [1, 2], "agl.response_token_ids": [int(t)], "agl.response_logprobs": [-0.1]}
    return Span(
        rollout_id="ro",
        attempt_id="at",
        kind="llm",
        name="chat",
        agent=agent,
        start_time=t,
        end_time=t + 0.5,
        status=status,
        attributes=attrs if ids else {},
    )


def reward(t: float, value: float) -> Span:
    return Span(
        rollout_id="ro", attempt_id="at", kind="reward", name="r", start_time=t, attributes={"agl.reward": value}
    )


def test_transitions_follow_call_order_and_selection() -> None:
    spans = [llm(3, "checker"), llm(1, "writer"), llm(5, "rewriter"), llm(7, "writer", status="error")]
    traj = build_trajectory(RO, spans, select_agents(["writer", "rewriter"]))
    assert [(t.agent, t.response_ids) for t in traj.transitions] == [("writer", [1]), ("rewriter", [5])]
    assert [t.step for t in traj.transitions] == [0, 1]
    assert traj.final_reward == 1.0 and traj.task_id == "t1"


def test_regex_selection_matches_whole_name() -> None:
    sel = select_agents("writer|rewriter")
    assert sel("writer") and sel("rewriter") and not sel("writer2") and not sel(None)
    assert select_agents(None)(None)
    with pytest.raises(ValueError, match="regular expression"):
        select_agents("(")


def test_rewards_attach_to_the_call_they_follow() -> None:
    spans = [
        reward(0.5, 0.1),
        llm(1, "a"),
        reward(2, 0.2),
        reward(2.5, 0.3),
        llm(3, "b"),
        llm(4, "a"),
        reward(4.6, 1.0),
    ]
    traj = build_trajectory(RO, spans, select_agents(["a"]))
    assert [t.reward for t in traj.transitions] == pytest.approx([0.1 + 0.2 + 0.3, 1.0])
    assert traj.rewards == [0.1, 0.2, 0.3, 1.0]


def test_capture_failures() -> None:
    no_llm = build_trajectory(RO, [reward(1, 1.0)], select_agents(None))
    assert "no LLM call was captured" in check_capture(no_llm, [reward(1, 1.0)], False).reason  # type: ignore[union-attr]
    spans = [llm(1, "a", ids=False)]
    traj = build_trajectory(RO, spans, select_agents(None))
    assert check_capture(traj, spans, require_token_ids=False) is None
    assert "no token ids" in check_capture(traj, spans, require_token_ids=True).reason  # type: ignore[union-attr]
    other = build_trajectory(RO, [llm(1, "x")], select_agents(["a"]))
    assert "selected agents" in check_capture(other, [llm(1, "x")], False).reason  # type: ignore[union-attr]
    failed = build_trajectory(RO.model_copy(update={"status": "failed"}), [], select_agents(None))
    assert check_capture(failed, [], True) is None


def test_air_rules_add_rewards_at_the_span_end() -> None:
    tool_ok = Span(rollout_id="ro", attempt_id="at", kind="tool", name="run_sql", start_time=1.2, end_time=1.4)
    tool_bad = Span(
        rollout_id="ro", attempt_id="at", kind="tool", name="run_sql", start_time=3.2, end_time=3.4, status="error"
    )

    def air(span: Span) -> float | None:
        if span.kind != "tool":
            return None
        return 0.1 if span.status == "ok" else -0.1

    traj = build_trajectory(RO, [llm(1, "a"), tool_ok, llm(3, "a"), tool_bad], select_agents(None), air=air)
    assert [t.reward for t in traj.transitions] == pytest.approx([0.1, -0.1])
