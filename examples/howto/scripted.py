"""The scripted model the how-to examples run against, so that each runs as written with no model to download.

``solve_with_add`` is an OpenAI-compatible model that asks for the tool ``add`` on the two numbers of the user's
question, then answers with the tool's result; ``evaluate`` runs an agent on tasks against it, in runner processes,
and returns what agl captured.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

import agl
from agl.testing import FakeLLM, FakeReply

#: Tasks every capture example solves: two numbers to add, and the answer.
TASKS = [
    {"id": "t1", "question": "What is 2 + 3?", "answer": "5"},
    {"id": "t2", "question": "What is 4 + 4?", "answer": "8"},
]


def solve_with_add(body: dict[str, Any]) -> FakeReply:
    """A tool call ``add(a, b)`` for the question's numbers, then ``The answer is <the tool's result>.``."""
    messages = body["messages"]
    results = [str(m["content"]) for m in messages if m["role"] == "tool"]
    if results:
        return FakeReply(content=f"The answer is {results[-1]}.")
    question = next(str(m["content"]) for m in reversed(messages) if m["role"] == "user")
    a, b = (int(x) for x in re.findall(r"\d+", question)[:2])
    return FakeReply(tool_calls=[{"name": "add", "arguments": {"a": a, "b": b}}])


def title_case(body: dict[str, Any]) -> FakeReply:
    """Every call answered ``Paris Is The Capital``."""
    return FakeReply(content="Paris Is The Capital")


def evaluate(
    agent: Callable[..., Any],
    agents: str | Sequence[str],
    store: str,
    reply: Callable[[dict[str, Any]], FakeReply] = solve_with_add,
    tasks: Sequence[dict[str, Any]] = TASKS,
) -> agl.RolloutBatch:
    """``agent`` on ``tasks`` in two runner processes, its model scripted by ``reply``; ``agents`` are the agent names
    whose calls become transitions."""
    with FakeLLM(reply) as fake:
        resources: dict[str, Any] = {"main_llm": agl.LLM(base_url=fake.base_url, model="scripted")}
        with agl.Trainer(n_runners=2, store=store, agents=agents, resources=resources) as trainer:
            return trainer.evaluate(agent, tasks)


def show(batch: agl.RolloutBatch) -> None:
    """Print a batch's summary and each rollout's calls (agent, response token ids, reward)."""
    print(batch.summary)
    for trajectory in batch.trajectories:
        print(trajectory.task_id, [(t.agent, len(t.response_ids), t.reward) for t in trajectory.transitions])
