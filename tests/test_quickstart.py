"""The docs' quickstart (examples/quickstart) runs as written: a LangGraph agent captured against FakeLLM, then
trained with LightningRL on the tiny model until its reward rises."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import agl
from agl.core.adapter import build_trajectory, select_agents
from examples.quickstart.train import main

pytestmark = pytest.mark.slow


def test_the_quickstart_captures_the_graphs_calls_and_trains_the_tiny_model(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--out", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    assert "'rollouts': 4, 'succeeded': 4, 'failed': 0, 'capture_failures': 0, 'mean_reward': 0.75" in printed, (
        "3 of the 4 words of the scripted 'Paris is The Capital' are capitalised"
    )
    store = agl.open_store(f"sqlite:///{tmp_path}/evaluate.db")
    for rollout in store.list_rollouts():
        (attempt,) = store.list_attempts(rollout.rollout_id)
        spans = store.query_spans(attempt_id=attempt.attempt_id)
        (call,) = build_trajectory(rollout, spans, select_agents("answer"), attempt.attempt_id).transitions
        assert call.agent == "answer" and call.prompt_ids and call.response_ids, "the graph node's call, with ids"
    line = next(row for row in printed.splitlines() if row.startswith("trained: mean reward per round"))
    rewards = [float(x) for x in re.findall(r"\d+\.\d+", line)]
    assert len(rewards) == 4 and rewards[-1] > rewards[0] + 0.25, line
    assert "agl runs --store" in printed
