"""What the SQL agent's schema view and identifier check cost and bring, on the same questions: accuracy per group and
tier, the share of final queries that named only existing tables and columns and the share that ran, the writer's
prompt tokens and questions/s, each variant paired against the first.

``python -m benchmarks.bench_schema_views [--model NAME] [--groups dev] [--variants bare,compact,rows,values]``

Variants (``VARIANTS``): ``bare`` is the agent before either remedy (``CREATE TABLE`` lines, SQLite's own error for
an unknown name); ``compact``, ``rows`` and ``values`` are the schema views of ``examples/sql_agent/schema.py``, each
with the identifier check. Each variant is one greedy evaluation of the model, untrained, exactly as the SQL demo runs
it (``examples.sql_agent.train.evaluate``: 16 runners, 64 tokens per call). Views are chosen on ``dev``; ``--groups
test,independent`` measures the chosen one where nothing was tuned. Writes ``benchmarks/results/schema-views.json``.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Any

from agl.core.stats import compare_paired
from agl.cpu import cpu_description
from agl.serving.models import DEFAULT_MODEL, model_names, prepare_model
from examples.sql_agent.train import Settings, agent_tasks, evaluate, held_out_tasks

RESULTS = Path(__file__).resolve().parent / "results"
VARIANTS: dict[str, tuple[str, bool]] = {
    "bare": ("compact", False),
    "compact": ("compact", True),
    "rows": ("rows", True),
    "values": ("values", True),
}
"""Variant → (schema view, identifier check)."""


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=DEFAULT_MODEL, choices=model_names())
    p.add_argument("--groups", default="dev", help="comma-separated splits evaluated (default dev)")
    p.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated, of {', '.join(VARIANTS)}")
    p.add_argument("-n", type=int, default=None, help="questions per group (a tier-stratified sample; default all)")
    p.add_argument("--no-cache", action="store_true", help="measure again a variant evaluated before")
    p.add_argument("--out", type=Path, default=RESULTS / "schema-views.json")
    args = p.parse_args()
    variants = args.variants.split(",")
    if unknown := [v for v in variants if v not in VARIANTS]:
        p.error(f"--variants: unknown {', '.join(unknown)}; choose from {', '.join(VARIANTS)}")
    model_dir = prepare_model(args.model)
    print(f"[bench] {args.model} untrained on {args.groups}; {cpu_description()}", flush=True)
    results: dict[str, Any] = {}
    questions_of: dict[str, list[str]] = {}
    with tempfile.TemporaryDirectory(prefix="agl-schema-views-") as tmp:
        for name in variants:
            view, check = VARIANTS[name]
            s = Settings(out=Path(tmp) / name, schema_view=view, check_names=check, use_cache=not args.no_cache)
            s.out.mkdir()
            groups = {g: agent_tasks(s, held_out_tasks(args.n, s.seed, g)) for g in args.groups.split(",")}
            questions_of = {g: [t["id"] for t in tasks] for g, tasks in groups.items()}
            result = evaluate(s, model_dir, groups, "base")
            questions = sum(len(g) for g in groups.values())
            results[name] = {**result, "questions_per_s": questions / max(result["seconds"], 1e-9)}
            print(report_line(name, results[name]), flush=True)
    first = variants[0]
    for name in variants[1:]:
        for group, ids in questions_of.items():
            a = [results[first]["outcomes"][i]["correct"] for i in ids]
            b = [results[name]["outcomes"][i]["correct"] for i in ids]
            print(f"[bench] {group}: {compare_paired(a, b).describe(first, name)}", flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    payload = {"model": args.model, "cpu": cpu_description(), "groups": args.groups.split(","), "variants": results}
    args.out.write_text(json.dumps(payload, indent=2, default=str))
    print(f"[bench] wrote {args.out}", flush=True)


def report_line(name: str, result: dict[str, Any]) -> str:
    """One variant's figures, group by group."""
    parts = []
    for group, g in result["groups"].items():
        tiers = " ".join(f"{k} {v:.0%}" for k, v in g["by_tier"].items())
        parts.append(
            f"{group} {g['correct']}/{g['n']} ({g['accuracy']:.1%}; {tiers}); ran {g['executed']:.0%}, "
            f"names ok {g['identifiers_ok']:.0%}, writer prompt {g['prompt_tokens']:.0f} tokens"
        )
    return f"[bench] {name}: " + " | ".join(parts) + f" | {result['questions_per_s']:.2f} questions/s"


if __name__ == "__main__":
    main()
