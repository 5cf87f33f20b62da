"""LightningRL: reinforcement learning of an agent's policy from its own rollouts, any agent shape.

Every LLM call of the selected agents is one training sample (a transition). A round is: run a sample of tasks
``group_size`` times each on the current weights → returns by credit assignment (plus AIR) → GRPO advantages within
each task's group → clipped policy update against the recorded behaviour log-probs → hot-swap the new weights into the
serving backend as the next version → publish resources pointing at it. Weights change only between rounds, after every
rollout of the round has finished, and a round whose transitions report more than one weights version is an error.
With ``min_informative_groups`` a round draws further batches of tasks, on the same weights, until enough of its
groups carry a signal (dynamic sampling, ``sampling.py``).

One thread drives everything; rollouts run in the Trainer's runner processes. By default one policy is trained (one
model or adapter behind one LLM resource). With ``policies`` each listed agent trains a LoRA adapter of its own
(``policies.py``): the published LLM resource routes every listed agent to its adapter (``LLM.routes``), transitions
are split by the policy that served them (``Transition.policy``), advantages and updates stay within each policy,
and one publish per round carries every adapter's new version.
"""

from __future__ import annotations

import logging
import math
import random
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal, cast

from agl.core.algorithm import Algorithm
from agl.core.types import LLM, ModelWeights, ResourceSet, Span, Trajectory, Transition
from agl.serving.vllm import VllmConfig
from agl.trainers.rl._report import console_line, round_diagnostics, write_metrics
from agl.trainers.rl.air import AirRules
from agl.trainers.rl.credit import CreditMode, assign_all
from agl.trainers.rl.grpo import AdvantageStats, GRPOConfig, group_key, grpo_advantages, informative_tasks
from agl.trainers.rl.policies import MANIFEST, count_transitions, split_by_policy, validate_policies
from agl.trainers.rl.sampling import (
    GroupOutcome,
    TaskRecord,
    draw_round,
    history_from_state,
    history_state,
    retired_tasks,
)
from agl.trainers.rl.update_config import LossConfig, UpdateConfig

if TYPE_CHECKING:
    from agl.core.trainer import RolloutBatch, TrainContext
    from agl.trainers.rl.backend import PolicyBackend
    from agl.trainers.rl.policies import AdapterServing, AdapterSet
    from agl.trainers.rl.update import PolicyUpdater

log = logging.getLogger("agl.trainers.rl")

#: The version of the untrained base model, which per-agent policies leave as it is.
BASE_VERSION = "v0"

#: Step metrics a round reports as their mean over its optimizer steps (``approx_kl`` is reported as ``kl``).
_STEP_MEANS = ("loss", "clip_fraction", "approx_kl", "kl_ref", "entropy", "grad_norm")


