"""Third-party telemetry in runner processes: what agl switches off, and how to keep it.

A runner runs the user's agent inside the capture scopes of the frameworks it uses. What such a framework sends to
its vendor on its own would carry the agent's data (agent roles, tool names, trace contents), and an exporter that
cannot reach its service holds the process at exit. So inside runner processes agl switches off the exporters the
frameworks it has integrations for turn on by default:

- **CrewAI** (checked against crewai 1.6): ``crewai.telemetry.Telemetry`` builds an OpenTelemetry ``TracerProvider``
  exporting to telemetry.crewai.com and installs it as OpenTelemetry's *global* provider when ``crewai`` is imported
  (so every other library's OpenTelemetry spans, AutoGen's included, would go there too), and ``import crewai`` sends
  an install ping to api.scarf.sh. Both are off when ``CREWAI_DISABLE_TELEMETRY=true``, which crewai reads when it is
  imported (``Telemetry.__init__``, ``crewai._track_install_async``) and again before each telemetry operation
  (``Telemetry._should_execute_telemetry``). Runner processes set it before the agent is imported
  (:func:`quiet_framework_telemetry`). When crewai got imported before that anyway (a spawned runner re-imports the
  trainer script's ``__main__``), the CrewAI integration turns the telemetry off when it is activated and shuts
  crewai's provider down if it became the global one.
- **OpenAI Agents SDK**: the SDK's default trace processor exports every trace to OpenAI's platform when an API key
  is set. The integration removes that one processor from the SDK's trace provider; tracing itself stays on, because
  agl's own processor captures the SDK's spans (``OPENAI_AGENTS_DISABLE_TRACING`` / ``set_tracing_disabled`` would
  end capture too, so agl never sets them).
- **AutoGen** exports nothing itself: its agents and tools open OpenTelemetry spans on the global provider, which
  goes nowhere unless the program installed one.
- Left as the user set them, because they are opt-in: LangSmith tracing (``LANGSMITH_TRACING`` /
  ``LANGCHAIN_TRACING_V2``), CrewAI's trace upload (``CREWAI_TRACING_ENABLED`` or consent stored by crewai), and any
  OpenTelemetry tracer provider the program installs itself. agl never sets ``OTEL_SDK_DISABLED``, which would
  switch off the user's own OpenTelemetry too.

A switch the user set in the environment is never overwritten. ``AGL_KEEP_FRAMEWORK_TELEMETRY=1`` keeps every
framework's telemetry as the framework has it. Frameworks a runner does not use are not imported at all (see
``agl.core.integration_scopes.integration_scopes``).

This module imports nothing: the switches must be in place before any framework is.
"""

from __future__ import annotations

import os

__all__ = [
    "FRAMEWORK_TELEMETRY_OFF",
    "KEEP_FRAMEWORK_TELEMETRY",
    "keep_framework_telemetry",
    "quiet_framework_telemetry",
]

#: Set to 1 (or true / yes) to keep the frameworks' own telemetry in runner processes.
KEEP_FRAMEWORK_TELEMETRY = "AGL_KEEP_FRAMEWORK_TELEMETRY"

#: Environment switches that turn a framework's default telemetry off, set in runner processes before the agent is
#: imported (exporters without one are switched off by their integration when it is activated).
FRAMEWORK_TELEMETRY_OFF: dict[str, str] = {"CREWAI_DISABLE_TELEMETRY": "true"}


def keep_framework_telemetry() -> bool:
    """Whether the user asked to keep the frameworks' own telemetry (``AGL_KEEP_FRAMEWORK_TELEMETRY``)."""
    return os.environ.get(KEEP_FRAMEWORK_TELEMETRY, "").strip().lower() in ("1", "true", "yes")


def quiet_framework_telemetry() -> dict[str, str]:
    """Set the switches of :data:`FRAMEWORK_TELEMETRY_OFF` this process's environment lacks; returns those it set.

    Call it before any framework is imported (runner processes do, first thing). Nothing is set when
    ``AGL_KEEP_FRAMEWORK_TELEMETRY`` asks to keep the telemetry, and a switch already set is left as it is.
    """
    if keep_framework_telemetry():
        return {}
    added = {name: value for name, value in FRAMEWORK_TELEMETRY_OFF.items() if name not in os.environ}
    os.environ.update(added)
    return added
