"""Run the core benchmarks and print ``name=value`` lines: ``python -m benchmarks.run_all``.

The RL benchmark trains a model and is run on its own: ``python -m benchmarks.bench_rl [--model NAME]``; so is the
catalogue's models side by side (generation, update, evaluation): ``python -m benchmarks.bench_models``.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys

_BENCHES = [
    ("import", "benchmarks.bench_import", None),
    ("sqlite ingest", "benchmarks.bench_store", "sqlite_ingest_spans_per_s"),
    ("http ingest", "benchmarks.bench_http_ingest", "http_ingest_spans_per_s"),
    (
        "rollouts (8 runners x 5 LLM calls, fake LLM; full: python -m benchmarks.bench_rollouts)",
        "benchmarks.bench_rollouts",
        None,
    ),
    ("capture overhead: langchain", "benchmarks.bench_capture_langchain", None),
    ("capture overhead: openai-agents", "benchmarks.bench_capture_openai_agents", None),
    ("capture overhead: autogen", "benchmarks.bench_capture_autogen", None),
    ("capture overhead: crewai", "benchmarks.bench_capture_crewai", None),
]
_FRAMEWORK = {
    "benchmarks.bench_capture_langchain": "langchain_core",
    "benchmarks.bench_capture_openai_agents": "agents",
    "benchmarks.bench_capture_autogen": "autogen_agentchat",
    "benchmarks.bench_capture_crewai": "crewai",
}


def _show(value: object) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def main() -> int:
    for title, module, name in _BENCHES:
        needs = _FRAMEWORK.get(module)
        if needs is not None and importlib.util.find_spec(needs) is None:
            print(f"# {title}: skipped ({needs} not installed)")
            continue
        print(f"# {title}", flush=True)
        bench = importlib.import_module(module)
        result = getattr(bench, "summary", bench.run)()  # a benchmark may offer a shorter run for this list
        if isinstance(result, dict):
            for key, value in result.items():
                print(f"{key}={_show(value)}")
        elif isinstance(result, tuple):
            seconds, rss, heavy = result
            print(f"import_agl_s={seconds:.3f}\nimport_agl_rss_mib={rss:.1f}\nimport_agl_heavy_modules={heavy}")
        else:
            print(f"{name}={result:.0f}")
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
