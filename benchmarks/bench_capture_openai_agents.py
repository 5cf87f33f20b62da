"""Capture overhead of the OpenAI Agents SDK integration per LLM call, in the agent's process.

One ``Agent`` on ``OpenAIChatCompletionsModel`` answers against the fake LLM (instant replies) inside a rollout whose
spans go to an in-memory sink; each ``Runner.run`` is one LLM call. Blocks of runs with agl's tracing processor
registered (what ``activate()`` installs inside runners) alternate with blocks without any processor (the SDK still
builds its spans: tracing stays on, nothing consumes them); timing and figures as in :mod:`benchmarks._capture` (the
event loop runs in the calling thread). The model is NOT served through the gateway here, so every call is recorded as
a full ``llm`` span (messages converted): the dearer of the two paths.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from agents import Agent, OpenAIChatCompletionsModel, Runner
from agents.tracing import TracingProcessor, get_trace_provider
from openai import AsyncOpenAI

from agl.core.emit import rollout_scope
from agl.integrations.openai_agents import AglTracingProcessor, install
from agl.testing import FakeLLM
from benchmarks._capture import Sample, SpanCounter, compare, print_report, report, time_async_calls


def run(rounds: int = 15, calls_per_block: int = 100) -> dict[str, Any]:
    counter = SpanCounter()
    with FakeLLM(lambda body: "ok") as fake, rollout_scope(counter.context), asyncio.Runner() as loop:
        client = AsyncOpenAI(base_url=fake.base_url, api_key="x", max_retries=0)
        model = OpenAIChatCompletionsModel(model="m", openai_client=client)
        agent = Agent(name="bench", instructions="be brief", model=model)
        provider = get_trace_provider()
        install()
        registered = provider._multi_processor._processors  # type: ignore[attr-defined]
        on: list[TracingProcessor] = [p for p in registered if isinstance(p, AglTracingProcessor)]

        def block(capture: bool, n: int) -> Sample:
            provider.set_processors(on if capture else [])
            return loop.run(time_async_calls(lambda i: Runner.run(agent, f"question {i}"), n))

        try:
            samples = compare(block, rounds, calls_per_block, warmup=50)
        finally:
            provider.set_processors(on)
    return report("openai_agents", samples, counter.close())


if __name__ == "__main__":
    print_report(run())
