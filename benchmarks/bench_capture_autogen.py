"""Capture overhead of the AutoGen integration per LLM call, in the agent's process.

An ``AssistantAgent`` (``OpenAIChatCompletionClient``) answers one task per ``run`` (one LLM call each) against the fake
LLM (instant replies), inside a rollout whose spans go to an in-memory sink; the agent is reset between runs so every
prompt is the same size. Blocks of runs with capture installed alternate with blocks after
:func:`agl.integrations.autogen.uninstall` (AutoGen's own functions back); timing and figures as in
:mod:`benchmarks._capture` (the event loop runs in the calling thread). The model is NOT served through the gateway
here, so every call is recorded as a full ``llm`` span (messages converted) plus an ``agent`` span: the dearer of the
two paths.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from autogen_agentchat.agents import AssistantAgent
from autogen_core import CancellationToken
from autogen_core.models import ModelInfo
from autogen_ext.models.openai import OpenAIChatCompletionClient

from agl.core.emit import rollout_scope
from agl.integrations.autogen import install, uninstall
from agl.testing import FakeLLM
from benchmarks._capture import Sample, SpanCounter, compare, print_report, report, time_async_calls

MODEL_INFO = ModelInfo(
    vision=False, function_calling=True, json_output=False, family="unknown", structured_output=False
)


def run(rounds: int = 15, calls_per_block: int = 100) -> dict[str, Any]:
    counter = SpanCounter()
    with FakeLLM(lambda body: "ok") as fake, rollout_scope(counter.context), asyncio.Runner() as loop:
        client = OpenAIChatCompletionClient(
            base_url=fake.base_url, model="m", api_key="x", model_info=MODEL_INFO, max_retries=0
        )
        agent = AssistantAgent("bench", client, system_message="be brief")
        token = CancellationToken()

        async def ask(i: int) -> None:
            await agent.run(task=f"question {i}")
            await agent.on_reset(token)

        def block(capture: bool, n: int) -> Sample:
            if not capture:
                return loop.run(time_async_calls(ask, n))
            install()
            try:
                return loop.run(time_async_calls(ask, n))
            finally:
                uninstall()

        samples = compare(block, rounds, calls_per_block, warmup=50)
        loop.run(client.close())
    return report("autogen", samples, counter.close())


if __name__ == "__main__":
    print_report(run())
