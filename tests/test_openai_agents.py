"""OpenAI Agents SDK capture end to end: the real openai-agents package, agl's gateway, runner processes, and FakeLLM
over HTTP. The app is tests/agents_openai_agents.py (researcher ‖ writer, then triage → handoff → solver with a
function tool), run async (asyncio.gather, streamed researcher) and sync (Runner.run_sync in two threads).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar

import pytest
from agents import Agent, Runner, function_tool, set_default_openai_api, set_default_openai_client
from agents.models import _openai_shared
from agents.tracing import flush_traces, get_trace_provider
from agents.tracing.processors import default_exporter, default_processor
from openai import AsyncOpenAI

import agl
from agl.core.emit import RolloutContext, SpanSink, rollout_scope
from agl.integrations import openai_agents
from agl.integrations.openai_agents import ATTR_CALL_ID, GENERATION_SPAN_NAME, activate, install
from agl.testing import FakeLLM, FakeReply
from tests import agents_openai_agents
from tests.agents_openai_agents import AGENT_OF_ROLE
from tests.framework_harness import (
    Run,
    SpanList,
    assert_all_succeeded_on_both_runners,
    assert_direct_calls_lack_token_ids,
    assert_each_agents_calls_went_to_its_policy,
    assert_transitions_are_the_selected_calls,
    evaluate,
    system_role,
)

TASKS: list[dict[str, Any]] = [
    {"id": f"t{i}", "a": i + 1, "b": 10 * (i + 1), "mode": "async" if i % 2 else "sync"} for i in range(4)
]
SELECTED = ["researcher", "triage", "solver"]  # not "writer"
ROUTED = ["researcher", "triage"]  # one policy each, the others share the model


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    with FakeLLM(agents_openai_agents.reply) as fake:
        tmp = tmp_path_factory.mktemp("openai_agents")
        yield evaluate(tmp, fake, agents_openai_agents.openai_agents_agent, TASKS, selected=SELECTED, routed=ROUTED)


def test_each_agents_calls_went_to_its_own_policy(run: Run) -> None:
    assert_each_agents_calls_went_to_its_policy(run, ROUTED, agent_of_role=AGENT_OF_ROLE)


def test_rollouts_succeed_on_both_runners(run: Run) -> None:
    assert_all_succeeded_on_both_runners(run, len(TASKS))
    assert len(run.fake.requests) == 4 * 5, "researcher, writer, triage and two solver calls per rollout"


def test_selected_agents_become_transitions_with_exact_token_ids(run: Run) -> None:
    assert_transitions_are_the_selected_calls(
        run,
        ["researcher", "solver", "solver", "triage"],
        selected=lambda role: role != "writer",
        agent_of_role=AGENT_OF_ROLE,
    )


def test_every_call_is_one_gateway_span_tagged_with_its_agent(run: Run) -> None:
    for task in TASKS:
        llm = run.spans(task["id"], "llm")
        assert len(llm) == len(run.requests(task["id"])) == 5, "no second llm span from the SDK's generation span"
        generations = {
            s.attributes[ATTR_CALL_ID]: s for s in run.spans(task["id"], "custom") if s.name == GENERATION_SPAN_NAME
        }
        assert len(generations) == 5
        for span in llm:
            messages = span.attributes["gen_ai.input.messages"]
            assert span.agent == AGENT_OF_ROLE[system_role(messages)], "concurrent agents keep their own name"
            assert span.attributes["agl.response_token_ids"] == run.served(messages).token_ids
            framework = generations[span.attributes[ATTR_CALL_ID]]
            assert span.parent_id == framework.span_id and framework.agent == span.agent
            assert framework.attributes["agl.via_gateway"] is True
            assert framework.attributes["gen_ai.output.messages"][0]["role"] == "assistant"
        by_role = {system_role(s.attributes["gen_ai.input.messages"]): s for s in llm}
        assert by_role["researcher"].attributes["agl.stream"] is (task["mode"] == "async")
        assert by_role["writer"].attributes["agl.stream"] is False
        r, w = by_role["researcher"], by_role["writer"]
        assert r.start_time < (w.end_time or 0) and w.start_time < (r.end_time or 0), "the two agents overlapped"
        text = f"researcher notes for [{task['id']}] {task['a']} + {task['b']}"
        framework_view = generations[r.attributes[ATTR_CALL_ID]].attributes["gen_ai.output.messages"]
        assert framework_view == [{"role": "assistant", "content": text}], "streamed output in chat format too"


def test_agents_tools_handoffs_and_rewards_carry_their_agent(run: Run) -> None:
    for task, traj in zip(TASKS, run.batch.trajectories, strict=True):
        assert traj.task_id == task["id"]
        agents = {s.span_id: s for s in run.spans(task["id"], "agent")}
        assert sorted((s.name, s.agent) for s in agents.values()) == [
            (n, n) for n in ("researcher", "solver", "triage", "writer")
        ]
        assert all(s.attributes["gen_ai.agent.name"] == s.name for s in agents.values())
        [tool] = run.spans(task["id"], "tool")
        assert tool.name == "add" and tool.agent == "solver" and tool.status == "ok"
        assert agents[tool.parent_id or ""].name == "solver"
        assert tool.attributes["gen_ai.tool.call.arguments"] == {"a": task["a"], "b": task["b"]}
        assert tool.attributes["gen_ai.tool.call.result"] == task["a"] + task["b"]
        [handoff] = [s for s in run.spans(task["id"], "custom") if s.name == "handoff"]
        assert handoff.agent == "triage" and agents[handoff.parent_id or ""].name == "triage"
        assert handoff.attributes["openai_agents.handoff.to_agent"] == "solver"
        [reward] = run.spans(task["id"], "reward")
        assert reward.name == "tool_ran" and reward.agent == "solver" and reward.parent_id == tool.span_id
        assert traj.rewards == [0.1]
        [rewarded] = [t for t in traj.transitions if t.reward]
        assert rewarded.agent == "solver" and rewarded.reward == pytest.approx(0.1)


@pytest.fixture(scope="module")
def side_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    """Two rollouts whose tool raises (sync and async) and one whose model calls bypass the gateway."""
    with FakeLLM(agents_openai_agents.reply) as fake:
        tasks: list[dict[str, Any]] = [
            {"id": f"bad{i}", "a": -1, "b": 2, "mode": m} for i, m in enumerate(["sync", "async"])
        ]
        tasks.append({"id": "direct", "a": 4, "b": 5, "mode": "async", "direct_url": fake.base_url})
        tmp = tmp_path_factory.mktemp("openai_agents_side")
        yield evaluate(tmp, fake, agents_openai_agents.openai_agents_agent, tasks, selected=SELECTED)


def test_an_error_in_a_tool_is_an_exception_span_and_fails_the_rollout(side_run: Run) -> None:
    for task_id in ("bad0", "bad1"):
        ro = side_run.rollout(task_id)
        assert ro.status == "failed"
        assert ro.error is not None and "add refuses negative input -1" in ro.error
        [exception] = side_run.spans(task_id, "exception")
        assert exception.agent == "solver", "recorded once where it was raised, not again by the agent or runner"
        assert "add refuses negative input -1" in exception.attributes["exception.message"]
        [tool] = side_run.spans(task_id, "tool")
        assert tool.status == "error" and tool.attributes["error.type"] == "UserError"
        assert exception.parent_id == tool.span_id
        failed = {s.name for s in side_run.spans(task_id, "agent") if s.status == "error"}
        assert failed == {"solver"}


def test_calls_that_bypass_the_gateway_are_llm_spans_without_token_ids(side_run: Run) -> None:
    llm = side_run.spans("direct", "llm")
    assert len(llm) == 5 and {s.name for s in llm} == {GENERATION_SPAN_NAME}, "the SDK's record stands in"
    agents = ["researcher", "solver", "solver", "triage"]
    assert_direct_calls_lack_token_ids(side_run, "direct", agents, agent_of_role=AGENT_OF_ROLE)
    for span in llm:
        messages = span.attributes["gen_ai.input.messages"]
        assert span.attributes["gen_ai.output.messages"][0]["role"] == "assistant"
        if system_role(messages) == "solver":
            assert span.attributes["gen_ai.tool.definitions"] == [{"type": "function", "function": {"name": "add"}}]
        if system_role(messages) == "triage":
            assert span.attributes["gen_ai.output.messages"][0]["tool_calls"][0]["function"]["name"] == (
                "transfer_to_solver"
            )


# ------------------------------------------------------------------------------------------- in-process checks


class _Ingest(BaseHTTPRequestHandler):
    """Stands in for OpenAI's trace ingest endpoint: counts what reaches it."""

    hits: ClassVar[list[str]] = []

    def do_POST(self) -> None:
        self.hits.append(self.path)
        self.send_response(200)
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet."""


@pytest.fixture
def ingest() -> Iterator[list[str]]:
    """The SDK's default exporter pointed at a local endpoint, with a key (as ``set_default_openai_client`` sets)."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Ingest)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    exporter = default_exporter()
    endpoint, key = exporter.endpoint, exporter._api_key
    exporter.endpoint = f"http://127.0.0.1:{server.server_address[1]}/v1/traces/ingest"
    exporter.set_api_key("sk-test")
    _Ingest.hits = []
    try:
        yield _Ingest.hits
    finally:
        exporter.endpoint, exporter._api_key = endpoint, key
        server.shutdown()


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_default_client_in_process_records_and_exports_nothing(mode: str, ingest: list[str]) -> None:
    """``set_default_openai_client`` (which hands its key to the OpenAI exporter) + a plain model name; a tool whose
    error the SDK answers the model with marks the tool span failed without failing anything."""

    @function_tool
    def flaky(x: int) -> int:
        """Fails."""
        raise RuntimeError(f"flaky broke on {x}")

    def script(body: dict[str, Any]) -> FakeReply:
        if body["messages"][-1]["role"] == "tool":
            return FakeReply(content="gave up")
        return FakeReply(tool_calls=[{"name": "flaky", "arguments": {"x": 7}}])

    memory = SpanList()
    sink = SpanSink(memory)
    ctx = RolloutContext("ro-local", "at-local", sink)
    previous_client = _openai_shared.get_default_openai_client()
    try:
        with FakeLLM(script) as fake, rollout_scope(ctx), activate():
            set_default_openai_client(AsyncOpenAI(base_url=fake.base_url, api_key="sk-test", max_retries=0))
            set_default_openai_api("chat_completions")
            agent = Agent(name="lonely", instructions="ROLE lonely", tools=[flaky], model="fake-model")
            result = Runner.run_sync(agent, "go") if mode == "sync" else asyncio.run(Runner.run(agent, "go"))
        flush_traces()
        default_processor().force_flush()
    finally:
        set_default_openai_api("responses")
        _openai_shared.set_default_openai_client(previous_client)  # type: ignore[arg-type]
    sink.close()
    assert result.final_output == "gave up"
    assert ingest == [], "nothing was exported to OpenAI"
    assert default_processor() not in get_trace_provider()._multi_processor._processors  # type: ignore[attr-defined]
    kinds = sorted(s.kind for s in memory.spans)
    assert kinds == ["agent", "llm", "llm", "tool"]
    [tool] = [s for s in memory.spans if s.kind == "tool"]
    assert tool.status == "error" and tool.agent == "lonely"
    assert tool.attributes["gen_ai.tool.call.arguments"] == {"x": 7}
    assert "non-fatal" in tool.attributes["error.message"]
    assert all(s.agent == "lonely" for s in memory.spans)
    assert all(not r.headers.get("x-agl-agent") for r in fake.requests), "only gateway requests are tagged"


