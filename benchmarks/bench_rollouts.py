"""Rollouts/s end to end, and where the time goes.

Workload: an async agent (``benchmarks.bench_agents:rollout_agent``) makes 5 sequential chat calls through agl's
gateway to a fake OpenAI-compatible backend that answers at once (a process of its own; 512 prompt + 128 completion
token ids and 128 logprobs per call), then emits one reward; 64 rollouts per batch. Measured:

- ``steady``: rollouts/s of a batch with runners up, first attempt start → last rollout end (store timestamps);
- ``batch``: rollouts/s of one ``Trainer.evaluate`` call with runners up (enqueue, wait, trajectories included);
- ``cold``: rollouts/s of a whole cold run: ``Trainer(...)`` created, server and runners started, 64 rollouts done;
- ``runners_ready_s``: from ``Trainer(...)`` to the last runner's first lease in the cold run;
- rollouts/s at 8, 32 and 64 runners, with CPU time per rollout of the trainer process (server, gateway and store
  run there, per thread), of the runner processes and of the fake backend, and the runners' memory;
- the gateway's added latency per call: the agent times each gateway call and, right after it, the same call made
  straight to the backend (p50 / p99 of both, same batch, same concurrency).

Usage::

    python -m benchmarks.bench_rollouts                       # SQLite store, everything (about 2-4 minutes)
    python -m benchmarks.bench_rollouts --store postgresql   # a throwaway PostgreSQL server (initdb + pg_ctl)
    python -m benchmarks.bench_rollouts --store postgresql://user:pw@host/db
    python -m benchmarks.bench_rollouts --runners 8 --batches 2   # quicker

Writes ``benchmarks/results/rollouts-<store>.json`` and ``rollouts-<store>.png`` (rollouts/s vs runners). On a
machine with few cores, 32 and 64 runners mostly measure start-up and memory: every runner is a process, and the
curve flattens once the cores are busy (the CPU-per-rollout figures say with what).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psutil

import agl
from benchmarks.bench_agents import CALLS, COMPLETION_WORDS, PROMPT_WORDS, rollout_agent

RESULTS = Path(__file__).resolve().parent / "results"
AGENT = rollout_agent


# ------------------------------------------------------------------------------------------------ the fake backend


def serve_fake() -> None:
    """Run the fake backend until stdin closes (``--serve-fake``); prints its base URL first."""
    from agl.testing import FakeLLM
    from benchmarks.bench_agents import completion_text

    with FakeLLM(completion_text) as fake:
        print(fake.base_url, flush=True)
        sys.stdin.read()


@contextmanager
def fake_backend() -> Iterator[tuple[str, psutil.Process]]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.bench_rollouts", "--serve-fake"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parent.parent,
    )
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().strip()
        if not url.startswith("http"):
            raise RuntimeError("the fake backend did not start")
        yield url, psutil.Process(proc.pid)
    finally:
        if proc.stdin is not None:
            proc.stdin.close()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


# ------------------------------------------------------------------------------------------------ CPU accounting


def _thread_names() -> dict[int, str]:
    """Native thread id → a group name (thread pools collapsed)."""
    names: dict[int, str] = {}
    for t in threading.enumerate():
        if t.native_id is None:
            continue
        name = t.name
        if name.startswith(("AnyIO worker", "ThreadPoolExecutor")):
            name = "store threadpool"
        elif t is threading.main_thread():
            name = "trainer main"
        names[t.native_id] = name
    return names


class CpuMeter:
    """CPU seconds spent between ``start`` and ``stop`` by this process (per thread), its other descendants (the
    runners) and the fake backend."""

    def __init__(self, backend: psutil.Process, database: bool = False) -> None:
        self.backend = backend
        self.database = database  # also count the PostgreSQL server's processes (all of them on this machine)
        self.me = psutil.Process()

    def _snapshot(self) -> dict[str, Any]:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        names = _thread_names()
        threads: dict[int, float] = {t.id: t.user_time + t.system_time for t in self.me.threads()}
        kids: dict[int, float] = {}
        for child in self.me.children(recursive=True):
            if child.pid == self.backend.pid:
                continue
            try:
                times = child.cpu_times()
                kids[child.pid] = times.user + times.system
            except psutil.Error:
                continue
        b = self.backend.cpu_times()
        database = 0.0
        if self.database:
            for proc in psutil.process_iter(["name"]):
                if proc.info["name"] in ("postgres", "postmaster"):
                    try:
                        t = proc.cpu_times()
                        database += t.user + t.system
                    except psutil.Error:
                        continue
        return {
            "database": database,
            "self": usage.ru_utime + usage.ru_stime,
            "threads": threads,
            "names": names,
            "kids": kids,
            "backend": b.user + b.system,
        }

    def start(self) -> None:
        self._before = self._snapshot()

    def stop(self) -> dict[str, Any]:
        after = self._snapshot()
        before = self._before
        per_thread: dict[str, float] = {}
        for tid, cpu in after["threads"].items():
            name = after["names"].get(tid) or before["names"].get(tid) or "other"
            per_thread[name] = per_thread.get(name, 0.0) + cpu - before["threads"].get(tid, 0.0)
        runners = sum(cpu - before["kids"].get(pid, 0.0) for pid, cpu in after["kids"].items())
        return {
            "trainer_s": after["self"] - before["self"],
            "trainer_threads_s": {k: round(v, 3) for k, v in sorted(per_thread.items(), key=lambda kv: -kv[1])},
            "runners_s": runners,
            "backend_s": after["backend"] - before["backend"],
            "database_s": after["database"] - before["database"],
        }

    def memory(self) -> dict[str, float]:
        """Memory of the runner processes (and their template): resident in all, and unique to them (USS: what
        stopping them frees; pages a forked runner shares with its template count once, in the template)."""
        rss = uss = 0
        for child in self.me.children(recursive=True):
            if child.pid == self.backend.pid:
                continue
            try:
                info = child.memory_full_info()
            except psutil.Error:
                continue
            rss += info.rss
            uss += info.uss
        return {"rss_mib": rss / 2**20, "uss_mib": uss / 2**20}


# ------------------------------------------------------------------------------------------------ one configuration


def _tasks(n: int, backend: str, offset: int = 0, probe: str | None = None, **extra: Any) -> list[dict[str, Any]]:
    return [{"i": offset + i, "backend": backend, **({"probe": probe} if probe else {}), **extra} for i in range(n)]


def _store_url(store: str, folder: str, tag: str) -> str:
    return f"sqlite:///{folder}/{tag}.db" if store == "sqlite" else store


@contextmanager
def _stores(store: str) -> Iterator[Callable[[], str]]:
    """What each configuration gets as its store: ``sqlite`` (a fresh file each, made by ``run_config``), a new
    database on a throwaway PostgreSQL server for ``postgresql`` (``agl.testing.postgres``, durable settings), or the
    URL given."""
    if store != "postgresql":
        yield lambda: store
        return
    from agl.testing.postgres import PostgresCluster

    cluster = PostgresCluster(durable=True).start()
    try:
        yield cluster.new_database
    finally:
        cluster.stop()


def _span_of_batch(trainer: agl.Trainer, batch: Any) -> float:
    """First attempt start → last rollout end of ``batch``, from the store's clock."""
    store = trainer._store
    assert store is not None
    starts = [a.started_at for r in batch.rollouts for a in store.list_attempts(r.rollout_id)]
    ends = [r.finished_at for r in batch.rollouts if r.finished_at is not None]
    return max(ends) - min(starts)


