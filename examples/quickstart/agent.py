"""The quickstart's agent: a one-node LangGraph app that answers a prompt through ChatOpenAI.

It holds no agl code but its reward: inside a rollout, agl's LangChain integration captures the graph's model calls
by itself, each under the name of the node that made it (``answer``). The reward is a toy one that a tiny random model
can learn in a minute: the share of words in the reply that start with a capital letter.
"""

from __future__ import annotations

from typing import Any, TypedDict

from langchain_core.messages import HumanMessage
from langchain_openai import ChatOpenAI
from langgraph.graph import END, START, StateGraph
from pydantic import SecretStr

import agl

TASKS = [{"id": f"q{i}", "prompt": prompt} for i, prompt in enumerate(["Hello", "Say words", "Go", "Name a city"])]


class State(TypedDict):
    prompt: str
    reply: str


def capital_share(text: str) -> float:
    """The share of the words of ``text`` that start with an upper-case letter (0 for none)."""
    words = text.split()
    return sum(word[:1].isupper() for word in words) / len(words) if words else 0.0


def answer_in_capitals(task: dict[str, Any], resources: dict[str, Any]) -> float:
    """One rollout: run the graph on the task's prompt with the model agl hands in; the reward is returned."""
    llm: agl.LLM = resources["main_llm"]  # in a rollout: agl's gateway, which records the exact token ids
    model = ChatOpenAI(base_url=llm.base_url, api_key=SecretStr(llm.api_key or "none"), model=llm.model, max_retries=0)

    def answer(state: State) -> dict[str, str]:
        return {"reply": str(model.invoke([HumanMessage(state["prompt"])]).content)}

    graph = StateGraph(State)
    graph.add_node("answer", answer)
    graph.add_edge(START, "answer")
    graph.add_edge("answer", END)
    result = graph.compile().invoke({"prompt": task["prompt"], "reply": ""})
    return capital_share(result["reply"])
