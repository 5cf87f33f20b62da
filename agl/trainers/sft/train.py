"""Training on SFT samples with TRL's ``SFTTrainer``, and ``sft_on_trajectories`` for use outside a Trainer run.

TRL (>= 1.x) takes pre-tokenized datasets as they are: an ``input_ids`` column plus ``completion_mask`` (with
``completion_only_loss=True``) becomes ``labels`` = the ids on response tokens and -100 elsewhere, with no
re-tokenization, no added EOS and (with ``max_length=None``) no truncation: truncation is done beforehand by
``to_sft_sample``, which keeps the response. So TRL's trainer loop, LoRA wrapping (peft), device placement
(accelerate) and logging are reused unchanged. Single process; one caller at a time.
"""

from __future__ import annotations

import logging
import shutil
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from agl.core.types import Trajectory
from agl.cpu import all_cores
from agl.trainers.config import LoraConfig, on_accelerator
from agl.trainers.sft.config import SFTConfig
from agl.trainers.sft.data import SFTSample, build_samples, select_trajectories

if TYPE_CHECKING:
    from trl import SFTTrainer

log = logging.getLogger("agl.sft")


@dataclass
class TrainResult:
    """Where the weights were saved and what training measured (``loss_first``/``loss_last``: first/last step)."""

    path: Path
    metrics: dict[str, Any]


class _Progress:
    """Prints each optimizer step (loss, tokens/s, time left) at most every ``every_s`` seconds, and stops training
    before a step that would end past ``budget_s`` (mean step time so far). Built as a ``TrainerCallback`` subclass
    by ``_progress_callback`` so transformers is imported only when training."""

    def __init__(self, budget_s: float | None, tokens: int, every_s: float = 10.0) -> None:
        self.budget_s, self.tokens, self.every_s = budget_s, tokens, every_s
        self.started = self.last_print = 0.0
        self.stopped_early = False
        self.seconds_per_step = float("nan")

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.started = time.perf_counter()

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any) -> None:
        step, total = state.global_step, max(1, state.max_steps)
        if not logs or "loss" not in logs or step == 0:
            return
        elapsed = time.perf_counter() - self.started
        self.seconds_per_step = elapsed / step
        left = self.seconds_per_step * (total - step)
        if self.budget_s is not None:
            left = min(left, max(0.0, self.budget_s - elapsed))
        now = time.perf_counter()
        if step == 1 or step == total or now - self.last_print >= self.every_s:
            self.last_print = now
            print(
                f"[agl] sft step {step}/{total}: loss {logs['loss']:.4f}, "
                f"{self.tokens * step / total / elapsed:,.0f} tokens/s, ~{left / 60:.1f} min left",
                file=sys.stderr,
                flush=True,
            )

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        step = state.global_step
        if self.budget_s is None or step == 0 or step >= state.max_steps:
            return
        elapsed = time.perf_counter() - self.started
        if elapsed + elapsed / step > self.budget_s:
            self.stopped_early = True
            control.should_training_stop = True
            print(
                f"[agl] sft: time budget of {self.budget_s:.0f}s reached after step {step}/{state.max_steps}",
                file=sys.stderr,
                flush=True,
            )


def _progress_callback(budget_s: float | None, tokens: int) -> _Progress:
    from transformers import TrainerCallback

    class Progress(_Progress, TrainerCallback):
        pass

    return Progress(budget_s, tokens)


def _response_loss_trainer() -> type[Any]:
    """TRL's ``SFTTrainer`` whose loss projects only the positions that predict a response token onto the
    vocabulary (``agl.trainers.logits``): the same loss, without TRL's log-prob kernel over every prompt position
    (measured on the SQL demo's writer demonstrations, ~400 prompt and ~30 response tokens each: most of a step with
    a small model). Models whose logits are more than the output layer over the decoder take TRL's own loss."""
    import torch
    from trl import SFTTrainer

    from agl.trainers.logits import selected_logits

    class ResponseLossTrainer(SFTTrainer):
        def compute_loss(
            self, model: Any, inputs: dict[str, Any], return_outputs: bool = False, num_items_in_batch: Any = None
        ) -> Any:
            labels = inputs.get("labels")
            if labels is None or return_outputs or "position_ids" in inputs:
                return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
            targets = labels[:, 1:]
            predicts = torch.nn.functional.pad(targets != -100, (0, 1), value=False)
            logits = selected_logits(model, inputs["input_ids"], inputs.get("attention_mask"), predicts)
            if logits is None:
                return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
            total = torch.nn.functional.cross_entropy(logits.float(), targets[targets != -100], reduction="sum")
            count = (targets != -100).sum() if num_items_in_batch is None else num_items_in_batch
            return total / torch.as_tensor(count, device=total.device).clamp(min=1)

    return ResponseLossTrainer


