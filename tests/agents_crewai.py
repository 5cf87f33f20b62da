"""A multi-agent CrewAI crew used by tests/test_crewai.py (module level: runner processes import it).

Crew (ReAct prompting, CrewAI's default with a plain OpenAI-compatible model)::

    research (Researcher, tool ``add``, async task) ‖ outline (Writer, async task, streaming model)
        → report (Editor, sync task, context = both)

The two async tasks run at the same time in CrewAI's task threads; FakeLLM answers them slowly so their calls
overlap. ``add`` emits a reward. A task with ``"mode": "async"`` is run with ``kickoff_async``. No agl-specific code
besides ``agl.emit_reward``: capture is automatic inside a rollout.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import time
from typing import Any

# CrewAI must never reach the internet from tests (telemetry, trace upload, first-run prompt).
for _name in ("CREWAI_DISABLE_TELEMETRY", "OTEL_SDK_DISABLED", "CREWAI_TESTING"):
    os.environ[_name] = "true"
os.environ["CREWAI_TRACING_ENABLED"] = "false"

from crewai import LLM, Agent, Crew, CrewOutput, Task  # noqa: E402
from crewai.tools import tool  # noqa: E402

import agl  # noqa: E402
from agl.testing import FakeReply  # noqa: E402

ROLES = ("Researcher", "Writer", "Editor")
#: The role whose model call FakeLLM fails for a task marked ``"fail": true``.
FAILING_ROLE = "Editor"


@tool("add")
def add(a: int, b: int) -> int:
    """Add two integers."""
    if a < 0:
        raise ValueError(f"add refuses negative input {a}")
    agl.emit_reward(0.1, name="tool_ran")
    return a + b


def role_of(messages: list[dict[str, Any]]) -> str:
    """The agent role a request came from (CrewAI's system prompt starts with "You are <role>.")."""
    return str(messages[0]["content"]).split(".", 1)[0].removeprefix("You are ")


def task_id_of(messages: list[dict[str, Any]]) -> str:
    """The task id every task description of the crew starts with (``[t0] ...``)."""
    user = next(str(m["content"]) for m in messages if m["role"] == "user")
    return user.split("[", 1)[1].split("]", 1)[0]


def reply(body: dict[str, Any]) -> FakeReply:
    """FakeLLM script: ReAct answers per role; the two concurrent roles answer slowly so their calls overlap."""
    messages = body["messages"]
    role = role_of(messages)
    user = next(str(m["content"]) for m in messages if m["role"] == "user")
    if role in ("Researcher", "Writer"):
        time.sleep(0.15)
    if role == "Writer":
        return FakeReply(content=f"Thought: easy\nFinal Answer: outline for [{task_id_of(messages)}]")
    if role == "Editor":
        if "FAIL" in user:
            return FakeReply(status=500, error="editor model is down")
        found = re.search(r"The sum is (-?\d+|unknown)", user)
        return FakeReply(content=f"Thought: done\nFinal Answer: The answer is {found.group(1) if found else '?'}.")
    observations = [m["content"] for m in messages if m["role"] == "assistant" and "Observation:" in m["content"]]
    if observations:
        result = observations[-1].rsplit("Observation:", 1)[1].strip()
        value = result if re.fullmatch(r"-?\d+", result) else "unknown"
        return FakeReply(content=f"Thought: I now know the final answer\nFinal Answer: The sum is {value}")
    a, b = (int(x) for x in re.findall(r"-?\d+", user.split("]", 1)[1])[:2])
    args = json.dumps({"a": a, "b": b})
    return FakeReply(content=f"Thought: I should add the numbers\nAction: add\nAction Input: {args}")


def build_crew(task: dict[str, Any], base_url: str, api_key: str = "x", model: str = "m") -> Crew:
    """The crew for one task, on an OpenAI-compatible endpoint (the Writer's model streams)."""

    def llm(stream: bool = False) -> LLM:
        return LLM(model=model, provider="openai", base_url=base_url, api_key=api_key, max_retries=0, stream=stream)

    tid = task["id"]
    researcher = Agent(role="Researcher", goal="add numbers", backstory="careful", llm=llm(), tools=[add])
    writer = Agent(role="Writer", goal="outline reports", backstory="quick", llm=llm(stream=True))
    editor = Agent(role="Editor", goal="write the answer", backstory="exact", llm=llm(), max_retry_limit=0)
    research = Task(
        description=f"[{tid}] add {task['a']} and {task['b']} with the add tool",
        expected_output="the sum",
        agent=researcher,
        async_execution=True,
    )
    outline = Task(
        description=f"[{tid}] outline the report", expected_output="an outline", agent=writer, async_execution=True
    )
    report = Task(
        description=f"[{tid}] write the answer{' FAIL' if task.get('fail') else ''}",
        expected_output="the answer",
        agent=editor,
        context=[research, outline],
    )
    return Crew(agents=[researcher, writer, editor], tasks=[research, outline, report])


def run_crew(task: dict[str, Any], base_url: str, api_key: str = "x", model: str = "m") -> str:
    """Run the crew for one task (``kickoff`` or, for ``"mode": "async"``, ``kickoff_async``); the final output."""
    crew = build_crew(task, base_url, api_key, model)
    output = asyncio.run(crew.kickoff_async()) if task.get("mode") == "async" else crew.kickoff()
    assert isinstance(output, CrewOutput), "the crew does not stream"
    return str(output.raw)


def crewai_agent(task: dict[str, Any], resources: dict[str, Any]) -> float:
    """The agent as agl runs it: a plain crew on the LLM resource it was handed.

    A task with ``direct_url`` bypasses the gateway (calls the model there instead), as a misconfigured agent would.
    """
    llm = resources["main_llm"]
    answer = run_crew(task, task.get("direct_url") or llm.base_url, llm.api_key, llm.model)
    return 1.0 if answer == f"The answer is {task['a'] + task['b']}." else 0.0
