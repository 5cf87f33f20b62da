"""Credit assignment, AIR rules and GRPO advantages, with hand-computed numbers."""

from __future__ import annotations

import math
from typing import Any

import pytest

from agl.core.adapter import build_trajectory, select_agents
from agl.core.types import ATTR_OUTPUT_MESSAGES, ATTR_REWARD, Rollout, Span, Trajectory, Transition
from agl.trainers.rl.air import AirRules, format_ok, tool_error, tool_ok
from agl.trainers.rl.credit import assign_all, assign_returns
from agl.trainers.rl.grpo import GRPOConfig, grpo_advantages
from tests.trajectories import finished


def traj(final: float | None, rewards: list[float], task_id: str | None = "t", rollout_id: str = "ro") -> Trajectory:
    steps = [Transition(span_id=f"{rollout_id}-{i}", agent="a", step=i, reward=r) for i, r in enumerate(rewards)]
    return finished(rollout_id, task_id, final, steps, rewards=[r for r in rewards if r])


# ------------------------------------------------------------------------------------------------------- credit


def test_broadcast_adds_final_reward_to_each_steps_own_reward() -> None:
    t = traj(1.0, [0.0, 0.5, -0.25])
    assert assign_returns(t, "broadcast") == [1.0, 1.5, 0.75]
    assert [s.ret for s in t.transitions] == [1.0, 1.5, 0.75]


def test_discounted_accumulates_backwards_with_final_reward_at_last_step() -> None:
    t = traj(1.0, [0.0, 0.5, -0.25])
    # ret_2 = -0.25 + 1 = 0.75; ret_1 = 0.5 + 0.5 * 0.75 = 0.875; ret_0 = 0 + 0.5 * 0.875 = 0.4375
    assert assign_returns(t, "discounted", gamma=0.5) == pytest.approx([0.4375, 0.875, 0.75])
    # gamma = 1: final reward plus every intermediate reward from the step onwards
    assert assign_returns(traj(1.0, [0.1, 0.2, 0.3]), "discounted", gamma=1.0) == pytest.approx([1.6, 1.5, 1.3])


def test_per_step_ignores_final_reward_and_missing_final_counts_zero() -> None:
    assert assign_returns(traj(1.0, [0.2, 0.0]), "per_step") == [0.2, 0.0]
    assert assign_returns(traj(None, [0.2, 0.0]), "broadcast") == [0.2, 0.0]
    assert assign_returns(traj(1.0, []), "discounted") == []


def test_credit_rejects_bad_mode_and_gamma() -> None:
    with pytest.raises(ValueError, match="credit mode"):
        assign_returns(traj(1.0, [0.0]), "sum")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="gamma"):
        assign_returns(traj(1.0, [0.0]), "discounted", gamma=1.5)


# ------------------------------------------------------------------------------------------------------- GRPO


def test_grpo_single_call_groups_match_textbook_grpo() -> None:
    group = [traj(r, [0.0], rollout_id=f"r{i}") for i, r in enumerate([1.0, 0.0, 0.0, 1.0])]
    other = [traj(r, [0.0], task_id="u", rollout_id=f"u{i}") for i, r in enumerate([0.0, 3.0])]
    assign_all(group + other)
    kept, stats = grpo_advantages(group + other, GRPOConfig(epsilon=0.0))
    # task t: mean 0.5, sample std sqrt(1/3); task u: mean 1.5, sample std sqrt(4.5)
    s = math.sqrt(1 / 3)
    assert [k.advantage for k in kept] == pytest.approx(
        [0.5 / s, -0.5 / s, -0.5 / s, 0.5 / s, -1.5 / math.sqrt(4.5), 1.5 / math.sqrt(4.5)]
    )
    assert (stats.groups, stats.skipped_groups, stats.kept_transitions) == (2, 0, 6)


def test_grpo_without_std_normalisation_is_return_minus_group_mean() -> None:
    group = [traj(r, [0.0], rollout_id=f"r{i}") for i, r in enumerate([2.0, 0.0, 1.0])]
    assign_all(group)
    kept, _ = grpo_advantages(group, GRPOConfig(normalize_std=False))
    assert [k.advantage for k in kept] == pytest.approx([1.0, -1.0, 0.0])


def test_grpo_pools_all_steps_of_the_group() -> None:
    a, b = traj(1.0, [0.0, 0.0], rollout_id="a"), traj(0.0, [0.0], rollout_id="b")
    assign_all([a, b])
    kept, _ = grpo_advantages([a, b], GRPOConfig(normalize_std=False))
    # returns 1, 1, 0 -> mean 2/3
    assert [k.advantage for k in kept] == pytest.approx([1 / 3, 1 / 3, -2 / 3])


