"""One behaviour suite for every Store implementation (SQLite embedded, HTTP client → server, PostgreSQL), then what
is particular to SQLite (durability, schema versions) and to PostgreSQL (concurrency, schema versions, availability).

The PostgreSQL cases run on a real server the test session starts (``tests/conftest.py``); they fail, never skip,
when it cannot start."""

from __future__ import annotations

import json
import logging
import shutil
import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agl.core.store import NotFound, Store, StoreError, StoreSettings
from agl.core.store.base import MAX_CANCEL_REASON
from agl.core.store.http import HttpStore
from agl.core.store.postgres import PostgresStore
from agl.core.store.sqlite import CHECKPOINT_INTERVAL, SCHEMA_VERSION, WAL_SIZE_LIMIT, SqliteStore
from agl.core.types import LLM, PromptTemplate, Record, RolloutRequest, Span
from tests.waiting import wait_for

FAST = StoreSettings(heartbeat_timeout=0.5, attempt_timeout=60.0)


@pytest.fixture(params=["sqlite", "http", "postgres"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    """The store under test; "sqlite" and "http" keep their data in the SQLite file ``tmp_path / "s.db"``,
    "postgres" in a fresh database of the session's PostgreSQL server."""
    if request.param == "postgres":
        pg = PostgresStore(request.getfixturevalue("postgres_url"), FAST)
        yield pg
        pg.close()
        return
    backing = SqliteStore(tmp_path / "s.db", FAST)
    if request.param == "sqlite":
        yield backing
        backing.close()
        return
    from agl.core.server import AglServer

    server = AglServer(backing, port=0).start()
    client = HttpStore(server.url, retry_for=2.0)
    yield client
    client.close()
    server.stop()
    backing.close()


def _publish(store: Store) -> int:
    return store.publish_resources({"main_llm": LLM(base_url="http://127.0.0.1:1/v1", model="m")}).version


def _span(rollout_id: str, attempt_id: str, i: int, kind: str = "custom", agent: str | None = None) -> Span:
    return Span(
        span_id=f"sp-{rollout_id}-{i}",
        rollout_id=rollout_id,
        attempt_id=attempt_id,
        sequence=i,
        kind=kind,  # type: ignore[arg-type]
        name=f"s{i}",
        agent=agent,
        start_time=1000.0 + i,
        attributes={"i": i, "payload": "x" * 100},
    )


def test_enqueue_requires_published_resources(store: Store) -> None:
    with pytest.raises(StoreError, match="publish"):
        store.enqueue([RolloutRequest(task={"q": 1})])


def test_enqueue_lease_complete_in_fifo_order(store: Store) -> None:
    version = _publish(store)
    queued = store.enqueue([RolloutRequest(task={"q": i}, task_id=f"t{i}") for i in range(3)])
    assert [r.status for r in queued] == ["queued"] * 3
    assert all(r.resources_version == version for r in queued)
    leased = store.lease("w1")
    assert leased is not None
    rollout, attempt = leased
    assert rollout.rollout_id == queued[0].rollout_id and rollout.status == "running" and rollout.task == {"q": 0}
    assert attempt.number == 1 and attempt.worker_id == "w1"
    assert store.complete_attempt(attempt.attempt_id, "succeeded", final_reward=0.5)
    done = store.get_rollout(rollout.rollout_id)
    assert done.status == "succeeded" and done.final_reward == 0.5 and done.finished_at is not None
    assert store.lease("w2")[0].rollout_id == queued[1].rollout_id  # type: ignore[index]


def test_enqueue_with_a_known_rollout_id_returns_the_stored_rollout(store: Store) -> None:
    _publish(store)
    [first] = store.enqueue([RolloutRequest(task={"q": 1}, rollout_id="ro-chosen")])
    rollout, _ = store.lease("w1") or pytest.fail("nothing to lease")
    [again, other] = store.enqueue([RolloutRequest(task={"q": 2}, rollout_id="ro-chosen"), RolloutRequest(task=3)])
    assert first.rollout_id == again.rollout_id == rollout.rollout_id == "ro-chosen"
    assert again.task == {"q": 1} and again.status == "running", "the stored rollout, untouched"
    assert len(store.list_rollouts()) == 2 and other.rollout_id != "ro-chosen"


def test_lease_on_empty_queue_returns_none(store: Store) -> None:
    _publish(store)
    assert store.lease("w") is None


def test_failed_attempt_fails_rollout_with_error(store: Store) -> None:
    _publish(store)
    [ro] = store.enqueue([RolloutRequest(task=1)])
    _, attempt = store.lease("w")  # type: ignore[misc]
    store.complete_attempt(attempt.attempt_id, "failed", error="ValueError: boom")
    got = store.get_rollout(ro.rollout_id)
    assert got.status == "failed" and got.error == "ValueError: boom"


def test_lost_worker_is_retried_then_fails_after_max_attempts(store: Store) -> None:
    _publish(store)
    [ro] = store.enqueue([RolloutRequest(task=1, max_attempts=2)])
    _, first = store.lease("dead-1")  # type: ignore[misc]
    time.sleep(0.7)  # longer than heartbeat_timeout: the worker is lost
    retry = store.lease("w2")
    assert retry is not None and retry[0].rollout_id == ro.rollout_id and retry[1].number == 2
    assert not store.heartbeat(first.attempt_id), "a reaped attempt must be told to stop"
    assert not store.complete_attempt(first.attempt_id, "succeeded", final_reward=1.0), "late report is ignored"
    time.sleep(0.7)
    store.reap()
    got = store.get_rollout(ro.rollout_id)
    assert got.status == "failed" and "no attempts left" in (got.error or "")
    statuses = [a.status for a in store.list_attempts(ro.rollout_id)]
    assert statuses == ["lost", "lost"]


def test_attempt_reported_lost_is_retried_then_fails_with_its_error(store: Store) -> None:
    _publish(store)
    [ro] = store.enqueue([RolloutRequest(task=1, max_attempts=2)])
    _, first = store.lease("w1")  # type: ignore[misc]
    assert store.complete_attempt(first.attempt_id, "lost", error="gateway unreachable: ConnectError")
    assert store.get_rollout(ro.rollout_id).status == "queued", "a lost attempt with tries left is retried"
    assert not store.heartbeat(first.attempt_id), "the lost attempt's worker is told to stop"
    assert not store.complete_attempt(first.attempt_id, "succeeded", final_reward=1.0), "a late report is ignored"
    retry = store.lease("w2")
    assert retry is not None and retry[0].rollout_id == ro.rollout_id and retry[1].number == 2
    assert store.complete_attempt(retry[1].attempt_id, "lost", error="store unreachable: ReadTimeout")
    got = store.get_rollout(ro.rollout_id)
    assert got.status == "failed" and got.finished_at is not None
    assert "store unreachable: ReadTimeout" in (got.error or "") and "no attempts left (2/2)" in (got.error or "")
    attempts = store.list_attempts(ro.rollout_id)
    assert [a.status for a in attempts] == ["lost", "lost"]
    assert "gateway unreachable: ConnectError" in (attempts[0].error or "")
    assert store.lease("w3") is None


def test_complete_attempt_refuses_statuses_only_the_store_decides(store: Store) -> None:
    _publish(store)
    store.enqueue([RolloutRequest(task=1)])
    _, attempt = store.lease("w")  # type: ignore[misc]
    for status in ("timed_out", "running"):
        with pytest.raises(StoreError, match="'succeeded', 'failed' or 'lost'"):
            store.complete_attempt(attempt.attempt_id, status)
    assert store.complete_attempt(attempt.attempt_id, "succeeded", final_reward=1.0)


def test_heartbeat_keeps_attempt_alive(store: Store) -> None:
    _publish(store)
    [kept, silent] = store.enqueue([RolloutRequest(task=1), RolloutRequest(task=2)])
    _, attempt = store.lease("w")  # type: ignore[misc]
    store.lease("silent")  # leased after the kept one, and never heartbeats

    def silent_one_reaped() -> bool:
        assert store.heartbeat(attempt.attempt_id)
        store.reap()
        return store.list_attempts(silent.rollout_id)[0].status == "lost"

    # the store reaping the silent attempt is what says its heartbeat timeout has passed, for both
    wait_for(silent_one_reaped, 60, "the attempt without heartbeats to be reaped")
    assert store.get_rollout(kept.rollout_id).status == "running"
    assert store.complete_attempt(attempt.attempt_id, "succeeded", final_reward=1.0)


def test_attempt_timeout_marks_timed_out(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "t.db", StoreSettings(heartbeat_timeout=60, attempt_timeout=0.3))
    _publish(store)
    [ro] = store.enqueue([RolloutRequest(task=1, max_attempts=1)])
    _, attempt = store.lease("w")  # type: ignore[misc]
    time.sleep(0.5)
    store.heartbeat(attempt.attempt_id)
    assert store.reap() == 1
    assert store.list_attempts(ro.rollout_id)[0].status == "timed_out"
    assert store.get_rollout(ro.rollout_id).status == "failed"


def test_add_spans_is_idempotent_and_queryable(store: Store) -> None:
    _publish(store)
    [ro] = store.enqueue([RolloutRequest(task=1)])
    _, at = store.lease("w")  # type: ignore[misc]
    spans = [
        _span(ro.rollout_id, at.attempt_id, i, kind="llm" if i % 2 else "tool", agent=f"a{i % 3}") for i in range(6)
    ]
    assert store.add_spans(spans) == 6
    assert store.add_spans(spans[:3]) == 0
    got = store.query_spans(rollout_id=ro.rollout_id)
    assert [s.span_id for s in got] == [s.span_id for s in spans]
    assert got[0] == spans[0]
    assert [s.sequence for s in store.query_spans(rollout_id=ro.rollout_id, kind="llm")] == [1, 3, 5]
    assert [s.sequence for s in store.query_spans(attempt_id=at.attempt_id, agent="a0")] == [0, 3]
    assert store.query_spans(rollout_id="nope") == []


def test_spans_come_back_in_arrival_order_not_by_their_clocks(store: Store) -> None:
    _publish(store)
    [ro] = store.enqueue([RolloutRequest(task=1)])
    _, at = store.lease("w")  # type: ignore[misc]
    spans = [_span(ro.rollout_id, at.attempt_id, i) for i in range(6)]
    for i, s in enumerate(spans):  # producers whose clocks disagree: times out of order, sequence numbers too
        s.start_time = 2000.0 - 7 * i if i % 2 else 1000.0 + i
        s.sequence = (i * 5) % 6
    store.add_spans(spans[:4])
    store.add_spans(spans[4:])
    assert [s.span_id for s in store.query_spans(rollout_id=ro.rollout_id)] == [s.span_id for s in spans]
    assert [s.span_id for s in store.query_spans(attempt_id=at.attempt_id, limit=3)] == [s.span_id for s in spans[:3]]


def test_unreadable_stored_spans_are_skipped_not_fatal(
    store: Store, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    _publish(store)
    [ro] = store.enqueue([RolloutRequest(task=1)])
    _, at = store.lease("w")  # type: ignore[misc]
    good = [_span(ro.rollout_id, at.attempt_id, i) for i in range(3)]
    store.add_spans(good[:2])
    raw = good[0].model_dump(mode="json")
    bad_rows = {  # what older files may hold: 1e400 accepted at the door (read back as inf), null, not JSON
        "sp-inf": json.dumps({**raw, "span_id": "sp-inf", "start_time": "@"}).replace('"@"', "1e400"),
        "sp-null": json.dumps({**raw, "span_id": "sp-null", "start_time": None}),
        "sp-garbage": "{not json",
    }
    rows = [
        (span_id, ro.rollout_id, at.attempt_id, "custom", None, float("inf"), 0, body)
        for span_id, body in bad_rows.items()
    ]
    columns = "span_id, rollout_id, attempt_id, kind, agent, start_time, sequence, body"
    if isinstance(store, PostgresStore):
        with store.connection() as conn:
            conn.cursor().executemany(f"INSERT INTO spans ({columns}) VALUES (%s,%s,%s,%s,%s,%s,%s,%s)", rows)
    else:
        with sqlite3.connect(tmp_path / "s.db") as db:
            db.executemany(f"INSERT INTO spans ({columns}) VALUES (?,?,?,?,?,?,?,?)", rows)
    store.add_spans(good[2:])
    with caplog.at_level(logging.WARNING, logger="agl.store"):
        assert [s.span_id for s in store.query_spans(rollout_id=ro.rollout_id)] == [s.span_id for s in good]
        assert [s.span_id for s in store.query_spans()] == [s.span_id for s in good]
        assert [s.span_id for s in store.query_spans(attempt_id=at.attempt_id, kind="custom")] == [
            s.span_id for s in good
        ]
    if not isinstance(store, HttpStore):  # over HTTP the server logs it
        assert "skipped 3 stored span(s)" in caplog.text and "sp-garbage" in caplog.text


def test_resources_are_versioned_and_immutable(store: Store) -> None:
    with pytest.raises(NotFound):
        store.get_resources()
    v1 = store.publish_resources({"p": PromptTemplate(template="Answer {q}", agent="writer")})
    v2 = store.publish_resources({"p": PromptTemplate(template="Think, then answer {q}", agent="writer")})
    assert (v1.version, v2.version) == (1, 2)
    assert store.get_resources().version == 2
    old = store.get_resources(1).resources["p"]
    assert isinstance(old, PromptTemplate) and old.template == "Answer {q}"
    with pytest.raises(NotFound):
        store.get_resources(7)
    [ro] = store.enqueue([RolloutRequest(task=1, resources_version=1)])
    assert ro.resources_version == 1
    with pytest.raises(NotFound):
        store.enqueue([RolloutRequest(task=1, resources_version=9)])


def test_wait_returns_when_rollouts_finish(store: Store) -> None:
    _publish(store)
    ros = store.enqueue([RolloutRequest(task=i) for i in range(2)])

    def work() -> None:
        for _ in range(2):
            _, at = store.lease("w")  # type: ignore[misc]
            store.complete_attempt(at.attempt_id, "succeeded", final_reward=1.0)

    t = threading.Thread(target=work)
    t.start()
    done = store.wait([r.rollout_id for r in ros], timeout=10)
    t.join()
    assert [r.status for r in done] == ["succeeded", "succeeded"]
    pending = store.enqueue([RolloutRequest(task=9)])
    assert store.wait([pending[0].rollout_id], timeout=0.2)[0].status == "queued"


def test_cancel_and_list(store: Store) -> None:
    _publish(store)
    ros = store.enqueue([RolloutRequest(task=i, mode="val") for i in range(3)])
    assert store.cancel([ros[0].rollout_id]) == 1
    assert store.cancel([ros[0].rollout_id]) == 0
    assert store.get_rollout(ros[0].rollout_id).error is None
    assert [r.rollout_id for r in store.list_rollouts(status="cancelled")] == [ros[0].rollout_id]
    assert len(store.list_rollouts(mode="val")) == 3
    assert [r.rollout_id for r in store.list_rollouts(limit=2)] == [ros[2].rollout_id, ros[1].rollout_id]
    with pytest.raises(NotFound):
        store.get_rollout("ro-missing")


def test_cancel_keeps_its_reason_on_the_rollout_and_its_running_attempt(store: Store) -> None:
    _publish(store)
    running, queued, done = store.enqueue([RolloutRequest(task=i) for i in range(3)])
    leased = store.lease("w")
    assert leased is not None and leased[0].rollout_id == running.rollout_id
    ids = [running.rollout_id, queued.rollout_id, done.rollout_id]
    store.cancel([done.rollout_id], "first")
    assert store.cancel(ids, "the batch was interrupted (KeyboardInterrupt)") == 2
    got = {r.rollout_id: r for r in store.get_rollouts(ids)}
    assert [got[i].status for i in ids] == ["cancelled"] * 3
    assert got[running.rollout_id].error == got[queued.rollout_id].error
    assert got[queued.rollout_id].error == "the batch was interrupted (KeyboardInterrupt)"
    assert got[done.rollout_id].error == "first", "a finished rollout keeps what it had"
    [attempt] = store.list_attempts(running.rollout_id)
    assert (attempt.status, attempt.error) == ("failed", "the batch was interrupted (KeyboardInterrupt)")
    for bad in ("", "x" * (MAX_CANCEL_REASON + 1)):
        with pytest.raises(ValueError, match="reason"):
            store.cancel([queued.rollout_id], bad)


def test_records_kept_in_order(store: Store) -> None:
    store.add_record(Record(kind="metrics", key="0", data={"reward": 0.1}))
    store.add_record(Record(kind="metrics", key="1", data={"reward": 0.3}))
    store.add_record(Record(kind="apo", key="c1", data={"prompt": "x"}))
    assert [r.data["reward"] for r in store.list_records("metrics")] == [0.1, 0.3]
    assert [r.key for r in store.list_records("metrics", key="1")] == ["1"]


def test_sqlite_survives_reopen(tmp_path: Path) -> None:
    path = tmp_path / "durable.db"
    first = SqliteStore(path)
    _publish(first)
    [ro] = first.enqueue([RolloutRequest(task={"q": 1})])
    first.add_spans([_span(ro.rollout_id, "at-x", i) for i in range(10)])
    first.close()
    again = SqliteStore(path)
    assert again.get_rollout(ro.rollout_id).task == {"q": 1}
    assert len(again.query_spans(rollout_id=ro.rollout_id)) == 10
    assert again.get_resources().version == 1


def test_sqlite_store_shared_by_two_processes_leases_each_rollout_once(tmp_path: Path) -> None:
    import multiprocessing as mp

    path = tmp_path / "shared.db"
    store = SqliteStore(path)
    _publish(store)
    store.enqueue([RolloutRequest(task=i) for i in range(40)])
    ctx = mp.get_context("spawn")
    with ctx.Pool(2) as pool:
        leased = pool.map(_lease_all, [str(path), str(path)])
    flat = [r for part in leased for r in part]
    assert len(flat) == 40 and len(set(flat)) == 40


def _lease_all(path: str) -> list[str]:
    store = SqliteStore(path)
    out = []
    while (got := store.lease("w")) is not None:
        out.append(got[0].rollout_id)
    return out


# ------------------------------------------------------------------------------------------ SQLite durability

#: The schema agl wrote before store files carried a schema version (``PRAGMA user_version`` 0).
_V0_SCHEMA = """
CREATE TABLE rollouts (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, rollout_id TEXT UNIQUE NOT NULL, task TEXT NOT NULL, task_id TEXT,
    mode TEXT NOT NULL, resources_version INTEGER NOT NULL, status TEXT NOT NULL, max_attempts INTEGER NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0, current_attempt TEXT, final_reward REAL, error TEXT,
    created_at REAL NOT NULL, finished_at REAL, metadata TEXT NOT NULL
);
CREATE INDEX rollouts_status ON rollouts(status, seq);
CREATE TABLE attempts (
    attempt_id TEXT PRIMARY KEY, rollout_id TEXT NOT NULL, number INTEGER NOT NULL, worker_id TEXT NOT NULL,
    status TEXT NOT NULL, started_at REAL NOT NULL, heartbeat_at REAL NOT NULL, ended_at REAL, error TEXT
);
CREATE INDEX attempts_rollout ON attempts(rollout_id, number);
CREATE INDEX attempts_running ON attempts(status);
CREATE TABLE spans (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, span_id TEXT UNIQUE NOT NULL, rollout_id TEXT NOT NULL,
    attempt_id TEXT NOT NULL, kind TEXT NOT NULL, agent TEXT, start_time REAL NOT NULL, sequence INTEGER NOT NULL,
    body TEXT NOT NULL
);
CREATE INDEX spans_rollout ON spans(rollout_id, start_time, sequence);
CREATE INDEX spans_attempt ON spans(attempt_id, start_time, sequence);
CREATE TABLE resources (version INTEGER PRIMARY KEY, body TEXT NOT NULL, created_at REAL NOT NULL);
CREATE TABLE records (
    id INTEGER PRIMARY KEY AUTOINCREMENT, kind TEXT NOT NULL, key TEXT NOT NULL, body TEXT NOT NULL,
    created_at REAL NOT NULL
);
CREATE INDEX records_kind ON records(kind, key, id);
"""


def _index_names(path: Path) -> set[str]:
    db = sqlite3.connect(path)
    try:
        return {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type='index'")}
    finally:
        db.close()


def test_version_0_store_file_is_migrated_and_still_readable(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    spans = [_span("ro-old", "at-old", i) for i in range(3)]
    llm = LLM(base_url="http://127.0.0.1:1/v1", model="m")
    db = sqlite3.connect(path)
    db.executescript(_V0_SCHEMA)
    db.execute("INSERT INTO resources VALUES (1, ?, 1.0)", (json.dumps({"main_llm": llm.model_dump()}),))
    db.execute(
        "INSERT INTO rollouts (rollout_id, task, task_id, mode, resources_version, status, max_attempts, attempts, "
        "final_reward, created_at, finished_at, metadata) VALUES "
        "('ro-old', '{\"q\": 1}', 't1', 'train', 1, 'succeeded', 3, 1, 0.5, 1.0, 2.0, '{}')"
    )
    db.execute("INSERT INTO attempts VALUES ('at-old', 'ro-old', 1, 'w', 'succeeded', 1.0, 2.0, 2.0, NULL)")
    db.executemany(
        "INSERT INTO spans (span_id, rollout_id, attempt_id, kind, agent, start_time, sequence, body) "
        "VALUES (?,?,?,?,?,?,?,?)",
        [
            (s.span_id, s.rollout_id, s.attempt_id, s.kind, s.agent, s.start_time, s.sequence, s.model_dump_json())
            for s in spans
        ],
    )
    db.execute("INSERT INTO records (kind, key, body, created_at) VALUES ('metrics', '0', '{\"r\": 1}', 1.0)")
    db.commit()
    db.close()

    store = SqliteStore(path)
    assert store.get_rollout("ro-old").task == {"q": 1} and store.get_rollout("ro-old").final_reward == 0.5
    assert [a.status for a in store.list_attempts("ro-old")] == ["succeeded"]
    assert store.query_spans(rollout_id="ro-old") == spans
    assert store.get_resources().resources["main_llm"] == llm
    assert [r.data for r in store.list_records("metrics")] == [{"r": 1}]
    [ro] = store.enqueue([RolloutRequest(task=2)])
    assert store.lease("w") is not None and ro.resources_version == 1
    store.close()
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    db.close()
    indexes = _index_names(path)
    assert {"spans_rollout_arrival", "spans_attempt_arrival"} <= indexes and "spans_rollout" not in indexes
    SqliteStore(path).close()  # opening a current file again changes nothing
    assert _index_names(path) == indexes


def test_store_file_from_a_newer_agl_is_refused_naming_both_versions(tmp_path: Path) -> None:
    path = tmp_path / "newer.db"
    SqliteStore(path).close()
    db = sqlite3.connect(path)
    db.execute(f"PRAGMA user_version={SCHEMA_VERSION + 1}")
    db.close()
    with pytest.raises(StoreError) as refused:
        SqliteStore(path)
    message = str(refused.value)
    assert f"schema version {SCHEMA_VERSION + 1}" in message and f"up to {SCHEMA_VERSION}" in message
    assert "upgrade agl" in message and str(path) in message


def _run_rollouts(store: SqliteStore, n: int, spans_each: int = 5) -> list[str]:
    """``n`` rollouts run to success, each with ``spans_each`` spans; returns their ids."""
    _publish(store)
    ids = [r.rollout_id for r in store.enqueue([RolloutRequest(task=i) for i in range(n)])]
    while (leased := store.lease("w")) is not None:
        ro, at = leased
        store.add_spans([_span(ro.rollout_id, at.attempt_id, i) for i in range(spans_each)])
        store.complete_attempt(at.attempt_id, "succeeded", final_reward=1.0)
    return ids


def test_closed_store_is_whole_without_its_wal_file(tmp_path: Path) -> None:
    path = tmp_path / "agl.db"
    store = SqliteStore(path)
    reader = sqlite3.connect(path)  # another process reading the file (agl show): SQLite alone keeps the WAL then
    try:
        reader.execute("SELECT COUNT(*) FROM rollouts").fetchone()
        ids = _run_rollouts(store, 30, spans_each=20)
        store.close()
        assert Path(f"{path}-wal").stat().st_size == 0, "close empties the WAL into the main file"
        shutil.copy(path, tmp_path / "main-file-only.db")  # the -wal file lost
    finally:
        reader.close()
    copy = SqliteStore(tmp_path / "main-file-only.db")
    assert [r.status for r in copy.get_rollouts(ids)] == ["succeeded"] * 30
    assert len(copy.query_spans()) == 30 * 20
    copy.close()


def test_store_in_use_moves_committed_writes_out_of_its_wal(tmp_path: Path) -> None:
    path = tmp_path / "agl.db"
    store = SqliteStore(path)
    ids = _run_rollouts(store, 30)
    deadline = time.monotonic() + 30 * CHECKPOINT_INTERVAL
    while store.checkpointed < store.written and time.monotonic() < deadline:  # the checkpointer copies them
        time.sleep(0.01)
    assert store.checkpointed == store.written, "no checkpoint within 30 intervals of the writes"
    shutil.copy(path, tmp_path / "crashed.db")  # a kill -9 now, and the -wal file lost with it
    crashed = SqliteStore(tmp_path / "crashed.db")
    assert [r.status for r in crashed.get_rollouts(ids)] == ["succeeded"] * 30
    assert len(crashed.query_spans()) == 30 * 5
    crashed.close()
    store.close()


def test_wal_stays_small_while_many_spans_are_ingested(tmp_path: Path) -> None:
    path = tmp_path / "big.db"
    store = SqliteStore(path)
    wal = Path(f"{path}-wal")
    text = "x" * 4000
    largest = 0
    for batch in range(24):  # 12,000 spans of ~4 KB: ~48 MB through the WAL
        store.add_spans(
            [
                Span(rollout_id="ro", attempt_id="at", kind="llm", name=f"c{batch}", attributes={"t": text})
                for _ in range(500)
            ]
        )
        largest = max(largest, wal.stat().st_size)
    assert largest < WAL_SIZE_LIMIT + 8 * 2**20, f"the WAL grew to {largest / 2**20:.1f} MiB"
    assert len(store.query_spans(kind="llm", limit=20_000)) == 12_000
    store.close()
    assert not wal.exists() or wal.stat().st_size == 0


def test_an_error_in_a_write_statement_is_not_reported_as_an_unavailable_store(tmp_path: Path) -> None:
    """Only a database that cannot take writes now is "unavailable" (a 503 clients retry); bad SQL is a bug."""
    store = SqliteStore(tmp_path / "agl.db")
    with pytest.raises(sqlite3.OperationalError, match="no such table") as raised:
        store._tx(lambda cur: cur.execute("INSERT INTO no_such_table VALUES (1)"))
    assert not isinstance(raised.value, StoreError)
    store.publish_resources({"p": PromptTemplate(template="x")})  # rolled back: the store still writes
    store.close()


# ------------------------------------------------------------------------------------------------ PostgreSQL


def test_postgres_leases_each_rollout_once_across_processes_and_threads(postgres_url: str) -> None:
    import multiprocessing as mp

    store = PostgresStore(postgres_url)
    _publish(store)
    ids = {r.rollout_id for r in store.enqueue([RolloutRequest(task=i) for i in range(200)])}
    ctx = mp.get_context("spawn")
    start, results = ctx.Barrier(2), ctx.Queue()
    procs = [ctx.Process(target=_pg_lease_all_threaded, args=(postgres_url, start, results)) for _ in range(2)]
    for p in procs:
        p.start()
    leased = [results.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(30)
    flat = [r for part in leased for r in part]
    assert len(flat) == 200 and set(flat) == ids, "every rollout leased exactly once"
    assert all(len(part) > 0 for part in leased), "both processes leased"
    assert {r.status for r in store.list_rollouts(limit=300)} == {"running"}
    store.close()


def _pg_lease_all_threaded(url: str, start: Any, results: Any) -> None:
    store = PostgresStore(url)
    out: list[str] = []

    def work(n: int) -> None:
        while (got := store.lease(f"w{n}")) is not None:
            out.append(got[0].rollout_id)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(4)]
    start.wait(60)  # both processes start leasing together
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    store.close()
    results.put(out)


def test_postgres_concurrent_publishers_get_consecutive_versions(postgres_url: str) -> None:
    stores = [PostgresStore(postgres_url) for _ in range(2)]  # two "servers"
    versions: list[int] = []

    def publish(n: int) -> None:
        for i in range(5):
            rs = stores[n % 2].publish_resources({"p": PromptTemplate(template=f"{n}-{i}")})
            versions.append(rs.version)

    threads = [threading.Thread(target=publish, args=(n,)) for n in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(versions) == list(range(1, 31))
    latest = stores[0].get_resources()
    assert latest.version == 30 and stores[1].get_resources(30) == latest
    for s in stores:
        s.close()


def test_postgres_pages_by_offset_read_every_span_once_while_servers_write(postgres_url: str) -> None:
    """Arrival order is commit order: a reader paging by offset during concurrent writes never skips or repeats."""
    writers = [PostgresStore(postgres_url) for _ in range(3)]
    reader = PostgresStore(postgres_url)
    written: list[str] = []
    done = threading.Event()

    def write(n: int) -> None:
        for b in range(15):
            batch = [_span(f"ro{n}", f"at{n}", b * 10 + i) for i in range(10)]
            writers[n].add_spans(batch)
            written.extend(s.span_id for s in batch)

    threads = [threading.Thread(target=write, args=(n,)) for n in range(3)]
    for t in threads:
        t.start()
    read: list[str] = []
    while True:
        finished = done.is_set()
        page = reader.query_spans(limit=7, offset=len(read))
        read.extend(s.span_id for s in page)
        if finished and not page:
            break
        if not any(t.is_alive() for t in threads):
            done.set()
    assert len(read) == len(set(read)) == 450 and set(read) == set(written)
    for s in [*writers, reader]:
        s.close()


def test_postgres_timing_rules_live_in_the_database(postgres_url: str) -> None:
    first = PostgresStore(postgres_url, StoreSettings(heartbeat_timeout=0.3, attempt_timeout=50.0))
    second = PostgresStore(postgres_url)  # another server, opened without settings: the stored rules
    assert second.settings == StoreSettings(heartbeat_timeout=0.3, attempt_timeout=50.0)
    _publish(first)
    [ro] = first.enqueue([RolloutRequest(task=1, max_attempts=1)])
    first.lease("w")
    time.sleep(0.5)
    assert second.reap() == 1 and second.get_rollout(ro.rollout_id).status == "failed"
    first.close()
    second.close()
    again = PostgresStore(postgres_url)  # and a restart keeps them, and the data
    assert again.settings.heartbeat_timeout == 0.3 and again.get_rollout(ro.rollout_id).status == "failed"
    again.close()


def test_postgres_attempt_timeout_marks_timed_out(postgres_url: str) -> None:
    store = PostgresStore(postgres_url, StoreSettings(heartbeat_timeout=60, attempt_timeout=0.3))
    _publish(store)
    [ro] = store.enqueue([RolloutRequest(task=1, max_attempts=1)])
    _, attempt = store.lease("w")  # type: ignore[misc]
    time.sleep(0.5)
    store.heartbeat(attempt.attempt_id)
    assert store.reap() == 1
    assert store.list_attempts(ro.rollout_id)[0].status == "timed_out"
    assert store.get_rollout(ro.rollout_id).status == "failed"
    store.close()


def test_postgres_schema_is_created_once_by_servers_starting_together(postgres_url: str) -> None:
    from agl.core.store.postgres import SCHEMA_VERSION as PG_SCHEMA_VERSION

    opened: list[PostgresStore] = []
    threads = [threading.Thread(target=lambda: opened.append(PostgresStore(postgres_url))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(opened) == 4
    with opened[0].connection() as conn:
        assert conn.execute("SELECT version FROM schema_version").fetchall() == [(PG_SCHEMA_VERSION,)]
    for s in opened:
        s.close()


def test_postgres_database_from_a_newer_agl_is_refused_naming_both_versions(postgres_url: str) -> None:
    from agl.core.store.postgres import SCHEMA_VERSION as PG_SCHEMA_VERSION

    store = PostgresStore(postgres_url)
    with store.connection() as conn:
        conn.execute("UPDATE schema_version SET version=%s", (PG_SCHEMA_VERSION + 1,))
    store.close()
    with pytest.raises(StoreError) as refused:
        PostgresStore(postgres_url)
    message = str(refused.value)
    assert f"schema version {PG_SCHEMA_VERSION + 1}" in message and f"up to {PG_SCHEMA_VERSION}" in message
    assert "upgrade agl" in message and postgres_url in message


def test_postgres_unavailable_means_cannot_write_now_and_a_bad_statement_is_a_bug(postgres_url: str) -> None:
    import psycopg

    from agl.core.server import AglServer
    from agl.core.store import StoreUnavailable
    from agl.core.types import HEADER_UNAVAILABLE

    store = PostgresStore(postgres_url)
    with pytest.raises(psycopg.errors.UndefinedTable) as raised:
        store._tx(lambda cur: cur.execute("INSERT INTO no_such_table VALUES (1)"))
    assert not isinstance(raised.value, StoreError)
    _publish(store)  # rolled back: the store still writes
    with store.connection() as conn:  # the server kills every connection of the store: the next calls reconnect
        conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
    assert store.get_resources().version == 1 and _publish(store) == 2
    name = postgres_url.rsplit("/", 1)[1]
    with store.connection() as conn:
        conn.execute(f"ALTER DATABASE {name} SET default_transaction_read_only = on")
    store.close()
    read_only = PostgresStore(postgres_url)  # opens and reads a current database that is read-only
    assert read_only.get_resources().version == 2
    with pytest.raises(StoreUnavailable, match=r"cannot take writes now.*read-only"):
        _publish(read_only)
    with AglServer(read_only) as server:
        import httpx

        resp = httpx.post(f"{server.url}/api/records", json={"kind": "k", "key": "", "data": {}}, timeout=30)
        assert resp.status_code == 503 and resp.headers[HEADER_UNAVAILABLE] and "read-only" in resp.json()["error"]
    read_only.close()
    from tests.server_process import free_port

    nobody = f"postgresql://agl:secret-pw@127.0.0.1:{free_port()}/none"
    with pytest.raises(StoreUnavailable, match="cannot be reached") as unreachable:
        PostgresStore(nobody)
    assert "secret-pw" not in str(unreachable.value) and "agl:***@127.0.0.1" in str(unreachable.value)


def test_postgres_keeps_text_with_nul_characters(postgres_url: str) -> None:
    store = PostgresStore(postgres_url)
    _publish(store)
    [ro] = store.enqueue([RolloutRequest(task={"q": "a\x00b"}, task_id="t\x00", metadata={"m": "\x00"})])
    _, at = store.lease("w\x00")  # type: ignore[misc]
    span = Span(rollout_id=ro.rollout_id, attempt_id=at.attempt_id, kind="tool", name="n\x00", agent="a\x00")
    assert store.add_spans([span]) == 1
    assert store.query_spans(agent="a\x00") == [span], "JSON bodies come back exact; filters match"
    assert store.complete_attempt(at.attempt_id, "failed", error="boom\x00")
    got = store.get_rollout(ro.rollout_id)
    assert got.task == {"q": "a\x00b"} and got.metadata == {"m": "\x00"} and got.task_id == "t\ufffd"
    assert got.error == "boom\ufffd", "plain text columns hold U+FFFD for NUL"
    store.add_record(Record(kind="k\x00", key="x", data={"v": "\x00"}))
    assert [r.data for r in store.list_records("k\x00")] == [{"v": "\x00"}]
    store.close()


def test_open_store_opens_postgres_urls(postgres_url: str) -> None:
    from agl.core.store import open_store

    for url in (postgres_url, postgres_url.replace("postgresql://", "postgres://", 1)):
        opened = open_store(url)
        assert isinstance(opened, PostgresStore)
        opened.close()


# ------------------------------------------------------------------------------------------------ agl migrate


def _filled_sqlite_store(path: Path) -> SqliteStore:
    """A store with every kind of row: resources versions with real keys, rollouts in every state, spans, records."""
    store = SqliteStore(path, FAST)
    store.publish_resources({"main_llm": LLM(base_url="http://127.0.0.1:1/v1", model="m", api_key="sk-real-1")})
    store.publish_resources(
        {
            "main_llm": LLM(base_url="http://127.0.0.1:1/v1", model="m", api_key="sk-real-2"),
            "p": PromptTemplate(template="Answer {q}", agent="writer"),
        }
    )
    ros = store.enqueue(
        [RolloutRequest(task={"q": i}, task_id=f"t{i}", mode="val" if i % 2 else "train") for i in range(8)]
    )
    for n in range(5):  # 2 succeeded, 1 failed, 1 running, 1 retried after a lost attempt; 3 queued
        ro, at = store.lease(f"w{n}")  # type: ignore[misc]
        store.add_spans(
            [_span(ro.rollout_id, at.attempt_id, i, kind="llm" if i % 2 else "tool", agent="a") for i in range(5)]
        )
        if n < 2:
            store.complete_attempt(at.attempt_id, "succeeded", final_reward=0.5 + n)
        elif n == 2:
            store.complete_attempt(at.attempt_id, "failed", error="ValueError: boom")
        elif n == 4:
            store.complete_attempt(at.attempt_id, "lost", error="gateway unreachable")
    store.cancel([ros[-1].rollout_id])
    store.add_record(Record(kind="metrics", key="0", data={"reward": 0.1}))
    store.add_record(Record(kind="apo", key="c1", data={"prompt": "x"}))
    return store


def _assert_same_content(a: Store, b: Store) -> None:
    rollouts = a.list_rollouts(limit=1000)
    assert b.list_rollouts(limit=1000) == rollouts and len(rollouts) == 8
    for ro in rollouts:
        assert b.list_attempts(ro.rollout_id) == a.list_attempts(ro.rollout_id)
        assert b.query_spans(rollout_id=ro.rollout_id) == a.query_spans(rollout_id=ro.rollout_id)
    assert b.query_spans() == a.query_spans() and len(a.query_spans()) == 25
    latest = a.get_resources().version
    assert latest == 2 and b.get_resources() == a.get_resources()
    for v in range(1, latest + 1):
        assert b.get_resources(v) == a.get_resources(v)
    for kind in ("metrics", "apo"):
        assert b.list_records(kind) == a.list_records(kind) and a.list_records(kind)


def test_agl_migrate_copies_a_sqlite_store_into_postgres(tmp_path: Path, postgres_url: str) -> None:
    import subprocess
    import sys

    source = _filled_sqlite_store(tmp_path / "agl.db")
    source.close()
    done = subprocess.run(
        [sys.executable, "-m", "agl.cli", "migrate", "--from", f"sqlite:///{tmp_path}/agl.db", "--to", postgres_url],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "agl migrate: spans: 25/25" in done.stdout
    assert "copied 8 rollouts, 5 attempts, 25 spans, 2 resources, 2 records" in done.stdout
    source = SqliteStore(tmp_path / "agl.db", FAST)
    target = PostgresStore(postgres_url)
    _assert_same_content(source, target)
    llm = target.get_resources(1).resources["main_llm"]
    assert isinstance(llm, LLM) and llm.api_key == "sk-real-1", "real keys, every version"
    # the copy carries on where the source was: FIFO queue, the running attempt can report
    running = target.list_rollouts(status="running")[0]
    [current] = [a for a in target.list_attempts(running.rollout_id) if a.status == "running"]
    assert target.complete_attempt(current.attempt_id, "succeeded", final_reward=1.0)
    queued = source.list_rollouts(status="queued")
    assert target.lease("w")[0].rollout_id == queued[-1].rollout_id  # type: ignore[index]
    again = subprocess.run(
        [sys.executable, "-m", "agl.cli", "migrate", "--from", f"sqlite:///{tmp_path}/agl.db", "--to", postgres_url],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert again.returncode == 1 and "is not empty (8 rollouts" in again.stderr and "create a new one" in again.stderr
    assert len(target.query_spans()) == 25, "a refused copy changes nothing"
    source.close()
    target.close()


def test_migrate_copies_postgres_to_postgres_with_its_timing_rules(
    tmp_path: Path, postgres_url: str, postgres_cluster: Any
) -> None:
    from agl.core.store.migrate import copy_store

    sqlite_source = _filled_sqlite_store(tmp_path / "agl.db")
    copy_store(f"sqlite:///{tmp_path}/agl.db", postgres_url, progress=lambda _: None)
    PostgresStore(postgres_url, StoreSettings(heartbeat_timeout=7, attempt_timeout=70)).close()
    second = postgres_cluster.new_database()
    lines: list[str] = []
    copied = copy_store(postgres_url, second, progress=lines.append)
    assert copied == {"rollouts": 8, "attempts": 5, "spans": 25, "resources": 2, "records": 2}
    assert "rollouts: 8/8" in lines
    first, copy = PostgresStore(postgres_url), PostgresStore(second)
    _assert_same_content(first, copy)
    _assert_same_content(sqlite_source, copy)
    assert copy.settings == StoreSettings(heartbeat_timeout=7, attempt_timeout=70)
    with pytest.raises(StoreError, match="not empty"):
        copy_store(f"sqlite:///{tmp_path}/agl.db", second, progress=lambda _: None)
    with pytest.raises(StoreError, match="expected postgresql://"):
        copy_store(postgres_url, f"sqlite:///{tmp_path}/other.db")
    for s in (first, copy, sqlite_source):
        s.close()
    postgres_cluster.drop_database(second)
