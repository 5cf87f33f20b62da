"""SFT: supervised fine-tuning of the served policy on its own selected rollouts (rejection-sampling fine-tuning).

A round: run every training task ``samples_per_task`` times on the current weights → keep the rollouts the selection
rules accept → fine-tune on their LLM calls (exact token ids, loss on responses) → load the new weights into the
local ``PolicyServer`` as the next version → publish resources pointing at it. Weights change only between rounds.
One thread drives everything; rollouts run in the Trainer's runner processes.

With ``policies`` each listed agent has a LoRA adapter of its own (served as ``f"{model_name}/{agent}"``, routed by
the published ``LLM.routes``): a round fine-tunes each adapter on the selected calls it served, loads the trained ones
into the server under the round's version and publishes every adapter's version in one resource set; the folders
are ``round-NNNN/policies/<agent>`` with a ``manifest.json`` (``round-0000`` holds the fresh adapters).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from agl.core.algorithm import Algorithm
from agl.core.types import PolicyRoute, ResourceSet
from agl.trainers._weights import BASE_VERSION, publish, validate
from agl.trainers.sft.config import SFTConfig
from agl.trainers.sft.data import SFTSample, build_samples, select_trajectories

if TYPE_CHECKING:
    from agl.core.context import TrainContext
    from agl.trainers.rl.backend import LocalBackend


@dataclass
class _Adapters:
    """The per-agent adapters being served: each agent's current folder and version, and the manifest folder."""

    folders: dict[str, Path] = field(default_factory=dict)
    versions: dict[str, str] = field(default_factory=dict)
    #: The model name that reaches each agent's adapter, as the backend said when it loaded it.
    served: dict[str, str] = field(default_factory=dict)
    manifest_dir: Path | None = None
    #: The version of the latest round that trained any adapter (what ``ModelWeights.version`` reports).
    version: str = BASE_VERSION


