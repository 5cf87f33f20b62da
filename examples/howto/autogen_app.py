"""Capture an AutoGen agent: the ``AssistantAgent``'s name is the agent name agl records (teams included).

python -m examples.howto.autogen_app         # against a scripted model that calls the tool, then answers
"""

from __future__ import annotations

from typing import Any

import agl
from examples.howto import scripted

# --8<-- [start:agent]
from autogen_agentchat.agents import AssistantAgent
from autogen_core.models import ModelInfo
from autogen_ext.models.openai import OpenAIChatCompletionClient

INFO = ModelInfo(vision=False, function_calling=True, json_output=False, family="unknown", structured_output=False)


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


async def agent(task: dict[str, Any], resources: dict[str, Any]) -> float:
    llm = resources["main_llm"]
    client = OpenAIChatCompletionClient(base_url=llm.base_url, model=llm.model, api_key=llm.api_key, model_info=INFO)
    solver = AssistantAgent("solver", client, tools=[add], reflect_on_tool_use=True)
    result = await solver.run(task=task["question"])
    return float(task["answer"] in result.messages[-1].to_text())


# --8<-- [end:agent]


def main(store: str = "sqlite:///runs/autogen.db") -> agl.RolloutBatch:
    batch = scripted.evaluate(agent, agents=["solver"], store=store)  # agl.Trainer(agents=["solver"], ...)
    scripted.show(batch)
    return batch


if __name__ == "__main__":
    main()
