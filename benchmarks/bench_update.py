"""One LightningRL update step on agent-shaped transitions: long prompts, short responses (the SQL writer's shape).

    .venv/bin/python benchmarks/bench_update.py                      # SmolLM2-135M, 8 x (340 + 30) tokens, ~2 min
    .venv/bin/python benchmarks/bench_update.py --model qwen2.5-coder-0.5b   # another model of agl's catalogue
    git worktree add /tmp/agl-old <rev> && PYTHONPATH=/tmp/agl-old .venv/bin/python benchmarks/bench_update.py

``--model NAME``: a model of agl's catalogue (``agl.serving.models.model_names()``; default ``smollm2-135m``, the
figures quoted so far), prepared with ``prepare_model``; ``--tiny``: the tiny random model instead. The third line
times another revision with the same script (it uses only ``PolicyUpdater``), for before → after.
torch starts at one thread, what a local policy server in the same process leaves it at; the KL-to-start forward
pass is on (the default). One warm-up step on two transitions, then the timed step. Prints ``key=value`` lines.
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from pathlib import Path

import torch

import agl
from agl.core.types import Transition
from agl.serving import models
from agl.serving.models import make_tiny_model
from agl.trainers.rl.update import PolicyUpdater, UpdateConfig

DEFAULT_MODEL = "smollm2-135m"


def catalogue() -> list[str]:
    """The catalogue's names; an agl from before the catalogue (``PYTHONPATH=/tmp/agl-old``) has SmolLM2 only."""
    return models.model_names() if hasattr(models, "model_names") else [DEFAULT_MODEL]


def prepare(name: str) -> Path:
    """``prepare_model(name)``; ``prepare_smollm2()`` on an agl from before the catalogue."""
    if hasattr(models, "prepare_model"):
        return Path(models.prepare_model(name))
    return Path(models.prepare_smollm2())


def make_transitions(count: int, prompt_tokens: int, response_tokens: int, seed: int = 0) -> list[Transition]:
    """``count`` writer-shaped transitions of random token ids (1000-40000: in every catalogue model's vocabulary),
    behaviour log-probs -1 and advantages alternating -1 / +1."""
    rng = random.Random(seed)
    return [
        Transition(
            span_id=f"s{i}",
            agent="writer",
            step=0,
            prompt_ids=[rng.randrange(1000, 40000) for _ in range(prompt_tokens)],
            response_ids=[rng.randrange(1000, 40000) for _ in range(response_tokens)],
            response_logprobs=[-1.0] * response_tokens,
            advantage=1.0 if i % 2 else -1.0,
        )
        for i in range(count)
    ]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=catalogue(), default=DEFAULT_MODEL, help="a model of agl's catalogue")
    p.add_argument("--tiny", action="store_true", help="the tiny random model instead of --model")
    p.add_argument("--transitions", type=int, default=8)
    p.add_argument("--prompt-tokens", type=int, default=340)
    p.add_argument("--response-tokens", type=int, default=30)
    args = p.parse_args()
    torch.set_num_threads(1)
    model_dir = make_tiny_model(Path(tempfile.mkdtemp()), seed=0) if args.tiny else prepare(args.model)
    updater = PolicyUpdater(model_dir, UpdateConfig(lr=1e-6))
    transitions = make_transitions(args.transitions, args.prompt_tokens, args.response_tokens)
    updater.step(transitions[:2])
    started = time.perf_counter()
    updater.step(transitions)
    seconds = time.perf_counter() - started
    tokens = args.transitions * (args.prompt_tokens + args.response_tokens)
    print(f"agl={agl.__file__}")
    print(f"model={'tiny' if args.tiny else args.model} lora={getattr(updater.config, 'lora', None) is not None}")
    print(f"transitions={args.transitions} tokens={tokens}")
    print(f"update_step_s={seconds:.1f}")
    print(f"tokens_per_s={tokens / seconds:.0f}")


if __name__ == "__main__":
    main()