@dataclass
class LightningRLConfig:
    """Everything LightningRL does is set here. Only ``model_dir`` is required.

    Policy and serving:
        model_dir: ``save_pretrained`` folder of the model to train (e.g. ``agl.serving.prepare_smollm2()``).
        llm_resource: name of the ``LLM`` resource the agent calls (default ``"main_llm"``); published by LightningRL.
        policy_resource: name of the ``ModelWeights`` resource describing the current weights (default ``"policy"``).
        model_name: model name served by the local backend (vLLM serves each version under its version name).
        backend: ``"local"`` (default: ``agl.serving.PolicyServer`` in this process, CPU, hot swap in memory) or
            ``"vllm"`` (agl launches vLLM on ``model_dir``; LoRA rounds are loaded live, full weights restart it —
            see ``backend.py``; needs ``pip install agl[vllm]`` on a GPU, or vLLM's CPU build, see ``vllm``).
        vllm: how vLLM is launched with ``backend="vllm"`` (``agl.serving.VllmConfig``: the interpreter that has it,
            e.g. ``.venv-vllm/bin/python`` made by ``scripts/vllm_cpu.sh``, GPU or CPU, memory, extra arguments).
        max_batch_size: requests the local server decodes together. Default 8; raise it with many runners.
        temperature / max_tokens: default sampling of the published LLM resource (the agent may override per call).
            Default 1.0 / 256. Keep temperature near 1: lower values make groups agree and leave GRPO no signal.
            The loss scores each call at the temperature it was sent with (recorded on its ``llm`` span), the
            distribution its tokens and behaviour log-probs come from; ``temperature`` stands in for calls that
            recorded none. Greedy calls (temperature 0) are scored at temperature 1, as the servers report them, and
            counted per round in ``greedy_transitions``. Leave top-p/top-k off: the loss does not model them.
        policies: one policy per agent, e.g. ``{"writer": "lora", "rewriter": "lora"}``: each listed agent trains a
            LoRA adapter of its own (``lora_r``/``lora_alpha``; only ``"lora"`` exists) served as model
            ``f"{model_name}/{agent}"`` (local backend) or ``f"{agent}@{version}"`` (vLLM, each version loaded live
            with ``--max-loras`` = the number of agents), and the gateway routes the agent's calls there (a nested
            agent ``writer/x`` follows ``writer``). Other agents' calls go to the untrained base model and are
            counted in ``base_transitions``, not trained on. Default empty: one policy for every agent.

    Rounds and data:
        rounds: training rounds. Default 10.
        time_budget_s: stop before a round that would end past this many seconds from the start of ``fit`` (judged
            by the slowest round so far); None = run every round. For wall-clock-bounded runs such as the CPU demo.
        tasks_per_round: tasks sampled (without replacement) per round; None = all training tasks. Default None.
        group_size: rollouts per task per round (the GRPO group). Default 4; 8-16 gives steadier advantages.
        min_informative_groups: dynamic sampling (DAPO-style, ``sampling.py``), off by default (None). With K set, a
            round draws batches of ``tasks_per_round`` tasks (all on the round's weights) until at least K of its
            tasks' groups give GRPO a signal (returns that differ, or tie-break scores with ``grpo.tie_break``) or it
            has drawn ``max_draw_factor * tasks_per_round`` tasks. Tasks whose rewards so far differed are drawn
            first, then unseen ones; a task whose group was flat twice is never drawn again (the per-task history is
            kept in checkpoints). Flat groups are never trained on (needs ``grpo.skip_zero_variance``); they cost
            only their generation. Each round reports ``tasks_drawn``, ``informative_groups``, ``draws`` and
            ``flat_skipped_tasks`` (tasks left out because they were flat twice), and its reward metrics cover
            every task drawn. Training stops early once every task is left out.
        max_draw_factor: the cap of dynamic sampling, in multiples of ``tasks_per_round`` (>= 1). Default 3.0.
        seed: seeds task sampling, torch and the local server's sampling. Default 0.

    Credit and advantages:
        credit / gamma: how returns are computed (``broadcast`` | ``discounted`` | ``per_step``, see ``credit.py``).
        air: automatic intermediate rewards (default none; ``AirRules.defaults()`` rewards tool calls that ran).
        grpo: advantage options (std normalisation by group or batch std, skipping zero-variance groups,
            ``group_by``: which calls share a baseline, ``"task"`` | ``"task_agent"`` | ``"task_agent_step"``, and
            ``tie_break``: order a flat group by the calls' tie-break scores; see ``grpo.py``). With ``tie_break``
            each round reports ``tie_break_groups``, the groups trained on their tie-break scores.

    Update:
        lr: learning rate. Default 1e-5 (full weights of a ~100M model); ~1e-4 for LoRA.
        clip_low / clip_high / aggregation / kl_beta: the loss (see ``loss.py``). Defaults 0.2 / 0.2 / token_mean / 0.
        lora / lora_r / lora_alpha: train a LoRA adapter instead of all weights. Default off / 16 / 32.
        micro_batch_tokens / max_length / max_grad_norm / device / mixed_precision: see ``UpdateConfig``.
        epochs: passes over a round's transitions. Default 1; 2-4 reuse expensive rollouts more (clipping bounds it).
        mini_batches: optimizer steps per epoch (transitions are shuffled and split). Default 1.
        measure_kl_ref: report ``kl_ref`` (approximate KL to the start policy) every round even with ``kl_beta`` 0.
            Default True; costs a forward pass per micro-batch and, for full weights, a frozen copy of the model.

    Validation, checkpoints, resume:
        val_every: validate on ``val_tasks`` before training and every k rounds (and after the last). 0 = never.
        checkpoint_dir: where round folders go (default ``run_dir/rl_checkpoints``).
        checkpoint_every: add the resumable trainer state every k rounds (and after the last). Default 1.
        keep_checkpoints: round folders kept (oldest removed; the newest and the newest resumable stay). Default 2;
            None keeps all (full weights of a 135M model are ~0.5 GB per round).
        resume_from: a round folder, or ``"latest"`` (newest resumable folder under ``checkpoint_dir``), or None.
    """

    model_dir: str | Path
    llm_resource: str = "main_llm"
    policy_resource: str = "policy"
    model_name: str = "policy"
    backend: Literal["local", "vllm"] = "local"
    vllm: VllmConfig = field(default_factory=VllmConfig)
    max_batch_size: int = 8
    temperature: float = 1.0
    max_tokens: int = 256
    policies: dict[str, str] = field(default_factory=dict)
    rounds: int = 10
    time_budget_s: float | None = None
    tasks_per_round: int | None = None
    group_size: int = 4
    min_informative_groups: int | None = None
    max_draw_factor: float = 3.0
    seed: int = 0
    credit: CreditMode = "broadcast"
    gamma: float = 1.0
    air: AirRules = field(default_factory=AirRules)
    grpo: GRPOConfig = field(default_factory=GRPOConfig)
    lr: float = 1e-5
    clip_low: float = 0.2
    clip_high: float = 0.2
    aggregation: Literal["token_mean", "sequence_mean"] = "token_mean"
    kl_beta: float = 0.0
    lora: bool = False
    lora_r: int = 16
    lora_alpha: int = 32
    micro_batch_tokens: int = 4096
    max_length: int | None = None
    max_grad_norm: float | None = 1.0
    device: str = "auto"
    mixed_precision: Literal["no", "bf16"] = "no"
    epochs: int = 1
    mini_batches: int = 1
    measure_kl_ref: bool = True
    val_every: int = 0
    checkpoint_dir: str | Path | None = None
    checkpoint_every: int = 1
    keep_checkpoints: int | None = 2
    resume_from: str | Path | None = None

    def __post_init__(self) -> None:
        for name in ("rounds", "group_size", "epochs", "mini_batches", "checkpoint_every", "max_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}: must be >= 1, got {getattr(self, name)}")
        if self.tasks_per_round is not None and self.tasks_per_round < 1:
            raise ValueError(f"tasks_per_round: must be >= 1 or None, got {self.tasks_per_round}")
        if self.min_informative_groups is not None:
            if self.min_informative_groups < 1:
                raise ValueError(f"min_informative_groups: must be >= 1 or None, got {self.min_informative_groups}")
            if not self.grpo.skip_zero_variance:
                raise ValueError("min_informative_groups: flat groups are never trained on; needs skip_zero_variance")
        if not self.max_draw_factor >= 1.0:
            raise ValueError(f"max_draw_factor: must be >= 1, got {self.max_draw_factor}")
        if self.val_every < 0:
            raise ValueError(f"val_every: must be >= 0, got {self.val_every}")
        if self.backend not in ("local", "vllm"):
            raise ValueError(f"backend: expected 'local' or 'vllm', got {self.backend!r}")
        if self.llm_resource == self.policy_resource:
            raise ValueError("llm_resource and policy_resource must be different names")
        validate_policies(self.policies)
        self.update_config()

    def update_config(self) -> UpdateConfig:
        """The ``UpdateConfig`` these settings describe."""
        return UpdateConfig(
            lr=self.lr,
            max_grad_norm=self.max_grad_norm,
            loss=LossConfig(self.clip_low, self.clip_high, self.aggregation, self.kl_beta),
            micro_batch_tokens=self.micro_batch_tokens,
            max_length=self.max_length,
            lora=self.lora,
            lora_r=self.lora_r,
            lora_alpha=self.lora_alpha,
            device=self.device,
            mixed_precision=self.mixed_precision,
            temperature=self.temperature,
            measure_kl_ref=self.measure_kl_ref,
        )


