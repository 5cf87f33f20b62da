"""What each dashboard page shows, read from a ``Store`` through its public contract only (so any store works:
SQLite, PostgreSQL, an agl server over HTTP). Every read is paged or bounded; nothing is written.

Each function returns the context its template renders; none holds state between requests.
"""

from __future__ import annotations

import difflib
import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from agl.core.adapter import build_trajectory, select_agents, span_summary
from agl.core.failures import FAILURE_KINDS, Failure, failure_breakdown, rollout_failure
from agl.core.runs import Run, list_runs
from agl.core.server.auth import redact
from agl.core.store.base import NotFound, Store
from agl.core.types import (
    ATTR_INPUT_TOKENS,
    ATTR_OUTPUT_TOKENS,
    ATTR_PROMPT_IDS,
    ATTR_RESPONSE_IDS,
    Attempt,
    PromptTemplate,
    Rollout,
    Span,
)
from agl.dashboard.svg import line_chart

#: Rollouts per page of the rollouts list, and failed rollouts shown above it.
PAGE = 50
FAILED_FIRST = 20
#: Spans of one attempt shown in its tree (a rollout with more says so and shows the first ones).
MAX_TREE_SPANS = 2_000
#: Rollouts read per store call when a filter the store cannot apply (agent, run) is checked here.
SCAN_CHUNK = 500
#: Finished rollouts (the newest) the failures page classifies.
FAILURES_LIMIT = 1_000
#: Resources versions per page of the resources list.
VERSIONS_PAGE = 50
#: The highest page number a list takes (beyond any store's size; keeps offsets inside 64 bits).
MAX_PAGE = 10**9


class PageError(ValueError):
    """A query parameter the page cannot use; the message names it."""


@dataclass(frozen=True)
class RolloutRow:
    """One line of a rollouts table."""

    rollout: Rollout
    worker: str
    duration_s: float | None


def _row(store: Store, rollout: Rollout) -> RolloutRow:
    attempts = store.list_attempts(rollout.rollout_id)
    last = attempts[-1] if attempts else None
    duration = None
    if last is not None:
        end = last.ended_at if last.ended_at is not None else last.heartbeat_at
        duration = end - last.started_at
    return RolloutRow(rollout, last.worker_id if last else "-", duration)


def _check_page(page: int) -> None:
    if not 0 <= page <= MAX_PAGE:
        raise PageError(f"page: must be between 0 and {MAX_PAGE}, got {page}")


def runs_page(store: Store) -> dict[str, Any]:
    return {"runs": list_runs(store)}


def _find_run(store: Store, run_id: str) -> Run:
    for run in list_runs(store):
        if run.run_id == run_id:
            return run
    raise PageError(f"run: no run {run_id!r} in this store")


def _scan(
    store: Store, status: str | None, mode: str | None, keep: Callable[[Rollout], bool], skip: int, want: int
) -> list[Rollout]:
    """Rollouts newest first that ``keep`` accepts, after skipping ``skip`` of them; at most ``want``. Reads the
    store in chunks and stops as soon as it has enough."""
    found: list[Rollout] = []
    offset = 0
    while len(found) < skip + want:
        chunk = store.list_rollouts(status=status, mode=mode, limit=SCAN_CHUNK, offset=offset)
        if not chunk:
            break
        offset += len(chunk)
        found.extend(r for r in chunk if keep(r))
    return found[skip : skip + want]


def rollouts_page(
    store: Store,
    status: str | None = None,
    mode: str | None = None,
    agent: str | None = None,
    run: str | None = None,
    page: int = 0,
) -> dict[str, Any]:
    """A page of rollouts newest first with the filters applied; failed rollouts first (a separate table on the
    first unfiltered page), one row more read than shown to know whether a next page exists."""
    _check_page(page)
    found_run = _find_run(store, run) if run else None
    checks: list[Callable[[Rollout], bool]] = []
    if found_run is not None:
        checks.append(found_run.covers)
    if agent:  # the agent or one nested in it ("solver" takes "solver/critic"), as agents= selects them
        chosen = select_agents([agent])
        checks.append(lambda r: any(chosen(s.agent) for s in store.query_spans(rollout_id=r.rollout_id, kind="llm")))
    if checks:
        rollouts = _scan(store, status, mode, lambda r: all(c(r) for c in checks), page * PAGE, PAGE + 1)
    else:
        rollouts = store.list_rollouts(status=status, mode=mode, limit=PAGE + 1, offset=page * PAGE)
    failed: list[RolloutRow] = []
    if page == 0 and status is None and not checks:
        failed = [_row(store, r) for r in store.list_rollouts(status="failed", mode=mode, limit=FAILED_FIRST)]
    return {
        "rows": [_row(store, r) for r in rollouts[:PAGE]],
        "failed": failed,
        "has_next": len(rollouts) > PAGE,
        "page": page,
        "filters": {"status": status or "", "mode": mode or "", "agent": agent or "", "run": run or ""},
        "run": found_run,
    }


