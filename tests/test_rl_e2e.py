"""LightningRL end to end: Trainer + runners + gateway + local policy server + updates, on a tiny model (CPU).

The toy task: a plain OpenAI-client agent asks for a few tokens; the reward is the share of reply tokens that start
with an upper-case letter (read from the per-token logprob entries the server returns). The random tiny model's
next-token distribution is almost uniform, and about 28% of the vocabulary is capitalised; GRPO with a high learning
rate pushes the share up within a few rounds. Sampling at temperature 0.25 sharpens that flat distribution so a group's
samples overlap and an update visibly moves what the next round samples.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import openai
import pytest

import agl

pytestmark = pytest.mark.slow  # every test here trains a policy with LightningRL

MAX_TOKENS = 4


def capital_share(tokens: list[str]) -> float:
    """Share of tokens whose text (leading spaces ignored) starts with an upper-case letter (0 for no tokens)."""
    return sum(t.strip()[:1].isupper() for t in tokens) / len(tokens) if tokens else 0.0


def capital_agent(task: dict[str, Any], resources: dict[str, Any]) -> float:
    """One call (streamed when the task says so); records exactly the ids the server sent back, for the test."""
    llm = resources["main_llm"]
    client = openai.OpenAI(base_url=llm.base_url, api_key=llm.api_key, max_retries=0)
    messages: Any = [{"role": "user", "content": task["prompt"]}]
    if task.get("stream"):
        tokens: list[str] = []
        response_ids: list[int] = []
        prompt_ids: list[int] = []
        version = None
        for chunk in client.chat.completions.create(model=llm.model, messages=messages, stream=True):
            extra = chunk.model_extra or {}
            prompt_ids = extra.get("prompt_token_ids") or prompt_ids
            version = extra.get("agl_weights_version", version)
            if chunk.choices:
                choice = chunk.choices[0]
                tokens += [e.token for e in (choice.logprobs.content or [])] if choice.logprobs else []
                response_ids += (choice.model_extra or {}).get("token_ids") or []
    else:
        # asked for: a non-streamed answer carries back only the ids and logprobs its client asked for
        reply = client.chat.completions.create(
            model=llm.model, messages=messages, logprobs=True, extra_body={"return_token_ids": True}
        )
        extra = reply.model_extra or {}
        logprobs = reply.choices[0].logprobs
        tokens = [e.token for e in (logprobs.content or [])] if logprobs else []
        prompt_ids, version = extra["prompt_token_ids"], extra["agl_weights_version"]
        response_ids = (reply.choices[0].model_extra or {})["token_ids"]
    agl.emit_object("seen", {"prompt_ids": prompt_ids, "response_ids": response_ids, "version": version})
    return capital_share(tokens)


TASKS = [{"id": f"t{i}", "prompt": p, "stream": i == 0} for i, p in enumerate(["Hello", "Say words", "Go", "Name"])]


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    from agl.serving.models import make_tiny_model
    from agl.trainers.config import ServingConfig
    from agl.trainers.rl import LightningRL, LightningRLConfig, UpdateConfig

    root = tmp_path_factory.mktemp("rl")
    cfg = LightningRLConfig(
        model_dir=make_tiny_model(root / "tiny", seed=0),
        rounds=4,
        group_size=4,
        serving=ServingConfig(max_tokens=MAX_TOKENS, temperature=0.25),
        update=UpdateConfig(lr=1e-2, device="cpu"),
        epochs=2,
        mini_batches=2,
        seed=0,
        val_every=2,
    )
    store = f"sqlite:///{root / 'agl.db'}"
    # One runner: requests reach the server in a fixed order, so its sampling seeds (drawn in arrival order) and
    # therefore the whole run are repeatable.
    trainer = agl.Trainer(algorithm=LightningRL(cfg), n_runners=1, store=store, progress=False)
    result = trainer.fit(capital_agent, TASKS, TASKS[1:])
    return {"result": result, "store": store, "root": root}


def _rows(run: dict[str, Any]) -> list[dict[str, Any]]:
    import json

    rows: list[dict[str, Any]] = json.loads((run["root"] / "rl_metrics.json").read_text())
    return rows


def test_mean_reward_rises(run: dict[str, Any]) -> None:
    rows = _rows(run)
    train = [r for r in rows if r["round"] > 0]
    assert [r["round"] for r in train] == [1, 2, 3, 4]
    rewards = [r["mean_reward"] for r in train]
    assert (rewards[2] + rewards[3]) / 2 > rewards[0] + 0.25, rewards
    assert (run["root"] / "rl_metrics.csv").read_text().startswith("round,")
    assert {"val/mean_reward", "kl", "clip_fraction", "tokens_per_s", "seconds"} <= set().union(*rows)


def test_every_round_reports_the_training_diagnostics(run: dict[str, Any]) -> None:
    from agl.trainers.rl._report import DIAGNOSTICS

    measured_by_update = {"entropy", "kl_ref", "clip_fraction", "grad_norm"}
    train = [r for r in _rows(run) if r["round"] > 0]
    for row in train:
        trained = row["trained_transitions"] > 0
        for column, _, _ in DIAGNOSTICS:
            if trained or column not in measured_by_update:
                assert isinstance(row[column], float) and math.isfinite(row[column]), (row["round"], column)
            else:  # a round whose groups were all zero-variance trains nothing: NaN in the CSV, null in the JSON
                assert row[column] is None, (row["round"], column)
        # one call per rollout, 4 rollouts per task, replies of exactly MAX_TOKENS tokens (the tiny model never stops)
        assert row["transitions_per_task"] == 4.0 and row["response_length"] == MAX_TOKENS
        assert row["zero_variance_fraction"] == row["skipped_groups"] / row["groups"]
        assert row["greedy_transitions"] == 0.0
        if trained:
            assert row["entropy"] > 0.0 and row["grad_norm"] > 0.0 and row["kl_ref"] >= 0.0
    assert [r["trained_transitions"] > 0 for r in train][:2] == [True, True]
    assert train[1]["kl_ref"] > 0.0  # round 2 samples from the weights round 1 trained


def test_transitions_carry_exactly_what_the_server_returned(run: dict[str, Any]) -> None:
    from agl.core.adapter import build_trajectory, select_agents
    from agl.core.store import open_store

    store = open_store(run["store"])
    try:
        rollouts = store.list_rollouts(limit=1000)
        streamed = 0
        for ro in rollouts:
            spans = store.query_spans(rollout_id=ro.rollout_id)
            traj = build_trajectory(ro, spans, select_agents(None))
            (seen,) = [s.attributes["agl.object"] for s in spans if s.kind == "custom"]
            (transition,) = traj.transitions
            assert transition.prompt_ids == seen["prompt_ids"]
            assert transition.response_ids == seen["response_ids"]
            assert len(transition.response_logprobs) == len(seen["response_ids"]) > 0
            assert transition.weights_version == seen["version"]
            assert transition.temperature == 0.25  # the published sampling, recorded on the call's span
            streamed += bool(ro.task["stream"])
        assert streamed >= 4
    finally:
        store.close()


def test_weight_versions_follow_rounds_and_never_mix(run: dict[str, Any]) -> None:
    from agl.core.store import open_store

    expected, index = "v0", 0
    rows = [r for r in _rows(run) if r["round"] > 0]
    for row in rows:
        assert row["weights_version"] == expected
        if row["trained_transitions"]:
            index += 1
            expected = f"v{index}"
    assert index >= 2 and run["result"].metrics["weights_version"] == expected
    store = open_store(run["store"])
    try:
        train = store.list_rollouts(mode="train", limit=1000)
        assert len(train) == 4 * len(TASKS) * 4
        by_resources: dict[int, set[str]] = {}
        for ro in train:
            (llm,) = store.query_spans(rollout_id=ro.rollout_id, kind="llm")
            version = llm.attributes["agl.weights_version"]
            by_resources.setdefault(ro.resources_version, set()).add(version)
            policy = store.get_resources(ro.resources_version).resources["policy"]
            assert isinstance(policy, agl.ModelWeights) and policy.version == version
        assert all(len(versions) == 1 for versions in by_resources.values())
        assert set().union(*by_resources.values()) == {r["weights_version"] for r in rows}
    finally:
        store.close()


def test_resume_continues_from_the_latest_checkpoint(tmp_path: Path) -> None:
    from agl.serving.models import make_tiny_model
    from agl.trainers.config import ServingConfig
    from agl.trainers.rl import LightningRL, LightningRLConfig, UpdateConfig

    settings: dict[str, Any] = {
        "model_dir": make_tiny_model(tmp_path / "tiny", seed=0),
        "group_size": 4,
        "serving": ServingConfig(max_tokens=MAX_TOKENS, temperature=0.25),
        "update": UpdateConfig(lr=1e-2, device="cpu"),
        "seed": 0,
        "checkpoint_dir": tmp_path / "ckpt",
        "keep_checkpoints": 1,
    }
    store = f"sqlite:///{tmp_path / 'agl.db'}"
    first = LightningRL(LightningRLConfig(rounds=1, **settings))
    agl.Trainer(algorithm=first, n_runners=1, store=store, progress=False).fit(capital_agent, TASKS)
    assert (tmp_path / "ckpt" / "round-0001" / "trainer_state.pt").is_file()
    second = LightningRL(LightningRLConfig(rounds=2, resume_from="latest", **settings))
    result = agl.Trainer(algorithm=second, n_runners=1, store=store, progress=False).fit(capital_agent, TASKS)
    rows = _rows({"root": tmp_path})
    assert [r["round"] for r in rows] == [1, 2]
    # one optimizer step per round, on the round's own samples: at temperature 0.25 the ratio is 1 on that step
    assert rows[0]["optimizer_steps"] == 1 and rows[0]["clip_fraction"] == 0.0
    assert rows[0]["kl"] == pytest.approx(0.0, abs=1e-6) and rows[0]["kl_ref"] == pytest.approx(0.0, abs=1e-6)
    assert rows[0]["trained_transitions"] > 0 and rows[1]["weights_version"] == "v1"
    assert result.metrics["weights_version"] == ("v2" if rows[1]["trained_transitions"] else "v1")
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["round-0002"]
