"""Questions per second of a greedy SQL-agent evaluation against the local policy server: before → after in one run.

``python -m benchmarks.bench_sql_eval [--model NAME] [--questions N] [--rounds R] [--variants before,after,...]
[--rl-tasks K]``

The evaluation is the one ``examples/sql_agent/train.py`` runs: the LangGraph agent (writer → execute → checker →
rewriter) on held-out questions, greedy, 64 tokens at most per call, through agl's gateway. One Trainer (its runners,
gateway and store) per runner count serves its variants' measurements; each variant is a ``PolicyServer`` on the
model (``--model``: a name of agl's catalogue, ``agl.serving.models.model_names()``, prepared with ``prepare_model``;
default ``smollm2-135m``, what this benchmark always measured) started on the same port, so only the server (and the
runner count) changes between them. The variants of a runner count take turns on the same questions, ``--rounds``
times (the machine's other load drifts over minutes; alternating spreads it over all of them); the runner counts run
one after the other:

* ``before``: one engine with one intra-op thread remembering its last 4 prompts: the engine of commit
  ``ca25bfb`` (recovered with ``git show``, as ``bench_policy_server`` does) in a one-thread server, 8 runners;
* ``after``: ``PolicyServer``'s defaults (one replica, half the cores, prompt prefixes kept within a memory budget),
  8 runners;
* ``one-engine-2-threads``: the defaults with two intra-op threads (one per core on 2 cores), 8 runners;
* ``two-replicas``: two single-threaded replicas (copies of the model) behind the endpoint, 8 runners;
* ``demo``: what the SQL demo's evaluation runs (``examples/sql_agent/train.py``: ``serve_checkpoint``): 16 runners
  into a batch of 16, decoded on every core;
* ``demo-batched-prefill``: ``demo`` with the engine of commit ``646feff``, the last that prefilled the new prompts
  of a step together, left-padded in one forward pass (today's prefills one prompt per pass).

Reported per variant and round: questions/s, the process's CPU use (all its threads: decoding, gateway, store; the
runners are other processes), and the server's prompt-prefix counters (hits, misses, share of prompt tokens reused).
``--rl-tasks K`` adds an RL-like round per variant: K questions × group size 4 at temperature 0.8 (what a
LightningRL round samples), reported as rollouts/s. Printed with each measurement: the load average before and after,
the process's peak resident memory (``agl.cpu.ResidentPeak``: the kernel's high-water mark, reset after freed heap
memory went back to the system, so one variant's leftovers do not count as the next's), and how many greedy answers
equal the first measurement's (every call's response token ids of each question, compared).
Writes ``benchmarks/results/sql-eval.json`` (``--out`` to change).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

import agl
from agl.cpu import ResidentPeak, cpu_description, usable_cores
from agl.serving.models import model_names, prepare_model
from agl.serving.policy_server import PolicyServer
from benchmarks.bench_policy_server import engine_at, install_engine
from examples.sql_agent.agent import sql_agent
from examples.sql_agent.train import AGENTS, held_out_tasks, prompt_resources

RESULTS = Path(__file__).resolve().parent / "results"
OLD_ENGINE_COMMIT = "ca25bfb"
"""The last engine with one worker and a prompt-prefix memory of 4 entries."""
BATCHED_PREFILL_COMMIT = "646feff"
"""The last engine that prefilled a step's new prompts together in one left-padded forward pass."""

DEFAULT_MODEL = "smollm2-135m"
"""The model this benchmark measured before it took ``--model``: the figures quoted so far are of it."""
GROUP_SIZE = 4
RL_TEMPERATURE = 0.8
MAX_TOKENS = 64
N_RUNNERS = 8
DEMO_RUNNERS = 16


@dataclass(frozen=True)
class Variant:
    """A server factory (a not yet started server listening on the benchmark's port) and the runners feeding it."""

    make: Callable[[], PolicyServer]
    runners: int = N_RUNNERS


