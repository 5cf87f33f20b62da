"""What tests/test_telemetry_isolation.py needs without importing any framework (runner processes and the test
process import this module): ``lazy_autogen_agent`` imports AutoGen only inside its first call, as an agent that
defers a heavy import would, so the runner cannot know before the rollout starts that AutoGen is in use; ``reply``
is the FakeLLM script of the crew in tests/agents_telemetry_crewai.py."""

from __future__ import annotations

from typing import Any

from agl.testing import FakeReply

#: The role of the one CrewAI agent of tests/agents_telemetry_crewai.py.
CREW_ROLE = "Solver"


def reply(body: dict[str, Any]) -> FakeReply:
    """FakeLLM script of the crew: a ReAct final answer repeating the task's tag."""
    user = next(str(m["content"]) for m in body["messages"] if m["role"] == "user")
    tag = user.split("[", 1)[1].split("]", 1)[0]
    return FakeReply(content=f"Thought: done\nFinal Answer: solved {tag}")


def lazy_autogen_agent(task: dict[str, Any], resources: dict[str, Any]) -> float:
    """The AutoGen app of tests/agents_autogen.py, imported on first use."""
    from tests.agents_autogen import autogen_agent

    return autogen_agent(task, resources)
