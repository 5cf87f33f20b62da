"""Capture overhead of the LangChain/LangGraph integration per LLM call, in the agent's process.

A one-node LangGraph graph calls ``ChatOpenAI`` against the fake LLM (instant replies) inside a rollout whose spans go
to an in-memory sink. Blocks of calls with the handler attached (what the zero-config hook attaches inside runners)
alternate with blocks without it; timing and figures as in :mod:`benchmarks._capture` (the graph runs in the calling
thread). The model is NOT served through the gateway here, so every call is recorded as a full ``llm`` span (messages
converted): the dearer of the two paths. The figure includes LangChain's own cost of dispatching callbacks to a
handler.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, TypedDict

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from langchain_core.runnables import RunnableConfig
from langchain_openai import ChatOpenAI
from langgraph.graph import END, START, StateGraph
from pydantic import SecretStr

from agl.core.emit import rollout_scope
from agl.integrations.langchain import AglCallbackHandler
from agl.testing import FakeLLM
from benchmarks._capture import Sample, SpanCounter, compare, print_report, report, time_calls


class _State(TypedDict):
    question: str
    answer: str


def run(rounds: int = 15, calls_per_block: int = 100) -> dict[str, Any]:
    counter = SpanCounter()
    with FakeLLM(lambda body: "ok") as fake, rollout_scope(counter.context):
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

        def block(capture: bool, n: int) -> Sample:
            config = on if capture else off
            return time_calls(lambda i: graph.invoke({"question": f"question {i}", "answer": ""}, config), n)

        samples = compare(block, rounds, calls_per_block, warmup=50)
    return report("langchain", samples, counter.close())


if __name__ == "__main__":
    print_report(run())
