"""AutoGen capture end to end: real autogen-agentchat / autogen-core / autogen-ext (OpenAI client), agl's gateway,
runner processes, and FakeLLM over HTTP. The app is tests/agents_autogen.py (researcher ‖ writer via asyncio.gather,
then a RoundRobinGroupChat of solver (with a tool) and critic), its team run with ``run`` and with ``run_stream``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from typing import Any

import pytest

import agl
from agl.core.types import ATTR_CALL_ID
from agl.integrations.autogen import CALL_SPAN_NAME, activate, install
from agl.testing import FakeLLM
from tests import agents_autogen
from tests.framework_harness import (
    Run,
    assert_all_succeeded_on_both_runners,
    assert_direct_calls_lack_token_ids,
    assert_each_agents_calls_went_to_its_policy,
    assert_transitions_are_the_selected_calls,
    evaluate,
    local_rollout,
    system_role,
)

TASKS: list[dict[str, Any]] = [
    {"id": f"t{i}", "a": i + 1, "b": 10 * (i + 1), "mode": "stream" if i % 2 else "run"} for i in range(4)
]
SELECTED = ["solver", "researcher"]  # not "writer", not "critic"
ROUTED = ["researcher", "solver"]  # one policy each, the others share the model
CALLS_PER_ROLLOUT = 5  # researcher, writer, solver (tool call), solver (reflection), critic


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    with FakeLLM(agents_autogen.reply) as fake:
        tmp = tmp_path_factory.mktemp("autogen")
        yield evaluate(tmp, fake, agents_autogen.autogen_agent, TASKS, selected=SELECTED, routed=ROUTED)


def test_each_agents_calls_went_to_its_own_policy(run: Run) -> None:
    assert_each_agents_calls_went_to_its_policy(run, ROUTED)


def test_rollouts_succeed_on_both_runners(run: Run) -> None:
    assert_all_succeeded_on_both_runners(run, len(TASKS))
    assert len(run.fake.requests) == 4 * CALLS_PER_ROLLOUT


def test_selected_agents_become_transitions_with_exact_token_ids(run: Run) -> None:
    assert_transitions_are_the_selected_calls(
        run, ["researcher", "solver", "solver"], selected=lambda role: role in SELECTED
    )


def test_every_call_is_one_gateway_span_tagged_with_its_agent(run: Run) -> None:
    for task in TASKS:
        llm = run.spans(task["id"], "llm")
        assert len(llm) == len(run.requests(task["id"])) == CALLS_PER_ROLLOUT, "no second llm span from AutoGen"
        framework = {s.attributes[ATTR_CALL_ID]: s for s in run.spans(task["id"], "custom") if s.name == CALL_SPAN_NAME}
        assert len(framework) == CALLS_PER_ROLLOUT
        agents = {s.span_id: s for s in run.spans(task["id"], "agent")}
        for span in llm:
            messages = span.attributes["gen_ai.input.messages"]
            assert span.agent == system_role(messages), "concurrent agents keep their own name"
            assert span.attributes["agl.response_token_ids"] == run.served(messages).token_ids
            call = framework[span.attributes[ATTR_CALL_ID]]
            assert span.parent_id == call.span_id and call.agent == span.agent
            assert call.attributes["agl.via_gateway"] is True
            assert agents[call.parent_id or ""].name == span.agent, "the call hangs under its agent's span"
        by_role = {system_role(s.attributes["gen_ai.input.messages"]): s for s in llm}
        assert by_role["researcher"].attributes["agl.stream"] is True
        assert by_role["critic"].attributes["agl.stream"] is True
        assert by_role["writer"].attributes["agl.stream"] is False
        r, w = by_role["researcher"], by_role["writer"]
        assert r.start_time < (w.end_time or 0) and w.start_time < (r.end_time or 0), "the two agents overlapped"
        solver_calls = sorted((s for s in framework.values() if s.agent == "solver"), key=lambda s: s.start_time)
        outputs = [c.attributes["gen_ai.output.messages"][0] for c in solver_calls]
        assert outputs[0]["tool_calls"][0]["function"]["name"] == "add" and "tool_calls" not in outputs[1]


def test_agents_tools_and_rewards_carry_their_agent(run: Run) -> None:
    for task, traj in zip(TASKS, run.batch.trajectories, strict=True):
        assert traj.task_id == task["id"]
        agents = run.spans(task["id"], "agent")
        assert sorted((s.name, s.agent) for s in agents) == [
            (n, n) for n in ("critic", "researcher", "solver", "writer")
        ]
        team_ids = {s.name: s.attributes.get("gen_ai.agent.id", "") for s in agents}
        assert team_ids["solver"].startswith("solver_") and team_ids["critic"].startswith("critic_")
        assert "gen_ai.agent.id" not in next(s for s in agents if s.name == "writer").attributes
        [tool] = run.spans(task["id"], "tool")
        solver = next(s for s in agents if s.name == "solver")
        assert tool.name == "add" and tool.agent == "solver" and tool.status == "ok"
        assert tool.parent_id == solver.span_id
        assert tool.attributes["gen_ai.tool.call.arguments"] == {"a": task["a"], "b": task["b"]}
        assert tool.attributes["gen_ai.tool.call.result"] == str(task["a"] + task["b"])
        assert tool.attributes["gen_ai.tool.call.id"].startswith("call_")
        [reward] = run.spans(task["id"], "reward")
        assert reward.name == "tool_ran" and reward.agent == "solver" and reward.parent_id == tool.span_id
        assert traj.rewards == [0.1]
        rewarded = [t for t in traj.transitions if t.reward]
        assert [t.agent for t in rewarded] == ["solver"] and rewarded[0].reward == pytest.approx(0.1)


@pytest.fixture(scope="module")
def side_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    """A rollout whose tool raises, one whose critic's model call fails, one that bypasses the gateway."""
    with FakeLLM(agents_autogen.reply) as fake:
        tasks: list[dict[str, Any]] = [
            {"id": "bad", "a": -1, "b": 2, "mode": "run"},
            {"id": agents_autogen.FAILING_TASK, "a": 1, "b": 2, "mode": "stream"},
            {"id": "direct", "a": 4, "b": 5, "mode": "stream", "direct_url": fake.base_url},
        ]
        tmp = tmp_path_factory.mktemp("autogen_side")
        yield evaluate(tmp, fake, agents_autogen.autogen_agent, tasks, selected=SELECTED)


