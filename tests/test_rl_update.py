"""Batching alignment, the loss, and real update steps on a tiny model built in code."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch

from agl.core.types import Transition
from agl.trainers.config import LoraConfig
from agl.trainers.rl.batching import (
    MicroBatch,
    collate,
    collate_shared,
    make_micro_batches,
    plan_micro_batches,
    plan_shared,
    to_sample,
)
from agl.trainers.rl.loss import LossConfig, policy_loss
from agl.trainers.rl.update import PolicyUpdater, UpdateConfig


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from agl.serving.models import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("tiny"), seed=0)


def tr(prompt: list[int], response: list[int], adv: float = 1.0, logprobs: list[float] | None = None) -> Transition:
    lps = logprobs if logprobs is not None else [-float(i + 1) for i in range(len(response))]
    return Transition(
        span_id=f"s{len(prompt)}-{len(response)}-{adv}",
        agent="a",
        step=0,
        prompt_ids=prompt,
        response_ids=response,
        response_logprobs=lps,
        advantage=adv,
    )


# ------------------------------------------------------------------------------------------------------- batching


def test_batch_aligns_response_mask_and_logprobs_with_input_ids() -> None:
    batch = collate([to_sample(tr([1, 2, 3], [7, 8])), to_sample(tr([4], [9, 10, 11], adv=-0.5))], pad_id=0)
    assert batch.input_ids.tolist() == [[1, 2, 3, 7, 8], [4, 9, 10, 11, 0]]
    assert batch.attention_mask.tolist() == [[1, 1, 1, 1, 1], [1, 1, 1, 1, 0]]
    assert batch.response_mask.tolist() == [[0, 0, 0, 1, 1], [0, 1, 1, 1, 0]]
    assert batch.old_logprobs.tolist() == [[0, 0, 0, -1, -2], [0, -1, -2, -3, 0]]
    assert batch.advantages.tolist() == [1.0, -0.5]
    assert batch.response_tokens == 5 and batch.truncated == 0


def test_truncation_cuts_the_prompt_from_the_left_and_keeps_the_response() -> None:
    s = to_sample(tr([1, 2, 3, 4, 5], [7, 8]), max_length=4)
    assert (s.input_ids, s.response_start, s.old_logprobs, s.truncated) == ([4, 5, 7, 8], 2, [-1.0, -2.0], True)
    s = to_sample(tr([1, 2], [7, 8, 9, 10]), max_length=3)
    assert (s.input_ids, s.response_start, s.old_logprobs) == ([2, 7, 8], 1, [-1.0, -2.0])
    assert not to_sample(tr([1, 2], [7]), max_length=3).truncated


def test_bad_transitions_are_rejected_with_a_reason() -> None:
    with pytest.raises(ValueError, match="no token ids"):
        to_sample(tr([], [1]))
    with pytest.raises(ValueError, match="logprobs"):
        to_sample(tr([1], [2, 3], logprobs=[-1.0]))
    with pytest.raises(ValueError, match="advantage"):
        to_sample(Transition(span_id="x", agent=None, step=0, prompt_ids=[1], response_ids=[2], response_logprobs=[0]))


def test_micro_batches_respect_the_token_budget() -> None:
    # longest first: 12 alone (2 x 12 > 20), then 10 + 4 (2 x 10), then 3 + 2
    assert plan_micro_batches([3, 10, 4, 2, 12], token_budget=20) == [[4], [1, 2], [0, 3]]
    assert plan_micro_batches([30, 2], token_budget=8) == [[0], [1]]
    batches = make_micro_batches([tr([1] * 5, [2] * 5), tr([1], [2]), tr([1] * 3, [2] * 2)], token_budget=10, pad_id=0)
    assert [tuple(b.input_ids.shape) for b in batches] == [(1, 10), (2, 5)]
    assert sum(b.response_tokens for b in batches) == 8


def test_prompts_sharing_a_prefix_are_batched_over_it_once() -> None:
    system = list(range(100, 140))  # a 40-token system prompt every call repeats
    group = [tr([*system, 1, 2, 3], [7 + i, 8], adv=float(i)) for i in range(3)]  # one GRPO group: same prompt
    later = [tr([*system, 9, 9, 9, 9], [5]), tr([*system, 9, 9, 8], [6, 6])]  # later calls: the system prompt
    alone = tr([1, 2, 3], [4])  # shares nothing
    samples = [to_sample(t) for t in [*group, *later, alone]]
    groups, single = plan_shared(samples, token_budget=100, min_shared=32)
    assert groups == [(40, [0, 1, 2, 4, 3])] and single == [5], "neighbours in prompt order, down to the system prompt"
    groups, single = plan_shared(samples, token_budget=100, min_shared=42)
    assert groups == [(43, [0, 1, 2]), (42, [4, 3])] and single == [5]
    groups, single = plan_shared(samples, token_budget=4, min_shared=32)  # two 2-token remainders fit, not three
    assert groups == [(43, [0, 1])] and single == [2, 3, 4, 5]
    batches = make_micro_batches([*group, *later, alone], token_budget=100, pad_id=0, share_prefixes=32)
    shared = batches[0]
    assert shared.prefix_ids is not None and shared.prefix_ids.tolist() == [system]
    assert shared.input_ids.tolist()[0] == [1, 2, 3, 7, 8] and shared.response_mask.tolist()[0] == [0, 0, 0, 1, 1]
    assert shared.tokens == 40 + sum(len(t.prompt_ids) + len(t.response_ids) - 40 for t in [*group, *later])
    assert sum(b.response_tokens for b in batches) == sum(len(t.response_ids) for t in [*group, *later, alone])
    with pytest.raises(ValueError, match="do not share"):
        collate_shared([to_sample(group[0]), to_sample(alone)], 3, pad_id=0)


# ------------------------------------------------------------------------------------------------------- loss


def test_loss_clips_and_aggregates() -> None:
    mask = torch.tensor([[0.0, 1.0, 1.0], [0.0, 1.0, 0.0]])
    old = torch.zeros(2, 3)
    new = torch.tensor([[0.0, 0.5, 0.0], [0.0, 0.0, 0.0]])  # first token's ratio e^0.5 ≈ 1.65 > 1.2: clipped
    adv = torch.tensor([1.0, -1.0])
    loss, sums = policy_loss(new, old, adv, mask, LossConfig(), normalizer=3.0)
    assert loss.item() == pytest.approx((-1.2 - 1.0 + 1.0) / 3)
    assert (sums.tokens, sums.clipped) == (3.0, 1.0)
    loss, _ = policy_loss(new, old, adv, mask, LossConfig(aggregation="sequence_mean"), normalizer=2.0)
    assert loss.item() == pytest.approx(((-1.2 - 1.0) / 2 + 1.0) / 2)
    ref = torch.tensor([[0.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    loss_kl, sums_kl = policy_loss(new, old, adv, mask, LossConfig(kl_beta=0.5), normalizer=3.0, ref_logprobs=ref)
    k3 = torch.exp(torch.tensor(-0.5)) + 0.5 - 1.0
    assert sums_kl.kl_ref == pytest.approx(k3.item(), rel=1e-5)
    assert loss_kl.item() == pytest.approx(loss.item() * 0 + (-1.2 - 1.0 + 1.0 + 0.5 * k3.item()) / 3, rel=1e-5)


def test_negative_weight_scales_only_the_terms_of_negative_advantages() -> None:
    mask = torch.tensor([[0.0, 1.0, 1.0], [0.0, 1.0, 0.0]])
    old = torch.zeros(2, 3)
    new = torch.tensor([[0.0, 0.5, 0.0], [0.0, 0.0, 0.0]])
    adv = torch.tensor([1.0, -1.0])
    today, _ = policy_loss(new, old, adv, mask, LossConfig(), normalizer=3.0)
    same, _ = policy_loss(new, old, adv, mask, LossConfig(negative_weight=1.0), normalizer=3.0)
    assert torch.equal(today, same), "weight 1 is today's GRPO loss, bit for bit"
    half, _ = policy_loss(new, old, adv, mask, LossConfig(negative_weight=0.5), normalizer=3.0)
    assert half.item() == pytest.approx((-1.2 - 1.0 + 0.5) / 3)
    none, _ = policy_loss(new, old, adv, mask, LossConfig(negative_weight=0.0), normalizer=3.0)
    assert none.item() == pytest.approx((-1.2 - 1.0) / 3), "the negative call adds nothing; the mean still counts it"
    with pytest.raises(ValueError, match="negative_weight: must be in"):
        LossConfig(negative_weight=1.5)


# ------------------------------------------------------------------------------------------------------- updates


def _transitions(updater: PolicyUpdater) -> list[Transition]:
    """Two prompts, each with a response to push up (+1) and one to push down (-1), behaviour = current policy."""
    tok = updater.tokenizer
    out: list[Transition] = []
    for i, question in enumerate(["Say yes.", "What is two plus two?"]):
        text = tok.apply_chat_template(
            [{"role": "user", "content": question}], add_generation_prompt=True, tokenize=False
        )
        prompt = tok(text, add_special_tokens=False)["input_ids"]
        for j, (answer, adv) in enumerate([(" yes yes", 1.0), (" no thanks", -1.0)]):
            response = tok(answer, add_special_tokens=False)["input_ids"]
            out.append(
                Transition(
                    span_id=f"s{i}{j}",
                    agent="a",
                    step=0,
                    prompt_ids=prompt,
                    response_ids=response,
                    response_logprobs=[0.0] * len(response),
                    advantage=adv,
                )
            )
    for t, lp in zip(out, _response_logprobs(updater, out), strict=True):
        t.response_logprobs = lp
    return out


def _response_logprobs(updater: PolicyUpdater, transitions: list[Transition]) -> list[list[float]]:
    out = []
    for t in transitions:
        batch = collate([to_sample(t)], updater.pad_id)
        lp = updater.logprobs(batch)[0].cpu()
        out.append([float(x) for x in lp[batch.response_mask[0] > 0]])
    return out


def _check_update(updater: PolicyUpdater) -> dict[str, float]:
    transitions = _transitions(updater)
    before = [sum(lp) for lp in _response_logprobs(updater, transitions)]
    metrics = updater.step(transitions)
    after = [sum(lp) for lp in _response_logprobs(updater, transitions)]
    for t, b, a in zip(transitions, before, after, strict=True):
        assert (a > b) if t.advantage and t.advantage > 0 else (a < b), (t.span_id, b, a)
    return metrics


def test_update_raises_positive_and_lowers_negative_responses(model_dir: Path) -> None:
    updater = PolicyUpdater(model_dir, UpdateConfig(lr=1e-3, device="cpu", micro_batch_tokens=64))
    metrics = _check_update(updater)
    # behaviour logprobs were the current ones: nothing is clipped on the first step
    assert metrics["clip_fraction"] == 0.0
    assert metrics["approx_kl"] == pytest.approx(0.0, abs=1e-6)
    assert metrics["micro_batches"] >= 2 and metrics["response_tokens"] > 0 and metrics["grad_norm"] > 0
    # the KL to the start weights is measured without a KL penalty: 0 before the first step moved them, > 0 after
    assert updater.config.loss.kl_beta == 0.0 and metrics["kl_ref"] == pytest.approx(0.0, abs=1e-6)
    assert updater.step(_transitions(updater))["kl_ref"] > 1e-6


def test_state_dict_hot_swaps_into_a_fresh_model(model_dir: Path) -> None:
    from transformers import AutoModelForCausalLM

    for lora in (False, True):
        updater = PolicyUpdater(model_dir, UpdateConfig(lr=1e-2, lora=LoraConfig(r=4) if lora else None, device="cpu"))
        updater.step(_transitions(updater))
        fresh = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
        fresh.load_state_dict(updater.state_dict(), strict=True)
        ids = torch.tensor([[1, 2, 3, 4]])
        with torch.no_grad():
            assert torch.allclose(fresh(input_ids=ids).logits, updater.model(input_ids=ids).logits, atol=1e-4)


def test_lora_path_with_reference_kl_trains_and_round_trips(model_dir: Path, tmp_path: Path) -> None:
    cfg = UpdateConfig(lr=1e-2, lora=LoraConfig(r=4, alpha=8), device="cpu", loss=LossConfig(kl_beta=0.1))
    updater = PolicyUpdater(model_dir, cfg)
    trainable = sum(p.numel() for p in updater.parameters)
    assert trainable < sum(p.numel() for p in updater.model.parameters()) / 4
    metrics = _check_update(updater)
    assert metrics["kl_ref"] == pytest.approx(0.0, abs=1e-6)  # adapter starts as identity: policy == reference
    second = updater.step(_transitions(updater))
    assert second["kl_ref"] > 0.0
    folder = updater.save(tmp_path / "adapter")
    assert (folder / "adapter_config.json").is_file()
    again = PolicyUpdater(model_dir, cfg)
    again.load(folder)
    ids = torch.tensor([[5, 6, 7]])
    with torch.no_grad():
        assert torch.allclose(again.model(input_ids=ids).logits, updater.model(input_ids=ids).logits, atol=1e-5)


def test_full_weights_save_and_load(model_dir: Path, tmp_path: Path) -> None:
    updater = PolicyUpdater(model_dir, UpdateConfig(lr=1e-2, device="cpu", loss=LossConfig(kl_beta=0.05)))
    metrics = updater.step(_transitions(updater))
    assert metrics["kl_ref"] == pytest.approx(0.0, abs=1e-6)
    again = PolicyUpdater(model_dir, UpdateConfig(device="cpu"))
    again.load(updater.save(tmp_path / "full"))
    again.load_optimizer_state(updater.optimizer_state())
    ids = torch.tensor([[5, 6, 7]])
    with torch.no_grad():
        assert torch.allclose(again.model(input_ids=ids).logits, updater.model(input_ids=ids).logits, atol=1e-5)


@pytest.mark.parametrize(("lora", "share"), [(False, False), (True, False), (False, True), (True, True)])
def test_logprobs_come_from_the_response_positions_only_and_equal_a_full_forward_pass(
    model_dir: Path, lora: bool, share: bool
) -> None:
    """The update projects only the positions that predict a response token onto the vocabulary; the log-probs it
    gets there (at each call's temperature) are those of the model's whole forward pass, through a LoRA wrapper too,
    and when calls sharing a prompt are scored over one pass of it."""
    config = UpdateConfig(lr=1e-3, lora=LoraConfig() if lora else None, share_prefixes=share)
    updater = PolicyUpdater(model_dir, config)
    transitions = _transitions(updater)
    transitions[0].temperature = 0.7
    rows: list[int] = []
    head = updater.model.get_output_embeddings()
    hook = head.register_forward_hook(lambda _m, args, _out: rows.append(args[0].numel() // args[0].shape[-1]))
    batches = updater.micro_batches(transitions)
    assert any(b.prefix_ids is not None for b in batches) == share
    for shared in batches:
        rows.clear()
        ours = updater.logprobs(shared)
        assert rows == [int(shared.response_mask.sum())]
        batch, ours = _whole(shared, ours)
        hook.remove()
        with torch.no_grad():
            logits = updater.model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
        hook = head.register_forward_hook(lambda _m, args, _out: rows.append(args[0].numel() // args[0].shape[-1]))
        scaled = logits[:, :-1].float() / batch.temperatures.view(-1, 1, 1)
        full = torch.log_softmax(scaled, -1).gather(-1, batch.input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)
        mask = batch.response_mask[:, 1:] > 0
        assert torch.allclose(ours[:, 1:][mask], full[mask], atol=1e-5)
        assert torch.all(ours[:, 1:][~mask] == 0)
    hook.remove()


def _whole(batch: MicroBatch, logprobs: torch.Tensor) -> tuple[MicroBatch, torch.Tensor]:
    """A shared-prefix micro-batch as the full sequences it stands for, and its log-probs aligned with them."""
    if batch.prefix_ids is None:
        return batch, logprobs
    n, width = batch.input_ids.shape[0], batch.prefix_ids.shape[1]
    pad = torch.zeros((n, width))
    whole = replace(
        batch,
        input_ids=torch.cat([batch.prefix_ids.expand(n, -1), batch.input_ids], dim=1),
        attention_mask=torch.cat([torch.ones((n, width), dtype=torch.long), batch.attention_mask], dim=1),
        response_mask=torch.cat([pad, batch.response_mask], dim=1),
        prefix_ids=None,
    )
    return whole, torch.cat([pad, logprobs], dim=1)


def test_an_update_step_uses_every_core_and_gives_the_process_its_thread_count_back(model_dir: Path) -> None:
    """A local policy server keeps the process at half the cores while it decodes; the update, which runs between
    rounds, takes them all for its duration."""
    from agl.cpu import usable_cores

    updater = PolicyUpdater(model_dir, UpdateConfig(lr=1e-3))
    transitions = _transitions(updater)
    seen: list[int] = []
    head = updater.model.get_output_embeddings()
    hook = head.register_forward_hook(lambda *_: seen.append(torch.get_num_threads()))
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        updater.step(transitions)
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
        hook.remove()
    assert seen and set(seen) == {usable_cores()}


def test_negative_weight_zero_never_trains_a_call_with_a_negative_advantage(model_dir: Path) -> None:
    """Weight 0: the negative calls are left out of the passes (their terms are zero), the positive ones train exactly
    as in the full step (same normaliser), and a step of only negative calls changes no weight."""
    grpo = PolicyUpdater(model_dir, UpdateConfig(lr=1e-3, device="cpu", micro_batch_tokens=64))
    transitions = _transitions(grpo)
    positives = [t for t in transitions if t.advantage and t.advantage > 0]
    filtered_cfg = UpdateConfig(lr=1e-3, device="cpu", micro_batch_tokens=64, loss=LossConfig(negative_weight=0.0))
    filtered = PolicyUpdater(model_dir, filtered_cfg)
    before = {k: v.clone() for k, v in filtered.state_dict().items()}
    metrics = filtered.step([t for t in transitions if t not in positives])
    assert metrics["negative_skipped"] == 2 and metrics["micro_batches"] == 0
    assert all(torch.equal(before[k], v) for k, v in filtered.state_dict().items()), "no negative call trains"
    # the gradient of the filtered step is that of the positives alone, scaled by the full step's normaliser
    filtered.step(transitions)
    grads = {n: p.grad for n, p in filtered.model.named_parameters()}
    assert all(g is None for g in grads.values()), "gradients are cleared after the step"
    reference = PolicyUpdater(model_dir, UpdateConfig(lr=1e-3, device="cpu", micro_batch_tokens=64))
    reference.optimizer.zero_grad(set_to_none=True)
    batches = reference.micro_batches(transitions)
    normalizer = float(sum(b.response_tokens for b in batches))
    for batch in reference.micro_batches(positives):
        new = reference._scored(reference.model, batch)[1]
        loss, _ = policy_loss(new, batch.old_logprobs, batch.advantages, batch.response_mask, LossConfig(), normalizer)
        loss.backward()
    torch.nn.utils.clip_grad_norm_(reference.parameters, 1.0)
    reference.optimizer.step()
    for (name, mine), theirs in zip(filtered.state_dict().items(), reference.state_dict().values(), strict=True):
        assert torch.allclose(mine, theirs, atol=1e-6), name


@pytest.mark.parametrize("lora", [False, True])
def test_a_step_over_shared_prefixes_trains_the_same_weights_as_over_whole_sequences(
    model_dir: Path, lora: bool
) -> None:
    results = []
    for share in (False, True):
        config = UpdateConfig(lr=1e-3, lora=LoraConfig() if lora else None, share_prefixes=share)
        torch.manual_seed(0)  # the same LoRA initialisation
        updater = PolicyUpdater(model_dir, config)
        metrics = updater.step(_transitions(updater))
        results.append((metrics, updater.state_dict()))
    (whole, before), (shared, after) = results
    assert shared["tokens"] < whole["tokens"], "each prompt is read once"
    assert shared["loss"] == pytest.approx(whole["loss"], rel=1e-4, abs=1e-6)
    assert shared["kl_ref"] == pytest.approx(whole["kl_ref"], abs=1e-6)
    for name, value in before.items():
        assert torch.allclose(value, after[name], atol=1e-5), name


@pytest.mark.parametrize(("lora", "share"), [(False, False), (True, False), (False, True), (True, True)])
def test_gradient_checkpointing_recomputes_the_layers_and_trains_the_same_weights(
    model_dir: Path, lora: bool, share: bool
) -> None:
    """``gradient_checkpointing``: every decoder layer runs again in the backward pass (counted on its MLP), and the
    step's weights are those of the same step without it, over whole sequences and over shared prefixes (whose
    key/value cache the replayed layers read again)."""
    results = []
    for checkpointed in (False, True):
        config = UpdateConfig(
            lr=1e-3, lora=LoraConfig() if lora else None, gradient_checkpointing=checkpointed, share_prefixes=share
        )
        torch.manual_seed(0)  # the same LoRA initialisation
        updater = PolicyUpdater(model_dir, config)
        transitions = _transitions(updater)
        mlp = updater.model.get_decoder().layers[0].mlp
        with_grad: list[int] = []  # the layer's passes that build a graph: the step's, then the backward's replays
        plain_forward = mlp.forward  # wrapped on the instance: torch runs no module hooks while it replays

        def counted(*args: Any, seen: list[int] = with_grad, run: Any = plain_forward, **kwargs: Any) -> Any:
            seen.extend([1] if torch.is_grad_enabled() else [])
            return run(*args, **kwargs)

        mlp.forward = counted
        metrics = updater.step(transitions)
        mlp.forward = plain_forward
        passes = metrics["micro_batches"] * (2 if share else 1)  # a shared prefix: its pass, then the continuations'
        assert len(with_grad) == passes * (2 if checkpointed else 1)
        assert not updater.model.get_decoder().layers[0].training, "the layers go back to eval mode"
        results.append((metrics, updater.state_dict()))
    (plain, before), (checkpointed_run, after) = results
    assert checkpointed_run["loss"] == pytest.approx(plain["loss"], rel=1e-5, abs=1e-7)
    for name, value in before.items():
        assert torch.allclose(value, after[name], atol=1e-6), name


# --------------------------------------------------------------------------------------------------------- memory

#: One update step on two 2,048-token calls of a 4-layer model with the SmolLM2 tokenizer's 49k vocabulary, in a fresh
#: interpreter, printing how far the step raised the resident set (``agl.cpu.ResidentPeak``) in MiB; argv: whether
#: to checkpoint, whether to score every position (the output layer over all 2 x 2,048 positions, as before
#: ``agl.trainers.logits``), whether glibc's mmap threshold is held (``agl.cpu.pin_mmap_threshold``), the model.
_STEP_MEMORY = """
import json, sys, torch
import agl.cpu
import agl.trainers.logits as logits
from agl.core.types import Transition
from agl.cpu import ResidentPeak
from agl.trainers.config import LoraConfig
from agl.trainers.rl.update import PolicyUpdater, UpdateConfig

