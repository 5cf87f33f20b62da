"""End to end: Trainer → runners (processes) → gateway → fake LLM, embedded (SQLite) and server mode."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import agl
from agl.core.store.sqlite import SqliteStore
from agl.testing import FakeLLM, FakeReply
from tests import agents_basic
from tests.server_process import free_port, start_server


def _reply(body: dict[str, Any]) -> FakeReply:
    text = body["messages"][-1]["content"]
    question = text.split(":", 1)[-1].split("(")[0].strip()
    return FakeReply(content=f"the answer to {question} is {question.upper()}")


@pytest.fixture
def fake() -> Iterator[FakeLLM]:
    with FakeLLM(_reply) as server:
        yield server


def _tasks(n: int = 8) -> list[dict[str, Any]]:
    return [{"id": f"t{i}", "question": f"q{i}", "answer": f"Q{i}", "stream": i % 2 == 1} for i in range(n)]


def _check_exact_tokens(batch: agl.RolloutBatch, fake: FakeLLM) -> None:
    """Every transition carries exactly the ids and logprobs the fake LLM returned for one of its calls."""
    served = sorted(
        (tuple(r.prompt_token_ids or []), tuple(r.token_ids or []), tuple(r.logprobs or [])) for r in fake.replies
    )
    captured = sorted(
        (tuple(t.prompt_ids), tuple(t.response_ids), tuple(t.response_logprobs))
        for traj in batch.trajectories
        for t in traj.transitions
    )
    assert captured == served and all(s[0] and s[1] for s in served)
    for traj in batch.trajectories:
        assert len(traj.transitions) == 2
        assert traj.transitions[0].request_messages[-1]["content"].startswith("draft:")
        assert [t.reward for t in traj.transitions] == [0.2, 0.0]
        assert traj.rewards == [0.2]
        assert traj.final_reward == 1.0


def test_embedded_mode_captures_exact_tokens_and_rewards(tmp_path: Path, fake: FakeLLM) -> None:
    trainer = agl.Trainer(
        n_runners=2,
        store=f"sqlite:///{tmp_path}/agl.db",
        resources={"main_llm": agl.LLM(base_url=fake.base_url, model="fake")},
        progress=False,
    )
    batch = trainer.evaluate(agents_basic.two_call_agent, _tasks())
    assert len(batch.trajectories) == 8 and batch.failures == []
    assert sorted(str(t.task_id) for t in batch.trajectories) == sorted(f"t{i}" for i in range(8))
    _check_exact_tokens(batch, fake)
    assert batch.summary["mean_reward"] == 1.0 and batch.summary["success_rate"] == 1.0
    assert batch.summary["mean_transitions"] == 2.0
    streamed = [r for r in fake.requests if r.get("stream")]
    assert len(streamed) == 8, "half the tasks stream both calls"
    workers = {
        a.worker_id for r in batch.rollouts for a in SqliteStore(tmp_path / "agl.db").list_attempts(r.rollout_id)
    }
    assert len(workers) == 2, "both runners took work"


def test_async_agent_is_captured_the_same(tmp_path: Path, fake: FakeLLM) -> None:
    trainer = agl.Trainer(
        n_runners=1,
        store=f"sqlite:///{tmp_path}/agl.db",
        resources={"main_llm": agl.LLM(base_url=fake.base_url, model="fake")},
        progress=False,
    )
    batch = trainer.evaluate(agents_basic.async_two_call_agent, _tasks(3))
    assert [len(t.transitions) for t in batch.trajectories] == [2, 2, 2]
    assert all(t.transitions[0].response_ids for t in batch.trajectories)


def test_server_mode_with_agl_server_process(tmp_path: Path, fake: FakeLLM) -> None:
    port = free_port()
    server = start_server(tmp_path / "srv.db", port)
    try:
        trainer = agl.Trainer(
            n_runners=2,
            store=f"http://127.0.0.1:{port}",
            resources={"main_llm": agl.LLM(base_url=fake.base_url, model="fake")},
            progress=False,
        )
        batch = trainer.evaluate(agents_basic.two_call_agent, _tasks())
        assert len(batch.trajectories) == 8
        _check_exact_tokens(batch, fake)
    finally:
        server.terminate()
        server.wait(10)


def test_server_restart_mid_run_keeps_acknowledged_spans(tmp_path: Path, fake: FakeLLM) -> None:
    db = tmp_path / "restart.db"
    port = free_port()
    server = start_server(db, port)
    trainer = agl.Trainer(
        n_runners=2,
        store=f"http://127.0.0.1:{port}",
        resources={"main_llm": agl.LLM(base_url=fake.base_url, model="fake")},
        progress=False,
    )
    result: dict[str, Any] = {}
    run = threading.Thread(
        target=lambda: result.update(batch=trainer.evaluate(agents_basic.two_call_agent, _tasks(16)))
    )
    run.start()
    while len(fake.requests) < 6:
        time.sleep(0.02)
    before = {s.span_id for s in SqliteStore(db).query_spans()}
    server.terminate()
    server.wait(10)
    server = start_server(db, port)
    try:
        run.join(120)
        assert not run.is_alive()
        after = {s.span_id for s in SqliteStore(db).query_spans()}
        assert before and before <= after, "every span stored before the restart is still there"
        assert len(result["batch"].rollouts) == 16
        assert all(r.finished for r in result["batch"].rollouts)
    finally:
        server.terminate()
        server.wait(10)


def test_killed_runner_rollout_is_retried_without_duplicate_spans(tmp_path: Path, fake: FakeLLM) -> None:
    marker = tmp_path / "pid"
    trainer = agl.Trainer(
        n_runners=2,
        store=f"sqlite:///{tmp_path}/agl.db",
        heartbeat_timeout=2.0,
        resources={"main_llm": agl.LLM(base_url=fake.base_url, model="fake")},
        progress=False,
    )

    def killer() -> None:
        while not marker.exists() or not marker.read_text():
            time.sleep(0.02)
        os.kill(int(marker.read_text()), signal.SIGKILL)

    k = threading.Thread(target=killer, daemon=True)
    k.start()
    batch = trainer.evaluate(agents_basic.dies_once_agent, [{"id": "k", "marker": str(marker)}])
    k.join(5)
    [ro] = batch.rollouts
    assert ro.status == "succeeded"
    store = SqliteStore(tmp_path / "agl.db")
    attempts = store.list_attempts(ro.rollout_id)
    # The killed attempt is lost and retried; on a heavily loaded machine a starved heartbeat may cost one more try.
    assert attempts[0].status == "lost" and attempts[-1].status == "succeeded"
    assert {a.status for a in attempts[1:-1]} <= {"lost"} and ro.attempts == len(attempts)
    assert attempts[0].worker_id != attempts[-1].worker_id
    [traj] = batch.trajectories
    assert [t.request_messages[-1]["content"] for t in traj.transitions] == ["first call", "second call"]
    spans = store.query_spans(rollout_id=ro.rollout_id)
    assert len({s.span_id for s in spans}) == len(spans)
    assert len(store.query_spans(attempt_id=attempts[0].attempt_id, kind="llm")) == 1


def test_crashing_agent_fails_its_attempt_not_the_runner(tmp_path: Path, fake: FakeLLM) -> None:
    trainer = agl.Trainer(
        n_runners=1,
        store=f"sqlite:///{tmp_path}/agl.db",
        resources={"main_llm": agl.LLM(base_url=fake.base_url, model="fake")},
        progress=False,
    )
    batch = trainer.evaluate(agents_basic.crashing_agent, [{"i": i} for i in range(4)])
    assert [r.status for r in batch.rollouts] == ["succeeded", "failed", "succeeded", "failed"]
    assert batch.rollouts[1].error == "ValueError: bad input 1"
    assert batch.summary["failed"] == 2 and batch.summary["mean_reward"] == 0.5
    store = SqliteStore(tmp_path / "agl.db")
    exc = store.query_spans(rollout_id=batch.rollouts[1].rollout_id, kind="exception")
    assert exc and exc[0].attributes["exception.message"] == "bad input 1"
    assert len({a.worker_id for r in batch.rollouts for a in store.list_attempts(r.rollout_id)}) == 1


def test_agent_bypassing_the_gateway_is_a_capture_failure(tmp_path: Path, fake: FakeLLM) -> None:
    tasks = [{"direct_url": fake.base_url} for _ in range(3)]
    kwargs: dict[str, Any] = dict(
        n_runners=1,
        store=f"sqlite:///{tmp_path}/agl.db",
        resources={"main_llm": agl.LLM(base_url=fake.base_url, model="fake")},
        progress=False,
    )
    with pytest.raises(agl.CaptureError, match="no LLM call was captured"):
        agl.Trainer(**kwargs).evaluate(agents_basic.bypass_agent, tasks)
    batch = agl.Trainer(allow_capture_failures=True, **kwargs).evaluate(agents_basic.bypass_agent, tasks)
    assert batch.summary["capture_failures"] == 3 and batch.usable == []


def test_cli_runs_and_show(tmp_path: Path, fake: FakeLLM, capsys: pytest.CaptureFixture[str]) -> None:
    from agl.cli import main

    url = f"sqlite:///{tmp_path}/agl.db"
    trainer = agl.Trainer(
        n_runners=1, store=url, progress=False, resources={"main_llm": agl.LLM(base_url=fake.base_url, model="fake")}
    )
    batch = trainer.evaluate(agents_basic.crashing_agent, [{"i": 0}, {"i": 1}])
    capsys.readouterr()
    assert main(["runs", "--store", url]) == 0
    out = capsys.readouterr().out
    assert "succeeded" in out and "failed" in out and "ValueError: bad input 1" in out
    assert main(["show", batch.rollouts[1].rollout_id, "--store", url]) == 0
    out = capsys.readouterr().out
    assert "ERROR: ValueError: bad input 1" in out and "exception:ValueError" in out and "llm:chat.completions" in out
    assert main(["show", "ro-nope", "--store", url]) == 1
