"""emit_* attach to the current rollout from the agent's own threads and asyncio tasks, and do nothing outside one;
values are made JSON-safe where they are recorded; the span pipeline stores, retries, bounds and counts."""

from __future__ import annotations

import asyncio
import math
import threading
import time
from pathlib import Path

import pytest
from pydantic import TypeAdapter, ValidationError

import agl
from agl.core.emit import RolloutContext, SpanSink, agent_scope, rollout_scope, span_scope
from agl.core.span_pipeline import SpanPipeline, SpansNotStored
from agl.core.store.base import StoreUnavailable
from agl.core.store.sqlite import SqliteStore
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


def test_sink_retries_a_failed_write_and_keeps_every_span() -> None:
    writer = ListWriter(fail_times=1)
    sink = SpanSink(writer, interval=10)
    ctx = RolloutContext("ro", "at", sink)
    for i in range(5):
        ctx.record("custom", f"s{i}")
    sink.flush()  # the first write fails; the retry stores the batch, so flush succeeds
    assert [s.name for s in writer.spans] == [f"s{i}" for i in range(5)]
    sink.close()
    assert sink.dropped == 0 and len(writer.spans) == 5


def test_sink_counts_and_reports_spans_it_could_not_store() -> None:
    writer = ListWriter(fail_times=1_000)
    sink = SpanSink(writer, interval=0.01)
    ctx = RolloutContext("ro", "at", sink)
    for i in range(3):
        ctx.record("custom", f"s{i}")
    with pytest.raises(SpansNotStored, match="3 spans could not be stored: ConnectionError: store down") as lost:
        sink.close()
    assert sink.dropped == 3 and lost.value.dropped == 3 and writer.spans == []


class StoreGoneWriter:
    """A store that already retried for as long as it was told to, then gave up."""

    def __init__(self) -> None:
        self.calls = 0

    def add_spans(self, spans: list[Span]) -> int:
        self.calls += 1
        raise StoreUnavailable("agl server at http://127.0.0.1:1 unavailable for 60s")


def test_a_store_that_gave_up_is_not_retried_on_top_of_its_own_retries() -> None:
    writer = StoreGoneWriter()
    sink = SpanSink(writer, interval=0.01)
    RolloutContext("ro", "at", sink).record("custom", "s")
    with pytest.raises(SpansNotStored, match="unavailable for 60s"):
        sink.close()
    assert writer.calls == 1 and sink.dropped == 1


def test_sink_writes_on_its_interval_without_a_flush(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "s.db")
    sink = SpanSink(store, interval=0.2)
    span = RolloutContext("ro-1", "at-1", sink).record("custom", "x")
    deadline = time.monotonic() + 30.0  # the loop ends when the write lands; the bound only stops a hang
    while not store.query_spans(rollout_id="ro-1") and time.monotonic() < deadline:
        time.sleep(0.01)
    assert [s.span_id for s in store.query_spans(rollout_id="ro-1")] == [span.span_id]
    sink.close()
    store.close()


def test_emit_object_with_a_non_json_value_keeps_the_rollouts_other_spans(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "s.db")
    ctx = RolloutContext("ro-1", "at-1", SpanSink(store, interval=0.01))
    with rollout_scope(ctx):
        agl.emit_reward(0.5)
        agl.emit_object("thing", object())
        agl.emit_object("numbers", {"nan": math.nan, "huge": 2**70, "items": {1, 2}}, note=math.inf)
        agl.emit_message("done", extra=object())
        with span_scope("tool", "lookup") as attrs:
            attrs["result"] = math.nan
    ctx.sink.close()  # nothing dropped: close would raise
    spans = {s.name: s for s in store.query_spans(rollout_id="ro-1")}
    assert set(spans) == {"reward", "thing", "numbers", "message", "lookup"}
    assert spans["thing"].attributes["agl.object"].startswith("<object object at")
    assert spans["numbers"].attributes == {
        "agl.object": {"nan": "nan", "huge": str(2**70), "items": [1, 2]},
        "note": "inf",
    }
    assert spans["lookup"].attributes["result"] == "nan"
    store.close()


