"""Compare two models of two demo runs on the same questions: paired difference, 95% interval, McNemar's test.

    python -m examples.sql_agent.compare runs/A/metrics.json:sft_rl runs/B/metrics.json:rl

Each argument is a run's ``metrics.json`` and the label of one model it evaluated (``base``, ``sft``, ``sft_rl``,
``rl``, ``apo``). The comparison is B − A on each evaluation group (``test``, ``independent``), on the questions both
runs answered; runs that evaluated different questions of a group are refused (the comparison would not be paired).
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


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Paired comparison of two models of two SQL demo runs (B − A).")
    p.add_argument("a", help="<run>/metrics.json:<label> (A)")
    p.add_argument("b", help="<run>/metrics.json:<label> (B)")
    p.add_argument("--seed", type=int, default=0, help="seed of the paired bootstrap")
    args = p.parse_args(argv)
    try:
        (name_a, a), (name_b, b) = outcomes(args.a), outcomes(args.b)
        comparisons = compare_runs(a, b, args.seed)
    except (OSError, ValueError) as exc:
        print(f"compare: {exc}", file=sys.stderr)
        return 1
    for group, c in comparisons.items():
        print(
            f"{group} ({c.n} questions): {name_a} {c.accuracy_a:.1%}, {name_b} {c.accuracy_b:.1%}; "
            f"B − A {c.describe(name_a, name_b)}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
