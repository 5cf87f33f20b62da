"""GRPO options on constructed groups: tie-break scores (from ``agl.TIE_BREAK_REWARD`` reward spans to advantages)
and the batch-level std, with hand-computed numbers."""

from __future__ import annotations

import math

import pytest

import agl
from agl.core.adapter import TIE_BREAK_REWARD, build_trajectory, check_capture, select_agents
from agl.core.types import ATTR_REWARD, Attempt, Rollout, Span, Trajectory, Transition
from agl.otel.mapping import root_span
from agl.trainers.rl.credit import assign_all
from agl.trainers.rl.grpo import GRPOConfig, grpo_advantages, informative_tasks
from tests.trajectories import finished

RO = Rollout(
    rollout_id="ro", task={"q": 1}, task_id="t", resources_version=1, created_at=0, status="succeeded", final_reward=0.0
)


def span(sequence: int, kind: str, name: str = "x", value: float | None = None) -> Span:
    attributes: dict[str, object] = (
        {"agl.prompt_token_ids": [1], "agl.response_token_ids": [2]} if kind == "llm" else {}
    )
    if value is not None:
        attributes[ATTR_REWARD] = value
    return Span.model_validate(
        {
            "rollout_id": "ro",
            "attempt_id": "at",
            "sequence": sequence,
            "kind": kind,
            "name": name,
            "attributes": attributes,
        }
    )


def rollout(rollout_id: str, final: float, tie_breaks: list[float | None], task_id: str = "t") -> Trajectory:
    steps = [
        Transition(span_id=f"{rollout_id}-{i}", agent="a", step=i, tie_break=tie) for i, tie in enumerate(tie_breaks)
    ]
    return finished(rollout_id, task_id, final, steps)


# ------------------------------------------------------------------------------------------ spans → transitions


def test_tie_break_spans_land_on_the_call_they_follow_and_never_on_its_reward() -> None:
    assert agl.TIE_BREAK_REWARD == TIE_BREAK_REWARD == "tie_break"
    spans = [
        span(1, "llm"),
        span(2, "reward", TIE_BREAK_REWARD, 0.4),
        span(3, "reward", "reward", 0.25),
        span(4, "llm"),
        span(5, "llm"),
        span(6, "reward", TIE_BREAK_REWARD, 0.5),
        span(7, "reward", TIE_BREAK_REWARD, 0.25),  # several on one call add up
    ]
    traj = build_trajectory(RO.model_copy(update={"final_reward": 1.0}), spans, select_agents(None))
    assert [t.tie_break for t in traj.transitions] == [0.4, None, 0.75]
    assert [t.reward for t in traj.transitions] == [0.25, 0.0, 0.0]
    assert traj.rewards == [0.25]
    assign_all([traj])
    assert [t.ret for t in traj.transitions] == [1.25, 1.0, 1.0]  # credit assignment never sees the tie-break
    early = build_trajectory(RO, [span(1, "reward", TIE_BREAK_REWARD, 0.3), span(2, "llm")], select_agents(None))
    assert early.transitions[0].tie_break == 0.3 and early.transitions[0].reward == 0.0  # placed as rewards are


def test_exported_rollout_lists_rewards_but_never_tie_break_scores() -> None:
    attempt = Attempt(attempt_id="at", rollout_id="ro", number=1, worker_id="w", started_at=0, heartbeat_at=0)
    spans = [span(1, "llm"), span(2, "reward", TIE_BREAK_REWARD, 0.4), span(3, "reward", "reward", 0.25)]
    root = root_span(RO, attempt, spans, None)
    assert root.attributes["agl.rewards"] == [0.25]
    alone = root_span(RO, attempt, spans[:2], None)
    assert "agl.rewards" not in alone.attributes


def test_tie_breaks_among_unnumbered_calls_are_a_capture_failure_like_rewards() -> None:
    spans = [span(1, "llm"), span(2, "reward", TIE_BREAK_REWARD, 0.5), span(3, "llm")]
    unnumbered = [s if s.kind != "llm" else s.model_copy(update={"sequence": 0}) for s in spans]
    failure = check_capture(build_trajectory(RO, unnumbered, select_agents(None)), unnumbered, False)
    assert failure is not None and "the tie-break scores cannot be placed" in failure.reason
    assert check_capture(build_trajectory(RO, spans, select_agents(None)), spans, False) is None
    one_call = unnumbered[:2]
    assert check_capture(build_trajectory(RO, one_call, select_agents(None)), one_call, False) is None


# ------------------------------------------------------------------------------------------ tie-break advantages


def test_tie_break_contributes_exactly_zero_to_a_group_whose_returns_differ() -> None:
    def group(ties: list[float | None]) -> list[Trajectory]:
        out = [
            rollout(f"r{i}", final, [tie])
            for i, (final, tie) in enumerate(zip([1.0, 0.0, 0.0, 1.0], ties, strict=True))
        ]
        assign_all(out)
        return out

    for config in (GRPOConfig(tie_break=True), GRPOConfig(tie_break=True, normalize_std=False)):
        scored, stats = grpo_advantages(group([0.9, 0.1, 0.8, 0.0]), config)
        reference, _ = grpo_advantages(group([None] * 4), GRPOConfig(normalize_std=config.normalize_std))
        assert [t.advantage for t in scored] == [t.advantage for t in reference]
        assert stats.tie_break_groups == 0 and stats.zero_variance_groups == 0


