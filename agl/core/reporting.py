"""Where metrics go besides the store and ``metrics.jsonl``: TensorBoard, MLflow and W&B writers, and the console
warning for a round whose failure rate jumps.

Owned by one Trainer and called from its thread only (no locks). Each writer opens at the first metrics it gets and
is closed by ``Trainer.close()``; a later ``fit`` opens a new one (a new TensorBoard folder, MLflow run, W&B run).
The libraries are imported only when a writer opens, so ``import agl`` stays light.
"""

from __future__ import annotations

import importlib.util
import itertools
import math
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

#: The names ``Trainer(report_to=...)`` accepts.
REPORTERS = ("tensorboard", "mlflow", "wandb")


def parse_report_to(report_to: str | Sequence[str] | None) -> list[str]:
    """The writer names of ``report_to`` (one name or several), checked: unknown names and writers whose library is
    not installed raise here, at ``Trainer(...)``, not after the first round."""
    if report_to is None:
        return []
    names = [report_to] if isinstance(report_to, str) else list(report_to)
    unknown = [n for n in names if n not in REPORTERS]
    if unknown:
        raise ValueError(f"report_to: unknown {unknown}; choose from {list(REPORTERS)}")
    for name in names:
        missing = _missing_library(name)
        if missing:
            raise ImportError(f"report_to: {name!r} needs {missing}")
    return list(dict.fromkeys(names))


def _installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def _missing_library(name: str) -> str | None:
    """What to install for writer ``name``, or None when its library is there."""
    torch_writer = _installed("torch") and _installed("tensorboard")
    if name == "tensorboard" and not (torch_writer or _installed("tensorboardX")):
        return "tensorboard and tensorboardX (pip install 'agl[tensorboard]')"
    if name == "mlflow" and not (_installed("mlflow") and _installed("sqlalchemy") and _installed("alembic")):
        return "mlflow with its SQLite store (pip install 'agl[mlflow]')"
    if name == "wandb" and not _installed("wandb"):
        return "the wandb package (pip install wandb)"
    return None


def numeric_metrics(metrics: dict[str, Any]) -> dict[str, float]:
    """The values the writers take: ints and floats (not bools); strings and other values are left out."""
    return {k: float(v) for k, v in metrics.items() if isinstance(v, int | float) and not isinstance(v, bool)}


class _Writer(Protocol):
    where: str

    def write(self, step: int, metrics: dict[str, float], wall_time: float) -> None: ...

    def close(self) -> None: ...


class Reporter:
    """Sends each ``log_metrics`` call's numeric metrics to the writers named in ``report_to``."""

    def __init__(self, report_to: str | Sequence[str] | None, run_dir: Path) -> None:
        self.names = parse_report_to(report_to)
        self.run_dir = run_dir
        self._writers: dict[str, _Writer] = {}

    def log(self, step: int, metrics: dict[str, Any], wall_time: float) -> None:
        values = numeric_metrics(metrics)
        if not values:
            return
        for name in self.names:
            writer = self._writers.get(name)
            if writer is None:
                writer = self._writers[name] = _OPENERS[name](self.run_dir)
                print(f"[agl] metrics also go to {name}: {writer.where}", file=sys.stderr, flush=True)
            writer.write(step, values, wall_time)

    def close(self) -> None:
        """Flush and close every open writer (each one, even when another fails)."""
        writers, self._writers = list(self._writers.values()), {}
        errors: list[BaseException] = []
        for writer in writers:
            try:
                writer.close()
            except Exception as exc:
                errors.append(exc)
        if errors:
            raise errors[0]


_opened = itertools.count(1)


def _run_name() -> str:
    """A name no other writer of this machine has: time, process id, and a count of the writers it opened."""
    return f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}-{next(_opened)}"


