"""SFT: supervised fine-tuning of the served policy on its own selected rollouts (rejection-sampling fine-tuning).

A round: run every training task ``samples_per_task`` times on the current weights → keep the rollouts the selection
rules accept → fine-tune on their LLM calls (exact token ids, loss on responses) → load the new weights into the
local ``PolicyServer`` as the next version → publish resources pointing at it. Weights change only between rounds.
One thread drives everything; rollouts run in the Trainer's runner processes.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from agl.core.algorithm import Algorithm
from agl.core.types import LLM, ModelWeights, ResourceSet
from agl.trainers.sft.config import SFTConfig
from agl.trainers.sft.data import build_samples, select_trajectories

if TYPE_CHECKING:
    from agl.core.trainer import TrainContext
    from agl.serving.policy_server import PolicyServer


class SFT(Algorithm):
    """Rejection-sampling fine-tuning of a local policy on the agent's successful rollouts.

    Example::

        cfg = SFTConfig(model_dir=agl.serving.prepare_smollm2(), rft_rounds=2, samples_per_task=8, lr=1e-5)
        agl.Trainer(algorithm=SFT(cfg), n_runners=4).fit(my_agent, train_tasks, val_tasks)

    The agent calls the model through ``resources[cfg.llm_resource]`` (an ``LLM``: base_url, model, sampling) and
    returns its final reward. Metrics per round go to ``ctx.log_metrics``; weights to ``output_dir/round-NNNN``.
    """

    requires_token_ids: ClassVar[bool] = True
    #: Stored (imported) rollouts without token ids are still usable offline: ``sft_on_trajectories`` renders their
    #: messages with the model's chat template (text-derived samples); live rollouts must carry token ids.
    trains_on_text: ClassVar[bool] = True

    def __init__(self, config: SFTConfig) -> None:
        self.config = config

    def fit(self, ctx: TrainContext, train_tasks: Sequence[Any], val_tasks: Sequence[Any] | None) -> dict[str, Any]:
        from agl.serving.policy_server import PolicyServer

        cfg = self.config
        if not train_tasks:
            raise ValueError("SFT.fit: no training tasks")
        root = Path(cfg.output_dir) if cfg.output_dir is not None else ctx.run_dir / "sft"
        server = PolicyServer(
            cfg.model_dir,
            model_name=cfg.model_name,
            seed=cfg.seed,
            max_batch_size=cfg.max_batch_size,
            weights_version="v0",
            api_key=secrets.token_urlsafe(32),
        ).start()
        validate = bool(val_tasks) and cfg.val_every > 0
        weights_path: Path | None = None
        row: dict[str, Any] = {}
        try:
            resources = self._publish(ctx, server, weights_path)
            if validate:
                row = {"round": 0, "weights_version": server.weights_version}
                row.update(self._validate(ctx, val_tasks, resources))
                ctx.log_metrics(0, row)
            for number in range(1, cfg.rft_rounds + 1):
                row, weights_path, resources = self._round(
                    ctx, train_tasks, number, root, server, weights_path, resources
                )
                if validate and (number % cfg.val_every == 0 or number == cfg.rft_rounds):
                    row.update(self._validate(ctx, val_tasks, resources))
                ctx.log_metrics(number, row)
        finally:
            server.stop()
        return {**row, "weights_version": server.weights_version, "weights_path": str(weights_path or cfg.model_dir)}

    def _round(
        self,
        ctx: TrainContext,
        train_tasks: Sequence[Any],
        number: int,
        root: Path,
        server: PolicyServer,
        weights_path: Path | None,
        resources: ResourceSet,
    ) -> tuple[dict[str, Any], Path | None, ResourceSet]:
        """Sample → select → train → serve → publish; returns the round's metrics, weights folder and resources."""
        from agl.trainers.sft.train import train_samples

        cfg = self.config
        batch = ctx.rollouts(
            train_tasks,
            mode="train",
            n=cfg.samples_per_task,
            resources_version=resources.version,
            desc=f"sft round {number}/{cfg.rft_rounds}",
        )
        selected = select_trajectories(
            batch.usable,
            successful_only=cfg.successful_only,
            min_reward=cfg.min_reward,
            top_k_per_task=cfg.top_k_per_task,
        )
        samples = build_samples(selected, cfg.max_length)
        summary = batch.summary
        row: dict[str, Any] = {
            "round": number,
            "sampled_on": server.weights_version,
            "mean_reward": summary["mean_reward"],
            "success_rate": summary["success_rate"],
            "rollouts": summary["rollouts"],
            "selected_rollouts": len(selected),
        }
        if samples:
            result = train_samples(samples, cfg, root / f"round-{number:04d}", init_from=weights_path)
            weights_path = result.path
            server.load_weights(weights_path, f"v{number}")
            resources = self._publish(ctx, server, weights_path)
            row.update(result.metrics)
        row["weights_version"] = server.weights_version
        return row, weights_path, resources

    def _publish(self, ctx: TrainContext, server: PolicyServer, weights_path: Path | None) -> ResourceSet:
        """Publish the LLM and ModelWeights resources, keeping every other resource of the latest version."""
        cfg = self.config
        trained = weights_path is not None
        return ctx.publish_changes(
            {
                cfg.llm_resource: LLM(
                    base_url=server.base_url,
                    model=server.model_name,
                    api_key=server.api_key or "agl",
                    sampling={"temperature": cfg.temperature, "max_tokens": cfg.max_tokens},
                    weights_version=server.weights_version,
                ),
                cfg.policy_resource: ModelWeights(
                    path=str(weights_path if trained else cfg.model_dir),
                    version=server.weights_version,
                    base_model=str(cfg.model_dir) if trained else None,
                    adapter=cfg.lora and trained,
                ),
            }
        )

    def _validate(self, ctx: TrainContext, val_tasks: Sequence[Any] | None, resources: ResourceSet) -> dict[str, Any]:
        batch = ctx.rollouts(list(val_tasks or []), mode="val", resources_version=resources.version, desc="sft val")
        summary = batch.summary
        return {"val/mean_reward": summary["mean_reward"], "val/success_rate": summary["success_rate"]}
