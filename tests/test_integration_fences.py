"""The fences around the integrations' private framework hooks: wrap once and undo, versions checked, never silent."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from agents.tracing import get_trace_provider

from agl.core.emit import RolloutContext, SpanSink, rollout_scope
from agl.integrations import langchain, openai_agents
from agl.integrations._capture import Integration
from agl.integrations._patch import ATTR_CAPTURE_DEGRADED, Patches, Verified
from tests.framework_harness import SpanList


class _Base:
    def run(self) -> str:
        return "base"


class _Child(_Base):
    def own(self) -> str:
        return "own"


def _tagging(original: Any) -> Any:
    def wrapped(self: Any) -> str:
        return "agl:" + (original(self) if original is not None else "none")

    return wrapped


def test_a_function_is_wrapped_once_however_often_and_undo_restores_what_each_class_had() -> None:
    patches = Patches("example")
    assert patches.wrap(_Child, "run", _tagging) and not patches.wrap(_Child, "run", _tagging)
    assert patches.wrap(_Child, "own", _tagging, own=True) and not patches.wrap(_Child, "own", _tagging, own=True)
    assert _Child().run() == "agl:base" and _Child().own() == "agl:own" and _Base().run() == "base"
    patches.undo()
    assert "run" not in vars(_Child), "an inherited function is inherited again, not copied onto the subclass"
    assert _Child().run() == "base" and _Child().own() == "own"
    assert patches.wrap(_Child, "run", _tagging), "after undo it can be wrapped again"
    patches.undo()


def test_a_missing_hook_is_logged_and_skipped(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="agl.integrations"):
        assert not Patches("example").wrap(_Child, "gone", _tagging)
    assert "_Child.gone is missing in this example version" in caplog.text


def test_versions_outside_the_verified_range_are_degraded_and_inside_it_are_not() -> None:
    inside = Verified("langchain-core", "1.0", "99")
    assert inside.installed is not None and inside.degraded() is None
    below = Verified("langchain-core", "99", "100")
    why = below.degraded()
    assert why is not None and f"langchain-core {below.installed}" in why and ">=99,<100" in why
    assert Verified("langchain-core", "0.1", "1.0").degraded() is not None, "the upper bound is exclusive"
    assert Verified("no-such-distribution-agl", "1", "2").degraded() is None, "not installed: nothing to capture"


def test_every_shipped_integration_is_verified_with_the_installed_framework() -> None:
    from agl.integrations import autogen, crewai

    for module in (langchain, openai_agents, autogen, crewai):
        verified = module._INTEGRATION.verified
        assert verified.installed is not None and verified.degraded() is None, verified


def test_capture_outside_the_verified_versions_warns_and_marks_every_rollout_it_captures(
    caplog: pytest.LogCaptureFixture,
) -> None:
    integration = Integration(
        verified=Verified("langchain-core", "0.1", "0.2"),
        scope_resolver=langchain._framework_scope,  # langchain's own: registering them again changes nothing
        tagger=langchain._RECORDER.tag,
    )
    spans = SpanList()
    sink = SpanSink(spans, interval=0.01)
    with caplog.at_level(logging.WARNING, logger="agl.integrations"):
        for rollout in ("ro-1", "ro-2"):
            with rollout_scope(RolloutContext(rollout, "at", sink)), integration.activate():
                pass
    sink.close()
    assert caplog.text.count("is outside the versions agl's capture was verified with") == 1, "warned once"
    marked = [s for s in spans.spans if ATTR_CAPTURE_DEGRADED in s.attributes]
    assert sorted(s.rollout_id for s in marked) == ["ro-1", "ro-2"]
    assert "langchain-core" in marked[0].attributes[ATTR_CAPTURE_DEGRADED]


def test_an_sdk_without_the_processor_list_is_refused_rather_than_left_exporting(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A changed SDK (its trace provider no longer keeps ``_multi_processor._processors``) would leave its OpenAI
    exporter on beside agl's processor: install refuses, unless framework telemetry is kept on purpose."""
    provider = get_trace_provider()
    multi = provider._multi_processor  # type: ignore[attr-defined]
    kept = multi._processors
    monkeypatch.delenv("AGL_KEEP_FRAMEWORK_TELEMETRY", raising=False)
    try:
        del multi._processors
        with pytest.raises(RuntimeError, match="cannot take the OpenAI Agents SDK's exporter off"):
            openai_agents.install()
    finally:
        multi._processors = kept
    openai_agents.install()
    assert openai_agents._PROCESSOR in multi._processors
