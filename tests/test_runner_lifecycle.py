"""Runner processes that stay up: a Trainer keeps its runners across calls, a pool forks its runners from Python's
fork server, idle runners wait in one lease request and stop at once when their server drains; the gateway's
per-call check reads one row; the agent gets the answer it asked for."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

import agl
from agl.core import fork_servers
from agl.core.runner_pool import RunnerPool, RunnerPoolError
from agl.core.server import AglServer
from agl.core.server import app as server_app
from agl.core.store.base import LiveAttempt, Store
from agl.core.store.http import HttpStore
from agl.core.store.sqlite import SqliteStore
from agl.core.types import ATTR_LOGPROBS, ATTR_PROMPT_IDS, ATTR_RESPONSE_IDS, LLM, RolloutRequest
from agl.testing import FakeLLM
from tests import agents_basic
from tests.waiting import wait_for

USER: Any = [{"role": "user", "content": "what is two plus two"}]


@pytest.fixture
def fake() -> Iterator[FakeLLM]:
    with FakeLLM(lambda body: "the answer is Q") as server:
        yield server


def _tasks(n: int) -> list[dict[str, Any]]:
    return [{"id": f"t{i}", "question": f"q{i}", "answer": "Q"} for i in range(n)]


def _trainer(tmp_path: Path, fake: FakeLLM, n: int = 2) -> agl.Trainer:
    return agl.Trainer(
        n_runners=n,
        store=f"sqlite:///{tmp_path}/agl.db",
        resources={"main_llm": agl.LLM(base_url=fake.base_url, model="fake")},
        progress=False,
    )


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


# ------------------------------------------------------------------------------------------------ the Trainer


def test_trainer_keeps_its_runner_processes_across_evaluate_calls(tmp_path: Path, fake: FakeLLM) -> None:
    trainer = _trainer(tmp_path, fake)
    first = trainer.evaluate(agents_basic.two_call_agent, _tasks(4))
    pool = trainer._pool
    assert pool is not None
    wait_for(lambda: None not in pool.pids(), 30, "both runners to be started")
    pids = pool.pids()
    url = trainer.server_url
    second = trainer.evaluate(agents_basic.two_call_agent, _tasks(4))
    assert trainer._pool is pool and pool.pids() == pids and trainer.server_url == url, "the same runners"
    assert all(p is not None and _alive(p) for p in pids)
    workers = {
        a.worker_id for b in (first, second) for r in b.rollouts for a in trainer._store.list_attempts(r.rollout_id)
    }  # type: ignore[union-attr]
    assert len(workers) <= 2, "two runners did all eight rollouts"
    assert [r.status for r in first.rollouts + second.rollouts] == ["succeeded"] * 8

    # another agent: new runners, the same server and store
    third = trainer.evaluate(agents_basic.async_two_call_agent, _tasks(2))
    assert trainer._pool is not pool and trainer.server_url == url
    assert [r.status for r in third.rollouts] == ["succeeded"] * 2

    trainer.close()
    wait_for(lambda: not any(_alive(p) for p in pids if p is not None), 30, "the runners to exit")
    assert trainer._pool is None and trainer._server is None
    # a closed Trainer starts again when asked
    again = trainer.evaluate(agents_basic.two_call_agent, _tasks(1))
    assert again.rollouts[0].status == "succeeded"
    trainer.close()


def test_a_garbage_collected_trainer_stops_its_runners(tmp_path: Path, fake: FakeLLM) -> None:
    trainer = _trainer(tmp_path, fake, n=1)
    trainer.evaluate(agents_basic.two_call_agent, _tasks(1))
    pids = _started_pids(trainer)
    del trainer
    wait_for(lambda: not any(_alive(p) for p in pids), 30, "the runners to exit")


def _zombie(pid: int) -> bool:
    with open(f"/proc/{pid}/stat") as fh:
        return fh.read().split(") ")[-1].startswith("Z")


def _started_pids(trainer: agl.Trainer) -> list[int]:
    pool = trainer._pool
    assert pool is not None
    wait_for(lambda: None not in pool.pids(), 30, "the runners to be started")
    return [p for p in pool.pids() if p is not None]


# ------------------------------------------------------------------------------------------------ the pool


def test_runners_start_from_the_fork_server_and_killed_ones_are_replaced(tmp_path: Path, fake: FakeLLM) -> None:
    store = SqliteStore(tmp_path / "s.db")
    store.publish_resources({"main_llm": LLM(base_url=fake.base_url, model="fake")})
    with AglServer(store) as server:
        pool = RunnerPool(agents_basic.two_call_agent, server.url, 2, start_method="forkserver").start()
        try:
            ids = [r.rollout_id for r in store.enqueue([RolloutRequest(task=t) for t in _tasks(2)])]
            assert [r.status for r in _supervised_wait(pool, store, ids)] == ["succeeded"] * 2
            first = pool.pids()
            os.kill(first[0], signal.SIGKILL)
            wait_for(lambda: not _alive(first[0]) or _zombie(first[0]), 30, "the runner to die")
            ids = [r.rollout_id for r in store.enqueue([RolloutRequest(task=t) for t in _tasks(3)])]
            assert [r.status for r in _supervised_wait(pool, store, ids)] == ["succeeded"] * 3
            assert pool.replaced == 1 and pool.pids()[1] == first[1] and pool.pids()[0] != first[0]
        finally:
            server.drain()
            pool.stop()


def test_the_fork_server_shares_agl_and_the_agents_module_but_never_another_agents_module_nor_an_old_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests import agents_probe

    store = SqliteStore(tmp_path / "s.db")
    store.publish_resources({"main_llm": LLM(base_url="http://127.0.0.1:9/v1", model="m")})
    with AglServer(store) as server:
        for agent in (agents_basic.two_call_agent, agents_probe.probe_agent):  # the first pool's agent is not probed
            pool = RunnerPool(agent, server.url, 2, start_method="forkserver").start()
            try:
                monkeypatch.setenv("AGL_TEST_PROBE", "set after the fork server started")
                if agent is agents_probe.probe_agent:
                    ids = [r.rollout_id for r in store.enqueue([RolloutRequest(task={"i": i}) for i in range(4)])]
                    assert [r.status for r in _supervised_wait(pool, store, ids)] == ["succeeded"] * 4
            finally:
                server.drain()
                pool.stop()
                server.drain(False)
    imported_in = set()
    for rid in ids:
        [span] = [s for s in store.query_spans(rollout_id=rid, kind="custom") if s.name == "probe"]
        probe = span.attributes["agl.object"]
        assert probe["imported_in"] != probe["pid"], "the agent's module is imported by its fork server"
        imported_in.add(probe["imported_in"])
        assert probe["modules"] == {"agl.core.store.http": True, "tests.agents_basic": False}
        assert probe["env"] == "set after the fork server started", "runners get the pool's environment"
        assert probe["frozen"] > 10_000, "the fork server's objects are frozen, so runners keep sharing them"
    assert len(imported_in) == 1, "every runner of the agent is forked from the one server that imported it"


def test_fork_servers_nobody_uses_are_kept_two_at_most_and_the_oldest_is_stopped() -> None:
    servers = [fork_servers.acquire(f"tests.not_a_module_{i}") for i in range(3)]  # a failed import leaves it up
    for server in servers:
        server.ensure_running()
    pids = [server.pid() for server in servers]
    for server in servers:
        fork_servers.release(server)
    assert servers[0].pid() is None
    wait_for(lambda: not _alive(pids[0]) or _zombie(pids[0]), 10, "the oldest idle fork server to exit")
    assert all(pid is not None and _alive(pid) for pid in pids[1:]), "two idle servers are kept"
    again = fork_servers.acquire("tests.not_a_module_1")
    assert again is servers[1] and again.pid() == pids[1], "a kept server is reused"
    fork_servers.release(again)


def test_spawned_runners_work_the_same(tmp_path: Path, fake: FakeLLM) -> None:
    store = SqliteStore(tmp_path / "s.db")
    store.publish_resources({"main_llm": LLM(base_url=fake.base_url, model="fake")})
    with AglServer(store) as server:
        pool = RunnerPool(agents_basic.two_call_agent, server.url, 2, start_method="spawn").start()
        try:
            ids = [r.rollout_id for r in store.enqueue([RolloutRequest(task=t) for t in _tasks(3)])]
            assert [r.status for r in _supervised_wait(pool, store, ids)] == ["succeeded"] * 3
        finally:
            server.drain()
            pool.stop()


def test_an_interrupted_evaluate_cancels_its_rollouts_and_drops_runners_it_cannot_keep(
    tmp_path: Path, fake: FakeLLM
) -> None:
    with _trainer(tmp_path, fake) as trainer:
        with pytest.raises(RunnerPoolError):
            trainer.evaluate(agents_basic.dying_agent, _tasks(3))
        assert trainer._pool is None, "a pool that could not be kept alive is not reused"
        store = trainer._store
        assert store is not None
        left = [r for r in store.list_rollouts() if not r.finished]
        assert not left, "the interrupted batch's rollouts were cancelled, not left for the next runners"
        after = trainer.evaluate(agents_basic.two_call_agent, _tasks(2))
        assert [r.status for r in after.rollouts] == ["succeeded"] * 2


def _supervised_wait(pool: RunnerPool, store: Store, ids: list[str]) -> list[Any]:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        pool.check()
        rollouts = store.wait(ids, timeout=0.2)
        if all(r.finished for r in rollouts):
            return rollouts
    raise AssertionError("rollouts did not finish")


# ------------------------------------------------------------------------------------------------ waiting leases


def _counting_leases(store: Store) -> list[bool]:
    """Record every ``store.lease`` from now on (True: it leased a rollout): how a test sees that a waiting lease
    has looked at the queue, so that what the test does next happens while the lease waits."""
    looks: list[bool] = []
    lease = store.lease

    def counted(worker_id: str) -> tuple[Any, Any] | None:
        got = lease(worker_id)
        looks.append(got is not None)
        return got

    store.lease = counted  # type: ignore[method-assign]
    return looks


def _polling_only_when_woken(monkeypatch: pytest.MonkeyPatch) -> None:
    """A waiting lease on the server looks at the queue again only when woken (its poll outlasts any wait here)."""
    monkeypatch.setattr(server_app, "LEASE_POLL_MIN_S", 600.0)
    monkeypatch.setattr(server_app, "LEASE_POLL_MAX_S", 600.0)


def test_a_waiting_lease_is_answered_as_soon_as_a_rollout_is_queued(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = SqliteStore(tmp_path / "s.db")
    store.publish_resources({"main_llm": LLM(base_url="http://127.0.0.1:9/v1", model="m")})
    with AglServer(store) as server:
        client = HttpStore(server.url)
        began = time.monotonic()
        assert client.lease_wait("w", 0.3) is None
        assert 0.25 <= time.monotonic() - began < 5, "nothing queued: it waited"

        _polling_only_when_woken(monkeypatch)
        looks = _counting_leases(store)
        got: dict[str, Any] = {}
        # the client asks the server to wait 30 s (its cap); a lease back within 20 s was woken, not polled
        waiting = threading.Thread(target=lambda: got.update(leased=client.lease_wait("w", 60)), daemon=True)
        waiting.start()
        wait_for(lambda: looks, 30, "the waiting lease's first look at the empty queue")
        [ro] = store.enqueue([RolloutRequest(task={"q": 1})])
        waiting.join(20)
        assert not waiting.is_alive(), "woken by the enqueue, not by a poll"
        assert got["leased"] is not None and got["leased"][0].rollout_id == ro.rollout_id

        looks.clear()
        waiting = threading.Thread(target=lambda: got.update(drained=client.lease_wait("w", 60)), daemon=True)
        waiting.start()
        wait_for(lambda: looks, 30, "the waiting lease's first look at the empty queue")
        server.drain()
        waiting.join(20)
        assert not waiting.is_alive(), "answered by the drain, not by a poll"
        assert got["drained"] is None
        client.close()


def test_a_waiting_lease_whose_client_left_leases_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = SqliteStore(tmp_path / "s.db")
    store.publish_resources({"main_llm": LLM(base_url="http://127.0.0.1:9/v1", model="m")})
    _polling_only_when_woken(monkeypatch)
    looks = _counting_leases(store)
    with AglServer(store) as server:
        with pytest.raises(httpx.ReadTimeout):  # the client leaves while its lease waits
            httpx.post(f"{server.url}/api/lease", json={"worker_id": "gone", "wait": 5}, timeout=0.3)
        wait_for(lambda: looks, 30, "the abandoned lease's first look at the empty queue")
        [ro] = store.enqueue([RolloutRequest(task={"q": 1})])
        assert server._server is not None
        requests = server._server.server_state.tasks  # uvicorn's requests in progress
        wait_for(lambda: not requests, 30, "the abandoned request, woken by the enqueue, to end")
        assert store.get_rollout(ro.rollout_id).status == "queued", "not leased to a runner that is gone"
        assert looks == [False], "it did not look at the queue again for a client that left"
        leased = HttpStore(server.url).lease_wait("here", 5)
        assert leased is not None and leased[0].rollout_id == ro.rollout_id


def test_a_store_waits_for_work_and_for_finished_rollouts_without_polling_its_own_writes(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "s.db")
    store.publish_resources({"main_llm": LLM(base_url="http://127.0.0.1:9/v1", model="m")})
    waits: list[str] = []  # the events the store's waiters have begun to wait on (after their look at the store)
    wait = store.events.wait

    def wait_and_record(event: Any, seen: int, timeout: float) -> int:
        waits.append(event)
        return wait(event, seen, timeout)

    store.events.wait = wait_and_record  # type: ignore[method-assign]
    got: dict[str, Any] = {}
    # it looks again for other processes' work only every 600 s: back within 20 s, it was woken by the enqueue
    waiting = threading.Thread(target=lambda: got.update(leased=store.lease_wait("w", 60, poll=600)), daemon=True)
    waiting.start()
    wait_for(lambda: "queued" in waits, 30, "the lease to wait for work")
    [ro] = store.enqueue([RolloutRequest(task={"q": 1})])
    waiting.join(20)
    assert not waiting.is_alive() and got["leased"][0].rollout_id == ro.rollout_id
    attempt = got["leased"][1]

    waiting = threading.Thread(target=lambda: got.update(done=store.wait([ro.rollout_id], 60, poll=600)), daemon=True)
    waiting.start()
    wait_for(lambda: "finished" in waits, 30, "the wait for the rollout to finish")
    store.complete_attempt(attempt.attempt_id, "succeeded", 1.0)
    waiting.join(20)
    assert not waiting.is_alive(), "woken by the completion, not by a poll"
    assert [r.status for r in got["done"]] == ["succeeded"]


# ------------------------------------------------------------------------------------------------ the gateway


def test_live_attempt_is_the_rollouts_running_attempt(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "s.db")
    store.publish_resources({"main_llm": LLM(base_url="http://127.0.0.1:9/v1", model="m")})
    [ro] = store.enqueue([RolloutRequest(task={"q": 1}, max_attempts=2)])
    default = Store.live_attempt  # the implementation every store inherits, built on get_rollout + list_attempts
    for read in (store.live_attempt, lambda rid: default(store, rid)):
        assert read(ro.rollout_id) == LiveAttempt("queued", 1, None)
    leased = store.lease("w")
    assert leased is not None
    for read in (store.live_attempt, lambda rid: default(store, rid)):
        assert read(ro.rollout_id) == LiveAttempt("running", 1, leased[1].attempt_id)
    store.complete_attempt(leased[1].attempt_id, "lost", error="gone")
    for read in (store.live_attempt, lambda rid: default(store, rid)):
        assert read(ro.rollout_id) == LiveAttempt("queued", 1, None)
    again = store.lease("w")
    assert again is not None
    store.complete_attempt(again[1].attempt_id, "succeeded", 1.0)
    for read in (store.live_attempt, lambda rid: default(store, rid)):
        assert read(ro.rollout_id) == LiveAttempt("succeeded", 1, None)


def test_the_agent_gets_the_answer_it_asked_for_and_the_span_the_ids(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "s.db")
    with FakeLLM(["four", "five", "six"]) as fake, AglServer(store) as server:
        store.publish_resources({"main_llm": LLM(base_url=fake.base_url, model="fake-model")})
        [ro] = store.enqueue([RolloutRequest(task={"q": 1})])
        leased = store.lease("w")
        assert leased is not None
        url = f"{server.url}/gw/{ro.rollout_id}/{leased[1].attempt_id}/main_llm/v1"
        client = openai.OpenAI(base_url=url, api_key="k", max_retries=0)

        plain = client.chat.completions.create(model="fake-model", messages=USER)
        assert plain.choices[0].message.content == "four"
        assert plain.choices[0].logprobs is None, "agl asked for logprobs, the agent did not"
        raw = httpx.post(url + "/chat/completions", json={"messages": USER}).json()
        assert "prompt_token_ids" not in raw and "token_ids" not in raw["choices"][0]
        assert raw["choices"][0]["logprobs"] is None and raw["choices"][0]["message"]["content"] == "five"

        asked = client.chat.completions.create(model="fake-model", messages=USER, logprobs=True)
        assert asked.choices[0].logprobs is not None, "asked for: passed on"

        server.flush()
        spans = store.query_spans(rollout_id=ro.rollout_id, kind="llm")
        assert len(spans) == 3
        for span, served in zip(spans, fake.replies, strict=True):
            assert span.attributes[ATTR_PROMPT_IDS] == served.prompt_token_ids
            assert span.attributes[ATTR_RESPONSE_IDS] == served.token_ids
            assert span.attributes[ATTR_LOGPROBS] == served.logprobs
