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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from agl.core.algorithm import Algorithm
from agl.core.types import ResourceSet, Span, Trajectory, Transition
from agl.serving.vllm import VllmConfig
from agl.trainers._weights import BASE_VERSION, publish, validate
from agl.trainers.config import SERVING_FIELDS, ServingConfig, moved_fields, resolve_lora
from agl.trainers.rl._report import console_line, round_diagnostics, write_metrics
from agl.trainers.rl.air import AirRules
from agl.trainers.rl.credit import CreditMode, assign_all
from agl.trainers.rl.grpo import AdvantageStats, GRPOConfig, group_key, grpo_advantages, informative_tasks
from agl.trainers.rl.policies import count_transitions, validate_policies
from agl.trainers.rl.sampling import (
    GroupOutcome,
    TaskRecord,
    draw_round,
    history_from_state,
    history_state,
    retired_tasks,
)
from agl.trainers.rl.update_config import UpdateConfig

if TYPE_CHECKING:
    from agl.core.context import RolloutBatch, TrainContext
    from agl.trainers.rl.backend import PolicyBackend
    from agl.trainers.rl.distributed import UpdateGroup
    from agl.trainers.rl.policies import PolicySet
    from agl.trainers.rl.update import PolicyUpdater

log = logging.getLogger("agl.trainers.rl")

#: Step metrics a round reports as their mean over its optimizer steps (``approx_kl`` is reported as ``kl``).
_STEP_MEANS = ("loss", "clip_fraction", "approx_kl", "kl_ref", "entropy", "grad_norm")


#: Fields that moved into the nested configs, accepted under their old names until agl 0.3 (``moved_fields``).
MOVED_RL_FIELDS = {
    **{name: f"serving.{name}" for name in SERVING_FIELDS},
    **{
        name: f"update.{name}"
        for name in ("lr", "max_grad_norm", "micro_batch_tokens", "max_length", "device", "mixed_precision")
    },
    "measure_kl_ref": "update.measure_kl_ref",
    **{name: f"update.loss.{name}" for name in ("clip_low", "clip_high", "aggregation", "kl_beta")},
    "lora_r": "update.lora.r",
    "lora_alpha": "update.lora.alpha",
}


