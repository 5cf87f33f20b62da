"""PostgreSQL store: one database shared by any number of ``agl server`` processes (server mode at scale).

Same contract and semantics as ``SqliteStore``; what differs is how they hold under concurrency, since several
processes on several hosts write at once and no lock in one process can order them:

- Connections come from a ``psycopg_pool.ConnectionPool`` (autocommit; a write is one explicit transaction). Every
  state change is one transaction, so a crash never leaves a half-written batch.
- ``lease`` takes the oldest queued rollout with ``SELECT ... FOR UPDATE SKIP LOCKED``: concurrent leasers never wait
  for each other and never get the same rollout. Row locks are always taken rollout first, then its attempts, so
  ``lease``, ``complete_attempt``, ``reap`` and ``cancel`` do not deadlock one another; a deadlock or serialization
  failure all the same (a concurrent ``enqueue`` of the same ids in another order) is retried transparently.
- Times that decide reaping (``started_at``, ``heartbeat_at``) are the database's clock, not the servers': servers
  whose clocks disagree still agree on which attempt is stale.
- Spans keep arrival order: ``add_spans`` takes one transaction-scoped advisory lock before it inserts, so span
  sequence numbers (an identity column) are handed out in commit order; a reader paging by ``offset`` never skips or
  repeats a span. Inserts are pipelined ``INSERT ... ON CONFLICT (span_id) DO NOTHING`` (idempotent); span bodies
  are TEXT compressed with lz4 where the server has it (measured ~5x faster to insert than pglz or JSONB).
- ``publish_resources`` numbers versions under an advisory lock: concurrent publishers get 1, 2, 3, ...
- Timing rules (``settings``) live in the database: a store opened with ``settings`` stores them; one opened without
  reads them (re-read every ``SETTINGS_TTL`` seconds), so every server reaps by the same rules.
- ``StoreUnavailable`` (the server answers 503, clients retry): the database is unreachable, refuses connections,
  is shutting down, read-only, out of disk/memory/connections, a lock wait timed out, or a transaction kept failing
  with deadlocks/serialization failures. Any other SQL error is a bug and propagates (a 500).
- PostgreSQL text cannot hold the NUL character: a NUL in a plain text column (an id, an error message) is stored as
  U+FFFD. JSON bodies (tasks, spans, resources, records) escape it and come back exact.

Schema: table ``schema_version`` holds the version; opening an older database applies the missing steps of
``_MIGRATIONS`` in one transaction under an advisory lock (servers starting together migrate once); a database
written by a newer agl is refused naming both versions.
"""

from __future__ import annotations

import contextlib
import logging
import random
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import psycopg
from psycopg.types.string import StrDumperUnknown
from psycopg_pool import ConnectionPool

from agl.core.net import shown_url
from agl.core.store.base import NotFound, StoreError, StoreSettings, StoreUnavailable
from agl.core.store.sql import ATTEMPT_COLS, ROLLOUT_COLS, Cursor, SqlStore, json_text, rollout_from_row
from agl.core.types import Attempt, Rollout, RolloutRequest, Span, new_id

log = logging.getLogger("agl.store")

T = TypeVar("T")

#: The clock every server shares: the database's, in seconds since the epoch.
_NOW = "extract(epoch FROM clock_timestamp())::float8"

