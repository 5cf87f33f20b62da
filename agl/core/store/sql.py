"""What the two SQL stores (SQLite, PostgreSQL) share: the attempt state machine and every query, written once.

``SqlStore`` holds the rules; a dialect subclass (``SqliteStore``, ``PostgresStore``) holds what really differs:
its connection and transactions (``_tx``, ``_read``), migrations, error mapping, and the three writes whose best SQL
differs (``enqueue``, ``lease``, ``add_spans``). The rest differs only in spelling, which the subclass declares:

- ``P``: the driver's parameter mark (``?``, ``%s``);
- ``CLOCK``: SQL for "now" in epoch seconds where several servers must share one clock (the database's), or None to
  bind this process's clock as a parameter (one SQLite file lives on one machine);
- ``FOR_UPDATE``: the row-lock clause of a SELECT inside a write, empty where a write transaction holds the whole
  database (SQLite's ``BEGIN IMMEDIATE``); with it, a write locks the rollout row first, then its attempts, in the
  same order everywhere, so concurrent writers never deadlock;
- ``_in`` / ``IN_CHUNK``: how a list of ids is matched, and how many at once;
- ``_serialize``: a transaction-wide lock for writes that number things (resources versions), a no-op where the
  transaction already serialises writers.
"""

from __future__ import annotations

import abc
import json
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, ClassVar, Protocol, TypeVar

from pydantic import TypeAdapter

from agl.core.store.base import LiveAttempt, NotFound, Store, StoreError, check_cancel_reason
from agl.core.types import Attempt, AttemptStatus, Record, Resource, ResourceSet, Rollout, Span

log = logging.getLogger("agl.store")

T = TypeVar("T")

RESOURCES = TypeAdapter(dict[str, Resource])
#: The columns of a rollout, in the order ``rollout_from_row`` reads them.
ROLLOUT_COLS = (
    "rollout_id, task, task_id, mode, resources_version, status, max_attempts, attempts, final_reward, error, "
    "created_at, finished_at, metadata"
)
#: The columns of an attempt, in the order ``attempt_from_row`` reads them.
ATTEMPT_COLS = "attempt_id, rollout_id, number, worker_id, status, started_at, heartbeat_at, ended_at, error"


class Cursor(Protocol):
    """The part of a DB-API cursor the shared code uses (``sqlite3.Cursor``, ``psycopg.Cursor``)."""

    @property
    def rowcount(self) -> int: ...

    def execute(self, query: Any, params: Any = ..., /) -> Any: ...


def rollout_from_row(row: Sequence[Any]) -> Rollout:
    """A ``Rollout`` from a ``rollouts`` row selected as ``ROLLOUT_COLS``."""
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
    """An ``Attempt`` from an ``attempts`` row selected as ``ATTEMPT_COLS``."""
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


