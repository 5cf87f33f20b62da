"""One behaviour suite for every Store implementation (SQLite embedded, HTTP client → server)."""

from __future__ import annotations

import json
import logging
import shutil
import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agl.core.store import NotFound, Store, StoreError, StoreSettings
from agl.core.store.sqlite import CHECKPOINT_INTERVAL, SCHEMA_VERSION, WAL_SIZE_LIMIT, SqliteStore
from agl.core.types import LLM, PromptTemplate, Record, RolloutRequest, Span

FAST = StoreSettings(heartbeat_timeout=0.5, attempt_timeout=60.0)


@pytest.fixture(params=["sqlite", "http"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    """The store under test; its data lives in the SQLite file ``tmp_path / "s.db"`` either way."""
    backing = SqliteStore(tmp_path / "s.db", FAST)
    if request.param == "sqlite":
        yield backing
        backing.close()
        return
    from agl.core.server import AglServer
    from agl.core.store.http import HttpStore

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
    store.enqueue([RolloutRequest(task=1)])
    _, attempt = store.lease("w")  # type: ignore[misc]
    for _ in range(5):
        time.sleep(0.2)
        assert store.heartbeat(attempt.attempt_id)
    assert store.reap() == 0
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
    with sqlite3.connect(tmp_path / "s.db") as db:
        for span_id, body in bad_rows.items():
            db.execute(
                "INSERT INTO spans (span_id, rollout_id, attempt_id, kind, agent, start_time, sequence, body) "
                "VALUES (?,?,?,?,?,?,?,?)",
                (span_id, ro.rollout_id, at.attempt_id, "custom", None, float("inf"), 0, body),
            )
    store.add_spans(good[2:])
    with caplog.at_level(logging.WARNING, logger="agl.store"):
        assert [s.span_id for s in store.query_spans(rollout_id=ro.rollout_id)] == [s.span_id for s in good]
        assert [s.span_id for s in store.query_spans()] == [s.span_id for s in good]
        assert [s.span_id for s in store.query_spans(attempt_id=at.attempt_id, kind="custom")] == [
            s.span_id for s in good
        ]
    if isinstance(store, SqliteStore):  # over HTTP the server logs it
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
    assert [r.rollout_id for r in store.list_rollouts(status="cancelled")] == [ros[0].rollout_id]
    assert len(store.list_rollouts(mode="val")) == 3
    assert [r.rollout_id for r in store.list_rollouts(limit=2)] == [ros[2].rollout_id, ros[1].rollout_id]
    with pytest.raises(NotFound):
        store.get_rollout("ro-missing")


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
    time.sleep(CHECKPOINT_INTERVAL + 0.2)
    store.get_rollouts(ids)  # any use of the store after the interval checkpoints what was committed
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
    with pytest.raises(sqlite3.OperationalError, match="no such table") as raised, store._tx() as conn:
        conn.execute("INSERT INTO no_such_table VALUES (1)")
    assert not isinstance(raised.value, StoreError)
    store.publish_resources({"p": PromptTemplate(template="x")})  # rolled back: the store still writes
    store.close()