def test_grpo_zero_variance_groups_are_skipped_or_zeroed() -> None:
    flat = [traj(1.0, [0.0], task_id="flat", rollout_id=f"f{i}") for i in range(3)]
    live = [traj(r, [0.0], task_id="live", rollout_id=f"l{i}") for i, r in enumerate([1.0, 0.0])]
    lonely = [traj(1.0, [0.0], task_id=None, rollout_id="alone")]
    everything = flat + live + lonely
    assign_all(everything)
    kept, stats = grpo_advantages(everything, GRPOConfig(skip_zero_variance=True))
    assert [k.span_id for k in kept] == ["l0-0", "l1-0"]
    assert (stats.groups, stats.skipped_groups, stats.transitions) == (3, 2, 6)
    assert all(t.advantage is None for t in flat[0].transitions)
    kept, stats = grpo_advantages(everything, GRPOConfig(skip_zero_variance=False))
    assert len(kept) == 6 and stats.skipped_groups == 0
    assert [t.transitions[0].advantage for t in flat + lonely] == [0.0, 0.0, 0.0, 0.0]


def _calls(rollout_id: str, task_id: str, calls: list[tuple[str, float]]) -> Trajectory:
    """A rollout whose transitions are made by the named agents and already carry their returns."""
    steps = [
        Transition(span_id=f"{rollout_id}-{agent}{i}", agent=agent, step=i, ret=ret)
        for i, (agent, ret) in enumerate(calls)
    ]
    return finished(rollout_id, task_id, None, steps)


def _two_agent_group() -> list[Trajectory]:
    """Task t: rollout A calls writer, checker, writer; rollout B calls checker, then writer. Task u: one writer call.

    B's writer call is its 2nd call but its writer's 1st: grouping by step index would put it apart from A's 1st.
    """
    return [
        _calls("A", "t", [("writer", 1.0), ("checker", 0.5), ("writer", 0.0)]),
        _calls("B", "t", [("checker", 0.5), ("writer", 0.0)]),
        _calls("C", "u", [("writer", 5.0)]),
    ]


def test_grpo_group_by_task_pools_every_agent_and_call() -> None:
    kept, stats = grpo_advantages(_two_agent_group(), GRPOConfig(normalize_std=False))
    # task t: returns 1, .5, 0, 0, .5 -> mean .4; task u is a lone transition (zero variance, skipped)
    assert [(k.span_id, k.advantage) for k in kept] == [
        ("A-writer0", pytest.approx(0.6)),
        ("A-checker1", pytest.approx(0.1)),
        ("A-writer2", pytest.approx(-0.4)),
        ("B-checker0", pytest.approx(0.1)),
        ("B-writer1", pytest.approx(-0.4)),
    ]
    assert (stats.groups, stats.skipped_groups, stats.zero_variance_groups) == (2, 1, 1)


def test_grpo_group_by_task_agent_compares_each_agent_only_with_itself() -> None:
    trajectories = _two_agent_group()
    kept, stats = grpo_advantages(trajectories, GRPOConfig(normalize_std=False, group_by="task_agent"))
    # writers of t: 1, 0, 0 -> mean 1/3; checkers of t: .5, .5 -> zero variance, skipped; u's writer alone
    assert [(k.span_id, k.advantage) for k in kept] == [
        ("A-writer0", pytest.approx(2 / 3)),
        ("A-writer2", pytest.approx(-1 / 3)),
        ("B-writer1", pytest.approx(-1 / 3)),
    ]
    assert (stats.groups, stats.skipped_groups, stats.zero_variance_groups, stats.transitions) == (3, 2, 2, 6)
    assert trajectories[0].transitions[1].advantage is None


def test_grpo_group_by_task_agent_step_compares_the_kth_call_of_each_agent() -> None:
    kept, stats = grpo_advantages(_two_agent_group(), GRPOConfig(normalize_std=False, group_by="task_agent_step"))
    # (t, writer, 1st): 1, 0 -> mean .5; (t, checker, 1st): flat; (t, writer, 2nd): only A reached it; u alone
    assert [(k.span_id, k.advantage) for k in kept] == [
        ("A-writer0", pytest.approx(0.5)),
        ("B-writer1", pytest.approx(-0.5)),
    ]
    assert (stats.groups, stats.skipped_groups, stats.kept_transitions) == (4, 3, 2)
    kept, stats = grpo_advantages(
        _two_agent_group(), GRPOConfig(normalize_std=False, group_by="task_agent_step", skip_zero_variance=False)
    )
    assert [(k.span_id, k.advantage) for k in kept] == [
        ("A-writer0", 0.5),
        ("B-writer1", -0.5),
        ("A-checker1", 0.0),
        ("B-checker0", 0.0),
        ("A-writer2", 0.0),
        ("C-writer0", 0.0),
    ]
    assert (stats.skipped_groups, stats.zero_variance_groups) == (0, 3)


def test_grpo_group_by_is_validated() -> None:
    with pytest.raises(ValueError, match="group_by"):
        GRPOConfig(group_by="agent")  # type: ignore[arg-type]


def test_grpo_requires_returns() -> None:
    with pytest.raises(ValueError, match="credit assignment"):
        grpo_advantages([traj(1.0, [0.0])])


# ------------------------------------------------------------------------------------------------------- AIR


