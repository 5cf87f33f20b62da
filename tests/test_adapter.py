"""Spans → trajectories: call order, agent selection, reward attribution, capture failures."""

from __future__ import annotations

import time
from typing import Literal

import pytest

from agl.core.adapter import build_trajectory, call_order, check_capture, select_agents
from agl.core.types import ATTR_CALL_ID, ATTR_RESPONSE_IDS, ATTR_VIA_GATEWAY, Rollout, Span

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


def test_regex_selection_takes_linear_time_so_a_reader_pattern_cannot_hold_the_server() -> None:
    """``?agents=`` comes from any dashboard reader: a backtracking engine takes ~13 s for this name (doubling per
    character); RE2 answers at once. What RE2 cannot run (backreferences) is refused with the reason."""
    sel = select_agents(r"(\w|\w)*!")
    started = time.perf_counter()
    assert not sel("a" * 26)
    assert time.perf_counter() - started < 2.0
    with pytest.raises(ValueError, match=r"agents: .* RE2 accepts \(invalid escape sequence"):
        select_agents(r"(a)\1")


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


# ------------------------------------------------------------------------------------------ order without clocks

GATEWAY_CLOCK = 1000.0


def gateway_call(sequence: int, at: float, attempt: str = "at", call_id: str | None = None) -> Span:
    """An ``llm`` span as the gateway stores it: its own clock, the runner's number from ``x-agl-sequence``."""
    span = llm(GATEWAY_CLOCK + at, "a")
    span.sequence, span.attempt_id = sequence, attempt
    if call_id is not None:
        span.attributes[ATTR_CALL_ID] = call_id
    return span


def runner_span(sequence: int, at: float, skew: float, kind: str = "reward", value: float = 0.0) -> Span:
    """A span the runner recorded: numbered by its counter, timed by its own clock (``skew`` seconds off)."""
    return Span.model_validate(
        {
            "rollout_id": "ro",
            "attempt_id": "at",
            "sequence": sequence,
            "kind": kind,
            "name": kind,
            "start_time": GATEWAY_CLOCK + at + skew,
            "end_time": GATEWAY_CLOCK + at + skew + 0.01,
            "attributes": {"agl.reward": value} if kind == "reward" else {},
        }
    )


@pytest.mark.parametrize("skew", [5.0, -5.0, 0.0])
def test_rewards_land_on_the_right_call_whatever_the_runners_clock(skew: float) -> None:
    """Three calls; after each the runner emits a reward (after the second, a tool runs first). The runner's spans
    arrive in batches after the gateway's, and its clock is ``skew`` seconds off the gateway's."""
    arrived = [
        gateway_call(1, 0.0),
        gateway_call(3, 1.0),
        runner_span(2, 0.5, skew, value=0.1),
        runner_span(4, 1.4, skew, kind="tool"),
        runner_span(5, 1.5, skew, value=0.2),
        gateway_call(6, 2.0),
        runner_span(7, 2.5, skew, value=1.0),
    ]

    def air(span: Span) -> float | None:
        return 0.05 if span.kind == "tool" else None

    traj = build_trajectory(RO, arrived, select_agents(None), air=air)
    assert [t.response_ids for t in traj.transitions] == [[1000], [1001], [1002]], "calls in the order they were sent"
    assert [t.reward for t in traj.transitions] == pytest.approx([0.1, 0.25, 1.0])
    assert traj.rewards == pytest.approx([0.1, 0.05, 0.2, 1.0])


def test_spans_without_a_runner_number_keep_their_arrival_place() -> None:
    first, second = gateway_call(0, 0.0), gateway_call(0, 1.0)  # sent by a client agl does not tag
    late, early = runner_span(2, 1.5, 0.0, value=0.2), runner_span(1, 0.5, 0.0, value=0.1)
    arrived = [first, late, second, early]  # the runner's numbered spans arrive out of order
    assert [s.span_id for s in call_order(arrived)] == [s.span_id for s in [first, early, second, late]]
    traj = build_trajectory(RO, arrived, select_agents(None))
    assert [t.reward for t in traj.transitions] == pytest.approx([0.1, 0.2])


def test_call_order_keeps_attempts_apart() -> None:
    retry = [gateway_call(2, 5.0, attempt="at2"), gateway_call(1, 6.0, attempt="at2")]
    first = [gateway_call(2, 0.0), gateway_call(1, 1.0)]
    ordered = call_order([first[0], retry[0], first[1], retry[1]])
    assert [(s.attempt_id, s.sequence) for s in ordered] == [("at", 1), ("at", 2), ("at2", 1), ("at2", 2)]


# ------------------------------------------------------------------------------------------ partial loss


def framework_call(call_id: str, agent: str, *, via_gateway: bool = True, status: str = "ok") -> Span:
    """The framework's record of a model call (a ``custom`` span when it went through the gateway)."""
    return Span.model_validate(
        {
            "rollout_id": "ro",
            "attempt_id": "at",
            "kind": "custom" if via_gateway else "llm",
            "name": "chat_model",
            "agent": agent,
            "status": status,
            "attributes": {ATTR_CALL_ID: call_id, ATTR_VIA_GATEWAY: via_gateway},
        }
    )


