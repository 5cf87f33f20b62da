"""One client's added latency per LLM call: agl's gateway against the floor of any Python forwarding proxy.

Both forward the same calls to the same instant fake backend (``bench_rollouts``' fake LLM) and are timed against the
same calls made straight to it, in alternating rounds on one machine:

* agl: one runner, rollouts of five sequential calls through the gateway (``bench_rollouts``' latency probe, so the
  figures are that benchmark's "one client" row);
* bare: uvicorn (uvloop and httptools when installed, as for agl's server) with one Starlette route that forwards the
  request body unchanged over one aiohttp session and returns the answer's bytes: nothing parsed, checked, recorded or
  acknowledged. What it adds is what any proxy written this way adds before doing its work.

    .venv/bin/python -m benchmarks.bench_gateway                # 3 rounds of 300 calls each way, about 2 minutes
    .venv/bin/python -m benchmarks.bench_gateway --rounds 1 --calls 60
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import openai

from agl.cpu import cpu_description
from benchmarks import bench_rollouts
from benchmarks.bench_agents import CALLS, prompt_text


def serve_bare(backend: str) -> None:
    """The bare proxy (``--serve-bare BACKEND``): prints its base URL, then serves until killed."""
    import aiohttp
    import uvicorn
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route

    sessions: list[aiohttp.ClientSession] = []

    async def chat(request: Request) -> Response:
        if not sessions:
            sessions.append(aiohttp.ClientSession())
        body = await request.body()
        headers = {"content-type": "application/json"}
        async with sessions[0].post(f"{backend}/chat/completions", data=body, headers=headers) as answer:
            return Response(await answer.read(), answer.status, media_type="application/json")

    app = Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])])
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.bind(("127.0.0.1", 0))
    print(f"http://127.0.0.1:{sock.getsockname()[1]}/v1", flush=True)
    uvicorn.Server(uvicorn.Config(app, log_config=None, access_log=False)).run(sockets=[sock])


async def _alternate(proxy: str, backend: str, calls: int) -> tuple[list[float], list[float]]:
    """``calls`` calls through ``proxy`` and as many straight to ``backend``, alternating (after 20 warm-up pairs),
    with the body agl's gateway forwards; returns both lists of seconds."""
    via = openai.AsyncOpenAI(base_url=proxy, api_key="x", max_retries=0)
    direct = openai.AsyncOpenAI(base_url=backend, api_key="x", max_retries=0)
    through: list[float] = []
    straight: list[float] = []
    for i in range(calls + 20):
        messages: Any = [{"role": "user", "content": prompt_text(i, i % CALLS)}]
        for client, times in ((via, through), (direct, straight)):
            start = time.perf_counter()
            await client.chat.completions.create(
                model="fake", messages=messages, logprobs=True, extra_body={"return_token_ids": True}
            )
            if i >= 20:
                times.append(time.perf_counter() - start)
    await via.close()
    await direct.close()
    return through, straight


def _summary(through: list[float], straight: list[float]) -> dict[str, float]:
    p50, p99 = bench_rollouts._percentile, lambda v: bench_rollouts._percentile(v, 0.99)
    out = {
        "proxy_p50": 1000 * p50(through, 0.5),
        "proxy_p99": 1000 * p99(through),
        "direct_p50": 1000 * p50(straight, 0.5),
        "direct_p99": 1000 * p99(straight),
    }
    out["added_p50"] = out["proxy_p50"] - out["direct_p50"]
    out["ratio_p50"] = out["proxy_p50"] / out["direct_p50"]
    return out


def bare_round(backend: str, calls: int) -> dict[str, float]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.bench_gateway", "--serve-bare", backend], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        proxy = proc.stdout.readline().strip()
        return _summary(*asyncio.run(_alternate(proxy, backend, calls)))
    finally:
        proc.kill()
        proc.wait()


def agl_round(backend: str, calls: int) -> dict[str, float]:
    import agl

    with (
        tempfile.TemporaryDirectory() as folder,
        agl.Trainer(
            n_runners=1,
            store=bench_rollouts._store_url("sqlite", folder, "gw"),
            resources={"main_llm": agl.LLM(base_url=backend, model="fake")},
            progress=False,
        ) as trainer,
    ):
        trainer.evaluate(bench_rollouts.AGENT, bench_rollouts._tasks(4, backend, 0))  # runner and paths warm
        lat = bench_rollouts._probe(trainer, backend, 1, 100, repeat=max(1, calls // CALLS))
    return {
        "proxy_p50": lat["gateway_p50"],
        "proxy_p99": lat["gateway_p99"],
        "direct_p50": lat["direct_p50"],
        "direct_p99": lat["direct_p99"],
        "added_p50": lat["added_p50"],
        "ratio_p50": lat["gateway_p50"] / lat["direct_p50"],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds of each proxy")
    parser.add_argument("--calls", type=int, default=300, help="calls per proxy per round")
    parser.add_argument("--serve-bare", metavar="BACKEND", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve_bare:
        serve_bare(args.serve_bare)
        return 0
    print(f"# {cpu_description()}; load {' '.join(Path('/proc/loadavg').read_text().split()[:3])}")
    rows: dict[str, list[dict[str, float]]] = {"agl": [], "bare": []}
    with bench_rollouts.fake_backend() as (backend, _):
        for number in range(1, args.rounds + 1):
            for name, measure in (("agl", agl_round), ("bare", bare_round)):
                row = measure(backend, args.calls)
                rows[name].append(row)
                print(
                    f"round {number} {name:4}: added p50 {row['added_p50']:.2f} ms, x{row['ratio_p50']:.2f} the direct "
                    f"call (through {row['proxy_p50']:.2f} / {row['proxy_p99']:.2f}, direct {row['direct_p50']:.2f} / "
                    f"{row['direct_p99']:.2f} ms p50 / p99)",
                    flush=True,
                )
    for name, label in (("agl", "agl's gateway"), ("bare", "bare forwarding proxy")):
        added = statistics.median(r["added_p50"] for r in rows[name])
        ratio = statistics.median(r["ratio_p50"] for r in rows[name])
        print(
            f"{name}_added_p50_ms={added:.2f} {name}_ratio_p50={ratio:.2f}  # {label}, median of {args.rounds} rounds"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