def span(
    kind: str, name: str = "x", *, status: str = "ok", t: float = 0.0, attrs: dict[str, Any] | None = None
) -> Span:
    return Span.model_validate(
        {
            "rollout_id": "ro",
            "attempt_id": "at",
            "kind": kind,
            "name": name,
            "status": status,
            "start_time": t,
            "end_time": t + 0.1,
            "attributes": attrs or {},
            "agent": "a",
        }
    )


def test_air_builtins() -> None:
    ok, bad = span("tool", "execute_sql"), span("tool", "search", status="error")
    assert tool_ok()(ok) == 0.1 and tool_ok()(bad) is None
    assert tool_ok(0.3, tools=["execute_sql"])(ok) == 0.3
    assert tool_ok(0.3, tools=["execute_sql"])(span("tool", "search")) is None
    assert tool_ok(tools=["execute_sql"])(span("tool", "run", attrs={"gen_ai.tool.name": "execute_sql"})) == 0.1
    assert tool_error()(bad) == -0.1 and tool_error()(ok) is None
    assert tool_error()(span("exception", "ValueError", status="error")) == -0.1
    assert tool_error(exceptions=False)(span("exception", "ValueError", status="error")) is None
    answer = span("llm", attrs={ATTR_OUTPUT_MESSAGES: [{"role": "assistant", "content": "ANSWER: 42"}]})
    assert format_ok(r"ANSWER: \d+")(answer) == 0.1
    assert format_ok(r"^\{")(answer) is None
    assert format_ok(r"ANSWER", agents=["other"])(answer) is None
    with pytest.raises(ValueError, match="regular expression"):
        format_ok("(")


def test_air_rules_sum_what_fires_and_call_the_hook() -> None:
    rules = AirRules(
        rules=[tool_ok(0.1), tool_ok(0.2, tools=["execute_sql"])],
        air_rule=lambda s: 1.0 if s.name == "execute_sql" else None,
    )
    assert rules(span("tool", "execute_sql")) == pytest.approx(1.3)
    assert rules(span("tool", "search")) == pytest.approx(0.1)
    assert rules(span("message")) is None
    assert AirRules()(span("tool")) is None
    assert AirRules.defaults()(span("tool", status="error")) == -0.1


def _rollout(i: int) -> Rollout:
    return Rollout(
        rollout_id=f"ro{i}",
        task="q",
        task_id="t",
        resources_version=1,
        status="succeeded",
        final_reward=1.0 if i < 2 else 0.0,
        created_at=0.0,
    )


def _spans(i: int) -> list[Span]:
    """Two LLM calls; between them a tool call that fails in rollouts 1 and 3."""
    return [
        span("llm", "call", t=1.0),
        span("tool", "execute_sql", status="error" if i % 2 else "ok", t=2.0),
        span("llm", "call", t=3.0),
        span("reward", "r", t=4.0, attrs={ATTR_REWARD: 0.0}),
    ]


def _advantages(air: AirRules | None) -> list[float]:
    trajectories = [build_trajectory(_rollout(i), _spans(i), select_agents(None), "at", air=air) for i in range(4)]
    assign_all(trajectories, "broadcast")
    grpo_advantages(trajectories, GRPOConfig())
    advantages = [t.advantage for tr in trajectories for t in tr.transitions]
    assert all(a is not None for a in advantages), "every transition of a varied group gets an advantage"
    return [float(a or 0.0) for a in advantages]


def test_air_changes_the_advantages() -> None:
    plain = _advantages(None)
    shaped = _advantages(AirRules.defaults())
    assert plain != pytest.approx(shaped)
    # without AIR both calls of a rollout share its advantage; with AIR the first call of a rollout whose tool call
    # failed (rollout 1, same final reward as rollout 0) is worse than rollout 0's first call
    assert plain[0] == pytest.approx(plain[2])
    assert shaped[0] > shaped[2]


def test_a_failing_tool_is_punished_once_and_other_exceptions_still_count() -> None:
    """A failing tool leaves its tool span (status error) and the exception span recorded under it: one failure."""
    call = span("llm", "call", t=1.0)
    tool = span("tool", "execute_sql", status="error", t=2.0)
    raised = span("exception", "OperationalError", status="error", t=2.05).model_copy(
        update={"parent_id": tool.span_id}
    )
    node_error = span("exception", "ValueError", status="error", t=2.5)  # an agent step raised, no tool involved
    second = span("llm", "call", t=3.0)
    spans = [call, raised, tool, node_error, second]
    for i, s in enumerate(spans, start=1):
        s.sequence = i
    traj = build_trajectory(_rollout(0), spans, select_agents(None), "at", air=AirRules(rules=[tool_error(-0.1)]))
    assert traj.rewards == pytest.approx([-0.1, -0.1]), "the tool once, the step's own exception once"
    assert [t.reward for t in traj.transitions] == pytest.approx([-0.2, 0.0])
    only_tools = AirRules(rules=[tool_error(-0.1, tools=["search"])])
    traj = build_trajectory(_rollout(0), spans, select_agents(None), "at", air=only_tools)
    assert traj.rewards == pytest.approx([-0.1]), "a tool outside `tools` is not judged through its exception"
