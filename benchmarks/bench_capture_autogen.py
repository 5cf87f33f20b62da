"""Capture overhead of the AutoGen integration per LLM call, in the agent's process.

An ``AssistantAgent`` (``OpenAIChatCompletionClient``) answers one task per ``run`` (one LLM call each) against the fake
LLM (instant replies), inside a rollout whose spans go to an in-memory sink; the agent is reset between runs so every
prompt is the same size. Blocks of runs with capture installed alternate with blocks after
:func:`agl.integrations.autogen.uninstall` (AutoGen's own functions back); the overhead is the difference of the median
per-call times. The headline figure is CPU time of the calling thread (the event loop runs there; the fake LLM answers
from other threads), which stays stable on a loaded machine; wall-clock figures are printed too. The model is NOT
served through the gateway here, so every call is recorded as a full ``llm`` span (messages converted) plus an
``agent`` span: the dearer of the two paths.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from autogen_agentchat.agents import AssistantAgent
from autogen_core import CancellationToken
from autogen_core.models import ModelInfo
from autogen_ext.models.openai import OpenAIChatCompletionClient

from agl.core.emit import RolloutContext, SpanSink, rollout_scope
from agl.core.types import Span
from agl.integrations.autogen import install, uninstall
from agl.testing import FakeLLM

MODEL_INFO = ModelInfo(
    vision=False, function_calling=True, json_output=False, family="unknown", structured_output=False
)


class _Memory:
    def __init__(self) -> None:
        self.spans = 0

    def add_spans(self, spans: list[Span]) -> int:
        self.spans += len(spans)
        return len(spans)


async def _block(agent: AssistantAgent, n: int) -> tuple[float, float]:
    """(wall seconds, CPU seconds of this thread) per call over ``n`` agent runs (one LLM call each)."""
    token = CancellationToken()
    wall, cpu = time.perf_counter(), time.thread_time()
    for i in range(n):
        await agent.run(task=f"question {i}")
        await agent.on_reset(token)
    return (time.perf_counter() - wall) / n, (time.thread_time() - cpu) / n


async def _measure(base_url: str, rounds: int, calls_per_block: int) -> tuple[list[Any], list[Any]]:
    client = OpenAIChatCompletionClient(base_url=base_url, model="m", api_key="x", model_info=MODEL_INFO, max_retries=0)
    agent = AssistantAgent("bench", client, system_message="be brief")
    install()
    await _block(agent, 50)
    uninstall()
    await _block(agent, 50)
    with_capture: list[tuple[float, float]] = []
    without: list[tuple[float, float]] = []
    for r in range(rounds):
        for capture in (r % 2 == 0, r % 2 == 1):
            if capture:
                install()
                with_capture.append(await _block(agent, calls_per_block))
                uninstall()
            else:
                without.append(await _block(agent, calls_per_block))
    await client.close()
    return with_capture, without


def run(rounds: int = 15, calls_per_block: int = 100) -> dict[str, Any]:
    memory = _Memory()
    sink = SpanSink(memory)
    with FakeLLM(lambda body: "ok") as fake, rollout_scope(RolloutContext("ro-bench", "at-bench", sink)):
        with_capture, without = asyncio.run(_measure(fake.base_url, rounds, calls_per_block))
    sink.close()

    def median_ms(samples: list[tuple[float, float]], i: int) -> float:
        return statistics.median(s[i] for s in samples) * 1e3

    return {
        "autogen_overhead_ms_per_call": median_ms(with_capture, 1) - median_ms(without, 1),
        "autogen_overhead_wall_ms_per_call": median_ms(with_capture, 0) - median_ms(without, 0),
        "autogen_call_cpu_ms_with_capture": median_ms(with_capture, 1),
        "autogen_call_cpu_ms_without_capture": median_ms(without, 1),
        "autogen_spans_recorded": memory.spans,
    }


if __name__ == "__main__":
    for key, value in run().items():
        print(f"{key}={value:.4f}" if isinstance(value, float) else f"{key}={value}")
