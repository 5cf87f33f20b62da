"""Compare two models of two demo runs on the same questions: paired difference, 95% interval, McNemar's test.

    python -m examples.sql_agent.compare runs/A/metrics.json:sft_rl runs/B/metrics.json:rl

Each argument is a run's ``metrics.json`` and the label of one model it evaluated (``base``, ``sft``, ``sft_rl``,
``rl``, ``apo``). The comparison is B − A on each evaluation group (``test``, ``independent``), on the questions both
runs answered; runs that evaluated different questions of a group are refused (the comparison would not be paired).

``--curves PNG`` also prints both runs' LightningRL rounds side by side (replies that are a query, queries that ran,
train accuracy, transitions trained, zero-variance groups) and draws them, one line per run: the AIR ablation's
curves; ``--also <run>/metrics.json`` (repeatable) adds another run's rounds to them.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from agl.core.stats import PairedComparison, compare_paired
from examples.sql_agent.sql_data import load_split
from examples.sql_agent.train import GROUPS, LABELS


def outcomes(spec: str) -> tuple[str, dict[str, bool]]:
    """``path:label`` → (a display name, task id → correct) of that model in that run."""
    path, sep, label = spec.rpartition(":")
    if not sep or not path:
        raise ValueError(f"{spec!r}: expected <metrics.json>:<label>, e.g. runs/x/metrics.json:sft_rl")
    metrics: dict[str, Any] = json.loads(Path(path).read_text(encoding="utf-8"))
    models = metrics.get("outcomes", {})
    if label not in models:
        raise ValueError(f"{path}: no model {label!r} evaluated (it has: {', '.join(models) or 'none'})")
    run = Path(path).parent.name
    return f"{LABELS.get(label, label)} ({run})", {str(k): bool(v) for k, v in models[label].items()}


def compare_runs(a: dict[str, bool], b: dict[str, bool], seed: int = 0) -> dict[str, PairedComparison]:
    """B − A per evaluation group, on the questions of that group both evaluated (refused when they differ)."""
    out: dict[str, PairedComparison] = {}
    for group in GROUPS:
        ids = {t.id for t in load_split(group)}
        in_a, in_b = sorted(ids & a.keys()), sorted(ids & b.keys())
        if in_a != in_b:
            raise ValueError(f"{group}: the two runs evaluated different questions ({len(in_a)} vs {len(in_b)})")
        if in_a:
            out[group] = compare_paired([a[i] for i in in_a], [b[i] for i in in_a], seed=seed)
    return out


#: What ``--curves`` shows per RL round: (metrics key, panel title, table header).
CURVES = (
    ("query_reply_rate", "writer/rewriter replies that are a query", "query replies"),
    ("executable_rate", "run_sql queries that ran", "queries ran"),
    ("success_rate", "train accuracy", "train acc."),
    ("trained_transitions", "transitions trained", "trained"),
    ("zero_variance_fraction", "zero-variance groups (skipped)", "zero-var."),
)


def rl_rounds(path: str) -> list[dict[str, Any]]:
    """The LightningRL rounds (round > 0) a run's ``metrics.json`` recorded; refused when it recorded none."""
    metrics: dict[str, Any] = json.loads(Path(path).read_text(encoding="utf-8"))
    rows = [r for r in metrics.get("rl_rounds", []) if int(r.get("round", 0)) > 0]
    if not rows:
        raise ValueError(f"{path}: no LightningRL rounds recorded (a --method rl run has them)")
    return rows


def _cell(row: dict[str, Any], key: str) -> str:
    value = row.get(key)
    if value is None:
        return "–"
    return f"{value:.0%}" if key != "trained_transitions" else str(int(value))


def curves_table(runs: dict[str, list[dict[str, Any]]]) -> str:
    """A markdown table: one line per round, each run's per-round figures side by side."""
    names = list(runs)
    header = ["round"] + [f"{name}: {title}" for name in names for _, _, title in CURVES]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    by_round = {name: {int(r["round"]): r for r in rows} for name, rows in runs.items()}
    for number in sorted({n for rows in by_round.values() for n in rows}):
        cells = [str(number)]
        for name in names:
            row = by_round[name].get(number, {})
            cells += [_cell(row, key) for key, _, _ in CURVES]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def draw_curves(runs: dict[str, list[dict[str, Any]]], path: Path) -> Path:
    """One panel per ``CURVES`` entry, one line per run, against the RL round."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, axes = plt.subplots(1, len(CURVES), figsize=(4.5 * len(CURVES), 3.6))
    for ax, (key, title, _) in zip(axes, CURVES, strict=True):
        for name, rows in runs.items():
            points = [(int(r["round"]), float(r[key])) for r in rows if r.get(key) is not None]
            ax.plot([x for x, _ in points], [y for _, y in points], marker="o", label=name)
        ax.set_title(title)
        ax.set_xlabel("RL round")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        if key != "trained_transitions":
            ax.set_ylim(-0.02, 1.02)
    axes[0].legend(loc="best")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Paired comparison of two models of two SQL demo runs (B − A).")
    p.add_argument("a", help="<run>/metrics.json:<label> (A)")
    p.add_argument("b", help="<run>/metrics.json:<label> (B)")
    p.add_argument("--seed", type=int, default=0, help="seed of the paired bootstrap")
    p.add_argument(
        "--curves", type=Path, help="also print both runs' RL rounds side by side and draw them into this PNG"
    )
    p.add_argument(
        "--also", action="append", default=[], help="with --curves: another run's metrics.json whose rounds to add"
    )
    args = p.parse_args(argv)
    if args.also and args.curves is None:
        p.error("--also adds runs to --curves: give --curves too")
    try:
        (name_a, a), (name_b, b) = outcomes(args.a), outcomes(args.b)
        comparisons = compare_runs(a, b, args.seed)
        runs: dict[str, list[dict[str, Any]]] = {}
        if args.curves is not None:
            paths = [Path(spec.rpartition(":")[0]) for spec in (args.a, args.b)] + [Path(x) for x in args.also]
            folders = [p.parent.name for p in paths]
            named = folders if len(set(folders)) == len(folders) else paths
            runs = {str(name): rl_rounds(str(path)) for name, path in zip(named, paths, strict=True)}
    except (OSError, ValueError) as exc:
        print(f"compare: {exc}", file=sys.stderr)
        return 1
    for group, c in comparisons.items():
        print(
            f"{group} ({c.n} questions): {name_a} {c.accuracy_a:.1%}, {name_b} {c.accuracy_b:.1%}; "
            f"B − A {c.describe(name_a, name_b)}"
        )
    if runs:
        print("\n" + curves_table(runs))
        print(f"\ncurves: {draw_curves(runs, args.curves)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
