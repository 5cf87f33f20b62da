"""Import from MLflow: an agent run without agl, traced by MLflow's own tracing (OpenAI autolog for the LLM calls,
``@mlflow.trace`` for the agent and its tool) into a local SQLite tracking store, with feedback logged by
``mlflow.log_feedback``; ``agl import --from-mlflow`` turns each trace into a rollout that APO learns from offline.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

import agl
from agl.cli import main
from agl.core.types import ATTR_INPUT_TOKENS, ATTR_MODEL, ATTR_OUTPUT_TOKENS, ATTR_REWARD, ATTR_TOOL_NAME
from agl.otel import stored_trajectories
from agl.testing import FakeLLM, FakeReply
from agl.trainers.apo import APO, APOConfig
from tests.traced_elsewhere import run_elsewhere

pytestmark = pytest.mark.slow

PROMPT = "Add the two numbers. {question}"
BETTER = "Add the two numbers carefully. {question}"
CRITIQUE = "The answers are off by one: the prompt should ask to add carefully."
TASKS = [{"a": 1, "b": 2}, {"a": 2, "b": 4}, {"a": 3, "b": 6}]
ADD_TOOL = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two integers.",
        "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}},
    },
}


def reply(body: dict[str, Any]) -> FakeReply:
    """A tool call to ``add``, then the sum: off by one for an odd ``a`` unless the prompt says "carefully"."""
    messages = body["messages"]
    a, b = (int(x) for x in re.findall(r"-?\d+", messages[1]["content"])[:2])
    if messages[-1]["role"] != "tool":
        return FakeReply(tool_calls=[{"name": "add", "arguments": {"a": a, "b": b}}])
    wrong = a % 2 == 1 and "carefully" not in messages[0]["content"]
    return FakeReply(content=f"The answer is {int(messages[-1]['content']) + wrong}.")


def optimizer_reply(body: dict[str, Any]) -> FakeReply:
    text = body["messages"][-1]["content"]
    if CRITIQUE in text:
        return FakeReply(content=f'<prompt name="system_prompt">{BETTER}</prompt>')
    return FakeReply(content=CRITIQUE)


@pytest.fixture
def mlflow_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A fresh SQLite tracking store's URI; MLflow's telemetry off in this process."""
    monkeypatch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")
    return f"sqlite:///{tmp_path / 'mlflow.db'}"


def test_import_from_mlflow_gives_rollouts_with_messages_tokens_agents_and_feedback_rewards_that_apo_learns_from(
    mlflow_store: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    runs = run_elsewhere(tmp_path, "mlflow", mlflow_store, "prod-agent")["runs"]
    assert [r["reward"] for r in runs] == [0.0, 1.0, 0.0], "the starting prompt fails the odd tasks"
    store_url = f"sqlite:///{tmp_path / 'agl.db'}"
    args = ["import", "--from-mlflow", mlflow_store, "--experiment", "prod-agent", "--reward", "reward"]

    assert main([*args, "--store", store_url]) == 0
    assert "imported 3 rollouts" in capsys.readouterr().out
    assert main([*args, "--store", store_url]) == 0
    assert "imported 0 rollouts (0 spans); 3 already in the store" in capsys.readouterr().out

    store = agl.open_store(store_url)
    trajectories = stored_trajectories(store, source=f"mlflow:{mlflow_store}", agents=["solver"])
    assert len(trajectories) == len(TASKS), "one rollout per trace"
    by_trace = {t.metadata["agl.imported"]["trace_id"]: t for t in trajectories}
    for task, run in zip(TASKS, runs, strict=True):
        traj = by_trace[run["trace_id"].removeprefix("tr-")]
        question = f"What is {task['a']} + {task['b']}?"
        assert traj.status == "succeeded" and traj.task == {"question": question}
        assert traj.final_reward == run["reward"], "the trace's feedback named by --reward"
        assert traj.rewards == [1.0], "the span-level feedback as an intermediate reward"
        assert [t.agent for t in traj.transitions] == ["solver", "solver"], "agent from the AGENT span"
        first, second = traj.transitions
        assert first.request_messages == [
            {"role": "system", "content": PROMPT.format(question=question)},
            {"role": "user", "content": question},
        ]
        assert first.response_message["tool_calls"][0]["function"]["name"] == "add"
        assert first.reward == 1.0, "tool_choice feedback lands after the call it judges"
        assert second.request_messages[-1] == {
            "role": "tool",
            "tool_call_id": first.response_message["tool_calls"][0]["id"],
            "content": str(task["a"] + task["b"]),
        }
        assert second.response_message == {"role": "assistant", "content": run["answer"]}
        spans = store.query_spans(attempt_id=traj.attempt_id)
        llm_spans = [s for s in spans if s.kind == "llm"]
        assert [s.attributes[ATTR_MODEL] for s in llm_spans] == ["fake-model", "fake-model"]
        assert [[s.attributes[ATTR_INPUT_TOKENS], s.attributes[ATTR_OUTPUT_TOKENS]] for s in llm_spans] == run["usage"]
        (tool,) = [s for s in spans if s.kind == "tool"]
        assert tool.attributes[ATTR_TOOL_NAME] == "add" and tool.agent == "solver"
        assert tool.attributes["gen_ai.tool.call.arguments"] == {"a": task["a"], "b": task["b"]}
        assert [s.attributes[ATTR_REWARD] for s in spans if s.kind == "reward"] == [1.0]

    assert main(["import", "--from-mlflow", mlflow_store, "--experiment", "nope", "--store", store_url]) == 1
    assert "has no experiment 'nope'" in capsys.readouterr().err

    with FakeLLM(optimizer_reply) as optimizer:
        resources: dict[str, Any] = {
            "system_prompt": agl.PromptTemplate(template=PROMPT, agent="solver"),
            "optimizer_llm": agl.LLM(base_url=optimizer.base_url, model="optimizer"),
        }
        cfg = APOConfig(prompts=["system_prompt"], optimizer_llm="optimizer_llm", branch_factor=1)
        proposal = APO(cfg).fit_offline(resources, trajectories)
        critique_request = optimizer.requests[0]["messages"][-1]["content"]
    assert proposal.prompts == {"system_prompt": BETTER}
    assert proposal.failures == 2
    assert "What is 1 + 2?" in critique_request and "tool calls: add(" in critique_request