def test_record_refuses_a_span_field_that_cannot_be_stored() -> None:
    ctx = _ctx(ListWriter())
    with pytest.raises(ValidationError, match="start_time"):
        ctx.record("custom", "x", start_time=math.nan)
    with pytest.raises(ValidationError, match="name"):
        ctx.record("custom", "x" * 600)
    ctx.sink.close()


# --------------------------------------------------------------------------------------------------- pipeline


class GatedWriter(ListWriter):
    """Holds every write until ``gate`` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()
        self.entered = threading.Event()
        self.batches: list[list[Span]] = []

    def add_spans(self, spans: list[Span]) -> int:
        self.entered.set()
        assert self.gate.wait(30)
        self.batches.append(list(spans))
        return super().add_spans(spans)


def _span(name: str = "s", size: int = 0) -> Span:
    return Span(rollout_id="ro", attempt_id="at", kind="custom", name=name, attributes={"pad": "x" * size})


def test_pipeline_acknowledges_a_span_once_it_is_stored() -> None:
    writer = GatedWriter()
    pipeline = SpanPipeline(writer, interval=0.0)
    done = pipeline.put(_span())
    assert writer.entered.wait(10)
    assert not done.done(), "not acknowledged while the write is held"
    assert not pipeline.flush(timeout=0.05)
    writer.gate.set()
    assert done.result(timeout=10) is None and len(writer.spans) == 1
    assert pipeline.flush(timeout=10) and pipeline.close(timeout=10)


def test_pipeline_group_commits_spans_put_during_a_write() -> None:
    writer = GatedWriter()
    pipeline = SpanPipeline(writer, interval=0.0)
    first = pipeline.put(_span("first"))
    assert writer.entered.wait(10)  # the writer took "first" and waits at the gate
    later = [pipeline.put(_span(f"later{i}")) for i in range(5)]
    writer.gate.set()
    for done in [first, *later]:
        done.result(timeout=10)
    assert [[s.name for s in b] for b in writer.batches] == [["first"], [f"later{i}" for i in range(5)]]
    pipeline.close()


def test_pipeline_splits_batches_by_count_and_by_size() -> None:
    writer = ListWriter()
    batches: list[int] = []
    sizes: list[int] = []

    class Measuring:
        def add_spans(self, spans: list[Span]) -> int:
            batches.append(len(spans))
            sizes.append(len(TypeAdapter(list[Span]).dump_json(spans)))
            return writer.add_spans(spans)

    pipeline = SpanPipeline(Measuring(), interval=10, max_batch=4, max_batch_bytes=5_000)
    for i in range(6):
        pipeline.put(_span(f"small{i}"))
    for i in range(6):
        pipeline.put(_span(f"big{i}", size=1_500))
    assert pipeline.flush(timeout=10)
    assert len(writer.spans) == 12 and max(batches) <= 4 and max(sizes) <= 5_000, (batches, sizes)
    with pytest.raises(ValueError, match="over the batch limit of 5000 bytes"):
        pipeline.put(_span("huge", size=6_000))
    pipeline.close()


def test_pipeline_full_blocks_briefly_then_drops_and_counts() -> None:
    writer = GatedWriter()
    pipeline = SpanPipeline(writer, interval=0.0, max_pending=2, block=0.05)
    results = [pipeline.put(_span(f"s{i}")) for i in range(5)]
    failed = [r for r in results if r.done() and r.exception() is not None]
    assert failed and pipeline.dropped == len(failed), "a full pipeline drops what has no room, and counts it"
    assert isinstance(failed[0].exception(), SpansNotStored) and "waiting to be stored" in str(failed[0].exception())
    writer.gate.set()
    assert pipeline.flush(timeout=10)
    assert len(writer.spans) + pipeline.dropped == 5
    pipeline.close()


def test_pipeline_writes_a_span_put_after_close() -> None:
    writer = ListWriter()
    pipeline = SpanPipeline(writer)
    assert pipeline.close(timeout=10)
    pipeline.put(_span("late")).result(timeout=10)
    assert [s.name for s in writer.spans] == ["late"]