@dataclass
class SpanNode:
    """A span in the tree, with what the page shows of it."""

    span: Span
    children: list[SpanNode]
    selected: bool
    transition_step: int | None
    summary: str
    tokens: str


def _tokens(span: Span) -> str:
    a = span.attributes
    if span.kind != "llm":
        return ""
    prompt = len(a.get(ATTR_PROMPT_IDS) or []) or a.get(ATTR_INPUT_TOKENS)
    response = len(a.get(ATTR_RESPONSE_IDS) or []) or a.get(ATTR_OUTPUT_TOKENS)
    return f"{prompt or 0} → {response or 0} tokens"


def rollout_page(
    store: Store, rollout_id: str, attempt: str | None = None, agents: str | None = None
) -> dict[str, Any]:
    """One rollout: its attempts, the span tree of one attempt (default: the last), the transitions the trainer
    builds from it for ``agents`` (a regex; default all) and the rewards where they landed."""
    rollout = store.get_rollout(rollout_id)
    attempts = store.list_attempts(rollout_id)
    chosen: Attempt | None = attempts[-1] if attempts else None
    if attempt:
        chosen = next((a for a in attempts if a.attempt_id == attempt), None)
        if chosen is None:
            raise PageError(f"attempt: rollout {rollout_id} has no attempt {attempt!r}")
    try:
        selector = select_agents(agents or None)
    except ValueError as exc:
        raise PageError(str(exc)) from exc
    spans = store.query_spans(attempt_id=chosen.attempt_id, limit=MAX_TREE_SPANS + 1) if chosen else []
    truncated = len(spans) > MAX_TREE_SPANS
    spans = spans[:MAX_TREE_SPANS]
    trajectory = build_trajectory(rollout, spans, selector, chosen.attempt_id if chosen else None)
    steps = {t.span_id: t.step for t in trajectory.transitions}
    ids = {s.span_id for s in spans}
    children: dict[str | None, list[Span]] = {}
    for s in spans:
        children.setdefault(s.parent_id if s.parent_id in ids else None, []).append(s)

    def build(parent: str | None) -> list[SpanNode]:
        return [
            SpanNode(
                s,
                build(s.span_id),
                s.kind == "llm" and selector(s.agent),
                steps.get(s.span_id),
                span_summary(s),
                _tokens(s),
            )
            for s in children.get(parent, [])
        ]

    failure = rollout_failure(store, rollout) if rollout.finished else None
    return {
        "rollout": rollout,
        "attempts": attempts,
        "attempt": chosen,
        "tree": build(None),
        "span_count": len(spans),
        "truncated": truncated,
        "trajectory": trajectory,
        "agents": agents or "",
        "failure": failure,
        "task": json.dumps(rollout.task, indent=2, default=str),
    }


def span_page(store: Store, rollout_id: str, span_id: str) -> dict[str, Any]:
    """One span with all its attributes; looked up among its rollout's spans, page by page."""
    rollout = store.get_rollout(rollout_id)
    offset = 0
    while True:
        chunk = store.query_spans(rollout_id=rollout_id, limit=1000, offset=offset)
        found = next((s for s in chunk if s.span_id == span_id), None)
        if found is not None:
            break
        if len(chunk) < 1000:
            raise NotFound(f"rollout {rollout_id} has no span {span_id!r}")
        offset += len(chunk)
    return {
        "rollout": rollout,
        "span": found,
        "summary": span_summary(found),
        "tokens": _tokens(found),
        "attributes": json.dumps(found.attributes, indent=2, default=str),
        "messages": found.attributes.get("gen_ai.input.messages") or [],
        "output": found.attributes.get("gen_ai.output.messages") or [],
    }


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


#: Metrics whose name holds one of these come first on the curves page, in this order.
FIRST_METRICS = ("reward", "accuracy", "success", "loss")


def _chart_order(item: tuple[str, Any]) -> tuple[int, str]:
    key = item[0]
    return next((i for i, word in enumerate(FIRST_METRICS) if word in key), len(FIRST_METRICS)), key


