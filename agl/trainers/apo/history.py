"""Every candidate APO considered, and the files that show them: ``apo_history.json`` and ``apo_report.md``.

Both files are rewritten (temporary file, then rename) after every iteration, so they are complete and readable at
any moment of a run, and a crash leaves the history up to the last finished iteration. Single writer (the algorithm).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

HISTORY_NAME = "apo_history.json"
REPORT_NAME = "apo_report.md"


@dataclass
class Candidate:
    """One set of prompts the search considered.

    ``rewards`` holds every training reward per task id (a candidate kept in the beam is re-evaluated on later
    minibatches); ``val_rewards`` the validation rewards. ``survived`` lists the iterations after which it was in the
    beam. A ``rejected`` candidate failed ``check_edit`` (``reason``) and never ran.
    """

    id: str
    parent: str | None
    iteration: int
    prompts: dict[str, str]
    critique: str | None = None
    status: Literal["evaluated", "rejected"] = "evaluated"
    reason: str | None = None
    resources_version: int | None = None
    rewards: dict[str, list[float]] = field(default_factory=dict)
    val_rewards: dict[str, list[float]] = field(default_factory=dict)
    survived: list[int] = field(default_factory=list)

    def scores(self) -> dict[str, float]:
        """Mean training reward per task."""
        return {task: sum(r) / len(r) for task, r in self.rewards.items() if r}

    @property
    def mean(self) -> float | None:
        """Mean over the tasks it ran on of its per-task mean training reward (None before it ran)."""
        scores = self.scores()
        return sum(scores.values()) / len(scores) if scores else None

    @property
    def val_mean(self) -> float | None:
        """Mean validation reward per task, averaged over tasks (None without validation)."""
        per_task = [sum(r) / len(r) for r in self.val_rewards.values() if r]
        return sum(per_task) / len(per_task) if per_task else None

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "scores": self.scores(), "mean": self.mean, "val_mean": self.val_mean}


def write_history(run_dir: Path, candidates: Sequence[Candidate], summary: dict[str, Any]) -> None:
    """Write ``apo_history.json`` (summary + every candidate) and the readable ``apo_report.md`` into ``run_dir``."""
    run_dir.mkdir(parents=True, exist_ok=True)
    data = {"summary": summary, "candidates": [c.to_dict() for c in candidates]}
    _replace(run_dir / HISTORY_NAME, json.dumps(data, indent=1, default=str))
    _replace(run_dir / REPORT_NAME, render_report(candidates, summary))


def _replace(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def _fmt(value: float | None) -> str:
    return "—" if value is None else f"{value:.3f}"


def render_report(candidates: Sequence[Candidate], summary: dict[str, Any]) -> str:
    """Markdown: the outcome, a table of every candidate, then each candidate's prompts, critique and scores."""
    lines = ["# APO report", ""]
    chosen = summary.get("chosen")
    if chosen:
        lines.append(f"**Published: {chosen}** (resources v{summary.get('published_version', '?')}).")
    lines.append(
        f"Iterations: {summary.get('iterations', 0)}; rollouts: {summary.get('rollouts', 0)} of "
        f"{summary.get('rollout_budget', '?')} (+{summary.get('val_rollouts', 0)} validation); "
        f"selection: {summary.get('selection', '?')}, beam width {summary.get('beam_width', '?')}; "
        f"stopped: {summary.get('stop_reason', 'running')}."
    )
    if summary.get("unparsed_replies"):
        lines += [
            "",
            f"Optimizer edit replies with no usable version: {summary['unparsed_replies']}. The last one:",
            "",
            *[f"> {line}" for line in str(summary.get("last_unparsed_reply") or "").splitlines()],
        ]
    lines += [
        "",
        "| id | parent | iteration | status | train mean | val mean | in beam after |",
        "|---|---|---|---|---|---|---|",
    ]
    for c in candidates:
        status = c.status if c.status == "evaluated" else f"rejected: {c.reason}"
        lines.append(
            f"| {c.id} | {c.parent or '—'} | {c.iteration} | {status} | {_fmt(c.mean)} | {_fmt(c.val_mean)} | "
            f"{', '.join(map(str, c.survived)) or '—'} |"
        )
    for c in candidates:
        lines += ["", f"## {c.id}" + (f" (from {c.parent})" if c.parent else " (starting prompts)"), ""]
        for name, text in c.prompts.items():
            lines += [f"`{name}`:", "", "```text", text, "```", ""]
        if c.critique:
            lines += ["Critique:", "", *[f"> {line}" for line in c.critique.splitlines()], ""]
        if c.reason:
            lines += [f"Rejected: {c.reason}", ""]
        scores = c.scores()
        if scores:
            lines.append("Per-task training score: " + ", ".join(f"{t}={s:.2f}" for t, s in sorted(scores.items())))
    return "\n".join(lines).rstrip() + "\n"
