"""What the two SQL stores (SQLite, PostgreSQL) share: rows to models, values to JSON columns."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from agl.core.store.base import StoreError
from agl.core.types import Attempt, Rollout


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
