"""The failure taxonomy: why a finished rollout did not give the algorithm a usable, rewarded trajectory.

Pure functions over what the store already holds (the rollout, its attempts, the spans of its last attempt); no I/O
except in ``failure_breakdown``, which reads a store page by page. Kinds, checked in this order:

- ``timeout``: the last attempt ran past ``attempt_timeout`` (reaped ``timed_out``), or the Trainer cancelled the
  rollout for ``rollout_timeout`` (its batch went too long without a rollout finishing).
- ``cancelled``: cancelled for any other reason, kept as the rollout's error (an interrupted batch: Ctrl-C, runners
  that could not be kept alive, a failing store; or whoever called ``Store.cancel``). A rollout cancelled without a
  reason (every cancelled rollout of a store written before reasons were kept) is ``cancelled``, "no reason recorded".
- ``lost_worker``: the last attempt was ``lost`` (no heartbeat, or the runner could not reach agl) and no tries
  were left.
- ``capture_failure``: the attempt's spans could not all be stored ("attempt incomplete"), or a succeeded rollout's
  recording is unusable (``agl.core.adapter.check_capture``: nothing captured, calls seen by only one side).
- ``llm_error``: the agent failed and an LLM call of that attempt was answered with an error (``status`` keeps the
  HTTP status the gateway recorded).
- ``tool_error``: the agent failed and a tool span of that attempt ended in error.
- ``agent_exception``: the agent failed for any other reason.
- ``missing_reward``: the rollout succeeded but the agent returned no reward.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal, get_args

from agl.core.adapter import build_trajectory, check_capture, select_agents
from agl.core.store.base import Store
from agl.core.types import ATTR_ERROR_MESSAGE, ATTR_HTTP_STATUS, Attempt, Rollout, Span

FailureKind = Literal[
    "llm_error",
    "tool_error",
    "agent_exception",
    "timeout",
    "cancelled",
    "lost_worker",
    "capture_failure",
    "missing_reward",
]
FAILURE_KINDS: tuple[FailureKind, ...] = get_args(FailureKind)
#: The error the runner reports for an attempt whose spans did not all reach the store (``agl.core.runner``).
INCOMPLETE_PREFIX = "attempt incomplete"
#: How the cancel reason of a rollout the Trainer cancelled for ``rollout_timeout`` starts (``agl.core.trainer``).
ROLLOUT_TIMEOUT_PREFIX = "rollout_timeout"


@dataclass(frozen=True)
class Failure:
    """One rollout's failure: its kind, the rollout, a one-line detail, and the HTTP status of an ``llm_error``."""

    kind: FailureKind
    rollout_id: str
    detail: str
    status: int | None = None


def _error_llm_call(spans: Sequence[Span]) -> Span | None:
    """The last LLM call of the attempt that was answered with an error (the one the agent most likely died of)."""
    errors = [s for s in spans if s.kind == "llm" and s.status == "error"]
    return errors[-1] if errors else None


def classify(rollout: Rollout, attempts: Sequence[Attempt], spans: Sequence[Span]) -> Failure | None:
    """The failure of a finished rollout, or None when it succeeded with a reward and a usable recording.

    ``attempts`` are the rollout's attempts (``Store.list_attempts``), ``spans`` those of its last attempt
    (``Store.query_spans(attempt_id=...)``). A rollout that has not finished is not classified (None).
    """
    rid = rollout.rollout_id
    last = attempts[-1] if attempts else None
    if rollout.status == "cancelled":
        if rollout.error is not None and rollout.error.startswith(ROLLOUT_TIMEOUT_PREFIX):
            return Failure("timeout", rid, f"cancelled: {rollout.error}")
        return Failure("cancelled", rid, f"cancelled: {rollout.error or 'no reason recorded'}")
    if rollout.status == "failed":
        error = rollout.error or (last.error if last else None) or "failed"
        if last is not None and last.status == "timed_out":
            return Failure("timeout", rid, error)
        if last is not None and last.status == "lost":
            return Failure("lost_worker", rid, error)
        if error.startswith(INCOMPLETE_PREFIX):
            return Failure("capture_failure", rid, error)
        llm = _error_llm_call(spans)
        if llm is not None:
            status = llm.attributes.get(ATTR_HTTP_STATUS)
            message = llm.attributes.get(ATTR_ERROR_MESSAGE) or error
            return Failure("llm_error", rid, str(message), status if isinstance(status, int) else None)
        tool = next((s for s in reversed(spans) if s.kind == "tool" and s.status == "error"), None)
        if tool is not None:
            return Failure("tool_error", rid, f"tool {tool.name}: {tool.attributes.get(ATTR_ERROR_MESSAGE) or error}")
        return Failure("agent_exception", rid, error)
    if rollout.status != "succeeded":
        return None
    trajectory = build_trajectory(rollout, spans, select_agents(None), last.attempt_id if last else None)
    capture = check_capture(trajectory, spans, require_token_ids=False)
    if capture is not None:
        return Failure("capture_failure", rid, capture.reason)
    if rollout.final_reward is None:
        return Failure("missing_reward", rid, "the agent returned no reward (None)")
    return None


@dataclass
class RoundFailures:
    """Failures of the rollouts that ran with one resources version (a round of training publishes one)."""

    resources_version: int
    rollouts: int = 0
    counts: Counter[str] = field(default_factory=Counter)
    examples: dict[str, Failure] = field(default_factory=dict)

    @property
    def failed(self) -> int:
        return sum(self.counts.values())

    @property
    def rate(self) -> float:
        return self.failed / self.rollouts if self.rollouts else 0.0


@dataclass
class FailureBreakdown:
    """Counts per kind over all finished rollouts read, one example (the newest) per kind, and the same per round."""

    rollouts: int = 0
    counts: Counter[str] = field(default_factory=Counter)
    examples: dict[str, Failure] = field(default_factory=dict)
    rounds: dict[int, RoundFailures] = field(default_factory=dict)

    def add(self, rollout: Rollout, failure: Failure | None) -> None:
        """Count one finished rollout (rollouts arrive newest first, so the first example kept is the newest)."""
        version = rollout.resources_version
        round_ = self.rounds.setdefault(version, RoundFailures(version))
        self.rollouts += 1
        round_.rollouts += 1
        if failure is None:
            return
        for target in (self, round_):
            target.counts[failure.kind] += 1
            target.examples.setdefault(failure.kind, failure)


def rollout_failure(store: Store, rollout: Rollout) -> Failure | None:
    """``classify`` with the rollout's attempts and its last attempt's spans read from ``store``."""
    if not rollout.finished:
        return None
    attempts = store.list_attempts(rollout.rollout_id)
    needs_spans = rollout.status in ("failed", "succeeded") and attempts
    spans = store.query_spans(attempt_id=attempts[-1].attempt_id) if needs_spans else []
    return classify(rollout, attempts, spans)


def failure_breakdown(
    store: Store,
    limit: int = 2_000,
    page: int = 500,
    classify_one: Callable[[Store, Rollout], Failure | None] = rollout_failure,
) -> FailureBreakdown:
    """Classify the newest ``limit`` finished rollouts of ``store`` (read in pages of ``page``; each rollout costs
    two indexed reads: its attempts and its last attempt's spans). ``classify_one`` may be a caching
    ``rollout_failure``: a finished rollout's class never changes."""
    result = FailureBreakdown()
    offset = 0
    while result.rollouts < limit:
        batch = store.list_rollouts(limit=page, offset=offset)
        if not batch:
            break
        offset += len(batch)
        for rollout in batch:
            if rollout.finished and result.rollouts < limit:
                result.add(rollout, classify_one(store, rollout))
    return result
