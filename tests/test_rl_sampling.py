"""Dynamic sampling (``LightningRLConfig.min_informative_groups``): task choice and refills as pure functions, and one
LightningRL run on a tiny model whose tasks always succeed, always fail, or vary."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import openai
import pytest

import agl
from agl.trainers.rl.sampling import (
    FLAT_LIMIT,
    GroupOutcome,
    TaskRecord,
    choose_tasks,
    draw_round,
    history_from_state,
    history_state,
    record_outcome,
)

# ------------------------------------------------------------------------------------------------ pure functions


def test_choose_prefers_mixed_then_unseen_and_never_retired_or_taken() -> None:
    ids = ["mixed", "unseen", "solved", "retired", "taken", "mixed2"]
    history = {
        "mixed": TaskRecord(rollouts=4, low=0.0, high=1.0),
        "mixed2": TaskRecord(rollouts=4, low=0.0, high=0.5),  # not a pass, but the rewards differed
        "solved": TaskRecord(rollouts=4, low=1.0, high=1.0, flat=1),
        "retired": TaskRecord(rollouts=8, low=0.0, high=0.0, flat=FLAT_LIMIT),
        "taken": TaskRecord(rollouts=4, low=0.0, high=1.0),
    }
    rng = random.Random(0)
    assert choose_tasks(ids, history, 2, rng, {"taken"}) == [0, 5]
    assert choose_tasks(ids, history, 3, rng, {"taken"}) == [0, 1, 5]
    assert choose_tasks(ids, history, 10, rng, {"taken"}) == [0, 1, 2, 5]  # never "retired" nor "taken"
    assert choose_tasks(ids, history, 0, rng, set()) == []
    # within a tier the choice is random, and repeatable with the same seed
    many = [f"u{i}" for i in range(20)]
    picks = [choose_tasks(many, {}, 3, random.Random(seed), set()) for seed in (1, 1, 2)]
    assert picks[0] == picks[1] != picks[2] and len(picks[0]) == 3


def test_record_outcome_tracks_rewards_and_flat_groups() -> None:
    history: dict[str, TaskRecord] = {}
    record_outcome(history, "t", GroupOutcome((0.0, 0.0), informative=False))
    assert history["t"] == TaskRecord(rollouts=2, low=0.0, high=0.0, flat=1) and not history["t"].mixed
    record_outcome(history, "t", GroupOutcome((1.0, 0.0), informative=True))
    assert history["t"] == TaskRecord(rollouts=4, low=0.0, high=1.0, flat=1) and history["t"].mixed
    record_outcome(history, "t", GroupOutcome((), informative=False))  # no usable rollout: nothing learnt
    assert history["t"].flat == 1 and not history["t"].retired


class FakeGroups:
    """Runs a batch of tasks without a model: ``win*`` tasks always get 1, ``lose*`` always 0, ``mix*`` a mix."""

    def __init__(self, ids: list[str]) -> None:
        self.ids = ids
        self.batches: list[list[str]] = []

    def __call__(self, chosen: list[int]) -> dict[str, GroupOutcome]:
        names = [self.ids[i] for i in chosen]
        self.batches.append(names)
        out = {}
        for name in names:
            rewards = (1.0, 1.0) if name.startswith("win") else (0.0, 0.0) if name.startswith("lose") else (1.0, 0.0)
            out[name] = GroupOutcome(rewards, informative=name.startswith("mix"))
        return out


def test_a_round_refills_until_enough_informative_groups() -> None:
    ids = ["win0", "win1", "lose0", "lose1", "mix0", "mix1", "mix2", "mix3"]
    history: dict[str, TaskRecord] = {}
    run = FakeGroups(ids)
    draws = draw_round(ids, history, per_draw=2, min_informative=3, cap=8, rng=random.Random(0), run=run)
    drawn = [ids[i] for i in draws.tasks]
    assert draws.draws == len(run.batches) and drawn == [n for batch in run.batches for n in batch]
    assert len(set(drawn)) == len(drawn)  # never the same task twice in a round
    assert draws.informative == sum(n.startswith("mix") for n in drawn) >= 3
    assert sum(n.startswith("mix") for n in run.batches[-1]) >= 1  # it stopped as soon as the third one came
    assert draws.retired_skipped == 0
    assert all(history[n].rollouts == 2 for n in drawn) and set(history) == set(drawn)


def test_the_cap_bounds_the_draws_and_flat_twice_tasks_are_skipped_for_good() -> None:
    ids = ["win0", "lose0", "mix0", "win1", "lose1"]
    history: dict[str, TaskRecord] = {}
    run = FakeGroups(ids)
    rng = random.Random(0)
    # K = 3 is unreachable (one mixed task): round 1 stops at the cap of 4 tasks, round 2 at 4 again
    first = draw_round(ids, history, per_draw=2, min_informative=3, cap=4, rng=rng, run=run)
    assert (len(first.tasks), first.draws, first.informative) == (4, 2, int("mix0" in history))
    second = draw_round(ids, history, per_draw=2, min_informative=3, cap=4, rng=rng, run=run)
    assert "mix0" in run.batches[2]  # it varied before, or was never drawn: either way among the first
    assert len(second.tasks) == 4 and second.draws == 2
    retired = {n for n, record in history.items() if record.retired}
    assert retired and all(not n.startswith("mix") for n in retired) and all(history[n].flat == 2 for n in retired)
    third = draw_round(ids, history, per_draw=2, min_informative=3, cap=4, rng=rng, run=run)
    assert third.retired_skipped == len(retired)
    assert not retired & {ids[i] for i in third.tasks}
    # once every flat task is retired only the mixed one is left: the round stops when nothing is left to draw
    for _ in range(4):
        draw_round(ids, history, per_draw=2, min_informative=3, cap=4, rng=rng, run=run)
    assert {n for n, record in history.items() if record.retired} == {"win0", "lose0", "win1", "lose1"}
    last = draw_round(ids, history, per_draw=2, min_informative=3, cap=4, rng=rng, run=run)
    assert [ids[i] for i in last.tasks] == ["mix0"] and last.draws == 1 and last.retired_skipped == 4


def test_task_history_survives_a_checkpoint(tmp_path: Path) -> None:
    from agl.trainers.rl import checkpoint

    history = {"a": TaskRecord(rollouts=4, low=0.0, high=1.0, flat=1), "b": TaskRecord()}
    checkpoint.save_state(tmp_path, {"tasks": history_state(history)})
    assert history_from_state(checkpoint.load_state(tmp_path)["tasks"]) == history


def test_config_validates_dynamic_sampling() -> None:
    from agl.trainers.rl import GRPOConfig, LightningRLConfig

    assert LightningRLConfig(model_dir="m").min_informative_groups is None  # off by default
    with pytest.raises(ValueError, match="min_informative_groups"):
        LightningRLConfig(model_dir="m", min_informative_groups=0)
    with pytest.raises(ValueError, match="skip_zero_variance"):
        LightningRLConfig(model_dir="m", min_informative_groups=2, grpo=GRPOConfig(skip_zero_variance=False))
    with pytest.raises(ValueError, match="max_draw_factor"):
        LightningRLConfig(model_dir="m", max_draw_factor=0.5)


# ------------------------------------------------------------------------------------------------ end to end

GROUP = 3


def graded_agent(task: dict[str, Any], resources: dict[str, Any]) -> float:
    """One model call; ``win`` tasks score 1 and ``lose`` tasks 0 whatever it says, ``mix`` tasks a number in [0, 1)
    computed from the reply's characters, which differs between samples of the near-uniform tiny model (four tokens
    of a 49k vocabulary), so a ``mix`` group is never flat (the share of capitalised tokens was 0 for a whole group
    of some seeds)."""
    llm = resources["main_llm"]
    client = openai.OpenAI(base_url=llm.base_url, api_key=llm.api_key, max_retries=0)
    reply = client.chat.completions.create(
        model=llm.model, messages=[{"role": "user", "content": task["prompt"]}], logprobs=True
    )
    logprobs = reply.choices[0].logprobs
    tokens = [e.token for e in (logprobs.content or [])] if logprobs else []
    if task["id"].startswith("win"):
        return 1.0
    if task["id"].startswith("lose"):
        return 0.0
    return sum(ord(c) for c in "".join(tokens)) % 97 / 97


TASKS = [{"id": i, "prompt": p} for i, p in [("win0", "Hi"), ("lose0", "Go"), ("mix0", "Say"), ("mix1", "Name")]]


@pytest.mark.slow
def test_lightningrl_draws_until_informative_and_retires_flat_tasks(tmp_path: Path) -> None:
    import json

    from agl.serving.models import make_tiny_model
    from agl.trainers.config import ServingConfig
    from agl.trainers.rl import LightningRL, LightningRLConfig, UpdateConfig, checkpoint

    cfg = LightningRLConfig(
        model_dir=make_tiny_model(tmp_path / "tiny", seed=0),
        rounds=3,
        tasks_per_round=2,
        group_size=GROUP,
        min_informative_groups=3,  # unreachable with two mixed tasks: every round draws up to its cap
        max_draw_factor=2.0,  # cap: 4 tasks a round
        serving=ServingConfig(max_tokens=4),
        update=UpdateConfig(lr=1e-2, device="cpu", measure_kl_ref=False),
        seed=0,
        checkpoint_dir=tmp_path / "ckpt",
    )
    store = f"sqlite:///{tmp_path / 'agl.db'}"
    agl.Trainer(algorithm=LightningRL(cfg), n_runners=1, store=store, progress=False).fit(graded_agent, TASKS)
    rows = json.loads((tmp_path / "rl_metrics.json").read_text())
    assert [r["round"] for r in rows] == [1, 2, 3]
    for row in rows:
        assert row["rollouts"] == GROUP * row["tasks_drawn"]
        # flat groups are never trained on: only the mixed tasks' calls (one per rollout) are
        assert row["skipped_groups"] == row["tasks_drawn"] - row["informative_groups"]
        assert row["trained_transitions"] == GROUP * row["informative_groups"]
    first, second, third = rows
    # rounds 1 and 2: a batch of two, then a refill of two (the cap); the win and lose groups are flat both times
    assert (first["tasks_drawn"], first["draws"], first["informative_groups"]) == (4, 2, 2)
    assert (second["tasks_drawn"], second["draws"], second["informative_groups"]) == (4, 2, 2)
    assert first["flat_skipped_tasks"] == second["flat_skipped_tasks"] == 0
    # round 3: the two tasks flat twice are skipped; only the mixed ones are left, one draw
    assert (third["tasks_drawn"], third["draws"], third["flat_skipped_tasks"]) == (2, 1, 2)
    assert {"tasks_drawn", "informative_groups", "draws", "flat_skipped_tasks"} <= set(
        (tmp_path / "rl_metrics.csv").read_text().splitlines()[0].split(",")
    )
    # every rollout of a round ran on that round's weights, whatever draw it came from
    assert [r["weights_version"] for r in rows] == ["v0", "v1", "v2"]
    latest = checkpoint.latest_checkpoint(tmp_path / "ckpt")
    assert latest is not None
    saved = history_from_state(checkpoint.load_state(latest)["tasks"])
    assert {k: (r.flat, r.rollouts) for k, r in saved.items()} == {
        "win0": (2, 2 * GROUP),
        "lose0": (2, 2 * GROUP),
        "mix0": (0, 3 * GROUP),
        "mix1": (0, 3 * GROUP),
    }
