"""agl's rollout benchmark workload, run through Microsoft's Agent Lightning v0.3.0 (the peer), for comparison.

Run it with the peer's venv (``bash benchmarks/bench_peer.sh`` makes the venv and runs this), from the repository root::

    .venv-peer/bin/python benchmarks/peer/bench_peer.py            # 8 runners, 64 rollouts/batch, 3 warm batches
    .venv-peer/bin/python benchmarks/peer/bench_peer.py --backend http://127.0.0.1:PORT/v1

Workload (the same as ``benchmarks/bench_rollouts.py`` at 8 runners): the fake OpenAI-compatible backend of
``python -m benchmarks.bench_rollouts --serve-fake`` (started with agl's venv, in a process of its own, unless
``--backend`` is given) answers at once with 512 prompt + 128 completion token ids and 128 logprobs when asked. An
async agent makes 5 sequential chat completion calls (the 510-word prompt of ``bench_agents.prompt_text``, a new
``openai.AsyncOpenAI`` client per rollout, as agl's ``rollout_agent`` does) and ends with one reward; 64 rollouts per
batch, 8 runner processes. Figures: ``steady`` (first attempt start -> last rollout end, store timestamps, median of 3
warm batches), ``batch`` (enqueue -> all rollouts finished and their spans turned into triplets, median of 3),
``cold`` (``Trainer(...)`` created -> store server, runners and proxy started, 64 rollouts done), CPU ms per rollout
by process (psutil, the middle warm batch, plus what the proxy process and the store's threads spend after the batch
until the proxy's spans for it are all in the store).

How the peer's parts map onto agl's:

- agl's ``Trainer.evaluate`` (enqueue a batch, wait, build trajectories)  ->  an ``agentlightning.Algorithm`` run by
  ``agentlightning.Trainer.fit`` (the peer's way to drive rollouts: its tutorial "Write the First Algorithm" and its
  VERL daemon do the same): it publishes the proxy as the ``main_llm`` resource (``LLMProxy.as_resource()``, a
  ``ProxyLLM``), enqueues the batch with ``store.enqueue_many_rollouts``, waits with ``store.wait_for_rollouts``,
  then queries each rollout's spans and turns them into triplets with the trainer's adapter (its default
  ``TracerTraceToTriplet``; agl's ``evaluate`` likewise returns trajectories).
- agl's store (SQLite by default)  ->  the peer's default store: ``InMemoryLightningStore`` behind a
  ``LightningStoreServer`` (FastAPI/uvicorn in a thread of the trainer process). The peer has no SQLite store (its
  ``store/sqlite.py`` is an empty "TODO" file); its only other store is MongoDB, which needs a MongoDB server, so
  it is not run here.
- agl's runner processes  ->  the peer's default ``ClientServerExecutionStrategy`` with ``n_runners=8``: 8 forked
  runner processes (``LitAgentRunner``, default settings) talking to the store server over HTTP
  (``LightningStoreClient``), each tracing with the default ``AgentOpsTracer`` (agentops, local mode).
- agl's gateway (in the trainer process)  ->  the peer's ``LLMProxy`` (LiteLLM proxy server) in its default "mp"
  launch mode, i.e. a process of its own, with the fake backend registered as ``hosted_vllm/fake`` (how the peer
  fronts vLLM). Its middleware takes the rollout/attempt ids from the URL prefix the agent is handed, asks the store
  for a span sequence id per call, adds ``return_token_ids`` (default callback) and ``logprobs`` (its optional
  ``"logprobs"`` callback, enabled here because agl's gateway asks for logprobs too, so the backend sends the same
  payload; ``--no-logprobs`` leaves the peer's default) and exports LiteLLM's OpenTelemetry spans to the store's
  OTLP endpoint.
- agl's function agent  ->  the peer's function agent ``@agentlightning.rollout`` ``async def agent(task, llm)``:
  ``llm.get_base_url()`` is the proxy URL with the rollout/attempt prefix; it returns the reward (1.0), which the
  runner stores as a reward span (agl's agent calls ``agl.emit_reward(1.0)`` and returns 1.0).

What is checked (a batch with any failure aborts the run): every rollout ``succeeded``; the default adapter gives 5
triplets per rollout, each with 512 prompt and 128 response token ids (from the runner's AgentOps spans) and the
reward on the last; the proxy's own spans hold 5 LLM calls with 512 + 128 token ids per rollout (checked with the
peer's ``LlmProxyTraceToTriplet``; the proxy exports them from its own process, so this check waits up to 30 s after
each batch, outside the timings, and reports how many rollouts' proxy spans were not in the store yet right after the
batch).
What the peer records per call (``--dump-spans FILE`` writes one rollout's spans): in the runner, an AgentOps
``openai.chat.completion`` span (prompt and completion text, usage, prompt and response token ids, the logprobs); in
the proxy, 7 LiteLLM spans (``Received Proxy Server Request``, ``proxy_pre_call``, 2 ``router``, ``self``,
``litellm_request`` with the texts, usage and request headers, ``raw_gen_ai_request`` with the backend's whole
response: token ids and logprobs); per rollout also an AgentOps session span and the reward span.

Differences that could not be avoided:

- the store is in-memory (no SQLite store in the peer): nothing is written to disk, unlike agl's SQLite run;
- the peer's runners poll the store for work every 5 s when idle (``LitAgentRunner(poll_interval=5.0)``, the
  default): a batch enqueued while they sleep waits up to ~5.5 s; ``batch`` and ``cold`` include that wait,
  ``steady`` does not; ``--poll-interval`` changes it;
- the proxy runs in its own process (agl's gateway runs in the trainer process), so its CPU is reported on its own
  and also summed with the trainer's (store server + algorithm) for comparison with agl's ``trainer``;
- the peer records each call twice (runner-side AgentOps span, proxy-side LiteLLM spans) where agl records it once
  at the gateway, and adds a session span per rollout;
- the peer's dependencies are pinned to what was current when 0.3.0 came out (``benchmarks/peer/requirements.txt``
  says why: with today's litellm and OpenTelemetry its proxy does not start or loses every span);
- LiteLLM is told to use its bundled model cost map (``LITELLM_LOCAL_MODEL_COST_MAP``): offline it otherwise
  spends ~10 s at import retrying a download (outside the timings either way);
- the benchmark runs in a scratch working directory, because AgentOps writes ``agentops.log`` into it;
- ``prompt_text`` and the workload's constants are repeated here: ``benchmarks/bench_agents.py`` imports agl, which
  the peer's venv does not have.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from importlib.metadata import version
from pathlib import Path
from typing import Any

# LiteLLM fetches its model cost map from GitHub at import unless told not to (3 tries, ~10 s offline)
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import agentlightning as agl
import openai
import portpicker
import psutil
from agentlightning.adapter import LlmProxyTraceToTriplet

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"

# The workload's constants, as in benchmarks/bench_agents.py (which imports agl, so it cannot be imported here).
PROMPT_WORDS = 510  # the fake LLM adds two role markers: 512 prompt token ids
COMPLETION_WORDS = 128
CALLS = 5
MODEL = "fake"


def prompt_text(task: int, step: int) -> str:
    """A prompt of ``PROMPT_WORDS`` words, different for every call (the same text as bench_agents.prompt_text)."""
    return " ".join([f"t{task}s{step}", *(f"w{i}" for i in range(PROMPT_WORDS - 1))])


@agl.rollout
async def five_call_agent(task: dict[str, Any], llm: agl.LLM) -> float:
    """CALLS sequential chat calls through the endpoint the peer hands the agent, then the reward."""
    client = openai.AsyncOpenAI(base_url=llm.get_base_url(), api_key=llm.api_key or "x", max_retries=0)
    try:
        for step in range(CALLS):
            messages = [{"role": "user", "content": prompt_text(task["i"], step)}]
            await client.chat.completions.create(model=llm.model, messages=messages)  # type: ignore[arg-type]
    finally:
        await client.close()
    return 1.0


# ------------------------------------------------------------------------------------------------ the fake backend


@contextmanager
def fake_backend(url: str | None) -> Iterator[tuple[str, psutil.Process | None]]:
    """agl's fake backend, run with agl's venv (or the URL given: then its CPU is not measured)."""
    if url:
        yield url, None
        return
    python = os.environ.get("AGL_PYTHON", str(ROOT / ".venv" / "bin" / "python"))
    proc = subprocess.Popen(
        [python, "-m", "benchmarks.bench_rollouts", "--serve-fake"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    try:
        assert proc.stdout is not None
        base = proc.stdout.readline().strip()
        if not base.startswith("http"):
            raise RuntimeError(f"the fake backend did not start ({python} -m benchmarks.bench_rollouts --serve-fake)")
        yield base, psutil.Process(proc.pid)
    finally:
        if proc.stdin is not None:
            proc.stdin.close()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# ------------------------------------------------------------------------------------------------ CPU accounting


def _cpu(proc: psutil.Process) -> float:
    t = proc.cpu_times()
    return t.user + t.system


class CpuMeter:
    """CPU seconds between ``start`` and ``stop`` of: this process (algorithm + store server threads; its main
    thread, the algorithm's, also on its own), the proxy process (and its children), the runner processes (every other
    descendant) and the fake backend."""

    def __init__(self, backend: psutil.Process | None) -> None:
        self.backend = backend
        self.me = psutil.Process()
        self.proxy_pid: int | None = None

    def _snapshot(self) -> dict[str, Any]:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        main_id = threading.main_thread().native_id
        main = sum(t.user_time + t.system_time for t in self.me.threads() if t.id == main_id)
        proxy_pids: set[int] = set()
        if self.proxy_pid is not None:
            try:
                p = psutil.Process(self.proxy_pid)
                proxy_pids = {p.pid, *(c.pid for c in p.children(recursive=True))}
            except psutil.Error:
                pass
        proxy: dict[int, float] = {}
        runners: dict[int, float] = {}
        for child in self.me.children(recursive=True):
            if self.backend is not None and child.pid == self.backend.pid:
                continue
            try:
                cpu = _cpu(child)
            except psutil.Error:
                continue
            (proxy if child.pid in proxy_pids else runners)[child.pid] = cpu
        return {
            "trainer": usage.ru_utime + usage.ru_stime,
            "main": main,
            "proxy": proxy,
            "runners": runners,
            "backend": _cpu(self.backend) if self.backend is not None else 0.0,
        }

    def start(self) -> None:
        self._before = self._snapshot()

    def stop(self) -> dict[str, float]:
        after, before = self._snapshot(), self._before

        def delta(kind: str) -> float:
            return sum(cpu - before[kind].get(pid, 0.0) for pid, cpu in after[kind].items())

        return {
            "trainer_s": after["trainer"] - before["trainer"],
            "trainer_main_thread_s": after["main"] - before["main"],
            "proxy_s": delta("proxy"),
            "runners_s": delta("runners"),
            "backend_s": after["backend"] - before["backend"],
            "runner_processes": len(after["runners"]),
        }

    def memory(self) -> dict[str, float]:
        rss = uss = 0
        for child in self.me.children(recursive=True):
            if (self.backend is not None and child.pid == self.backend.pid) or child.pid == self.proxy_pid:
                continue
            try:
                info = child.memory_full_info()
            except psutil.Error:
                continue
            rss += info.rss
            uss += info.uss
        return {"rss_mib": rss / 2**20, "uss_mib": uss / 2**20}


# ------------------------------------------------------------------------------------------------ the algorithm


class RolloutBench(agl.Algorithm):
    """Drives the benchmark inside ``Trainer.fit``: a cold batch, then ``batches`` warm ones."""

    def __init__(self, rollouts: int, batches: int, n_runners: int, meter: CpuMeter, started: float, wall: float):
        super().__init__()
        self.rollouts = rollouts
        self.batches = batches
        self.n_runners = n_runners
        self.meter = meter
        self.started = started  # perf_counter() before Trainer(...)
        self.wall = wall  # time.time() before Trainer(...)
        self.out: dict[str, Any] = {}
        self.dump_spans: Path | None = None  # write one rollout's spans there (JSON)
        self.error: BaseException | None = None

    async def run(self, train_dataset: Any = None, val_dataset: Any = None) -> None:
        try:
            await self._run()
        except BaseException as exc:  # reported by main()
            self.error = exc
            raise

    async def _batch(self, store: agl.LightningStore, offset: int, resources_id: str) -> dict[str, Any]:
        """One batch: enqueue, wait, spans -> triplets (the adapter a training algorithm uses)."""
        requests = [
            agl.EnqueueRolloutRequest(input={"i": offset + i}, mode="train", resources_id=resources_id)
            for i in range(self.rollouts)
        ]
        t0 = time.perf_counter()
        rollouts = await store.enqueue_many_rollouts(requests)
        ids = [r.rollout_id for r in rollouts]
        done = await store.wait_for_rollouts(rollout_ids=ids, timeout=300)
        adapter = self.get_adapter()
        triplets = {}
        for rid in ids:
            spans = await store.query_spans(rid, attempt_id="latest")
            triplets[rid] = adapter.adapt(spans)
        elapsed = time.perf_counter() - t0
        return {"ids": ids, "done": done, "triplets": triplets, "elapsed": elapsed}

    async def _check(self, store: agl.LightningStore, batch: dict[str, Any]) -> dict[str, Any]:
        """Raise unless every rollout succeeded and its calls were captured; what was captured."""
        ids, done = batch["ids"], batch["done"]
        bad = [r for r in done if r.status != "succeeded"]
        if len(done) != len(ids) or bad:
            raise RuntimeError(
                f"{len(bad)} of {len(done)} finished rollouts did not succeed ({len(ids) - len(done)} unfinished)"
                + (f": rollout {bad[0].rollout_id} is {bad[0].status}" if bad else "")
            )
        for rid, triplets in batch["triplets"].items():
            if len(triplets) != CALLS:
                raise RuntimeError(f"rollout {rid}: {len(triplets)} triplets from the runner's spans, expected {CALLS}")
            for t in triplets:
                p, r = t.prompt.get("token_ids") or [], t.response.get("token_ids") or []
                if len(p) != PROMPT_WORDS + 2 or len(r) != COMPLETION_WORDS:
                    raise RuntimeError(f"rollout {rid}: token id counts {len(p)} / {len(r)} in the runner's spans")
            if triplets[-1].reward != 1.0:
                raise RuntimeError(f"rollout {rid}: final reward {triplets[-1].reward}, expected 1.0")
        # the proxy's own spans: exported asynchronously from the proxy process, so wait for them
        proxy_adapter = LlmProxyTraceToTriplet()
        t0 = time.perf_counter()
        missing = list(ids)
        missing_at_first_look: int | None = None
        span_names: dict[str, int] = {}
        while True:
            still = []
            for rid in missing:
                spans = await store.query_spans(rid, attempt_id="latest")
                calls = proxy_adapter.adapt(spans)
                ok = len(calls) == CALLS and all(
                    len(c.prompt["token_ids"]) == PROMPT_WORDS + 2 and len(c.response["token_ids"]) == COMPLETION_WORDS
                    for c in calls
                )
                if not ok:
                    still.append(rid)
            missing = still
            if missing_at_first_look is None:
                missing_at_first_look = len(missing)
            if not missing or time.perf_counter() - t0 > 30:
                break
            await asyncio.sleep(0.2)
        # 0 when the first look (right after the batch) found every proxy span already in the store
        lag = time.perf_counter() - t0 if missing_at_first_look else 0.0
        if missing:
            raise RuntimeError(f"{len(missing)} rollouts lack {CALLS} proxy-captured calls with token ids after 30 s")
        spans = await store.query_spans(ids[0], attempt_id="latest")
        sizes: dict[str, int] = {}
        for s in spans:
            name = s.name.replace(ids[0], "<rollout_id>")
            span_names[name] = span_names.get(name, 0) + 1
            sizes[name] = sizes.get(name, 0) + len(s.model_dump_json())
        if self.dump_spans is not None:
            self.dump_spans.write_text(json.dumps([s.model_dump(mode="json") for s in spans], indent=1))
            self.dump_spans = None
        return {
            "proxy_spans_missing_after_batch": missing_at_first_look,
            "proxy_spans_lag_s": lag,
            "spans_per_rollout": len(spans),
            "span_names": span_names,
            "span_json_bytes_per_rollout": sum(sizes.values()),
            "span_json_bytes_by_name": sizes,
        }

    async def _steady(self, store: agl.LightningStore, ids: list[str]) -> tuple[float, dict[str, float]]:
        """Rollouts/s from the first attempt start to the last rollout end (store timestamps); first lease per
        worker."""
        starts: list[float] = []
        ends: list[float] = []
        first: dict[str, float] = {}
        for rid in ids:
            for a in await store.query_attempts(rid):
                starts.append(a.start_time)
                if a.worker_id is not None:
                    first[a.worker_id] = min(first.get(a.worker_id, a.start_time), a.start_time)
            r = await store.get_rollout_by_id(rid)
            assert r is not None and r.end_time is not None
            ends.append(r.end_time)
        return len(ids) / (max(ends) - min(starts)), first

    async def _run(self) -> None:
        store = self.get_store()
        proxy = self.get_llm_proxy()
        assert proxy is not None
        await proxy.start()
        launcher_proc = getattr(proxy.server_launcher, "_proc", None)  # the proxy's process, for CPU accounting
        self.meter.proxy_pid = launcher_proc.pid if launcher_proc is not None else None
        update = await store.add_resources({"main_llm": proxy.as_resource()})
        rid = update.resources_id
        out = self.out
        # cold: Trainer(...) -> 64 rollouts done (store server, runners and proxy started on the way)
        cold = await self._batch(store, 0, rid)
        cold_s = time.perf_counter() - self.started
        captured = await self._check(store, cold)
        _, first = await self._steady(store, cold["ids"])
        out["cold_s"] = cold_s
        out["cold_rollouts_per_s"] = self.rollouts / cold_s
        out["runners_leased_in_cold_run"] = len(first)
        out["runners_ready_s"] = max(first.values()) - self.wall if len(first) >= self.n_runners else None
        out["captured"] = captured
        offset = self.rollouts
        steady, whole, cpu, trailing = [], [], [], []
        lags, late = [captured["proxy_spans_lag_s"]], [captured["proxy_spans_missing_after_batch"]]
        for _ in range(self.batches):
            self.meter.start()
            batch = await self._batch(store, offset, rid)
            cpu.append(self.meter.stop())
            offset += self.rollouts
            whole.append(self.rollouts / batch["elapsed"])
            # the proxy goes on exporting the batch's spans to the store after the batch: that work (the proxy
            # process, and the store server threads of this process that take the spans in) counts too; the main
            # thread's (this check's) does not
            self.meter.start()
            checked = await self._check(store, batch)
            trailing.append(self.meter.stop())
            lags.append(checked["proxy_spans_lag_s"])
            late.append(checked["proxy_spans_missing_after_batch"])
            rate, _ = await self._steady(store, batch["ids"])
            steady.append(rate)
        out["steady_rollouts_per_s"] = statistics.median(steady)
        out["batch_rollouts_per_s"] = statistics.median(whole)
        out["steady_all"] = [round(x, 2) for x in steady]
        out["batch_all"] = [round(x, 2) for x in whole]
        out["proxy_spans_missing_after_batch"] = late  # rollouts (cold, then warm batches)
        out["proxy_spans_lag_s"] = [round(x, 2) for x in lags]
        middle = cpu[len(cpu) // 2]  # as bench_rollouts does
        after = trailing[len(cpu) // 2]
        n = self.rollouts
        trainer_after = max(0.0, after["trainer_s"] - after["trainer_main_thread_s"])  # (clock ticks: can dip < 0)
        out["cpu_ms_per_rollout"] = {
            "trainer": 1000 * (middle["trainer_s"] + trainer_after) / n,
            "proxy": 1000 * (middle["proxy_s"] + after["proxy_s"]) / n,
            "trainer_plus_proxy": 1000
            * (middle["trainer_s"] + trainer_after + middle["proxy_s"] + after["proxy_s"])
            / n,
            "runners": 1000 * middle["runners_s"] / n,
            "backend": 1000 * middle["backend_s"] / n,
        }
        out["cpu_ms_per_rollout_after_batch"] = {  # included above: the proxy's span export after the batch ended
            "trainer_store_threads": 1000 * trainer_after / n,
            "proxy": 1000 * after["proxy_s"] / n,
        }
        out["runner_processes_measured"] = middle["runner_processes"]
        memory = self.meter.memory()
        out["runners_rss_mib"], out["runners_uss_mib"] = memory["rss_mib"], memory["uss_mib"]
        await proxy.stop()


# ------------------------------------------------------------------------------------------------ one run


def run(
    backend_url: str | None,
    n_runners: int,
    rollouts: int,
    batches: int,
    poll_interval: float | None,
    dump_spans: Path | None = None,
    logprobs: bool = True,
) -> dict[str, Any]:
    load_before = os.getloadavg()
    with fake_backend(backend_url) as (backend, backend_proc):
        meter = CpuMeter(backend_proc)
        started, wall = time.perf_counter(), time.time()
        algorithm = RolloutBench(rollouts, batches, n_runners, meter, started, wall)
        algorithm.dump_spans = dump_spans
        proxy = agl.LLMProxy(
            model_list=[
                {"model_name": MODEL, "litellm_params": {"model": f"hosted_vllm/{MODEL}", "api_base": backend}}
            ],
            # the peer's default callbacks are return_token_ids + opentelemetry; "logprobs" makes the proxy ask for
            # logprobs as agl's gateway does
            callbacks=["return_token_ids", *(["logprobs"] if logprobs else []), "opentelemetry"],
        )
        extra: dict[str, Any] = {}
        if poll_interval is not None:
            extra["runner"] = {"type": "agentlightning.LitAgentRunner", "poll_interval": poll_interval}
        trainer = agl.Trainer(
            n_runners=n_runners,
            algorithm=algorithm,
            llm_proxy=proxy,
            port=portpicker.pick_unused_port(),
            **extra,
        )
        trainer.fit(five_call_agent, train_dataset=[{"i": i} for i in range(rollouts)])
        if algorithm.error is not None:
            raise algorithm.error
        if "steady_rollouts_per_s" not in algorithm.out:
            raise RuntimeError("the benchmark algorithm did not finish (see the log above)")
    out = algorithm.out
    return {
        "peer": f"agentlightning {agl.__version__} (litellm {version('litellm')})",
        "workload": f"{CALLS} sequential calls x ({PROMPT_WORDS + 2} prompt + {COMPLETION_WORDS} completion token "
        f"ids{', logprobs' if logprobs else ''}), async agent, 1 reward, instant fake backend (agl's)",
        "proxy_asks_logprobs": logprobs,
        "store": "in-memory (InMemoryLightningStore behind LightningStoreServer)",
        "runners": n_runners,
        "rollouts_per_batch": rollouts,
        "warm_batches": batches,
        "runner_poll_interval_s": poll_interval if poll_interval is not None else 5.0,
        "cpus": os.cpu_count(),
        "load_before": [round(x, 2) for x in load_before],
        "load_after": [round(x, 2) for x in os.getloadavg()],
        **out,
    }


def report(result: dict[str, Any]) -> list[str]:
    cpu = result["cpu_ms_per_rollout"]
    after = result["cpu_ms_per_rollout_after_batch"]
    total = cpu["trainer_plus_proxy"] + cpu["runners"] + cpu["backend"]
    cap = result["captured"]
    return [
        f"# {result['peer']}; store={result['store']}; runners={result['runners']}; cores={result['cpus']};"
        f" load before/after={result['load_before']}/{result['load_after']}",
        f"steady_rollouts_per_s={result['steady_rollouts_per_s']:.2f}  (all: {result['steady_all']})",
        f"batch_rollouts_per_s={result['batch_rollouts_per_s']:.2f}  (all: {result['batch_all']})",
        f"cold_rollouts_per_s={result['cold_rollouts_per_s']:.2f}  (cold run {result['cold_s']:.1f} s)",
        f"runners_ready_s={result['runners_ready_s']:.2f}"
        if result["runners_ready_s"] is not None
        else f"runners_ready_s=n/a ({result['runners_leased_in_cold_run']} runners leased in the cold run)",
        f"cpu ms/rollout: trainer={cpu['trainer']:.1f} proxy={cpu['proxy']:.1f} (trainer+proxy="
        f"{cpu['trainer_plus_proxy']:.1f}) runners={cpu['runners']:.1f} backend={cpu['backend']:.1f}"
        f" -> cpu bound {1000 * (result['cpus'] or 1) / total:.0f}/s; of which after the batch (proxy exporting"
        f" spans): trainer={after['trainer_store_threads']:.1f} proxy={after['proxy']:.1f}",
        f"runners memory rss={result['runners_rss_mib']:.0f} MiB uss={result['runners_uss_mib']:.0f} MiB",
        f"captured per rollout: {cap['spans_per_rollout']} spans {cap['span_names']}"
        f"; rollouts whose proxy spans were not all in the store yet right after the batch (cold, warm...):"
        f" {result['proxy_spans_missing_after_batch']} (all in after {result['proxy_spans_lag_s']} s more)",
    ]


@contextmanager
def _output_to(log: Path | None) -> Iterator[None]:
    """Send this process's stdout and stderr, and so its children's, to ``log`` (None: leave them)."""
    if log is None:
        yield
        return
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    try:
        yield
    except BaseException:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        print(f"# failed; the peer's output is in {log}", file=sys.stderr)
        raise
    else:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        print(f"# the peer's own output: {log}")
    finally:
        os.close(saved[0])
        os.close(saved[1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", help="base URL of a running fake backend (default: start agl's)")
    parser.add_argument("--runners", type=int, default=8)
    parser.add_argument("--rollouts", type=int, default=64, help="rollouts per batch")
    parser.add_argument("--batches", type=int, default=3, help="warm batches (median)")
    parser.add_argument(
        "--poll-interval", type=float, default=None, help="runner poll interval in s (default: the peer's, 5)"
    )
    parser.add_argument("--out", type=Path, default=RESULTS / "peer-rollouts.json")
    parser.add_argument(
        "--no-logprobs", action="store_true", help="the proxy's default callbacks: no logprobs asked (agl asks)"
    )
    parser.add_argument("--dump-spans", type=Path, help="write one rollout's spans (as stored) to this JSON file")
    parser.add_argument(
        "--log",
        help="where the peer's own output goes (LiteLLM's banner, AgentOps' per-rollout lines, uvicorn): a file "
        "(default: a new one under the temp dir, named at the end) or - for the terminal",
    )
    args = parser.parse_args(argv)
    warnings.simplefilter("ignore", DeprecationWarning)
    out = args.out.resolve()
    dump = args.dump_spans.resolve() if args.dump_spans else None
    log = None if args.log == "-" else Path(args.log or tempfile.mkstemp(prefix="bench-peer-", suffix=".log")[1])
    with tempfile.TemporaryDirectory(prefix="bench-peer-") as scratch, _output_to(log):
        os.chdir(scratch)  # AgentOps writes agentops.log into the working directory (of every runner)
        try:
            result = run(
                args.backend, args.runners, args.rollouts, args.batches, args.poll_interval, dump, not args.no_logprobs
            )
        finally:
            os.chdir(ROOT)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    print("\n".join(report(result)))
    print(f"results={out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
