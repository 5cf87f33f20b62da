"""A multi-agent LangGraph app used by tests/test_langgraph.py (module level: runner processes import it).

Graph (the same shape sync and async)::

    START → planner → (researcher ‖ writer) → solver → judge → END
    solver = subgraph: START → agent ⇄ tools (ToolNode[add]) → END

``researcher`` streams the model, ``writer`` calls it plainly; the two run in parallel (LangGraph's thread pool with
``invoke``, asyncio tasks with ``ainvoke``). ``add`` and ``judge`` emit rewards. No agl-specific code besides
``agl.emit_reward``: capture is automatic inside a rollout.
"""

from __future__ import annotations

import asyncio
import operator
import re
import time
from typing import Annotated, Any, TypedDict

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AnyMessage, HumanMessage, SystemMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.graph.state import CompiledStateGraph
from langgraph.prebuilt import ToolNode, tools_condition
from pydantic import SecretStr

import agl
from agl.testing import FakeReply

#: The agent names capture must give each role's LLM calls (see agl.integrations.langchain's naming rule).
AGENT_OF_ROLE = {"planner": "planner", "researcher": "researcher", "writer": "writer", "solver": "solver/agent"}


class State(TypedDict):
    task: dict[str, Any]
    notes: Annotated[list[str], operator.add]
    answer: str


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    if a < 0:
        raise ValueError(f"add refuses negative input {a}")
    agl.emit_reward(0.1, name="tool_ran")
    return a + b


def _prompt(role: str, task: dict[str, Any], extra: str = "") -> list[AnyMessage]:
    return [SystemMessage(f"ROLE {role}"), HumanMessage(f"[{task['id']}] {task['a']} + {task['b']} {extra}".strip())]


def reply(body: dict[str, Any]) -> FakeReply:
    """FakeLLM script: answers each role; the two parallel roles answer slowly so their calls overlap."""
    messages = body["messages"]
    role = messages[0]["content"].split()[-1]
    user = next(m["content"] for m in messages if m["role"] == "user")
    if role in ("researcher", "writer"):
        time.sleep(0.15)
    if role != "solver":
        return FakeReply(content=f"{role} notes for {user}")
    tool_results = [m["content"] for m in messages if m["role"] == "tool"]
    if tool_results:
        return FakeReply(content=f"The answer is {tool_results[-1]}.")
    a, b = (int(x) for x in re.findall(r"-?\d+", user.split("]", 1)[1])[:2])
    return FakeReply(tool_calls=[{"name": "add", "arguments": {"a": a, "b": b}}])


def _solver(model: BaseChatModel, is_async: bool) -> CompiledStateGraph:
    """The nested agent: a tool-calling loop over ``add``."""
    bound = model.bind_tools([add])

    def agent(state: MessagesState) -> dict[str, Any]:
        return {"messages": [bound.invoke(state["messages"])]}

    async def aagent(state: MessagesState) -> dict[str, Any]:
        return {"messages": [await bound.ainvoke(state["messages"])]}

    g = StateGraph(MessagesState)
    g.add_node("agent", aagent if is_async else agent)
    g.add_node("tools", ToolNode([add]))
    g.add_edge(START, "agent")
    g.add_conditional_edges("agent", tools_condition)
    g.add_edge("tools", "agent")
    return g.compile()


def build_graph(model: BaseChatModel, is_async: bool) -> CompiledStateGraph:
    """The multi-agent graph, with sync or async node functions."""
    solver_graph = _solver(model, is_async)

    def solver_input(state: State) -> dict[str, Any]:
        return {"messages": _prompt("solver", state["task"], "use the add tool")}

    def judge(state: State) -> dict[str, Any]:
        agl.emit_reward(0.5, name="judged")
        return {}

    async def aplanner(state: State) -> dict[str, Any]:
        return {"notes": [str((await model.ainvoke(_prompt("planner", state["task"]))).content)]}

    async def aresearcher(state: State) -> dict[str, Any]:
        parts = [str(c.content) async for c in model.astream(_prompt("researcher", state["task"]))]
        return {"notes": ["".join(parts)]}

    async def awriter(state: State) -> dict[str, Any]:
        return {"notes": [str((await model.ainvoke(_prompt("writer", state["task"]))).content)]}

    async def asolver(state: State) -> dict[str, Any]:
        out = await solver_graph.ainvoke(solver_input(state))
        return {"answer": str(out["messages"][-1].content)}

    def planner(state: State) -> dict[str, Any]:
        return {"notes": [str(model.invoke(_prompt("planner", state["task"])).content)]}

    def researcher(state: State) -> dict[str, Any]:
        parts = [str(c.content) for c in model.stream(_prompt("researcher", state["task"]))]
        return {"notes": ["".join(parts)]}

    def writer(state: State) -> dict[str, Any]:
        return {"notes": [str(model.invoke(_prompt("writer", state["task"])).content)]}

    def solver(state: State) -> dict[str, Any]:
        out = solver_graph.invoke(solver_input(state))
        return {"answer": str(out["messages"][-1].content)}

    g = StateGraph(State)
    if is_async:
        g.add_node("planner", aplanner)
        g.add_node("researcher", aresearcher)
        g.add_node("writer", awriter)
        g.add_node("solver", asolver)
    else:
        g.add_node("planner", planner)
        g.add_node("researcher", researcher)
        g.add_node("writer", writer)
        g.add_node("solver", solver)
    g.add_node("judge", judge)
    g.add_edge(START, "planner")
    g.add_edge("planner", "researcher")
    g.add_edge("planner", "writer")
    g.add_edge(["researcher", "writer"], "solver")
    g.add_edge("solver", "judge")
    g.add_edge("judge", END)
    return g.compile()


def run_graph(
    task: dict[str, Any], base_url: str, api_key: str = "x", model_name: str = "m", callbacks: list[Any] | None = None
) -> State:
    """Run the graph for one task against an OpenAI-compatible endpoint (sync or async as the task says)."""
    is_async = task.get("mode") == "async"
    model = ChatOpenAI(base_url=base_url, api_key=SecretStr(api_key), model=model_name, max_retries=0)
    graph = build_graph(model, is_async)
    start: State = {"task": task, "notes": [], "answer": ""}
    config: RunnableConfig = {"callbacks": callbacks} if callbacks else {}
    if is_async:
        return asyncio.run(graph.ainvoke(start, config))  # type: ignore[return-value]
    return graph.invoke(start, config)  # type: ignore[return-value]


def langgraph_agent(task: dict[str, Any], resources: dict[str, Any]) -> float:
    """The agent as agl runs it: a plain LangGraph app on the LLM resource it was handed.

    A task with ``direct_url`` bypasses the gateway (calls the model there instead), as a misconfigured agent would.
    """
    llm = resources["main_llm"]
    state = run_graph(task, task.get("direct_url") or llm.base_url, llm.api_key, llm.model)
    return 1.0 if f"The answer is {task['a'] + task['b']}." == state["answer"] else 0.0