def make_variants(model_dir: Path, port: int) -> dict[str, Variant]:
    """Each variant: a server on ``model_dir`` listening on ``port``, and its runner count."""

    def server(max_batch_size: int = N_RUNNERS, **options: Any) -> PolicyServer:
        return PolicyServer(model_dir, seed=0, max_batch_size=max_batch_size, port=port, **options)

    def before() -> PolicyServer:
        old = server(replicas=1, threads=1)
        install_engine(old, engine_at(OLD_ENGINE_COMMIT), 1)
        return old

    def demo() -> PolicyServer:
        return server(DEMO_RUNNERS, threads=usable_cores())

    def demo_batched_prefill() -> PolicyServer:
        previous = demo()
        install_engine(previous, engine_at(BATCHED_PREFILL_COMMIT), usable_cores())
        return previous

    return {
        "before": Variant(before),
        "after": Variant(server),
        "one-engine-2-threads": Variant(lambda: server(replicas=1, threads=2)),
        "two-replicas": Variant(lambda: server(replicas=2, threads=1)),
        "demo": Variant(demo, DEMO_RUNNERS),
        "demo-batched-prefill": Variant(demo_batched_prefill, DEMO_RUNNERS),
    }


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def answers(batch: agl.RolloutBatch) -> dict[str, list[list[int]]]:
    """Each question's greedy answer: the response token ids of every call of its rollout, by task id."""
    return {str(t.task["id"]): [call.response_ids for call in t.transitions] for t in batch.trajectories}


def measure(trainer: agl.Trainer, make: Callable[[], PolicyServer], tasks: list[dict[str, Any]]) -> dict[str, Any]:
    """Evaluate ``tasks`` once against a fresh server from ``make``; the server's load is not timed."""
    with ResidentPeak() as memory:
        server = make().start()
        try:
            load_before = os.getloadavg()[0]
            cpu, started = time.process_time(), time.perf_counter()
            batch = trainer.evaluate(sql_agent, tasks)
            seconds = time.perf_counter() - started
            cpu = time.process_time() - cpu
            stats = server.stats
        finally:
            server.stop()
    reused = getattr(stats, "reused_prompt_tokens", 0)
    prompt_tokens = getattr(stats, "prompt_tokens", 0)  # the old engine does not count them
    return {
        "rollouts": len(tasks),
        "seconds": seconds,
        "per_second": len(tasks) / seconds,
        "process_cpu_percent": 100 * cpu / seconds,
        "succeeded": sum(1 for reward in batch.rewards if reward >= 1.0),
        "failed": batch.summary["failed"],
        "load_before": load_before,
        "load_after": os.getloadavg()[0],
        "stats": asdict(stats),
        "reused_share": reused / prompt_tokens if prompt_tokens else None,
        "peak_resident_bytes": memory.peak,
        "answers": answers(batch),
    }


def run_phase(
    out: Path,
    label: str,
    sampling: dict[str, Any],
    port: int,
    tasks: list[dict[str, Any]],
    variants: dict[str, Variant],
    rounds: int,
) -> dict[str, list[dict[str, Any]]]:
    """Per runner count, one Trainer whose LLM is ``http://127.0.0.1:port/v1`` with ``sampling``; its variants take
    turns on ``tasks``."""
    llm = agl.LLM(base_url=f"http://127.0.0.1:{port}/v1", model="policy", sampling=sampling)
    results: dict[str, list[dict[str, Any]]] = {name: [] for name in variants}
    for runners in sorted({v.runners for v in variants.values()}):
        group = {name: v for name, v in variants.items() if v.runners == runners}
        run_group(out, f"{label}-{runners}", llm, runners, tasks, group, rounds, results)
    return results


def run_group(
    out: Path,
    label: str,
    llm: agl.LLM,
    runners: int,
    tasks: list[dict[str, Any]],
    variants: dict[str, Variant],
    rounds: int,
    results: dict[str, list[dict[str, Any]]],
) -> None:
    """The variants fed by ``runners`` runners take turns on ``tasks``, ``rounds`` times; adds to ``results``."""
    with agl.Trainer(
        n_runners=runners,
        store=f"sqlite:///{out}/{label}.db",
        resources={"main_llm": llm, **prompt_resources(None)},
        agents=AGENTS,
        allow_capture_failures=True,
        run_dir=out,
    ) as trainer:
        measure(trainer, next(iter(variants.values())).make, tasks[:2])  # starts the runners (not timed)
        for round_index in range(rounds):
            order = list(variants) if round_index % 2 == 0 else list(reversed(variants))
            for name in order:
                result = measure(trainer, variants[name].make, tasks)
                results[name].append(result)
                share = result["reused_share"]
                print(
                    f"{label} round {round_index + 1} {name:>22}: {result['per_second']:.3f} /s "
                    f"({result['seconds']:.0f} s), process CPU {result['process_cpu_percent']:.0f}%, prefix hits "
                    f"{result['stats'].get('prefix_hits', '-')} misses {result['stats'].get('prefix_misses', '-')}"
                    f"{'' if share is None else f', {100 * share:.0f}% of prompt tokens reused'}, load "
                    f"{result['load_before']:.1f}→{result['load_after']:.1f}, peak memory "
                    f"{result['peak_resident_bytes'] / 2**30:.2f} GiB, {agreement(results, result)}",
                    flush=True,
                )


