"""SFT: selection rules, exact-id samples and loss mask (as TRL prepares them), training raises the log-prob of the
trained responses, the served weights version follows what was loaded, and a full Trainer run on a tiny model (CPU).
"""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import openai
import pytest
import torch

import agl
from agl.core.types import ATTR_WEIGHTS_VERSION, Trajectory, Transition
from agl.precision import fast_dtype
from agl.trainers.sft import (
    SFT,
    SFTConfig,
    SFTSample,
    build_samples,
    make_sft_trainer,
    select_trajectories,
    sft_on_trajectories,
    to_sft_sample,
)

# -- pure: selection and samples -------------------------------------------------------------------------------------


def _traj(task: str, reward: float | None, status: str = "succeeded", n: int = 1, tag: str = "") -> Trajectory:
    transitions = [
        Transition(span_id=f"{task}{tag}-{i}", agent=None, step=i, prompt_ids=[1, 2, 3 + i], response_ids=[7, 8])
        for i in range(n)
    ]
    return Trajectory(
        rollout_id=f"ro-{task}{tag}",
        attempt_id="at",
        task_id=task,
        resources_version=1,
        status=status,  # type: ignore[arg-type]
        final_reward=reward,
        transitions=transitions,
    )


def test_selection_rules() -> None:
    trajs = [
        _traj("a", 1.0, tag="1"),
        _traj("a", 0.5, tag="2"),
        _traj("a", 1.0, tag="3"),
        _traj("b", 1.0, status="failed", tag="1"),
        _traj("b", None, tag="2"),
        _traj("c", 0.2, tag="1"),
    ]
    ids = [t.rollout_id for t in select_trajectories(trajs)]
    assert ids == ["ro-a1", "ro-a2", "ro-a3", "ro-c1"], "successful_only drops failed and reward-less rollouts"
    ids = [t.rollout_id for t in select_trajectories(trajs, min_reward=1.0)]
    assert ids == ["ro-a1", "ro-a3"]
    ids = [t.rollout_id for t in select_trajectories(trajs, successful_only=False, min_reward=1.0)]
    assert ids == ["ro-a1", "ro-a3", "ro-b1"]
    ids = [t.rollout_id for t in select_trajectories(trajs, top_k_per_task=1)]
    assert ids == ["ro-a1", "ro-c1"], "per task, the highest reward first (ties: earliest)"


def test_samples_are_exact_ids_with_a_response_only_mask() -> None:
    t = Transition(span_id="s", agent=None, step=0, prompt_ids=[5, 6, 7, 8], response_ids=[9, 10, 11])
    sample = to_sft_sample(t)
    assert sample.input_ids == [5, 6, 7, 8, 9, 10, 11]
    assert sample.completion_mask == [0, 0, 0, 0, 1, 1, 1] and not sample.truncated
    cut = to_sft_sample(t, max_length=5)
    assert cut.input_ids == [7, 8, 9, 10, 11] and cut.completion_mask == [0, 0, 1, 1, 1] and cut.truncated
    assert to_sft_sample(t, max_length=3).input_ids == [8, 9, 10], "the response is cut only when it alone overflows"
    assert [s.input_ids for s in build_samples([_traj("x", 1.0, n=2)])] == [[1, 2, 3, 7, 8], [1, 2, 4, 7, 8]]
    with pytest.raises(ValueError, match="no token ids"):
        to_sft_sample(Transition(span_id="s", agent=None, step=0))


# -- with the tiny model ---------------------------------------------------------------------------------------------

PAIRS = [("What is the capital of France?", "Paris"), ("Name a primary color.", "Blue"), ("Say hi.", "Hello there")]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from agl.serving.models import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("tiny") / "model", seed=0)


def _ids(value: Any) -> list[int]:
    return list(value["input_ids"] if not isinstance(value, list) else value)


