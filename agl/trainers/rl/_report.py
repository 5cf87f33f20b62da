"""Per-round RL diagnostics: computed from a round's trajectories, written to ``rl_metrics.csv`` and
``rl_metrics.json`` in the run folder (rewritten each round), shown as one compact console line, drawn one panel each.

Rewriting (to a temporary file, then rename) keeps both files complete and readable at any moment, and lets columns
that appear later (validation rounds) join the CSV header. Single writer. Pure functions otherwise; matplotlib is
imported only by ``draw_diagnostics``.
"""

from __future__ import annotations

import csv
import json
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agl.core.types import Trajectory
from agl.trainers.rl.grpo import AdvantageStats, group_key, sample_std

CSV_NAME = "rl_metrics.csv"
JSON_NAME = "rl_metrics.json"

#: The diagnostics every training round reports, in the order the console line and the plot show them:
#: (column, short console label, panel title).
DIAGNOSTICS: tuple[tuple[str, str, str], ...] = (
    ("mean_reward", "reward", "mean reward"),
    ("pass_at_k", "pass@k", "tasks some rollout solved (pass@k)"),
    ("reward_std", "std", "reward std within a task's group"),
    ("zero_variance_fraction", "zero-var", "zero-variance GRPO groups (fraction)"),
    ("entropy", "entropy", "policy entropy (nats/token)"),
    ("kl_ref", "kl_ref", "approx. KL to the start policy"),
    ("clip_fraction", "clip", "clip fraction"),
    ("grad_norm", "grad", "grad norm (before clipping)"),
    ("response_length", "len", "response length (tokens)"),
    ("transitions_per_task", "trans/task", "transitions per task"),
)


def round_diagnostics(trajectories: Sequence[Trajectory], tasks: int, advantages: AdvantageStats) -> dict[str, float]:
    """The rollout-side diagnostics of one round (the update adds entropy, KL, clip fraction and grad norm).

    * ``reward_std``: the sample standard deviation of the final rewards of each task's rollouts (a missing reward
      counts 0), averaged over the tasks with at least two usable rollouts; NaN when there is none. Near 0 means the
      groups agree and GRPO has little to learn from.
    * ``pass_at_k``: the share of the round's tasks that at least one of their rollouts solved (a positive final
      reward), k being the group size: the ceiling of what the round can reinforce, as GRPO learns only from a group
      where some rollout did better than the others. NaN when there is no task.
    * ``zero_variance_fraction``: the share of GRPO groups (as ``group_by`` forms them) whose returns were all equal,
      skipped or not.
    * ``response_length``: mean response tokens per transition; ``transitions_per_task``: transitions of the round
      divided by the ``tasks`` it sampled; ``greedy_transitions``: transitions sampled at temperature 0.
    """
    by_task: dict[str, list[float]] = {}
    for trajectory in trajectories:
        reward = trajectory.final_reward if trajectory.final_reward is not None else 0.0
        by_task.setdefault(group_key(trajectory), []).append(reward)
    spreads = [sample_std(rewards) for rewards in by_task.values() if len(rewards) > 1]
    solved = [any(reward > 0 for reward in rewards) for rewards in by_task.values()]
    transitions = [t for trajectory in trajectories for t in trajectory.transitions]
    return {
        "reward_std": sum(spreads) / len(spreads) if spreads else math.nan,
        "pass_at_k": sum(solved) / len(solved) if solved else math.nan,
        "zero_variance_fraction": (
            advantages.zero_variance_groups / advantages.groups if advantages.groups else math.nan
        ),
        "response_length": (
            sum(len(t.response_ids) for t in transitions) / len(transitions) if transitions else math.nan
        ),
        "transitions_per_task": len(transitions) / tasks if tasks else math.nan,
        "greedy_transitions": float(sum(t.temperature == 0 for t in transitions)),
    }


def console_line(row: dict[str, Any], rounds: int) -> str:
    """One compact line with a round's diagnostics (``-`` for what the round did not measure)."""
    shown = []
    for column, label, _ in DIAGNOSTICS:
        value = row.get(column)
        text = f"{value:.3g}" if isinstance(value, int | float) and math.isfinite(value) else "-"
        shown.append(f"{label} {text}")
    seconds = row.get("seconds")
    took = f" ({seconds:.0f}s)" if isinstance(seconds, int | float) else ""
    return f"[rl] round {row['round']}/{rounds}{took}: " + " | ".join(shown)


def draw_diagnostics(axes: Sequence[Any], rows: Sequence[dict[str, Any]]) -> None:
    """Draw each diagnostic of ``DIAGNOSTICS`` per training round on its own matplotlib axis (``axes`` in that
    order; extra diagnostics beyond ``len(axes)`` are not drawn). Rounds that did not measure one leave a gap."""
    train = [r for r in rows if int(r.get("round", 0)) > 0]
    rounds = [int(r["round"]) for r in train]
    for ax, (column, _, title) in zip(axes, DIAGNOSTICS, strict=False):
        values = [_finite(r.get(column)) for r in train]
        ax.plot(rounds, [math.nan if v is None else v for v in values], marker="o", markersize=3)
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("RL round", fontsize=8)
        ax.tick_params(labelsize=8)


def write_metrics(run_dir: Path, rows: Sequence[dict[str, Any]]) -> None:
    """Write every row so far to ``run_dir/rl_metrics.csv`` (union of columns, first-seen order) and ``.json``."""
    run_dir.mkdir(parents=True, exist_ok=True)
    columns: list[str] = []
    for row in rows:
        columns.extend(k for k in row if k not in columns)
    tmp = run_dir / f".{CSV_NAME}.tmp"
    with open(tmp, "w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=columns, restval="")
        writer.writeheader()
        writer.writerows(rows)
    os.replace(tmp, run_dir / CSV_NAME)
    tmp = run_dir / f".{JSON_NAME}.tmp"
    clean = [{k: _finite(v) for k, v in row.items()} for row in rows]
    tmp.write_text(json.dumps(clean, indent=1, default=str), encoding="utf-8")
    os.replace(tmp, run_dir / JSON_NAME)


def _finite(value: Any) -> Any:
    """NaN/inf become None so the JSON file is standard JSON."""
    return None if isinstance(value, float) and not math.isfinite(value) else value
