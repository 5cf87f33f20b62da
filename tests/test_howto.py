"""The how-to pages' code (examples/howto, quoted by the pages section by section) runs as written: each capture
example records its framework's calls under the agent names the page says, each trainer trains the tiny model, and
the offline path turns imported traces into a prompt edit and new weights."""

from __future__ import annotations

import importlib
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

import agl
from agl.testing import FakeLLM, FakeReply

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.slow


@pytest.fixture
def in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Run in ``tmp_path`` as a user runs in their project: the examples' default ``runs/`` lands there."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    yield tmp_path


def _calls(batch: agl.RolloutBatch) -> list[list[str | None]]:
    return [[t.agent for t in trajectory.transitions] for trajectory in batch.trajectories]


@pytest.mark.parametrize(
    ("module", "agents"),
    [
        ("examples.howto.two_agents", ["writer", "rewriter"]),
        ("examples.howto.openai_agents_app", ["solver", "solver"]),
        ("examples.howto.autogen_app", ["solver", "solver"]),
        ("examples.howto.crewai_app", ["Solver", "Solver"]),
    ],
)
def test_each_frameworks_example_is_captured_under_its_agent_names(
    in_tmp: Path, module: str, agents: list[str]
) -> None:
    example = importlib.import_module(module)
    batch = example.main(store=f"sqlite:///{in_tmp}/example.db")
    assert batch.summary["capture_failures"] == 0 and batch.summary["failed"] == 0
    assert batch.summary["mean_reward"] == 1.0, "the scripted model's answers are right"
    assert _calls(batch) == [agents] * len(batch.rollouts)
    for trajectory in batch.trajectories:
        assert all(t.prompt_ids and t.response_ids for t in trajectory.transitions), "exact ids from the gateway"


def test_the_plain_openai_example_records_its_call_and_intermediate_reward(in_tmp: Path) -> None:
    from examples.howto.plain_openai import main

    with FakeLLM(lambda body: FakeReply(content="2+2 is 4")) as fake:
        result = main(fake.base_url, store=f"sqlite:///{in_tmp}/agl.db")
    assert result.summary["mean_reward"] == 1.0 and result.summary["capture_failures"] == 0
    ((call,),) = [trajectory.transitions for trajectory in result.trajectories]
    assert call.response_ids and call.reward == pytest.approx(0.2), "agl.emit_reward lands on the call before it"


def test_the_lightningrl_example_trains_a_round_of_the_tiny_model(in_tmp: Path) -> None:
    from agl.serving import make_tiny_model
    from examples.howto import trainers
    from examples.howto.two_agents import TASKS

    tiny = make_tiny_model(in_tmp / "tiny", seed=0)
    rl = trainers.lightningrl(tiny, TASKS, rounds=1).metrics
    assert rl["rollouts"] == 16 and rl["optimizer_steps"] >= 1 and rl["trained_transitions"] == 32
    assert trainers.vllm_config(tiny).backend == "vllm", "GPU only: built, not started"


def test_the_per_agent_lora_example_trains_an_adapter_for_each_agent(in_tmp: Path) -> None:
    from agl.serving import make_tiny_model
    from examples.howto import trainers
    from examples.howto.two_agents import TASKS

    lora = trainers.lora_per_agent(make_tiny_model(in_tmp / "tiny", seed=0), TASKS, rounds=1).metrics
    assert lora["weight_sync"] == "adapter"
    assert lora["policy/writer/trained_transitions"] == lora["policy/rewriter/trained_transitions"] == 16


def test_the_rejection_sampling_example_fine_tunes_the_tiny_model_on_selected_calls(in_tmp: Path) -> None:
    from agl.serving import make_tiny_model
    from examples.howto import trainers
    from examples.howto.two_agents import TASKS

    tiny = make_tiny_model(in_tmp / "tiny", seed=0)
    rft = trainers.rejection_sampling(tiny, TASKS, rounds=1, min_reward=0.0).metrics
    assert rft["selected_samples"] > 0 and rft["optimizer_steps"] > 0 and rft["weights_version"] == "v1"


def test_the_apo_example_publishes_the_prompt_that_solves_the_tasks(in_tmp: Path) -> None:
    from examples.howto import trainers
    from examples.howto.two_agents import TASKS

    with FakeLLM(trainers.scripted_apo_models) as fake:
        apo = trainers.prompt_optimization(fake.base_url, fake.base_url, TASKS, rollout_budget=8).metrics
    assert apo["chosen"] != "c0" and apo["train/mean_reward"] == 1.0
    assert list((in_tmp / "runs" / "tensorboard").iterdir()), "report_to wrote TensorBoard events"


def test_the_own_algorithm_examples_measure_and_pick_the_best_prompt(in_tmp: Path) -> None:
    from examples.howto.own_algorithm import main

    measured, best = main(store=f"sqlite:///{in_tmp}/own.db")
    assert measured["rollouts"] == 2 and measured["mean_reward"] == 0.0
    assert best == {"best_mean_reward": 1.0}


def test_the_production_traces_example_edits_the_prompt_and_trains_on_text(in_tmp: Path) -> None:
    from examples.howto.production_traces import main

    prompt, weights = main(in_tmp)
    assert prompt == "Add the numbers, then check the sum: {question}"
    assert (in_tmp / weights / "config.json").is_file()
