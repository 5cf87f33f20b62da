"""Agents run WITHOUT agl and traced by another tool, each in a process of its own (``python -m
tests.traced_elsewhere openinference|mlflow ...``): an instrumentor or autolog changes process-wide state (patched
clients, the OpenTelemetry and OpenAI Agents SDK trace providers), which must not leak into the tests' process.
Prints one JSON line with what the test needs to check the import against.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from agl.testing import FakeLLM


def openinference(phoenix: str, project: str, tasks_json: str, otlp_file: str) -> dict[str, Any]:
    """The LangGraph agent of ``tests.agents_otel`` traced by OpenInference's LangChain instrumentor into Phoenix and
    into ``otlp_file`` (OTLP JSON, OpenTelemetry's own encoder); returns the rewards, the root span ids and the span
    count."""
    from google.protobuf.json_format import MessageToDict
    from openinference.instrumentation.langchain import LangChainInstrumentor
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from tests import agents_otel as A

    provider = TracerProvider(resource=Resource.create({"openinference.project.name": project}))
    memory = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=f"{phoenix}/v1/traces")))
    provider.add_span_processor(SimpleSpanProcessor(memory))
    LangChainInstrumentor().instrument(tracer_provider=provider)
    rewards = []
    with FakeLLM(A.reply) as llm:
        for task in json.loads(tasks_json):
            answer = A.solve(f"What is {task['a']} + {task['b']}?", llm.base_url, "fake-model", "k", A.PROMPT)
            rewards.append(A.score(answer, task))
    provider.shutdown()
    spans = list(memory.get_finished_spans())
    Path(otlp_file).write_text(json.dumps(MessageToDict(encode_spans(spans))))
    roots = [f"{s.context.span_id:016x}" for s in spans if s.parent is None]
    return {"rewards": rewards, "roots": roots, "spans": len(spans)}


def mlflow(tracking_uri: str, experiment: str) -> dict[str, Any]:
    """The adding agent of ``tests.test_otel_mlflow`` traced by MLflow (OpenAI autolog, ``@mlflow.trace``) into
    ``tracking_uri``, with feedback logged per trace (``reward``) and on its first LLM span (``tool_choice``)."""
    import mlflow as mf
    import openai

    from tests.test_otel_mlflow import ADD_TOOL, PROMPT, TASKS, reply

    mf.set_tracking_uri(tracking_uri)
    mf.set_experiment(experiment_id=mf.create_experiment(experiment, artifact_location=str(Path.cwd())))
    mf.openai.autolog()
    runs: list[dict[str, Any]] = []
    with FakeLLM(reply) as llm:
        client = openai.OpenAI(base_url=llm.base_url, api_key="k", max_retries=0)

        @mf.trace(span_type="TOOL")
        def add(a: int, b: int) -> int:
            return a + b

        @mf.trace(name="solver", span_type="AGENT")
        def solve(question: str) -> tuple[str, list[tuple[int, int]]]:
            messages: list[dict[str, Any]] = [
                {"role": "system", "content": PROMPT.format(question=question)},
                {"role": "user", "content": question},
            ]
            first = client.chat.completions.create(model="fake-model", messages=messages, tools=[ADD_TOOL])  # type: ignore[arg-type,list-item]
            call = first.choices[0].message.tool_calls[0]  # type: ignore[index]
            result = add(**json.loads(call.function.arguments))  # type: ignore[union-attr]
            messages += [
                first.choices[0].message.model_dump(exclude_none=True),
                {"role": "tool", "tool_call_id": call.id, "content": str(result)},
            ]
            second = client.chat.completions.create(model="fake-model", messages=messages)  # type: ignore[arg-type]
            usage = [(r.usage.prompt_tokens, r.usage.completion_tokens) for r in (first, second)]  # type: ignore[union-attr]
            return str(second.choices[0].message.content), usage

        for task in TASKS:
            answer, usage = solve(f"What is {task['a']} + {task['b']}?")
            trace_id = mf.get_last_active_trace_id()
            reward = 1.0 if answer == f"The answer is {task['a'] + task['b']}." else 0.0
            runs.append({"trace_id": trace_id, "reward": reward, "usage": usage, "answer": answer})
    mf.flush_trace_async_logging()
    source = mf.entities.AssessmentSource(source_type="HUMAN", source_id="reviewer")
    for run in runs:
        mf.log_feedback(trace_id=run["trace_id"], name="reward", value=run["reward"], source=source)
        first_llm = mf.get_trace(run["trace_id"]).search_spans(span_type="CHAT_MODEL")[0]
        mf.log_feedback(
            trace_id=run["trace_id"], name="tool_choice", value=True, source=source, span_id=first_llm.span_id
        )
    return {"runs": runs}


def run_elsewhere(cwd: Path, *args: str) -> dict[str, Any]:
    """Run this module with ``args`` in a process of its own (from the tests); its JSON answer."""
    import os
    import subprocess

    root = Path(__file__).resolve().parent.parent
    env = {
        **os.environ,
        "PYTHONPATH": str(root),
        "MLFLOW_DISABLE_TELEMETRY": "true",
        "MLFLOW_ENABLE_ASYNC_TRACE_LOGGING": "false",
    }
    env.pop("OTEL_SDK_DISABLED", None)  # the CrewAI tests' agents switch the SDK off in the tests' process
    done = subprocess.run(
        [sys.executable, "-m", "tests.traced_elsewhere", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, f"the traced agent failed:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
    answer: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return answer


if __name__ == "__main__":
    tool, *rest = sys.argv[1:]
    print(json.dumps(openinference(*rest) if tool == "openinference" else mlflow(*rest)))
