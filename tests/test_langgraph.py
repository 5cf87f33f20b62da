"""LangChain / LangGraph capture end to end: real langchain-core, langgraph and langchain-openai, agl's gateway, runner
processes, and FakeLLM over HTTP. The app is tests/agents_langgraph.py (planner → researcher ‖ writer → solver
subgraph with a tool → judge), run sync (thread-pool branches) and async (asyncio-task branches).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest

import agl
from agl.core.adapter import build_trajectory, select_agents
from agl.integrations.langchain import ATTR_CALL_ID, AglCallbackHandler, activate, install
from agl.testing import FakeLLM
from tests import agents_langgraph
from tests.agents_langgraph import AGENT_OF_ROLE
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
    {"id": f"t{i}", "a": i + 1, "b": 10 * (i + 1), "mode": "async" if i % 2 else "sync"} for i in range(4)
]
SELECTED = ["planner", "researcher", "solver/agent"]  # not "writer", not the tool node
ROUTED = ["researcher", "solver"]  # a policy each ("solver/agent" takes the subgraph's); the others share the model


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    with FakeLLM(agents_langgraph.reply) as fake:
        tmp = tmp_path_factory.mktemp("langgraph")
        yield evaluate(tmp, fake, agents_langgraph.langgraph_agent, TASKS, selected=SELECTED, routed=ROUTED)


def test_each_agents_calls_went_to_its_own_policy(run: Run) -> None:
    assert_each_agents_calls_went_to_its_policy(run, ROUTED, agent_of_role=AGENT_OF_ROLE)


def test_rollouts_succeed_on_both_runners(run: Run) -> None:
    assert_all_succeeded_on_both_runners(run, len(TASKS))
    assert len(run.fake.requests) == 4 * 5, "planner, researcher, writer and two solver calls per rollout"


def test_selected_agents_become_transitions_with_exact_token_ids(run: Run) -> None:
    assert_transitions_are_the_selected_calls(
        run,
        ["planner", "researcher", "solver", "solver"],
        selected=lambda role: role != "writer",
        agent_of_role=AGENT_OF_ROLE,
    )


def test_every_call_is_one_gateway_span_tagged_with_its_agent(run: Run) -> None:
    for task in TASKS:
        llm = run.spans(task["id"], "llm")
        assert len(llm) == len(run.requests(task["id"])) == 5, "no second llm span from the callback"
        chat = {
            s.attributes[ATTR_CALL_ID]: s for s in run.spans(task["id"], "custom") if s.name == "langchain.chat_model"
        }
        assert len(chat) == 5
        for span in llm:
            messages = span.attributes["gen_ai.input.messages"]
            assert span.agent == AGENT_OF_ROLE[system_role(messages)], "concurrent branches keep their own agent"
            assert span.attributes["agl.response_token_ids"] == run.served(messages).token_ids
            framework = chat[span.attributes[ATTR_CALL_ID]]
            assert span.parent_id == framework.span_id and framework.agent == span.agent
            assert framework.attributes["agl.via_gateway"] is True
        by_role = {system_role(s.attributes["gen_ai.input.messages"]): s for s in llm}
        assert by_role["researcher"].attributes["agl.stream"] is True
        assert by_role["writer"].attributes["agl.stream"] is False
        r, w = by_role["researcher"], by_role["writer"]
        assert r.start_time < (w.end_time or 0) and w.start_time < (r.end_time or 0), "the branches overlapped"


def test_a_whole_subgraph_agent_is_selected_by_regex(run: Run) -> None:
    for ro in run.batch.rollouts:
        spans = run.store.query_spans(rollout_id=ro.rollout_id)
        traj = build_trajectory(ro, spans, select_agents("solver(/.*)?"))
        assert [t.agent for t in traj.transitions] == ["solver/agent", "solver/agent"]
        assert agents_langgraph.AGENT_OF_ROLE["solver"] == "solver/agent"


def test_nodes_tools_and_rewards_carry_their_agent(run: Run) -> None:
    for task, traj in zip(TASKS, run.batch.trajectories, strict=True):
        assert traj.task_id == task["id"]
        nodes = sorted((s.name, s.agent) for s in run.spans(task["id"], "agent"))
        assert nodes == sorted(
            [
                ("planner", "planner"),
                ("researcher", "researcher"),
                ("writer", "writer"),
                ("solver", "solver"),
                ("agent", "solver/agent"),
                ("agent", "solver/agent"),
                ("tools", "solver/tools"),
                ("judge", "judge"),
            ]
        )
        [tool] = run.spans(task["id"], "tool")
        assert tool.name == "add" and tool.agent == "solver/tools" and tool.status == "ok"
        assert tool.attributes["gen_ai.tool.call.arguments"] == {"a": task["a"], "b": task["b"]}
        assert tool.attributes["gen_ai.tool.call.result"] == str(task["a"] + task["b"])
        assert tool.attributes["gen_ai.tool.call.id"].startswith("call_")
        rewards = {s.name: s for s in run.spans(task["id"], "reward")}
        assert rewards["tool_ran"].agent == "solver/tools" and rewards["tool_ran"].parent_id == tool.span_id
        assert rewards["judged"].agent == "judge"
        assert sorted(traj.rewards) == [0.1, 0.5]
        assert sum(t.reward for t in traj.transitions) == pytest.approx(0.6)


@pytest.fixture(scope="module")
def side_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    """Two rollouts whose tool raises (sync and async) and one whose model calls bypass the gateway."""
    with FakeLLM(agents_langgraph.reply) as fake:
        tasks: list[dict[str, Any]] = [
            {"id": f"bad{i}", "a": -1, "b": 2, "mode": m} for i, m in enumerate(["sync", "async"])
        ]
        tasks.append({"id": "direct", "a": 4, "b": 5, "mode": "async", "direct_url": fake.base_url})
        tmp = tmp_path_factory.mktemp("langgraph_side")
        yield evaluate(tmp, fake, agents_langgraph.langgraph_agent, tasks, selected=SELECTED)


def test_an_error_in_a_tool_is_an_exception_span_and_fails_the_rollout(side_run: Run) -> None:
    for task_id in ("bad0", "bad1"):
        ro = side_run.rollout(task_id)
        assert ro.status == "failed"
        assert ro.error is not None and "add refuses negative input -1" in ro.error
        exceptions = side_run.spans(task_id, "exception")
        from_tool = [s for s in exceptions if s.agent == "solver/tools"]
        assert len(from_tool) == 1, "recorded once where it was raised, not again by every enclosing node"
        assert from_tool[0].attributes["exception.message"] == "add refuses negative input -1"
        [tool] = side_run.spans(task_id, "tool")
        assert tool.status == "error" and tool.attributes["error.type"] == "ValueError"
        assert from_tool[0].parent_id == tool.span_id
        failed_nodes = {s.name for s in side_run.spans(task_id, "agent") if s.status == "error"}
        assert failed_nodes == {"tools", "solver"}


def test_calls_that_bypass_the_gateway_are_llm_spans_without_token_ids(side_run: Run) -> None:
    llm = side_run.spans("direct", "llm")
    assert len(llm) == 5 and {s.name for s in llm} == {"langchain.chat_model"}, "the framework's record stands in"
    agents = ["planner", "researcher", "solver/agent", "solver/agent"]
    assert_direct_calls_lack_token_ids(side_run, "direct", agents, agent_of_role=AGENT_OF_ROLE)


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_explicit_handler_records_once_and_direct_calls_are_llm_spans(mode: str) -> None:
    task = {"id": "local", "a": 2, "b": 3, "mode": mode}
    with FakeLLM(agents_langgraph.reply) as fake, local_rollout() as memory, activate():
        state = agents_langgraph.run_graph(task, fake.base_url, callbacks=[AglCallbackHandler()])
    assert state["answer"] == "The answer is 5."
    kinds = sorted(s.kind for s in memory.spans)
    assert kinds == sorted(["agent"] * 8 + ["llm"] * 5 + ["tool"] + ["reward"] * 2)
    for span in (s for s in memory.spans if s.kind == "llm"):
        # no gateway on this path: the framework's record is the llm span (and has no token ids)
        messages = span.attributes["gen_ai.input.messages"]
        assert span.agent == AGENT_OF_ROLE[system_role(messages)]
        assert span.attributes["agl.via_gateway"] is False and "agl.response_token_ids" not in span.attributes
        if system_role(messages) == "solver":
            assert span.attributes["gen_ai.tool.definitions"][0]["function"]["name"] == "add"
    assert all(not r.headers.get("x-agl-agent") for r in fake.requests), "only gateway requests are tagged"


def test_outside_agl_the_same_graph_runs_untouched(caplog: pytest.LogCaptureFixture) -> None:
    install()
    assert agl.current_rollout() is None
    with caplog.at_level(logging.DEBUG, logger="agl"), FakeLLM(agents_langgraph.reply) as fake:
        for mode in ("sync", "async"):
            state = agents_langgraph.run_graph({"id": "plain", "a": 1, "b": 1, "mode": mode}, fake.base_url)
            assert state["answer"] == "The answer is 2."
            assert agl.emit_reward(1.0) is None
    assert len(fake.requests) == 10
    assert not any(k.startswith("x-agl") for r in fake.requests for k in r.headers)
    assert not [r for r in caplog.records if r.name.startswith("agl")]
