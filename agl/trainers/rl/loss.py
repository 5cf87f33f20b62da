"""The policy loss: a clipped importance-weighted objective against recorded behaviour log-probs, plus optional KL.

Per response token ``j`` of a sequence with advantage ``A``::

    ratio_j = exp(logp_new_j - logp_behaviour_j)
    loss_j  = -w(A) * min(ratio_j * A, clip(ratio_j, 1 - clip_low, 1 + clip_high) * A) + kl_beta * k3_j
    w(A)    = negative_weight if A < 0 else 1
    k3_j    = exp(logp_ref_j - logp_new_j) - (logp_ref_j - logp_new_j) - 1        (KL to the frozen reference)

Every log-prob is taken at the sequence's sampling temperature, ``log_softmax(logits / T)`` (T = 1 for a greedy call),
the distribution its tokens were drawn from and the one the serving backend's behaviour log-probs describe; so the
ratio of the first step after sampling is 1 (up to float error), and the clip fraction 0.

Aggregation over a whole update step (possibly many micro-batches): ``token_mean`` averages ``loss_j`` over every
response token of the step; ``sequence_mean`` averages each sequence's token mean over the sequences. Functions return
*sums divided by the step-wide normaliser*, so summing micro-batch losses (gradient accumulation) gives the step mean.
The KL to the reference is measured whenever reference log-probs are given, and enters the loss only with
``kl_beta > 0``. Pure tensor functions, no model.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from agl.trainers.rl.update_config import LossConfig


@dataclass
class LossSums:
    """Sums over the response tokens of one micro-batch, for step-wide statistics (``entropy`` is filled by the
    caller from the scores, see ``entropy_sum``)."""

    tokens: float = 0.0
    clipped: float = 0.0
    approx_kl: float = 0.0
    kl_ref: float = 0.0
    entropy: float = 0.0

    def add(self, other: LossSums) -> None:
        self.tokens += other.tokens
        self.clipped += other.clipped
        self.approx_kl += other.approx_kl
        self.kl_ref += other.kl_ref
        self.entropy += other.entropy


def response_scores(
    logits: torch.Tensor, predicts: torch.Tensor, temperatures: torch.Tensor | None = None
) -> torch.Tensor:
    """The scores ``[N, V]`` (fp32) the loss reads: ``logits`` of the ``N`` positions that predict a response token
    (``predicts``: ``[B, L-1]``, true at position ``p`` when token ``p + 1`` is a response token; ``logits`` are those
    positions' rows, in row-major order), each divided by its sequence's temperature (``temperatures``: ``[B]``;
    None = 1)."""
    scores = logits.float()
    if temperatures is not None:
        scale = temperatures.to(scores.device, scores.dtype).view(-1, 1).expand(predicts.shape)[predicts]
        scores = scores / scale.unsqueeze(-1)
    return scores


def selective_log_softmax(scores: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """``log_softmax(scores)[i, tokens[i]]`` per row, by TRL's ``selective_log_softmax`` (it gathers the chosen token
    without materialising a full log-softmax copy per row when it can)."""
    from trl.trainer.utils import selective_log_softmax as trl_selective

    return trl_selective(scores, tokens)


def response_logprobs(scores: torch.Tensor, input_ids: torch.Tensor, predicts: torch.Tensor) -> torch.Tensor:
    """Log-prob of every response token given the ones before it, ``[B, L]`` aligned with ``input_ids`` (0 at every
    other position), from the ``response_scores`` of the positions ``predicts`` marks.

    Uses TRL's ``selective_log_softmax`` (gathers the chosen token without materialising a full log-softmax copy
    per row when it can).
    """
    chosen = selective_log_softmax(scores, input_ids[:, 1:][predicts])
    shifted = torch.zeros(predicts.shape, dtype=chosen.dtype, device=chosen.device).masked_scatter(predicts, chosen)
    return torch.nn.functional.pad(shifted, (1, 0), value=0.0)


def entropy_sum(scores: torch.Tensor) -> float:
    """Sum over the response tokens of the entropy (nats) of the distribution each was sampled from (its
    ``response_scores`` row), without gradient."""
    with torch.no_grad():
        logp = torch.log_softmax(scores, dim=-1)
        return float(-(logp.exp() * logp).sum().item())


def k3_kl(new_logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimator of KL(new ‖ ref) from samples of ``new``: ``exp(d) - d - 1`` with ``d = ref - new``."""
    d = ref_logprobs - new_logprobs
    return torch.exp(d) - d - 1.0


def weighted_advantages(advantages: torch.Tensor, negative_weight: float) -> torch.Tensor:
    """``advantages`` with every negative one scaled by ``negative_weight`` (``LossConfig.negative_weight``); the
    very tensor when the weight is 1, so today's GRPO loss is reproduced bit for bit. Scaling the advantage scales the
    clipped term too: ``min(r * wA, clip(r) * wA) = w * min(r * A, clip(r) * A)`` for ``w >= 0``."""
    if negative_weight == 1.0:
        return advantages
    return torch.where(advantages < 0, advantages * negative_weight, advantages)


def policy_loss(
    new_logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    config: LossConfig,
    normalizer: float,
    ref_logprobs: torch.Tensor | None = None,
) -> tuple[torch.Tensor, LossSums]:
    """The micro-batch's share of the step loss (see module docstring) and its statistic sums.

    ``normalizer`` is the step's total response tokens (``token_mean``) or sequences (``sequence_mean``).
    ``new/old/ref_logprobs`` and ``response_mask`` are ``[B, L]`` aligned with the input ids; ``advantages`` is ``[B]``.
    """
    if normalizer <= 0:
        raise ValueError(f"normalizer: must be > 0, got {normalizer}")
    mask = response_mask.to(new_logprobs.dtype)
    log_ratio = (new_logprobs - old_logprobs) * mask
    ratio = torch.exp(log_ratio)
    adv = weighted_advantages(advantages, config.negative_weight).to(new_logprobs.dtype).unsqueeze(-1)
    unclipped = ratio * adv
    clipped = torch.clamp(ratio, 1.0 - config.clip_low, 1.0 + config.clip_high) * adv
    per_token = -torch.minimum(unclipped, clipped)
    kl_sum = 0.0
    if ref_logprobs is not None:
        kl = k3_kl(new_logprobs, ref_logprobs) * mask
        if config.kl_beta > 0.0:
            per_token = per_token + config.kl_beta * kl
        kl_sum = float(kl.sum().item())
    per_token = per_token * mask
    if config.aggregation == "token_mean":
        loss = per_token.sum() / normalizer
    else:
        lengths = mask.sum(dim=-1).clamp(min=1.0)
        loss = (per_token.sum(dim=-1) / lengths).sum() / normalizer
    with torch.no_grad():
        was_clipped = ((clipped < unclipped) & (mask > 0)).to(mask.dtype)
        approx_kl = ((ratio - 1.0) - log_ratio) * mask
        sums = LossSums(
            tokens=float(mask.sum().item()),
            clipped=float(was_clipped.sum().item()),
            approx_kl=float(approx_kl.sum().item()),
            kl_ref=kl_sum,
        )
    return loss, sums
