"""The policy update: a trainable copy of the policy (full weights or a LoRA adapter) and its AdamW optimizer.

``PolicyUpdater.step(transitions)`` is one optimizer step over any number of transitions: they are split into
micro-batches by a token budget, each forward/backward adds its share of the step loss (gradient accumulation), then
the gradient is clipped and applied. ``state_dict()`` gives full merged weights under the base model's names, ready to
hot-swap into a server. Not thread-safe: one caller drives it. The device comes from the config (``auto`` = CUDA when
available), so the same code runs on CPU and on a GPU. With ``UpdateConfig.strategy = "ddp"`` under torchrun, rank 0's
updater leads each step and the other ranks' updaters follow it (``agl.trainers.rl.distributed``).

The model is kept in ``eval()`` mode while training (dropout off): the importance ratio compares log-probs of the
same deterministic network before and after the update, so dropout noise would only blur it. Log-probs are taken at
each transition's sampling temperature (see ``loss.py``).
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from agl.core.types import Transition
from agl.cpu import all_cores, usable_cores
from agl.trainers.config import resolve_lora
from agl.trainers.rl.batching import MicroBatch, make_micro_batches
from agl.trainers.rl.distributed import Message, UpdateGroup, shard_transitions
from agl.trainers.rl.loss import (
    LossSums,
    entropy_sum,
    policy_loss,
    response_logprobs,
    response_scores,
    selective_log_softmax,
)
from agl.trainers.rl.update_config import UpdateConfig

#: The fewest leading prompt tokens calls must share to be scored over one prefix pass (``share_prefixes``): below
#: that, the cache's set-up costs more than the tokens it saves.
MIN_SHARED_PREFIX = 32


def resolve_device(name: str) -> torch.device:
    """``auto`` → ``cuda`` when a GPU is visible, else ``cpu``; anything else is passed to ``torch.device``."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


