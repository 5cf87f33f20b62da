"""``agl migrate``: copy a whole store (SQLite or PostgreSQL) into an empty PostgreSQL database.

Everything is copied as stored, not through the Store API: rollouts in their states (with the attempt each one is
running), every attempt, every span in arrival order (byte for byte, unreadable ones too), every resources version
with its real API keys (an agl server only ever answers them redacted), every record, and a PostgreSQL source's
timing rules. The source is read in one snapshot (stop the servers that write to it first, or what they write
meanwhile is not copied) and the target written in one transaction: an interrupted copy leaves the target empty, so
running it again is safe. A target that already holds data is refused: merging two stores would renumber resources
versions under rollouts that name them.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Callable, Iterator
from typing import Any

from agl.core.net import shown_url
from agl.core.store import POSTGRES_SCHEMES
from agl.core.store.base import StoreError
from agl.core.store.postgres import PostgresStore

#: The tables copied, in order, with their columns as both schemas name them and the order they are read in.
TABLES: tuple[tuple[str, str, str], ...] = (
    (
        "rollouts",
        "rollout_id, task, task_id, mode, resources_version, status, max_attempts, attempts, current_attempt, "
        "final_reward, error, created_at, finished_at, metadata",
        "seq",
    ),
    ("attempts", "attempt_id, rollout_id, number, worker_id, status, started_at, heartbeat_at, ended_at, error", "1"),
    ("spans", "span_id, rollout_id, attempt_id, kind, agent, start_time, sequence, body", "seq"),
    ("resources", "version, body, created_at", "version"),
    ("records", "kind, key, body, created_at", "id"),
)
#: Rows read and written per round trip.
BATCH = 2000


class _Source:
    """The rows of a store, read in one consistent snapshot."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.shown = shown_url(url)
        self._stack = contextlib.ExitStack()
        if url.startswith("sqlite:"):
            from agl.core.store.sqlite import SqliteStore, path_from_url

            path = path_from_url(url)
            if not path.exists():
                raise StoreError(f"agl migrate: the source store file {path} does not exist")
            SqliteStore(path).close()  # brings an older file to the current schema; refuses a newer one
            db = sqlite3.connect(path, isolation_level=None)
            self._stack.callback(db.close)
            db.execute("BEGIN")  # one read snapshot for every table
            self._sqlite: sqlite3.Connection | None = db
            self._pg: Any = None
        elif url.startswith(POSTGRES_SCHEMES):
            store = PostgresStore(url)  # migrates an older database; refuses a newer one
            self._stack.callback(store.close)
            conn = self._stack.enter_context(store.connection())
            conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
            self._stack.callback(conn.execute, "ROLLBACK")
            self._sqlite, self._pg = None, conn
        else:
            raise StoreError(
                f"agl migrate: --from {url!r}: expected sqlite:///path.db or postgresql://user:password@host/dbname"
            )

    def count(self, table: str) -> int:
        if self._sqlite is not None:
            return int(self._sqlite.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0])
        return int(self._pg.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0])

    def rows(self, table: str, columns: str, order: str) -> Iterator[list[tuple[Any, ...]]]:
        sql = f"SELECT {columns} FROM {table} ORDER BY {order}"
        if self._sqlite is not None:
            cursor = self._sqlite.execute(sql)
            while batch := cursor.fetchmany(BATCH):
                yield batch
            return
        with self._pg.cursor(name=f"agl_migrate_{table}") as cursor:  # server-side: rows come in batches
            cursor.execute(sql)
            while batch := cursor.fetchmany(BATCH):
                yield batch

    def settings(self) -> tuple[float, float] | None:
        if self._pg is None:
            return None  # a SQLite store keeps no timing rules: each process opens it with its own
        row = self._pg.execute("SELECT heartbeat_timeout, attempt_timeout FROM settings WHERE id=1").fetchone()
        return None if row is None else (float(row[0]), float(row[1]))

    def close(self) -> None:
        self._stack.close()


def copy_store(source: str, target: str, progress: Callable[[str], None] = print) -> dict[str, int]:
    """Copy every row of the store at ``source`` into the empty PostgreSQL store at ``target`` (created or migrated
    to the current schema first). Returns the rows copied per table; ``progress`` gets a line per batch.

    StoreError when the target is not a PostgreSQL URL, is the source itself, or already holds data.
    """
    if not target.startswith(POSTGRES_SCHEMES):
        raise StoreError(f"agl migrate: --to {shown_url(target)!r}: expected postgresql://user:password@host/dbname")
    if source == target:
        raise StoreError("agl migrate: --from and --to are the same store")
    src = _Source(source)
    try:
        dst = PostgresStore(target)
        try:
            with dst.connection() as conn, conn.transaction():
                tables = ", ".join(t for t, _, _ in TABLES)
                conn.execute(f"LOCK TABLE {tables}, settings IN EXCLUSIVE MODE")  # no server writes meanwhile
                held = {t: int(conn.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0]) for t, _, _ in TABLES}
                if any(held.values()):
                    what = ", ".join(f"{n} {t}" for t, n in held.items() if n)
                    raise StoreError(
                        f"agl migrate: the target {dst.shown} is not empty ({what}); agl migrate copies into an "
                        "empty database only: create a new one (or drop this one's agl tables) and run it again"
                    )
                copied: dict[str, int] = {}
                for table, columns, order in TABLES:
                    total = src.count(table)
                    done = 0
                    with conn.cursor().copy(f"COPY {table} ({columns}) FROM STDIN") as copy:
                        for batch in src.rows(table, columns, order):
                            for row in batch:
                                copy.write_row(row)
                            done += len(batch)
                            progress(f"{table}: {done}/{total}")
                    if total == 0:
                        progress(f"{table}: 0/0")
                    copied[table] = done
                rules = src.settings()
                if rules is not None:
                    conn.execute(
                        "INSERT INTO settings VALUES (1, %s, %s) ON CONFLICT (id) DO UPDATE SET "
                        "heartbeat_timeout=EXCLUDED.heartbeat_timeout, attempt_timeout=EXCLUDED.attempt_timeout",
                        rules,
                    )
            return copied
        finally:
            dst.close()
    finally:
        src.close()
