"""LoRA by default for a large model on a CPU, and that path on a tiny Qwen2-architecture model: an adapter trained by
SFT, served over one copy of the base by the policy server, merged into a whole model that serves the same logits.
The tiny model stands in for Qwen2.5-Coder-0.5B: the same architecture class, tokenizer and code path; only the
size threshold is lowered so that it counts as large."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import agl
import agl.trainers.config as trainer_config
from agl.clients import openai_client
from agl.serving.models import make_tiny_model
from agl.trainers.config import AutoLora, LoraConfig, parameter_count, resolve_lora
from agl.trainers.sft import SFTConfig, SFTSample


@pytest.fixture(scope="module")
def tiny_qwen(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("tiny-qwen") / "model", seed=0, architecture="qwen2")


@pytest.fixture
def counts_as_large(monkeypatch: pytest.MonkeyPatch, tiny_qwen: Path) -> None:
    count = parameter_count(tiny_qwen)
    assert count is not None
    monkeypatch.setattr(trainer_config, "LORA_AUTO_PARAMETERS", count - 1)


def test_parameters_are_counted_from_the_safetensors_headers(tiny_qwen: Path, tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_qwen)
    stored = {t.data_ptr(): t.numel() for t in model.state_dict().values()}  # tied weights are stored once
    assert parameter_count(tiny_qwen) == sum(stored.values())
    assert parameter_count(tmp_path) is None, "no weights file: unknown, not zero"


def test_the_default_is_a_lora_adapter_for_a_large_model_on_a_cpu_only(
    tiny_qwen: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert resolve_lora(AutoLora(), tiny_qwen, "cpu") is None, "a small model trains all its weights"
    assert SFTConfig(model_dir=tiny_qwen).lora is None
    assert agl.LightningRLConfig(model_dir=tiny_qwen).update.lora is None
    monkeypatch.setattr(trainer_config, "LORA_AUTO_PARAMETERS", 1000)
    assert SFTConfig(model_dir=tiny_qwen, device="cpu").lora == LoraConfig()
    assert agl.LightningRLConfig(model_dir=tiny_qwen).update.lora == LoraConfig(), "no GPU here: auto means the CPU"
    assert resolve_lora(AutoLora(r=4), tiny_qwen, "cpu") == LoraConfig(r=4), "the default's settings are kept"
    assert SFTConfig(model_dir=tiny_qwen, device="cuda").lora is None, "on a GPU full weights stay the default"
    assert SFTConfig(model_dir=tiny_qwen, lora=None).lora is None, "full weights when asked"
    assert SFTConfig(model_dir=tiny_qwen, lora=LoraConfig(r=2)).lora == LoraConfig(r=2)


def _samples(model_dir: Path) -> list[SFTSample]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    samples = []
    for question, answer in [("count the users", "SELECT COUNT(*) FROM users"), ("list cities", "SELECT city FROM t")]:
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": question}], add_generation_prompt=True, tokenize=False
        )
        prompt_ids = list(tokenizer(text, add_special_tokens=False)["input_ids"])
        reply = list(tokenizer(answer + "<|im_end|>", add_special_tokens=False)["input_ids"])
        samples.append(SFTSample(prompt_ids + reply, [0] * len(prompt_ids) + [1] * len(reply)))
    return samples


@pytest.mark.usefixtures("counts_as_large")
def test_a_tiny_qwen2_trains_a_lora_adapter_that_serves_over_the_base_and_merges_to_the_same_logits(
    tiny_qwen: Path, tmp_path: Path
) -> None:
    from peft import AutoPeftModelForCausalLM
    from transformers import AutoModelForCausalLM

    from agl.serving import PolicyServer
    from agl.trainers.sft.train import is_adapter, merge_adapter, train_samples

    cfg = SFTConfig(model_dir=tiny_qwen, lr=3e-2, epochs=3, device="cpu")
    assert cfg.lora == LoraConfig(), "the default path of a large model"
    adapter = train_samples(_samples(tiny_qwen), cfg, tmp_path / "adapter").path
    assert is_adapter(adapter) and not (adapter / "config.json").is_file()
    with PolicyServer(tiny_qwen, seed=0) as server:
        base = {k: v.clone() for k, v in server.model.state_dict().items()}
        server.load_adapter("tuned", adapter, "v1")
        served = {k.replace("base_layer.", ""): v for k, v in server.model.state_dict().items() if ".lora_" not in k}
        assert served.keys() == base.keys(), "the adapter wraps the base model; no second copy"
        assert all(torch.equal(v, base[k]) for k, v in served.items()), "the base weights are unchanged"
        client = openai_client(agl.LLM(base_url=server.base_url, model="policy", api_key="x"))
        reply = client.chat.completions.create(
            model="policy/tuned", messages=[{"role": "user", "content": "count the users"}], max_tokens=8
        )
        assert reply.choices[0].message.content is not None
    merged = merge_adapter(adapter, tmp_path / "merged")
    ids = torch.tensor([_samples(tiny_qwen)[0].input_ids])
    with torch.no_grad():
        expected = AutoPeftModelForCausalLM.from_pretrained(str(adapter)).eval()(ids).logits
        got = AutoModelForCausalLM.from_pretrained(merged).eval()(ids).logits
        untrained = AutoModelForCausalLM.from_pretrained(tiny_qwen).eval()(ids).logits
    assert torch.allclose(got, expected, atol=1e-4), "the merged model is the adapter over its base"
    assert not torch.allclose(got, untrained, atol=1e-3), "training moved it"
