"""Runs: one ``run`` record per ``fit`` or ``evaluate``, so a store says what was run, with what, and how it ended.

A run is kept as records of kind ``run`` keyed by its id: one when it starts (status ``running``) and one when it
ends (``succeeded`` or ``failed`` with the error); the latest record of a key is the run's state. A run names the
resources versions it ran with (the latest version when it started and when it ended) and the rollout modes it
enqueued. Every rollout a run enqueues carries its id in ``metadata[RUN_ID_KEY]``, which is how a run's rollouts
are found (``Run.covers``): two runs on the same version, or two Trainers sharing a store, never see each other's.
Runs recorded before rollouts carried the id (their record has no ``tags_rollouts``) still find theirs by version
and mode, among the rollouts no run tagged.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from agl.core.store.base import NotFound, Store
from agl.core.types import Record, Rollout, new_id

RUN_KIND = "run"
#: The ``Rollout.metadata`` key holding the id of the run that enqueued the rollout.
RUN_ID_KEY = "agl.run_id"


@dataclass(frozen=True)
class Run:
    """A run's latest state, read back from its records."""

    run_id: str
    kind: str
    algorithm: str
    status: str
    started_at: float
    ended_at: float | None
    first_version: int | None
    last_version: int | None
    modes: tuple[str, ...]
    error: str | None = None
    tags_rollouts: bool = False

    @property
    def wall_s(self) -> float | None:
        return None if self.ended_at is None else self.ended_at - self.started_at

    def covers(self, rollout: Rollout) -> bool:
        """Whether this run enqueued ``rollout``: the run id it carries. A run recorded before rollouts carried one
        covers the untagged rollouts that ran with one of its resources versions and modes."""
        tag = rollout.metadata.get(RUN_ID_KEY)
        if self.tags_rollouts:
            return tag == self.run_id
        low = self.first_version or 1
        high = self.last_version if self.last_version is not None else low
        return tag is None and rollout.mode in self.modes and low <= rollout.resources_version <= high


def _latest_version(store: Store) -> int | None:
    try:
        return store.get_resources().version
    except NotFound:
        return None


@contextmanager
def recorded_run(store: Store, kind: str, algorithm: str, modes: Sequence[str]) -> Iterator[str]:
    """Record a run around a block (``kind``: ``fit`` or ``evaluate``); yields the run id, which the block puts in
    ``metadata[RUN_ID_KEY]`` of every rollout it enqueues. An exception in the block ends the run ``failed`` with the
    exception's message, and propagates."""
    run_id = new_id("run")
    data: dict[str, Any] = {
        "kind": kind,
        "algorithm": algorithm,
        "status": "running",
        "started_at": time.time(),
        "ended_at": None,
        "first_version": _latest_version(store),
        "last_version": None,
        "modes": list(modes),
        "error": None,
        "tags_rollouts": True,
    }
    store.add_record(Record(kind=RUN_KIND, key=run_id, data=data))
    try:
        yield run_id
    except BaseException as exc:
        data.update(status="failed", error=f"{type(exc).__name__}: {exc}")
        raise
    else:
        data["status"] = "succeeded"
    finally:
        data.update(ended_at=time.time(), last_version=_latest_version(store))
        store.add_record(Record(kind=RUN_KIND, key=run_id, data=data))


def list_runs(store: Store) -> list[Run]:
    """Every recorded run in its latest state, newest first."""
    latest: dict[str, dict[str, Any]] = {}
    for record in store.list_records(RUN_KIND):
        latest[record.key] = record.data
    runs = [
        Run(
            run_id=key,
            kind=str(d.get("kind", "")),
            algorithm=str(d.get("algorithm", "")),
            status=str(d.get("status", "")),
            started_at=float(d.get("started_at") or 0.0),
            ended_at=d.get("ended_at"),
            first_version=d.get("first_version"),
            last_version=d.get("last_version"),
            modes=tuple(d.get("modes") or ()),
            error=d.get("error"),
            tags_rollouts=d.get("tags_rollouts") is True,
        )
        for key, d in latest.items()
    ]
    return sorted(runs, key=lambda r: r.started_at, reverse=True)
