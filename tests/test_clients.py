"""``agl.openai_client`` / ``agl.async_openai_client``: an OpenAI client per rollout with the attempt's URL and key,
over one HTTP client per runner process (async: per event loop, which the runner keeps across rollouts)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import agl
from agl.core.store.sqlite import SqliteStore
from agl.testing import FakeLLM, FakeReply
from tests import agents_basic


def _reply(body: dict[str, Any]) -> FakeReply:
    text = body["messages"][-1]["content"]
    question = text.split(":", 1)[-1].split("(")[0].strip().split(" ")[0]
    return FakeReply(content=f"the answer to {question} is {question.upper()}")


@pytest.fixture
def fake() -> Iterator[FakeLLM]:
    with FakeLLM(_reply) as server:
        yield server


def _trainer(tmp_path: Path, fake: FakeLLM) -> agl.Trainer:
    return agl.Trainer(
        n_runners=1,
        store=f"sqlite:///{tmp_path}/agl.db",
        resources={"main_llm": agl.LLM(base_url=fake.base_url, model="fake")},
        progress=False,
    )


def test_async_client_is_shared_across_rollouts_and_each_call_lands_in_its_own_attempt(
    tmp_path: Path, fake: FakeLLM
) -> None:
    marks = tmp_path / "marks"
    marks.mkdir()
    tasks = [{"id": f"t{i}", "question": f"q{i}", "answer": f"Q{i}", "marks": str(marks)} for i in range(4)]
    batch = _trainer(tmp_path, fake).evaluate(agents_basic.shared_client_agent, tasks)
    assert batch.failures == [] and batch.summary["mean_reward"] == 1.0
    assert [len(t.transitions) for t in batch.trajectories] == [2, 2, 2, 2]
    assert all(t.transitions[0].response_ids for t in batch.trajectories)
    store = SqliteStore(tmp_path / "agl.db")
    clients = set()
    for rollout in batch.rollouts:
        llm_spans = store.query_spans(rollout_id=rollout.rollout_id, kind="llm")
        (attempt,) = store.list_attempts(rollout.rollout_id)
        assert {s.attempt_id for s in llm_spans} == {attempt.attempt_id}, "each call went to its own attempt"
        (mark,) = [s for s in store.query_spans(rollout_id=rollout.rollout_id, kind="custom") if s.name == "client"]
        clients.add((mark.attributes["agl.object"]["pid"], mark.attributes["agl.object"]["http_client"]))
    assert len(clients) == 1, "one runner, one event loop: every rollout used the same HTTP client"
    assert sorted(p.name for p in marks.iterdir()) == [f"t{i}.cancelled" for i in range(4)], (
        "what a rollout left running is cancelled when it ends"
    )


def test_sync_client_captures_calls_streamed_or_not(tmp_path: Path, fake: FakeLLM) -> None:
    tasks = [{"id": f"t{i}", "question": f"q{i}", "answer": f"Q{i}", "stream": i % 2 == 1} for i in range(4)]
    batch = _trainer(tmp_path, fake).evaluate(agents_basic.shared_sync_client_agent, tasks)
    assert batch.failures == [] and batch.summary["mean_reward"] == 1.0
    assert [len(t.transitions) for t in batch.trajectories] == [2, 2, 2, 2]
    assert all(t.transitions[1].response_ids for t in batch.trajectories)


def test_a_client_for_something_else_than_an_llm_resource_is_refused() -> None:
    with pytest.raises(TypeError, match=r"agl\.LLM resource"):
        agl.openai_client({"base_url": "http://127.0.0.1:1/v1"})  # type: ignore[arg-type]