#: Forward migrations: step ``i`` takes a database from schema version ``i`` to ``i + 1`` (0 = empty). Append only;
#: never edit a step that has shipped.
_MIGRATIONS: tuple[tuple[str, ...], ...] = (
    (
        """CREATE TABLE rollouts (
    seq BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    rollout_id TEXT UNIQUE NOT NULL,
    task TEXT NOT NULL,
    task_id TEXT,
    mode TEXT NOT NULL,
    resources_version BIGINT NOT NULL,
    status TEXT NOT NULL,
    max_attempts BIGINT NOT NULL,
    attempts BIGINT NOT NULL DEFAULT 0,
    current_attempt TEXT,
    final_reward DOUBLE PRECISION,
    error TEXT,
    created_at DOUBLE PRECISION NOT NULL,
    finished_at DOUBLE PRECISION,
    metadata TEXT NOT NULL
)""",
        "CREATE INDEX rollouts_queued ON rollouts (seq) WHERE status = 'queued'",
        "CREATE INDEX rollouts_status ON rollouts (status, seq)",
        """CREATE TABLE attempts (
    attempt_id TEXT PRIMARY KEY,
    rollout_id TEXT NOT NULL,
    number BIGINT NOT NULL,
    worker_id TEXT NOT NULL,
    status TEXT NOT NULL,
    started_at DOUBLE PRECISION NOT NULL,
    heartbeat_at DOUBLE PRECISION NOT NULL,
    ended_at DOUBLE PRECISION,
    error TEXT
)""",
        "CREATE INDEX attempts_rollout ON attempts (rollout_id, number)",
        "CREATE INDEX attempts_running ON attempts (heartbeat_at) WHERE status = 'running'",
        """CREATE TABLE spans (
    seq BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    span_id TEXT UNIQUE NOT NULL,
    rollout_id TEXT NOT NULL,
    attempt_id TEXT NOT NULL,
    kind TEXT NOT NULL,
    agent TEXT,
    start_time DOUBLE PRECISION NOT NULL,
    sequence BIGINT NOT NULL,
    body TEXT NOT NULL
)""",
        "CREATE INDEX spans_rollout_arrival ON spans (rollout_id, seq)",
        "CREATE INDEX spans_attempt_arrival ON spans (attempt_id, seq)",
        # lz4 where the server was built with it (PostgreSQL 14+); pglz otherwise.
        "DO $$ BEGIN ALTER TABLE spans ALTER COLUMN body SET COMPRESSION lz4; EXCEPTION WHEN OTHERS THEN NULL; END $$",
        """CREATE TABLE resources (
    version BIGINT PRIMARY KEY,
    body TEXT NOT NULL,
    created_at DOUBLE PRECISION NOT NULL
)""",
        """CREATE TABLE records (
    id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    kind TEXT NOT NULL,
    key TEXT NOT NULL,
    body TEXT NOT NULL,
    created_at DOUBLE PRECISION NOT NULL
)""",
        "CREATE INDEX records_kind ON records (kind, key, id)",
        """CREATE TABLE settings (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    heartbeat_timeout DOUBLE PRECISION NOT NULL,
    attempt_timeout DOUBLE PRECISION NOT NULL
)""",
    ),
)
#: The schema version this agl writes.
SCHEMA_VERSION = len(_MIGRATIONS)

#: Advisory lock keys (transaction-scoped, per database).
_LOCK_MIGRATE = 0x61676C00
#: Transaction-scoped locks ``_serialize`` takes, by what they serialise.
_LOCKS = {"spans": 0x61676C01, "resources": 0x61676C02}

#: How long a store keeps the timing rules it read before reading them again.
SETTINGS_TTL = 5.0
#: Tries of a transaction that hit a deadlock or a serialization failure (each after a short random pause).
_CONFLICT_TRIES = 6
#: Tries of a call whose connection broke before it committed (the pool hands out a fresh connection).
_CONNECTION_TRIES = 3
#: How long a call waits for a pooled connection, and a statement for a row lock, before the store is unavailable.
POOL_TIMEOUT = 15.0
LOCK_TIMEOUT_MS = 30_000

#: SQLSTATE classes and codes that mean "the database cannot do this now" (the call may succeed later).
_UNAVAILABLE_CLASSES = frozenset({"08", "40", "53", "57", "58"})
_UNAVAILABLE_STATES = frozenset({"25006", "55P03", "55006", "72000"})


class _NulSafeStr(StrDumperUnknown):
    """Python ``str`` → PostgreSQL text, a NUL (which text cannot hold) replaced by U+FFFD."""

    def dump(self, obj: str) -> Any:
        return super().dump(obj.replace("\x00", "\ufffd") if "\x00" in obj else obj)


def _configure(conn: psycopg.Connection[Any]) -> None:
    conn.adapters.register_dumper(str, _NulSafeStr)
    conn.execute(f"SET lock_timeout = {LOCK_TIMEOUT_MS}")


def is_unavailable(exc: psycopg.Error) -> bool:
    """Whether ``exc`` means the database cannot take the call now (as opposed to an error in the statement)."""
    state = exc.sqlstate
    if state is None:  # no answer from the server: connection refused or lost, no pooled connection in time
        return isinstance(exc, psycopg.OperationalError)
    return state[:2] in _UNAVAILABLE_CLASSES or state in _UNAVAILABLE_STATES