@dataclass
class _State:
    """What survives a round (and a checkpoint)."""

    round: int = 0
    version_index: int = 0
    weights_path: str = ""
    history: list[dict[str, Any]] = field(default_factory=list)
    tasks: dict[str, TaskRecord] = field(default_factory=dict)  # per task id, for dynamic sampling

    @property
    def version(self) -> str:
        return f"v{self.version_index}"


class LightningRL(Algorithm):
    """GRPO-style RL on the transitions of an agent's LLM calls, served and hot-swapped between rounds.

    Example::

        cfg = LightningRLConfig(model_dir=agl.serving.prepare_smollm2(), rounds=5, group_size=8, lr=1e-5)
        agl.Trainer(algorithm=LightningRL(cfg), n_runners=4).fit(my_agent, train_tasks, val_tasks)

    The agent calls the model through ``resources[cfg.llm_resource]`` (an ``LLM``: base_url, model, sampling) and
    returns its final reward. Metrics per round go to ``ctx.log_metrics`` and ``run_dir/rl_metrics.{csv,json}``.
    """

    requires_token_ids: ClassVar[bool] = True

    def __init__(self, config: LightningRLConfig) -> None:
        self.config = config

    def air(self, span: Span) -> float | None:
        """Delegates to the configured AIR rules."""
        return self.config.air(span)

    # -- the loop ----------------------------------------------------------------------------------------------------

    def fit(self, ctx: TrainContext, train_tasks: Sequence[Any], val_tasks: Sequence[Any] | None) -> dict[str, Any]:
        import torch

        from agl.trainers.rl import checkpoint
        from agl.trainers.rl.update import PolicyUpdater

        cfg = self.config
        if not train_tasks:
            raise ValueError("LightningRL.fit: no training tasks")
        rng = random.Random(cfg.seed)
        torch.manual_seed(cfg.seed)
        updater: PolicyUpdater | None = None
        adapters: AdapterSet | None = None
        if cfg.policies:
            from agl.trainers.rl.policies import AdapterSet

            adapters = AdapterSet(cfg.model_dir, list(cfg.policies), cfg.update_config(), cfg.model_name)
        else:
            updater = PolicyUpdater(cfg.model_dir, cfg.update_config())
        root = Path(cfg.checkpoint_dir) if cfg.checkpoint_dir is not None else ctx.run_dir / "rl_checkpoints"
        state = _State(weights_path=str(cfg.model_dir))
        resumed = self._resume(root, updater, adapters, rng, state)
        backend = self._backend(state.version if adapters is None else BASE_VERSION)
        backend.start()
        bar = _RoundBar(cfg.rounds, state.round, getattr(ctx.trainer, "progress", True))
        try:
            if adapters is not None:
                if resumed is None:  # the fresh adapters (identity) are served too, so every route exists at once
                    state.weights_path = str(adapters.save(checkpoint.round_dir(root, 0) / checkpoint.POLICIES_DIR))
                served_from = Path(state.weights_path) if resumed is None else resumed / checkpoint.POLICIES_DIR
                adapters.sync(cast("AdapterServing", backend), served_from)
            elif resumed is not None:
                assert updater is not None
                backend.sync(updater, state.version, resumed / checkpoint.POLICY_DIR)
            resources = self._publish(ctx, backend, state, adapters)
            validate = bool(val_tasks) and cfg.val_every > 0
            if validate and state.round == 0:
                row = {"round": 0, "weights_version": state.version, **self._validate(ctx, val_tasks, resources)}
                self._record(ctx, state, row)
            fit_started, slowest = time.perf_counter(), 0.0
            while state.round < cfg.rounds:
                elapsed = time.perf_counter() - fit_started
                if cfg.time_budget_s is not None and state.round > 0 and elapsed + slowest > cfg.time_budget_s:
                    log.info("time budget of %.0fs reached after %d rounds", cfg.time_budget_s, state.round)
                    break
                if cfg.min_informative_groups is not None and _all_retired(train_tasks, state.tasks):
                    log.warning("every training task was flat twice: stopping after %d rounds", state.round)
                    break
                row, resources = self._round(ctx, train_tasks, rng, updater, adapters, backend, resources, state, root)
                slowest = max(slowest, row["seconds"])
                last = state.round == cfg.rounds
                if validate and (state.round % cfg.val_every == 0 or last):
                    row.update(self._validate(ctx, val_tasks, resources))
                self._record(ctx, state, row)
                if state.round % cfg.checkpoint_every == 0 or last:
                    folder = checkpoint.round_dir(root, state.round)
                    if adapters is not None:
                        if not (folder / checkpoint.POLICIES_DIR / MANIFEST).is_file():
                            state.weights_path = str(adapters.save(folder / checkpoint.POLICIES_DIR))
                    elif updater is not None and not (folder / checkpoint.POLICY_DIR).is_dir():
                        state.weights_path = str(updater.save(folder / checkpoint.POLICY_DIR))
                    checkpoint.save_state(folder, self._checkpoint_state(updater, adapters, rng, state))
                checkpoint.prune(root, cfg.keep_checkpoints)
                bar.update(row)
        finally:
            bar.close()
            backend.stop()
        final = dict(state.history[-1]) if state.history else {}
        final.update({"weights_version": state.version, "weights_path": state.weights_path})
        return final

    def _round(
        self,
        ctx: TrainContext,
        train_tasks: Sequence[Any],
        rng: random.Random,
        updater: PolicyUpdater | None,
        adapters: AdapterSet | None,
        backend: PolicyBackend,
        resources: ResourceSet,
        state: _State,
        root: Path,
    ) -> tuple[dict[str, Any], ResourceSet]:
        """One round: rollouts (one batch, or with ``min_informative_groups`` as many as ``_draw`` needs) → credit →
        advantages → update → swap → publish. Returns its metrics row.

        With ``adapters`` the transitions are split by policy first; each adapter is updated from its own policy's
        transitions only, every updated adapter gets the round's new version, and one publish carries them all."""
        from agl.trainers.rl import checkpoint

        cfg = self.config
        started = time.perf_counter()
        number = state.round + 1
        drawn: dict[str, Any] = {}
        if cfg.min_informative_groups is None:
            tasks = sample_tasks(train_tasks, cfg.tasks_per_round, rng)
            batch = ctx.rollouts(
                tasks,
                mode="train",
                n=cfg.group_size,
                resources_version=resources.version,
                desc=f"rl round {number}/{cfg.rounds}",
            )
        else:
            tasks, batch, drawn = self._draw(ctx, train_tasks, rng, adapters, resources, state)
        rollout_seconds = time.perf_counter() - started
        trajectories = batch.usable
        assign_all(trajectories, cfg.credit, cfg.gamma)
        extra: dict[str, Any] = {}
        if adapters is None:
            served = check_single_version(trajectories, state.version)
            kept, adv = grpo_advantages(trajectories, cfg.grpo)
            kept_by: dict[str | None, list[Transition]] = {None: kept}
        else:
            served = state.version
            kept_by, adv, extra = self._policy_advantages(trajectories, adapters)
        summary = batch.summary
        row: dict[str, Any] = {
            "round": number,
            "weights_version": served,
            "mean_reward": summary["mean_reward"],
            "success_rate": summary["success_rate"],
            "transitions_per_rollout": summary["mean_transitions"],
            "rollouts": summary["rollouts"],
            "failed_rollouts": summary["failed"] + summary["capture_failures"],
            "groups": adv.groups,
            "skipped_groups": adv.skipped_groups,
            "trained_transitions": adv.kept_transitions,
            **round_diagnostics(trajectories, len(tasks), adv),
            **drawn,
            **({"tie_break_groups": adv.tie_break_groups} if cfg.grpo.tie_break else {}),
            **extra,
            "rollout_seconds": rollout_seconds,
        }
        update_started = time.perf_counter()
        if any(kept_by.values()):
            state.version_index += 1
            if adapters is None:
                assert updater is not None
                row.update(self._update(updater, kept_by[None], rng))
                folder = checkpoint.round_dir(root, number) / checkpoint.POLICY_DIR
                updater.save(folder)
                backend.sync(updater, state.version, folder)
            else:
                updated = self._update_adapters(adapters, kept_by, rng, state.version)
                row.update(combine_updates(updated))
                for agent, metrics in updated.items():
                    row[f"policy/{agent}/loss"] = metrics["loss"]
                    row[f"policy/{agent}/kl"] = metrics["kl"]
                folder = adapters.save(checkpoint.round_dir(root, number) / checkpoint.POLICIES_DIR)
                adapters.sync(cast("AdapterServing", backend), folder, agents=list(updated))
            state.weights_path = str(folder)
            resources = self._publish(ctx, backend, state, adapters)
        else:  # every group was zero-variance: nothing to train on, nothing measured on the policy
            row.update(dict.fromkeys(("loss", "clip_fraction", "kl", "kl_ref", "entropy", "grad_norm"), math.nan))
            row["optimizer_steps"] = 0
        row["update_seconds"] = time.perf_counter() - update_started
        row["seconds"] = time.perf_counter() - started
        row["transitions_per_s"] = sum(len(t.transitions) for t in trajectories) / row["seconds"]
        state.round = number
        return row, resources

    def _draw(
        self,
        ctx: TrainContext,
        train_tasks: Sequence[Any],
        rng: random.Random,
        adapters: AdapterSet | None,
        resources: ResourceSet,
        state: _State,
    ) -> tuple[list[Any], RolloutBatch, dict[str, Any]]:
        """Dynamic sampling (``sampling.draw_round``): batches of tasks on the round's resources until enough groups
        are informative. Returns the tasks drawn, every draw's rollouts as one batch (returns assigned), and the
        round's sampling counts for its metrics row; ``state.tasks`` learns every group's outcome."""
        from agl.core.trainer import RolloutBatch, task_id_of

        cfg = self.config
        assert cfg.min_informative_groups is not None
        number = state.round + 1
        ids = [task_id_of(task) for task in train_tasks]
        per_draw = min(cfg.tasks_per_round or len(train_tasks), len(train_tasks))
        batches: list[RolloutBatch] = []

        def run(chosen: list[int]) -> dict[str, GroupOutcome]:
            desc = f"rl round {number}/{cfg.rounds}" + (f" (draw {len(batches) + 1})" if batches else "")
            batch = ctx.rollouts(
                [train_tasks[i] for i in chosen],
                mode="train",
                n=cfg.group_size,
                resources_version=resources.version,
                desc=desc,
            )
            batches.append(batch)
            usable = batch.usable
            assign_all(usable, cfg.credit, cfg.gamma)
            signal = self._task_signal(usable, adapters)
            rewards: dict[str, list[float]] = {}
            for trajectory in usable:
                reward = trajectory.final_reward if trajectory.final_reward is not None else 0.0
                rewards.setdefault(group_key(trajectory), []).append(reward)
            return {key: GroupOutcome(tuple(values), signal.get(key, False)) for key, values in rewards.items()}

        draws = draw_round(
            ids,
            state.tasks,
            per_draw=per_draw,
            min_informative=cfg.min_informative_groups,
            cap=max(per_draw, int(cfg.max_draw_factor * per_draw)),
            rng=rng,
            run=run,
        )
        merged = RolloutBatch(
            rollouts=[r for b in batches for r in b.rollouts],
            trajectories=[t for b in batches for t in b.trajectories],
            failures=[f for b in batches for f in b.failures],
            success_threshold=batches[0].success_threshold,
        )
        counts = {
            "tasks_drawn": len(draws.tasks),
            "informative_groups": draws.informative,
            "draws": draws.draws,
            "flat_skipped_tasks": draws.retired_skipped,
        }
        return [train_tasks[i] for i in draws.tasks], merged, counts

    def _task_signal(self, trajectories: Sequence[Trajectory], adapters: AdapterSet | None) -> dict[str, bool]:
        """Whether each task's group gives GRPO a signal, judged as training will judge it: over all transitions, or
        with ``adapters`` within each trained policy's transitions (a signal in any of them counts)."""
        if adapters is None:
            return informative_tasks(trajectories, self.config.grpo)
        parts = split_by_policy(trajectories, adapters.models())
        signal: dict[str, bool] = {}
        for agent in adapters.updaters:
            for key, informative in informative_tasks(parts[agent], self.config.grpo).items():
                signal[key] = signal.get(key, False) or informative
        return signal

    def _policy_advantages(
        self, trajectories: Sequence[Trajectory], adapters: AdapterSet
    ) -> tuple[dict[str | None, list[Transition]], AdvantageStats, dict[str, Any]]:
        """Split by policy, check each policy ran on one version (its current one: no round mixes versions of an
        adapter), and compute GRPO advantages within each policy's groups. Returns the transitions to train per agent,
        the summed advantage stats, and per-policy counts for the metrics row (``base_transitions``: calls served by
        the base model, not trained)."""
        parts = split_by_policy(trajectories, adapters.models())
        expected: dict[str | None, str] = {None: BASE_VERSION}
        expected.update(adapters.versions)
        for key, part in parts.items():
            try:
                check_single_version(part, expected[key])
            except RuntimeError as exc:
                raise RuntimeError(f"{'the base model' if key is None else f'policy {key!r}'}: {exc}") from None
        kept_by: dict[str | None, list[Transition]] = {}
        stats: list[AdvantageStats] = []
        extra: dict[str, Any] = {"base_transitions": count_transitions(parts[None])}
        for agent in adapters.updaters:
            kept, adv = grpo_advantages(parts[agent], self.config.grpo)
            kept_by[agent] = kept
            stats.append(adv)
            extra[f"policy/{agent}/weights_version"] = adapters.versions[agent]
            extra[f"policy/{agent}/transitions"] = adv.transitions
            extra[f"policy/{agent}/trained_transitions"] = adv.kept_transitions
        total = AdvantageStats(
            groups=sum(s.groups for s in stats),
            skipped_groups=sum(s.skipped_groups for s in stats),
            transitions=sum(s.transitions for s in stats),
            kept_transitions=sum(s.kept_transitions for s in stats),
            zero_variance_groups=sum(s.zero_variance_groups for s in stats),
            tie_break_groups=sum(s.tie_break_groups for s in stats),
        )
        return kept_by, total, extra

    def _update_adapters(
        self, adapters: AdapterSet, kept_by: dict[str | None, list[Transition]], rng: random.Random, version: str
    ) -> dict[str, dict[str, float]]:
        """Update each agent's adapter from that agent's kept transitions only and mark it ``version``; agents with
        nothing to train on keep their weights and version. Returns the update metrics by agent."""
        updated: dict[str, dict[str, float]] = {}
        for agent, updater in adapters.updaters.items():
            kept = kept_by.get(agent) or []
            if kept:
                updated[agent] = self._update(updater, kept, rng)
                adapters.versions[agent] = version
        return updated

    def _update(self, updater: PolicyUpdater, kept: list[Any], rng: random.Random) -> dict[str, float]:
        """``epochs`` passes of ``mini_batches`` optimizer steps; metrics averaged over steps (tokens summed)."""
        steps: list[dict[str, float]] = []
        for _ in range(self.config.epochs):
            order = list(kept)
            if self.config.mini_batches > 1:
                rng.shuffle(order)
            for chunk in split(order, self.config.mini_batches):
                steps.append(updater.step(chunk))
        mean = {k: sum(s[k] for s in steps) / len(steps) for k in _STEP_MEANS}
        tokens = sum(s["tokens"] for s in steps)
        seconds = sum(s["seconds"] for s in steps)
        kl = mean.pop("approx_kl")
        return {
            **mean,
            "kl": kl,
            "train_tokens": tokens,
            "tokens_per_s": tokens / seconds if seconds > 0 else 0.0,
            "optimizer_steps": len(steps),
        }

    # -- pieces ------------------------------------------------------------------------------------------------------

    def _backend(self, version: str) -> PolicyBackend:
        from agl.trainers.rl.backend import LocalBackend, VllmBackend

        cfg = self.config
        if cfg.backend == "vllm":
            return VllmBackend(
                Path(cfg.model_dir),
                version=version,
                lora=cfg.lora or bool(cfg.policies),
                max_lora_rank=cfg.lora_r,
                max_loras=len(cfg.policies) or None,  # every agent's adapter can decode in one batch
                config=cfg.vllm,
            )
        return LocalBackend(
            Path(cfg.model_dir),
            model_name=cfg.model_name,
            seed=cfg.seed,
            max_batch_size=cfg.max_batch_size,
            version=version,
        )

    def _publish(
        self, ctx: TrainContext, backend: PolicyBackend, state: _State, adapters: AdapterSet | None
    ) -> ResourceSet:
        """Publish the LLM and ModelWeights resources, keeping every other resource of the latest version.

        With ``adapters`` the LLM resource names the untrained base model and routes each listed agent to its
        adapter at its current version (all adapters in this one publish); ``ModelWeights.path`` is then the
        folder of the adapters and their ``manifest.json``."""
        cfg = self.config
        trained = state.version_index > 0
        return ctx.publish_changes(
            {
                cfg.llm_resource: LLM(
                    base_url=backend.base_url,
                    model=backend.model,
                    api_key=backend.api_key,
                    sampling={"temperature": cfg.temperature, "max_tokens": cfg.max_tokens},
                    weights_version=state.version if adapters is None else BASE_VERSION,
                    routes=adapters.routes() if adapters is not None else {},
                ),
                cfg.policy_resource: ModelWeights(
                    path=state.weights_path,
                    version=state.version,
                    base_model=str(cfg.model_dir) if trained or adapters is not None else None,
                    adapter=(cfg.lora and trained) or adapters is not None,
                ),
            }
        )

    def _validate(self, ctx: TrainContext, val_tasks: Sequence[Any] | None, resources: ResourceSet) -> dict[str, Any]:
        batch = ctx.rollouts(list(val_tasks or []), mode="val", resources_version=resources.version, desc="rl val")
        summary = batch.summary
        return {"val/mean_reward": summary["mean_reward"], "val/success_rate": summary["success_rate"]}

    def _record(self, ctx: TrainContext, state: _State, row: dict[str, Any]) -> None:
        state.history.append(row)
        ctx.log_metrics(int(row["round"]), row)
        if int(row["round"]) > 0:
            print(console_line(row, self.config.rounds), file=sys.stderr, flush=True)
        write_metrics(ctx.run_dir, state.history)

    def _checkpoint_state(
        self, updater: PolicyUpdater | None, adapters: AdapterSet | None, rng: random.Random, state: _State
    ) -> dict[str, Any]:
        import torch

        return {
            "round": state.round,
            "version_index": state.version_index,
            "weights_path": state.weights_path,
            "history": state.history,
            "tasks": history_state(state.tasks),
            "optimizer": updater.optimizer_state() if updater is not None else None,
            "optimizers": adapters.optimizer_states() if adapters is not None else {},
            "python_rng": rng.getstate(),
            "torch_rng": torch.get_rng_state(),
        }

    def _resume(
        self,
        root: Path,
        updater: PolicyUpdater | None,
        adapters: AdapterSet | None,
        rng: random.Random,
        state: _State,
    ) -> Path | None:
        """Restore weights (every adapter, with ``policies``), optimizers, RNGs and history from ``resume_from``;
        returns the folder (None = fresh)."""
        import torch

        from agl.trainers.rl import checkpoint

        spec = self.config.resume_from
        if spec is None:
            return None
        folder = checkpoint.latest_checkpoint(root) if str(spec) == "latest" else Path(spec)
        if folder is None:
            raise FileNotFoundError(f"resume_from='latest': no resumable checkpoint under {root}")
        saved = checkpoint.load_state(folder)
        if adapters is not None:
            adapters.load(folder / checkpoint.POLICIES_DIR)
            adapters.load_optimizer_states(saved.get("optimizers") or {})
        elif updater is not None:
            updater.load(folder / checkpoint.POLICY_DIR)
            updater.load_optimizer_state(saved["optimizer"])
        rng.setstate(_as_rng_state(saved["python_rng"]))
        torch.set_rng_state(saved["torch_rng"])
        state.round = int(saved["round"])
        state.version_index = int(saved["version_index"])
        state.weights_path = str(saved["weights_path"])
        state.history = list(saved["history"])
        state.tasks = history_from_state(saved.get("tasks") or {})
        return folder


