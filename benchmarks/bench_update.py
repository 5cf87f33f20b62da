"""One LightningRL update step on agent-shaped transitions: long prompts, short responses (the SQL writer's shape).

    .venv/bin/python benchmarks/bench_update.py                      # SmolLM2-135M, 8 x (340 + 30) tokens, ~2 min
    git worktree add /tmp/agl-old <rev> && PYTHONPATH=/tmp/agl-old .venv/bin/python benchmarks/bench_update.py

The second line times another revision with the same script (it uses only ``PolicyUpdater``), for before → after.
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
from agl.serving.models import make_tiny_model, prepare_smollm2
from agl.trainers.rl.update import PolicyUpdater, UpdateConfig


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--tiny", action="store_true", help="the tiny random model instead of SmolLM2-135M")
    p.add_argument("--transitions", type=int, default=8)
    p.add_argument("--prompt-tokens", type=int, default=340)
    p.add_argument("--response-tokens", type=int, default=30)
    args = p.parse_args()
    torch.set_num_threads(1)
    model_dir = make_tiny_model(Path(tempfile.mkdtemp()), seed=0) if args.tiny else prepare_smollm2()
    updater = PolicyUpdater(model_dir, UpdateConfig(lr=1e-6))
    rng = random.Random(0)
    transitions = [
        Transition(
            span_id=f"s{i}",
            agent="writer",
            step=0,
            prompt_ids=[rng.randrange(1000, 40000) for _ in range(args.prompt_tokens)],
            response_ids=[rng.randrange(1000, 40000) for _ in range(args.response_tokens)],
            response_logprobs=[-1.0] * args.response_tokens,
            advantage=1.0 if i % 2 else -1.0,
        )
        for i in range(args.transitions)
    ]
    updater.step(transitions[:2])
    started = time.perf_counter()
    updater.step(transitions)
    seconds = time.perf_counter() - started
    tokens = args.transitions * (args.prompt_tokens + args.response_tokens)
    print(f"agl={agl.__file__}")
    print(f"transitions={args.transitions} tokens={tokens}")
    print(f"update_step_s={seconds:.1f}")
    print(f"tokens_per_s={tokens / seconds:.0f}")


if __name__ == "__main__":
    main()