def agreement(results: dict[str, list[dict[str, Any]]], result: dict[str, Any]) -> str:
    """How many of ``result``'s answers equal the first measurement's (the first variant's first round)."""
    first = next(runs[0] for runs in results.values() if runs)
    same = sum(1 for task, calls in result["answers"].items() if first["answers"].get(task) == calls)
    return f"same answers as the first measurement: {same}/{len(result['answers'])}"


def summary(results: dict[str, list[dict[str, Any]]], unit: str) -> dict[str, float]:
    """Median rate per variant, printed with before → after."""
    rates = {name: statistics.median(r["per_second"] for r in runs) for name, runs in results.items()}
    for name, rate in rates.items():
        spread = ", ".join(f"{r['per_second']:.3f}" for r in results[name])
        print(f"  {name:>22}: {rate:.3f} {unit} (runs: {spread})")
    if "before" in rates and "after" in rates:
        before, after = rates["before"], rates["after"]
        print(f"  before → after: {before:.3f} → {after:.3f} {unit} (×{after / before:.2f})")
    return rates


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=model_names(), default=DEFAULT_MODEL, help="a model of agl's catalogue")
    p.add_argument("--questions", type=int, default=None, help="questions of the test split (default: all of them)")
    p.add_argument("--rounds", type=int, default=1, help="turns each variant takes (alternating order)")
    p.add_argument(
        "--variants", default="before,after,demo", help="comma-separated, from: " + ", ".join(make_variants(Path(), 0))
    )
    p.add_argument("--rl-tasks", type=int, default=0, help="also an RL-like round: this many questions × group 4")
    p.add_argument("--out", type=Path, default=RESULTS / "sql-eval.json")
    args = p.parse_args()

    model_dir = prepare_model(args.model)
    port = free_port()
    every = make_variants(model_dir, port)
    names = [name.strip() for name in args.variants.split(",") if name.strip()]
    unknown = sorted(set(names) - set(every))
    if unknown:
        raise SystemExit(f"--variants: unknown {unknown}; known: {sorted(every)}")
    variants = {name: every[name] for name in names}
    tasks = held_out_tasks(args.questions, seed=0, split="test")
    runners = ", ".join(f"{name} {v.runners}" for name, v in variants.items())
    print(
        f"model {args.model}; CPU: {cpu_description()}, torch {torch.__version__}; {len(tasks)} questions, "
        f"runners: {runners}; "
        f"variants take turns {args.rounds}×",
        flush=True,
    )
    report: dict[str, Any] = {
        "model": args.model,
        "cpu": cpu_description(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "usable_cores": usable_cores(),
        "runners": {name: v.runners for name, v in variants.items()},
        "questions": len(tasks),
        "rounds": args.rounds,
    }
    with tempfile.TemporaryDirectory(prefix="agl-bench-sql-") as tmp:
        out = Path(tmp)
        greedy = run_phase(
            out, "eval", {"temperature": 0.0, "max_tokens": MAX_TOKENS}, port, tasks, variants, args.rounds
        )
        print("greedy evaluation, questions/s (median over rounds):")
        report["eval"] = {"runs": greedy, "median_per_second": summary(greedy, "questions/s")}
        if args.rl_tasks:
            group = [{**task, "id": f"{task['id']}#{k}"} for task in tasks[: args.rl_tasks] for k in range(GROUP_SIZE)]
            sampling = {"temperature": RL_TEMPERATURE, "max_tokens": MAX_TOKENS}
            rl = run_phase(out, "rl", sampling, port, group, variants, args.rounds)
            print(f"RL-like round ({args.rl_tasks} questions × {GROUP_SIZE}, T={RL_TEMPERATURE}), rollouts/s:")
            report["rl_round"] = {"runs": rl, "median_per_second": summary(rl, "rollouts/s")}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