class PolicyUpdater:
    """Holds the policy being trained and its optimizer; turns transitions with advantages into weight updates.

    Example::

        updater = PolicyUpdater(model_dir, UpdateConfig(lr=1e-5))
        metrics = updater.step(transitions)          # transitions carry token ids, logprobs and advantages
        server.load_state_dict(updater.state_dict(), version="v1")
    """

    def __init__(
        self,
        model_dir: str | Path,
        config: UpdateConfig | None = None,
        default_temperature: float = 1.0,
        name: str | None = None,
    ) -> None:
        """``default_temperature`` scores the transitions that recorded no sampling temperature
        (``Transition.temperature`` is None). Each other response is scored at its own temperature (1 for greedy
        calls), the distribution its tokens and behaviour log-probs come from; LightningRL passes the temperature it
        publishes. ``name`` is the policy's key in a ``PolicySet``: with ``strategy="ddp"``, how rank 0's messages
        reach the same policy's updater on the other ranks (every rank builds its updaters in the same order)."""
        from transformers import AutoModelForCausalLM, AutoTokenizer

        config = config or UpdateConfig()
        self.config = replace(config, lora=resolve_lora(config.lora, model_dir, config.device))
        if not default_temperature >= 0.0:
            raise ValueError(f"default_temperature: must be >= 0, got {default_temperature}")
        self.default_temperature = default_temperature
        self.model_dir = Path(model_dir)
        self.name = name
        # joined first: on GPUs it makes this rank's own GPU the current one, which "cuda" then means
        self.group = UpdateGroup.join() if self.config.strategy == "ddp" else None
        self.device = resolve_device(self.config.device)
        self.tokenizer = AutoTokenizer.from_pretrained(self.model_dir)
        pad = self.tokenizer.pad_token_id
        self.pad_id = int(pad if pad is not None else self.tokenizer.eos_token_id)
        model: Any = AutoModelForCausalLM.from_pretrained(self.model_dir, dtype=torch.float32)
        if self.config.gradient_checkpointing:  # non-reentrant: a LoRA's frozen inputs need no gradient hook
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        self.reference: Any = None
        if self._uses_reference and self.config.lora is None:
            reference: Any = copy.deepcopy(model)
            self.reference = reference.to(self.device).eval().requires_grad_(False)
        if self.config.lora is not None:
            from peft import get_peft_model

            model = get_peft_model(model, self.config.lora.peft())
        self.model: Any = model
        self.model.to(self.device).eval()
        self._checkpointed = checkpointed_layers(model) if self.config.gradient_checkpointing else []
        self.parameters = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(self.parameters, lr=self.config.lr, weight_decay=self.config.weight_decay)
        self.steps = 0
        if self.group is not None:  # the replicas start from rank 0's weights (a LoRA adapter's random init included)
            for p in self.parameters:
                self.group.broadcast_(p.data)

    # -- training ----------------------------------------------------------------------------------------------------

    def _autocast(self) -> AbstractContextManager[Any]:
        if self.config.mixed_precision == "bf16" and self.device.type == "cuda":
            return torch.autocast("cuda", dtype=torch.bfloat16)
        return nullcontext()

    @property
    def _uses_reference(self) -> bool:
        """Whether steps compute the start policy's log-probs (for the KL penalty or the ``kl_ref`` measurement)."""
        return self.config.loss.kl_beta > 0.0 or self.config.measure_kl_ref

    def _reference_logprobs(self, batch: MicroBatch) -> torch.Tensor | None:
        if not self._uses_reference:
            return None
        with torch.no_grad():
            if self.config.lora is not None:
                with self.model.disable_adapter():
                    return self._scored(self.model, batch)[1]
            return self._scored(self.reference, batch)[1]

    def _inert(self, transitions: Sequence[Transition]) -> set[int]:
        """Indices of the transitions whose loss terms are all zero: a negative advantage weighted 0
        (``LossConfig.negative_weight``) and no KL penalty."""
        loss = self.config.loss
        if loss.negative_weight > 0.0 or loss.kl_beta > 0.0:
            return set()
        return {i for i, t in enumerate(transitions) if t.advantage is not None and t.advantage < 0}

    def micro_batches(self, transitions: Sequence[Transition]) -> list[MicroBatch]:
        """The micro-batches ``step`` would train on (exposed for inspection and tests)."""
        from agl.trainers.logits import plain_head

        shares = self.config.share_prefixes and plain_head(self.model)
        return make_micro_batches(
            transitions,
            token_budget=self.config.micro_batch_tokens,
            pad_id=self.pad_id,
            max_length=self.config.max_length,
            default_temperature=self.default_temperature,
            share_prefixes=MIN_SHARED_PREFIX if shares else None,
        )

    def _scored(self, model: Any, batch: MicroBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """``model``'s scores of the positions that predict a response token (``[N, V]``, at each sequence's
        temperature) and its per-token log-probs (``[B, L]``, 0 outside the responses). Only those positions are
        projected onto the vocabulary (``agl.trainers.logits``): agent calls are long prompts with short answers."""
        from agl.trainers.logits import selected_logits, shared_prefix_logits

        if batch.prefix_ids is not None:
            predicts = batch.response_mask > 0
            with self._autocast():
                shared = shared_prefix_logits(model, batch.prefix_ids, batch.input_ids, batch.attention_mask, predicts)
                scores = response_scores(shared, predicts, batch.temperatures)
                chosen = selective_log_softmax(scores, batch.input_ids[predicts])
                aligned = torch.zeros(predicts.shape, dtype=chosen.dtype, device=chosen.device)
                return scores, aligned.masked_scatter(predicts, chosen)
        predicts = batch.response_mask[:, 1:] > 0
        with self._autocast():
            logits = selected_logits(
                model, batch.input_ids, batch.attention_mask, torch.nn.functional.pad(predicts, (0, 1), value=False)
            )
            if logits is None:  # logits beyond the output layer (capped, scaled): computed whole
                full = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
                logits = full[:, :-1, :][predicts]
            scores = response_scores(logits, predicts, batch.temperatures)
            return scores, response_logprobs(scores, batch.input_ids, predicts)

    def logprobs(self, batch: MicroBatch) -> torch.Tensor:
        """Current per-token log-probs of ``batch`` (aligned with its input ids, at each sequence's sampling
        temperature: what ``step`` divides by the behaviour log-probs), without gradient."""
        with torch.no_grad():
            return self._scored(self.model, batch.to(self.device))[1]

    def prompt_logprobs(self, text: str) -> tuple[list[int], list[float]]:
        """``text``'s token ids and the policy's log-probability (temperature 1) of each after the ones before it (one
        fewer than the ids): what a server of these weights must answer for the same ids (a sync's proof)."""
        ids = [int(i) for i in self.tokenizer(text, add_special_tokens=False)["input_ids"]]
        with torch.no_grad():
            logits = self.model(input_ids=torch.tensor([ids], device=self.device)).logits[0, :-1].float()
        chosen = torch.log_softmax(logits, dim=-1).gather(1, torch.tensor(ids[1:], device=self.device)[:, None])
        return ids, chosen[:, 0].tolist()

    def step(self, transitions: Sequence[Transition]) -> dict[str, float]:
        """One optimizer step over ``transitions``; returns loss, clip_fraction, approx_kl, kl_ref (NaN when not
        measured), entropy, grad_norm, tokens, response_tokens, sequences, greedy, micro_batches, truncated,
        negative_skipped (transitions left out because their terms are zero, see ``LossConfig.negative_weight``),
        seconds and tokens_per_s. Per-token statistics are means over the response tokens computed (every one but the
        skipped transitions'), of the policy before the step; with ``strategy="ddp"`` they cover every rank's shard.

        Runs on every core (``agl.cpu.all_cores``; a rank of a distributed update on its share of the machine's
        cores): the update comes between rounds, when the local policy server (which keeps the process at half the
        cores while it decodes) and the runners are idle."""
        if not transitions:
            raise ValueError("step: no transitions to train on")
        if self.group is not None and not self.group.leads:
            raise ValueError("step: rank 0 leads a distributed update; the other ranks follow it (follow_step)")
        with all_cores(self._threads()):
            return self._step(transitions)

    def follow_step(self, shard: Sequence[Transition], normalizer: float) -> None:
        """A follower rank's part of the step rank 0 leads: score ``shard`` (possibly empty) with the step's
        ``normalizer``, then sum gradients and apply the same AdamW step as every rank."""
        with all_cores(self._threads()):
            self._train(shard, normalizer, time.perf_counter(), 0, reduce=True)

    def _threads(self) -> int:
        return self.group.threads() if self.group is not None else usable_cores()

    def _step(self, transitions: Sequence[Transition]) -> dict[str, float]:
        started = time.perf_counter()
        batches = self.micro_batches(transitions)
        if self.config.loss.aggregation == "token_mean":
            normalizer = float(sum(b.response_tokens for b in batches))
        else:
            normalizer = float(sum(b.sequences for b in batches))
        inert = self._inert(transitions)
        # their terms are zero: the normaliser counts them, the forward/backward passes skip them
        kept = [t for i, t in enumerate(transitions) if i not in inert]
        reduce = self.group is not None and bool(kept)  # nothing to train: no rank takes part, no weight moves
        if reduce:
            assert self.group is not None
            shards = shard_transitions(kept, self.group.world)
            messages = [Message("step", self.name, shard, normalizer) for shard in shards]
            kept = self.group.send(messages).shard
        elif not inert:  # one process training every call: the batches planned for the normaliser are the ones
            return self._train(kept, normalizer, started, 0, reduce, batches)
        return self._train(kept, normalizer, started, len(inert), reduce)

    def _train(
        self,
        transitions: Sequence[Transition],
        normalizer: float,
        started: float,
        skipped: int,
        reduce: bool,
        batches: list[MicroBatch] | None = None,
    ) -> dict[str, float]:
        """Forward/backward over ``transitions``' micro-batches (``batches`` when already planned), with ``reduce``
        the gradient and the counts summed over the ranks, then clipped and applied; returns ``step``'s metrics."""
        if batches is None:
            batches = self.micro_batches(transitions) if transitions else []
        loss_cfg = self.config.loss
        self.optimizer.zero_grad(set_to_none=True)
        sums = LossSums()
        total_loss = 0.0
        tokens = 0
        for cpu_batch in batches:
            batch = cpu_batch.to(self.device)
            ref = self._reference_logprobs(batch)
            with checkpointing(self._checkpointed):
                scores, new = self._scored(self.model, batch)
            loss, part = policy_loss(
                new, batch.old_logprobs, batch.advantages, batch.response_mask, loss_cfg, normalizer, ref
            )
            part.entropy = entropy_sum(scores)
            del scores  # [N, V]: the backward pass does not need it, free it before the next micro-batch
            loss.backward()
            total_loss += float(loss.item())
            sums.add(part)
            tokens += cpu_batch.tokens
        counts = {
            "loss": total_loss,
            "tokens": float(tokens),
            "response_tokens": sums.tokens,
            "clipped": sums.clipped,
            "approx_kl": sums.approx_kl,
            "kl_ref": sums.kl_ref,
            "entropy": sums.entropy,
            "sequences": float(sum(b.sequences for b in batches)),
            "greedy": float(sum(b.greedy for b in batches)),
            "micro_batches": float(len(batches)),
            "truncated": float(sum(b.truncated for b in batches)),
        }
        if reduce:
            counts = self._sum_over_ranks(counts)
        limit = self.config.max_grad_norm if self.config.max_grad_norm is not None else float("inf")
        grad_norm = float(torch.nn.utils.clip_grad_norm_(self.parameters, limit).item())
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.steps += 1
        seconds = time.perf_counter() - started
        n = max(counts["response_tokens"], 1.0)
        return {
            "loss": counts["loss"],
            "clip_fraction": counts["clipped"] / n,
            "approx_kl": counts["approx_kl"] / n,
            "kl_ref": counts["kl_ref"] / n if self._uses_reference else math.nan,
            "entropy": counts["entropy"] / n,
            "grad_norm": grad_norm,
            "tokens": counts["tokens"],
            "response_tokens": counts["response_tokens"],
            "sequences": counts["sequences"],
            "greedy": counts["greedy"],
            "micro_batches": counts["micro_batches"],
            "truncated": counts["truncated"],
            "negative_skipped": float(skipped),
            "seconds": seconds,
            "tokens_per_s": counts["tokens"] / seconds if seconds > 0 else 0.0,
        }

    def _sum_over_ranks(self, counts: dict[str, float]) -> dict[str, float]:
        """Sum every rank's gradient (one all-reduce of all of them, zeros where a rank computed none) and its
        counts; the gradient is then the whole step's on every rank."""
        assert self.group is not None
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.parameters]
        flat = torch.cat([g.reshape(-1) for g in grads])
        self.group.sum_(flat, f"summing gradients of step {self.steps + 1}")
        offset = 0
        for p, g in zip(self.parameters, grads, strict=True):
            p.grad = flat[offset : offset + g.numel()].view_as(p).clone()
            offset += g.numel()
        totals = torch.tensor(list(counts.values()), dtype=torch.float64, device=flat.device)
        self.group.sum_(totals, f"summing metrics of step {self.steps + 1}")
        self.group.steps = self.steps + 1
        return dict(zip(counts, totals.tolist(), strict=True))

    # -- weights out and in ------------------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Full weights under the base model's parameter names, on the CPU (LoRA deltas merged in, model untouched)."""
        if self.config.lora is None:
            return {k: v.detach().to("cpu", copy=True) for k, v in self.model.state_dict().items()}
        from peft.tuners.lora import LoraLayer

        base = self.model.get_base_model()
        out: dict[str, torch.Tensor] = {}
        for key, value in base.state_dict().items():
            if ".lora_" in key:
                continue
            out[key.replace(".base_layer.", ".")] = value.detach().to("cpu", copy=True)
        with torch.no_grad():
            for name, module in base.named_modules():
                if isinstance(module, LoraLayer):
                    delta = module.get_delta_weight("default")  # type: ignore[attr-defined]
                    merged = module.base_layer.weight + delta
                    out[f"{name}.weight"] = merged.detach().to("cpu", copy=True)
        return out

    def frozen_base(self) -> dict[str, torch.Tensor] | None:
        """With LoRA on the CPU: the base model's weights under their plain names, the very tensors this updater holds
        and never trains, which a policy server in this process can serve instead of a copy of its own
        (``PolicyServer.load_state_dict(..., share=True)``); None for full weights or another device."""
        if self.config.lora is None or self.device.type != "cpu":
            return None
        base = self.model.get_base_model()
        return {k.replace(".base_layer.", "."): v.detach() for k, v in base.state_dict().items() if ".lora_" not in k}

    def save(self, path: str | Path) -> Path:
        """Write the policy to ``path``: a ``save_pretrained`` folder, or a peft adapter folder with LoRA (both carry
        the tokenizer). ``PolicyServer.load_weights`` accepts either."""
        folder = Path(path)
        folder.mkdir(parents=True, exist_ok=True)
        self.model.save_pretrained(folder)
        self.tokenizer.save_pretrained(folder)
        return folder

    def load(self, path: str | Path) -> None:
        """Load weights written by ``save`` (same ``lora`` setting) into the model being trained."""
        folder = Path(path)
        if self.config.lora is not None:
            from peft import set_peft_model_state_dict
            from safetensors.torch import load_file

            adapter = folder / "adapter_model.safetensors"
            if not adapter.is_file():
                raise ValueError(f"{folder} holds no LoRA adapter (adapter_model.safetensors); was it saved with lora?")
            set_peft_model_state_dict(self.model, load_file(str(adapter), device=str(self.device)))
            self._share_state()
            return
        if not (folder / "config.json").is_file():
            raise ValueError(f"{folder} is not a save_pretrained model folder (no config.json)")
        from transformers import AutoModelForCausalLM

        weights = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).state_dict()
        self.model.load_state_dict(weights)
        self._share_state()

    def optimizer_state(self) -> dict[str, Any]:
        """The optimizer's state (for checkpoints)."""
        return dict(self.optimizer.state_dict())

    def load_optimizer_state(self, state: dict[str, Any]) -> None:
        """Restore what ``optimizer_state`` returned."""
        self.optimizer.load_state_dict(state)
        self._share_state()

    def _share_state(self) -> None:
        """Rank 0 of a distributed update, after loading weights or optimizer state: the followers receive them
        (``receive_state``), so every replica stays equal."""
        if self.group is None or not self.group.leads:
            return
        self.group.send([Message("state", self.name) for _ in range(self.group.world)])
        self.receive_state()

    def receive_state(self) -> None:
        """Take rank 0's trainable weights and optimizer state (rank 0 sends them; see ``_share_state``)."""
        assert self.group is not None
        for p in self.parameters:
            self.group.broadcast_(p.data)
        state = self.optimizer_state() if self.group.leads else None
        state = self.group.broadcast_object(_on_cpu(state))
        if not self.group.leads:
            self.optimizer.load_state_dict(state)


