"""A multi-agent AutoGen app used by tests/test_autogen.py (module level: runner processes import it).

Shape (one task)::

    researcher ‖ writer          two AssistantAgents run concurrently (asyncio.gather of agent.run)
    team: solver → critic        RoundRobinGroupChat until the critic says APPROVED

``researcher`` and ``critic`` stream the model (``model_client_stream=True``), the others call it plainly. ``solver``
has one function tool, ``add`` (synchronous, so AutoGen runs it in a thread pool), which emits a reward, and reflects
on the tool's result with a second model call. Mode ``stream`` runs the team with ``run_stream``, mode ``run`` with
``run``. No agl-specific code besides ``agl.emit_reward``: capture is automatic inside a rollout.
"""

from __future__ import annotations

import asyncio
import re
import time
from typing import Any

from autogen_agentchat.agents import AssistantAgent
from autogen_agentchat.base import TaskResult
from autogen_agentchat.conditions import MaxMessageTermination, TextMentionTermination
from autogen_agentchat.messages import TextMessage
from autogen_agentchat.teams import RoundRobinGroupChat
from autogen_core.models import ModelInfo
from autogen_ext.models.openai import OpenAIChatCompletionClient

import agl
from agl.testing import FakeReply

MODEL_INFO = ModelInfo(
    vision=False, function_calling=True, json_output=False, family="unknown", structured_output=False
)
#: A task whose critic gets an HTTP 500 from the model (an agent error AutoGen does not handle).
FAILING_TASK = "fail"


def add(a: int, b: int) -> int:
    """Add two integers."""
    if a < 0:
        raise ValueError(f"add refuses negative input {a}")
    agl.emit_reward(0.1, name="tool_ran")
    return a + b


def task_prompt(task: dict[str, Any]) -> str:
    return f"[{task['id']}] {task['a']} + {task['b']}"


def reply(body: dict[str, Any]) -> FakeReply:
    """FakeLLM script: answers each role; the two concurrent roles answer slowly so their calls overlap."""
    messages = body["messages"]
    role = messages[0]["content"].split()[-1]
    user = next(m["content"] for m in messages if m["role"] == "user")
    if role in ("researcher", "writer"):
        time.sleep(0.15)
        return FakeReply(content=f"{role} notes for {user}")
    if role == "critic":
        if user.startswith(f"[{FAILING_TASK}]"):
            return FakeReply(status=500, error="critic model is down")
        return FakeReply(content="APPROVED")
    tool_results = [m["content"] for m in messages if m["role"] == "tool"]
    if tool_results:
        return FakeReply(content=f"The answer is {tool_results[-1]}.")
    a, b = (int(x) for x in re.findall(r"-?\d+", user.split("]", 1)[1])[:2])
    return FakeReply(tool_calls=[{"name": "add", "arguments": {"a": a, "b": b}}])


async def run_app(task: dict[str, Any], base_url: str, api_key: str = "x", model: str = "m") -> str:
    """Run the app for one task against an OpenAI-compatible endpoint; returns the solver's last message."""
    client = OpenAIChatCompletionClient(
        base_url=base_url, model=model, api_key=api_key, model_info=MODEL_INFO, max_retries=0
    )
    researcher = AssistantAgent("researcher", client, system_message="ROLE researcher", model_client_stream=True)
    writer = AssistantAgent("writer", client, system_message="ROLE writer")
    prompt = task_prompt(task)
    await asyncio.gather(researcher.run(task=prompt), writer.run(task=prompt))

    solver = AssistantAgent("solver", client, tools=[add], system_message="ROLE solver", reflect_on_tool_use=True)
    critic = AssistantAgent("critic", client, system_message="ROLE critic", model_client_stream=True)
    done = TextMentionTermination("APPROVED") | MaxMessageTermination(6)
    team = RoundRobinGroupChat([solver, critic], termination_condition=done)
    if task.get("mode") == "stream":
        results = [item async for item in team.run_stream(task=prompt) if isinstance(item, TaskResult)]
        result = results[-1]
    else:
        result = await team.run(task=prompt)
    await client.close()
    answers = [m.content for m in result.messages if isinstance(m, TextMessage) and m.source == "solver"]
    return answers[-1] if answers else ""


def autogen_agent(task: dict[str, Any], resources: dict[str, Any]) -> float:
    """The agent as agl runs it: a plain AutoGen app on the LLM resource it was handed.

    A task with ``direct_url`` bypasses the gateway (calls the model there instead), as a misconfigured agent would.
    """
    llm = resources["main_llm"]
    answer = asyncio.run(run_app(task, task.get("direct_url") or llm.base_url, llm.api_key, llm.model))
    return 1.0 if answer == f"The answer is {task['a'] + task['b']}." else 0.0