class SFT(Algorithm):
    """Rejection-sampling fine-tuning of a local policy on the agent's successful rollouts.

    Example::

        cfg = SFTConfig(model_dir=agl.serving.prepare_smollm2(), rft_rounds=2, samples_per_task=8, lr=1e-5)
        agl.Trainer(algorithm=SFT(cfg), n_runners=4).fit(my_agent, train_tasks, val_tasks)

    The agent calls the model through ``resources[cfg.serving.llm_resource]`` (an ``LLM``: base_url, model,
    sampling) and returns its final reward. Metrics per round go to ``ctx.log_metrics``; weights to
    ``output_dir/round-NNNN``.
    """

    requires_token_ids: ClassVar[bool] = True
    #: Stored (imported) rollouts without token ids are still usable offline: ``sft_on_trajectories`` renders their
    #: messages with the model's chat template (text-derived samples); live rollouts must carry token ids.
    trains_on_text: ClassVar[bool] = True

    def __init__(self, config: SFTConfig, extra_samples: Sequence[SFTSample] = ()) -> None:
        """``extra_samples`` join every round's selected samples (single policy only): e.g. the demonstrations a warm
        start was trained on, so rejection sampling adds the policy's own successes without drifting from them."""
        if extra_samples and config.policies:
            raise ValueError("extra_samples: only a single policy takes extra samples (config.policies is set)")
        self.config = config
        self.extra_samples = list(extra_samples)
        self._adapters = _Adapters()
        self._selected_so_far: list[SFTSample] = []  # with ``retrain_from_start``

    def fit(self, ctx: TrainContext, train_tasks: Sequence[Any], val_tasks: Sequence[Any] | None) -> dict[str, Any]:
        from agl.trainers.rl.backend import LocalBackend

        cfg = self.config
        if not train_tasks:
            raise ValueError("SFT.fit: no training tasks")
        root = Path(cfg.output_dir) if cfg.output_dir is not None else ctx.run_dir / "sft"
        backend = LocalBackend(
            Path(cfg.model_dir),
            model_name=cfg.serving.model_name,
            seed=cfg.seed,
            max_batch_size=cfg.serving.max_batch_size,
            version=BASE_VERSION,
        )
        backend.start()
        server = backend.server
        validating = bool(val_tasks) and cfg.val_every > 0
        weights_path: Path | None = None
        row: dict[str, Any] = {}
        self._adapters = _Adapters()
        self._selected_so_far = []
        try:
            if cfg.policies:
                self._start_adapters(backend, root / "round-0000" / "policies")
                weights_path = self._adapters.manifest_dir
            resources = self._publish(ctx, backend, weights_path)
            if validating:
                row = {"round": 0, "weights_version": server.weights_version}
                row.update(validate(ctx, val_tasks, resources, "sft val"))
                ctx.log_metrics(0, row)
            for number in range(1, cfg.rft_rounds + 1):
                row, weights_path, resources = self._round(
                    ctx, train_tasks, number, root, backend, weights_path, resources
                )
                if validating and (number % cfg.val_every == 0 or number == cfg.rft_rounds):
                    row.update(validate(ctx, val_tasks, resources, "sft val"))
                ctx.log_metrics(number, row)
        finally:
            backend.stop()
        version = self._adapters.version if cfg.policies else server.weights_version
        return {**row, "weights_version": version, "weights_path": str(weights_path or cfg.model_dir)}

    def _round(
        self,
        ctx: TrainContext,
        train_tasks: Sequence[Any],
        number: int,
        root: Path,
        backend: LocalBackend,
        weights_path: Path | None,
        resources: ResourceSet,
    ) -> tuple[dict[str, Any], Path | None, ResourceSet]:
        """Sample → select → train → serve → publish; returns the round's metrics, weights folder and resources."""
        from agl.trainers.sft.train import train_samples

        cfg = self.config
        server = backend.server
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
        summary = batch.summary
        row: dict[str, Any] = {
            "round": number,
            "sampled_on": server.weights_version,
            "mean_reward": summary["mean_reward"],
            "success_rate": summary["success_rate"],
            "rollouts": summary["rollouts"],
            "selected_rollouts": len(selected),
        }
        if cfg.policies:
            weights_path, resources = self._train_adapters(ctx, backend, selected, root, number, row, resources)
            row["weights_version"] = self._adapters.version
            return row, weights_path, resources
        samples = build_samples(selected, cfg.max_length)
        row["selected_samples"], row["extra_samples"] = len(samples), len(self.extra_samples)
        init_from = weights_path
        if cfg.retrain_from_start:  # ReST-EM: every selection so far, trained from model_dir
            self._selected_so_far += samples
            samples, init_from = list(self._selected_so_far), None
            row["trained_from"], row["cumulative_samples"] = "start", len(samples)
        samples += self.extra_samples
        if samples:
            result = train_samples(samples, cfg, root / f"round-{number:04d}", init_from=init_from)
            weights_path = result.path
            server.load_weights(weights_path, f"v{number}")
            resources = self._publish(ctx, backend, weights_path)
            row.update(result.metrics)
        row["weights_version"] = server.weights_version
        return row, weights_path, resources

    def _start_adapters(self, backend: LocalBackend, folder: Path) -> None:
        """Save a fresh (identity) adapter per listed agent into ``folder`` and serve each at ``v0``, so every route
        exists before the first round."""
        from agl.trainers.rl.policies import adapter_folder, write_manifest
        from agl.trainers.sft.train import fresh_adapter

        cfg = self.config
        for agent in cfg.policies:
            path = fresh_adapter(cfg, folder / adapter_folder(agent))
            self._adapters.folders[agent], self._adapters.versions[agent] = path, BASE_VERSION
            self._adapters.served[agent] = backend.sync_adapter(agent, path, BASE_VERSION)
        write_manifest(folder, cfg.model_dir, self._adapters.versions, cfg.serving.model_name)
        self._adapters.manifest_dir = folder

    def _train_adapters(
        self,
        ctx: TrainContext,
        backend: LocalBackend,
        selected: Sequence[Any],
        root: Path,
        number: int,
        row: dict[str, Any],
        resources: ResourceSet,
    ) -> tuple[Path | None, ResourceSet]:
        """Per-agent round: each adapter trained on its own selected calls, the trained ones served under
        ``v<number>``, then one publish with every adapter's version. Adds per-policy figures to ``row``."""
        from agl.trainers.rl.policies import adapter_folder
        from agl.trainers.sft.train import train_policies

        state = self._adapters
        folder = root / f"round-{number:04d}" / "policies"
        models = {name: agent for agent, name in state.served.items()}
        results, base = train_policies(
            selected, self.config, folder, state.folders, state.versions, f"v{number}", models
        )
        row["base_transitions"] = base
        for agent in self.config.policies:
            state.folders[agent] = folder / adapter_folder(agent)
            row[f"policy/{agent}/weights_version"] = state.versions[agent]
            row[f"policy/{agent}/samples"] = results[agent].metrics["samples"] if agent in results else 0
        for agent, result in results.items():
            state.served[agent] = backend.sync_adapter(agent, result.path, state.versions[agent])
            row[f"policy/{agent}/train_loss"] = result.metrics["train_loss"]
        state.manifest_dir = folder
        if results:
            state.version = f"v{number}"
            resources = self._publish(ctx, backend, folder)
        return state.manifest_dir, resources

    def _publish(self, ctx: TrainContext, backend: LocalBackend, weights_path: Path | None) -> ResourceSet:
        """Publish the LLM and ModelWeights resources (``_weights.publish``); with ``policies`` every adapter's route,
        under the model name the server gave it, at its current version."""
        cfg = self.config
        state = self._adapters
        routes = {
            agent: PolicyRoute(model=state.served[agent], weights_version=version)
            for agent, version in state.versions.items()
        }
        return publish(
            ctx,
            cfg.serving,
            backend,
            model_dir=cfg.model_dir,
            version=state.version if routes else backend.server.weights_version,
            path=weights_path,
            routes=routes,
            lora=cfg.lora is not None,
        )