def test_a_call_the_gateway_did_not_record_is_a_capture_failure_naming_it() -> None:
    recorded = [framework_call(f"c{i}", "writer") for i in range(3)]
    calls = [gateway_call(i + 1, float(i), call_id=f"c{i}") for i in (0, 2)]
    spans = recorded + calls
    failure = check_capture(build_trajectory(RO, spans, select_agents(None)), spans, False)
    assert failure is not None and failure.rollout_id == "ro"
    assert "1 answered LLM call(s) have no gateway llm span" in failure.reason
    assert "call c1 of agent writer" in failure.reason and "c0" not in failure.reason


def test_a_call_the_framework_did_not_record_is_a_capture_failure_naming_it() -> None:
    spans = [framework_call("c0", "a"), gateway_call(1, 0.0, call_id="c0"), gateway_call(2, 1.0, call_id="c1")]
    failure = check_capture(build_trajectory(RO, spans, select_agents(None)), spans, False)
    assert failure is not None and "missing from the framework's record" in failure.reason
    assert "call c1 of agent a" in failure.reason


def test_calls_recorded_by_both_or_never_answered_are_not_partial_loss() -> None:
    spans = [
        framework_call("c0", "a"),
        gateway_call(1, 0.0, call_id="c0"),
        gateway_call(2, 0.5, call_id="c0"),  # the client retried the same call
        framework_call("c1", "a", status="error"),  # failed before the gateway answered
        framework_call("c2", "a"),
        gateway_call(3, 1.0),  # c2, sent by a client agl could not tag: no call id
        framework_call("c3", "a", via_gateway=False),  # bypassed the gateway: the framework's llm span is the record
    ]
    assert check_capture(build_trajectory(RO, spans, select_agents(None)), spans, False) is None
    other_attempt = [framework_call("c0", "a"), gateway_call(1, 0.0, attempt="at2", call_id="c0")]
    failure = check_capture(build_trajectory(RO, other_attempt, select_agents(None)), other_attempt, False)
    assert failure is not None, "a call id pairs within one attempt only"


def test_intermediate_rewards_among_unnumbered_calls_are_a_capture_failure() -> None:
    """Calls sent by a client agl does not tag arrive unnumbered; a reward between two of them has no known place."""
    spans = [llm(1, "a"), reward(2, 0.5), llm(3, "a")]
    failure = check_capture(build_trajectory(RO, spans, select_agents(None)), spans, False)
    assert failure is not None and "2 of 2 selected LLM calls (steps [0, 1])" in failure.reason
    assert "x-agl-sequence" in failure.reason
    numbered = [s.model_copy(update={"sequence": n}) for n, s in enumerate(spans, start=1)]
    assert check_capture(build_trajectory(RO, numbered, select_agents(None)), numbered, False) is None
    one_call = [llm(1, "a"), reward(2, 0.5)]
    assert check_capture(build_trajectory(RO, one_call, select_agents(None)), one_call, False) is None


def summary_span(kind: str, name: str, attributes: dict[str, object], status: str = "ok") -> Span:
    return Span.model_validate(
        {"rollout_id": "ro", "attempt_id": "at", "sequence": 0, "kind": kind, "name": name, "status": status}
        | {"start_time": GATEWAY_CLOCK, "end_time": GATEWAY_CLOCK + 1, "attributes": attributes}
    )


def test_one_span_summary_serves_the_dashboard_and_agl_show() -> None:
    from agl.cli import _describe
    from agl.core.adapter import TIE_BREAK_REWARD, span_summary

    reply = summary_span(
        "llm",
        "chat",
        {"gen_ai.output.messages": [{"role": "assistant", "content": "SELECT  *\nFROM t"}], ATTR_RESPONSE_IDS: [1, 2]},
    )
    failed = summary_span("llm", "chat", {"http.status_code": 502, "error.message": "upstream down"}, status="error")
    tool = summary_span("tool", "run_sql", {"gen_ai.tool.call.arguments": "q", "gen_ai.tool.call.result": "x" * 300})
    assert span_summary(reply) == "SELECT * FROM t"
    assert _describe(reply) == "ids=2 SELECT * FROM t", "agl show adds the count of token ids to the same summary"
    assert span_summary(failed) == "HTTP 502: upstream down"
    assert span_summary(summary_span("reward", "reward", {"agl.reward": 0.5})) == "reward 0.5"
    assert span_summary(summary_span("reward", TIE_BREAK_REWARD, {"agl.reward": 0.2})) == "tie-break score 0.2"
    assert len(span_summary(tool, 40)) == 40 and span_summary(tool, 40).endswith("…")
    assert span_summary(summary_span("message", "message", {"agl.message": "hi"})) == "hi"