def is_adapter(path: str | Path) -> bool:
    """Whether ``path`` is a peft adapter folder (rather than a full ``save_pretrained`` model)."""
    return (Path(path) / "adapter_config.json").is_file()


def merge_adapter(adapter_dir: str | Path, output_dir: str | Path) -> Path:
    """Save the LoRA adapter in ``adapter_dir`` merged onto its base model as a full ``save_pretrained`` folder (with
    the tokenizer) in ``output_dir``: a starting point that a later run trains and serves like any model (e.g. the
    SQL demo's LightningRL after a LoRA warm start). Holds the base and the merged weights once each while it runs."""
    import torch
    from peft import AutoPeftModelForCausalLM
    from transformers import AutoTokenizer

    merged = AutoPeftModelForCausalLM.from_pretrained(str(adapter_dir), dtype=torch.float32).merge_and_unload()
    out = Path(output_dir)
    merged.save_pretrained(str(out))
    AutoTokenizer.from_pretrained(str(adapter_dir)).save_pretrained(str(out))
    return out


def make_sft_trainer(
    samples: Sequence[SFTSample], config: SFTConfig, output_dir: str | Path, init_from: str | Path | None = None
) -> SFTTrainer:
    """A ready TRL ``SFTTrainer`` over ``samples`` (exposed so its prepared dataset can be inspected).

    The model starts from ``init_from`` (a full model folder, or with ``lora`` an adapter folder to keep training)
    or else from ``config.model_dir``.
    """
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, PrinterCallback
    from trl import SFTConfig as TRLConfig

    from agl.precision import fast_dtype

    if not samples:
        raise ValueError("no SFT samples: the selection rules kept no transition with token ids")
    if config.lora is not None and init_from is not None and not is_adapter(init_from):
        raise ValueError(f"init_from: {init_from} is not a LoRA adapter folder, but lora=True continues an adapter")
    tokenizer = AutoTokenizer.from_pretrained(config.model_dir)
    peft_config: Any = None
    if config.lora is not None:
        base = AutoModelForCausalLM.from_pretrained(config.model_dir, dtype=torch.float32)
        if init_from is not None and is_adapter(init_from):
            from peft import PeftModel

            model: Any = PeftModel.from_pretrained(base, str(init_from), is_trainable=True)
        else:
            model = base
            peft_config = config.lora.peft()
    else:
        model = AutoModelForCausalLM.from_pretrained(init_from or config.model_dir, dtype=torch.float32)
    longest = max(len(s.input_ids) for s in samples)
    per_pass = max(1, config.batch_tokens // longest)
    accumulation = 1 if config.sequences_per_step is None else -(-config.sequences_per_step // per_pass)
    args = TRLConfig(
        output_dir=str(output_dir),
        learning_rate=config.lr,
        lr_scheduler_type=config.lr_scheduler,
        num_train_epochs=config.epochs,
        per_device_train_batch_size=per_pass,
        gradient_accumulation_steps=accumulation,
        max_steps=config.max_steps if config.max_steps is not None else -1,
        gradient_checkpointing=config.gradient_checkpointing,
        completion_only_loss=True,
        max_length=None,
        seed=config.seed,
        use_cpu=not on_accelerator(config.device),
        # TRL turns bf16 on by default; a CPU without native bf16 runs it through emulation (measured: a quick warm
        # start took 470-500 s in bf16 and 47 s in fp32 on a 2-core AVX2 machine), so bf16 only where it is fast.
        bf16=fast_dtype("cuda" if on_accelerator(config.device) else "cpu") == torch.bfloat16,
        save_strategy="no",
        report_to="none",
        logging_steps=1,
        disable_tqdm=True,
    )
    dataset = Dataset.from_dict(
        {"input_ids": [s.input_ids for s in samples], "completion_mask": [s.completion_mask for s in samples]}
    )
    trainer = _response_loss_trainer()(
        model=model, args=args, train_dataset=dataset, processing_class=tokenizer, peft_config=peft_config
    )
    trainer.remove_callback(PrinterCallback)
    trainer.add_callback(cast(Any, _progress_callback(config.time_budget_s, sum(len(s.input_ids) for s in samples))))
    return trainer


def train_samples(
    samples: Sequence[SFTSample], config: SFTConfig, output_dir: str | Path, init_from: str | Path | None = None
) -> TrainResult:
    """Fine-tune on ``samples`` and save into ``output_dir`` (full model, or adapter with ``lora``; tokenizer too)."""
    started = time.perf_counter()
    trainer = make_sft_trainer(samples, config, output_dir, init_from)
    with all_cores():  # training runs alone: a local policy server in this process leaves half the cores otherwise
        output = trainer.train()
    progress = next(c for c in trainer.callback_handler.callbacks if isinstance(c, _Progress))
    folder = Path(output_dir)
    trainer.save_model(str(folder))
    losses = [row["loss"] for row in trainer.state.log_history if "loss" in row]
    metrics = {
        "train_loss": float(output.training_loss),
        "loss_first": float(losses[0]) if losses else float("nan"),
        "loss_last": float(losses[-1]) if losses else float("nan"),
        "optimizer_steps": int(output.global_step),
        "planned_steps": int(trainer.state.max_steps),
        "seconds_per_step": progress.seconds_per_step,
        "stopped_by_budget": progress.stopped_early,
        "samples": len(samples),
        "train_tokens": sum(len(s.input_ids) for s in samples),
        "response_tokens": sum(s.response_tokens for s in samples),
        "truncated": sum(s.truncated for s in samples),
        "text_derived": sum(s.text_derived for s in samples),
        "train_seconds": time.perf_counter() - started,
    }
    return TrainResult(folder, metrics)


def fresh_adapter(config: SFTConfig, folder: str | Path) -> Path:
    """Save an untrained LoRA adapter over ``config.model_dir`` (``config.lora``, default ``LoraConfig()``; it starts
    as the identity, B = 0) into ``folder`` in peft format, with the tokenizer: what an agent's policy serves before its
    first round."""
    import torch
    from peft import get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(config.seed)
    base = AutoModelForCausalLM.from_pretrained(config.model_dir, dtype=torch.float32)
    out = Path(folder)
    get_peft_model(base, (config.lora or LoraConfig()).peft()).save_pretrained(str(out))
    AutoTokenizer.from_pretrained(config.model_dir).save_pretrained(str(out))
    return out


def train_policies(
    selected: Sequence[Trajectory],
    config: SFTConfig,
    folder: str | Path,
    current: Mapping[str, Path],
    versions: dict[str, str],
    version: str,
    models: Mapping[str, str],
) -> tuple[dict[str, TrainResult], int]:
    """One round of per-agent SFT: split the ``selected`` trajectories by the policy that served each call, fine-tune
    each agent's adapter (starting from its ``current`` folder) on its own calls only into ``folder/<agent>``, mark it
    ``version`` in ``versions``, copy the adapters with nothing to train on unchanged, and write the manifest.
    ``models``: the served model name → agent, as the backend named each adapter. Returns the training results by
    agent and how many selected calls the base model served (not trained on)."""
    from agl.trainers.rl.policies import adapter_folder, split_by_policy, write_manifest

    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    parts = split_by_policy(selected, models)
    adapter_config = replace(config, lora=config.lora or LoraConfig())
    results: dict[str, TrainResult] = {}
    for agent in config.policies:
        target = out / adapter_folder(agent)
        samples = build_samples(parts[agent], config.max_length)
        if samples:
            results[agent] = train_samples(samples, adapter_config, target, init_from=current[agent])
            versions[agent] = version
        else:
            shutil.copytree(current[agent], target, dirs_exist_ok=True)
    write_manifest(out, config.model_dir, versions, config.serving.model_name)
    base = sum(len(t.transitions) for t in parts[None])
    return results, base


def sft_on_trajectories(
    trajectories: Sequence[Trajectory], config: SFTConfig, *, output_dir: str | Path | None = None
) -> Path:
    """Select (``config``'s rules), lay out exact-id samples and fine-tune ``config.model_dir`` on them; returns the
    folder of the saved weights (``output_dir``, else ``config.output_dir``, else ``runs/sft``).

    Usable outside a Trainer run, e.g. to warm-start a policy from trajectories of a stronger model served through
    agl (their token ids must come from the same tokenizer). With ``lora`` the folder is an adapter.

    Transitions without token ids (traces imported with ``agl.otel``, read back with
    ``stored_trajectories(store, algorithm=SFT(...))``) become TEXT-DERIVED samples: their messages rendered with
    ``config.model_dir``'s chat template (a warning counts them).
    """
    selected = select_trajectories(
        trajectories,
        successful_only=config.successful_only,
        min_reward=config.min_reward,
        top_k_per_task=config.top_k_per_task,
    )
    tokenizer = None
    if any(not t.has_token_ids for traj in selected for t in traj.transitions):
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(config.model_dir)
    samples = build_samples(selected, config.max_length, tokenizer)
    derived = sum(s.text_derived for s in samples)
    if derived:
        log.warning(
            "sft: %d of %d samples are text-derived (messages rendered with %s's chat template, not the token ids "
            "a model produced)",
            derived,
            len(samples),
            config.model_dir,
        )
    if not samples:
        raise ValueError(
            f"sft_on_trajectories: none of {len(trajectories)} trajectories passed selection with a transition "
            f"(successful_only={config.successful_only}, min_reward={config.min_reward}); relax the rules"
        )
    folder = Path(output_dir or config.output_dir or "runs/sft")
    return train_samples(samples, config, folder).path