# -- pure helpers ----------------------------------------------------------------------------------------------------


def combine_updates(updates: dict[str, dict[str, float]]) -> dict[str, float]:
    """One round's update metrics over several adapters: token and step counts summed, throughput over the summed
    time, every other metric the mean over the adapters updated."""
    rows = list(updates.values())
    tokens = sum(r["train_tokens"] for r in rows)
    seconds = sum(r["train_tokens"] / r["tokens_per_s"] for r in rows if r["tokens_per_s"] > 0)
    out = {
        k: sum(r[k] for r in rows) / len(rows)
        for k in ("loss", "clip_fraction", "kl", "kl_ref", "entropy", "grad_norm")
    }
    out.update(
        train_tokens=tokens,
        tokens_per_s=tokens / seconds if seconds > 0 else 0.0,
        optimizer_steps=sum(r["optimizer_steps"] for r in rows),
    )
    return out


def sample_tasks(tasks: Sequence[Any], k: int | None, rng: random.Random) -> list[Any]:
    """``k`` tasks drawn without replacement (in their original order), or all of them when ``k`` is None or larger."""
    if k is None or k >= len(tasks):
        return list(tasks)
    return [tasks[i] for i in sorted(rng.sample(range(len(tasks)), k))]


def _all_retired(train_tasks: Sequence[Any], history: dict[str, TaskRecord]) -> bool:
    """Whether dynamic sampling has no task left to draw: every training task was flat twice."""
    from agl.core.trainer import task_id_of

    ids = {task_id_of(task) for task in train_tasks}
    return retired_tasks(list(ids), history) == len(ids)


