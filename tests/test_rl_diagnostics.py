"""Per-round RL diagnostics on constructed cases: reward spread, zero-variance groups, lengths, entropy, the console
line, the metrics files and one plot panel per diagnostic."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest
import torch

from agl.core.types import Trajectory, Transition
from agl.trainers.rl._report import DIAGNOSTICS, console_line, draw_diagnostics, round_diagnostics, write_metrics
from agl.trainers.rl.credit import assign_all
from agl.trainers.rl.grpo import GRPOConfig, grpo_advantages
from agl.trainers.rl.loss import entropy_sum, response_scores
from tests.trajectories import finished


def rollout(rollout_id: str, task_id: str, final: float, lengths: list[int], temperature: float = 1.0) -> Trajectory:
    steps = [
        Transition(span_id=f"{rollout_id}-{i}", agent="a", step=i, response_ids=[7] * n, temperature=temperature)
        for i, n in enumerate(lengths)
    ]
    return finished(rollout_id, task_id, final, steps)


def test_round_diagnostics_from_known_groups() -> None:
    trajectories = [
        *(rollout(f"t{i}", "t", r, [3]) for i, r in enumerate([1.0, 0.0, 1.0, 0.0])),  # rewards differ
        *(rollout(f"u{i}", "u", 1.0, [5, 5]) for i in range(2)),  # all rewards equal: zero variance
        rollout("v0", "v", 0.0, [1], temperature=0.0),  # a lone greedy rollout: no spread to measure
    ]
    assign_all(trajectories)
    _, stats = grpo_advantages(trajectories, GRPOConfig())
    got = round_diagnostics(trajectories, tasks=3, advantages=stats)
    # task t: sample std of 1,0,1,0 = sqrt(1/3); task u: 0; task v has one rollout and is left out
    assert got["reward_std"] == pytest.approx(math.sqrt(1 / 3) / 2)
    assert got["pass_at_k"] == pytest.approx(2 / 3)  # t and u had a solved rollout, v none
    assert got["zero_variance_fraction"] == pytest.approx(2 / 3)  # u and v of the three groups
    assert got["response_length"] == pytest.approx((4 * 3 + 4 * 5 + 1) / 9)
    assert got["transitions_per_task"] == 3.0
    assert got["greedy_transitions"] == 1.0
    # kept with advantage 0 instead of skipped, the flat groups still count
    _, kept_flat = grpo_advantages(trajectories, GRPOConfig(skip_zero_variance=False))
    assert kept_flat.skipped_groups == 0
    assert round_diagnostics(trajectories, 3, kept_flat)["zero_variance_fraction"] == pytest.approx(2 / 3)
    # the same rollouts grouped per call index: u's two calls make two groups, both flat
    _, stats = grpo_advantages(trajectories, GRPOConfig(group_by="task_agent_step"))
    assert round_diagnostics(trajectories, 3, stats)["zero_variance_fraction"] == pytest.approx(3 / 4)


def test_round_diagnostics_of_an_empty_round_are_nan_not_zero() -> None:
    _, stats = grpo_advantages([], GRPOConfig())
    got = round_diagnostics([], tasks=2, advantages=stats)
    assert all(math.isnan(got[k]) for k in ("reward_std", "pass_at_k", "zero_variance_fraction", "response_length"))
    assert got["transitions_per_task"] == 0.0


def test_entropy_is_that_of_the_sampling_distribution() -> None:
    # one sequence of 3 tokens, vocabulary of 2; positions 0 and 1 predict the response tokens 1 and 2
    logits = torch.tensor([[[0.0, math.log(3.0)], [5.0, 5.0], [9.0, -9.0]]])
    mask = torch.tensor([[0.0, 1.0, 1.0]])

    def h(p: list[float]) -> float:
        return -sum(x * math.log(x) for x in p)

    def entropy(mask: torch.Tensor, temperatures: torch.Tensor | None = None) -> float:
        predicts = mask[:, 1:] > 0
        return entropy_sum(response_scores(logits[:, :-1, :][predicts], predicts, temperatures))

    # temperature 1: p = (1/4, 3/4) then uniform; temperature 0.5: logits x2, p = (1/10, 9/10) then uniform
    assert entropy(mask) == pytest.approx(h([0.25, 0.75]) + math.log(2), rel=1e-6)
    assert entropy(mask, torch.tensor([0.5])) == pytest.approx(h([0.1, 0.9]) + math.log(2), rel=1e-6)
    assert entropy(torch.tensor([[0.0, 0.0, 1.0]])) == pytest.approx(math.log(2), rel=1e-6)


def test_console_line_is_compact_and_marks_what_was_not_measured() -> None:
    row = {"round": 3, "seconds": 41.6, "mean_reward": 0.3125, "reward_std": 0.2, "entropy": math.nan}
    line = console_line(row, rounds=10)
    assert line.startswith("[rl] round 3/10 (42s): reward 0.312 | pass@k - | std 0.2 | zero-var - | entropy - |")
    assert line.count("|") == len(DIAGNOSTICS) - 1 and "\n" not in line


def test_metrics_files_and_one_panel_per_diagnostic(tmp_path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [
        {"round": 0, "val/mean_reward": 0.1},
        {"round": 1, **{column: 1.0 for column, _, _ in DIAGNOSTICS}},
        {"round": 2, **{column: 2.0 for column, _, _ in DIAGNOSTICS}, "entropy": math.nan},
    ]
    write_metrics(tmp_path, rows)
    with open(tmp_path / "rl_metrics.csv", newline="") as fh:
        header = next(csv.reader(fh))
    assert header[:2] == ["round", "val/mean_reward"] and {c for c, _, _ in DIAGNOSTICS} <= set(header)
    assert json.loads((tmp_path / "rl_metrics.json").read_text())[2]["entropy"] is None
    fig, axes = plt.subplots(1, len(DIAGNOSTICS))
    draw_diagnostics(list(axes), rows)
    for ax, (column, _, title) in zip(axes, DIAGNOSTICS, strict=True):
        (line,) = ax.get_lines()
        assert ax.get_title() == title and list(line.get_xdata()) == [1, 2], column
        expected = [1.0, math.nan] if column == "entropy" else [1.0, 2.0]
        assert list(line.get_ydata()) == pytest.approx(expected, nan_ok=True), column
    plt.close(fig)
