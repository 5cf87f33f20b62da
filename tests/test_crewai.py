"""CrewAI capture end to end: real crewai, agl's gateway, runner processes, and FakeLLM over HTTP. The app is
tests/agents_crewai.py (Researcher ‖ Writer as concurrent async tasks, then Editor; a tool; a streaming model), run
with ``kickoff`` and ``kickoff_async``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

# isort: off
from tests import agents_crewai  # first: it keeps CrewAI off the network before crewai is imported
from agl.integrations.crewai import LLM_SPAN_NAME, activate, install

# isort: on
import pytest

import agl
from agl.core.types import ATTR_CALL_ID, Span
from agl.testing import FakeLLM
from tests.agents_crewai import role_of, task_id_of
from tests.framework_harness import (
    Run,
    assert_all_succeeded_on_both_runners,
    assert_direct_calls_lack_token_ids,
    assert_each_agents_calls_went_to_its_policy,
    assert_transitions_are_the_selected_calls,
    evaluate,
    local_rollout,
)

TASKS: list[dict[str, Any]] = [
    {"id": f"t{i}", "a": i + 1, "b": 10 * (i + 1), "mode": "async" if i % 2 else "sync"} for i in range(4)
]
SELECTED = ["Researcher", "Editor"]  # not the Writer
CALLS_PER_ROLLOUT = 4  # Researcher twice (tool, then answer), Writer once, Editor once


ROUTED = ["Researcher", "Editor"]  # one policy each, the Writer's calls go to the shared model


def _evaluate(tmp: Path, fake: FakeLLM, tasks: list[dict[str, Any]], routed: list[str] | None = None) -> Run:
    return evaluate(
        tmp,
        fake,
        agents_crewai.crewai_agent,
        tasks,
        selected=SELECTED,
        role_of=role_of,
        task_id_of=task_id_of,
        routed=routed or [],
    )


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    with FakeLLM(agents_crewai.reply) as fake:
        yield _evaluate(tmp_path_factory.mktemp("crewai"), fake, TASKS, ROUTED)


def test_each_agents_calls_went_to_its_own_policy(run: Run) -> None:
    assert_each_agents_calls_went_to_its_policy(run, ROUTED)


def test_rollouts_succeed_on_both_runners(run: Run) -> None:
    assert_all_succeeded_on_both_runners(run, len(TASKS))
    assert len(run.fake.requests) == 4 * CALLS_PER_ROLLOUT


def test_selected_agents_become_transitions_with_exact_token_ids(run: Run) -> None:
    assert_transitions_are_the_selected_calls(
        run, ["Editor", "Researcher", "Researcher"], selected=lambda role: role != "Writer"
    )


def test_every_call_is_one_gateway_span_tagged_with_its_role(run: Run) -> None:
    for task in TASKS:
        llm = run.spans(task["id"], "llm")
        assert len(llm) == len(run.requests(task["id"])) == CALLS_PER_ROLLOUT, "no second llm span from the events"
        framework = {s.attributes[ATTR_CALL_ID]: s for s in run.spans(task["id"], "custom") if s.name == LLM_SPAN_NAME}
        assert len(framework) == CALLS_PER_ROLLOUT
        for span in llm:
            messages = span.attributes["gen_ai.input.messages"]
            assert span.agent == role_of(messages), "concurrent agents keep their own role"
            assert span.attributes["agl.response_token_ids"] == run.served(messages).token_ids
            mine = framework[span.attributes[ATTR_CALL_ID]]
            assert span.parent_id == mine.span_id and mine.agent == span.agent
            assert mine.attributes["agl.via_gateway"] is True and "gen_ai.input.messages" not in mine.attributes
        by_role: dict[str, list[Span]] = {}
        for span in sorted(llm, key=lambda s: s.start_time):
            by_role.setdefault(role_of(span.attributes["gen_ai.input.messages"]), []).append(span)
        [writer], [research, _] = by_role["Writer"], by_role["Researcher"]
        assert writer.attributes["agl.stream"] is True and research.attributes["agl.stream"] is False
        assert research.start_time < (writer.end_time or 0) and writer.start_time < (research.end_time or 0), (
            "the two async tasks' calls overlapped"
        )


def test_crew_tasks_agents_tools_and_rewards_form_one_tree(run: Run) -> None:
    for task, traj in zip(TASKS, run.batch.trajectories, strict=True):
        assert traj.task_id == task["id"]
        spans = {s.span_id: s for s in run.spans(task["id"])}
        [crew] = [s for s in spans.values() if s.name == "crewai.crew"]
        tasks = [s for s in spans.values() if s.name == "crewai.task"]
        assert sorted(s.agent or "" for s in tasks) == ["Editor", "Researcher", "Writer"]
        assert all(s.parent_id == crew.span_id for s in tasks)
        agents = run.spans(task["id"], "agent")
        assert sorted((s.name, s.agent) for s in agents) == [(r, r) for r in ("Editor", "Researcher", "Writer")]
        assert all(spans[a.parent_id or ""].name == "crewai.task" for a in agents)
        agent_span = {a.agent: a for a in agents}
        for call in (s for s in spans.values() if s.name == LLM_SPAN_NAME):
            assert call.parent_id == agent_span[call.agent].span_id
        [tool] = run.spans(task["id"], "tool")
        assert tool.name == "add" and tool.agent == "Researcher" and tool.status == "ok"
        assert tool.parent_id == agent_span["Researcher"].span_id
        assert tool.attributes["gen_ai.tool.call.arguments"] == {"a": task["a"], "b": task["b"]}
        assert tool.attributes["gen_ai.tool.call.result"] == str(task["a"] + task["b"])
        [reward] = run.spans(task["id"], "reward")
        assert reward.agent == "Researcher" and reward.parent_id == tool.span_id
        assert traj.rewards == [0.1]
        assert sum(t.reward for t in traj.transitions) == pytest.approx(0.1)
        asked = [s for s in spans.values() if s.name == LLM_SPAN_NAME and s.agent == "Researcher"]
        tool_calls = [m.get("tool_calls") for s in asked for m in s.attributes["gen_ai.output.messages"]]
        arguments = json.dumps({"a": task["a"], "b": task["b"]})
        action = [{"type": "function", "function": {"name": "add", "arguments": arguments}}]
        assert [c for c in tool_calls if c] == [action], "the ReAct action is the call's tool call"


@pytest.fixture(scope="module")
def side_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    """A tool that raises (sync, async), a model error CrewAI gives up on, and model calls that bypass the gateway."""
    with FakeLLM(agents_crewai.reply) as fake:
        tasks: list[dict[str, Any]] = [
            {"id": f"bad{i}", "a": -1, "b": 2, "mode": m} for i, m in enumerate(["sync", "async"])
        ]
        tasks.append({"id": "down", "a": 1, "b": 2, "mode": "sync", "fail": True})
        tasks.append({"id": "direct", "a": 4, "b": 5, "mode": "async", "direct_url": fake.base_url})
        yield _evaluate(tmp_path_factory.mktemp("crewai_side"), fake, tasks)


def test_a_tool_error_is_fed_back_and_recorded_per_try(side_run: Run) -> None:
    for task_id in ("bad0", "bad1"):
        ro = side_run.rollout(task_id)
        assert ro.status == "succeeded" and ro.final_reward == 0.0, "CrewAI gives the error to the agent and goes on"
        tools = side_run.spans(task_id, "tool")
        assert tools and all(t.status == "error" and t.attributes["error.type"] == "ValueError" for t in tools)
        exceptions = side_run.spans(task_id, "exception")
        assert sorted(e.parent_id or "" for e in exceptions) == sorted(t.span_id for t in tools), "one per try"
        assert {(e.agent, e.attributes["exception.message"]) for e in exceptions} == {
            ("Researcher", "add refuses negative input -1")
        }
        assert side_run.spans(task_id, "reward") == [], "the tool never got to its reward"


def test_an_agent_error_is_one_exception_span_and_fails_the_rollout(side_run: Run) -> None:
    ro = side_run.rollout("down")
    assert ro.status == "failed"
    assert ro.error is not None and "editor model is down" in ro.error
    [exception] = side_run.spans("down", "exception")
    assert exception.agent == "Editor" and "editor model is down" in exception.attributes["exception.message"]
    [editor] = [s for s in side_run.spans("down", "agent") if s.agent == "Editor"]
    assert editor.status == "error" and exception.parent_id == editor.span_id
    failed = sorted((s.kind, s.name) for s in side_run.spans("down") if s.status == "error" and s.kind != "exception")
    assert failed == [
        ("agent", "Editor"),
        ("custom", "crewai.crew"),
        ("custom", "crewai.llm_call"),
        ("custom", "crewai.task"),
        ("llm", "chat.completions"),  # the gateway's record of the failed call
    ]


def test_calls_that_bypass_the_gateway_are_llm_spans_without_token_ids(side_run: Run) -> None:
    llm = side_run.spans("direct", "llm")
    assert len(llm) == CALLS_PER_ROLLOUT and {s.name for s in llm} == {LLM_SPAN_NAME}, "the event record stands in"
    assert_direct_calls_lack_token_ids(side_run, "direct", ["Editor", "Researcher", "Researcher"])
    for span in llm:
        assert span.attributes["gen_ai.output.messages"][0]["content"].startswith("Thought:")


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_in_process_rollout_records_each_event_once(mode: str) -> None:
    task = {"id": "local", "a": 2, "b": 3, "mode": mode}
    with FakeLLM(agents_crewai.reply) as fake, local_rollout() as memory, activate():
        answer = agents_crewai.run_crew(task, fake.base_url)
    assert answer == "The answer is 5."
    kinds = sorted(s.kind for s in memory.spans)
    assert kinds == sorted(["custom"] * 4 + ["agent"] * 3 + ["llm"] * 4 + ["tool", "reward"])
    usage = [s.attributes.get("gen_ai.usage.input_tokens") for s in memory.spans if s.kind == "llm"]
    assert sum(1 for u in usage if u) == 3, "usage of every non-streamed call"
    assert all(not r.headers.get("x-agl-agent") for r in fake.requests), "only gateway requests are tagged"


def test_outside_agl_the_same_crew_runs_untouched(caplog: pytest.LogCaptureFixture) -> None:
    install()
    assert agl.current_rollout() is None
    with caplog.at_level(logging.DEBUG, logger="agl"), FakeLLM(agents_crewai.reply) as fake:
        for mode in ("sync", "async"):
            assert agents_crewai.run_crew({"id": "plain", "a": 1, "b": 1, "mode": mode}, fake.base_url) == (
                "The answer is 2."
            )
            assert agl.emit_reward(1.0) is None
    assert len(fake.requests) == 2 * CALLS_PER_ROLLOUT
    assert not any(k.startswith("x-agl") for r in fake.requests for k in r.headers)
    assert not [r for r in caplog.records if r.name.startswith("agl")]