@pytest.fixture(scope="module")
def trajectories(tiny: Path) -> list[Trajectory]:
    """One-call trajectories whose ids are what a chat server would record: templated prompt, response + <|im_end|>."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny)
    out = []
    for i, (question, answer) in enumerate(PAIRS):
        prompt = _ids(tok.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True))
        response = _ids(tok(answer + "<|im_end|>", add_special_tokens=False))
        transition = Transition(span_id=f"s{i}", agent=None, step=0, prompt_ids=prompt, response_ids=response)
        out.append(
            Trajectory(
                rollout_id=f"ro{i}",
                attempt_id="at",
                task_id=f"t{i}",
                resources_version=1,
                status="succeeded",
                final_reward=1.0,
                transitions=[transition],
            )
        )
    return out


def _response_logprob(model_dir: Path, trajectories: list[Trajectory]) -> float:
    """Sum over trajectories of log p(response | prompt) from one forward pass each."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    total = 0.0
    for traj in trajectories:
        t = traj.transitions[0]
        ids = torch.tensor([t.prompt_ids + t.response_ids])
        with torch.no_grad():
            logprobs = model(input_ids=ids).logits[0, :-1].log_softmax(-1)
        token_lp = logprobs.gather(-1, ids[0, 1:, None])[:, 0]
        total += float(token_lp[len(t.prompt_ids) - 1 :].sum())
    return total


def test_trl_sees_exact_ids_and_masks_the_prompt(tiny: Path, trajectories: list[Trajectory], tmp_path: Path) -> None:
    samples = build_samples(trajectories)
    trainer = make_sft_trainer(samples, SFTConfig(model_dir=tiny, device="cpu"), tmp_path / "out")
    assert trainer.args.bf16 == (fast_dtype("cpu") == torch.bfloat16), (
        "bf16 only on a CPU where it is fast: TRL's default emulates it elsewhere, tens of times slower"
    )
    assert not trainer.args.gradient_checkpointing and not trainer.model.is_gradient_checkpointing, (
        "TRL recomputes activations by default; agl does only when asked (SFTConfig.gradient_checkpointing)"
    )
    prepared: Any = trainer.train_dataset
    for row, traj in zip(prepared, trajectories, strict=True):
        t = traj.transitions[0]
        assert row["input_ids"] == t.prompt_ids + t.response_ids
        assert row["labels"] == [-100] * len(t.prompt_ids) + t.response_ids


@pytest.fixture(scope="module")
def trained(tiny: Path, trajectories: list[Trajectory], tmp_path_factory: pytest.TempPathFactory) -> Path:
    cfg = SFTConfig(model_dir=tiny, lr=3e-3, epochs=4, batch_tokens=64, device="cpu")
    return sft_on_trajectories(trajectories, cfg, output_dir=tmp_path_factory.mktemp("sft") / "weights")


def test_sft_raises_the_logprob_of_the_trained_responses(
    tiny: Path, trajectories: list[Trajectory], trained: Path
) -> None:
    before, after = _response_logprob(tiny, trajectories), _response_logprob(trained, trajectories)
    assert after > before + 1.0, (before, after)


