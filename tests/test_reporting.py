"""Metrics where users look: ``Trainer(report_to=...)`` writes what ``metrics.jsonl`` holds to TensorBoard event files
and an MLflow store (read back with the libraries' own readers), and a round whose failure rate jumps is flagged in
the console. Real runs: Trainer, runners, SQLite store, fake LLM over HTTP.
"""

from __future__ import annotations

import json
import math
import struct
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

import agl
from agl.core.reporting import FailureWatch, Reporter
from agl.testing import FakeLLM
from agl.trainers.apo import APO, APOConfig
from tests.test_apo import START, TRAIN, VAL, agent_model, keyword_agent, optimizer_model


def _numeric_rows(run_dir: Path) -> list[tuple[str, int, float]]:
    """(metric, step, value) of every numeric metric ``metrics.jsonl`` holds, in the order logged."""
    out = []
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        for key, value in row.items():
            if key not in ("step", "time") and isinstance(value, int | float) and not isinstance(value, bool):
                out.append((key, row["step"], float(value)))
    return out


def _same(a: list[tuple[str, int, float]], b: list[tuple[str, int, float]]) -> bool:
    """Equal as multisets; NaN equals NaN; float32 rounding allowed (TensorBoard stores scalars as float32)."""
    if len(a) != len(b):
        return False
    return all(
        ka == kb and sa == sb and ((math.isnan(va) and math.isnan(vb)) or math.isclose(va, vb, rel_tol=1e-6))
        for (ka, sa, va), (kb, sb, vb) in zip(sorted(a, key=_key), sorted(b, key=_key), strict=True)
    )


def _key(item: tuple[str, int, float]) -> tuple[str, int, float]:
    return (item[0], item[1], -math.inf if math.isnan(item[2]) else item[2])


