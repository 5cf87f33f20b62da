"""One behaviour suite for every Store implementation (SQLite embedded, HTTP client → server)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agl.core.store import NotFound, Store, StoreError, StoreSettings
from agl.core.store.sqlite import SqliteStore
from agl.core.types import LLM, PromptTemplate, Record, RolloutRequest, Span

FAST = StoreSettings(heartbeat_timeout=0.5, attempt_timeout=60.0)


@pytest.fixture(params=["sqlite", "http"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
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