def curves_page(store: Store) -> dict[str, Any]:
    """One chart per numeric metric of the ``metrics`` records (x = step); APO's candidates and their scores."""
    records = store.list_records("metrics")
    series: dict[str, list[tuple[float, float]]] = {}
    for record in records:
        step = _number(record.data.get("step"))
        if step is None:
            continue
        for key, value in record.data.items():
            y = _number(value)
            if key not in ("step", "time") and y is not None:
                series.setdefault(key, []).append((step, y))
    charts = [(key, line_chart(key, {key: points})) for key, points in sorted(series.items(), key=_chart_order)]
    candidates = [r.data for r in store.list_records("apo_candidate")]
    latest: dict[str, dict[str, Any]] = {}
    for c in candidates:
        latest[str(c.get("id"))] = c
    rows = [_candidate_row(c) for c in latest.values()]
    rows.sort(key=lambda c: (c["iteration"], c["id"]))
    apo_points = [(float(c["iteration"]), c["mean"]) for c in rows if c["mean"] is not None]
    apo_chart = line_chart("APO candidate mean reward by iteration", {"candidates": apo_points}) if rows else None
    return {"charts": charts, "records": len(records), "candidates": rows, "apo_chart": apo_chart}


def _mean_of_means(scores: Any) -> float | None:
    """The mean over tasks of each task's mean reward (``{task: [rewards]}``); what is not a number is left out."""
    if not isinstance(scores, dict):
        return None
    means = []
    for values in scores.values():
        numbers = [n for n in map(_number, values if isinstance(values, list) else []) if n is not None]
        if numbers:
            means.append(sum(numbers) / len(numbers))
    return sum(means) / len(means) if means else None


def _candidate_row(c: dict[str, Any]) -> dict[str, Any]:
    """One ``apo_candidate`` record as the curves page shows it. Records come from any trainer token, so each field
    is read defensively: a missing or odd field shows as "-" instead of failing the page for every reader."""
    prompts = c.get("prompts")
    return {
        "id": str(c.get("id", "-")),
        "iteration": int(it) if (it := _number(c.get("iteration")) or 0.0).is_integer() else it,
        "parent": str(c["parent"]) if c.get("parent") is not None else None,
        "status": str(c.get("status") or "-"),
        "reason": str(c["reason"]) if c.get("reason") else None,
        "prompts": {str(k): str(v) for k, v in prompts.items()} if isinstance(prompts, dict) else {},
        "mean": _mean_of_means(c.get("rewards")),
        "val_mean": _mean_of_means(c.get("val_rewards")),
    }


def _prompts(version: Any) -> dict[str, str]:
    return {name: r.template for name, r in version.resources.items() if isinstance(r, PromptTemplate)}


def resources_page(store: Store, a: int | None = None, b: int | None = None, page: int = 0) -> dict[str, Any]:
    """Resources versions newest first (API keys redacted), and the diff of every prompt between versions ``a``
    and ``b`` (default: the latest and the one before it)."""
    _check_page(page)
    try:
        latest = store.get_resources().version
    except NotFound:
        return {"versions": [], "diffs": [], "a": None, "b": None, "page": 0, "has_next": False}
    top = latest - page * VERSIONS_PAGE
    shown = [redact(store.get_resources(v)) for v in range(top, max(0, top - VERSIONS_PAGE), -1)]
    b = latest if b is None else b
    a = max(1, b - 1) if a is None else a
    for name, value in (("a", a), ("b", b)):
        if not 1 <= value <= latest:
            raise PageError(f"{name}: no resources version {value} (versions 1..{latest})")
    old, new = _prompts(store.get_resources(a)), _prompts(store.get_resources(b))
    diffs = []
    for name in sorted(set(old) | set(new)):
        lines = list(
            difflib.unified_diff(
                old.get(name, "").splitlines(), new.get(name, "").splitlines(), f"v{a}", f"v{b}", lineterm=""
            )
        )
        diffs.append({"name": name, "lines": lines, "same": not lines})
    return {
        "versions": [(rs, _prompts(rs)) for rs in shown],
        "diffs": diffs,
        "a": a,
        "b": b,
        "page": page,
        "has_next": top - VERSIONS_PAGE >= 1,
    }


class FailureCache:
    """``rollout_failure`` remembered per finished rollout (its class never changes once it finished), so a live
    failures page re-reads only the rollouts that finished since its last load. Thread-safe enough for its use: a
    lost race computes one class twice. Holds at most ``size`` rollouts (then starts over)."""

    def __init__(self, size: int = 100_000) -> None:
        self.size = size
        self._known: dict[str, Failure | None] = {}

    def __call__(self, store: Store, rollout: Rollout) -> Failure | None:
        if rollout.rollout_id in self._known:
            return self._known[rollout.rollout_id]
        failure = rollout_failure(store, rollout)
        if len(self._known) >= self.size:
            self._known = {}
        self._known[rollout.rollout_id] = failure
        return failure


def failures_page(store: Store, cache: FailureCache | None = None) -> dict[str, Any]:
    """The failure breakdown of the newest finished rollouts: counts per kind and per round, one example each."""
    found = failure_breakdown(store, FAILURES_LIMIT, classify_one=cache or rollout_failure)
    return {
        "found": found,
        "kinds": FAILURE_KINDS,
        "rounds": sorted(found.rounds.values(), key=lambda r: -r.resources_version),
    }
