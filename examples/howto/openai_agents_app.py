"""Capture an OpenAI Agents SDK agent: the SDK agent's name is the agent name agl records, its tool a tool span.

python -m examples.howto.openai_agents_app   # against a scripted model that calls the tool, then answers
"""

from __future__ import annotations

from typing import Any

import agl
from examples.howto import scripted

# --8<-- [start:agent]
from agents import Agent, OpenAIChatCompletionsModel, Runner, function_tool
from openai import AsyncOpenAI


@function_tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


async def agent(task: dict[str, Any], resources: dict[str, Any]) -> float:
    llm = resources["main_llm"]
    client = AsyncOpenAI(base_url=llm.base_url, api_key=llm.api_key)
    model = OpenAIChatCompletionsModel(model=llm.model, openai_client=client)
    solver = Agent(name="solver", instructions="Solve it with the tool.", tools=[add], model=model)
    result = await Runner.run(solver, task["question"])
    return float(task["answer"] in str(result.final_output))


# --8<-- [end:agent]


def main(store: str = "sqlite:///runs/openai-agents.db") -> agl.RolloutBatch:
    batch = scripted.evaluate(agent, agents=["solver"], store=store)  # agl.Trainer(agents=["solver"], ...)
    scripted.show(batch)
    return batch


if __name__ == "__main__":
    main()