class SqlStore(Store):
    """The Store contract on an SQL database (see the module doc for what a dialect declares)."""

    #: The driver's parameter mark.
    P: ClassVar[str]
    #: SQL for "now" in epoch seconds (the database's clock), or None to bind this process's ``time.time()``.
    CLOCK: ClassVar[str | None] = None
    #: Row-lock clause of a SELECT inside a write ("" where a write transaction locks the whole database).
    FOR_UPDATE: ClassVar[str] = ""
    #: LIMIT value that means no limit, so ``query_spans`` keeps one shape with or without one.
    NO_LIMIT: ClassVar[int | None]
    #: Ids matched per statement by ``_in``.
    IN_CHUNK: ClassVar[int]
    #: How logs and errors name this store (a path, or a URL without its password).
    location: str

    @abc.abstractmethod
    def _tx(self, fn: Callable[[Cursor], T]) -> T:
        """Run ``fn`` in one write transaction and return its result."""

    @abc.abstractmethod
    def _read(self, sql: str, args: Sequence[Any] = ()) -> list[Any]:
        """The rows of one read."""

    @abc.abstractmethod
    def _in(self, ids: Sequence[str]) -> tuple[str, tuple[Any, ...]]:
        """SQL that follows a column to match it against ``ids`` (at most ``IN_CHUNK``), and its arguments."""

    def _serialize(self, cur: Cursor, what: str) -> None:
        """Hold a lock on ``what`` until the transaction ends, so writes that number rows number them in order."""

    def _clock(self) -> tuple[str, tuple[float, ...]]:
        """SQL for "now" and its arguments (see ``CLOCK``)."""
        return (self.CLOCK, ()) if self.CLOCK is not None else (self.P, (time.time(),))

    def _chunks(self, ids: Sequence[str]) -> Iterator[Sequence[str]]:
        for i in range(0, len(ids), self.IN_CHUNK):
            yield ids[i : i + self.IN_CHUNK]

    def _lock_rollout(self, cur: Cursor, rollout_id: str) -> None:
        """Lock the rollout's row before its attempts' (the one lock order); nothing to do without row locks."""
        if self.FOR_UPDATE:
            cur.execute(f"SELECT 1 FROM rollouts WHERE rollout_id={self.P}{self.FOR_UPDATE}", (rollout_id,))

    # rollouts -------------------------------------------------------------------------------------------------
    def heartbeat(self, attempt_id: str) -> bool:
        now, now_args = self._clock()
        sql = f"UPDATE attempts SET heartbeat_at={now} WHERE attempt_id={self.P} AND status='running'"
        return self._tx(lambda cur: bool(cur.execute(sql, (*now_args, attempt_id)).rowcount == 1))

    def complete_attempt(
        self, attempt_id: str, status: AttemptStatus, final_reward: float | None = None, error: str | None = None
    ) -> bool:
        if status not in ("succeeded", "failed", "lost"):
            raise StoreError(f"complete_attempt: status must be 'succeeded', 'failed' or 'lost', not {status!r}")
        p = self.P
        now_sql, now_args = self._clock()

        def run(cur: Cursor) -> bool:
            found = cur.execute(f"SELECT rollout_id FROM attempts WHERE attempt_id={p}", (attempt_id,)).fetchone()
            if found is None:
                raise NotFound(f"complete_attempt: no attempt {attempt_id!r}")
            rollout_id = found[0]
            self._lock_rollout(cur, rollout_id)
            current, number, now = cur.execute(
                f"SELECT status, number, {now_sql} FROM attempts WHERE attempt_id={p}{self.FOR_UPDATE}",
                (*now_args, attempt_id),
            ).fetchone() or ("gone", 0, 0.0)
            if current != "running":
                return False
            if status == "lost":
                why = f"attempt {number} lost: {error}" if error else f"attempt {number} lost (reported by its worker)"
                self._end_attempt(cur, attempt_id, rollout_id, "lost", why, now)
                return True
            cur.execute(
                f"UPDATE attempts SET status={p}, ended_at={p}, heartbeat_at={p}, error={p} WHERE attempt_id={p}",
                (status, now, now, error, attempt_id),
            )
            cur.execute(
                f"UPDATE rollouts SET status={p}, final_reward={p}, error={p}, finished_at={p}, current_attempt=NULL "
                f"WHERE rollout_id={p} AND current_attempt={p}",
                (status, final_reward, error, now, rollout_id, attempt_id),
            )
            return True

        return self._tx(run)

    def get_rollout(self, rollout_id: str) -> Rollout:
        rows = self._read(f"SELECT {ROLLOUT_COLS} FROM rollouts WHERE rollout_id={self.P}", (rollout_id,))
        if not rows:
            raise NotFound(f"no rollout {rollout_id!r}")
        return rollout_from_row(rows[0])

    def get_rollouts(self, rollout_ids: Sequence[str]) -> list[Rollout]:
        ids = list(rollout_ids)
        found: dict[str, Rollout] = {}
        for chunk in self._chunks(ids):
            match, args = self._in(chunk)
            for row in self._read(f"SELECT {ROLLOUT_COLS} FROM rollouts WHERE rollout_id {match}", args):
                found[row[0]] = rollout_from_row(row)
        missing = [r for r in ids if r not in found]
        if missing:
            raise NotFound(
                f"no rollout {missing[0]!r}" + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else "")
            )
        return [found[r] for r in ids]

    def list_rollouts(
        self, status: str | None = None, mode: str | None = None, limit: int = 100, offset: int = 0
    ) -> list[Rollout]:
        filters = {"status": status, "mode": mode}
        where = [f"{column}={self.P}" for column, value in filters.items() if value is not None]
        args = [value for value in filters.values() if value is not None]
        clause = f"WHERE {' AND '.join(where)}" if where else ""
        rows = self._read(
            f"SELECT {ROLLOUT_COLS} FROM rollouts {clause} ORDER BY seq DESC LIMIT {self.P} OFFSET {self.P}",
            (*args, limit, offset),
        )
        return [rollout_from_row(r) for r in rows]

    def list_attempts(self, rollout_id: str) -> list[Attempt]:
        rows = self._read(
            f"SELECT {ATTEMPT_COLS} FROM attempts WHERE rollout_id={self.P} ORDER BY number", (rollout_id,)
        )
        return [attempt_from_row(r) for r in rows]

    def cancel(self, rollout_ids: Sequence[str], reason: str | None = None) -> int:
        check_cancel_reason(reason)
        ids = sorted(set(rollout_ids))  # rows locked in one order by every writer
        now_sql, now_args = self._clock()

        def run(cur: Cursor) -> int:
            changed = 0
            for chunk in self._chunks(ids):
                match, args = self._in(chunk)
                rows = cur.execute(
                    f"SELECT rollout_id, {now_sql} FROM rollouts WHERE rollout_id {match} "
                    f"AND status IN ('queued','running') ORDER BY rollout_id{self.FOR_UPDATE}",
                    (*now_args, *args),
                ).fetchall()
                if not rows:
                    continue
                live, now = [r[0] for r in rows], rows[0][1]
                match, args = self._in(live)
                cur.execute(
                    f"UPDATE attempts SET status='failed', ended_at={self.P}, error={self.P} "
                    f"WHERE rollout_id {match} AND status='running'",
                    (now, reason or "cancelled", *args),
                )
                cur.execute(
                    f"UPDATE rollouts SET status='cancelled', finished_at={self.P}, current_attempt=NULL, "
                    f"error={self.P} WHERE rollout_id {match}",
                    (now, reason, *args),
                )
                changed += len(live)
            return changed

        return self._tx(run)

    def reap(self) -> int:
        settings = self.settings
        p = self.P
        now_sql, now_args = self._clock()
        stale = f"status='running' AND (heartbeat_at < {now_sql} - {p} OR started_at < {now_sql} - {p})"
        limits = (*now_args, settings.heartbeat_timeout, *now_args, settings.attempt_timeout)
        if not self._read(f"SELECT 1 FROM attempts WHERE {stale} LIMIT 1", limits):
            return 0

        def run(cur: Cursor) -> int:
            found = cur.execute(
                f"SELECT attempt_id, rollout_id FROM attempts WHERE {stale} ORDER BY rollout_id", limits
            ).fetchall()
            reaped = 0
            for attempt_id, rollout_id in found:
                self._lock_rollout(cur, rollout_id)
                row = cur.execute(
                    f"SELECT number, started_at, heartbeat_at, {now_sql} FROM attempts "
                    f"WHERE attempt_id={p} AND {stale}{self.FOR_UPDATE}",
                    (*now_args, attempt_id, *limits),
                ).fetchone()
                if row is None:  # another server reaped it, or it heartbeat meanwhile
                    continue
                number, started_at, heartbeat_at, now = row
                if started_at < now - settings.attempt_timeout:
                    status: AttemptStatus = "timed_out"
                    why = f"attempt {number} timed out after {settings.attempt_timeout:g}s"
                else:
                    status = "lost"
                    why = f"attempt {number} lost: no heartbeat for {now - heartbeat_at:.1f}s (worker died?)"
                reaped += self._end_attempt(cur, attempt_id, rollout_id, status, why, now)
            return reaped

        return self._tx(run)

    def _end_attempt(
        self, cur: Cursor, attempt_id: str, rollout_id: str, status: AttemptStatus, why: str, now: float
    ) -> bool:
        """End a running attempt as lost / timed_out (its rollout row locked): the rollout is queued again while it
        has tries left, else it fails with ``why``. False when the rollout had already moved on to another attempt."""
        p = self.P
        cur.execute(
            f"UPDATE attempts SET status={p}, ended_at={p}, error={p} WHERE attempt_id={p}",
            (status, now, why, attempt_id),
        )
        ro = cur.execute(
            f"SELECT attempts, max_attempts FROM rollouts WHERE rollout_id={p} AND current_attempt={p}",
            (rollout_id, attempt_id),
        ).fetchone()
        if ro is None:
            return False
        tries, max_attempts = ro
        if tries >= max_attempts:
            cur.execute(
                f"UPDATE rollouts SET status='failed', error={p}, finished_at={p}, current_attempt=NULL "
                f"WHERE rollout_id={p}",
                (f"{why}; no attempts left ({tries}/{max_attempts})", now, rollout_id),
            )
        else:
            cur.execute(
                f"UPDATE rollouts SET status='queued', current_attempt=NULL WHERE rollout_id={p}", (rollout_id,)
            )
        return True

    def live_attempt(self, rollout_id: str) -> LiveAttempt:
        """One indexed row: a rollout's ``current_attempt`` is its running attempt, set by ``lease`` and cleared
        whenever that attempt ends."""
        return self._live(rollout_id, self._read(self._LIVE_SQL.format(P=self.P), (rollout_id,)))

    _LIVE_SQL = "SELECT status, resources_version, current_attempt FROM rollouts WHERE rollout_id={P}"

    @staticmethod
    def _live(rollout_id: str, rows: Sequence[Any]) -> LiveAttempt:
        """The ``LiveAttempt`` of the row ``_LIVE_SQL`` read (NotFound when there is none)."""
        if not rows:
            raise NotFound(f"no rollout {rollout_id!r}")
        status, version, current = rows[0]
        return LiveAttempt(status, version, current if status == "running" else None)

    def wait(self, rollout_ids: Sequence[str], timeout: float, poll: float = 0.05) -> list[Rollout]:
        return self._wait_counting(rollout_ids, timeout, poll, self._unfinished)

    def _unfinished(self, ids: list[str]) -> int:
        count = 0
        for chunk in self._chunks(ids):
            match, args = self._in(chunk)
            rows = self._read(
                f"SELECT COUNT(*) FROM rollouts WHERE rollout_id {match} AND status IN ('queued', 'running')", args
            )
            count += int(rows[0][0])
        return count

    # spans ----------------------------------------------------------------------------------------------------
    def query_spans(
        self,
        rollout_id: str | None = None,
        attempt_id: str | None = None,
        kind: str | None = None,
        agent: str | None = None,
        limit: int | None = None,
        offset: int = 0,
    ) -> list[Span]:
        filters = {"rollout_id": rollout_id, "attempt_id": attempt_id, "kind": kind, "agent": agent}
        where = [f"{column}={self.P}" for column, value in filters.items() if value is not None]
        args: list[Any] = [value for value in filters.values() if value is not None]
        clause = f"WHERE {' AND '.join(where)}" if where else ""
        args += [self.NO_LIMIT if limit is None else int(limit), int(offset)]
        rows = self._read(f"SELECT span_id, body FROM spans {clause} ORDER BY seq LIMIT {self.P} OFFSET {self.P}", args)
        return spans_from_rows(rows, self.location)

    # resources ------------------------------------------------------------------------------------------------
    def publish_resources(self, resources: dict[str, Resource]) -> ResourceSet:
        if not resources:
            raise StoreError("publish_resources: at least one named resource is required")

        def run(cur: Cursor) -> ResourceSet:
            self._serialize(cur, "resources")  # versions 1, 2, 3, ... in order
            latest = cur.execute("SELECT COALESCE(MAX(version), 0) FROM resources").fetchone()[0]
            rs = ResourceSet(version=latest + 1, resources=resources)
            body = RESOURCES.dump_json(rs.resources).decode()
            cur.execute(f"INSERT INTO resources VALUES ({self.P},{self.P},{self.P})", (rs.version, body, rs.created_at))
            return rs

        return self._tx(run)

    def get_resources(self, version: int | None = None) -> ResourceSet:
        if version is None:
            rows = self._read("SELECT version, body, created_at FROM resources ORDER BY version DESC LIMIT 1")
        else:
            rows = self._read(f"SELECT version, body, created_at FROM resources WHERE version={self.P}", (version,))
        if not rows:
            raise NotFound("no resources published yet" if version is None else f"no resources version {version}")
        v, body, created = rows[0]
        return ResourceSet(version=v, resources=RESOURCES.validate_json(body), created_at=created)

    # records --------------------------------------------------------------------------------------------------
    def add_record(self, record: Record) -> None:
        body = json_text(record.data, "record data")
        p = self.P
        self._tx(
            lambda cur: cur.execute(
                f"INSERT INTO records (kind, key, body, created_at) VALUES ({p},{p},{p},{p})",
                (record.kind, record.key, body, record.created_at),
            )
        )

    def list_records(self, kind: str, key: str | None = None) -> list[Record]:
        where, args = f"kind={self.P}", [kind]
        if key is not None:
            where, args = f"{where} AND key={self.P}", [kind, key]
        rows = self._read(f"SELECT kind, key, body, created_at FROM records WHERE {where} ORDER BY id", args)
        return [Record(kind=k, key=ky, data=json.loads(b), created_at=t) for k, ky, b, t in rows]
