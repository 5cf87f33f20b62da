"""Capture overhead of the LangChain/LangGraph integration per LLM call, in the agent's process.

A one-node LangGraph graph calls ``ChatOpenAI`` against the fake LLM (instant replies) inside a rollout whose spans go
to an in-memory sink. Blocks of calls with the handler attached (what the zero-config hook attaches inside runners)
alternate with blocks without it; the overhead is the difference of the median per-call times. The headline figure
is CPU time of the calling thread (the graph runs there; the fake LLM answers from other threads), which stays
stable on a loaded machine; wall-clock figures are printed too. The model is NOT served through the gateway here,
so every call is recorded as a full ``llm`` span (messages converted): the dearer of the two paths. The figure
includes LangChain's own cost of dispatching callbacks to a handler.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path
from typing import Any, TypedDict

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from langchain_core.runnables import RunnableConfig
from langchain_openai import ChatOpenAI
from langgraph.graph import END, START, StateGraph
from pydantic import SecretStr

from agl.core.emit import RolloutContext, SpanSink, rollout_scope
from agl.core.types import Span
from agl.integrations.langchain import AglCallbackHandler
from agl.testing import FakeLLM


class _Memory:
    def __init__(self) -> None:
        self.spans = 0

    def add_spans(self, spans: list[Span]) -> int:
        self.spans += len(spans)
        return len(spans)


class _State(TypedDict):
    question: str
    answer: str


def _block(graph: Any, n: int, config: RunnableConfig) -> tuple[float, float]:
    """(wall seconds, CPU seconds of this thread) per call over ``n`` graph runs (one LLM call each)."""
    wall, cpu = time.perf_counter(), time.thread_time()
    for i in range(n):
        graph.invoke({"question": f"question {i}", "answer": ""}, config)
    return (time.perf_counter() - wall) / n, (time.thread_time() - cpu) / n


def run(rounds: int = 15, calls_per_block: int = 100) -> dict[str, Any]:
    memory = _Memory()
    sink = SpanSink(memory)
    with FakeLLM(lambda body: "ok") as fake, rollout_scope(RolloutContext("ro-bench", "at-bench", sink)):
        model = ChatOpenAI(base_url=fake.base_url, api_key=SecretStr("x"), model="m", max_retries=0)

        def agent(state: _State) -> dict[str, Any]:
            return {"answer": str(model.invoke([("system", "be brief"), ("user", state["question"])]).content)}

        builder = StateGraph(_State)
        builder.add_node("agent", agent)
        builder.add_edge(START, "agent")
        builder.add_edge("agent", END)
        graph = builder.compile()
        on: RunnableConfig = {"callbacks": [AglCallbackHandler()]}
        off: RunnableConfig = {}
        _block(graph, 50, on)
        _block(graph, 50, off)
        with_capture: list[tuple[float, float]] = []
        without: list[tuple[float, float]] = []
        for r in range(rounds):
            first, second = (on, off) if r % 2 == 0 else (off, on)
            a, b = _block(graph, calls_per_block, first), _block(graph, calls_per_block, second)
            with_capture.append(a if first is on else b)
            without.append(b if first is on else a)
    sink.close()

    def median_ms(samples: list[tuple[float, float]], i: int) -> float:
        return statistics.median(s[i] for s in samples) * 1e3

    return {
        "langchain_overhead_ms_per_call": median_ms(with_capture, 1) - median_ms(without, 1),
        "langchain_overhead_wall_ms_per_call": median_ms(with_capture, 0) - median_ms(without, 0),
        "langchain_call_cpu_ms_with_capture": median_ms(with_capture, 1),
        "langchain_call_cpu_ms_without_capture": median_ms(without, 1),
        "langchain_spans_recorded": memory.spans,
    }


if __name__ == "__main__":
    for key, value in run().items():
        print(f"{key}={value:.4f}" if isinstance(value, float) else f"{key}={value}")
