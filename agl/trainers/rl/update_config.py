"""Settings of the policy update (``UpdateConfig``) and of its loss (``LossConfig``). Pure data, no torch, so a
configuration can be built and validated without loading the training stack."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from agl.trainers.config import AutoLora, LoraConfig

Aggregation = Literal["token_mean", "sequence_mean"]


@dataclass(frozen=True)
class LossConfig:
    """Attributes:
    clip_low / clip_high: the ratio is clipped to ``[1 - clip_low, 1 + clip_high]``. Default 0.2 / 0.2 (PPO).
        Raise ``clip_high`` (e.g. 0.28, DAPO) to let rare good tokens grow faster.
    aggregation: ``token_mean`` (default; long responses weigh more, as in DAPO/TRL) or ``sequence_mean`` (every
        response counts equally, as in the original GRPO).
    kl_beta: weight of the k3 KL to the frozen reference model. Default 0 (off, no reference model is kept);
        set e.g. 0.01-0.05 to keep the policy close to where it started.
    negative_weight: weight of the policy-gradient term of calls with a negative advantage, in [0, 1]. Default 1
        (GRPO as published: worse-than-baseline calls are pushed down as hard as better ones are pulled up). 0 is
        online reward-filtered behaviour cloning (RAFT, expert iteration): only better-than-baseline calls train, so
        a failed JOIN never teaches the policy to stop joining; values between soften the push. The step's
        normaliser is unchanged (a weight of 0 drops those calls' terms, not their share of the mean), and calls
        whose terms are all zero (weight 0, no KL penalty) are not computed at all.
    """

    clip_low: float = 0.2
    clip_high: float = 0.2
    aggregation: Aggregation = "token_mean"
    kl_beta: float = 0.0
    negative_weight: float = 1.0

    def __post_init__(self) -> None:
        if not 0.0 <= self.clip_low < 1.0:
            raise ValueError(f"clip_low: must be in [0, 1), got {self.clip_low}")
        if self.clip_high < 0.0:
            raise ValueError(f"clip_high: must be >= 0, got {self.clip_high}")
        if self.aggregation not in ("token_mean", "sequence_mean"):
            raise ValueError(f"aggregation: expected 'token_mean' or 'sequence_mean', got {self.aggregation!r}")
        if self.kl_beta < 0.0:
            raise ValueError(f"kl_beta: must be >= 0, got {self.kl_beta}")
        if not 0.0 <= self.negative_weight <= 1.0:
            raise ValueError(f"negative_weight: must be in [0, 1], got {self.negative_weight}")


@dataclass
class UpdateConfig:
    """How the policy is trained.

    Attributes:
        lr: AdamW learning rate. Default 1e-5 (full fine-tuning of a small model); LoRA usually wants ~1e-4, a tiny
            test model tolerates 1e-3 or more.
        weight_decay: AdamW weight decay. Default 0.0.
        max_grad_norm: clip the global gradient norm to this (None = no clipping). Default 1.0.
        loss: clip range, aggregation and KL weight (see ``LossConfig``).
        micro_batch_tokens: padded tokens (sequences × longest) per forward/backward. Default 4096. Lower it when
            memory runs out; raise it on a GPU for speed. Never changes the result, only how it is computed.
        max_length: longest prompt + response trained on (None = no limit; prompts are left-truncated to fit).
        lora: train this LoRA adapter (peft; ``LoraConfig``: rank, scale, dropout, wrapped modules) instead of all
            weights; None: full weights. Default ``AutoLora()``: a LoRA adapter for a model over 200M parameters
            trained on a CPU, full weights otherwise (``agl.trainers.config.resolve_lora``).
        device: ``"auto"`` (CUDA when available, else CPU), ``"cpu"``, ``"cuda"``, ``"cuda:1"``...
        mixed_precision: ``"no"`` (fp32, default) or ``"bf16"`` (autocast on CUDA; the weights and the optimizer stay
            fp32). Use ``"bf16"`` on a GPU for speed and memory.
        gradient_checkpointing: recompute each decoder layer's activations in the backward pass instead of keeping
            them: a pass holds one layer's activations rather than every layer's, which is what long agent prompts
            fill memory with. Costs a second forward pass. Works with ``share_prefixes``. Default False.
        share_prefixes: score calls whose prompts share a prefix (a GRPO group's calls share the whole prompt; an
            agent's calls share its system prompt and context) over one pass of that prefix and its key/value cache
            (``agl.trainers.rl.batching``). Same log-probs and gradients up to float error, a fraction of the compute
            when prompts are long and responses short: on Qwen2.5-Coder-0.5B with LoRA, one ~900-token prompt with
            four 40-token responses takes ~6x less time per step. The shared prefix is not counted against
            ``micro_batch_tokens``. Default True; models whose logits are more than the output layer over the
            decoder are always scored whole.
        strategy: ``"none"`` (default): the update runs in this process. ``"ddp"``: data parallel over
            torch.distributed, the script started by ``torchrun --nproc-per-node N`` (every rank runs it):
            rank 0 runs the loop and splits each step's calls into token-balanced shards, every rank scores its shard
            and the gradients are summed (gloo on a CPU, NCCL on GPUs) before the same AdamW step on every rank
            (``agl.trainers.rl.distributed``). Same result as one process up to float summation order.
        measure_kl_ref: measure ``kl_ref`` (the KL of the policy to the start weights) every step even when
            ``loss.kl_beta`` is 0. Costs one extra forward pass per micro-batch without gradient and, for full
            weights, a frozen copy of the start model in memory (LoRA disables its adapter instead). Default True.
    """

    lr: float = 1e-5
    weight_decay: float = 0.0
    max_grad_norm: float | None = 1.0
    loss: LossConfig = field(default_factory=LossConfig)
    micro_batch_tokens: int = 4096
    max_length: int | None = None
    lora: LoraConfig | None = field(default_factory=AutoLora)
    device: str = "auto"
    mixed_precision: Literal["no", "bf16"] = "no"
    gradient_checkpointing: bool = False
    share_prefixes: bool = True
    strategy: Literal["none", "ddp"] = "none"
    measure_kl_ref: bool = True

    def __post_init__(self) -> None:
        if self.lr <= 0:
            raise ValueError(f"lr: must be > 0, got {self.lr}")
        if self.micro_batch_tokens < 1:
            raise ValueError(f"micro_batch_tokens: must be >= 1, got {self.micro_batch_tokens}")
        if self.strategy not in ("none", "ddp"):
            raise ValueError(f"strategy: expected 'none' or 'ddp', got {self.strategy!r}")
        if self.mixed_precision not in ("no", "bf16"):
            raise ValueError(f"mixed_precision: expected 'no' or 'bf16', got {self.mixed_precision!r}")
