"""emit_* attach to the current rollout from the agent's own threads and asyncio tasks, and do nothing outside one."""

from __future__ import annotations

import asyncio
import math
import threading

import pytest

import agl
from agl.core.emit import RolloutContext, SpanSink, agent_scope, rollout_scope, span_scope
from agl.core.types import Span


class ListWriter:
    def __init__(self, fail_times: int = 0) -> None:
        self.spans: list[Span] = []
        self.fail_times = fail_times

    def add_spans(self, spans: list[Span]) -> int:
        if self.fail_times:
            self.fail_times -= 1
            raise ConnectionError("store down")
        self.spans.extend(spans)
        return len(spans)


def _ctx(writer: ListWriter) -> RolloutContext:
    return RolloutContext("ro-1", "at-1", SpanSink(writer, interval=0.01))


def test_emits_outside_a_rollout_are_noops() -> None:
    assert agl.current_rollout() is None
    assert agl.emit_reward(1.0) is None
    assert agl.emit_message("hi") is None
    assert agl.emit_object("x", {"a": 1}) is None
    assert agl.emit_exception(ValueError("x")) is None
    with span_scope("tool", "t") as attrs:
        attrs["x"] = 1


def test_emit_reward_validates_value() -> None:
    for bad in (math.nan, math.inf, "1", True, None):
        with pytest.raises(ValueError, match="finite number"):
            agl.emit_reward(bad)  # type: ignore[arg-type]


def test_emits_from_threads_and_tasks_reach_the_rollout() -> None:
    writer = ListWriter()
    ctx = _ctx(writer)

    async def in_task() -> None:
        agl.emit_reward(0.5, name="task")

    with rollout_scope(ctx):
        agl.emit_reward(0.25, name="main")
        t = threading.Thread(target=lambda: agl.emit_reward(0.75, name="thread"))
        t.start()
        t.join()
        asyncio.run(in_task())
        with agent_scope("writer"):
            agl.emit_message("from writer")
    ctx.sink.close()
    names = sorted(s.name for s in writer.spans if s.kind == "reward")
    assert names == ["main", "task", "thread"]
    assert all(s.rollout_id == "ro-1" and s.attempt_id == "at-1" for s in writer.spans)
    msg = next(s for s in writer.spans if s.kind == "message")
    assert msg.agent == "writer" and msg.attributes["agl.message"] == "from writer"
    assert agl.current_rollout() is None


def test_span_scope_nests_and_records_errors() -> None:
    writer = ListWriter()
    ctx = _ctx(writer)
    with rollout_scope(ctx), span_scope("agent", "outer", agent="planner"):
        agl.emit_reward(1.0)
        with pytest.raises(KeyError), span_scope("tool", "lookup"):
            raise KeyError("missing")
    ctx.sink.close()
    by_name = {s.name: s for s in writer.spans}
    assert by_name["reward"].parent_id == by_name["outer"].span_id
    assert by_name["reward"].agent == "planner"
    assert by_name["lookup"].parent_id == by_name["outer"].span_id
    assert by_name["lookup"].status == "error" and by_name["lookup"].attributes["error.type"] == "KeyError"


def test_sink_keeps_spans_when_the_store_is_briefly_down() -> None:
    writer = ListWriter(fail_times=1)
    sink = SpanSink(writer, interval=10)
    ctx = RolloutContext("ro", "at", sink)
    for i in range(5):
        ctx.record("custom", f"s{i}")
    with pytest.raises(ConnectionError):
        sink.flush()
    sink.close()
    assert [s.name for s in writer.spans] == [f"s{i}" for i in range(5)]
