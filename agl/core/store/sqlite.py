"""SQLite store: the embedded default. One file, WAL journal, safe across processes and restarts.

Concurrency model: one connection per store object guarded by a lock; writers in other processes are serialised by
SQLite itself (``BEGIN IMMEDIATE`` + busy timeout). Every state change is one transaction, so a crash never leaves a
half-written batch. Spans are stored as their JSON plus indexed columns; ``INSERT OR IGNORE`` makes uploads idempotent.

Durability: a call that returned has its transaction committed to the write-ahead log (WAL) with
``synchronous=NORMAL``: it survives the process being killed (``kill -9``) at any moment after that. A power loss or
an operating-system crash can roll back the transactions of the last moments before it (the WAL is synced to disk
at each checkpoint, not at each commit); the file is never corrupted. The WAL is kept small so that the main file
holds nearly everything: committed writes are copied into it (checkpointed) when the WAL reaches
``AUTOCHECKPOINT_PAGES`` pages, every ``CHECKPOINT_INTERVAL`` seconds after a write by a background thread with a
connection of its own (``agl-sqlite-checkpoint``; a PASSIVE checkpoint never blocks a writer or reader, so no call
waits for one), and completely, the WAL emptied, when the store is closed. A closed
store is one self-contained file: losing its ``-wal`` file loses nothing.

Schema: the file records its schema version in ``PRAGMA user_version``. Opening an older file applies the missing
steps of ``_MIGRATIONS`` in order, in one transaction; a file written by a newer agl is refused with a ``StoreError``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from agl.core.store.base import LiveAttempt, NotFound, StoreError, StoreSettings, StoreUnavailable
from agl.core.store.sql import ATTEMPT_COLS, ROLLOUT_COLS, SqlStore, json_text, rollout_from_row
from agl.core.types import Attempt, Rollout, RolloutRequest, Span, new_id

log = logging.getLogger("agl.store")

T = TypeVar("T")

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


def path_from_url(url: str) -> Path:
    """``sqlite:///runs/agl.db`` → ``runs/agl.db``; ``sqlite:////abs/agl.db`` → ``/abs/agl.db``."""
    if not url.startswith("sqlite:///"):
        raise StoreError(f"store URL {url!r}: expected sqlite:///relative/path.db or sqlite:////absolute/path.db")
    return Path(url[len("sqlite:///") :])


