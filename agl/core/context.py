"""What an algorithm sees of a training run: ``TrainContext`` (run tasks as rollouts, publish resources, log
metrics) and the ``RolloutBatch`` its rollouts come back as.

The ``Trainer`` builds the context and does the work behind it; the context knows the Trainer only as a
``ContextHost``, so this module, ``agl.core.algorithm`` (which types ``fit``'s ``ctx`` with it) and the Trainer import
in one direction: trainer → algorithm → context.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from agl.core.adapter import CaptureFailure
from agl.core.reporting import FailureWatch, Reporter
from agl.core.runs import RUN_ID_KEY
from agl.core.store import NotFound, Store
from agl.core.types import Record, Resource, ResourceSet, Rollout, RolloutMode, RolloutRequest, Trajectory

log = logging.getLogger("agl.trainer")


def task_id_of(task: Any) -> str:
    """A task's id: its ``id``/``task_id`` field when it is a dict with one, else a digest of its JSON.

    Stable across calls, so the same task gets the same id in every minibatch (GRPO groups and APO scores key on it).
    """
    if isinstance(task, dict):
        for key in ("id", "task_id"):
            if key in task:
                return str(task[key])
    digest = hashlib.sha1(json.dumps(task, sort_keys=True, default=str).encode()).hexdigest()[:12]
    return f"task-{digest}"


@dataclass
class RolloutBatch:
    """Finished rollouts of one call, their trajectories (same order) and what could not be used."""

    rollouts: list[Rollout]
    trajectories: list[Trajectory]
    failures: list[CaptureFailure] = field(default_factory=list)
    success_threshold: float = 1.0

    @property
    def usable(self) -> list[Trajectory]:
        """Succeeded trajectories without capture failures: what algorithms learn from."""
        bad = {f.rollout_id for f in self.failures}
        return [t for t in self.trajectories if t.status == "succeeded" and t.rollout_id not in bad]

    @property
    def rewards(self) -> list[float]:
        """Final reward per rollout; a failed rollout or one without a reward counts 0."""
        return [r.final_reward if r.final_reward is not None else 0.0 for r in self.rollouts]

    @property
    def summary(self) -> dict[str, Any]:
        n = len(self.rollouts)
        rewards = self.rewards
        usable = self.usable
        return {
            "rollouts": n,
            "succeeded": sum(r.status == "succeeded" for r in self.rollouts),
            "failed": sum(r.status in ("failed", "cancelled") for r in self.rollouts),
            "capture_failures": len(self.failures),
            "mean_reward": sum(rewards) / n if n else math.nan,
            "success_rate": sum(x >= self.success_threshold for x in rewards) / n if n else math.nan,
            "mean_transitions": sum(len(t.transitions) for t in usable) / len(usable) if usable else math.nan,
        }


class ContextHost(Protocol):
    """The ``Trainer`` as the ``TrainContext`` it builds uses it."""

    run_dir: Path
    max_attempts: int
    progress: bool
    _reporter: Reporter

    def _run_requests(self, store: Store, requests: list[RolloutRequest], desc: str) -> RolloutBatch:
        """Enqueue ``requests``, wait for them and turn them into trajectories."""
        ...

    def _remember_keys(self, resources: dict[str, Resource]) -> None:
        """Keep the API keys of the LLMs in ``resources``, which an agl server answers redacted."""
        ...

    def _unredact(self, rs: ResourceSet) -> ResourceSet:
        """``rs`` with the redacted keys this trainer published filled in."""
        ...


class TrainContext:
    """What an algorithm can do: run rollouts, publish resources, log metrics. Built by the Trainer."""

    def __init__(self, trainer: ContextHost, store: Store, run_id: str | None = None) -> None:
        self.trainer = trainer
        self.store = store
        self.run_id = run_id  # the recorded run (``agl.core.runs``) every rollout enqueued here is tagged with
        self.run_dir = trainer.run_dir
        self.failure_watch = FailureWatch()

    def publish(self, resources: dict[str, Resource]) -> ResourceSet:
        """Publish a new resources version; later rollouts run with it."""
        rs = self.store.publish_resources(resources)
        self.trainer._remember_keys(resources)
        log.info("published resources v%d (%s)", rs.version, ", ".join(resources))
        return rs

    def latest_resources(self) -> ResourceSet:
        """The latest resources; an LLM's key an agl server redacted is filled in when this trainer published it."""
        return self.trainer._unredact(self.store.get_resources())

    def publish_changes(self, changes: dict[str, Resource]) -> ResourceSet:
        """Publish the latest resources with ``changes`` added or replaced (all of ``changes`` if none yet)."""
        try:
            current: dict[str, Resource] = dict(self.latest_resources().resources)
        except NotFound:
            current = {}
        current.update(changes)
        return self.publish(current)

    def rollouts(
        self,
        tasks: Sequence[Any],
        *,
        mode: RolloutMode = "train",
        n: int = 1,
        resources_version: int | Sequence[int | None] | None = None,
        desc: str | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> RolloutBatch:
        """Run every task ``n`` times (a group per task, for GRPO) and wait for all of them.

        ``resources_version``: one version for all (None = latest), or one per task (e.g. APO's candidates side by
        side in one batch).
        """
        if isinstance(resources_version, Sequence):
            versions = list(resources_version)
            if len(versions) != len(tasks):
                raise ValueError(f"resources_version: {len(versions)} versions for {len(tasks)} tasks")
        else:
            versions = [resources_version] * len(tasks)
        tagged = {**(metadata or {}), **({RUN_ID_KEY: self.run_id} if self.run_id is not None else {})}
        requests = [
            RolloutRequest(
                task=task,
                task_id=task_id_of(task),
                mode=mode,
                resources_version=versions[i],
                max_attempts=self.trainer.max_attempts,
                metadata=tagged,
            )
            for i, task in enumerate(tasks)
            for _ in range(n)
        ]
        batch = self.trainer._run_requests(self.store, requests, desc or mode)
        self.failure_watch.add([r.status for r in batch.rollouts])
        return batch

    def log_metrics(self, step: int, metrics: dict[str, Any]) -> None:
        """Keep metrics in the store (record kind ``metrics``), append them to ``run_dir/metrics.jsonl``, send the
        numeric ones to the ``report_to`` writers, and warn when this round's failure rate jumped (``FailureWatch``)."""
        row = {"step": step, "time": time.time(), **metrics}
        self.store.add_record(Record(kind="metrics", key=str(step), data=row))
        self.run_dir.mkdir(parents=True, exist_ok=True)
        with open(self.run_dir / "metrics.jsonl", "a", encoding="utf-8") as fh:
            fh.write(json.dumps(row, default=str) + "\n")
        shown = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in metrics.items())
        print(f"[agl] step {step}: {shown}", file=sys.stderr, flush=True)
        warning = self.failure_watch.end_round(step)
        if warning:
            print(warning, file=sys.stderr, flush=True)
        self.trainer._reporter.log(step, metrics, row["time"])
