"""The ``Trainer(report_to=...)`` writers: TensorBoard, MLflow and W&B, each behind ``write(step, metrics, wall_time)``
and ``close()``, and the check of the names.

Above core: ``agl.core.reporting`` imports this module only when a Trainer is given ``report_to`` (as it reaches
``agl.otel`` only for ``otlp_endpoint``), and nothing here imports core. Each writer imports its library — torch's or
tensorboardX's SummaryWriter, MLflow, wandb — when it opens.
"""

from __future__ import annotations

import importlib.util
import itertools
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol


class Writer(Protocol):
    where: str

    def write(self, step: int, metrics: dict[str, float], wall_time: float) -> None: ...

    def close(self) -> None: ...


def installed(module: str) -> bool:
    """Whether ``module`` can be imported here (found, not imported)."""
    return importlib.util.find_spec(module) is not None


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


def _missing_library(name: str) -> str | None:
    """What to install for writer ``name``, or None when its library is there."""
    torch_writer = installed("torch") and installed("tensorboard")
    if name == "tensorboard" and not (torch_writer or installed("tensorboardX")):
        return "tensorboard and tensorboardX (pip install 'agl[tensorboard]')"
    if name == "mlflow" and not (installed("mlflow") and installed("sqlalchemy") and installed("alembic")):
        return "mlflow with its SQLite store (pip install 'agl[mlflow]')"
    if name == "wandb" and not installed("wandb"):
        return "the wandb package (pip install wandb)"
    return None


_opened = itertools.count(1)


def _run_name() -> str:
    """A name no other writer of this machine has: time, process id, and a count of the writers it opened."""
    return f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}-{next(_opened)}"


class _TensorBoard:
    """Event files under ``run_dir/tensorboard/<run>``, written by ``torch.utils.tensorboard`` when torch is
    installed, else by ``tensorboardX`` (the same file format)."""

    def __init__(self, run_dir: Path) -> None:
        folder = run_dir / "tensorboard" / _run_name()
        if installed("torch") and installed("tensorboard"):
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


def open_writer(name: str, run_dir: Path) -> Writer:
    """Open writer ``name`` (one of ``REPORTERS``) for the run folder ``run_dir``."""
    opener: Any = _OPENERS[name]
    writer: Writer = opener(run_dir)
    return writer