def test_install_keeps_one_processor_and_other_processors() -> None:
    class Other(openai_agents.AglTracingProcessor):
        pass

    other = Other()
    provider = get_trace_provider()
    provider.register_processor(other)
    try:
        install()
        install()
        processors = provider._multi_processor._processors  # type: ignore[attr-defined]
        assert processors.count(openai_agents._PROCESSOR) == 1 and other in processors
        assert default_processor() not in processors
    finally:
        provider.set_processors([p for p in provider._multi_processor._processors if p is not other])  # type: ignore[attr-defined]


def test_outside_agl_the_same_app_runs_untouched(caplog: pytest.LogCaptureFixture, ingest: list[str]) -> None:
    install()
    assert agl.current_rollout() is None
    with caplog.at_level(logging.DEBUG, logger="agl"), FakeLLM(agents_openai_agents.reply) as fake:
        for mode in ("sync", "async"):
            answer = agents_openai_agents.run_app({"id": "plain", "a": 1, "b": 1, "mode": mode}, fake.base_url)
            assert answer == "The answer is 2."
            assert agl.emit_reward(1.0) is None
    flush_traces()
    default_processor().force_flush()
    assert len(fake.requests) == 10
    assert not any(k.startswith("x-agl") for r in fake.requests for k in r.headers)
    assert not [r for r in caplog.records if r.name.startswith("agl")]
    assert len(openai_agents._PROCESSOR._open) == 0, "no span of a run outside agl is tracked"
    assert ingest == [], "nothing was exported to OpenAI"