def test_sft_time_budget_stops_before_the_next_step_and_progress_is_printed(
    tiny: Path, trajectories: list[Trajectory], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from agl.trainers.sft.train import train_samples

    cfg = SFTConfig(model_dir=tiny, lr=3e-3, epochs=4, batch_tokens=64, device="cpu", time_budget_s=1e-6)
    result = train_samples(build_samples(trajectories), cfg, tmp_path / "out")
    assert result.metrics["planned_steps"] > 1 and result.metrics["optimizer_steps"] == 1
    assert result.metrics["stopped_by_budget"] and result.metrics["seconds_per_step"] > 0
    assert (tmp_path / "out" / "config.json").is_file(), "a stopped run still saves its weights"
    err = capsys.readouterr().err
    assert f"sft step 1/{result.metrics['planned_steps']}: loss" in err and "tokens/s" in err and "min left" in err
    assert "time budget" in err
    with pytest.raises(ValueError, match="time_budget_s"):
        SFTConfig(model_dir=tiny, time_budget_s=0)


def _served_version(base_url: str) -> str:
    client = openai.OpenAI(base_url=base_url, api_key="x", max_retries=0)
    reply = client.chat.completions.create(
        model="policy", messages=[{"role": "user", "content": "hi"}], max_tokens=2, temperature=0
    )
    return str((reply.model_extra or {})["agl_weights_version"])


def test_max_steps_cycles_the_samples_and_sequences_per_step_accumulate(
    tiny: Path, trajectories: list[Trajectory], tmp_path: Path
) -> None:
    """A control matched to an RL run: exactly ``max_steps`` optimizer steps, more than one pass over few samples,
    each step accumulating passes until it has seen ``sequences_per_step`` samples."""
    from agl.trainers.sft.train import train_samples

    samples = build_samples(trajectories)
    cfg = SFTConfig(model_dir=tiny, lr=1e-3, batch_tokens=1, device="cpu", max_steps=5, sequences_per_step=3)
    trainer = make_sft_trainer(samples, cfg, tmp_path / "inspect")
    assert (trainer.args.per_device_train_batch_size, trainer.args.gradient_accumulation_steps) == (1, 3)
    assert len(samples) < 5 * 3, "the samples are cycled"
    result = train_samples(samples, cfg, tmp_path / "out")
    assert result.metrics["optimizer_steps"] == result.metrics["planned_steps"] == 5


def test_served_model_reports_the_loaded_weights_version(tiny: Path, trained: Path) -> None:
    from agl.serving import PolicyServer

    with PolicyServer(tiny, seed=0) as server:
        assert _served_version(server.base_url) == "v0"
        server.load_weights(trained, "v1")
        assert _served_version(server.base_url) == "v1" == server.weights_version


def test_lora_saves_an_adapter_the_server_merges(tiny: Path, trajectories: list[Trajectory], tmp_path: Path) -> None:
    import torch

    from agl.serving import PolicyServer

    cfg = SFTConfig(model_dir=tiny, lora=agl.LoraConfig(r=8), lr=3e-2, epochs=3, device="cpu")
    adapter = sft_on_trajectories(trajectories, cfg, output_dir=tmp_path / "lora")
    assert (adapter / "adapter_config.json").is_file() and not (adapter / "config.json").is_file()
    with PolicyServer(tiny, seed=0) as server:
        before = {k: v.clone() for k, v in server.model.state_dict().items()}
        server.load_weights(adapter, "v1-lora")
        assert _served_version(server.base_url) == "v1-lora"
        changed = [k for k, v in server.model.state_dict().items() if not torch.equal(v, before[k])]
        assert changed, "the merged adapter changed the served weights"


def test_sft_trains_on_imported_text_traces_rendered_with_the_chat_template(tiny: Path, tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    from agl.otel import import_traces, read_otlp_json, stored_trajectories
    from agl.trainers.sft.train import train_samples
    from examples.howto.production_traces import write_traces

    store = agl.open_store(f"sqlite:///{tmp_path / 'imported.db'}")
    import_traces(store, read_otlp_json(write_traces(tmp_path / "traces.json", PAIRS, agent=None)), source="prod")
    cfg = SFTConfig(model_dir=tiny, successful_only=False, min_reward=None, lr=3e-3, epochs=4, device="cpu")
    imported = stored_trajectories(store, algorithm=SFT(cfg))  # SFT takes text; RL refuses it (test_otel)
    assert [t.transitions[0].has_token_ids for t in imported] == [False] * len(PAIRS)
    with pytest.raises(ValueError, match="no token ids"):
        build_samples(imported)  # exact ids only, unless a tokenizer is given

    tok = AutoTokenizer.from_pretrained(tiny)
    samples = build_samples(imported, tokenizer=tok)
    assert all(s.text_derived for s in samples)
    for sample, (question, answer) in zip(samples, PAIRS, strict=True):
        prompt = _ids(tok.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True))
        cut = sample.completion_mask.index(1)
        assert sample.input_ids[:cut] == prompt and sample.completion_mask[cut:] == [1] * (len(sample.input_ids) - cut)
        assert tok.decode(sample.input_ids[cut:]).startswith(answer + "<|im_end|>"), "the loss is on the answer"

    result = train_samples(samples, cfg, tmp_path / "weights")
    assert math.isfinite(result.metrics["train_loss"]) and result.metrics["text_derived"] == len(PAIRS)
    as_ids = [
        t.model_copy(
            update={
                "transitions": [
                    Transition(
                        span_id=f"s{i}",
                        agent=None,
                        step=0,
                        prompt_ids=s.input_ids[: s.completion_mask.index(1)],
                        response_ids=s.input_ids[s.completion_mask.index(1) :],
                    )
                ]
            }
        )
        for i, (t, s) in enumerate(zip(imported, samples, strict=True))
    ]
    before, after = _response_logprob(tiny, as_ids), _response_logprob(result.path, as_ids)
    assert after > before + 1.0, (before, after)
    one_epoch = SFTConfig(model_dir=tiny, successful_only=False, min_reward=None, device="cpu")
    assert (sft_on_trajectories(imported, one_epoch, output_dir=tmp_path / "w") / "config.json").is_file()


# -- end to end ------------------------------------------------------------------------------------------------------


def short_reply_agent(task: dict[str, Any], resources: dict[str, Any]) -> float:
    """One call with the published sampling; any non-empty reply counts as a success."""
    llm = resources["main_llm"]
    client = openai.OpenAI(base_url=llm.base_url, api_key=llm.api_key, max_retries=0)
    reply = client.chat.completions.create(
        model=llm.model, messages=[{"role": "user", "content": task["prompt"]}], **llm.sampling
    )
    return 1.0 if (reply.choices[0].message.content or "").strip() else 0.0


@pytest.mark.slow
def test_trainer_fit_with_sft_publishes_and_serves_new_versions(tiny: Path, tmp_path: Path) -> None:
    from agl.core.store import open_store

    cfg = SFTConfig(
        model_dir=tiny,
        min_reward=None,
        rft_rounds=2,
        samples_per_task=2,
        serving=agl.ServingConfig(max_tokens=4),
        lr=1e-3,
        val_every=2,
    )
    tasks = [{"id": f"t{i}", "prompt": p} for i, p in enumerate(["Hello", "Say words", "Go"])]
    store_url = f"sqlite:///{tmp_path / 'agl.db'}"
    trainer = agl.Trainer(algorithm=SFT(cfg), n_runners=2, store=store_url, progress=False)
    result = trainer.fit(short_reply_agent, tasks, tasks[:2])
    assert result.metrics["weights_version"] == "v2" and result.metrics["samples"] == 6
    policy = result.resources.resources["policy"]
    assert isinstance(policy, agl.ModelWeights) and policy.version == "v2"
    assert Path(policy.path) == tmp_path / "sft" / "round-0002" and policy.base_model == str(tiny)
    llm = result.resources.resources["main_llm"]
    assert isinstance(llm, agl.LLM) and llm.weights_version == "v2"
    store = open_store(store_url)
    try:
        published = [store.get_resources(v).resources["policy"] for v in range(1, result.resources.version + 1)]
        seen: dict[tuple[str, int], set[str]] = {}
        for ro in store.list_rollouts(limit=1000):
            for span in store.query_spans(rollout_id=ro.rollout_id, kind="llm"):
                seen.setdefault((ro.mode, ro.resources_version), set()).add(span.attributes[ATTR_WEIGHTS_VERSION])
    finally:
        store.close()
    assert [p.version for p in published if isinstance(p, agl.ModelWeights)] == ["v0", "v1", "v2"]
    train = [seen[k] for k in sorted(seen) if k[0] == "train"]
    val = [seen[k] for k in sorted(seen) if k[0] == "val"]
    assert train == [{"v0"}, {"v1"}], "round 2 samples from the weights trained in round 1"
    assert val == [{"v0"}, {"v2"}], "validation before training and after the last round"


def test_per_agent_sft_trains_each_adapter_only_on_the_calls_it_served(
    tiny: Path, trajectories: list[Trajectory], tmp_path: Path
) -> None:
    import torch
    from safetensors.torch import load_file

    from agl.trainers.sft.train import fresh_adapter, train_policies, train_samples

    with pytest.raises(ValueError, match=r"policies\['writer'\].*only 'lora'"):
        SFTConfig(model_dir=tiny, policies={"writer": "full"})
    cfg = SFTConfig(
        model_dir=tiny, policies={"writer": "lora", "rewriter": "lora"}, lora=agl.LoraConfig(r=8), lr=3e-2, device="cpu"
    )
    start = {agent: fresh_adapter(cfg, tmp_path / "start" / agent) for agent in cfg.policies}
    served = ["policy/writer", "policy", "policy/writer"]  # the rewriter served nothing; one call went to the base
    routed = [
        t.model_copy(update={"transitions": [t.transitions[0].model_copy(update={"policy": p})]})
        for t, p in zip(trajectories, served, strict=True)
    ]
    versions = {"writer": "v0", "rewriter": "v0"}
    models = {"policy/writer": "writer", "policy/rewriter": "rewriter"}
    results, base = train_policies(routed, cfg, tmp_path / "round", start, versions, "v1", models)
    assert list(results) == ["writer"] and base == 1 and versions == {"writer": "v1", "rewriter": "v0"}
    manifest = json.loads((tmp_path / "round" / "manifest.json").read_text())
    assert {a: (e["folder"], e["version"]) for a, e in manifest["adapters"].items()} == {
        "writer": ("writer", "v1"),
        "rewriter": ("rewriter", "v0"),
    }

    def weights(folder: Path) -> dict[str, torch.Tensor]:
        return load_file(str(folder / "adapter_model.safetensors"))

    # the writer's adapter is exactly what training on the writer's two calls alone gives; the rewriter's is unchanged
    alone = train_samples(
        build_samples([routed[0], routed[2]]),
        replace(cfg, lora=True),
        tmp_path / "alone",
        start["writer"],
    )
    trained, expected = weights(tmp_path / "round" / "writer"), weights(alone.path)
    assert trained.keys() == expected.keys() and all(torch.equal(trained[k], expected[k]) for k in trained)
    assert any(not torch.equal(trained[k], weights(start["writer"])[k]) for k in trained)
    untouched, fresh = weights(tmp_path / "round" / "rewriter"), weights(start["rewriter"])
    assert all(torch.equal(untouched[k], fresh[k]) for k in fresh)


def test_the_loss_projects_only_response_positions_and_equals_trls_own(
    tiny: Path, trajectories: list[Trajectory], tmp_path: Path
) -> None:
    """The SFT loss computes logits only where a response token is predicted, and is TRL's loss (and gradient)."""
    from trl import SFTTrainer

    trainer = make_sft_trainer(build_samples(trajectories), SFTConfig(model_dir=tiny, device="cpu"), tmp_path / "o")
    batch = next(iter(trainer.get_train_dataloader()))
    model = trainer.model
    calls: list[int] = []
    head = model.get_output_embeddings()
    hook = head.register_forward_hook(lambda _m, args, _out: calls.append(args[0].shape[0]))
    ours = trainer.compute_loss(model, dict(batch))
    hook.remove()
    assert calls == [int((batch["labels"][:, 1:] != -100).sum())], "the output layer ran on response positions only"
    ours.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    theirs = SFTTrainer.compute_loss(trainer, model, dict(batch))
    theirs.backward()
    assert float(ours) == pytest.approx(float(theirs), rel=1e-5)
    for name, param in model.named_parameters():
        assert torch.allclose(grads[name], param.grad, rtol=1e-4, atol=1e-6), name


@pytest.mark.slow
def test_extra_samples_join_every_rounds_selected_ones(tiny: Path, tmp_path: Path) -> None:
    """Rejection sampling mixed with demonstrations: ``extra_samples`` are trained on beside the round's selected
    rollouts, and are counted apart."""
    cfg = SFTConfig(
        model_dir=tiny,
        min_reward=None,
        rft_rounds=1,
        samples_per_task=2,
        serving=agl.ServingConfig(max_tokens=4),
        lr=1e-3,
    )
    demos = [SFTSample([1, 2, 3, 4, 5, 6], [0, 0, 0, 1, 1, 1]), SFTSample([7, 8, 9, 10], [0, 0, 1, 1])]
    tasks = [{"id": f"t{i}", "prompt": p} for i, p in enumerate(["Hello", "Go"])]
    trainer = agl.Trainer(
        algorithm=SFT(cfg, extra_samples=demos), n_runners=2, store=f"sqlite:///{tmp_path / 'a.db'}", progress=False
    )
    result = trainer.fit(short_reply_agent, tasks)
    assert result.metrics["selected_samples"] == 4 and result.metrics["extra_samples"] == 2
    assert result.metrics["samples"] == 6, "the demonstrations are trained on with the selected calls"


def test_extra_samples_are_refused_with_per_agent_policies(tiny: Path) -> None:
    cfg = SFTConfig(model_dir=tiny, policies={"writer": "lora"})
    with pytest.raises(ValueError, match="extra_samples: only a single policy"):
        SFT(cfg, extra_samples=[SFTSample([1, 2], [0, 1])])


@pytest.mark.slow
def test_rest_em_retrains_from_the_start_weights_on_every_selection_so_far(
    tiny: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ReST-EM (``retrain_from_start``): round 2 samples from round 1's weights but trains from ``model_dir`` on both
    rounds' selections; iterated expert iteration (the default) continues from round 1's weights on round 2's own."""
    import agl.trainers.sft.train as sft_train

    real = sft_train.train_samples
    calls: list[tuple[int, str | Path | None]] = []

    def recording(samples: Any, config: SFTConfig, output_dir: Any, init_from: Any = None) -> Any:
        calls.append((len(samples), init_from))
        return real(samples, config, output_dir, init_from)

    monkeypatch.setattr(sft_train, "train_samples", recording)
    tasks = [{"id": f"t{i}", "prompt": p} for i, p in enumerate(["Hello", "Go"])]
    for restart in (True, False):
        cfg = SFTConfig(
            model_dir=tiny,
            min_reward=None,
            rft_rounds=2,
            samples_per_task=2,
            retrain_from_start=restart,
            serving=agl.ServingConfig(max_tokens=4),
            lr=1e-3,
            output_dir=tmp_path / f"restart-{restart}",
        )
        calls.clear()
        trainer = agl.Trainer(
            algorithm=SFT(cfg), n_runners=2, store=f"sqlite:///{tmp_path / f'{restart}.db'}", progress=False
        )
        result = trainer.fit(short_reply_agent, tasks)
        round_one = tmp_path / f"restart-{restart}" / "round-0001"
        if restart:
            assert calls == [(4, None), (8, None)], "each round from model_dir, on every selection so far"
            assert result.metrics["trained_from"] == "start" and result.metrics["cumulative_samples"] == 8
        else:
            assert calls == [(4, None), (4, round_one)], "round 2 continues from round 1 on its own selection"
            assert "trained_from" not in result.metrics


def test_rest_em_is_refused_with_per_agent_policies(tiny: Path) -> None:
    with pytest.raises(ValueError, match="retrain_from_start: only a single policy"):
        SFTConfig(model_dir=tiny, policies={"writer": "lora"}, retrain_from_start=True)