def _first_leases(trainer: agl.Trainer, batch: Any) -> dict[str, float]:
    store = trainer._store
    assert store is not None
    first: dict[str, float] = {}
    for r in batch.rollouts:
        for a in store.list_attempts(r.rollout_id):
            first[a.worker_id] = min(first.get(a.worker_id, a.started_at), a.started_at)
    return first


def _check(batch: Any, n: int, calls: int = CALLS) -> None:
    bad = [r for r in batch.rollouts if r.status != "succeeded"]
    if bad or len(batch.rollouts) != n:
        raise RuntimeError(
            f"{len(bad)} of {len(batch.rollouts)} rollouts did not succeed: {bad[0].error if bad else ''}"
        )
    if calls == 0:
        return
    for traj in batch.trajectories:
        if len(traj.transitions) != calls:
            raise RuntimeError(f"rollout {traj.rollout_id}: {len(traj.transitions)} transitions, expected {CALLS}")
        t = traj.transitions[0]
        if len(t.prompt_ids) != PROMPT_WORDS + 2 or len(t.response_ids) != COMPLETION_WORDS:
            raise RuntimeError(f"unexpected token id counts {len(t.prompt_ids)} / {len(t.response_ids)}")


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def run_config(
    store: str,
    backend: str,
    backend_proc: psutil.Process,
    n_runners: int,
    rollouts: int,
    batches: int,
    folder: str,
    probe: bool = False,
) -> dict[str, Any]:
    """Cold run of ``rollouts`` rollouts with ``n_runners`` fresh runners, then ``batches`` warm batches (and, with
    ``probe``, a latency-probe batch)."""
    meter = CpuMeter(backend_proc, database=store != "sqlite")
    out: dict[str, Any] = {"runners": n_runners, "rollouts_per_batch": rollouts}
    offset = 0
    started = time.perf_counter()
    wall_start = time.time()
    with agl.Trainer(
        n_runners=n_runners,
        store=_store_url(store, folder, f"r{n_runners}"),
        resources={"main_llm": agl.LLM(base_url=backend, model="fake")},
        progress=False,
    ) as trainer:
        cold = trainer.evaluate(AGENT, _tasks(rollouts, backend, offset))
        cold_s = time.perf_counter() - started
        offset += rollouts
        _check(cold, rollouts)
        leases = _first_leases(trainer, cold)
        out["cold_s"] = cold_s
        out["cold_rollouts_per_s"] = rollouts / cold_s
        out["runners_ready_s"] = max(leases.values()) - wall_start if len(leases) >= n_runners else None
        out["runners_leased_in_cold_run"] = len(leases)
        steady, whole, cpu = [], [], []
        for _ in range(batches):
            meter.start()
            t0 = time.perf_counter()
            batch = trainer.evaluate(AGENT, _tasks(rollouts, backend, offset))
            whole.append(rollouts / (time.perf_counter() - t0))
            cpu.append(meter.stop())
            offset += rollouts
            _check(batch, rollouts)
            steady.append(rollouts / _span_of_batch(trainer, batch))
        out["steady_rollouts_per_s"] = statistics.median(steady)
        out["batch_rollouts_per_s"] = statistics.median(whole)
        out["steady_all"] = [round(x, 2) for x in steady]
        out["batch_all"] = [round(x, 2) for x in whole]
        last = cpu[len(cpu) // 2]
        n = rollouts
        out["cpu_ms_per_rollout"] = {
            "trainer": 1000 * last["trainer_s"] / n,
            "runners": 1000 * last["runners_s"] / n,
            "backend": 1000 * last["backend_s"] / n,
            **({"database": 1000 * last["database_s"] / n} if store != "sqlite" else {}),
        }
        out["trainer_threads_ms_per_rollout"] = {
            k: round(1000 * v / n, 2) for k, v in last["trainer_threads_s"].items() if 1000 * v / n >= 0.01
        }
        memory = meter.memory()
        out["runners_rss_mib"], out["runners_uss_mib"] = memory["rss_mib"], memory["uss_mib"]
        if probe:
            # the same workload with the OpenAI client from agl.async_openai_client (its HTTP client shared), and
            # with an agent that makes no call (what agl's runner costs a rollout by itself)
            for variant, extra in (("shared_client", {"client": "shared"}), ("no_calls", {"calls": 0})):
                rates, costs = [], []
                trainer.allow_capture_failures = "calls" in extra  # no call: nothing to capture, on purpose
                for _ in range(batches):
                    meter.start()
                    batch = trainer.evaluate(AGENT, _tasks(rollouts, backend, offset, **extra))
                    costs.append(meter.stop())
                    offset += rollouts
                    _check(batch, rollouts, 0 if "calls" in extra else CALLS)
                    rates.append(rollouts / _span_of_batch(trainer, batch))
                middle = costs[len(costs) // 2]
                out[variant] = {
                    "steady_rollouts_per_s": statistics.median(rates),
                    "cpu_ms_per_rollout": {
                        "trainer": 1000 * middle["trainer_s"] / rollouts,
                        "runners": 1000 * middle["runners_s"] / rollouts,
                        "backend": 1000 * middle["backend_s"] / rollouts,
                    },
                }
            trainer.allow_capture_failures = False
            # the agent times each gateway call and the same call straight to the backend: all runners at once (the
            # workload's concurrency), then one rollout at a time (a single client)
            out["latency_ms"] = _probe(trainer, backend, rollouts, offset)
            offset += rollouts
            out["latency_1_client_ms"] = _probe(trainer, backend, 1, offset, repeat=24)
    return out


def _probe(trainer: agl.Trainer, backend: str, rollouts: int, offset: int, repeat: int = 1) -> dict[str, float]:
    via: list[float] = []
    straight: list[float] = []
    with tempfile.TemporaryDirectory() as probe_dir:
        for k in range(repeat):
            trainer.evaluate(AGENT, _tasks(rollouts, backend, offset + k * rollouts, probe=probe_dir))
        for f in Path(probe_dir).glob("*.json"):
            data = json.loads(f.read_text())
            via += data["gateway"]
            straight += data["direct"]
    lat = {
        "calls": len(via),
        "gateway_p50": 1000 * _percentile(via, 0.5),
        "gateway_p99": 1000 * _percentile(via, 0.99),
        "direct_p50": 1000 * _percentile(straight, 0.5),
        "direct_p99": 1000 * _percentile(straight, 0.99),
    }
    lat["added_p50"] = lat["gateway_p50"] - lat["direct_p50"]
    lat["added_p99"] = lat["gateway_p99"] - lat["direct_p99"]
    return lat


# ------------------------------------------------------------------------------------------------ report


def _plot(rows: list[dict[str, Any]], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    xs = [r["runners"] for r in rows]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(xs, [r["steady_rollouts_per_s"] for r in rows], "o-", label="steady (runners up)")
    ax.plot(xs, [r["batch_rollouts_per_s"] for r in rows], "s--", label="one evaluate() batch")
    ax.plot(xs, [r["cold_rollouts_per_s"] for r in rows], "^:", label="cold run (start-up included)")
    ax.set_xscale("log", base=2)
    ax.set_xticks(xs, [str(x) for x in xs])
    ax.set_xlabel("runner processes")
    ax.set_ylabel("rollouts/s")
    ax.set_ylim(bottom=0)
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def run(
    store: str = "sqlite",
    runners: tuple[int, ...] = (8, 32, 64),
    rollouts: int = 64,
    batches: int = 3,
    out_dir: Path = RESULTS,
) -> dict[str, Any]:
    """Every configuration; returns the figures (also written as JSON and a plot under ``out_dir``)."""
    rows: list[dict[str, Any]] = []
    load_before = os.getloadavg()
    with fake_backend() as (backend, proc), tempfile.TemporaryDirectory() as folder, _stores(store) as next_store:
        for n in runners:
            # more runners than rollouts would leave runners idle: give each at least two rollouts
            per_batch = max(rollouts, 2 * n) if n != runners[0] else rollouts
            row = run_config(
                next_store(),
                backend,
                proc,
                n,
                per_batch,
                batches if n == runners[0] else 1,
                folder,
                probe=n == runners[0],
            )
            rows.append(row)
            print(
                f"# {n} runners: steady {row['steady_rollouts_per_s']:.1f}, batch {row['batch_rollouts_per_s']:.1f}, "
                f"cold {row['cold_rollouts_per_s']:.1f} rollouts/s; runners ready {row['runners_ready_s'] or 0:.2f}s",
                file=sys.stderr,
                flush=True,
            )
    first = rows[0]
    kind = "sqlite" if store == "sqlite" else store.partition(":")[0]
    result = {
        "workload": f"{CALLS} sequential calls x ({PROMPT_WORDS + 2} prompt + {COMPLETION_WORDS} completion token "
        "ids), async agent, 1 reward, instant fake backend",
        "store": kind,
        "cpus": os.cpu_count(),
        "load_before": [round(x, 2) for x in load_before],
        "load_after": [round(x, 2) for x in os.getloadavg()],
        "steady_rollouts_per_s": first["steady_rollouts_per_s"],
        "batch_rollouts_per_s": first["batch_rollouts_per_s"],
        "cold_rollouts_per_s": first["cold_rollouts_per_s"],
        "runners_ready_s": first["runners_ready_s"],
        "gateway_latency_ms": first.get("latency_ms"),
        "gateway_latency_1_client_ms": first.get("latency_1_client_ms"),
        "configs": rows,
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"rollouts-{kind}.json").write_text(json.dumps(result, indent=2))
    plot = out_dir / f"rollouts-{kind}.png"
    _plot(rows, plot, f"agl rollouts/s ({kind} store, {os.cpu_count()} cores, 5 calls/rollout, instant backend)")
    result["plot"] = str(plot)
    return result


def summary() -> dict[str, Any]:
    """The three headline figures and the gateway's added latency at 8 runners only (what ``run_all`` prints)."""
    with tempfile.TemporaryDirectory() as out:  # the full run's files in benchmarks/results stay as they are
        result = run(runners=(8,), batches=2, out_dir=Path(out))
    lat = result["gateway_latency_ms"] or {}
    return {
        "steady_rollouts_per_s": result["steady_rollouts_per_s"],
        "batch_rollouts_per_s": result["batch_rollouts_per_s"],
        "cold_rollouts_per_s": result["cold_rollouts_per_s"],
        "runners_ready_s": result["runners_ready_s"],
        "gateway_added_ms_p50": lat.get("added_p50"),
        "gateway_added_ms_p99": lat.get("added_p99"),
    }


def report(result: dict[str, Any]) -> list[str]:
    """The figures as ``name=value`` lines and a few sentences on what bounds them."""
    cores = result["cpus"] or 1
    lines = [
        f"# store={result['store']} cores={cores} load before/after={result['load_before']}/{result['load_after']}"
    ]
    for key in ("steady_rollouts_per_s", "batch_rollouts_per_s", "cold_rollouts_per_s", "runners_ready_s"):
        lines.append(f"{key}={result[key]:.2f}" if result[key] is not None else f"{key}=n/a")
    for key, what in (("gateway_latency_ms", "all runners at once"), ("gateway_latency_1_client_ms", "one client")):
        lat = result[key]
        if lat:
            lines.append(
                f"gateway_added_ms ({what}): p50={lat['added_p50']:.2f} p99={lat['added_p99']:.2f} "
                f"(gateway {lat['gateway_p50']:.2f}/{lat['gateway_p99']:.2f}, direct {lat['direct_p50']:.2f}/"
                f"{lat['direct_p99']:.2f} ms p50/p99, {lat['calls']} calls)"
            )
    best = max(result["configs"], key=lambda row: row["steady_rollouts_per_s"])
    for row in result["configs"]:
        cpu = row["cpu_ms_per_rollout"]
        total = sum(cpu.values())
        bound = 1000 * cores / total
        lines.append(
            f"runners={row['runners']}: steady={row['steady_rollouts_per_s']:.1f}"
            f" batch={row['batch_rollouts_per_s']:.1f}"
            f" cold={row['cold_rollouts_per_s']:.1f} ready_s={row['runners_ready_s'] or float('nan'):.2f} |"
            f" cpu ms/rollout trainer={cpu['trainer']:.1f} runners={cpu['runners']:.1f} backend={cpu['backend']:.1f}"
            + (f" database={cpu['database']:.1f}" if "database" in cpu else "")
            + f" -> cpu bound {bound:.0f}/s ({100 * row['steady_rollouts_per_s'] / bound:.0f}% of it) |"
            f" runners memory rss={row['runners_rss_mib']:.0f} MiB uss={row['runners_uss_mib']:.0f} MiB"
        )
        lines.append(f"  trainer threads ms/rollout: {row['trainer_threads_ms_per_rollout']}")
        for variant, what in (
            ("shared_client", "OpenAI client from agl.async_openai_client"),
            ("no_calls", "agent that makes no call: agl's runner alone"),
        ):
            if variant in row:
                v = row[variant]
                c = v["cpu_ms_per_rollout"]
                lines.append(
                    f"  {what}: steady={v['steady_rollouts_per_s']:.1f} | cpu ms/rollout trainer={c['trainer']:.1f}"
                    f" runners={c['runners']:.1f} backend={c['backend']:.1f}"
                )
    cpu = best["cpu_ms_per_rollout"]
    lines.append(
        f"# the curve flattens once the {cores} cores are busy: every rollout costs "
        f"{sum(cpu.values()):.0f} ms of CPU ({cpu['runners']:.0f} in the agent's runner process, "
        f"{cpu['trainer']:.0f} in the trainer process: server, gateway, store; {cpu['backend']:.0f} in the fake "
        "backend), so more runners add processes and memory, not throughput"
    )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--store",
        default="sqlite",
        help="sqlite (a fresh file per configuration), postgresql (a throwaway server, a fresh database per "
        "configuration) or a store URL",
    )
    parser.add_argument("--runners", default="8,32,64", help="runner counts, comma-separated (the first is the main)")
    parser.add_argument("--rollouts", type=int, default=64, help="rollouts per batch")
    parser.add_argument("--batches", type=int, default=3, help="warm batches at the first runner count (median)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--serve-fake", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve_fake:
        serve_fake()
        return 0
    result = run(args.store, tuple(int(x) for x in args.runners.split(",")), args.rollouts, args.batches, args.out)
    print("\n".join(report(result)))
    print(f"results={args.out / ('rollouts-' + result['store'] + '.json')}")
    print(f"plot={result['plot']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
