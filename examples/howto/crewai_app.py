"""Capture a CrewAI crew: agent roles are the agent names agl records, its tools tool spans.

python -m examples.howto.crewai_app          # against a scripted model that uses the tool (ReAct), then answers
"""

from __future__ import annotations

import json
import os
import re
from typing import Any

os.environ.setdefault("CREWAI_DISABLE_TELEMETRY", "true")  # the example reaches no network but its model's
os.environ.setdefault("CREWAI_TRACING_ENABLED", "false")

import agl
from agl.testing import FakeReply
from examples.howto import scripted

# --8<-- [start:agent]
from crewai import LLM, Agent, Crew, Task
from crewai.tools import tool


@tool("add")
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def crew_agent(task: dict[str, Any], resources: dict[str, Any]) -> float:
    r = resources["main_llm"]
    llm = LLM(model=r.model, provider="openai", base_url=r.base_url, api_key=r.api_key)
    solver = Agent(role="Solver", goal="Answer sums", backstory="Careful with numbers.", llm=llm, tools=[add])
    work = Task(description=task["question"], expected_output="The answer", agent=solver)
    result = Crew(agents=[solver], tasks=[work]).kickoff()
    return float(task["answer"] in str(result))


# --8<-- [end:agent]


def react_with_add(body: dict[str, Any]) -> FakeReply:
    """CrewAI prompts a plain model in ReAct form: an ``Action: add`` first, then the ``Final Answer``."""
    messages = body["messages"]
    observed = [str(m["content"]) for m in messages if m["role"] == "assistant" and "Observation:" in str(m["content"])]
    if observed:
        return FakeReply(content=f"Thought: done\nFinal Answer: {observed[-1].rsplit('Observation:', 1)[1].strip()}")
    question = next(str(m["content"]) for m in messages if m["role"] == "user")
    a, b = (int(x) for x in re.findall(r"\d+", question)[:2])
    return FakeReply(content=f"Thought: add them\nAction: add\nAction Input: {json.dumps({'a': a, 'b': b})}")


def main(store: str = "sqlite:///runs/crewai.db") -> agl.RolloutBatch:
    batch = scripted.evaluate(crew_agent, agents=["Solver"], store=store, reply=react_with_add)
    scripted.show(batch)
    return batch


if __name__ == "__main__":
    main()