def _connection_lost(exc: psycopg.Error) -> bool:
    return exc.sqlstate is None or exc.sqlstate[:2] == "08" or exc.sqlstate in ("57P01", "57P02")


class PostgresStore(SqlStore):
    """Store in a PostgreSQL database (``postgresql://user:password@host:port/dbname``), created or migrated at open.

    Give it a database of its own: agl creates its tables (``rollouts``, ``attempts``, ``spans``, ``resources``,
    ``records``, ``settings``, ``schema_version``) in the connection's default schema. ``settings``: the timing rules
    every server on this database reaps by (stored; None reads the stored ones, defaults if none were stored).
    ``pool_size``: the most connections this store object opens.
    """

    P = "%s"
    CLOCK = _NOW
    FOR_UPDATE = " FOR UPDATE"
    NO_LIMIT = None
    IN_CHUNK = 1_000_000  # one statement: an array takes any number of ids, and cancel locks them in one order

    def __init__(self, url: str, settings: StoreSettings | None = None, *, pool_size: int = 16) -> None:
        self.url = url
        self.shown = self.location = shown_url(url)
        self._settings = StoreSettings()
        self._settings_read = -float("inf")
        try:
            with psycopg.connect(url, autocommit=True, connect_timeout=int(POOL_TIMEOUT)) as conn:
                _configure(conn)
                self._migrate(conn)
        except psycopg.Error as exc:
            if is_unavailable(exc):
                raise StoreUnavailable(f"the PostgreSQL store {self.shown} cannot be reached: {exc}") from exc
            raise
        self._pool: ConnectionPool[psycopg.Connection[Any]] = ConnectionPool(
            url,
            min_size=1,
            max_size=max(1, pool_size),
            kwargs={"autocommit": True, "application_name": "agl"},
            configure=_configure,
            timeout=POOL_TIMEOUT,
            name="agl-store",
            open=False,
        )
        self._pool.open(wait=False)
        self._closed = False
        try:
            if settings is not None:
                self.settings = settings
            else:
                self._read_settings()
        except BaseException:
            self.close()
            raise

    # schema ---------------------------------------------------------------------------------------------------
    def _refuse_newer(self, version: int) -> None:
        if version > SCHEMA_VERSION:
            raise StoreError(
                f"PostgreSQL store {self.shown} has schema version {version}, but this agl knows versions up to "
                f"{SCHEMA_VERSION}: it was written by a newer agl; upgrade agl to open it"
            )

    def _migrate(self, conn: psycopg.Connection[Any]) -> None:
        """Bring the database to ``SCHEMA_VERSION``: create it, or apply the missing migrations in one transaction."""
        try:
            row = conn.execute("SELECT version FROM schema_version").fetchone()
        except psycopg.errors.UndefinedTable:
            row = None
        if row is not None:
            self._refuse_newer(row[0])
            if row[0] == SCHEMA_VERSION:
                return
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (_LOCK_MIGRATE,))
            conn.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
            row = conn.execute("SELECT version FROM schema_version").fetchone()  # another server may have migrated
            version = 0 if row is None else int(row[0])
            self._refuse_newer(version)
            if version == SCHEMA_VERSION:
                return
            for step in _MIGRATIONS[version:]:
                for statement in step:
                    conn.execute(statement)
            if row is None:
                conn.execute("INSERT INTO schema_version VALUES (%s)", (SCHEMA_VERSION,))
            else:
                conn.execute("UPDATE schema_version SET version=%s", (SCHEMA_VERSION,))
        if version:
            log.info("store %s migrated from schema version %d to %d", self.shown, version, SCHEMA_VERSION)

    # plumbing -------------------------------------------------------------------------------------------------
    def _unavailable(self, exc: psycopg.Error, doing: str) -> StoreUnavailable:
        return StoreUnavailable(f"the PostgreSQL store {self.shown} cannot {doing} now: {exc}")

    def _tx(self, fn: Callable[[psycopg.Cursor[Any]], T]) -> T:
        """Run ``fn`` in one write transaction; retried on deadlocks, serialization failures and connections that
        broke before the commit was sent. A database that cannot take the write raises ``StoreUnavailable`` (nothing
        was written); any other database error propagates."""
        conflicts = lost = 0
        while True:
            committing = False
            try:
                with self._pool.connection() as conn:
                    try:
                        cur = conn.cursor()
                        cur.execute("BEGIN")
                        result = fn(cur)
                        committing = True
                        cur.execute("COMMIT")
                        return result
                    except BaseException:
                        if not committing and not conn.closed:
                            with contextlib.suppress(psycopg.Error):
                                conn.execute("ROLLBACK")
                        raise
            except psycopg.Error as exc:
                if not is_unavailable(exc):
                    raise  # a bug (bad SQL, a value the column refuses): a 500
                if exc.sqlstate is not None and exc.sqlstate[:2] == "40" and conflicts < _CONFLICT_TRIES - 1:
                    conflicts += 1
                    time.sleep(random.uniform(0.005, 0.02 * 2**conflicts))
                    continue
                if _connection_lost(exc) and not committing and lost < _CONNECTION_TRIES - 1:
                    lost += 1
                    continue
                raise self._unavailable(exc, "take writes") from exc

    def _in(self, ids: Sequence[str]) -> tuple[str, tuple[Any, ...]]:
        return "= ANY(%s::text[])", (list(ids),)

    def _serialize(self, cur: Cursor, what: str) -> None:
        cur.execute("SELECT pg_advisory_xact_lock(%s)", (_LOCKS[what],))

    def _read(self, sql: str, args: Sequence[Any] = ()) -> list[Any]:
        lost = 0
        while True:
            try:
                with self._pool.connection() as conn:
                    return conn.execute(sql, args).fetchall()
            except psycopg.Error as exc:
                if not is_unavailable(exc):
                    raise
                if _connection_lost(exc) and lost < _CONNECTION_TRIES - 1:
                    lost += 1
                    continue
                raise self._unavailable(exc, "be read") from exc

    # settings -------------------------------------------------------------------------------------------------
    @property
    def settings(self) -> StoreSettings:
        """The timing rules stored in the database (read again every ``SETTINGS_TTL`` seconds)."""
        if time.monotonic() - self._settings_read > SETTINGS_TTL:
            try:
                self._read_settings()
            except StoreUnavailable as exc:  # keep reaping by the rules last read
                log.warning("store %s: could not read its settings (keeping the last read): %s", self.shown, exc)
                self._settings_read = time.monotonic()
        return self._settings

    @settings.setter
    def settings(self, value: StoreSettings) -> None:
        """Store ``value`` as the timing rules of every server on this database."""

        def write(cur: psycopg.Cursor[Any]) -> None:
            cur.execute(
                "INSERT INTO settings VALUES (1, %s, %s) ON CONFLICT (id) DO UPDATE SET "
                "heartbeat_timeout=EXCLUDED.heartbeat_timeout, attempt_timeout=EXCLUDED.attempt_timeout",
                (value.heartbeat_timeout, value.attempt_timeout),
            )

        self._tx(write)
        self._settings, self._settings_read = value, time.monotonic()

    def _read_settings(self) -> None:
        rows = self._read("SELECT heartbeat_timeout, attempt_timeout FROM settings WHERE id=1")
        self._settings = StoreSettings(*rows[0]) if rows else StoreSettings()
        self._settings_read = time.monotonic()

    # rollouts -------------------------------------------------------------------------------------------------
    def enqueue(self, requests: Sequence[RolloutRequest]) -> list[Rollout]:
        def run(cur: psycopg.Cursor[Any]) -> list[Rollout]:
            cur.execute(f"SELECT MAX(version), {_NOW} FROM resources")
            latest, now = cur.fetchone() or (None, time.time())
            fresh: list[Rollout] = []
            for req in requests:
                version = req.resources_version or latest
                if version is None:
                    raise StoreError("enqueue: no resources published yet; publish_resources(...) first")
                if req.resources_version is not None and (latest is None or req.resources_version > latest):
                    raise NotFound(f"enqueue: resources_version {req.resources_version} was never published")
                fresh.append(
                    Rollout(
                        rollout_id=req.rollout_id or new_id("ro"),
                        task=req.task,
                        task_id=req.task_id,
                        mode=req.mode,
                        resources_version=version,
                        max_attempts=req.max_attempts,
                        created_at=now,
                        metadata=req.metadata,
                    )
                )
            if not fresh:
                return []
            # One statement, in the order asked; an id already stored (or twice in this batch) is not inserted.
            cur.execute(
                f"INSERT INTO rollouts ({ROLLOUT_COLS}) "
                "SELECT i, t, ti, m, v, 'queued', ma, 0, NULL::float8, NULL::text, %s, NULL::float8, md FROM unnest("
                "%s::text[], %s::text[], %s::text[], %s::text[], %s::bigint[], %s::bigint[], %s::text[]) "
                "WITH ORDINALITY AS x(i, t, ti, m, v, ma, md, n) ORDER BY n "
                "ON CONFLICT (rollout_id) DO NOTHING RETURNING rollout_id",
                (
                    now,
                    [r.rollout_id for r in fresh],
                    [json_text(r.task, "task") for r in fresh],
                    [r.task_id for r in fresh],
                    [r.mode for r in fresh],
                    [r.resources_version for r in fresh],
                    [r.max_attempts for r in fresh],
                    [json_text(r.metadata, "metadata") for r in fresh],
                ),
            )
            inserted = {row[0] for row in cur.fetchall()}
            out: list[Rollout] = []
            for ro in fresh:
                if ro.rollout_id in inserted:
                    inserted.discard(ro.rollout_id)  # a second request with this id gets the stored one
                    out.append(ro)
                    continue
                cur.execute(f"SELECT {ROLLOUT_COLS} FROM rollouts WHERE rollout_id=%s", (ro.rollout_id,))
                stored = cur.fetchone()
                out.append(rollout_from_row(stored) if stored is not None else ro)
            return out

        return self._tx(run)

    def lease(self, worker_id: str) -> tuple[Rollout, Attempt] | None:
        self.reap()
        attempt_id = new_id("at")

        def run(cur: psycopg.Cursor[Any]) -> tuple[Rollout, Attempt] | None:
            cur.execute(
                "WITH next AS (SELECT seq FROM rollouts WHERE status='queued' ORDER BY seq LIMIT 1 "
                "FOR UPDATE SKIP LOCKED) "
                "UPDATE rollouts r SET status='running', attempts=r.attempts + 1, current_attempt=%s "
                f"FROM next WHERE r.seq = next.seq RETURNING {', '.join('r.' + c for c in ROLLOUT_COLS.split(', '))}, "
                f"{_NOW}",
                (attempt_id,),
            )
            row = cur.fetchone()
            if row is None:
                return None
            ro, now = rollout_from_row(row), row[-1]
            attempt = Attempt(
                attempt_id=attempt_id,
                rollout_id=ro.rollout_id,
                number=ro.attempts,
                worker_id=worker_id,
                started_at=now,
                heartbeat_at=now,
            )
            cur.execute(
                f"INSERT INTO attempts ({ATTEMPT_COLS}) VALUES (%s,%s,%s,%s,'running',%s,%s,NULL,NULL)",
                (attempt_id, ro.rollout_id, attempt.number, worker_id, now, now),
            )
            return ro, attempt

        return self._tx(run)

    # spans ----------------------------------------------------------------------------------------------------
    def add_spans(self, spans: Sequence[Span]) -> int:
        if not spans:
            return 0
        rows = [
            (s.span_id, s.rollout_id, s.attempt_id, s.kind, s.agent, s.start_time, s.sequence, s.model_dump_json())
            for s in spans
        ]

        def run(cur: psycopg.Cursor[Any]) -> int:
            # Span seq numbers are handed out in commit order (see the module doc): arrival order for readers.
            self._serialize(cur, "spans")
            cur.executemany(
                "INSERT INTO spans (span_id, rollout_id, attempt_id, kind, agent, start_time, sequence, body) "
                "VALUES (%s,%s,%s,%s,%s,%s,%s,%s) ON CONFLICT (span_id) DO NOTHING",
                rows,
            )
            return max(cur.rowcount, 0)

        return self._tx(run)

    # migration support (``agl migrate``) ----------------------------------------------------------------------
    def connection(self) -> Any:
        """A pooled connection (context manager; autocommit) for bulk work such as ``agl migrate``."""
        return self._pool.connection()

    def close(self) -> None:
        """Close the pool's connections (a second call does nothing)."""
        if self._closed:
            return
        self._closed = True
        self._pool.close()
