"""Rollouts/s end to end: 8 runner processes × agents making 5 LLM calls each, against the fake LLM (instant replies).

Measures agl's own overhead per rollout (queue, lease, gateway, span capture, trajectory building); the model is free.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import agl
from agl.testing import FakeLLM
from benchmarks.bench_agents import five_call_agent


def run(n_rollouts: int = 200, n_runners: int = 8) -> dict[str, Any]:
    with (
        FakeLLM(lambda body: "ok") as fake,
        tempfile.TemporaryDirectory() as tmp,
        agl.Trainer(
            n_runners=n_runners,
            store=f"sqlite:///{tmp}/bench.db",
            resources={"main_llm": agl.LLM(base_url=fake.base_url, model="fake")},
            progress=False,
        ) as trainer,
    ):
        trainer.evaluate(five_call_agent, [{"i": i} for i in range(n_runners * 2)])  # warm-up: runners up
        start = time.perf_counter()
        batch = trainer.evaluate(five_call_agent, [{"i": i} for i in range(n_rollouts)])
        elapsed = time.perf_counter() - start
    calls = sum(len(t.transitions) for t in batch.trajectories)
    return {"rollouts_per_s": n_rollouts / elapsed, "llm_calls_per_s": calls / elapsed, "seconds": elapsed}


if __name__ == "__main__":
    r = run()
    print(f"rollouts_per_s={r['rollouts_per_s']:.1f}")
    print(f"captured_llm_calls_per_s={r['llm_calls_per_s']:.1f}")
