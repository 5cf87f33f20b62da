"""Per-agent policies in LightningRL: the setting, the split by policy, isolated adapter updates, checkpoints."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch

from agl.core.types import PolicyRoute, Trajectory, Transition
from agl.trainers.config import LoraConfig
from agl.trainers.rl import checkpoint
from agl.trainers.rl.batching import collate, to_sample
from agl.trainers.rl.credit import assign_all
from agl.trainers.rl.lightning import LightningRL, LightningRLConfig, _State
from agl.trainers.rl.policies import MANIFEST, POLICIES_DIR, PolicySet, split_by_policy
from agl.trainers.rl.update import PolicyUpdater
from agl.trainers.rl.update_config import UpdateConfig

AGENTS = ["writer", "rewriter"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from agl.serving.models import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("tiny"), seed=0)


def _config(model_dir: Path, **extra: object) -> LightningRLConfig:
    return LightningRLConfig(
        model_dir=model_dir,
        policies=dict.fromkeys(AGENTS, "lora"),
        update=UpdateConfig(lr=1e-2, lora=LoraConfig(r=4, alpha=8), device="cpu", measure_kl_ref=False),
        **extra,  # type: ignore[arg-type]
    )


def _adapters(model_dir: Path) -> PolicySet:
    cfg = _config(model_dir)
    return PolicySet(model_dir, list(cfg.policies), cfg.update, cfg.serving.model_name)


def _adapter_tensors(updater: PolicyUpdater) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in updater.model.named_parameters() if "lora_" in n}


def _call(updater: PolicyUpdater, span: str, agent: str, policy: str | None, answer: str) -> Transition:
    """One call of ``agent`` served by ``policy``, with behaviour log-probs = the current (identity-adapter) ones."""
    tok = updater.tokenizer
    text = tok.apply_chat_template(
        [{"role": "user", "content": "Say yes."}], add_generation_prompt=True, tokenize=False
    )
    prompt = tok(text, add_special_tokens=False)["input_ids"]
    response = tok(answer, add_special_tokens=False)["input_ids"]
    t = Transition(
        span_id=span,
        agent=agent,
        step=0,
        prompt_ids=prompt,
        response_ids=response,
        response_logprobs=[0.0] * len(response),
        weights_version="v0",
        policy=policy,
        advantage=0.0,
    )
    batch = collate([to_sample(t)], updater.pad_id)
    t.response_logprobs = [float(x) for x in updater.logprobs(batch)[0][batch.response_mask[0] > 0]]
    t.advantage = None
    return t


def _group(updater: PolicyUpdater, agent: str, policy: str | None, rewards: list[float]) -> list[Trajectory]:
    """One task's rollouts: each one call of ``agent`` (served by ``policy``) and a base-model call of ``other``."""
    out = []
    for i, reward in enumerate(rewards):
        answer = " yes yes" if reward > 0 else " no thanks"
        calls = [
            _call(updater, f"{agent}{i}", agent, policy, answer),
            _call(updater, f"o{i}", "other", "policy", " ok"),
        ]
        out.append(
            Trajectory(
                rollout_id=f"r{i}",
                attempt_id="a",
                task_id="t",
                resources_version=1,
                status="succeeded",
                final_reward=reward,
                transitions=calls,
            )
        )
    return out


def test_policies_accept_only_lora(model_dir: Path) -> None:
    with pytest.raises(ValueError, match=r"policies\['writer'\].*only 'lora'"):
        LightningRLConfig(model_dir=model_dir, policies={"writer": "full"})
    with pytest.raises(ValueError, match="policies: agent names"):
        LightningRLConfig(model_dir=model_dir, policies={"": "lora"})


def test_split_by_policy_keeps_each_policys_calls_and_puts_the_rest_on_the_base() -> None:
    def t(span: str, policy: str | None) -> Transition:
        return Transition(span_id=span, agent=span[0], step=0, policy=policy)

    calls = [t("w1", "policy/writer"), t("r1", "policy/rewriter"), t("c1", "policy"), t("x1", None)]
    only_writer = [t("w2", "policy/writer")]
    trajs = [
        Trajectory(
            rollout_id=f"r{i}",
            attempt_id="a",
            task_id="t",
            resources_version=1,
            status="succeeded",
            final_reward=1.0,
            transitions=ts,
        )
        for i, ts in enumerate([calls, only_writer])
    ]
    parts = split_by_policy(trajs, {"policy/writer": "writer", "policy/rewriter": "rewriter"})
    assert [[x.span_id for x in tr.transitions] for tr in parts["writer"]] == [["w1"], ["w2"]]
    assert [[x.span_id for x in tr.transitions] for tr in parts["rewriter"]] == [["r1"]]
    assert [[x.span_id for x in tr.transitions] for tr in parts[None]] == [["c1", "x1"]]
    assert parts["writer"][0].transitions[0] is calls[0]  # advantages written on a part land on the original


