"""Capture overhead of the CrewAI integration per LLM call, in the agent's process.

A one-agent, one-task crew whose model (the fake LLM, instant replies) answers at once, so every kickoff is exactly
one LLM call and every crew, task and agent span is charged to it (the dearest case). Kickoffs inside a rollout
whose spans go to an in-memory sink (capture on) alternate, in blocks of one by default, with kickoffs outside any
rollout (capture off: the installed hooks return after one check); timing and figures as in
:mod:`benchmarks._capture` (the crew, its events and agl's capture run in the calling thread). The model is NOT
served through the gateway here, so every call is recorded as a full ``llm`` span (request messages copied): the
dearer of the two paths. CrewAI's own listeners are set aside (``scoped_handlers``) in both arms: they run in its
thread pool, and its console listener parks each task-start handler for up to 5 s when no console tree is shown,
which would hold the process at exit.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

# CrewAI must not reach the internet (telemetry, trace upload, first-run prompt).
for _name in ("CREWAI_DISABLE_TELEMETRY", "OTEL_SDK_DISABLED", "CREWAI_TESTING"):
    os.environ[_name] = "true"
os.environ["CREWAI_TRACING_ENABLED"] = "false"

from crewai import LLM, Agent, Crew, Task  # noqa: E402
from crewai.events import crewai_event_bus  # noqa: E402

from agl.core.emit import rollout_scope  # noqa: E402
from agl.integrations.crewai import activate  # noqa: E402
from agl.testing import FakeLLM  # noqa: E402
from benchmarks._capture import Sample, SpanCounter, compare, print_report, report, time_calls  # noqa: E402


def run(rounds: int = 400, calls_per_block: int = 1) -> dict[str, Any]:
    counter = SpanCounter()
    with FakeLLM(lambda body: "Thought: easy\nFinal Answer: ok") as fake, crewai_event_bus.scoped_handlers():
        llm = LLM(model="m", provider="openai", base_url=fake.base_url, api_key="x", max_retries=0)
        agent = Agent(role="Answerer", goal="answer", backstory="brief", llm=llm)

        def block(capture: bool, n: int) -> Sample:
            tasks = [Task(description=f"question {i}", expected_output="an answer", agent=agent) for i in range(n)]
            crews = [Crew(agents=[agent], tasks=[task]) for task in tasks]  # built outside the timed calls
            if not capture:
                return time_calls(lambda i: crews[i].kickoff(), n)
            with rollout_scope(counter.context), activate():
                return time_calls(lambda i: crews[i].kickoff(), n)

        samples = compare(block, rounds, calls_per_block, warmup=15)
    return report("crewai", samples, counter.close())


if __name__ == "__main__":
    print_report(run())
