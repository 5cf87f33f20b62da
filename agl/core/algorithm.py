"""The algorithm interface: what RL, APO, SFT and Baseline implement to plug into ``Trainer.fit``.

An algorithm never touches runners or raw spans. It gets a ``TrainContext`` that runs tasks as rollouts against a
resources version and returns Trajectories, lets it publish new resources, and keeps its metrics.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from agl.core.context import TrainContext
    from agl.core.types import Span


class Algorithm(abc.ABC):
    """Improves resources from trajectories.

    Contract: ``fit`` drives rounds of ``ctx.rollouts(...)`` → learn → ``ctx.publish(...)`` and returns its final
    metrics. Set ``requires_token_ids`` when it trains on token ids, so rollouts without them are capture failures.

    Example (a complete algorithm that only measures)::

        class MeanReward(Algorithm):
            def fit(self, ctx, train_tasks, val_tasks):
                batch = ctx.rollouts(train_tasks, mode="train")
                ctx.log_metrics(0, batch.summary)
                return batch.summary
    """

    requires_token_ids: ClassVar[bool] = False

    def air(self, span: Span) -> float | None:
        """Automatic intermediate reward for a span (None = none). Applied when spans become trajectories."""
        return None

    @abc.abstractmethod
    def fit(self, ctx: TrainContext, train_tasks: Sequence[Any], val_tasks: Sequence[Any] | None) -> dict[str, Any]:
        """Train; return the final metrics (also logged through ``ctx.log_metrics``)."""

    def follows(self) -> bool:
        """Whether this process only assists another process's ``fit`` (a rank other than 0 of a distributed update,
        e.g. ``LightningRL`` with ``UpdateConfig.strategy="ddp"`` under torchrun). ``Trainer.fit`` then calls
        ``follow`` instead and starts no store, server or runners. Default False."""
        return False

    def follow(self) -> dict[str, Any]:
        """Assist the leading process's ``fit`` until it ends; returns this process's metrics. Called only when
        ``follows()``."""
        raise NotImplementedError(f"{type(self).__name__} has no follower role")


class Baseline(Algorithm):
    """Runs the tasks once with the current resources and reports; changes nothing. The yardstick for the others."""

    def fit(self, ctx: TrainContext, train_tasks: Sequence[Any], val_tasks: Sequence[Any] | None) -> dict[str, Any]:
        metrics: dict[str, Any] = {}
        train = ctx.rollouts(train_tasks, mode="train", desc="baseline train")
        metrics.update({f"train/{k}": v for k, v in train.summary.items()})
        if val_tasks:
            val = ctx.rollouts(val_tasks, mode="val", desc="baseline val")
            metrics.update({f"val/{k}": v for k, v in val.summary.items()})
        ctx.log_metrics(0, metrics)
        return metrics
