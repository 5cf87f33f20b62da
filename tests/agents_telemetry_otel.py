"""The AutoGen app of tests/agents_autogen.py in a program that installs its own OpenTelemetry tracer provider at
import (an in-memory exporter standing in for the user's collector), for tests/test_telemetry_isolation.py. The agent
records at the end of its rollout whether that provider is still OpenTelemetry's global one and which spans reached
the user's exporter, as a ``telemetry.probe`` object."""

from __future__ import annotations

from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import agl
from tests.agents_autogen import autogen_agent

EXPORTER = InMemorySpanExporter()
PROVIDER = TracerProvider()
PROVIDER.add_span_processor(SimpleSpanProcessor(EXPORTER))
trace.set_tracer_provider(PROVIDER)


def user_otel_agent(task: dict[str, Any], resources: dict[str, Any]) -> float:
    reward = autogen_agent(task, resources)
    names = sorted({span.name for span in EXPORTER.get_finished_spans()})
    in_place = trace.get_tracer_provider() is PROVIDER
    agl.emit_object("telemetry.probe", {"user_provider_is_global": in_place, "spans": names})
    return reward