def test_a_flat_group_with_differing_tie_breaks_is_kept_and_one_with_equal_ones_skipped() -> None:
    rescued = [rollout(f"a{i}", 0.0, [tie], task_id="a") for i, tie in enumerate([0.5, 0.0, None, 1.0])]
    stuck = [rollout(f"b{i}", 1.0, [0.3], task_id="b") for i in range(3)]
    batch = rescued + stuck
    assign_all(batch)
    kept, stats = grpo_advantages(batch, GRPOConfig(tie_break=True, normalize_std=False))
    # scores 0.5, 0, 0 (missing), 1: mean 0.375
    assert [t.advantage for t in kept] == pytest.approx([0.125, -0.375, -0.375, 0.625])
    assert {t.span_id for t in kept} == {f"a{i}-0" for i in range(4)}
    assert all(t.advantage is None for tr in stuck for t in tr.transitions)
    assert (stats.groups, stats.skipped_groups, stats.tie_break_groups, stats.zero_variance_groups) == (2, 1, 1, 2)
    assert [t.ret for tr in batch for t in tr.transitions] == [0.0] * 4 + [1.0] * 3  # returns untouched
    assert informative_tasks(batch, GRPOConfig(tie_break=True)) == {"a": True, "b": False}
    # without the option both groups are flat and skipped, whatever their tie-break values
    for tr in batch:
        for t in tr.transitions:
            t.advantage = None
    kept, stats = grpo_advantages(batch, GRPOConfig())
    assert kept == [] and (stats.skipped_groups, stats.tie_break_groups) == (2, 0)
    assert informative_tasks(batch, GRPOConfig()) == {"a": False, "b": False}


def test_a_rescued_group_is_normalised_like_any_other() -> None:
    batch = [rollout(f"a{i}", 1.0, [tie]) for i, tie in enumerate([0.2, 0.4])]
    assign_all(batch)
    kept, _ = grpo_advantages(batch, GRPOConfig(tie_break=True, epsilon=0.0))
    # scores 1.2, 1.4: centred -0.1, 0.1; sample std sqrt(0.02)
    assert [t.advantage for t in kept] == pytest.approx([-0.1 / math.sqrt(0.02), 0.1 / math.sqrt(0.02)])


# ------------------------------------------------------------------------------------------ batch std


def test_batch_std_divides_every_group_by_one_std_of_all_centred_returns() -> None:
    batch = [
        *(rollout(f"a{i}", r, [None], task_id="a") for i, r in enumerate([1.0, 0.0])),
        *(rollout(f"b{i}", r, [None], task_id="b") for i, r in enumerate([1.0, 1.0, 1.0, 0.0])),
        *(rollout(f"c{i}", 1.0, [None], task_id="c") for i in range(2)),  # flat: skipped, not in the std
    ]
    assign_all(batch)
    kept, stats = grpo_advantages(batch, GRPOConfig(std_scope="batch", epsilon=0.0))
    # centred: a 0.5, -0.5; b 0.25, 0.25, 0.25, -0.75. Sum of squares 1.25 over n-1 = 5: std 0.5
    assert [t.advantage for t in kept] == pytest.approx([1.0, -1.0, 0.5, 0.5, 0.5, -1.5])
    assert stats.skipped_groups == 1
    # the group std instead: a's is sqrt(0.5), b's 0.5
    kept, _ = grpo_advantages(batch, GRPOConfig(epsilon=0.0))
    half = 0.5 / math.sqrt(0.5)
    assert [t.advantage for t in kept] == pytest.approx([half, -half, 0.5, 0.5, 0.5, -1.5])


def test_flat_groups_kept_with_zero_advantage_stay_out_of_the_batch_std() -> None:
    batch = [rollout(f"a{i}", r, [None], task_id="a") for i, r in enumerate([1.0, 0.0])]
    batch += [rollout(f"c{i}", 1.0, [None], task_id="c") for i in range(3)]
    assign_all(batch)
    kept, _ = grpo_advantages(batch, GRPOConfig(std_scope="batch", epsilon=0.0, skip_zero_variance=False))
    # only a's centred values 0.5, -0.5: sample std sqrt(0.5)
    assert [t.advantage for t in kept] == pytest.approx([0.5 / math.sqrt(0.5), -0.5 / math.sqrt(0.5), 0, 0, 0])


def test_std_scope_is_validated() -> None:
    with pytest.raises(ValueError, match="std_scope"):
        GRPOConfig(std_scope="rollout")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="normalize_std"):
        GRPOConfig(std_scope="batch", normalize_std=False)
