"""Supervised warm start speed on this machine: seconds per optimizer step and peak memory, with and without
gradient checkpointing, on the SQL demo's own writer demonstrations (SmolLM2-135M on CPU by default).

    .venv/bin/python -m benchmarks.bench_sft              # SmolLM2-135M, 2 steps per setting, ~6 min on 2 cores
    .venv/bin/python -m benchmarks.bench_sft --tiny       # the tiny random model, seconds
    .venv/bin/python -m benchmarks.bench_sft --model qwen2.5-coder-0.5b   # another model of agl's catalogue

``--model NAME``: a model of agl's catalogue (``agl.serving.models.model_names()``; default ``smollm2-135m``, the
figures quoted so far), prepared with ``prepare_model``; ``--tiny`` overrides it.

Each setting runs in a fresh process (spawned), so peak RSS is its own; the settings alternate over ``--repeats``
so drifting load falls on both. Prints ``key=value`` lines.
"""

from __future__ import annotations

import argparse
import multiprocessing
import resource
import statistics
import tempfile
import time
from pathlib import Path


def one_run(model_dir: str, demos: int, checkpointing: bool) -> dict[str, float]:
    """Train on ``demos`` writer demonstrations; seconds per optimizer step and the process's peak RSS (MiB)."""
    from transformers import AutoTokenizer

    from agl.trainers.sft import SFTConfig
    from agl.trainers.sft.train import train_samples
    from examples.sql_agent.sql_data import load_split
    from examples.sql_agent.train import demonstrations

    samples = demonstrations(AutoTokenizer.from_pretrained(model_dir), load_split("train", demos))
    cfg = SFTConfig(model_dir=model_dir, lr=5e-5, batch_tokens=4096, device="cpu", gradient_checkpointing=checkpointing)
    with tempfile.TemporaryDirectory() as out:
        started = time.perf_counter()
        result = train_samples(samples, cfg, Path(out) / "sft")
        seconds = time.perf_counter() - started
    return {
        "seconds_per_step": float(result.metrics["seconds_per_step"]),
        "steps": float(result.metrics["optimizer_steps"]),
        "seconds": seconds,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def main() -> None:
    from agl.serving.models import make_tiny_model, model_names, prepare_model

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=model_names(), default="smollm2-135m", help="a model of agl's catalogue")
    p.add_argument("--tiny", action="store_true", help="the tiny random model instead of --model")
    p.add_argument("--steps", type=int, default=2, help="optimizer steps per run (about 10 demonstrations each)")
    p.add_argument("--repeats", type=int, default=1, help="runs per setting, alternating")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = str(make_tiny_model(Path(tmp) / "tiny", seed=0) if args.tiny else prepare_model(args.model))
        print(f"model={'tiny' if args.tiny else args.model}")
        demos = 10 * args.steps
        results: dict[bool, list[dict[str, float]]] = {False: [], True: []}
        ctx = multiprocessing.get_context("spawn")
        for _ in range(args.repeats):
            for checkpointing in (False, True):
                with ctx.Pool(1) as pool:
                    results[checkpointing].append(pool.apply(one_run, (model_dir, demos, checkpointing)))
        for checkpointing, runs in results.items():
            name = "checkpointing" if checkpointing else "no_checkpointing"
            for key in ("seconds_per_step", "peak_rss_mib"):
                print(f"{name}.{key}={statistics.median(r[key] for r in runs):.1f}")
            print(f"{name}.steps={int(runs[0]['steps'])}")
        ratio = statistics.median(r["seconds_per_step"] for r in results[True]) / statistics.median(
            r["seconds_per_step"] for r in results[False]
        )
        print(f"speedup_without_checkpointing={ratio:.2f}")


if __name__ == "__main__":
    main()
