"""One LightningRL update step on agent-shaped transitions: long prompts, short responses (the SQL writer's shape).

    .venv/bin/python benchmarks/bench_update.py                      # SmolLM2-135M, 8 x (340 + 30) tokens, ~2 min
    .venv/bin/python benchmarks/bench_update.py --model qwen2.5-coder-0.5b   # another model of agl's catalogue
    git worktree add /tmp/agl-old <rev> && PYTHONPATH=/tmp/agl-old .venv/bin/python benchmarks/bench_update.py

    .venv/bin/python -m benchmarks.bench_update --model qwen2.5-coder-0.5b --store runs/<run>/train.db --compare-sharing
    .venv/bin/python -m benchmarks.bench_update --ranks 2            # the same step on 1 rank, then on 2 (torchrun)
    .venv/bin/python -m benchmarks.bench_update --model qwen2.5-coder-0.5b --store runs/<run>/train.db \
        --micro-batch-tokens 512 [--gradient-checkpointing]          # the demo's step; peak memory with and without

``--store``: the first RL round's recorded calls (``--rollouts``, default 16, of the run's writer and rewriter) instead
of random ones, advantages alternating -1 / +1; ``--compare-sharing`` times the step with ``share_prefixes`` off and
on (each from the same start and LoRA initialisation) and prints the largest parameter difference between the two.
``--model NAME``: a model of agl's catalogue (``agl.serving.models.model_names()``; default ``smollm2-135m``, the
figures quoted so far), prepared with ``prepare_model``; ``--tiny``: the tiny random model instead. The third line
times another revision with the same script (it uses only ``PolicyUpdater``), for before → after. ``--ranks N``: the
step in this process, then under ``torchrun --nproc-per-node N`` with ``UpdateConfig(strategy="ddp")`` (gloo on a
CPU; each rank on its share of the cores): seconds of the step, peak resident memory of each process, and the largest
difference between the trainable parameters after the one-process and the N-rank steps.
torch starts at one thread, what a local policy server in the same process leaves it at; the KL-to-start forward
pass is on (the default). One warm-up step on two transitions, then the timed step. Prints ``key=value`` lines.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

import agl
from agl.core.types import Transition
from agl.cpu import cpu_description, release_free_memory
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


def stored_transitions(path: Path, rollouts: int) -> list[Transition]:
    """The writer and rewriter calls of the first ``rollouts`` train rollouts of a run's store, oldest first, with
    advantages alternating -1 / +1 (the timing does not depend on their values)."""
    from agl.core.store import open_store
    from agl.otel import stored_trajectories
    from examples.sql_agent.train import train_rollouts

    store = open_store(f"sqlite:///{path}")
    try:
        ids = [r.rollout_id for r in train_rollouts(store)[:rollouts]]
        trajectories = stored_trajectories(store, ids, agents="writer|rewriter")
    finally:
        store.close()
    transitions = [t for trajectory in trajectories for t in trajectory.transitions if t.has_token_ids]
    for i, t in enumerate(transitions):
        t.advantage = 1.0 if i % 2 else -1.0
    return transitions


def timed_step(
    model_dir: Path,
    transitions: list[Transition],
    share: bool | None,
    strategy: str | None = None,
    settings: dict[str, object] | None = None,
) -> tuple[PolicyUpdater, float]:
    """A fresh updater (seeded LoRA initialisation), one warm-up step on two transitions, then the timed step;
    ``share`` sets ``share_prefixes`` (None: the revision's default, for an agl that predates the field), ``strategy``
    the update's (None: the default, one process), ``settings`` more ``UpdateConfig`` fields."""
    torch.manual_seed(0)
    options: dict[str, object] = {"lr": 1e-6, **(settings or {})}
    if share is not None:
        options["share_prefixes"] = share
    if strategy is not None:
        options["strategy"] = strategy
    updater = PolicyUpdater(model_dir, UpdateConfig(**options))  # type: ignore[arg-type]
    updater.step(transitions[:2])
    started = time.perf_counter()
    updater.step(transitions)
    return updater, time.perf_counter() - started


def peak_rss_gib() -> float:
    """This process's peak resident memory so far (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def trainable(updater: PolicyUpdater) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in updater.model.named_parameters() if p.requires_grad}


def rank_worker(model_dir: Path, transitions: list[Transition], out: Path) -> None:
    """One rank under torchrun: rank 0 times the step it leads, the others follow it; each writes its figures."""
    from agl.trainers.rl.distributed import UpdateGroup, follow

    rank = int(os.environ["RANK"])
    if rank == 0:
        group = UpdateGroup.join()
        updater, seconds = timed_step(model_dir, transitions, None, "ddp")
        group.stop()
        torch.save(trainable(updater), out / "weights.pt")
    else:
        torch.manual_seed(0)
        updater = PolicyUpdater(model_dir, UpdateConfig(lr=1e-6, strategy="ddp"))
        started = time.perf_counter()
        follow(UpdateGroup.join(), {None: updater})
        seconds = time.perf_counter() - started
    figures = {"seconds": seconds, "peak_rss_gib": peak_rss_gib(), "threads": UpdateGroup.join().threads()}
    (out / f"rank{rank}.json").write_text(json.dumps(figures))


def compare_ranks(args: argparse.Namespace, model_dir: Path, transitions: list[Transition]) -> None:
    """The step in this process, then on ``args.ranks`` ranks under torchrun; prints both and the difference."""
    updater, seconds = timed_step(model_dir, transitions, None)
    print(f"update_step_1rank_s={seconds:.1f} peak_rss_1rank_gib={peak_rss_gib():.2f}")
    single = trainable(updater)
    del updater  # the ranks load their own copies: this one's memory goes back first
    release_free_memory()
    out = Path(tempfile.mkdtemp())
    forwarded = [a for a in sys.argv[1:] if a not in ("--ranks", str(args.ranks))]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={args.ranks}"]
    cmd += ["-m", "benchmarks.bench_update", *forwarded, "--rank-out", str(out)]
    subprocess.run(cmd, check=True, env={**os.environ, "PYTHONPATH": os.getcwd()})
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in range(args.ranks)]
    print(f"update_step_{args.ranks}ranks_s={ranks[0]['seconds']:.1f} threads_per_rank={ranks[0]['threads']}")
    print("peak_rss_per_rank_gib=" + ",".join(f"{r['peak_rss_gib']:.2f}" for r in ranks))
    spread = torch.load(out / "weights.pt")
    diff = max(float((single[k] - spread[k]).abs().max()) for k in single)
    print(f"max_parameter_difference={diff:.2e}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=catalogue(), default=DEFAULT_MODEL, help="a model of agl's catalogue")
    p.add_argument("--tiny", action="store_true", help="the tiny random model instead of --model")
    p.add_argument("--transitions", type=int, default=8)
    p.add_argument("--prompt-tokens", type=int, default=340)
    p.add_argument("--response-tokens", type=int, default=30)
    p.add_argument("--store", type=Path, default=None, help="a run's train.db: its first round's recorded calls")
    p.add_argument("--rollouts", type=int, default=16, help="with --store: rollouts whose calls are trained on")
    p.add_argument("--compare-sharing", action="store_true", help="time share_prefixes off and on")
    p.add_argument("--ranks", type=int, default=None, help="also time the step on this many ranks (torchrun)")
    p.add_argument("--rank-out", type=Path, default=None, help=argparse.SUPPRESS)  # a torchrun rank of --ranks
    p.add_argument("--micro-batch-tokens", type=int, default=None, help="UpdateConfig.micro_batch_tokens (demo: 512)")
    p.add_argument("--gradient-checkpointing", action="store_true", help="UpdateConfig.gradient_checkpointing on")
    args = p.parse_args()
    torch.set_num_threads(1)
    model_dir = make_tiny_model(Path(tempfile.mkdtemp()), seed=0) if args.tiny else prepare(args.model)
    if args.store is not None:
        transitions = stored_transitions(args.store, args.rollouts)
    else:
        transitions = make_transitions(args.transitions, args.prompt_tokens, args.response_tokens)
    if args.rank_out is not None:
        rank_worker(model_dir, transitions, args.rank_out)
        return
    tokens = sum(len(t.prompt_ids) + len(t.response_ids) for t in transitions)
    print(f"agl={agl.__file__}")
    print(f"cpu={cpu_description()}")
    print(f"transitions={len(transitions)} tokens={tokens}")
    if args.ranks is not None:
        compare_ranks(args, model_dir, transitions)
        return
    settings = (False, True) if args.compare_sharing else (None,)
    fields: dict[str, object] = {"gradient_checkpointing": args.gradient_checkpointing}
    if args.micro_batch_tokens is not None:
        fields["micro_batch_tokens"] = args.micro_batch_tokens
    weights: list[dict[str, torch.Tensor]] = []
    for share in settings:
        updater, seconds = timed_step(model_dir, transitions, share, settings=fields)
        label = "" if share is None else f"_{'shared' if share else 'whole'}"
        lora = getattr(updater.config, "lora", None) is not None
        print(f"model={'tiny' if args.tiny else args.model} lora={lora} share_prefixes={share}")
        print(f"update_step{label}_s={seconds:.1f}")
        print(f"tokens_per_s{label}={tokens / seconds:.0f}")
        print(f"peak_rss_gib={peak_rss_gib():.2f} {' '.join(f'{k}={v}' for k, v in fields.items())}")
        weights.append(updater.state_dict())
    if len(weights) == 2:
        diff = max(float((weights[0][k] - weights[1][k]).abs().max()) for k in weights[0])
        print(f"max_parameter_difference={diff:.2e}")


if __name__ == "__main__":
    main()
