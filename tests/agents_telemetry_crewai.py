"""A one-agent CrewAI crew for tests/test_telemetry_isolation.py (module level: runner processes import it; its
FakeLLM script is ``tests.agents_telemetry.reply``).

Unlike tests/agents_crewai.py it switches nothing off itself: what keeps CrewAI's telemetry quiet in a runner is
agl's doing. The agent records CrewAI's telemetry state at the end of its rollout as a ``telemetry.probe`` object.
"""

from __future__ import annotations

from typing import Any

from crewai import LLM, Agent, Crew, Task
from crewai.telemetry import Telemetry
from opentelemetry import trace

import agl
from tests.agents_telemetry import CREW_ROLE


def probe() -> dict[str, Any]:
    """CrewAI's telemetry in this process: whether it is ready to send, and whether its tracer provider (which
    exports to CrewAI's telemetry service) is OpenTelemetry's global one."""
    telemetry = Telemetry()
    crewai_provider = getattr(telemetry, "provider", None)
    return {
        "crewai_telemetry_ready": telemetry.ready,
        "crewai_provider_is_global": crewai_provider is not None and trace.get_tracer_provider() is crewai_provider,
    }


def crewai_agent(task: dict[str, Any], resources: dict[str, Any]) -> float:
    llm = resources["main_llm"]
    model = LLM(model=llm.model, provider="openai", base_url=llm.base_url, api_key=llm.api_key or "x", max_retries=0)
    solver = Agent(role=CREW_ROLE, goal="solve tasks", backstory="careful", llm=model)
    work = Task(description=f"[{task['id']}] solve it", expected_output="the solution", agent=solver)
    # verbose: a quiet crew leaves CrewAI's console listener waiting 5 s for a tree it never draws (crewai 1.6,
    # EventListener.on_task_started), which its process then waits for at exit; that is not telemetry
    output = Crew(agents=[solver], tasks=[work], verbose=True).kickoff()
    agl.emit_object("telemetry.probe", probe())
    return 1.0 if str(output.raw) == f"solved {task['id']}" else 0.0
