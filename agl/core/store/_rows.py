"""What the two SQL stores (SQLite, PostgreSQL) share: rows to models, values to JSON columns."""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from typing import Any

from agl.core.store.base import LiveAttempt, NotFound, StoreError
from agl.core.types import Attempt, Rollout, Span

log = logging.getLogger("agl.store")


def rollout_from_row(row: Sequence[Any]) -> Rollout:
    """A ``Rollout`` from a ``rollouts`` row in the column order both SQL stores select."""
    return Rollout(
        rollout_id=row[0],
        task=json.loads(row[1]),
        task_id=row[2],
        mode=row[3],
        resources_version=row[4],
        status=row[5],
        max_attempts=row[6],
        attempts=row[7],
        final_reward=row[8],
        error=row[9],
        created_at=row[10],
        finished_at=row[11],
        metadata=json.loads(row[12]),
    )


def attempt_from_row(row: Sequence[Any]) -> Attempt:
    """An ``Attempt`` from an ``attempts`` row in the column order both SQL stores select."""
    return Attempt(
        attempt_id=row[0],
        rollout_id=row[1],
        number=row[2],
        worker_id=row[3],
        status=row[4],
        started_at=row[5],
        heartbeat_at=row[6],
        ended_at=row[7],
        error=row[8],
    )


def json_text(value: Any, what: str) -> str:
    """``value`` as JSON text for a column; ``StoreError`` naming ``what`` when it is not JSON."""
    try:
        return json.dumps(value)
    except (TypeError, ValueError) as exc:
        raise StoreError(f"{what} is not JSON-serialisable: {exc}") from exc


#: ``Store.live_attempt`` in one indexed row (``?`` placeholder): a rollout's ``current_attempt`` is its running
#: attempt, set by ``lease`` and cleared whenever that attempt ends.
LIVE_ATTEMPT_SQL = "SELECT status, resources_version, current_attempt FROM rollouts WHERE rollout_id=?"


def live_attempt_of(rows: Sequence[Sequence[Any]], rollout_id: str) -> LiveAttempt:
    """The answer of ``LIVE_ATTEMPT_SQL``; NotFound when it found no row."""
    if not rows:
        raise NotFound(f"no rollout {rollout_id!r}")
    status, version, current = rows[0]
    return LiveAttempt(status, version, current if status == "running" else None)


def span_select(
    placeholder: str,
    filters: dict[str, str | None],
    limit: int | None,
    offset: int,
    unlimited: int | None,
) -> tuple[str, list[Any]]:
    """The SQL and arguments of ``query_spans``: the spans matching every given filter, in arrival order, paged.

    ``placeholder`` is the driver's parameter mark (``?`` or ``%s``); ``unlimited`` is the LIMIT value that means no
    limit (SQLite ``-1``, PostgreSQL ``NULL``), so the query keeps one shape with or without a limit.
    """
    where = [f"{column}={placeholder}" for column, value in filters.items() if value is not None]
    args: list[Any] = [value for value in filters.values() if value is not None]
    clause = f"WHERE {' AND '.join(where)}" if where else ""
    args += [unlimited if limit is None else int(limit), int(offset)]
    return f"SELECT span_id, body FROM spans {clause} ORDER BY seq LIMIT {placeholder} OFFSET {placeholder}", args


def spans_from_rows(rows: Sequence[Sequence[Any]], store: str) -> list[Span]:
    """Stored ``(span_id, body)`` rows → spans; a row that is no readable span is skipped and logged, never fatal.

    Such rows come from stores written before values were checked at the door (a ``1e400`` time stored as an
    infinity, a body that is not a span); every other span of the same query is still returned.
    """
    spans: list[Span] = []
    unreadable: list[str] = []
    for span_id, body in rows:
        try:
            spans.append(Span.model_validate_json(body))
        except ValueError:  # pydantic's ValidationError included: the model refuses non-finite numbers
            unreadable.append(span_id)
    if unreadable:
        log.warning(
            "store %s: skipped %d stored span(s) that cannot be read back (not a valid span, or a non-finite time): %s",
            store,
            len(unreadable),
            ", ".join(unreadable[:5]) + (" ..." if len(unreadable) > 5 else ""),
        )
    return spans
