"""A single LoRA policy trained by LightningRL on the local backend: the server serves the updater's frozen base
tensors (one copy of the base model in the process) and each round's adapter over them, never merging, so the base
stays the updater's own. On a tiny Qwen2 model counted as large (the threshold lowered), as the 0.5B runs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import openai
import pytest
import torch

import agl
import agl.trainers.config as trainer_config
from agl.serving.models import make_tiny_model
from agl.trainers.config import LoraConfig, parameter_count
from tests.test_rl_update import _transitions


@pytest.fixture(scope="module")
def tiny_qwen(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("tiny-qwen") / "model", seed=0, architecture="qwen2")


def _chat(backend: Any, prompt: str) -> Any:
    client = openai.OpenAI(base_url=backend.base_url, api_key=backend.api_key, max_retries=0)
    return client.chat.completions.create(
        model=backend.model,
        messages=[{"role": "user", "content": prompt}],
        max_tokens=6,
        temperature=0,
        extra_body={"return_token_ids": True},
    )


def test_the_server_serves_the_updaters_frozen_base_and_each_round_as_an_adapter(
    tiny_qwen: Path, tmp_path: Path
) -> None:
    from agl.trainers.rl.backend import LocalBackend
    from agl.trainers.rl.update import PolicyUpdater, UpdateConfig

    updater = PolicyUpdater(tiny_qwen, UpdateConfig(lr=1e-2, lora=LoraConfig(r=4), device="cpu"))
    frozen = updater.frozen_base()
    assert frozen is not None
    backend = LocalBackend(tiny_qwen, model_name="policy", seed=0, max_batch_size=2, version="v0")
    backend.start()
    try:
        before = _chat(backend, "Say yes.").choices[0].message.content
        backend.share_base(frozen)
        served = backend.server.model.state_dict()
        assert all(served[k].data_ptr() == t.data_ptr() for k, t in frozen.items()), "no copy of its own"
        assert _chat(backend, "Say yes.").choices[0].message.content == before, "the same weights"
        for version in ("v1", "v2"):  # each round replaces the adapter under the same model name
            updater.step(_transitions(updater))
            backend.sync(updater, version, updater.save(tmp_path / f"round-{version}"))
            assert backend.model == "policy/trained"
            reply = _chat(backend, "Say yes.")
            assert reply.model_extra is not None and reply.model_extra.get("agl_weights_version") == version
        base_now = {
            k.replace("base_layer.", ""): v for k, v in backend.server.model.state_dict().items() if ".lora_" not in k
        }
        assert all(base_now[k].data_ptr() == t.data_ptr() for k, t in frozen.items()), "still shared after a round"
        assert all(torch.equal(base_now[k], t) for k, t in updater.frozen_base().items())  # type: ignore[union-attr]
    finally:
        backend.stop()
    full = PolicyUpdater(tiny_qwen, UpdateConfig(lora=None, device="cpu"))
    assert full.frozen_base() is None, "full weights are trained: nothing to share"


def _agent(task: dict[str, Any], resources: dict[str, Any]) -> float:
    llm = resources["main_llm"]
    client = openai.OpenAI(base_url=llm.base_url, api_key=llm.api_key, max_retries=0)
    reply = client.chat.completions.create(model=llm.model, messages=[{"role": "user", "content": task["prompt"]}])
    text = reply.choices[0].message.content or ""
    return sum(c.isupper() for c in text) / max(1, len(text))


@pytest.mark.slow
def test_lightningrl_trains_a_large_models_lora_adapter_by_default_and_serves_it_over_one_base(
    tiny_qwen: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from agl.trainers.rl import LightningRL, LightningRLConfig, UpdateConfig
    from agl.trainers.rl.backend import LocalBackend

    monkeypatch.setattr(trainer_config, "LORA_AUTO_PARAMETERS", (parameter_count(tiny_qwen) or 0) - 1)
    remembered_at_update: list[int] = []  # the server's remembered prompts as each update starts
    before_update = LocalBackend.before_update

    def watched(backend: LocalBackend) -> None:
        before_update(backend)
        remembered_at_update.append(sum(len(engine._prefixes) for engine in backend.server._engine.engines))

    monkeypatch.setattr(LocalBackend, "before_update", watched)
    cfg = LightningRLConfig(
        model_dir=tiny_qwen,
        rounds=3,
        group_size=4,
        serving=agl.ServingConfig(max_tokens=4, temperature=1.0),
        update=UpdateConfig(lr=1e-2, device="cpu", measure_kl_ref=False),
        seed=0,
        checkpoint_dir=tmp_path / "ckpt",
    )
    assert cfg.update.lora == LoraConfig(), "LoRA by default for a large model on a CPU"
    store = f"sqlite:///{tmp_path / 'agl.db'}"
    trainer = agl.Trainer(algorithm=LightningRL(cfg), n_runners=1, store=store, progress=False)
    tasks = [{"id": f"t{i}", "prompt": p} for i, p in enumerate(["Hello", "Say words", "Go", "Name"])]
    result = trainer.fit(_agent, tasks)
    weights = Path(result.metrics["weights_path"])
    assert (weights / "adapter_config.json").is_file() and not (weights / "config.json").is_file()
    from agl.core.store import open_store

    opened = open_store(store)
    try:
        rollouts = opened.list_rollouts(mode="train", limit=100)
        assert len(rollouts) == 3 * 16 and all(r.status == "succeeded" for r in rollouts), "rounds 2 and 3 too"
        models = {
            s.attributes.get("gen_ai.request.model")
            for r in rollouts
            for s in opened.query_spans(rollout_id=r.rollout_id)
            if s.kind == "llm"
        }
    finally:
        opened.close()
    assert "policy" in models and "policy/trained" in models, models
    assert remembered_at_update and set(remembered_at_update) == {0}, "each update starts with the prompts forgotten"
