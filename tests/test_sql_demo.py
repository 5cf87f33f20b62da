"""The main job's --quick mode end to end: real SmolLM2 on CPU, SFT warm start, one LightningRL round, report.

Asserts the run folder is complete and its figures are finite — not that accuracy rises (too few steps for that).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from examples.sql_agent.train import held_out_tasks, main, wilson


def test_wilson_interval_brackets_the_rate() -> None:
    low, high = wilson(30, 60)
    assert low < 0.5 < high
    assert wilson(0, 10)[0] == 0.0 and wilson(10, 10)[1] == 1.0


def test_held_out_sample_is_stratified_and_fixed() -> None:
    a, b = held_out_tasks(40, seed=0), held_out_tasks(40, seed=0)
    assert a == b and len(a) == 40
    assert {t["tier"] for t in a} == {"easy", "medium", "join", "hard"}
    assert len({t["id"] for t in a}) == 40


@pytest.mark.slow
def test_quick_demo_writes_a_complete_run_folder(tmp_path: Path) -> None:
    out = tmp_path / "run"
    assert main(["--quick", "--out", str(out)]) == 0
    for name in ("report.md", "metrics.json", "metrics.csv", "curve.png", "rl_metrics.json"):
        assert (out / name).is_file() and (out / name).stat().st_size > 0, name
    metrics = json.loads((out / "metrics.json").read_text())
    for phase in ("before", "after"):
        result = metrics[phase]
        assert 0.0 <= result["accuracy"] <= 1.0
        assert result["n"] == 4 and result["capture_failures"] == 0
        assert math.isfinite(result["mean_transitions"]) and result["mean_transitions"] >= 1
    assert metrics["rl_rounds"] and math.isfinite(metrics["rl_rounds"][0]["mean_reward"])
    assert math.isfinite(metrics["sft"]["loss_last"])
    report = (out / "report.md").read_text()
    assert "execution accuracy" in report and "curve.png" in report