def split(items: Sequence[Any], parts: int) -> list[list[Any]]:
    """``items`` in ``parts`` contiguous chunks of near-equal size (no empty chunks)."""
    parts = max(1, min(parts, len(items)))
    size, extra = divmod(len(items), parts)
    out, start = [], 0
    for i in range(parts):
        end = start + size + (1 if i < extra else 0)
        out.append(list(items[start:end]))
        start = end
    return out


def check_single_version(trajectories: Sequence[Trajectory], expected: str | None) -> str | None:
    """The weights version every transition of a round reports; raises if they differ or differ from ``expected``."""
    versions = {t.weights_version for tr in trajectories for t in tr.transitions}
    if len(versions) > 1:
        raise RuntimeError(
            f"rollouts of one round ran on several weight versions {sorted(map(str, versions))}: weights must only "
            "change between rounds"
        )
    served = next(iter(versions)) if versions else None
    if expected is not None and versions and served != expected:
        raise RuntimeError(f"rollouts ran on weights {served!r}, but the round was meant to use {expected!r}")
    return served


def _as_rng_state(value: Any) -> tuple[Any, ...]:
    version, internal, gauss = value
    return (version, tuple(internal), gauss)


class _RoundBar:
    """A one-line progress display over rounds (tqdm on stderr) showing the latest reward and KL."""

    def __init__(self, total: int, done: int, enabled: bool) -> None:
        self._bar: Any = None
        if enabled:
            from tqdm.auto import tqdm

            self._bar = tqdm(total=total, initial=done, desc="LightningRL", unit="round", file=sys.stderr)

    def update(self, row: dict[str, Any]) -> None:
        if self._bar is None:
            return
        shown = {k: row[k] for k in ("mean_reward", "kl", "clip_fraction") if k in row}
        self._bar.set_postfix({k: f"{v:.3g}" for k, v in shown.items() if not math.isnan(v)})
        self._bar.update(1)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