class SqliteStore(SqlStore):
    """Embedded store in one SQLite file (created with its folder if missing, migrated if older).

    A new file is created readable by its owner only (mode 0600; SQLite gives its ``-wal`` and ``-shm`` files the
    same mode): it holds the API keys of published LLM resources.
    """

    P = "?"
    NO_LIMIT = -1
    IN_CHUNK = 500

    def __init__(self, path: str | Path, settings: StoreSettings | None = None) -> None:
        self.path = Path(path)
        self.location = str(self.path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if str(path) != ":memory:":
            with contextlib.suppress(FileExistsError):
                os.close(os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        self.settings = settings or StoreSettings()
        self._lock = threading.RLock()
        self._closed = False
        #: Write transactions committed by this store object, and how many of them the last checkpoint copied.
        self.written = 0
        self.checkpointed = 0
        self._stop = threading.Event()
        self._checkpointer: threading.Thread | None = None
        #: A read-only connection of its own for ``live_attempt_now`` (opened on first use), and its lock.
        self._reader: sqlite3.Connection | None = None
        self._reader_lock = threading.Lock()
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

        def run(c: sqlite3.Cursor) -> tuple[int, bool]:
            version = self._schema_version()  # another process may have migrated it since the check above
            if version == SCHEMA_VERSION:
                return version, False
            existing = c.execute("SELECT COUNT(*) FROM sqlite_master").fetchone()[0] > 0
            if version == 0:
                for statement in _BASE_SCHEMA:
                    c.execute(statement)
            for step in _MIGRATIONS[version:]:
                for statement in step:
                    c.execute(statement)
            c.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
            return version, existing

        version, existing = self._tx(run)
        if existing:
            log.info("store %s migrated from schema version %d to %d", self.path, version, SCHEMA_VERSION)

    def _tx(self, fn: Callable[[sqlite3.Cursor], T]) -> T:
        """Run ``fn`` in one write transaction, taken eagerly so concurrent processes queue instead of deadlocking.

        A database that cannot take the write now (read-only, locked past the busy timeout, disk full, I/O error)
        raises ``StoreUnavailable`` naming the file and SQLite's reason: nothing was written, and the same call may
        succeed once the cause is fixed (the server answers it with 503, which clients retry).
        """
        with self._lock:
            try:
                self._conn.execute("BEGIN IMMEDIATE")
                try:
                    result = fn(self._conn.cursor())
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
            self._wrote()
            return result

    def _read(self, sql: str, args: Sequence[Any] = ()) -> list[Any]:
        with self._lock:
            return self._conn.execute(sql, args).fetchall()

    def live_attempt_now(self, rollout_id: str) -> LiveAttempt | None:
        """The gateway's per-call check on a read-only connection of its own, which never waits: a read in WAL mode
        does not wait for writers (the store's lock, a span batch being committed), ``busy_timeout`` is 0, and a
        read already running on it or a busy file (a checkpoint resetting the WAL) answers None instead, so the
        caller reads through ``live_attempt`` off its loop. It sees every transaction committed before it starts.
        One indexed row: ~7 µs, against ~0.1 ms for a hop to a worker thread and back."""
        if self.location == ":memory:" or not self._reader_lock.acquire(blocking=False):
            return None
        try:
            if self._closed:
                return None
            if self._reader is None:
                self._reader = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
                self._reader.execute("PRAGMA query_only=1")
                self._reader.execute("PRAGMA busy_timeout=0")
            try:
                rows = self._reader.execute(self._LIVE_SQL.format(P=self.P), (rollout_id,)).fetchall()
            except sqlite3.OperationalError:
                return None
        finally:
            self._reader_lock.release()
        return self._live(rollout_id, rows)

    def _in(self, ids: Sequence[str]) -> tuple[str, tuple[Any, ...]]:
        return f"IN ({','.join('?' * len(ids))})", tuple(ids)

    def _wrote(self) -> None:
        """A write committed: the checkpointer (started by the first write) copies it within ``CHECKPOINT_INTERVAL``."""
        self.written += 1
        if self._checkpointer is None and self.location != ":memory:" and not self._closed:
            self._checkpointer = threading.Thread(
                target=self._checkpoint_loop, name="agl-sqlite-checkpoint", daemon=True
            )
            self._checkpointer.start()

    def _checkpoint_loop(self) -> None:
        """Copy committed writes into the main file every ``CHECKPOINT_INTERVAL`` seconds while there are any, on a
        connection of its own, off every caller's path (a checkpoint of a second's spans takes milliseconds).

        PASSIVE: it never waits for other connections; what they still read is copied by a later checkpoint. A
        failure leaves the data in the WAL (still durable), so it is logged and tried again at the next interval.
        """
        conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        try:
            while not self._stop.wait(CHECKPOINT_INTERVAL):
                target = self.written
                if target == self.checkpointed:
                    continue
                try:
                    conn.execute("PRAGMA wal_checkpoint(PASSIVE)")
                    self.checkpointed = target
                except sqlite3.Error as exc:
                    log.warning("store %s: checkpoint failed (the data stays in the WAL): %s", self.path, exc)
        finally:
            conn.close()

    # rollouts -------------------------------------------------------------------------------------------------
    def enqueue(self, requests: Sequence[RolloutRequest]) -> list[Rollout]:
        now = time.time()

        def run(c: sqlite3.Cursor) -> list[Rollout]:
            out: list[Rollout] = []
            latest = c.execute("SELECT MAX(version) FROM resources").fetchone()[0]
            for req in requests:
                version = req.resources_version or latest
                if version is None:
                    raise StoreError("enqueue: no resources published yet; publish_resources(...) first")
                if req.resources_version is not None and (latest is None or req.resources_version > latest):
                    raise NotFound(f"enqueue: resources_version {req.resources_version} was never published")
                if req.rollout_id is not None:
                    row = c.execute(f"SELECT {ROLLOUT_COLS} FROM rollouts WHERE rollout_id=?", (req.rollout_id,))
                    stored = row.fetchone()
                    if stored is not None:
                        out.append(rollout_from_row(stored))
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
                    f"INSERT INTO rollouts ({ROLLOUT_COLS}) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)",
                    (
                        ro.rollout_id,
                        json_text(ro.task, "task"),
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
                        json_text(ro.metadata, "metadata"),
                    ),
                )
                out.append(ro)
            return out

        return self._tx(run)

    def lease(self, worker_id: str) -> tuple[Rollout, Attempt] | None:
        self.reap()
        if not self._read("SELECT 1 FROM rollouts WHERE status='queued' LIMIT 1"):
            return None  # idle runners poll: a read, never the write lock the gateway's span writes wait on
        now = time.time()

        def run(c: sqlite3.Cursor) -> tuple[Rollout, Attempt] | None:
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
                f"INSERT INTO attempts ({ATTEMPT_COLS}) VALUES (?,?,?,?,?,?,?,?,?)",
                (attempt.attempt_id, rollout_id, attempt.number, worker_id, "running", now, now, None, None),
            )
            c.execute(
                "UPDATE rollouts SET status='running', attempts=?, current_attempt=? WHERE rollout_id=?",
                (attempt.number, attempt.attempt_id, rollout_id),
            )
            ro = c.execute(f"SELECT {ROLLOUT_COLS} FROM rollouts WHERE rollout_id=?", (rollout_id,)).fetchone()
            return rollout_from_row(ro), attempt

        return self._tx(run)

    # spans ----------------------------------------------------------------------------------------------------
    def add_spans(self, spans: Sequence[Span]) -> int:
        rows = [
            (s.span_id, s.rollout_id, s.attempt_id, s.kind, s.agent, s.start_time, s.sequence, s.model_dump_json())
            for s in spans
        ]

        def run(c: sqlite3.Cursor) -> int:
            before = c.connection.total_changes
            c.executemany(
                "INSERT OR IGNORE INTO spans (span_id, rollout_id, attempt_id, kind, agent, start_time, sequence, "
                "body) VALUES (?,?,?,?,?,?,?,?)",
                rows,
            )
            return c.connection.total_changes - before

        return self._tx(run)

    def close(self) -> None:
        """Checkpoint the whole WAL into the main file and empty it, then close (a second call does nothing).

        Other connections to the file get ``_CLOSE_BUSY_MS`` to finish what they are doing; if they are still busy
        the rest stays in the WAL (durable, copied by the next checkpoint) and a warning says so.
        """
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._stop.set()
            if self._checkpointer is not None:
                self._checkpointer.join()
            with self._reader_lock:
                if self._reader is not None:
                    self._reader.close()
            try:
                self._conn.execute(f"PRAGMA busy_timeout={_CLOSE_BUSY_MS}")
                busy, _, _ = self._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
                if busy:
                    log.warning("store %s: other connections kept part of the WAL from the main file", self.path)
            except sqlite3.Error as exc:
                log.warning("store %s: final checkpoint failed (the data stays in the WAL): %s", self.path, exc)
            finally:
                self._conn.close()