checkpointed, whole, pinned = (flag == "1" for flag in sys.argv[1:4])
if whole:
    logits.plain_head = lambda model: False
if not pinned:
    agl.cpu.pin_mmap_threshold = lambda: False
torch.manual_seed(0)
torch.set_num_threads(1)
config = UpdateConfig(lr=1e-3, lora=LoraConfig(), gradient_checkpointing=checkpointed, micro_batch_tokens=4096)
updater = PolicyUpdater(sys.argv[4], config)
calls = [
    Transition(span_id=f"s{i}", agent="a", step=0, prompt_ids=[1000 + (7 * j + i) % 30000 for j in range(2000)],
               response_ids=list(range(2000 + i, 2048 + i)), response_logprobs=[-1.0] * 48, advantage=1.0 - 2 * i)
    for i in range(2)
]
updater.step(calls[:1])  # warm-up: lazy allocations, optimizer state
with ResidentPeak() as memory:
    updater.step(calls)
print(json.dumps({"growth_mib": memory.growth / 2**20, "exact": memory.exact}))
"""


@pytest.fixture(scope="module")
def wider_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from agl.serving.models import make_tiny_model

    return make_tiny_model(
        tmp_path_factory.mktemp("wider"), seed=0, hidden_size=256, intermediate_size=1024, num_hidden_layers=4
    )


def memory_probe(script: str, *args: str) -> dict[str, Any]:
    """Run a memory-measuring ``script`` in a fresh interpreter and return the JSON of its last output line, which
    must come from an exact ``ResidentPeak`` (``exact``)."""
    done = subprocess.run(
        [sys.executable, "-c", script, *args], capture_output=True, text=True, timeout=600, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["exact"], "Linux resets the high-water mark (/proc/self/clear_refs)"
    return result


def _step_growth_mib(model: Path, checkpointed: bool, whole: bool, pinned: bool = True) -> float:
    flags = (str(int(flag)) for flag in (checkpointed, whole, pinned))
    return float(memory_probe(_STEP_MEMORY, *flags, str(model))["growth_mib"])


@pytest.mark.slow
def test_an_update_step_on_long_calls_stays_under_its_memory_bound(wider_model_dir: Path) -> None:
    """The update step's own memory on a fixed workload (two 2,048-token calls with 48 response tokens each, LoRA on
    a 4-layer model with hidden size 256 and a 49k vocabulary) stays under stated bounds: 640 MiB as it is (measured
    472 MiB in two runs on a 2-core AMD EPYC with AVX-512), 320 MiB with gradient checkpointing (154–156 MiB: one
    layer's activations and their gradients instead of four layers'). Two regressions are measured too, so the bounds
    are shown to tell them apart: the checkpointed step with glibc's mmap threshold left to rise (496–674 MiB: freed
    activations stay in its heap), and the output layer over every position, as before scoring selected positions
    only (1,929–1,930 MiB)."""
    plain = _step_growth_mib(wider_model_dir, checkpointed=False, whole=False)
    checkpointed = _step_growth_mib(wider_model_dir, checkpointed=True, whole=False)
    unpinned = _step_growth_mib(wider_model_dir, checkpointed=True, whole=False, pinned=False)
    whole = _step_growth_mib(wider_model_dir, checkpointed=False, whole=True)
    print(
        f"step memory growth: plain {plain:.0f} MiB, checkpointed {checkpointed:.0f} MiB, checkpointed with the "
        f"threshold rising {unpinned:.0f} MiB, every position {whole:.0f} MiB"
    )
    assert plain < 640 and checkpointed < 320
    assert unpinned > 400 and whole > 1536


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_the_mmap_threshold_is_pinned_where_glibc_runs_the_heap() -> None:
    """On Linux agl's torch phases do hold glibc's mmap threshold: ``mallopt`` is found and accepts it."""
    from agl.cpu import pin_mmap_threshold

    assert pin_mmap_threshold() is True


def test_resident_peak_is_the_blocks_own_not_the_process_earlier_one() -> None:
    """``ResidentPeak`` measures from the block's start: a larger allocation freed before it does not count, one made
    inside it does."""
    from agl.cpu import ResidentPeak

    earlier = b"x" * (400 * 2**20)
    del earlier
    with ResidentPeak() as memory:
        inside = b"y" * (100 * 2**20)
        del inside
    assert memory.exact
    assert 95 * 2**20 <= memory.growth < 300 * 2**20, memory.growth / 2**20
