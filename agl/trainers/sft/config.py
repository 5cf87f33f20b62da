"""``SFTConfig``: every setting of supervised fine-tuning on selected rollouts, documented. Pure data, no torch."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from agl.trainers.config import SERVING_FIELDS, AutoLora, LoraConfig, ServingConfig, moved_fields, resolve_lora
from agl.trainers.rl.policies import validate_policies

#: Fields that moved into the nested configs, accepted under their old names until agl 0.3 (``moved_fields``).
MOVED_SFT_FIELDS = {
    **{name: f"serving.{name}" for name in SERVING_FIELDS},
    **{f"lora_{name}": f"lora.{name}" for name in ("r", "alpha", "dropout", "target_modules")},
}


@moved_fields(MOVED_SFT_FIELDS)
@dataclass
class SFTConfig:
    """Settings of ``SFT`` and ``sft_on_trajectories``. Only ``model_dir`` is required.

    Policy and serving (``SFT.fit`` only):
        model_dir: ``save_pretrained`` folder of the model to fine-tune (e.g. ``agl.serving.prepare_smollm2()``); it is
            also what the local ``PolicyServer`` serves before the first update.
        serving: the published resources' names, the local server's model name and batch size, and the default
            sampling (``agl.trainers.config.ServingConfig``). Sampling at temperature ~1 (the default) gives the k
            samples per task the diversity rejection sampling needs.
        policies: one policy per agent, as in ``LightningRLConfig``: ``{"writer": "lora", "rewriter": "lora"}``
            gives each listed agent a LoRA adapter of its own (``lora``, default ``LoraConfig()``), served
            as ``f"{model_name}/{agent}"`` with the agent's calls routed there, and fine-tuned only on the selected
            calls its adapter served. Calls served by the base model are counted (``base_transitions``), not
            trained on. Needs a policy server that serves adapters. Default empty: one policy.

    Selection (which rollouts become training data):
        successful_only: drop rollouts that did not finish (the agent raised, timed out, was cancelled) or reported
            no final reward. Default True.
        min_reward: drop rollouts whose final reward is below it; None keeps any reward. Default 1.0 (solved only):
            with a graded reward, lower it to learn from partial successes too.
        top_k_per_task: keep at most this many rollouts per task, highest reward first (None = all). Caps how much a
            task that is solved every time weighs against rarely solved ones.

    Rounds (``SFT.fit``; one round = rejection-sampling fine-tuning):
        rft_rounds: rounds of sample → select → train → serve. Default 1; more rounds sample from the improved model.
        samples_per_task: rollouts per training task per round (k). Default 4.
        retrain_from_start: each round fine-tunes ``model_dir`` afresh on the samples every round so far selected
            (plus ``extra_samples``), sampling still from the newest weights: ReST-EM (Singh et al., 2023), which
            keeps rounds from compounding their drift. Default False: each round continues from the last round's
            weights on its own selection (iterated expert iteration). Single policy only.
        val_every: validate on ``val_tasks`` before training and every k rounds (and after the last). 0 = never.
            Default 1.

    Training (TRL ``SFTTrainer`` on exact token ids; loss on response tokens only):
        lr: learning rate. Default 1e-5 for full weights of a ~100M model; ~1e-4 for LoRA; a tiny test model takes 1e-3.
        lr_scheduler: a transformers scheduler name. Default ``"constant"`` (rounds are short; a decay would restart
            each round).
        epochs: passes over the selected samples per round. Default 1.
        max_steps: stop each round after this many optimizer steps, cycling the samples as often as that takes
            (overrides ``epochs``); None = ``epochs`` passes. A supervised control matched to an RL run sets it to
            the run's optimizer steps.
        sequences_per_step: at least this many samples per optimizer step, by gradient accumulation over the
            ``batch_tokens`` passes; None = one pass per step. With ``max_steps``, it matches the data an RL run's
            steps saw.
        batch_tokens: padded tokens per optimizer step (sequences per step = batch_tokens // longest sample, at
            least 1). Default 4096. Lower it when memory runs out.
        gradient_checkpointing: recompute activations in the backward pass to save memory, at the cost of a second
            forward pass. Default False (TRL's default is True, a GPU memory choice: on a CPU with a small model the
            memory is there and the recomputation is a third more compute per step).
        max_length: longest prompt + response trained on (None = no limit). A longer sample loses the start of its
            prompt, never its response unless the response alone does not fit.
        lora: train this LoRA adapter (peft; ``LoraConfig``: rank, scale, dropout, wrapped modules) instead of all
            weights. The saved folder is then an adapter folder, which ``PolicyServer.load_weights`` merges onto
            ``model_dir``. None: full weights. Default ``AutoLora()``: a LoRA adapter for a model over 200M
            parameters trained on a CPU, full weights otherwise (``agl.trainers.config.resolve_lora``).
        device: ``"auto"`` (CUDA when available), ``"cpu"`` or ``"cuda"``.
        time_budget_s: stop training before an optimizer step that would end past this many seconds (judged from the
            mean step time so far); None = run every step. With the default constant learning rate, stopping early
            is the same as training on fewer samples. Progress (step, loss, tokens/s, time left) is printed either
            way.
        output_dir: where weights go: ``round-NNNN`` folders in ``SFT.fit`` (default ``run_dir/sft``); the weights
            themselves in ``sft_on_trajectories`` (default ``runs/sft``).
        seed: seeds data order, initialisation of LoRA weights and the local server's sampling. Default 0.
    """

    model_dir: str | Path
    serving: ServingConfig = field(default_factory=ServingConfig)
    policies: dict[str, str] = field(default_factory=dict)
    successful_only: bool = True
    min_reward: float | None = 1.0
    top_k_per_task: int | None = None
    rft_rounds: int = 1
    samples_per_task: int = 4
    retrain_from_start: bool = False
    val_every: int = 1
    lr: float = 1e-5
    lr_scheduler: str = "constant"
    epochs: int = 1
    max_steps: int | None = None
    sequences_per_step: int | None = None
    batch_tokens: int = 4096
    gradient_checkpointing: bool = False
    max_length: int | None = None
    lora: LoraConfig | None = field(default_factory=AutoLora)
    device: str = "auto"
    output_dir: str | Path | None = None
    time_budget_s: float | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("rft_rounds", "samples_per_task", "epochs", "batch_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}: must be >= 1, got {getattr(self, name)}")
        for name in ("max_steps", "sequences_per_step"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ValueError(f"{name}: must be >= 1 or None, got {getattr(self, name)}")
        if self.top_k_per_task is not None and self.top_k_per_task < 1:
            raise ValueError(f"top_k_per_task: must be >= 1 or None, got {self.top_k_per_task}")
        if self.max_length is not None and self.max_length < 2:
            raise ValueError(f"max_length: must be >= 2 or None, got {self.max_length}")
        if self.val_every < 0:
            raise ValueError(f"val_every: must be >= 0, got {self.val_every}")
        if self.time_budget_s is not None and self.time_budget_s <= 0:
            raise ValueError(f"time_budget_s: must be > 0 or None, got {self.time_budget_s}")
        if self.lr <= 0:
            raise ValueError(f"lr: must be > 0, got {self.lr}")
        validate_policies(self.policies)
        if self.retrain_from_start and self.policies:
            raise ValueError("retrain_from_start: only a single policy retrains from the start (policies is set)")
        # LoRA by default for a large model on a CPU (``AutoLora``), decided here, where the model is known
        self.lora = resolve_lora(self.lora, self.model_dir, self.device)