class _TensorBoard:
    """Event files under ``run_dir/tensorboard/<run>``, written by ``torch.utils.tensorboard`` when torch is
    installed, else by ``tensorboardX`` (the same file format)."""

    def __init__(self, run_dir: Path) -> None:
        folder = run_dir / "tensorboard" / _run_name()
        if _installed("torch") and _installed("tensorboard"):
            from torch.utils.tensorboard import SummaryWriter
        else:
            from tensorboardX import SummaryWriter  # type: ignore[no-redef]
        self.writer = SummaryWriter(str(folder))
        self.where = str(folder)

    def write(self, step: int, metrics: dict[str, float], wall_time: float) -> None:
        for key, value in metrics.items():
            self.writer.add_scalar(key, value, global_step=step, walltime=wall_time)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class _MLflow:
    """One MLflow run per writer in experiment ``$MLFLOW_EXPERIMENT_NAME`` (default ``agl``), in the tracking store
    ``$MLFLOW_TRACKING_URI`` (default: ``sqlite:///run_dir/mlflow.db``, artifacts beside it)."""

    def __init__(self, run_dir: Path) -> None:
        from mlflow.entities import RunStatus
        from mlflow.tracking import MlflowClient

        uri = os.environ.get("MLFLOW_TRACKING_URI")
        artifacts = None
        if not uri:
            run_dir.mkdir(parents=True, exist_ok=True)
            uri = f"sqlite:///{run_dir.resolve() / 'mlflow.db'}"
            artifacts = (run_dir.resolve() / "mlflow-artifacts").as_uri()
        self.client = MlflowClient(tracking_uri=uri)
        name = os.environ.get("MLFLOW_EXPERIMENT_NAME") or "agl"
        experiment = self.client.get_experiment_by_name(name)
        experiment_id = (
            experiment.experiment_id
            if experiment is not None
            else self.client.create_experiment(name, artifact_location=artifacts)
        )
        self.run_id = self.client.create_run(experiment_id, run_name=f"agl-{_run_name()}").info.run_id
        self._finished = RunStatus.to_string(RunStatus.FINISHED)
        self.where = f"{uri} (experiment {name!r}, run {self.run_id})"

    def write(self, step: int, metrics: dict[str, float], wall_time: float) -> None:
        from mlflow.entities import Metric

        stamp = int(wall_time * 1000)
        batch = [Metric(key, value, stamp, step) for key, value in metrics.items()]
        self.client.log_batch(self.run_id, metrics=batch)

    def close(self) -> None:
        self.client.set_terminated(self.run_id, status=self._finished)


class _WandB:
    """One W&B run per writer (project ``$WANDB_PROJECT``, default ``agl``; files under ``run_dir``); agl's step is
    logged as the metric ``step`` and used as every metric's x axis, since W&B's own step may only grow."""

    def __init__(self, run_dir: Path) -> None:
        import wandb

        run_dir.mkdir(parents=True, exist_ok=True)
        self.run = wandb.init(project=os.environ.get("WANDB_PROJECT") or "agl", dir=str(run_dir), reinit="create_new")
        self.run.define_metric("step")
        self.run.define_metric("*", step_metric="step")
        self.where = f"{self.run.project}/{self.run.id}"

    def write(self, step: int, metrics: dict[str, float], wall_time: float) -> None:
        self.run.log({**metrics, "step": step})

    def close(self) -> None:
        self.run.finish()


_OPENERS: dict[str, Any] = {"tensorboard": _TensorBoard, "mlflow": _MLflow, "wandb": _WandB}


class FailureWatch:
    """Flags a round whose failure rate jumps: a round is what ran between two ``log_metrics`` calls; its failure
    rate is failed or cancelled rollouts (lost ones end failed) over its rollouts. It is flagged when it is at least
    ``factor`` times the mean rate of the earlier rounds and at least ``min_rise`` above it (so after clean rounds,
    ``min_rise`` alone decides; the first round has nothing to compare with)."""

    def __init__(self, factor: float = 2.0, min_rise: float = 0.10) -> None:
        self.factor, self.min_rise = factor, min_rise
        self.rates: list[float] = []
        self._rollouts = self._failed = 0

    def add(self, statuses: Sequence[str]) -> None:
        """Count a batch's rollout statuses into the current round."""
        self._rollouts += len(statuses)
        self._failed += sum(s in ("failed", "cancelled") for s in statuses)

    def end_round(self, step: int) -> str | None:
        """Close the current round; the warning line when its failure rate jumped, else None."""
        n, failed = self._rollouts, self._failed
        self._rollouts = self._failed = 0
        if not n:
            return None
        rate = failed / n
        before = sum(self.rates) / len(self.rates) if self.rates else math.nan
        self.rates.append(rate)
        if math.isnan(before) or rate < self.factor * before or rate - before < self.min_rise:
            return None
        return (
            f"[agl] warning: step {step}: {failed}/{n} rollouts failed ({rate:.0%}), up from {before:.0%} on average "
            f"in the {len(self.rates) - 1} earlier round(s); see `agl runs` / `agl show` for their errors"
        )