@moved_fields(MOVED_RL_FIELDS)
@dataclass
class LightningRLConfig:
    """Everything LightningRL does is set here. Only ``model_dir`` is required.

    Policy and serving:
        model_dir: ``save_pretrained`` folder of the model to train (e.g. ``agl.serving.prepare_smollm2()``).
        serving: the published resources' names, the local server's model name and batch size, and the default
            sampling (``agl.trainers.config.ServingConfig``). Keep ``serving.temperature`` near 1: lower values make
            groups agree and leave GRPO no signal. The loss scores each call at the temperature it was sent with
            (recorded on its ``llm`` span), the distribution its tokens and behaviour log-probs come from;
            ``serving.temperature`` stands in for calls that recorded none. Greedy calls (temperature 0) are scored
            at temperature 1, as the servers report them, and counted per round in ``greedy_transitions``. Leave
            top-p/top-k off: the loss does not model them.
        backend: ``"local"`` (default: ``agl.serving.PolicyServer`` in this process, CPU, hot swap in memory) or
            ``"vllm"`` (agl launches vLLM on ``model_dir``; LoRA rounds are loaded live, full weights restart it —
            see ``backend.py``; needs ``pip install agl[vllm]`` on a GPU, or vLLM's CPU build, see ``vllm``).
        vllm: how vLLM is launched with ``backend="vllm"`` (``agl.serving.VllmConfig``: the interpreter that has it,
            e.g. ``.venv-vllm/bin/python`` made by ``scripts/vllm_cpu.sh``, GPU or CPU, memory, extra arguments).
        policies: one policy per agent, e.g. ``{"writer": "lora", "rewriter": "lora"}``: each listed agent trains a
            LoRA adapter of its own (``update.lora``, default ``LoraConfig()``; only ``"lora"`` exists) served as model
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
        update: the optimizer, the loss, LoRA or full weights, memory and device (``UpdateConfig``; its ``lr``
            defaults to 1e-5 for full weights of a ~100M model, ~1e-4 suits LoRA). ``measure_kl_ref`` reports
            ``kl_ref`` (approximate KL to the start policy) every round.
        epochs: passes over a round's transitions. Default 1; 2-4 reuse expensive rollouts more (clipping bounds it).
        mini_batches: optimizer steps per epoch (transitions are shuffled and split). Default 1.

    Validation, checkpoints, resume:
        val_every: validate on ``val_tasks`` before training and every k rounds (and after the last). 0 = never.
        checkpoint_dir: where round folders go (default ``run_dir/rl_checkpoints``).
        checkpoint_every: add the resumable trainer state every k rounds (and after the last). Default 1.
        keep_checkpoints: round folders kept (oldest removed; the newest and the newest resumable stay). Default 2;
            None keeps all (full weights of a 135M model are ~0.5 GB per round).
        resume_from: a round folder, or ``"latest"`` (newest resumable folder under ``checkpoint_dir``), or None.
    """

    model_dir: str | Path
    serving: ServingConfig = field(default_factory=ServingConfig)
    backend: Literal["local", "vllm"] = "local"
    vllm: VllmConfig = field(default_factory=VllmConfig)
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
    update: UpdateConfig = field(default_factory=UpdateConfig)
    epochs: int = 1
    mini_batches: int = 1
    val_every: int = 0
    checkpoint_dir: str | Path | None = None
    checkpoint_every: int = 1
    keep_checkpoints: int | None = 2
    resume_from: str | Path | None = None

    def __post_init__(self) -> None:
        for name in ("rounds", "group_size", "epochs", "mini_batches", "checkpoint_every"):
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
        validate_policies(self.policies)
        # LoRA by default for a large model on a CPU (``AutoLora``), decided here, where the model is known
        self.update = replace(self.update, lora=resolve_lora(self.update.lora, self.model_dir, self.update.device))


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

        cfg = LightningRLConfig(model_dir=agl.serving.prepare_smollm2(), rounds=5, group_size=8)
        agl.Trainer(algorithm=LightningRL(cfg), n_runners=4).fit(my_agent, train_tasks, val_tasks)

    The agent calls the model through ``resources[cfg.serving.llm_resource]`` (an ``LLM``: base_url, model,
    sampling) and returns its final reward. Metrics per round go to ``ctx.log_metrics`` and
    ``run_dir/rl_metrics.{csv,json}``.
    """

    requires_token_ids: ClassVar[bool] = True

    def __init__(self, config: LightningRLConfig) -> None:
        self.config = config

    def air(self, span: Span) -> float | None:
        """Delegates to the configured AIR rules."""
        return self.config.air(span)

    def follows(self) -> bool:
        """With ``update.strategy="ddp"``, every rank but 0: it builds the same policies and takes part in each
        update step rank 0 leads (``agl.trainers.rl.distributed``)."""
        from agl.trainers.rl.distributed import env_rank

        return self.config.update.strategy == "ddp" and env_rank() > 0

    def follow(self) -> dict[str, Any]:
        """A follower rank's fit: the policies built as rank 0 builds them, then every step and state broadcast
        rank 0 leads, until its fit ends."""
        import torch

        from agl.trainers.rl.distributed import UpdateGroup, follow
        from agl.trainers.rl.policies import PolicySet

        cfg = self.config
        torch.manual_seed(cfg.seed)
        group = UpdateGroup.join()
        policies = PolicySet(
            cfg.model_dir, list(cfg.policies), cfg.update, cfg.serving.model_name, cfg.serving.temperature
        )
        steps = follow(group, policies.updaters)
        return {"rank": group.rank, "world_size": group.world, "optimizer_steps": steps}

    # -- the loop ----------------------------------------------------------------------------------------------------

    def fit(self, ctx: TrainContext, train_tasks: Sequence[Any], val_tasks: Sequence[Any] | None) -> dict[str, Any]:
        import torch

        from agl.trainers.rl.policies import PolicySet

        cfg = self.config
        if not train_tasks:
            raise ValueError("LightningRL.fit: no training tasks")
        rng = random.Random(cfg.seed)
        torch.manual_seed(cfg.seed)
        policies = PolicySet(
            cfg.model_dir, list(cfg.policies), cfg.update, cfg.serving.model_name, cfg.serving.temperature
        )
        group = self._update_group()
        try:
            return self._fit(ctx, train_tasks, val_tasks, rng, policies)
        finally:
            if group is not None:
                group.stop()

    def _fit(
        self,
        ctx: TrainContext,
        train_tasks: Sequence[Any],
        val_tasks: Sequence[Any] | None,
        rng: random.Random,
        policies: PolicySet,
    ) -> dict[str, Any]:
        from agl.trainers.rl import checkpoint
        from agl.trainers.rl.backend import LocalBackend

        cfg = self.config
        root = Path(cfg.checkpoint_dir) if cfg.checkpoint_dir is not None else ctx.run_dir / "rl_checkpoints"
        state = _State(weights_path=str(cfg.model_dir))
        resumed = self._resume(root, policies, rng, state)
        backend = self._backend(BASE_VERSION if policies.per_agent else state.version)
        backend.start()
        frozen = policies.updaters[None].frozen_base() if None in policies.updaters else None
        if frozen is not None and isinstance(backend, LocalBackend):
            backend.share_base(frozen)  # one copy of the base model for the LoRA updater and the server
        bar = _RoundBar(cfg.rounds, state.round, getattr(ctx.trainer, "progress", True))
        try:
            if resumed is not None:
                policies.sync(backend, resumed)
            elif policies.per_agent:  # the fresh adapters (identity) are served too, so every route exists at once
                state.weights_path = str(policies.save(checkpoint.round_dir(root, 0)))
                policies.sync(backend, checkpoint.round_dir(root, 0))
            resources = self._publish(ctx, backend, state, policies)
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
                row, resources = self._round(ctx, train_tasks, rng, policies, backend, resources, state, root)
                slowest = max(slowest, row["seconds"])
                last = state.round == cfg.rounds
                if validate and (state.round % cfg.val_every == 0 or last):
                    row.update(self._validate(ctx, val_tasks, resources))
                self._record(ctx, state, row)
                if state.round % cfg.checkpoint_every == 0 or last:
                    folder = checkpoint.round_dir(root, state.round)
                    if not policies.saved(folder):
                        state.weights_path = str(policies.save(folder))
                    checkpoint.save_state(folder, self._checkpoint_state(policies, rng, state))
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
        policies: PolicySet,
        backend: PolicyBackend,
        resources: ResourceSet,
        state: _State,
        root: Path,
    ) -> tuple[dict[str, Any], ResourceSet]:
        """One round: rollouts (one batch, or with ``min_informative_groups`` as many as ``_draw`` needs) → credit →
        advantages → update → swap → publish. Returns its metrics row.

        The transitions are split by policy first; each policy is updated from its own transitions only, every
        updated policy gets the round's new version, and one publish carries them all."""
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
            tasks, batch, drawn = self._draw(ctx, train_tasks, rng, policies, resources, state)
        rollout_seconds = time.perf_counter() - started
        trajectories = batch.usable
        assign_all(trajectories, cfg.credit, cfg.gamma)
        kept_by, adv, extra = self._advantages(trajectories, policies)
        summary = batch.summary
        row: dict[str, Any] = {
            "round": number,
            "weights_version": state.version,
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
            backend.before_update()
            updated = self._update_members(policies, kept_by, rng, state.version)
            row.update(combine_updates(updated))
            if policies.per_agent:
                for agent, metrics in updated.items():
                    row[f"policy/{agent}/loss"] = metrics["loss"]
                    row[f"policy/{agent}/kl"] = metrics["kl"]
            folder = checkpoint.round_dir(root, number)
            state.weights_path = str(policies.save(folder))
            sync_started = time.perf_counter()
            policies.sync(backend, folder, members=list(updated))
            row["sync_seconds"] = time.perf_counter() - sync_started
            row["weight_sync"] = backend.last_sync
            resources = self._publish(ctx, backend, state, policies)
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
        policies: PolicySet,
        resources: ResourceSet,
        state: _State,
    ) -> tuple[list[Any], RolloutBatch, dict[str, Any]]:
        """Dynamic sampling (``sampling.draw_round``): batches of tasks on the round's resources until enough groups
        are informative. Returns the tasks drawn, every draw's rollouts as one batch (returns assigned), and the
        round's sampling counts for its metrics row; ``state.tasks`` learns every group's outcome."""
        from agl.core.context import RolloutBatch, task_id_of

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
            signal = self._task_signal(usable, policies)
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

    def _task_signal(self, trajectories: Sequence[Trajectory], policies: PolicySet) -> dict[str, bool]:
        """Whether each task's group gives GRPO a signal, judged as training will judge it: within each trained
        policy's transitions (a signal in any of them counts)."""
        parts = policies.split(trajectories)
        signal: dict[str, bool] = {}
        for member in policies.updaters:
            for key, informative in informative_tasks(parts[member], self.config.grpo).items():
                signal[key] = signal.get(key, False) or informative
        return signal

    def _advantages(
        self, trajectories: Sequence[Trajectory], policies: PolicySet
    ) -> tuple[dict[str | None, list[Transition]], AdvantageStats, dict[str, Any]]:
        """Split by policy, check each policy ran on one version (its current one: no round mixes versions of a
        policy), and compute GRPO advantages within each policy's groups. Returns the transitions to train per
        member, the summed advantage stats, and with per-agent policies their counts for the metrics row
        (``base_transitions``: calls served by the base model, not trained)."""
        parts = policies.split(trajectories)
        expected = policies.expected_versions()
        for key, part in parts.items():
            try:
                check_single_version(part, expected[key])
            except RuntimeError as exc:
                if not policies.per_agent:
                    raise
                raise RuntimeError(f"{'the base model' if key is None else f'policy {key!r}'}: {exc}") from None
        kept_by: dict[str | None, list[Transition]] = {}
        stats: list[AdvantageStats] = []
        extra: dict[str, Any] = {"base_transitions": count_transitions(parts[None])} if policies.per_agent else {}
        for member in policies.updaters:
            kept, adv = grpo_advantages(parts[member], self.config.grpo)
            kept_by[member] = kept
            stats.append(adv)
            if member is not None:
                extra[f"policy/{member}/weights_version"] = policies.versions[member]
                extra[f"policy/{member}/transitions"] = adv.transitions
                extra[f"policy/{member}/trained_transitions"] = adv.kept_transitions
        total = AdvantageStats(
            groups=sum(s.groups for s in stats),
            skipped_groups=sum(s.skipped_groups for s in stats),
            transitions=sum(s.transitions for s in stats),
            kept_transitions=sum(s.kept_transitions for s in stats),
            zero_variance_groups=sum(s.zero_variance_groups for s in stats),
            tie_break_groups=sum(s.tie_break_groups for s in stats),
        )
        return kept_by, total, extra

    def _update_members(
        self, policies: PolicySet, kept_by: dict[str | None, list[Transition]], rng: random.Random, version: str
    ) -> dict[str | None, dict[str, float]]:
        """Update each policy from its own kept transitions only and mark it ``version``; policies with nothing to
        train on keep their weights and version. Returns the update metrics by member."""
        updated: dict[str | None, dict[str, float]] = {}
        for member, updater in policies.updaters.items():
            kept = kept_by.get(member) or []
            if kept:
                updated[member] = self._update(updater, kept, rng)
                policies.versions[member] = version
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
            "negative_skipped": sum(s["negative_skipped"] for s in steps),
        }

    # -- pieces ------------------------------------------------------------------------------------------------------

    def _update_group(self) -> UpdateGroup | None:
        """Rank 0's process group of a distributed update (None for one process; formed by the policies' updaters);
        its world must fit a round. The caller stops the followers once fit ends, however it ends."""
        if self.config.update.strategy != "ddp":
            return None
        from agl.trainers.rl.distributed import UpdateGroup

        group = UpdateGroup.join()
        per_round = (self.config.tasks_per_round or 1) * self.config.group_size
        if group.world > per_round:
            raise ValueError(
                f"update.strategy='ddp' on {group.world} ranks: a round of {per_round} rollouts cannot give every rank "
                "a call to train on; run fewer ranks or more rollouts per round (tasks_per_round, group_size)"
            )
        log.info("distributed update: rank 0 of %d leads", group.world)
        return group

    def _backend(self, version: str) -> PolicyBackend:
        from agl.trainers.config import LoraConfig
        from agl.trainers.rl.backend import LocalBackend, VllmBackend

        cfg = self.config
        if cfg.backend == "vllm":
            return VllmBackend(
                Path(cfg.model_dir),
                version=version,
                lora=cfg.update.lora is not None or bool(cfg.policies),
                max_lora_rank=(cfg.update.lora or LoraConfig()).r,
                max_loras=len(cfg.policies) or None,  # every agent's adapter can decode in one batch
                config=cfg.vllm,
            )
        return LocalBackend(
            Path(cfg.model_dir),
            model_name=cfg.serving.model_name,
            seed=cfg.seed,
            max_batch_size=cfg.serving.max_batch_size,
            version=version,
        )

    def _publish(self, ctx: TrainContext, backend: PolicyBackend, state: _State, policies: PolicySet) -> ResourceSet:
        """Publish the LLM and ModelWeights resources (``_weights.publish``): with per-agent policies every adapter's
        route at its current version, in this one publish."""
        cfg = self.config
        trained = state.version_index > 0 or policies.per_agent
        return publish(
            ctx,
            cfg.serving,
            backend,
            model_dir=cfg.model_dir,
            version=state.version,
            path=state.weights_path if trained else None,
            routes=policies.routes(),
            lora=cfg.update.lora is not None,
        )

    def _validate(self, ctx: TrainContext, val_tasks: Sequence[Any] | None, resources: ResourceSet) -> dict[str, Any]:
        return validate(ctx, val_tasks, resources, "rl val")

    def _record(self, ctx: TrainContext, state: _State, row: dict[str, Any]) -> None:
        state.history.append(row)
        ctx.log_metrics(int(row["round"]), row)
        if int(row["round"]) > 0:
            print(console_line(row, self.config.rounds), file=sys.stderr, flush=True)
        write_metrics(ctx.run_dir, state.history)

    def _checkpoint_state(self, policies: PolicySet, rng: random.Random, state: _State) -> dict[str, Any]:
        import torch

        return {
            "round": state.round,
            "version_index": state.version_index,
            "weights_path": state.weights_path,
            "history": state.history,
            "tasks": history_state(state.tasks),
            "optimizers": policies.optimizer_states(),
            "python_rng": rng.getstate(),
            "torch_rng": torch.get_rng_state(),
        }

    def _resume(self, root: Path, policies: PolicySet, rng: random.Random, state: _State) -> Path | None:
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
        state.round = int(saved["round"])
        state.version_index = int(saved["version_index"])
        policies.load(folder, state.version)
        policies.load_optimizer_states(saved.get("optimizers") or {})
        rng.setstate(_as_rng_state(saved["python_rng"]))
        torch.set_rng_state(saved["torch_rng"])
        state.weights_path = str(saved["weights_path"])
        state.history = list(saved["history"])
        state.tasks = history_from_state(saved.get("tasks") or {})
        return folder


# -- pure helpers ----------------------------------------------------------------------------------------------------


def combine_updates(updates: Mapping[str | None, dict[str, float]]) -> dict[str, float]:
    """One round's update metrics over the policies it updated: token, step and skipped-call counts summed,
    throughput over the summed time, every other metric the mean over the policies (one policy's metrics are its
    own)."""
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
        negative_skipped=sum(r["negative_skipped"] for r in rows),
    )
    return out


def sample_tasks(tasks: Sequence[Any], k: int | None, rng: random.Random) -> list[Any]:
    """``k`` tasks drawn without replacement (in their original order), or all of them when ``k`` is None or larger."""
    if k is None or k >= len(tasks):
        return list(tasks)
    return [tasks[i] for i in sorted(rng.sample(range(len(tasks)), k))]


def _all_retired(train_tasks: Sequence[Any], history: dict[str, TaskRecord]) -> bool:
    """Whether dynamic sampling has no task left to draw: every training task was flat twice."""
    from agl.core.context import task_id_of

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
