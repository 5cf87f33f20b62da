"""Cold ``import agl`` time and resident memory, in a fresh interpreter each time (best of 5)."""

from __future__ import annotations

import subprocess
import sys

_PROBE = (
    "import time, resource; t = time.perf_counter(); import agl; agl.emit_reward; agl.LLM; "
    "d = time.perf_counter() - t; import sys; "
    "heavy = [m for m in ('torch', 'transformers', 'langchain_core', 'langgraph', 'crewai', 'autogen_core', 'agents') "
    "if m in sys.modules]; "
    "print(d, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, ','.join(heavy) or '-')"
)


def run(repeats: int = 5) -> tuple[float, float, str]:
    """Best import time (s), its peak RSS (MiB), and heavy modules that got imported ('-' if none)."""
    best = (float("inf"), 0.0, "-")
    for _ in range(repeats):
        out = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, check=True).stdout.split()
        seconds, rss, heavy = float(out[0]), float(out[1]), out[2]
        if seconds < best[0]:
            best = (seconds, rss, heavy)
    return best


if __name__ == "__main__":
    seconds, rss, heavy = run()
    print(f"import_agl_s={seconds:.3f}")
    print(f"import_agl_rss_mib={rss:.1f}")
    print(f"import_agl_heavy_modules={heavy}")
