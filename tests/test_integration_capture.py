"""The pieces every framework integration shares (``agl.integrations._capture``), with no framework: open spans and
their failures, the one-record-per-call rule, span tables, context call stacks, and install-once / activate."""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Iterator

import pytest

from agl.core.emit import RolloutContext, SpanSink, current_rollout
from agl.core.types import ATTR_TOOL_ARGUMENTS, ATTR_TOOL_CALL_ID, ATTR_TOOL_NAME, ATTR_VIA_GATEWAY
from agl.integrations._capture import CallStack, Integration, OpenCall, OpenSpan, SpanTable
from agl.integrations._patch import Verified
from tests.framework_harness import SpanList, local_rollout


def _no_scope() -> tuple[str | None, str | None]:
    return None, None


@pytest.fixture
def contexts() -> Iterator[tuple[RolloutContext, RolloutContext]]:
    """Two rollouts (not current), their spans kept in memory."""
    sinks = [SpanSink(SpanList()), SpanSink(SpanList())]
    yield RolloutContext("ro-1", "at-1", sinks[0]), RolloutContext("ro-2", "at-2", sinks[1])
    for sink in sinks:
        sink.close()


def _current() -> RolloutContext:
    ctx = current_rollout()
    assert ctx is not None
    return ctx


def test_a_failure_is_one_exception_span_under_the_span_it_left_first() -> None:
    with local_rollout() as memory:
        ctx = _current()
        outer = OpenSpan(ctx=ctx, name="node", agent="solver")
        tool = OpenSpan(ctx=ctx, name="lookup", agent="solver", parent=outer.span_id)
        tool.describe_tool("lookup", {"key": "k"}, "call-1")
        error = KeyError("k")
        tool.fail(error)
        tool.finish("tool", "error")
        outer.fail(error)  # the same error bubbling out: described again, recorded once
        outer.finish("agent", "error")
    assert sorted(s.kind for s in memory.spans) == ["agent", "exception", "tool"]
    by_kind = {s.kind: s for s in memory.spans}
    assert by_kind["exception"].parent_id == tool.span_id and by_kind["exception"].agent == "solver"
    assert by_kind["tool"].status == "error" and by_kind["tool"].parent_id == outer.span_id
    assert by_kind["tool"].attributes["error.type"] == "KeyError"
    assert by_kind["tool"].attributes[ATTR_TOOL_NAME] == "lookup"
    assert by_kind["tool"].attributes[ATTR_TOOL_CALL_ID] == "call-1"
    assert by_kind["tool"].attributes[ATTR_TOOL_ARGUMENTS] == {"key": "k"}
    assert by_kind["agent"].attributes["error.type"] == "KeyError" and by_kind["agent"].status == "error"


def test_a_pass_through_scope_records_nothing_and_hands_on_its_parent() -> None:
    with local_rollout() as memory:
        ctx = _current()
        scope = OpenSpan(ctx=ctx, parent="sp-node", span_id=None)
        scope.finish("custom")
        scope.fail(ValueError("inside a plain chain"))
    assert scope.scope == "sp-node"
    [exception] = memory.spans
    assert exception.kind == "exception" and exception.parent_id == "sp-node"


def test_a_call_the_gateway_recorded_is_custom_and_one_it_did_not_is_llm(
    contexts: tuple[RolloutContext, RolloutContext],
) -> None:
    ctx = contexts[0]
    sent = OpenCall(ctx=ctx, agent="writer", call_id="run-1")
    tag = sent.take()
    assert (tag.agent, tag.call_id, tag.parent_span) == ("writer", "run-1", sent.span_id)
    assert sent.gateway_kind() == "custom" and sent.attrs[ATTR_VIA_GATEWAY] is True
    pointed = OpenCall(ctx=ctx, gateway_url=True)
    assert pointed.gateway_kind() == "custom"
    direct = OpenCall(ctx=ctx)
    assert direct.gateway_kind() == "llm" and direct.attrs[ATTR_VIA_GATEWAY] is False


def test_a_table_keeps_the_first_owner_and_forgets_a_finished_rollout(
    contexts: tuple[RolloutContext, RolloutContext],
) -> None:
    mine, other = contexts
    table: SpanTable[str, OpenSpan] = SpanTable()
    first, second = OpenSpan(ctx=mine), OpenSpan(ctx=mine)
    assert table.add("run", first) and not table.add("run", second)
    assert table.get("run") is first
    assert table.add("run", second, replace=True) and table.get("run") is second
    table.add("theirs", OpenSpan(ctx=other))
    assert table.discard(mine) == [second]
    assert len(table) == 1 and table.pop("run") is None and table.pop("theirs") is not None


def test_a_call_stack_gives_each_context_its_own_innermost_open_call(
    contexts: tuple[RolloutContext, RolloutContext],
) -> None:
    ctx, elsewhere = contexts
    stack: CallStack[OpenCall] = CallStack("test_calls")
    outer = OpenCall(ctx=ctx, call_id="outer")
    stack.push(outer)
    copied = contextvars.copy_context()
    inner = OpenCall(ctx=ctx, call_id="inner")
    stack.push(inner)
    assert stack.innermost(ctx) is inner
    assert copied.run(stack.innermost, ctx) is outer, "a copied context never sees calls started after the copy"
    inner.open = False
    assert stack.innermost(ctx) is outer
    stack.push(OpenCall(ctx=ctx, call_id="next"))
    assert [c.call_id for c in stack.get()] == ["outer", "next"], "ended calls are dropped"
    assert stack.innermost(elsewhere) is None


def test_install_hooks_once_across_threads_and_activate_forgets_the_rollout(
    contexts: tuple[RolloutContext, RolloutContext],
) -> None:
    hooked: list[int] = []
    rechecked: list[int] = []
    table: SpanTable[str, OpenSpan] = SpanTable()
    integration = Integration(
        verified=Verified("pydantic", "2", "99"),
        hook=lambda: hooked.append(1),
        recheck=lambda: rechecked.append(1),
        scope_resolver=_no_scope,
        tagger=lambda ctx: None,
        forget=table.discard,
    )
    threads = [threading.Thread(target=integration.install) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert hooked == [1] and len(rechecked) == 8 and integration.installed
    integration.uninstall(lambda: hooked.clear())
    assert not integration.installed
    with local_rollout():
        ctx = _current()
        with integration.activate():
            table.add("left open", OpenSpan(ctx=ctx))
            table.add("other rollout", OpenSpan(ctx=contexts[1]))
        assert table.get("left open") is None and table.get("other rollout") is not None
    assert hooked == [1], "installing again after uninstall hooks again"
