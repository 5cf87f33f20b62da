"""A LangGraph app of two agents, ``writer`` then ``rewriter``: node names are the agent names agl records.

The trainer examples (``examples/howto/trainers.py``) train it; its reward is the quickstart's toy one that a tiny
random model can learn: the share of words of the final reply that start with a capital letter.

    python -m examples.howto.two_agents          # captured against a scripted model
"""

from __future__ import annotations

from typing import Any, TypedDict

from langchain_core.messages import HumanMessage
from langchain_openai import ChatOpenAI
from langgraph.graph import END, START, StateGraph
from pydantic import SecretStr

import agl
from examples.howto import scripted
from examples.quickstart.agent import capital_share

TASKS = [{"id": f"q{i}", "prompt": prompt} for i, prompt in enumerate(["Hello", "Say words", "Go", "Name a city"])]


class State(TypedDict):
    prompt: str
    draft: str
    reply: str


# --8<-- [start:graph]
from agl.integrations.langchain import AglCallbackHandler


def build_graph(model: ChatOpenAI) -> Any:
    """``writer`` drafts a reply, ``rewriter`` rewrites the draft: two agents, one model."""

    def writer(state: State) -> dict[str, str]:
        return {"draft": str(model.invoke([HumanMessage(state["prompt"])]).content)}

    def rewriter(state: State) -> dict[str, str]:
        return {"reply": str(model.invoke([HumanMessage(f"Rewrite in Title Case: {state['draft']}")]).content)}

    graph = StateGraph(State)
    graph.add_node("writer", writer)
    graph.add_node("rewriter", rewriter)
    graph.add_edge(START, "writer")
    graph.add_edge("writer", "rewriter")
    graph.add_edge("rewriter", END)
    return graph.compile()


def agent(task: dict[str, Any], resources: dict[str, Any]) -> float:
    llm: agl.LLM = resources["main_llm"]
    model = ChatOpenAI(base_url=llm.base_url, api_key=SecretStr(llm.api_key or "none"), model=llm.model)
    inputs = {"prompt": task["prompt"], "draft": "", "reply": ""}
    result = build_graph(model).invoke(inputs, config={"callbacks": [AglCallbackHandler()]})  # optional in agl
    return capital_share(result["reply"])


# --8<-- [end:graph]


def main(store: str = "sqlite:///runs/two-agents.db") -> agl.RolloutBatch:
    """The graph against a scripted model that answers every call in Title Case."""
    # --8<-- [start:evaluate]
    batch = scripted.evaluate(agent, agents="writer|rewriter", store=store, reply=scripted.title_case, tasks=TASKS)
    # --8<-- [end:evaluate]
    scripted.show(batch)
    return batch


if __name__ == "__main__":
    main()
