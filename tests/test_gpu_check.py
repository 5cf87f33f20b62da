"""The GPU device check rehearsed on this machine (``--dry-run``: fake vLLM, tiny model), so it does not rot between
the rare runs on a GPU: every stage but the RL ones (which the real-engine tests cover) must pass."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.slow  # a fake vLLM, a gateway and a few training steps: ~20 s


def test_the_gpu_check_dry_run_passes_every_stage(tmp_path: Path) -> None:
    command = [sys.executable, str(REPO / "benchmarks" / "gpu_check.py"), "--dry-run", "--out", str(tmp_path)]
    command += ["--budget", "240", "--skip", "rl_full", "--skip", "rl_per_agent"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=REPO, check=False)
    results = json.loads((tmp_path / "gpu_check.json").read_text())
    stages = {name: r for name, r in results.items() if isinstance(r, dict)}
    assert {n: r["status"] for n, r in stages.items()} == {
        "env": "ok",
        "model": "ok",
        "vllm_start": "ok",
        "tokens": "ok",
        "throughput": "ok",
        "train_step": "ok",
        "sync_restart": "ok",
        "rl_full": "skipped",
        "rl_per_agent": "skipped",
    }, done.stdout[-3000:]
    assert done.returncode == 0
    assert all(stages["tokens"][k] for k in stages["tokens"] if k.endswith("_equal") or k.endswith("_has_ids"))