def test_a_tool_error_is_an_exception_span_and_autogen_hands_it_to_the_model(side_run: Run) -> None:
    ro = side_run.rollout("bad")
    assert ro.status == "succeeded", "AutoGen's workbench turns a tool error into an error result for the model"
    [exception] = side_run.spans("bad", "exception")
    [tool] = side_run.spans("bad", "tool")
    assert tool.status == "error" and tool.attributes["error.type"] == "ValueError"
    assert exception.agent == "solver" and exception.parent_id == tool.span_id
    assert exception.attributes["exception.message"] == "add refuses negative input -1"
    reflection = [q for q in side_run.requests("bad") if any(m["role"] == "tool" for m in q["messages"])]
    assert [m["content"] for m in reflection[0]["messages"] if m["role"] == "tool"] == ["add refuses negative input -1"]
    assert side_run.spans("bad", "reward") == []


def test_an_agent_error_is_an_exception_span_and_fails_the_rollout(side_run: Run) -> None:
    task_id = agents_autogen.FAILING_TASK
    ro = side_run.rollout(task_id)
    assert ro.status == "failed" and ro.error is not None and "critic model is down" in ro.error
    exceptions = side_run.spans(task_id, "exception")
    [from_model] = [s for s in exceptions if s.agent == "critic"]
    assert from_model.attributes["exception.type"] == "InternalServerError", "recorded once, where it was raised"
    [call] = [s for s in side_run.spans(task_id, "custom") if s.agent == "critic"]
    assert call.status == "error" and from_model.parent_id == call.span_id
    [critic] = [s for s in side_run.spans(task_id, "agent") if s.name == "critic"]
    assert critic.status == "error"
    [llm] = [s for s in side_run.spans(task_id, "llm") if s.agent == "critic"]
    assert llm.status == "error", "the gateway recorded the failed call"


def test_calls_that_bypass_the_gateway_are_llm_spans_without_token_ids(side_run: Run) -> None:
    llm = side_run.spans("direct", "llm")
    assert len(llm) == CALLS_PER_ROLLOUT and {s.name for s in llm} == {CALL_SPAN_NAME}, "AutoGen's record stands in"
    assert_direct_calls_lack_token_ids(side_run, "direct", ["researcher", "solver", "solver"])


@pytest.mark.parametrize("mode", ["run", "stream"])
def test_in_a_rollout_without_gateway_every_call_is_a_full_llm_span(mode: str) -> None:
    task = {"id": "local", "a": 2, "b": 3, "mode": mode}
    with FakeLLM(agents_autogen.reply) as fake, local_rollout() as memory, activate():
        answer = asyncio.run(agents_autogen.run_app(task, fake.base_url))
    assert answer == "The answer is 5."
    kinds = sorted(s.kind for s in memory.spans)
    assert kinds == sorted(["agent"] * 4 + ["llm"] * CALLS_PER_ROLLOUT + ["tool", "reward"])
    for span in (s for s in memory.spans if s.kind == "llm"):
        messages = span.attributes["gen_ai.input.messages"]
        assert span.agent == system_role(messages)
        assert span.attributes["gen_ai.request.model"] == "m"
        assert span.attributes["gen_ai.usage.input_tokens"] > 0 or span.attributes["agl.stream"]
    first_solver, reflection = [s for s in memory.spans if s.kind == "llm" and s.agent == "solver"]
    assert first_solver.attributes["gen_ai.tool.definitions"][0]["function"]["name"] == "add"
    assert "gen_ai.tool.definitions" not in reflection.attributes, "AutoGen reflects without offering tools"
    [tool_call] = first_solver.attributes["gen_ai.output.messages"][0]["tool_calls"]
    assert tool_call["function"]["name"] == "add" and first_solver.attributes["gen_ai.response.finish_reasons"]
    result = {"role": "tool", "tool_call_id": tool_call["id"], "content": "5"}
    assert reflection.attributes["gen_ai.input.messages"][-1] == result
    assert all(not r.headers.get("x-agl-agent") for r in fake.requests), "only gateway requests are tagged"


def test_outside_agl_the_same_app_runs_untouched(caplog: pytest.LogCaptureFixture) -> None:
    install()
    assert agl.current_rollout() is None
    with caplog.at_level(logging.DEBUG, logger="agl"), FakeLLM(agents_autogen.reply) as fake:
        for mode in ("run", "stream"):
            answer = asyncio.run(agents_autogen.run_app({"id": "plain", "a": 1, "b": 1, "mode": mode}, fake.base_url))
            assert answer == "The answer is 2."
            assert agl.emit_reward(1.0) is None
    assert len(fake.requests) == 2 * CALLS_PER_ROLLOUT
    assert not any(k.startswith("x-agl") for r in fake.requests for k in r.headers)
    assert not [r for r in caplog.records if r.name.startswith("agl")]
