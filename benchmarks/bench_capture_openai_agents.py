"""Capture overhead of the OpenAI Agents SDK integration per LLM call, in the agent's process.

One ``Agent`` on ``OpenAIChatCompletionsModel`` answers against the fake LLM (instant replies) inside a rollout whose
spans go to an in-memory sink; each ``Runner.run`` is one LLM call. Blocks of runs with agl's tracing processor
registered (what ``activate()`` installs inside runners) alternate with blocks without any processor (the SDK still
builds its spans: tracing stays on, nothing consumes them); the overhead is the difference of the median per-call
times. The headline figure is CPU time of the calling thread (the event loop runs there; the fake LLM answers from
other threads), which stays stable on a loaded machine; wall-clock figures are printed too. The model is NOT served
through the gateway here, so every call is recorded as a full ``llm`` span (messages converted): the dearer of the
two paths.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from agents import Agent, OpenAIChatCompletionsModel, Runner
from agents.tracing import TracingProcessor, get_trace_provider
from openai import AsyncOpenAI

from agl.core.emit import RolloutContext, SpanSink, rollout_scope
from agl.core.types import Span
from agl.integrations.openai_agents import AglTracingProcessor, install
from agl.testing import FakeLLM


class _Memory:
    def __init__(self) -> None:
        self.spans = 0

    def add_spans(self, spans: list[Span]) -> int:
        self.spans += len(spans)
        return len(spans)


async def _block(agent: Agent[Any], n: int) -> tuple[float, float]:
    """(wall seconds, CPU seconds of this thread) per call over ``n`` runs (one LLM call each)."""
    wall, cpu = time.perf_counter(), time.thread_time()
    for i in range(n):
        await Runner.run(agent, f"question {i}")
    return (time.perf_counter() - wall) / n, (time.thread_time() - cpu) / n


async def _measure(agent: Agent[Any], rounds: int, calls_per_block: int) -> tuple[list[Any], list[Any]]:
    provider = get_trace_provider()
    install()
    registered = provider._multi_processor._processors  # type: ignore[attr-defined]
    on: list[TracingProcessor] = [p for p in registered if isinstance(p, AglTracingProcessor)]
    off: list[TracingProcessor] = []
    with_capture: list[tuple[float, float]] = []
    without: list[tuple[float, float]] = []
    try:
        for processors in (on, off):
            provider.set_processors(processors)
            await _block(agent, 50)
        for r in range(rounds):
            for processors in (on, off) if r % 2 == 0 else (off, on):
                provider.set_processors(processors)
                sample = await _block(agent, calls_per_block)
                (with_capture if processors is on else without).append(sample)
    finally:
        provider.set_processors(on)
    return with_capture, without


def run(rounds: int = 15, calls_per_block: int = 100) -> dict[str, Any]:
    memory = _Memory()
    sink = SpanSink(memory)
    with FakeLLM(lambda body: "ok") as fake, rollout_scope(RolloutContext("ro-bench", "at-bench", sink)):

        async def main() -> tuple[list[Any], list[Any]]:
            client = AsyncOpenAI(base_url=fake.base_url, api_key="x", max_retries=0)
            model = OpenAIChatCompletionsModel(model="m", openai_client=client)
            agent = Agent(name="bench", instructions="be brief", model=model)
            return await _measure(agent, rounds, calls_per_block)

        with_capture, without = asyncio.run(main())
    sink.close()

    def median_ms(samples: list[tuple[float, float]], i: int) -> float:
        return statistics.median(s[i] for s in samples) * 1e3

    return {
        "openai_agents_overhead_ms_per_call": median_ms(with_capture, 1) - median_ms(without, 1),
        "openai_agents_overhead_wall_ms_per_call": median_ms(with_capture, 0) - median_ms(without, 0),
        "openai_agents_call_cpu_ms_with_capture": median_ms(with_capture, 1),
        "openai_agents_call_cpu_ms_without_capture": median_ms(without, 1),
        "openai_agents_spans_recorded": memory.spans,
    }


if __name__ == "__main__":
    for key, value in run().items():
        print(f"{key}={value:.4f}" if isinstance(value, float) else f"{key}={value}")
