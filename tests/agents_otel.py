"""A LangGraph agent for tests/test_otel.py (module level: runner processes import it).

Graph: START → solver ⇄ tools (ToolNode[add]) → END. The solver's system prompt comes from the ``system_prompt``
resource (or an argument when it runs without agl). The fake model (``reply``) calls ``add`` first, then answers the
sum, but correctly only when the system prompt says "carefully": so APO has failures to learn from.
"""

from __future__ import annotations

import re
from typing import Any

from langchain_core.messages import HumanMessage, SystemMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition
from pydantic import SecretStr

from agl.testing import FakeReply

PROMPT = "Add the two numbers. {question}"
BETTER = "Add the two numbers carefully. {question}"
CRITIQUE = "The answers are off by one: the prompt should ask to add carefully."


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def reply(body: dict[str, Any]) -> FakeReply:
    """The fake model: a tool call to ``add``, then the sum (off by one unless the prompt says "carefully")."""
    messages = body["messages"]
    a, b = (int(x) for x in re.findall(r"-?\d+", messages[1]["content"])[:2])
    if messages[-1]["role"] != "tool":
        return FakeReply(tool_calls=[{"name": "add", "arguments": {"a": a, "b": b}}])
    total = int(messages[-1]["content"]) + (0 if "carefully" in messages[0]["content"] else 1)
    return FakeReply(content=f"The answer is {total}.")


def optimizer_reply(body: dict[str, Any]) -> FakeReply:
    """The fake optimizer: a critique, then one edited prompt."""
    text = body["messages"][-1]["content"]
    if CRITIQUE in text:  # the edit request quotes the critique
        return FakeReply(content=f'<prompt name="system_prompt">{BETTER}</prompt>')
    return FakeReply(content=CRITIQUE)


def solve(question: str, base_url: str, model: str, api_key: str, prompt: str) -> str:
    """Run the graph once; returns the final answer text."""
    llm = ChatOpenAI(base_url=base_url, api_key=SecretStr(api_key), model=model, max_retries=0).bind_tools([add])

    def solver(state: MessagesState) -> dict[str, Any]:
        return {"messages": [llm.invoke(state["messages"])]}

    graph = StateGraph(MessagesState)
    graph.add_node("solver", solver)
    graph.add_node("tools", ToolNode([add]))
    graph.add_edge(START, "solver")
    graph.add_conditional_edges("solver", tools_condition)
    graph.add_edge("tools", "solver")
    app = graph.compile()
    system = prompt.format(question=question)
    out = app.invoke({"messages": [SystemMessage(system), HumanMessage(question)]})
    return str(out["messages"][-1].content)


def score(answer: str, task: dict[str, Any]) -> float:
    return 1.0 if f"The answer is {task['a'] + task['b']}." == answer else 0.0


def agent(task: dict[str, Any], resources: dict[str, Any]) -> float:
    """The agent as agl runs it: prompt and model from the resources."""
    llm = resources["main_llm"]
    question = f"What is {task['a']} + {task['b']}?"
    answer = solve(question, llm.base_url, llm.model, llm.api_key, resources["system_prompt"].template)
    return score(answer, task)