def test_an_agents_transitions_change_only_its_own_adapter(model_dir: Path) -> None:
    algo = LightningRL(_config(model_dir))
    adapters = _adapters(model_dir)
    writer, rewriter = adapters.updaters["writer"], adapters.updaters["rewriter"]
    trajectories = _group(writer, "writer", "policy/writer", [1.0, 0.0, 1.0, 0.0])
    assign_all(trajectories)
    before = {a: _adapter_tensors(u) for a, u in adapters.updaters.items()}
    kept_by, adv, extra = algo._advantages(trajectories, adapters)
    assert extra["base_transitions"] == 4 and extra["policy/writer/trained_transitions"] == 4
    assert [t.span_id for t in kept_by["writer"]] == ["writer0", "writer1", "writer2", "writer3"]
    assert kept_by["rewriter"] == [] and adv.kept_transitions == 4
    updated = algo._update_members(adapters, kept_by, random.Random(0), "v1")
    assert list(updated) == ["writer"] and adapters.versions == {"writer": "v1", "rewriter": "v0"}
    after = {a: _adapter_tensors(u) for a, u in adapters.updaters.items()}
    assert all(torch.equal(before["rewriter"][n], after["rewriter"][n]) for n in before["rewriter"])
    assert any(not torch.equal(before["writer"][n], after["writer"][n]) for n in before["writer"])
    # the other way round: the rewriter's calls move the rewriter's adapter and leave the writer's as it now is
    trajectories = _group(rewriter, "rewriter", "policy/rewriter", [0.0, 1.0, 1.0, 0.0])
    assign_all(trajectories)
    kept_by, _, _ = algo._advantages(trajectories, adapters)
    algo._update_members(adapters, kept_by, random.Random(0), "v2")
    again = {a: _adapter_tensors(u) for a, u in adapters.updaters.items()}
    assert all(torch.equal(after["writer"][n], again["writer"][n]) for n in after["writer"])
    assert any(not torch.equal(after["rewriter"][n], again["rewriter"][n]) for n in after["rewriter"])
    assert adapters.versions == {"writer": "v1", "rewriter": "v2"}
    assert adapters.routes() == {
        "writer": PolicyRoute(model="policy/writer", weights_version="v1"),
        "rewriter": PolicyRoute(model="policy/rewriter", weights_version="v2"),
    }


def test_a_stale_adapter_version_in_a_round_is_an_error_naming_the_policy(model_dir: Path) -> None:
    algo = LightningRL(_config(model_dir))
    adapters = _adapters(model_dir)
    trajectories = _group(adapters.updaters["writer"], "writer", "policy/writer", [1.0, 0.0])
    adapters.versions["writer"] = "v3"  # the writer was updated, but these calls ran on its v0
    assign_all(trajectories)
    with pytest.raises(RuntimeError, match=r"policy 'writer'.*'v0'.*'v3'"):
        algo._advantages(trajectories, adapters)
    adapters.versions["writer"] = "v0"
    trajectories[1].transitions[0].weights_version = "v1"  # one round, two versions of one adapter
    with pytest.raises(RuntimeError, match=r"policy 'writer'.*several weight versions"):
        algo._advantages(trajectories, adapters)


def test_checkpoint_holds_each_adapter_in_peft_format_and_resume_restores_all(model_dir: Path, tmp_path: Path) -> None:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    algo = LightningRL(_config(model_dir, checkpoint_dir=tmp_path / "ckpt"))
    adapters = _adapters(model_dir)
    for agent, policy, rewards in [
        ("writer", "policy/writer", [1.0, 0.0]),
        ("rewriter", "policy/rewriter", [0.0, 1.0]),
    ]:
        trajectories = _group(adapters.updaters[agent], agent, policy, rewards)
        assign_all(trajectories)
        kept_by, _, _ = algo._advantages(trajectories, adapters)
        algo._update_members(adapters, kept_by, random.Random(0), "v1")
    folder = checkpoint.round_dir(tmp_path / "ckpt", 1)
    adapters.save(folder)
    rng = random.Random(5)
    state = algo._checkpoint_state(adapters, rng, _State(round=1, version_index=1))
    checkpoint.save_state(folder, state)

    manifest = json.loads((folder / POLICIES_DIR / MANIFEST).read_text())
    assert manifest["adapters"] == {
        "writer": {"folder": "writer", "version": "v1", "model": "policy/writer"},
        "rewriter": {"folder": "rewriter", "version": "v1", "model": "policy/rewriter"},
    }
    ids = torch.tensor([[5, 6, 7, 8]])
    for agent, entry in manifest["adapters"].items():
        base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        loaded = PeftModel.from_pretrained(base, str(folder / POLICIES_DIR / entry["folder"])).eval()
        with torch.no_grad():
            assert torch.allclose(loaded(input_ids=ids).logits, adapters.updaters[agent].model(input_ids=ids).logits)

    resumed = LightningRL(_config(model_dir, checkpoint_dir=tmp_path / "ckpt", resume_from="latest"))
    fresh = _adapters(model_dir)
    restored = _State()
    assert resumed._resume(tmp_path / "ckpt", fresh, random.Random(0), restored) == folder
    assert fresh.versions == {"writer": "v1", "rewriter": "v1"} and restored.round == 1
    for agent in AGENTS:
        saved, back = _adapter_tensors(adapters.updaters[agent]), _adapter_tensors(fresh.updaters[agent])
        assert saved.keys() == back.keys() and all(torch.equal(saved[n], back[n]) for n in saved)
        moments = adapters.updaters[agent].optimizer.state_dict()["state"]
        restored_moments = fresh.updaters[agent].optimizer.state_dict()["state"]
        assert moments and moments.keys() == restored_moments.keys()
        assert all(torch.equal(moments[k]["exp_avg"], restored_moments[k]["exp_avg"]) for k in moments)