def checkpointed_layers(model: Any) -> list[Any]:
    """``model``'s decoder layers, the modules transformers checkpoints (found once, when the updater is built)."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    return [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]


@contextmanager
def checkpointing(layers: Sequence[Any]) -> Iterator[None]:
    """Let the decoder ``layers`` recompute their activations in the backward pass (``gradient_checkpointing``)
    during a forward pass with gradient. transformers checkpoints a layer only while that layer is in training mode,
    and the updater keeps the model in eval mode (no dropout, the log-probs the server computes); so only the layers
    themselves are switched, not their sub-modules (dropout stays off), and switched back afterwards. The backward
    pass replays each layer's forward without looking at the flag. A checkpointed layer drops any key/value cache it
    is given unless told it may keep it: the only cache the updater passes is a shared prefix's, whose layers
    (``agl.trainers.logits.PrefixLayer``) are safe to replay. No layers: nothing changes."""
    for layer in layers:
        layer.training, layer._can_checkpoint_with_cache = True, True
    try:
        yield
    finally:
        for layer in layers:
            layer.training = False
            del layer._can_checkpoint_with_cache  # the class's own value again


def _on_cpu(value: Any) -> Any:
    """``value`` with every tensor in it moved to the CPU (objects sent between ranks must not name a GPU)."""
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if isinstance(value, dict):
        return {k: _on_cpu(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_on_cpu(v) for v in value)
    return value
