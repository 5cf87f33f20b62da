"""SQLite store: the embedded default. One file, WAL journal, safe across processes and restarts.

Concurrency model: one connection per store object guarded by a lock; writers in other processes are serialised by
SQLite itself (``BEGIN IMMEDIATE`` + busy timeout). Every state change is one transaction, so a crash never leaves a
half-written batch. Spans are stored as their JSON plus indexed columns; ``INSERT OR IGNORE`` makes uploads idempotent.

Durability: a call that returned has its transaction committed to the write-ahead log (WAL) with
``synchronous=NORMAL``: it survives the process being killed (``kill -9``) at any moment after that. A power loss or
an operating-system crash can roll back the transactions of the last moments before it (the WAL is synced to disk
at each checkpoint, not at each commit); the file is never corrupted. The WAL is kept small so that the main file
holds nearly everything: committed writes are copied into it (checkpointed) when the WAL reaches
``AUTOCHECKPOINT_PAGES`` pages, by the first read or write of this store object that comes ``CHECKPOINT_INTERVAL``
seconds or more after the previous checkpoint, and completely, the WAL emptied, when the store is closed. A closed
store is one self-contained file: losing its ``-wal`` file loses nothing.

Schema: the file records its schema version in ``PRAGMA user_version``. Opening an older file applies the missing
steps of ``_MIGRATIONS`` in order, in one transaction; a file written by a newer agl is refused with a ``StoreError``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter

from agl.core.store._rows import LIVE_ATTEMPT_SQL, live_attempt_of, span_select, spans_from_rows
from agl.core.store._rows import attempt_from_row as _attempt
from agl.core.store._rows import json_text as _json
from agl.core.store._rows import rollout_from_row as _rollout
from agl.core.store.base import (
    LiveAttempt,
    NotFound,
    Store,
    StoreError,
    StoreSettings,
    StoreUnavailable,
    check_cancel_reason,
)
from agl.core.types import (
    Attempt,
    AttemptStatus,
    Record,
    Resource,
    ResourceSet,
    Rollout,
    RolloutRequest,
    Span,
    new_id,
)

log = logging.getLogger("agl.store")

#: Version 0: the schema every store file starts from (files written before schema versions existed are at 0).
_BASE_SCHEMA: tuple[str, ...] = (
    """CREATE TABLE IF NOT EXISTS rollouts (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    rollout_id TEXT UNIQUE NOT NULL,
    task TEXT NOT NULL,
    task_id TEXT,
    mode TEXT NOT NULL,
    resources_version INTEGER NOT NULL,
    status TEXT NOT NULL,
    max_attempts INTEGER NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0,
    current_attempt TEXT,
    final_reward REAL,
    error TEXT,
    created_at REAL NOT NULL,
    finished_at REAL,
    metadata TEXT NOT NULL
)""",
    "CREATE INDEX IF NOT EXISTS rollouts_status ON rollouts(status, seq)",
    """CREATE TABLE IF NOT EXISTS attempts (
    attempt_id TEXT PRIMARY KEY,
    rollout_id TEXT NOT NULL,
    number INTEGER NOT NULL,
    worker_id TEXT NOT NULL,
    status TEXT NOT NULL,
    started_at REAL NOT NULL,
    heartbeat_at REAL NOT NULL,
    ended_at REAL,
    error TEXT
)""",
    "CREATE INDEX IF NOT EXISTS attempts_rollout ON attempts(rollout_id, number)",
    "CREATE INDEX IF NOT EXISTS attempts_running ON attempts(status)",
    """CREATE TABLE IF NOT EXISTS spans (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    span_id TEXT UNIQUE NOT NULL,
    rollout_id TEXT NOT NULL,
    attempt_id TEXT NOT NULL,
    kind TEXT NOT NULL,
    agent TEXT,
    start_time REAL NOT NULL,
    sequence INTEGER NOT NULL,
    body TEXT NOT NULL
)""",
    "CREATE INDEX IF NOT EXISTS spans_rollout ON spans(rollout_id, start_time, sequence)",
    "CREATE INDEX IF NOT EXISTS spans_attempt ON spans(attempt_id, start_time, sequence)",
    """CREATE TABLE IF NOT EXISTS resources (
    version INTEGER PRIMARY KEY,
    body TEXT NOT NULL,
    created_at REAL NOT NULL
)""",
    """CREATE TABLE IF NOT EXISTS records (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    kind TEXT NOT NULL,
    key TEXT NOT NULL,
    body TEXT NOT NULL,
    created_at REAL NOT NULL
)""",
    "CREATE INDEX IF NOT EXISTS records_kind ON records(kind, key, id)",
)

#: Forward migrations: step ``i`` takes a file from schema version ``i`` to ``i + 1``. Append only; never edit a step
#: that has shipped (files in the field are at every earlier version).
_MIGRATIONS: tuple[tuple[str, ...], ...] = (
    # 1: spans are read in the order the store received them (``seq``), no longer by their producers' clocks.
    (
        "CREATE INDEX IF NOT EXISTS spans_rollout_arrival ON spans(rollout_id, seq)",
        "CREATE INDEX IF NOT EXISTS spans_attempt_arrival ON spans(attempt_id, seq)",
        "DROP INDEX IF EXISTS spans_rollout",
        "DROP INDEX IF EXISTS spans_attempt",
    ),
)
#: The schema version this agl writes (``PRAGMA user_version`` of a store file it created or migrated).
SCHEMA_VERSION = len(_MIGRATIONS)

#: Large pages suit multi-KB span bodies (measured: ~2x ingest vs. the 4 KiB default).
PAGE_SIZE = 16384
#: The WAL is checkpointed into the main file when it holds this many pages (16 MiB at ``PAGE_SIZE``).
AUTOCHECKPOINT_PAGES = 1000
#: After a checkpoint has emptied the WAL, a WAL file larger than this is truncated back to it.
WAL_SIZE_LIMIT = AUTOCHECKPOINT_PAGES * PAGE_SIZE
#: The first read or write this many seconds after the previous checkpoint checkpoints what was committed since.
CHECKPOINT_INTERVAL = 1.0

#: SQLite's primary result codes that mean "the database cannot take a write now" (the call may succeed later),
#: as opposed to an error in the statement itself.
_UNAVAILABLE = frozenset(
    {
        sqlite3.SQLITE_BUSY,
        sqlite3.SQLITE_LOCKED,
        sqlite3.SQLITE_READONLY,
        sqlite3.SQLITE_IOERR,
        sqlite3.SQLITE_FULL,
        sqlite3.SQLITE_CANTOPEN,
        sqlite3.SQLITE_PROTOCOL,
    }
)

#: How long ``close`` waits for other connections to let it checkpoint the whole WAL.
_CLOSE_BUSY_MS = 2000

_RESOURCES = TypeAdapter(dict[str, Resource])
_ROLLOUT_COLS = (
    "rollout_id, task, task_id, mode, resources_version, status, max_attempts, attempts, final_reward, error, "
    "created_at, finished_at, metadata"
)
_ATTEMPT_COLS = "attempt_id, rollout_id, number, worker_id, status, started_at, heartbeat_at, ended_at, error"


def path_from_url(url: str) -> Path:
    """``sqlite:///runs/agl.db`` → ``runs/agl.db``; ``sqlite:////abs/agl.db`` → ``/abs/agl.db``."""
    if not url.startswith("sqlite:///"):
        raise StoreError(f"store URL {url!r}: expected sqlite:///relative/path.db or sqlite:////absolute/path.db")
    return Path(url[len("sqlite:///") :])


