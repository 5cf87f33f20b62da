"""LightningRL's update on two ranks (torch.distributed, gloo, CPU): the same weights as one process, shards that cover
every call once, a clear error when a rank dies, and the example LightningRL run under torchrun."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from agl.core.types import Transition
from agl.trainers.rl.distributed import shard_transitions
from agl.trainers.rl.update import PolicyUpdater
from tests.update_ranks import config, trainable, transitions

ROOT = Path(__file__).resolve().parents[1]
WORKER = ROOT / "tests" / "update_ranks.py"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from agl.serving.models import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("tiny"), seed=0)


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}


def torchrun(*args: str, timeout: float = 240, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``torchrun --standalone --nproc-per-node 2`` (its module form), as a user starts a distributed update."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", *args]
    environment = {**_env(), **(env or {})}
    done = subprocess.run(cmd, cwd=ROOT, env=environment, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    return done


def _t(prompt: list[int], response_len: int, i: int) -> Transition:
    return Transition(
        span_id=f"s{i}",
        agent=None,
        step=0,
        prompt_ids=prompt,
        response_ids=[5] * response_len,
        response_logprobs=[-1.0] * response_len,
        advantage=1.0,
    )


def test_shards_are_token_balanced_non_empty_and_cover_every_call_once() -> None:
    calls = [_t([1] * 50, 5, i) for i in range(4)] + [_t([2] * 30, 5, 4 + i) for i in range(4)] + [_t([3] * 60, 9, 8)]
    shards = shard_transitions(calls, 2)
    ids = sorted(t.span_id for shard in shards for t in shard)
    assert ids == sorted(t.span_id for t in calls)  # every call once
    assert all(shards)
    # a group's calls stay together, so each rank scores their prompt once: {60-token call} + {30-token group}
    # (60 + 9 + 30 + 20 = 119) against {50-token group} (50 + 20 = 70)
    assert [sorted({t.prompt_ids[0] for t in s}) for s in shards] == [[1], [2, 3]]
    for shard in shards:  # original order within a shard
        assert [calls.index(t) for t in shard] == sorted(calls.index(t) for t in shard)
    # fewer prompts than ranks: a group is split so that every rank has calls
    one_group = [_t([1] * 50, 5, i) for i in range(3)]
    assert [len(s) for s in shard_transitions(one_group, 3)] == [1, 1, 1]
    assert sorted(len(s) for s in shard_transitions(one_group, 2)) == [1, 2]
    # fewer calls than ranks: the rest idle (they only take part in the gradient sum)
    assert [len(s) for s in shard_transitions(one_group[:1], 2)] == [1, 0]
    with pytest.raises(ValueError, match="world"):
        shard_transitions(calls, 0)


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_two_ranks_train_the_same_weights_as_one_process(model_dir: Path, tmp_path: Path, lora: bool) -> None:
    torchrun(str(WORKER), "steps", str(tmp_path), str(model_dir), "lora" if lora else "full")
    rank0 = torch.load(tmp_path / "rank0.pt")
    rank1 = torch.load(tmp_path / "rank1.pt")
    metrics = json.loads((tmp_path / "metrics.json").read_text())

    torch.manual_seed(0)  # rank 0's seed in the worker: the LoRA adapter's initial weights
    single = PolicyUpdater(model_dir, config(lora, "none"))
    start = trainable(single)
    data = transitions(single)
    expected = [single.step(data), single.step(data)]
    reference = trainable(single)

    assert rank0.keys() == reference.keys()
    for name, value in reference.items():
        assert torch.equal(rank0[name], rank1[name]), name  # the replicas stay equal
        # one process's steps, to float summation order (which AdamW amplifies where a gradient is ~0: a few weights
        # in thousands differ by ~2e-6, where a weight moves by ~1e-3 a step)
        assert torch.allclose(rank0[name], value, rtol=0, atol=2e-5), name
        assert float((value - start[name]).abs().max()) > 5e-4, name  # the steps moved every weight (LoRA A: once)
    for got, want in zip(metrics, expected, strict=True):  # step metrics cover both ranks' shards
        for key in ("response_tokens", "sequences", "tokens"):
            assert got[key] == want[key], key
        for key in ("loss", "entropy", "grad_norm", "kl_ref"):
            assert got[key] == pytest.approx(want[key], rel=1e-4, abs=1e-7), key


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_a_checkpoint_loaded_on_rank_0_reaches_every_rank(model_dir: Path, tmp_path: Path, lora: bool) -> None:
    torchrun(str(WORKER), "load", str(tmp_path), str(model_dir), "lora" if lora else "full")
    rank0, rank1 = torch.load(tmp_path / "rank0.pt"), torch.load(tmp_path / "rank1.pt")
    loaded = torch.load(tmp_path / "loaded.pt")
    for name in rank0:
        assert torch.equal(rank0[name], rank1[name]), name  # the follower stepped from the loaded weights too
    assert any(not torch.equal(rank0[n], loaded[n]) for n in rank0)  # and that step moved them


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_rank_that_dies_ends_the_step_with_an_error_naming_it(model_dir: Path, tmp_path: Path) -> None:
    # started by hand with torchrun's environment: torchrun itself would stop rank 0 as soon as rank 1 died
    port = str(_free_port())
    procs = []
    for rank in (0, 1):
        env = {**_env(), "RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1"}
        env["MASTER_PORT"] = port
        cmd = [sys.executable, str(WORKER), "die", str(tmp_path), str(model_dir)]
        procs.append(subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
    outputs = [p.communicate(timeout=180)[0].decode(errors="replace") for p in procs]
    assert procs[1].returncode == 3, outputs[1][-2000:]
    assert procs[0].returncode == 0, outputs[0][-3000:]
    error = (tmp_path / "error.txt").read_text()
    assert "rank 0 of 2" in error and "did another rank die" in error, error


def test_ddp_outside_torchrun_says_how_to_start_it(model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    from agl.trainers.rl.distributed import UpdateGroupError

    with pytest.raises(UpdateGroupError, match="torchrun --nproc-per-node"):
        PolicyUpdater(model_dir, config(False, "ddp"))


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["local", "vllm"])
def test_the_example_under_torchrun_trains_two_rounds_with_the_update_on_two_ranks(
    tmp_path: Path, backend: str
) -> None:
    env = {}
    if backend == "vllm":
        from tests.test_vllm_engine import vllm_python

        env["AGL_VLLM_PYTHON"] = vllm_python()  # fails, never skips, without the CPU build
    example = ["-m", "examples.distributed_update.train", "--out", str(tmp_path), "--backend", backend]
    done = torchrun(*example, timeout=500, env=env)
    printed = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    leader, follower = sorted(printed, key=lambda r: r["rank"])
    assert leader["resources"] and not follower["resources"]  # only rank 0 ran the store, server and runners
    assert leader["metrics"]["round"] == 2 and leader["metrics"]["weights_version"] == "v2"
    rows = json.loads((tmp_path / "rl_metrics.json").read_text())
    trained = [r for r in rows if r["round"] > 0 and r["trained_transitions"] > 0]
    # the follower took part in every optimizer step rank 0 took, and only in those
    assert follower["metrics"] == {"rank": 1, "world_size": 2, "optimizer_steps": len(trained)}
    assert len(trained) >= 1 and all(r["grad_norm"] > 0 for r in trained)
    assert {r["weight_sync"] for r in trained} == {"memory" if backend == "local" else "inplace"}
    assert (tmp_path / "checkpoints" / "round-0002").is_dir()