def _tensorboard_rows(run_dir: Path) -> list[tuple[str, int, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    folders = list((run_dir / "tensorboard").iterdir())
    assert len(folders) == 1, folders
    acc = EventAccumulator(str(folders[0]), size_guidance={"scalars": 0})
    acc.Reload()
    return [(tag, e.step, e.value) for tag in acc.Tags()["scalars"] for e in acc.Scalars(tag)]


def _mlflow_rows(run_dir: Path) -> list[tuple[str, int, float]]:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{run_dir / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("agl")
    assert experiment is not None
    runs = client.search_runs([experiment.experiment_id])
    assert len(runs) == 1 and runs[0].info.status == "FINISHED"
    run = runs[0]
    return [(key, m.step, m.value) for key in run.data.metrics for m in client.get_metric_history(run.info.run_id, key)]


@pytest.mark.slow
def test_report_to_tensorboard_and_mlflow_hold_what_metrics_jsonl_holds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("MLFLOW_EXPERIMENT_NAME", raising=False)
    with FakeLLM(agent_model) as model, FakeLLM(optimizer_model) as optimizer:
        resources = {
            "main_llm": agl.LLM(base_url=model.base_url, model="fake"),
            "optimizer_llm": agl.LLM(base_url=optimizer.base_url, model="optimizer"),
            "system_prompt": agl.PromptTemplate(template=START, agent="solver"),
        }
        cfg = APOConfig(prompts=["system_prompt"], beam_width=2, branch_factor=2, minibatch_size=4, rollout_budget=24)
        with agl.Trainer(
            algorithm=APO(cfg),
            n_runners=2,
            store=f"sqlite:///{tmp_path / 'agl.db'}",
            resources=resources,
            progress=False,
            report_to=["tensorboard", "mlflow"],
        ) as trainer:
            trainer.fit(keyword_agent, TRAIN, VAL)
    expected = _numeric_rows(tmp_path)
    steps = {step for _, step, _ in expected}
    assert len(steps) >= 2 and "best_mean" in {k for k, _, _ in expected}, expected
    text = (tmp_path / "metrics.jsonl").read_text()
    assert '"beam":' in text and '"stop_reason":' in text, "APO logs strings too: they stay out of the writers"
    assert _same(_tensorboard_rows(tmp_path), expected), (_tensorboard_rows(tmp_path), expected)
    assert _same(_mlflow_rows(tmp_path), expected), (_mlflow_rows(tmp_path), expected)


class Rounds(agl.Algorithm):
    """Runs the tasks once per round and logs the round's summary: the smallest multi-round algorithm."""

    def __init__(self, rounds: int) -> None:
        self.rounds = rounds

    def fit(self, ctx: Any, train_tasks: Sequence[Any], val_tasks: Sequence[Any] | None) -> dict[str, Any]:
        summary: dict[str, Any] = {}
        for number in range(1, self.rounds + 1):
            summary = ctx.rollouts(train_tasks, mode="train", desc=f"round {number}").summary
            ctx.log_metrics(number, summary)
        return summary


def asking_agent(task: dict[str, Any], resources: dict[str, Any]) -> float:
    """One LLM call; an error reply from the model fails the rollout."""
    import openai

    llm = resources["main_llm"]
    client = openai.OpenAI(base_url=llm.base_url, api_key=llm.api_key, max_retries=0)
    client.chat.completions.create(model=llm.model, messages=[{"role": "user", "content": task["question"]}])
    return 1.0


def _wandb_history(run_dir: Path) -> list[tuple[str, int, float]]:
    """(metric, agl step, value) of the history rows in the one offline W&B run under ``run_dir``: its ``.wandb``
    file is a LevelDB-style log (7-byte file header; 32 KiB blocks of records with a 7-byte header: checksum,
    little-endian length, type) of protobuf ``Record`` messages."""
    from wandb.proto import wandb_internal_pb2

    files = list((run_dir / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(files) == 1, files
    data = files[0].read_bytes()
    assert data[:4] == b":W&B"
    block, pos, pieces, out = 32768, 7, b"", []
    while pos + 7 <= len(data):
        if block - pos % block < 7:
            pos += block - pos % block
            continue
        length, kind = struct.unpack("<HB", data[pos + 4 : pos + 7])
        pieces += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # a whole record, or the last piece of one
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pieces)
            pieces = b""
            if record.WhichOneof("record_type") == "history":
                row = {
                    item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item
                }
                out += [(k, row["step"], float(v)) for k, v in row.items() if not k.startswith("_") and k != "step"]
    return out


def test_round_whose_failure_rate_jumps_is_flagged_in_the_console_and_wandb_gets_every_round(
    tmp_path: Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    tasks = [{"id": f"t{i}", "question": f"q{i}"} for i in range(4)]
    # 8 answers: rounds 1 and 2 succeed; past the end of its script the fake LLM answers 500, so round 3 fails
    with FakeLLM(["ok"] * 8) as model:
        trainer = agl.Trainer(
            algorithm=Rounds(3),
            n_runners=2,
            store=f"sqlite:///{tmp_path / 'agl.db'}",
            resources={"main_llm": agl.LLM(base_url=model.base_url, model="fake")},
            progress=False,
            report_to="wandb",
        )
        with trainer:
            result = trainer.fit(asking_agent, tasks)
    assert result.metrics["failed"] == 4
    err = capfd.readouterr().err
    warnings = [line for line in err.splitlines() if line.startswith("[agl] warning:")]
    assert warnings == [
        "[agl] warning: step 3: 4/4 rollouts failed (100%), up from 0% on average in the 2 earlier round(s); "
        "see `agl runs` / `agl show` for their errors"
    ], err
    expected = _numeric_rows(tmp_path)
    assert {step for _, step, _ in expected} == {1, 2, 3}
    assert _same(_wandb_history(tmp_path), expected), (_wandb_history(tmp_path), expected)


def test_failure_watch_flags_a_jump_not_a_steady_or_small_rate() -> None:
    def flagged(rounds: list[tuple[int, int]]) -> list[int]:
        watch = FailureWatch()
        out = []
        for step, (failed, n) in enumerate(rounds, 1):
            watch.add(["failed"] * failed + ["succeeded"] * (n - failed))
            if watch.end_round(step):
                out.append(step)
        return out

    assert flagged([(5, 10), (5, 10), (5, 10)]) == [], "steady 50%"
    assert flagged([(0, 20), (1, 20), (0, 20)]) == [], "5 points above a clean history"
    assert flagged([(0, 10), (2, 10)]) == [2], "20% after a clean round"
    assert flagged([(2, 10), (3, 10), (6, 10)]) == [3], "60%: at least 2x the mean 25% and 35 points above"
    assert flagged([(2, 10), (3, 10), (4, 10)]) == [], "40% < 2x the mean 25%"
    assert flagged([(9, 10)]) == [], "the first round has nothing to compare with"
    assert flagged([(0, 10), (0, 0), (5, 10)]) == [3], "a step without rollouts is no round"


def test_report_to_rejects_unknown_names() -> None:
    with pytest.raises(ValueError, match=r"report_to: unknown \['tensorbord'\]"):
        agl.Trainer(report_to=["tensorboard", "tensorbord"])
    with pytest.raises(ValueError, match="report_to: unknown"):
        agl.Trainer(report_to="comet")


def test_importing_the_trainer_loads_no_metric_writer() -> None:
    code = (
        "import sys, agl; agl.Trainer; "
        "print(sorted({'mlflow', 'tensorboard', 'tensorboardX', 'wandb', 'torch'} & set(sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]"


def test_mlflow_writes_where_mlflow_tracking_uri_points(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'elsewhere.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "my-experiment")
    reporter = Reporter("mlflow", tmp_path / "run")
    reporter.log(7, {"loss": 0.25, "note": "text"}, 1_700_000_000.5)
    reporter.close()
    assert not (tmp_path / "run" / "mlflow.db").exists()
    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("my-experiment")
    assert experiment is not None
    (run,) = client.search_runs([experiment.experiment_id])
    assert set(run.data.metrics) == {"loss"}
    history = client.get_metric_history(run.info.run_id, "loss")
    assert [(m.step, m.value, m.timestamp) for m in history] == [(7, 0.25, 1_700_000_000_500)]
