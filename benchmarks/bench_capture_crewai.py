"""Capture overhead of the CrewAI integration per LLM call, in the agent's process.

A one-agent, one-task crew whose model (the fake LLM, instant replies) answers at once, so every kickoff is exactly
one LLM call and every crew, task and agent span is charged to it (the dearest case). Kickoffs inside a rollout
whose spans go to an in-memory sink (capture on) alternate one by one with kickoffs outside any rollout (capture off:
the installed hooks return after one check); the overhead is the difference of the median per-call times. The headline
figure is CPU time of the calling thread (the crew, its events and agl's capture run there; the fake LLM answers
from other threads), which stays stable on a loaded machine; wall-clock figures are printed too. The model is NOT
served through the gateway here, so every call is recorded as a full ``llm`` span (request messages copied): the
dearer of the two paths. CrewAI's own listeners are set aside (``scoped_handlers``) in both arms: they run in its
thread pool, and its console listener parks each task-start handler for up to 5 s when no console tree is shown,
which would hold the process at exit.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

# CrewAI must not reach the internet (telemetry, trace upload, first-run prompt).
for _name in ("CREWAI_DISABLE_TELEMETRY", "OTEL_SDK_DISABLED", "CREWAI_TESTING"):
    os.environ[_name] = "true"
os.environ["CREWAI_TRACING_ENABLED"] = "false"

from crewai import LLM, Agent, Crew, Task  # noqa: E402
from crewai.events import crewai_event_bus  # noqa: E402

from agl.core.emit import RolloutContext, SpanSink, rollout_scope  # noqa: E402
from agl.core.types import Span  # noqa: E402
from agl.integrations.crewai import activate  # noqa: E402
from agl.testing import FakeLLM  # noqa: E402


class _Memory:
    def __init__(self) -> None:
        self.spans = 0

    def add_spans(self, spans: list[Span]) -> int:
        self.spans += len(spans)
        return len(spans)


def _kickoff(agent: Agent, i: int) -> tuple[float, float]:
    """(wall seconds, CPU seconds of this thread) of one kickoff (one LLM call)."""
    task = Task(description=f"question {i}", expected_output="an answer", agent=agent)
    crew = Crew(agents=[agent], tasks=[task])
    wall, cpu = time.perf_counter(), time.thread_time()
    crew.kickoff()
    return time.perf_counter() - wall, time.thread_time() - cpu


def run(calls: int = 400, warmup: int = 30) -> dict[str, Any]:
    memory = _Memory()
    sink = SpanSink(memory)
    ctx = RolloutContext("ro-bench", "at-bench", sink)
    with_capture: list[tuple[float, float]] = []
    without: list[tuple[float, float]] = []
    with FakeLLM(lambda body: "Thought: easy\nFinal Answer: ok") as fake, crewai_event_bus.scoped_handlers():
        llm = LLM(model="m", provider="openai", base_url=fake.base_url, api_key="x", max_retries=0)
        agent = Agent(role="Answerer", goal="answer", backstory="brief", llm=llm)
        for i in range(warmup + 2 * calls):  # on and off alternate call by call, so drift hits both alike
            if i % 2:
                sample = _kickoff(agent, i)
            else:
                with rollout_scope(ctx), activate():
                    sample = _kickoff(agent, i)
            if i >= warmup:
                (without if i % 2 else with_capture).append(sample)
    sink.close()

    def median_ms(samples: list[tuple[float, float]], k: int) -> float:
        return statistics.median(s[k] for s in samples) * 1e3

    return {
        "crewai_overhead_ms_per_call": median_ms(with_capture, 1) - median_ms(without, 1),
        "crewai_overhead_wall_ms_per_call": median_ms(with_capture, 0) - median_ms(without, 0),
        "crewai_call_cpu_ms_with_capture": median_ms(with_capture, 1),
        "crewai_call_cpu_ms_without_capture": median_ms(without, 1),
        "crewai_spans_recorded": memory.spans,
    }


if __name__ == "__main__":
    for key, value in run().items():
        print(f"{key}={value:.4f}" if isinstance(value, float) else f"{key}={value}")