class SqliteStore(Store):
    """Embedded store in one SQLite file (created with its folder if missing, migrated if older).

    A new file is created readable by its owner only (mode 0600; SQLite gives its ``-wal`` and ``-shm`` files the
    same mode): it holds the API keys of published LLM resources.
    """

    def __init__(self, path: str | Path, settings: StoreSettings | None = None) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if str(path) != ":memory:":
            with contextlib.suppress(FileExistsError):
                os.close(os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        self.settings = settings or StoreSettings()
        self._lock = threading.RLock()
        self._closed = False
        self._dirty = False
        self._last_checkpoint = time.monotonic()
        self._conn = sqlite3.connect(self.path, timeout=30.0, isolation_level=None, check_same_thread=False)
        try:
            self._conn.execute(f"PRAGMA page_size={PAGE_SIZE}")
            self._conn.execute("PRAGMA journal_mode=WAL")
            self._conn.execute("PRAGMA synchronous=NORMAL")
            self._conn.execute(f"PRAGMA wal_autocheckpoint={AUTOCHECKPOINT_PAGES}")
            self._conn.execute(f"PRAGMA journal_size_limit={WAL_SIZE_LIMIT}")
            self._conn.execute("PRAGMA cache_size=-65536")
            self._conn.execute("PRAGMA busy_timeout=30000")
            self._migrate()
        except BaseException:
            self._conn.close()
            raise

    def _schema_version(self) -> int:
        version = int(self._conn.execute("PRAGMA user_version").fetchone()[0])
        if version > SCHEMA_VERSION:
            raise StoreError(
                f"store file {self.path} has schema version {version}, but this agl knows versions up to "
                f"{SCHEMA_VERSION}: it was written by a newer agl; upgrade agl to open it"
            )
        return version

    def _migrate(self) -> None:
        """Bring the file to ``SCHEMA_VERSION``: create it, or apply the missing migrations in one transaction."""
        if self._schema_version() == SCHEMA_VERSION:
            return
        with self._tx() as c:
            version = self._schema_version()  # another process may have migrated it since the check above
            if version == SCHEMA_VERSION:
                return
            existing = c.execute("SELECT COUNT(*) FROM sqlite_master").fetchone()[0] > 0
            if version == 0:
                for statement in _BASE_SCHEMA:
                    c.execute(statement)
            for step in _MIGRATIONS[version:]:
                for statement in step:
                    c.execute(statement)
            c.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
        if existing:
            log.info("store %s migrated from schema version %d to %d", self.path, version, SCHEMA_VERSION)

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        """One write transaction, taken eagerly so concurrent processes queue instead of deadlocking.

        A database that cannot take the write now (read-only, locked past the busy timeout, disk full, I/O error)
        raises ``StoreUnavailable`` naming the file and SQLite's reason: nothing was written, and the same call may
        succeed once the cause is fixed (the server answers it with 503, which clients retry).
        """
        with self._lock:
            try:
                self._conn.execute("BEGIN IMMEDIATE")
                try:
                    yield self._conn
                except BaseException:
                    self._conn.execute("ROLLBACK")
                    raise
                self._conn.execute("COMMIT")
            except sqlite3.OperationalError as exc:
                if self._conn.in_transaction:
                    self._conn.execute("ROLLBACK")
                if exc.sqlite_errorcode & 0xFF not in _UNAVAILABLE:  # a bug (bad SQL, too many variables): a 500
                    raise
                raise StoreUnavailable(f"the SQLite store {self.path} cannot take writes now: {exc}") from exc
            self._dirty = True
            self._checkpoint_if_due()

    def _read(self, sql: str, args: Sequence[Any] = ()) -> list[sqlite3.Row]:
        with self._lock:
            rows = self._conn.execute(sql, args).fetchall()
            self._checkpoint_if_due()
            return rows

    def _checkpoint_if_due(self) -> None:
        """Copy committed writes into the main file once ``CHECKPOINT_INTERVAL`` passed since the last copy.

        PASSIVE: it never waits for other connections; what they still read is copied by a later checkpoint. A
        failure leaves the data in the WAL (still durable), so it is logged, never raised into the caller.
        """
        now = time.monotonic()
        if not self._dirty or now - self._last_checkpoint < CHECKPOINT_INTERVAL:
            return
        self._dirty = False
        self._last_checkpoint = now
        try:
            self._conn.execute("PRAGMA wal_checkpoint(PASSIVE)")
        except sqlite3.Error as exc:
            log.warning("store %s: checkpoint failed (the data stays in the WAL): %s", self.path, exc)

    # rollouts -------------------------------------------------------------------------------------------------
    def enqueue(self, requests: Sequence[RolloutRequest]) -> list[Rollout]:
        now = time.time()
        out: list[Rollout] = []
        with self._tx() as c:
            latest = c.execute("SELECT MAX(version) FROM resources").fetchone()[0]
            for req in requests:
                version = req.resources_version or latest
                if version is None:
                    raise StoreError("enqueue: no resources published yet; publish_resources(...) first")
                if req.resources_version is not None and (latest is None or req.resources_version > latest):
                    raise NotFound(f"enqueue: resources_version {req.resources_version} was never published")
                if req.rollout_id is not None:
                    row = c.execute(f"SELECT {_ROLLOUT_COLS} FROM rollouts WHERE rollout_id=?", (req.rollout_id,))
                    stored = row.fetchone()
                    if stored is not None:
                        out.append(_rollout(stored))
                        continue
                ro = Rollout(
                    rollout_id=req.rollout_id or new_id("ro"),
                    task=req.task,
                    task_id=req.task_id,
                    mode=req.mode,
                    resources_version=version,
                    max_attempts=req.max_attempts,
                    created_at=now,
                    metadata=req.metadata,
                )
                c.execute(
                    f"INSERT INTO rollouts ({_ROLLOUT_COLS}) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)",
                    (
                        ro.rollout_id,
                        _json(ro.task, "task"),
                        ro.task_id,
                        ro.mode,
                        ro.resources_version,
                        ro.status,
                        ro.max_attempts,
                        0,
                        None,
                        None,
                        now,
                        None,
                        _json(ro.metadata, "metadata"),
                    ),
                )
                out.append(ro)
        return out

    def lease(self, worker_id: str) -> tuple[Rollout, Attempt] | None:
        self.reap()
        now = time.time()
        with self._tx() as c:
            row = c.execute(
                "SELECT rollout_id, attempts FROM rollouts WHERE status='queued' ORDER BY seq LIMIT 1"
            ).fetchone()
            if row is None:
                return None
            rollout_id, tries = row
            attempt = Attempt(
                attempt_id=new_id("at"),
                rollout_id=rollout_id,
                number=tries + 1,
                worker_id=worker_id,
                started_at=now,
                heartbeat_at=now,
            )
            c.execute(
                f"INSERT INTO attempts ({_ATTEMPT_COLS}) VALUES (?,?,?,?,?,?,?,?,?)",
                (attempt.attempt_id, rollout_id, attempt.number, worker_id, "running", now, now, None, None),
            )
            c.execute(
                "UPDATE rollouts SET status='running', attempts=?, current_attempt=? WHERE rollout_id=?",
                (attempt.number, attempt.attempt_id, rollout_id),
            )
            ro = c.execute(f"SELECT {_ROLLOUT_COLS} FROM rollouts WHERE rollout_id=?", (rollout_id,)).fetchone()
        return _rollout(ro), attempt

    def heartbeat(self, attempt_id: str) -> bool:
        with self._tx() as c:
            cur = c.execute(
                "UPDATE attempts SET heartbeat_at=? WHERE attempt_id=? AND status='running'", (time.time(), attempt_id)
            )
            return cur.rowcount == 1

    def complete_attempt(
        self, attempt_id: str, status: AttemptStatus, final_reward: float | None = None, error: str | None = None
    ) -> bool:
        if status not in ("succeeded", "failed", "lost"):
            raise StoreError(f"complete_attempt: status must be 'succeeded', 'failed' or 'lost', not {status!r}")
        now = time.time()
        with self._tx() as c:
            row = c.execute(
                "SELECT rollout_id, status, number FROM attempts WHERE attempt_id=?", (attempt_id,)
            ).fetchone()
            if row is None:
                raise NotFound(f"complete_attempt: no attempt {attempt_id!r}")
            rollout_id, current, number = row
            if current != "running":
                return False
            if status == "lost":
                why = f"attempt {number} lost: {error}" if error else f"attempt {number} lost (reported by its worker)"
                self._end_attempt(c, attempt_id, rollout_id, "lost", why, now)
                return True
            c.execute(
                "UPDATE attempts SET status=?, ended_at=?, heartbeat_at=?, error=? WHERE attempt_id=?",
                (status, now, now, error, attempt_id),
            )
            c.execute(
                "UPDATE rollouts SET status=?, final_reward=?, error=?, finished_at=?, current_attempt=NULL "
                "WHERE rollout_id=? AND current_attempt=?",
                (status, final_reward, error, now, rollout_id, attempt_id),
            )
        return True

    def get_rollout(self, rollout_id: str) -> Rollout:
        rows = self._read(f"SELECT {_ROLLOUT_COLS} FROM rollouts WHERE rollout_id=?", (rollout_id,))
        if not rows:
            raise NotFound(f"no rollout {rollout_id!r}")
        return _rollout(rows[0])

    def get_rollouts(self, rollout_ids: Sequence[str]) -> list[Rollout]:
        found: dict[str, Rollout] = {}
        ids = list(rollout_ids)
        for i in range(0, len(ids), 500):
            chunk = ids[i : i + 500]
            marks = ",".join("?" * len(chunk))
            for row in self._read(f"SELECT {_ROLLOUT_COLS} FROM rollouts WHERE rollout_id IN ({marks})", chunk):
                found[row[0]] = _rollout(row)
        missing = [r for r in ids if r not in found]
        if missing:
            raise NotFound(
                f"no rollout {missing[0]!r}" + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else "")
            )
        return [found[r] for r in ids]

    def list_rollouts(
        self, status: str | None = None, mode: str | None = None, limit: int = 100, offset: int = 0
    ) -> list[Rollout]:
        where, args = [], []
        if status is not None:
            where.append("status=?")
            args.append(status)
        if mode is not None:
            where.append("mode=?")
            args.append(mode)
        clause = f"WHERE {' AND '.join(where)}" if where else ""
        rows = self._read(
            f"SELECT {_ROLLOUT_COLS} FROM rollouts {clause} ORDER BY seq DESC LIMIT ? OFFSET ?", (*args, limit, offset)
        )
        return [_rollout(r) for r in rows]

    def list_attempts(self, rollout_id: str) -> list[Attempt]:
        rows = self._read(f"SELECT {_ATTEMPT_COLS} FROM attempts WHERE rollout_id=? ORDER BY number", (rollout_id,))
        return [_attempt(r) for r in rows]

    def cancel(self, rollout_ids: Sequence[str], reason: str | None = None) -> int:
        check_cancel_reason(reason)
        now = time.time()
        changed = 0
        with self._tx() as c:
            for rid in rollout_ids:
                c.execute(
                    "UPDATE attempts SET status='failed', ended_at=?, error=? WHERE rollout_id=? AND status='running'",
                    (now, reason or "cancelled", rid),
                )
                cur = c.execute(
                    "UPDATE rollouts SET status='cancelled', finished_at=?, current_attempt=NULL, error=? "
                    "WHERE rollout_id=? AND status IN ('queued','running')",
                    (now, reason, rid),
                )
                changed += cur.rowcount
        return changed

    def reap(self) -> int:
        now = time.time()
        hb_limit = now - self.settings.heartbeat_timeout
        run_limit = now - self.settings.attempt_timeout
        with self._lock:
            stale = self._conn.execute(
                "SELECT 1 FROM attempts WHERE status='running' AND (heartbeat_at<? OR started_at<?) LIMIT 1",
                (hb_limit, run_limit),
            ).fetchone()
        if stale is None:
            return 0
        reaped = 0
        with self._tx() as c:
            rows = c.execute(
                "SELECT attempt_id, rollout_id, number, started_at, heartbeat_at FROM attempts "
                "WHERE status='running' AND (heartbeat_at<? OR started_at<?)",
                (hb_limit, run_limit),
            ).fetchall()
            for attempt_id, rollout_id, number, started_at, heartbeat_at in rows:
                if started_at < run_limit:
                    status: AttemptStatus = "timed_out"
                    why = f"attempt {number} timed out after {self.settings.attempt_timeout:g}s"
                else:
                    status = "lost"
                    why = f"attempt {number} lost: no heartbeat for {now - heartbeat_at:.1f}s (worker died?)"
                reaped += self._end_attempt(c, attempt_id, rollout_id, status, why, now)
        return reaped

    @staticmethod
    def _end_attempt(
        c: sqlite3.Connection, attempt_id: str, rollout_id: str, status: AttemptStatus, why: str, now: float
    ) -> bool:
        """End a running attempt as lost / timed_out: its rollout is queued again while it has tries left, else it
        fails with ``why``. False when the rollout had already moved on to another attempt (nothing to settle)."""
        c.execute(
            "UPDATE attempts SET status=?, ended_at=?, error=? WHERE attempt_id=?", (status, now, why, attempt_id)
        )
        ro = c.execute(
            "SELECT attempts, max_attempts FROM rollouts WHERE rollout_id=? AND current_attempt=?",
            (rollout_id, attempt_id),
        ).fetchone()
        if ro is None:
            return False
        tries, max_attempts = ro
        if tries >= max_attempts:
            c.execute(
                "UPDATE rollouts SET status='failed', error=?, finished_at=?, current_attempt=NULL WHERE rollout_id=?",
                (f"{why}; no attempts left ({tries}/{max_attempts})", now, rollout_id),
            )
        else:
            c.execute("UPDATE rollouts SET status='queued', current_attempt=NULL WHERE rollout_id=?", (rollout_id,))
        return True

    def live_attempt(self, rollout_id: str) -> LiveAttempt:
        """One indexed row (see ``live_attempt_of``)."""
        return live_attempt_of(self._read(LIVE_ATTEMPT_SQL, (rollout_id,)), rollout_id)

    def wait(self, rollout_ids: Sequence[str], timeout: float, poll: float = 0.05) -> list[Rollout]:
        return self._wait_counting(rollout_ids, timeout, poll, self._unfinished)

    def _unfinished(self, ids: list[str]) -> int:
        count = 0
        for i in range(0, len(ids), 500):
            chunk = ids[i : i + 500]
            marks = ",".join("?" * len(chunk))
            rows = self._read(
                f"SELECT COUNT(*) FROM rollouts WHERE rollout_id IN ({marks}) AND status IN ('queued', 'running')",
                chunk,
            )
            count += rows[0][0]
        return count

    # spans ----------------------------------------------------------------------------------------------------
    def add_spans(self, spans: Sequence[Span]) -> int:
        rows = [
            (s.span_id, s.rollout_id, s.attempt_id, s.kind, s.agent, s.start_time, s.sequence, s.model_dump_json())
            for s in spans
        ]
        with self._tx() as c:
            before = c.total_changes
            c.executemany(
                "INSERT OR IGNORE INTO spans (span_id, rollout_id, attempt_id, kind, agent, start_time, sequence, "
                "body) VALUES (?,?,?,?,?,?,?,?)",
                rows,
            )
            return c.total_changes - before

    def query_spans(
        self,
        rollout_id: str | None = None,
        attempt_id: str | None = None,
        kind: str | None = None,
        agent: str | None = None,
        limit: int | None = None,
        offset: int = 0,
    ) -> list[Span]:
        sql, args = span_select(
            "?",
            {"rollout_id": rollout_id, "attempt_id": attempt_id, "kind": kind, "agent": agent},
            limit,
            offset,
            unlimited=-1,
        )
        return spans_from_rows(self._read(sql, args), str(self.path))

    # resources ------------------------------------------------------------------------------------------------
    def publish_resources(self, resources: dict[str, Resource]) -> ResourceSet:
        if not resources:
            raise StoreError("publish_resources: at least one named resource is required")
        with self._tx() as c:
            latest = c.execute("SELECT MAX(version) FROM resources").fetchone()[0] or 0
            rs = ResourceSet(version=latest + 1, resources=resources)
            c.execute(
                "INSERT INTO resources VALUES (?,?,?)",
                (rs.version, _RESOURCES.dump_json(rs.resources).decode(), rs.created_at),
            )
        return rs

    def get_resources(self, version: int | None = None) -> ResourceSet:
        if version is None:
            rows = self._read("SELECT version, body, created_at FROM resources ORDER BY version DESC LIMIT 1")
        else:
            rows = self._read("SELECT version, body, created_at FROM resources WHERE version=?", (version,))
        if not rows:
            raise NotFound("no resources published yet" if version is None else f"no resources version {version}")
        v, body, created = rows[0]
        return ResourceSet(version=v, resources=_RESOURCES.validate_json(body), created_at=created)

    # records --------------------------------------------------------------------------------------------------
    def add_record(self, record: Record) -> None:
        with self._tx() as c:
            c.execute(
                "INSERT INTO records (kind, key, body, created_at) VALUES (?,?,?,?)",
                (record.kind, record.key, _json(record.data, "record data"), record.created_at),
            )

    def list_records(self, kind: str, key: str | None = None) -> list[Record]:
        if key is None:
            rows = self._read("SELECT kind, key, body, created_at FROM records WHERE kind=? ORDER BY id", (kind,))
        else:
            rows = self._read(
                "SELECT kind, key, body, created_at FROM records WHERE kind=? AND key=? ORDER BY id", (kind, key)
            )
        return [Record(kind=k, key=ky, data=json.loads(b), created_at=t) for k, ky, b, t in rows]

    def close(self) -> None:
        """Checkpoint the whole WAL into the main file and empty it, then close (a second call does nothing).

        Other connections to the file get ``_CLOSE_BUSY_MS`` to finish what they are doing; if they are still busy
        the rest stays in the WAL (durable, copied by the next checkpoint) and a warning says so.
        """
        with self._lock:
            if self._closed:
                return
            self._closed = True
            try:
                self._conn.execute(f"PRAGMA busy_timeout={_CLOSE_BUSY_MS}")
                busy, _, _ = self._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
                if busy:
                    log.warning("store %s: other connections kept part of the WAL from the main file", self.path)
            except sqlite3.Error as exc:
                log.warning("store %s: final checkpoint failed (the data stays in the WAL): %s", self.path, exc)
            finally:
                self._conn.close()
