"""Rewards on the right call and partial loss caught, through real parts: a LangChain agent run in a rollout of this
process (as a runner runs it), agl's gateway and store (``AglServer`` over SQLite), FakeLLM over HTTP. The runner's
clock is made 5 s off the server's: its spans reach the store with times shifted by that much.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import agl
from agl.core.adapter import build_trajectory, check_capture, select_agents
from agl.core.emit import RolloutContext, SpanSink, rollout_scope
from agl.core.runner import gateway_resources
from agl.core.server import AglServer
from agl.core.store.http import HttpStore
from agl.core.store.sqlite import SqliteStore
from agl.core.types import ATTR_CALL_ID, ATTR_VIA_GATEWAY, Rollout, RolloutRequest, Span
from agl.testing import FakeLLM, FakeReply

STEPS = 3


class SkewedClock:
    """The runner's span writer on a host whose clock is ``skew`` seconds off the server's."""

    def __init__(self, store: HttpStore, skew: float) -> None:
        self.store = store
        self.skew = skew

    def add_spans(self, spans: list[Span]) -> int:
        shifted = [
            s.model_copy(
                update={
                    "start_time": s.start_time + self.skew,
                    "end_time": None if s.end_time is None else s.end_time + self.skew,
                }
            )
            for s in spans
        ]
        return self.store.add_spans(shifted)


def langchain_agent(task: Any, resources: dict[str, Any]) -> float:
    """Three model calls through LangChain; after call ``k`` (0-based) a reward of ``0.1 * (k + 1)``."""
    from langchain_openai import ChatOpenAI

    llm = resources["main_llm"]
    chat = ChatOpenAI(base_url=llm.base_url, api_key=llm.api_key, model=llm.model, max_retries=0, timeout=30)
    for step in range(STEPS):
        chat.invoke(f"step {step} of {task}")
        agl.emit_reward(0.1 * (step + 1), name=f"after step {step}")
    return 1.0


def plain_agent(task: Any, resources: dict[str, Any]) -> float:
    """The same three calls and rewards with the OpenAI client and no framework."""
    import openai

    llm = resources["main_llm"]
    client = openai.OpenAI(base_url=llm.base_url, api_key=llm.api_key, max_retries=0, timeout=30)
    for step in range(STEPS):
        client.chat.completions.create(
            model=llm.model, messages=[{"role": "user", "content": f"step {step} of {task}"}]
        )
        agl.emit_reward(0.1 * (step + 1), name=f"after step {step}")
    return 1.0


@dataclass
class Served:
    server: AglServer
    store: SqliteStore
    path: Path


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    path = tmp_path_factory.mktemp("attribution") / "agl.db"
    with FakeLLM(lambda body: FakeReply(content="done")) as fake:
        store = SqliteStore(path)
        store.publish_resources({"main_llm": agl.LLM(base_url=fake.base_url, model="fake")})
        server = AglServer(store).start()
        try:
            yield Served(server, store, path)
        finally:
            server.stop()
            store.close()


def run_rollout(served: Served, skew: float, framework: str = "langchain") -> tuple[Rollout, str]:
    """Run an agent once as a runner on a host ``skew`` seconds off would, inside the capture scope of ``framework``
    (``langchain``: ``langchain_agent``; ``httpx``: ``plain_agent``); returns the rollout and attempt id."""
    if framework == "langchain":
        from agl.integrations.langchain import activate

        agent = langchain_agent
    else:
        from agl.integrations._http import activate

        agent = plain_agent

    runner_store = HttpStore(served.server.url, retry_for=5.0)
    try:
        [queued] = runner_store.enqueue([RolloutRequest(task=f"skew {skew:+g}")])
        leased = runner_store.lease("skewed-runner")
        assert leased is not None and leased[0].rollout_id == queued.rollout_id
        rollout, attempt = leased
        resources = gateway_resources(
            runner_store.get_resources(rollout.resources_version).resources, served.server.url, rollout, attempt
        )
        sink = SpanSink(SkewedClock(runner_store, skew))
        ctx = RolloutContext(rollout.rollout_id, attempt.attempt_id, sink, resources=resources, task=rollout.task)
        with rollout_scope(ctx), activate():
            reward = agent(rollout.task, resources)
        sink.close()
        assert runner_store.complete_attempt(attempt.attempt_id, "succeeded", final_reward=reward)
        return runner_store.get_rollout(rollout.rollout_id), attempt.attempt_id
    finally:
        runner_store.close()


@pytest.mark.parametrize(("skew", "framework"), [(5.0, "langchain"), (-5.0, "langchain"), (5.0, "httpx")])
def test_a_runner_whose_clock_is_off_gets_every_reward_on_the_right_call(
    served: Served, skew: float, framework: str
) -> None:
    rollout, attempt_id = run_rollout(served, skew, framework)
    spans = served.store.query_spans(attempt_id=attempt_id)
    rewards = [s for s in spans if s.kind == "reward"]
    calls = [s for s in spans if s.kind == "llm"]
    assert len(calls) == STEPS and len(rewards) == STEPS
    assert all(abs(r.start_time - c.start_time - skew) < 4 for r, c in zip(rewards, calls, strict=True)), (
        "the runner's spans carry its own (skewed) clock"
    )
    numbers = [s.sequence for s in sorted([*calls, *rewards], key=lambda s: s.sequence)]
    assert [s.kind for s in sorted([*calls, *rewards], key=lambda s: s.sequence)] == ["llm", "reward"] * STEPS, (
        f"each call carries the runner's number, taken when it was sent: {numbers}"
    )
    traj = build_trajectory(rollout, spans, select_agents(None), attempt_id)
    assert [t.request_messages[-1]["content"] for t in traj.transitions] == [
        f"step {k} of skew {skew:+g}" for k in range(STEPS)
    ]
    assert [t.reward for t in traj.transitions] == pytest.approx([0.1, 0.2, 0.3])
    assert check_capture(traj, spans, require_token_ids=True) is None


def _delete_span(path: Path, span_id: str) -> None:
    db = sqlite3.connect(path)
    try:
        with db:
            db.execute("DELETE FROM spans WHERE span_id=?", (span_id,))
    finally:
        db.close()


def test_a_rollout_missing_one_gateway_llm_span_is_a_capture_failure_naming_the_call(served: Served) -> None:
    rollout, attempt_id = run_rollout(served, 0.0)
    calls = served.store.query_spans(attempt_id=attempt_id, kind="llm")
    framework = [s for s in served.store.query_spans(attempt_id=attempt_id) if ATTR_VIA_GATEWAY in s.attributes]
    assert len(calls) == STEPS and sorted(s.attributes[ATTR_CALL_ID] for s in framework) == sorted(
        s.attributes[ATTR_CALL_ID] for s in calls
    ), "the framework's record and the gateway's agree on every call"
    lost = calls[1]
    _delete_span(served.path, lost.span_id)
    spans = served.store.query_spans(attempt_id=attempt_id)
    traj = build_trajectory(rollout, spans, select_agents(None), attempt_id)
    failure = check_capture(traj, spans, require_token_ids=True)
    assert failure is not None and failure.rollout_id == rollout.rollout_id
    assert f"call {lost.attributes[ATTR_CALL_ID]} of agent" in failure.reason
    assert "no gateway llm span" in failure.reason


def test_a_rollout_missing_a_framework_record_is_a_capture_failure_naming_the_call(served: Served) -> None:
    rollout, attempt_id = run_rollout(served, 0.0)
    framework = [s for s in served.store.query_spans(attempt_id=attempt_id) if ATTR_VIA_GATEWAY in s.attributes]
    assert len(framework) == STEPS
    _delete_span(served.path, framework[2].span_id)
    spans = served.store.query_spans(attempt_id=attempt_id)
    failure = check_capture(build_trajectory(rollout, spans, select_agents(None), attempt_id), spans, True)
    assert failure is not None and "missing from the framework's record" in failure.reason
    assert f"call {framework[2].attributes[ATTR_CALL_ID]} of agent" in failure.reason
