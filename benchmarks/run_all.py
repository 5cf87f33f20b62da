"""Run every benchmark and print ``name=value`` lines: ``python -m benchmarks.run_all``."""

from __future__ import annotations

import importlib
import sys

_BENCHES = [
    ("import", "benchmarks.bench_import"),
    ("sqlite ingest", "benchmarks.bench_store"),
    ("http ingest", "benchmarks.bench_http_ingest"),
    ("rollouts", "benchmarks.bench_rollouts"),
]


def main() -> int:
    for title, module in _BENCHES:
        print(f"# {title}", flush=True)
        mod = importlib.import_module(module)
        result = mod.run()
        if isinstance(result, dict):
            for k, v in result.items():
                print(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}")
        elif isinstance(result, tuple):
            print("import_agl_s={:.3f}\nimport_agl_rss_mib={:.1f}\nimport_agl_heavy_modules={}".format(*result))
        else:
            print(f"{module.rsplit('.', 1)[-1]}_per_s={result:.0f}")
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
