"""A multi-agent OpenAI Agents SDK app used by tests/test_openai_agents.py (module level: runner processes import it).

Flow (the same shape sync and async)::

    researcher ‖ writer          two agents at once: asyncio.gather of Runner.run_streamed + Runner.run (async),
                                 two threads each calling Runner.run_sync (sync)
    triage → handoff → solver    solver calls the function tool ``add``, then answers

Every agent uses ``OpenAIChatCompletionsModel`` on an ``AsyncOpenAI`` client pointed at the LLM resource's
``base_url`` (agl's gateway inside a rollout). ``add`` emits a reward. No agl-specific code besides
``agl.emit_reward``: capture is automatic inside a rollout.
"""

from __future__ import annotations

import asyncio
import re
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from agents import Agent, OpenAIChatCompletionsModel, Runner, function_tool
from openai import AsyncOpenAI

import agl
from agl.testing import FakeReply

#: The agent name capture must give each role's LLM calls (the SDK agent's name).
AGENT_OF_ROLE = {"researcher": "researcher", "writer": "writer", "triage": "triage", "solver": "solver"}


@function_tool(failure_error_function=None)  # let a failure end the run (the default answers the model instead)
def add(a: int, b: int) -> int:
    """Add two integers."""
    if a < 0:
        raise ValueError(f"add refuses negative input {a}")
    agl.emit_reward(0.1, name="tool_ran")
    return a + b


def reply(body: dict[str, Any]) -> FakeReply:
    """FakeLLM script: answers each role; the two concurrent roles answer slowly so their calls overlap."""
    messages = body["messages"]
    role = messages[0]["content"].split()[-1]
    user = next(m["content"] for m in messages if m["role"] == "user")
    if role in ("researcher", "writer"):
        time.sleep(0.15)
        return FakeReply(content=f"{role} notes for {user}")
    if role == "triage":
        return FakeReply(tool_calls=[{"name": "transfer_to_solver", "arguments": {}}])
    called_add = any(c["function"]["name"] == "add" for m in messages for c in m.get("tool_calls") or [])
    if called_add:
        return FakeReply(content=f"The answer is {messages[-1]['content']}.")
    a, b = (int(x) for x in re.findall(r"-?\d+", user.split("]", 1)[1])[:2])
    return FakeReply(tool_calls=[{"name": "add", "arguments": {"a": a, "b": b}}])


def build_agents(base_url: str, api_key: str = "x", model_name: str = "m") -> dict[str, Agent[Any]]:
    """The four agents, on one Chat Completions client for ``base_url`` (build them in the loop that runs them)."""
    client = AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0)
    model = OpenAIChatCompletionsModel(model=model_name, openai_client=client)
    solver = Agent(name="solver", instructions="ROLE solver", tools=[add], model=model)
    return {
        "researcher": Agent(name="researcher", instructions="ROLE researcher", model=model),
        "writer": Agent(name="writer", instructions="ROLE writer", model=model),
        "triage": Agent(name="triage", instructions="ROLE triage", handoffs=[solver], model=model),
        "solver": solver,
    }


def prompt(task: dict[str, Any]) -> str:
    return f"[{task['id']}] {task['a']} + {task['b']}"


async def run_async(task: dict[str, Any], base_url: str, api_key: str = "x", model_name: str = "m") -> str:
    """Researcher (streamed) and writer at once, then triage → solver."""
    agents = build_agents(base_url, api_key, model_name)
    streamed = Runner.run_streamed(agents["researcher"], prompt(task))

    async def research() -> str:
        async for _ in streamed.stream_events():
            pass
        return str(streamed.final_output)

    await asyncio.gather(research(), Runner.run(agents["writer"], prompt(task)))
    result = await Runner.run(agents["triage"], prompt(task))
    return str(result.final_output)


def run_sync(task: dict[str, Any], base_url: str, api_key: str = "x", model_name: str = "m") -> str:
    """Researcher and writer at once in two threads, then triage → solver, all with ``Runner.run_sync``."""

    def one(role: str) -> str:
        agent = build_agents(base_url, api_key, model_name)[role]
        return str(Runner.run_sync(agent, prompt(task)).final_output)

    with ThreadPoolExecutor(2) as pool:
        list(pool.map(one, ["researcher", "writer"]))
    return one("triage")


def run_app(task: dict[str, Any], base_url: str, api_key: str = "x", model_name: str = "m") -> str:
    """Run the app for one task against an OpenAI-compatible endpoint (sync or async as the task says)."""
    if task.get("mode") == "async":
        return asyncio.run(run_async(task, base_url, api_key, model_name))
    return run_sync(task, base_url, api_key, model_name)


def openai_agents_agent(task: dict[str, Any], resources: dict[str, Any]) -> float:
    """The agent as agl runs it: a plain Agents SDK app on the LLM resource it was handed.

    A task with ``direct_url`` bypasses the gateway (calls the model there instead), as a misconfigured agent would.
    """
    llm = resources["main_llm"]
    answer = run_app(task, task.get("direct_url") or llm.base_url, llm.api_key or "x", llm.model)
    return 1.0 if answer == f"The answer is {task['a'] + task['b']}." else 0.0
