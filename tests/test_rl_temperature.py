"""Behaviour and policy log-probs come from the distribution the tokens were sampled from, at any temperature.

A real local policy server samples from a tiny model at temperatures 0.7, 1.3 and 0 (greedy); its logprobs are compared
with an independent forward pass, and the real update code (``PolicyUpdater``) is checked to see an importance ratio
of 1 on its first step, with nothing clipped.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

from agl.core.types import Transition
from agl.trainers.rl.update import PolicyUpdater, UpdateConfig

TEMPERATURES = (0.7, 1.3, 0.0)
MAX_TOKENS = 8


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from agl.serving.models import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("tiny"), seed=0)


@pytest.fixture(scope="module")
def sampled(model_dir: Path) -> dict[float, Transition]:
    """One call per temperature, served by the policy server, as the transition the trainer would build from it."""
    from agl.serving.policy_server import PolicyServer

    out: dict[float, Transition] = {}
    # fp32, as LightningRL serves: the comparisons below are exact (a CPU with fast bf16 would serve in bf16)
    with PolicyServer(model_dir, seed=0, dtype="float32") as server, httpx.Client(timeout=60) as client:
        for i, temperature in enumerate(TEMPERATURES):
            body: dict[str, Any] = {
                "model": server.model_name,
                "messages": [{"role": "user", "content": f"Tell me something, number {i}."}],
                "temperature": temperature,
                "max_tokens": MAX_TOKENS,
                "logprobs": True,
                "return_token_ids": True,
            }
            reply = client.post(f"{server.base_url}/chat/completions", json=body)
            reply.raise_for_status()
            data = reply.json()
            choice = data["choices"][0]
            out[temperature] = Transition(
                span_id=f"call-{i}",
                agent="a",
                step=0,
                prompt_ids=data["prompt_token_ids"],
                response_ids=choice["token_ids"],
                response_logprobs=[e["logprob"] for e in choice["logprobs"]["content"]],
                temperature=temperature,
                advantage=1.0,
            )
    assert all(len(t.response_ids) == MAX_TOKENS for t in out.values())  # a random tiny model rarely says EOS
    return out


def _logprobs_at(model_dir: Path, transition: Transition, temperature: float) -> torch.Tensor:
    """An independent forward pass: ``log_softmax(logits / temperature)`` of each response token."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    ids = torch.tensor([transition.prompt_ids + transition.response_ids])
    start = len(transition.prompt_ids)
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, start - 1 : -1]
    scores = torch.log_softmax(logits / temperature, dim=-1)
    return scores.gather(-1, torch.tensor(transition.response_ids).unsqueeze(-1)).squeeze(-1)


def _log_ratios(updater: PolicyUpdater, transitions: list[Transition]) -> torch.Tensor:
    """``log pi_new - log pi_behaviour`` over every response token, as the update step computes it."""
    parts = []
    for batch in updater.micro_batches(transitions):
        new = updater.logprobs(batch).cpu()
        parts.append((new - batch.old_logprobs)[batch.response_mask > 0])
    return torch.cat(parts)


def test_server_logprobs_are_those_of_the_sampling_distribution(
    model_dir: Path, sampled: dict[float, Transition]
) -> None:
    for temperature, transition in sampled.items():
        reported = torch.tensor(transition.response_logprobs)
        scored_at = temperature if temperature > 0 else 1.0  # greedy calls report temperature-1 logprobs
        expected = _logprobs_at(model_dir, transition, scored_at)
        assert torch.allclose(reported, expected, atol=1e-4), (temperature, reported, expected)
        if temperature not in (0.0, 1.0):
            # the assertion tells the two apart: the temperature-1 distribution is another one
            assert (reported - _logprobs_at(model_dir, transition, 1.0)).abs().max() > 1e-2


def test_first_update_step_has_importance_ratio_one_at_any_sampling_temperature(
    model_dir: Path, sampled: dict[float, Transition]
) -> None:
    transitions = list(sampled.values())
    updater = PolicyUpdater(model_dir, UpdateConfig(lr=1e-3, device="cpu"))
    log_ratio = _log_ratios(updater, transitions)
    assert log_ratio.numel() == MAX_TOKENS * len(TEMPERATURES)
    assert log_ratio.abs().max().item() < 1e-4
    metrics = updater.step(transitions)
    assert metrics["clip_fraction"] == 0.0
    assert metrics["approx_kl"] == pytest.approx(0.0, abs=1e-8)
    assert metrics["kl_ref"] == pytest.approx(0.0, abs=1e-6)  # the policy is still the start policy
    assert metrics["greedy"] == 1.0 and metrics["entropy"] > 0.0
    assert _log_ratios(updater, transitions).abs().max().item() > 1e-3  # the step moved the policy


def test_a_call_without_recorded_temperature_is_scored_at_the_configured_one(
    model_dir: Path, sampled: dict[float, Transition]
) -> None:
    unrecorded = sampled[0.7].model_copy(update={"temperature": None})
    right = PolicyUpdater(model_dir, UpdateConfig(device="cpu", measure_kl_ref=False), default_temperature=0.7)
    assert _log_ratios(right, [unrecorded]).abs().max().item() < 1e-4
    wrong = PolicyUpdater(model_dir, UpdateConfig(device="cpu", measure_kl_ref=False), default_temperature=1.0)
    assert _log_ratios(wrong, [unrecorded]).abs().max().item() > 1e-2  # scored at 1: ratio is not 1
    assert wrong.reference is None and math.isnan(wrong.step([unrecorded])["kl_ref"])  # not measured when asked not to
