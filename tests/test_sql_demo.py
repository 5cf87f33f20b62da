"""The main job's --quick mode end to end for each method, report and metrics.

The default run (evaluation, LightningRL from the base, evaluation) runs on the real default model, Qwen2.5-Coder-0.5B
on CPU: the slow test that shows the main job works. The other methods and flags exercise their own plumbing on a tiny
random policy, in a fraction of the time. Asserts the run folder is complete and its figures are finite — not that
accuracy rises (too few steps for that). ``--no-cache`` makes every evaluation run; the cache key itself is tested on
its own.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from agl.core.stats import PairedComparison
from agl.core.store import open_store
from agl.serving.models import make_tiny_model
from agl.testing import FakeLLM
from agl.trainers.apo import parse_edits
from examples.sql_agent import train
from examples.sql_agent.budget import CLOSING_S, plan_budget
from examples.sql_agent.sql_data import load_split
from examples.sql_agent.train import (
    DEFAULT_N_INDEPENDENT,
    DEFAULT_N_TEST,
    Settings,
    air_rules,
    eval_cache_path,
    eval_groups,
    held_out_tasks,
    main,
    parse_settings,
    rl_config,
    unresolved,
)


def test_held_out_sample_is_stratified_and_fixed() -> None:
    a, b = held_out_tasks(40, seed=0), held_out_tasks(40, seed=0)
    assert a == b and len(a) == 40
    assert {t["tier"] for t in a} == {"easy", "medium", "join", "hard"}
    assert len({t["id"] for t in a}) == 40
    dev = held_out_tasks(8, seed=0, split="dev")
    assert not {t["db_id"] for t in dev} & {t["db_id"] for t in a}, "APO validates on other databases than the test"


def test_report_says_when_the_sample_cannot_resolve_the_last_step_and_points_to_full(tmp_path: Path) -> None:
    def comparisons(low: float, high: float) -> dict[str, dict[str, PairedComparison]]:
        c = PairedComparison(60, 0.83, 0.87, 0.033, (low, high), 1, 3, 0.63)
        return {"rl vs base": {"test": c, "independent": c}}

    s = Settings(out=tmp_path)
    note = "\n".join(unresolved(s, comparisons(-0.033, 0.10)))
    assert "The 60 test questions do not resolve RL − base" in note and "[-3.3, +10.0]" in note
    assert "bash scripts/demo.sh --full" in note and "160 test" in note
    assert unresolved(s, comparisons(0.017, 0.10)) == [], "an interval above 0 is resolved"
    assert unresolved(Settings(out=tmp_path, n_test=None), comparisons(-0.033, 0.10)) == [], "--full has no sample"


def test_default_evaluation_samples_both_groups_and_full_evaluates_every_question(tmp_path: Path) -> None:
    """The default run measures fixed tier-stratified samples (so most of its 45 minutes go to training); ``--full``
    every question of the test split and the independent group, on a 3-hour budget."""
    default = parse_settings(["--out", str(tmp_path / "a")])[1]
    groups = eval_groups(default)
    assert len(groups["test"]) == DEFAULT_N_TEST and len(groups["independent"]) == DEFAULT_N_INDEPENDENT
    assert groups == eval_groups(parse_settings(["--out", str(tmp_path / "b")])[1]), "the same questions every run"
    for group in groups.values():
        assert {t["tier"] for t in group} == {"easy", "medium", "join", "hard"}
    full = parse_settings(["--full", "--out", str(tmp_path / "c")])[1]
    assert full.budget_s == 180 * 60
    groups = eval_groups(full)
    assert len(groups["test"]) == 160 and len({t["id"] for t in groups["test"]}) == 160
    assert len(groups["independent"]) == len(load_split("independent")) >= 100
    assert not {t["db_id"] for t in groups["test"]} & {t["db_id"] for t in groups["independent"]}


def test_plan_gives_rl_the_larger_share_even_when_evaluation_is_slow() -> None:
    # Tuned-for speed: 207 questions at 1 s each. Measured here: 6 s each, and the first evaluation took 21 min.
    fast = plan_budget(45 * 60, 4 * 60, 2 * 207, 1.0, warm_start=True)
    slow = plan_budget(45 * 60, 21 * 60, 2 * 207, 6.0, warm_start=True)
    for plan in (fast, slow):
        assert plan.rl_s >= 0.5 * plan.training_s and plan.sft_cap_s < plan.rl_s
        assert plan.sft_cap_s + plan.rl_s == pytest.approx(plan.training_s)
    assert not fast.over_budget and fast.training_s == pytest.approx(45 * 60 - 4 * 60 - 2 * 207 * 1.15 - CLOSING_S)
    assert slow.over_budget and slow.training_s == pytest.approx(0.25 * 45 * 60), "training keeps a minimum share"
    assert "ends after its budget" in slow.describe() and "to RL" in slow.describe()
    # After the warm start only RL is left: it gets everything but the last evaluation.
    rl_only = plan_budget(45 * 60, 20 * 60, 207, 1.0, warm_start=False)
    assert rl_only.sft_cap_s == 0 and rl_only.rl_s == pytest.approx(25 * 60 - 207 * 1.15 - CLOSING_S)
    with pytest.raises(ValueError, match="sft_share"):
        plan_budget(60, 0, 1, 1.0, warm_start=True, sft_share=0.5)


def test_evaluation_cache_key_covers_weights_prompts_tasks_token_cap_and_machine(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / "model.safetensors").write_bytes(b"weights-1")
    s = Settings(out=tmp_path)
    tasks = held_out_tasks(4, seed=0)
    prompts = {"writer_prompt": "W", "rewriter_prompt": "R"}
    key = eval_cache_path(s, model, tasks, prompts)
    assert key == eval_cache_path(s, model, tasks, dict(prompts))
    assert key != eval_cache_path(s, model, tasks, {**prompts, "writer_prompt": "W2"})
    assert key != eval_cache_path(s, model, tasks[:3], prompts)
    assert key != eval_cache_path(Settings(out=tmp_path, max_tokens=32), model, tasks, prompts)
    with monkeypatch.context() as patched:  # another CPU: greedy answers may differ, so its results are its own
        patched.setattr(train, "cpu_description", lambda: "another CPU, 64 usable cores, torch kernels AVX512")
        assert key != eval_cache_path(s, model, tasks, prompts)
    assert key == eval_cache_path(s, model, tasks, prompts)
    (model / "model.safetensors").write_bytes(b"weights-2")
    assert key != eval_cache_path(s, model, tasks, prompts)
    (model / "model.safetensors").unlink()
    assert eval_cache_path(s, model, tasks, prompts) is None, "no weights file: nothing to key on, never cached"


@pytest.fixture(scope="module")
def tiny_policy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("policy") / "tiny", seed=0)


@pytest.mark.slow
def test_quick_demo_on_the_default_model_trains_lightningrl_from_the_base_and_writes_a_complete_run_folder(
    tmp_path: Path,
) -> None:
    """The default run on the real default model (Qwen2.5-Coder-0.5B, verified and converted from its wheels):
    LightningRL with a LoRA adapter from the base, no warm start, evaluated before and after."""
    out = tmp_path / "run"
    assert main(["--quick", "--no-cache", "--out", str(out)]) == 0
    for name in ("report.md", "metrics.json", "metrics.csv", "curve.png", "rl_metrics.json"):
        assert (out / name).is_file() and (out / name).stat().st_size > 0, name
    metrics = json.loads((out / "metrics.json").read_text())
    assert list(metrics["evaluations"]) == ["base", "rl"] and "sft" not in metrics
    assert "qwen2.5-coder-0.5b" in metrics["policy"]
    for label in ("base", "rl"):
        result = metrics["evaluations"][label]
        assert result["capture_failures"] == 0
        for group in ("test", "independent"):
            assert 0.0 <= result["groups"][group]["accuracy"] <= 1.0 and result["groups"][group]["n"] == 4
            assert math.isfinite(result["groups"][group]["mean_transitions"])
    assert metrics["rl_rounds"] and math.isfinite(metrics["rl_rounds"][0]["mean_reward"])
    report = (out / "report.md").read_text()
    assert "execution accuracy" in report and "curve.png" in report


@pytest.mark.slow
def test_quick_rl_run_evaluates_three_models_and_reports_paired_differences_on_both_groups(
    tiny_policy: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "rl"
    argv = ["--method", "rl", "--quick", "--no-cache", "--policy", str(tiny_policy), "--runners", "2"]
    assert main([*argv, "--out", str(out)]) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert list(metrics["evaluations"]) == ["base", "sft", "sft_rl"]
    for result in metrics["evaluations"].values():
        assert {g: r["n"] for g, r in result["groups"].items()} == {"test": 4, "independent": 4}
        assert result["seconds_per_question"] > 0
    assert set(metrics["outcomes"]["sft_rl"]) == {t["id"] for g in eval_groups_quick() for t in g}
    for pair in ("sft vs base", "sft_rl vs sft"):
        for group in ("test", "independent"):
            c = metrics["comparisons"][pair][group]
            assert c["n"] == 4 and c["ci95"][0] <= c["difference"] <= c["ci95"][1] and 0 < c["p_value"] <= 1
    first, second = metrics["plans"]
    assert first["sft_cap_s"] > 0 and first["rl_share"] >= 0.5 and second["sft_cap_s"] == 0
    assert metrics["sft"]["planned_steps"] >= metrics["sft"]["optimizer_steps"] >= 1
    report = (out / "report.md").read_text()
    for line in ("| SFT − base | test |", "| SFT − base | independent |", "| SFT + RL − SFT | independent |"):
        assert line in report
    assert "execution accuracy, independent" in report and "Time plan" in report
    printed = capsys.readouterr().out
    assert "SFT + RL − SFT, independent: " in printed and "McNemar exact p" in printed
    assert "[demo] evaluating base: 4/8 questions" in printed and "min left" in printed


@pytest.mark.slow
def test_quick_per_agent_run_trains_an_adapter_for_the_writer_and_the_rewriter(
    tiny_policy: Path, tmp_path: Path
) -> None:
    """``--per-agent``: LightningRL trains a LoRA adapter each for the writer and the rewriter over the warm-started
    model, and the final evaluation serves them (each agent's calls routed to its adapter)."""
    out = tmp_path / "per-agent"
    argv = ["--method", "rl", "--per-agent", "--quick", "--no-cache", "--policy", str(tiny_policy), "--runners", "2"]
    assert main([*argv, "--out", str(out)]) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert sorted(metrics["adapters_mb"]) == ["rewriter", "writer"] and all(metrics["adapters_mb"].values())
    assert metrics["evaluations"]["sft_rl"]["failed_rollouts"] == 0
    store = open_store(f"sqlite:///{out}/eval-sft_rl.db")
    spans = store.query_spans(kind="llm")
    store.close()
    routed = {(s.agent, s.attributes["agl.policy"]) for s in spans if s.agent in ("writer", "rewriter")}
    assert routed == {("writer", "policy/writer"), ("rewriter", "policy/rewriter")}
    assert "One LoRA adapter per agent" in (out / "report.md").read_text()


@pytest.mark.slow
def test_quick_rl_without_warm_start_or_air_compares_rl_with_the_start_and_counts_queries_that_ran(
    tiny_policy: Path, tmp_path: Path
) -> None:
    """The AIR ablation's run: ``--no-warm-start --no-air`` trains RL from the starting policy on the final reward
    alone, evaluates start and RL only, compares them, and reports per round the share of queries that ran (here
    with one GRPO baseline per agent and call index, ``--group-by task_agent_step``)."""
    out = tmp_path / "ablation"
    argv = ["--no-warm-start", "--no-air", "--quick", "--no-cache", "--policy", str(tiny_policy), "--runners", "2"]
    argv += ["--group-by", "task_agent_step", "--rl.update.loss.negative_weight", "0.5"]
    assert main([*argv, "--rl-minutes", "1", "--out", str(out)]) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert list(metrics["evaluations"]) == ["base", "rl"] and "sft" not in metrics
    assert set(metrics["comparisons"]) == {"rl vs base"}
    rounds = [r for r in metrics["rl_rounds"] if int(r["round"]) > 0]
    assert rounds and all(0 <= r["executable_rate"] <= 1 and 0 <= r["query_reply_rate"] <= 1 for r in rounds)
    assert all(0 <= r["pass_at_k"] <= 1 and 0 <= r["shape/join"] <= 1 for r in rounds)
    report = (out / "report.md").read_text()
    assert "No warm start" in report and "AIR off" in report and "Queries that ran, per round" in report
    assert "(pass@k), per round" in report and "Final queries with join, per round" in report
    assert "GRPO groups by task_agent_step" in report and "task_agent_step" in metrics["settings"]["rl_flags"]
    assert "negative advantages weighted 0.5" in report
    assert "| RL − base | test |" in report


def test_rl_only_flags_are_refused_with_other_methods(capsys: pytest.CaptureFixture[str]) -> None:
    for flag in (
        ["--no-air"],
        ["--air"],
        ["--rl-minutes", "3"],
        ["--rl-rounds", "2"],
        ["--rl-mini-batches", "2"],
        ["--group-by", "task_agent"],
        ["--informative", "8"],
        ["--advantage-std", "batch"],
        ["--tie-break"],
        ["--rl.update.loss.kl_beta", "0.01"],
    ):
        with pytest.raises(SystemExit):
            main(["--method", "sft", *flag])
        assert f"{flag[0]} is about LightningRL" in capsys.readouterr().err
    for method in ("sft", "apo"):
        with pytest.raises(SystemExit):
            main(["--method", method, "--no-warm-start"])
        assert "--no-warm-start goes with --method rl or --method rft" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--rl-minutes", "0"])
    assert "--rl-minutes must be > 0" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--rl-rounds", "0"])
    assert "argument --rl.rounds/--rl-rounds: must be >= 1, got 0" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--rl-mini-batches", "0"])
    assert "argument --rl.mini_batches/--rl-mini-batches: must be >= 1, got 0" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--rl.group_size", "0"])
    assert "argument --rl.group_size: must be >= 1, got 0" in capsys.readouterr().err


def test_rl_rounds_caps_the_rounds_in_a_quick_run_too(tmp_path: Path) -> None:
    """``--rl-rounds`` sets LightningRL's round cap, over the default and over ``--quick``'s single round;
    ``--rl-mini-batches`` the optimizer steps per round."""

    def config(*flags: str) -> Any:
        return rl_config(parse_settings([*flags, "--out", str(tmp_path)])[1], tmp_path, 60.0)

    default = config()
    assert default.rounds == 50 and default.mini_batches == 1
    assert config("--rl-mini-batches", "4").mini_batches == 4
    assert config("--rl-rounds", "3").rounds == 3
    assert config("--quick").rounds == 1 and config("--quick", "--rl-rounds", "2").rounds == 2


def test_rl_config_keeps_the_demo_defaults_and_applies_any_config_flag(tmp_path: Path) -> None:
    """The demo's own LightningRL defaults (lr 1e-6, or 1e-4 and LoRA per agent; temperature 0.8; 64 tokens; 4 tasks
    of 4 rollouts a round; 50 rounds; quick sizes; a checkpointed update) are the base; every ``--rl.<field path>``
    flag replaces its field, nested ones too, and ``--rl-lr`` is ``--rl.update.lr`` in both modes."""

    def config(*flags: str) -> Any:
        return rl_config(parse_settings([*flags, "--out", str(tmp_path)])[1], tmp_path, 60.0)

    default = config()
    assert (default.update.lr, default.update.lora, default.policies) == (1e-6, None, {})
    assert (default.serving.temperature, default.serving.max_tokens, default.serving.max_batch_size) == (0.8, 64, 16)
    assert (default.tasks_per_round, default.group_size, default.rounds, default.time_budget_s) == (4, 4, 50, 60.0)
    assert (default.checkpoint_dir, default.keep_checkpoints, default.seed) == (tmp_path / "rl", 1, 0)
    per_agent = config("--per-agent")
    assert per_agent.update.lr == 1e-4 and set(per_agent.policies) == {"writer", "rewriter"}
    assert config("--per-agent", "--rl-lr", "3e-4").update.lr == 3e-4
    quick = config("--quick")
    assert (quick.tasks_per_round, quick.group_size, quick.rounds, quick.serving.max_tokens) == (2, 2, 1, 32)
    cfg = config("--rl.update.loss.clip_high", "0.28", "--rl.epochs", "2", "--rl.serving.temperature", "1.0")
    assert (cfg.update.loss.clip_high, cfg.epochs, cfg.serving.temperature) == (0.28, 2, 1.0)
    assert cfg.update.lr == 1e-6 and cfg.serving.max_tokens == 64, "the other fields keep the demo's values"
    assert default.update.gradient_checkpointing, "the demo's update checkpoints (19.4 -> 12.95 GiB, same weights)"
    assert not config("--no-rl.update.gradient_checkpointing").update.gradient_checkpointing


def test_a_folder_holding_a_run_is_refused_as_out(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A second run into the same ``--out`` would add its rollouts to the first run's stores (and read them back
    as its own): refused, naming the stores."""
    (tmp_path / "train.db").write_bytes(b"")
    with pytest.raises(SystemExit):
        parse_settings(["--out", str(tmp_path)])
    assert "already holds a run's stores (train.db)" in capsys.readouterr().err
    assert parse_settings(["--out", str(tmp_path / "fresh")])[1].out == tmp_path / "fresh"


def test_group_by_reaches_lightningrl_grpo_config(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``--group-by`` chooses which calls share a GRPO baseline in the run's LightningRL config (default: task)."""
    default = parse_settings(["--out", str(tmp_path)])[1]
    assert rl_config(default, tmp_path, 60.0).grpo.group_by == "task"
    for mode in ("task_agent", "task_agent_step"):
        s = parse_settings(["--group-by", mode, "--out", str(tmp_path)])[1]
        assert rl_config(s, tmp_path, 60.0).grpo.group_by == mode
    with pytest.raises(SystemExit):
        parse_settings(["--group-by", "rollout", "--out", str(tmp_path)])
    assert "invalid choice: 'rollout'" in capsys.readouterr().err


def test_recipe_flags_reach_lightningrl(tmp_path: Path) -> None:
    """``--informative``, ``--advantage-std`` and ``--tie-break`` set dynamic sampling, the advantage scale and the
    tie-break reward of the run's LightningRL config; by default all three are off (per-group std)."""
    default = rl_config(parse_settings(["--out", str(tmp_path)])[1], tmp_path, 60.0)
    assert default.min_informative_groups is None
    assert (default.grpo.normalize_std, default.grpo.std_scope, default.grpo.tie_break) == (True, "group", False)
    flags = ["--informative", "6", "--advantage-std", "batch", "--tie-break", "--out", str(tmp_path)]
    cfg = rl_config(parse_settings(flags)[1], tmp_path, 60.0)
    assert cfg.min_informative_groups == 6
    assert (cfg.grpo.normalize_std, cfg.grpo.std_scope, cfg.grpo.tie_break) == (True, "batch", True)
    dr_grpo = rl_config(parse_settings(["--advantage-std", "none", "--out", str(tmp_path)])[1], tmp_path, 60.0)
    assert dr_grpo.grpo.normalize_std is False
    same = ["--rl.min_informative_groups", "6", "--rl.grpo.std_scope", "batch", "--rl.grpo.tie_break"]
    assert rl_config(parse_settings([*same, "--out", str(tmp_path)])[1], tmp_path, 60.0) == cfg


def eval_groups_quick() -> list[list[dict[str, Any]]]:
    return list(eval_groups(Settings(out=Path("."), n_test=4, n_independent=4)).values())


def endpoint_model(body: dict[str, Any]) -> str:
    """One endpoint as agent and optimizer: tagged edits for edit requests, a critique, else a fixed query."""
    text = str(body["messages"][-1]["content"])
    if "Critique of the current prompt" in text:
        target = "writer_prompt" if 'name="writer_prompt">' in text.split("Answer with")[-1] else "rewriter_prompt"
        return f'<prompt name="{target}">Write one SQLite query. Reply with SQL only.</prompt>'
    if "Study the failures" in text:
        return "The prompt does not say which tables exist."
    return "CORRECT" if str(body["messages"][0]["content"]).startswith("You check") else "SELECT 1"


@pytest.mark.slow
def test_apo_on_an_endpoint_agent_with_its_own_model_as_optimizer(tmp_path: Path) -> None:
    with FakeLLM(endpoint_model) as fake:
        argv = ["--method", "apo", "--quick", "--runners", "1", "--out", str(tmp_path)]
        argv += ["--base-url", fake.base_url, "--model", "fake"]
        assert main(argv) == 0
        requests = fake.requests
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["optimizer"] == "the agent's own model" and metrics["policy"].startswith("fake at ")
    assert metrics["apo"]["candidates"] >= 2 and metrics["apo"]["unparsed_replies"] == 0
    for label in ("base", "apo"):
        assert {g: r["n"] for g, r in metrics["evaluations"][label]["groups"].items()} == {"test": 4, "independent": 4}
    assert set(metrics["comparisons"]["apo vs base"]) == {"test", "independent"}
    assert any("Study the failures" in str(r["messages"][-1]["content"]) for r in requests)
    assert metrics["apo"]["chosen"] in (tmp_path / "apo_report.md").read_text()


def test_endpoint_weights_cannot_be_trained(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--method", "sft", "--base-url", "http://127.0.0.1:9/v1", "--model", "m"])
    assert "with --base-url use --method apo" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.parametrize("method", ["sft", "apo"])
def test_quick_sft_and_apo_runs_report_before_and_after(tiny_policy: Path, tmp_path: Path, method: str) -> None:
    out = tmp_path / method
    argv = ["--method", method, "--quick", "--no-cache", "--policy", str(tiny_policy), "--runners", "1"]
    assert main([*argv, "--out", str(out)]) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["method"] == method
    for label in ("base", method):
        result = metrics["evaluations"][label]
        assert result["groups"]["test"]["n"] == result["groups"]["independent"]["n"] == 4
        assert result["capture_failures"] == 0 and "cached" not in result
    report = (out / "report.md").read_text()
    assert f"({method.upper()})" in report and "execution accuracy, independent" in report
    assert f"| {'SFT' if method == 'sft' else 'APO prompts'} − base | independent |" in report
    if method == "apo":
        assert metrics["apo"]["optimizer_calls"] >= 2 and metrics["apo"]["rollouts"] >= 2
        assert set(metrics["prompts"]) == {"writer_prompt", "rewriter_prompt"}
        assert (out / "apo_report.md").is_file() and "Published prompts:" in report
    else:
        assert math.isfinite(metrics["sft"]["loss_last"]) and (out / "sft" / "config.json").is_file()


def test_handwritten_edits_answer_each_target_in_apo_markup() -> None:
    from agl.trainers.apo import APOConfig
    from agl.trainers.apo.prompts import format_instructions
    from examples.sql_agent.handwritten_edits import EDITS, scripted_optimizer

    cfg = APOConfig(prompts=["writer_prompt", "rewriter_prompt"])
    for name, versions in EDITS.items():
        request = cfg.edit_prompt.format(
            prompts="",
            targets=name,
            failures="",
            critique="",
            n=2,
            placeholders="",
            output_format=format_instructions([name], 2),
        )
        reply = scripted_optimizer({"messages": [{"role": "user", "content": request}]})
        assert parse_edits(reply, [name]) == [{name: v} for v in versions]
    critique = cfg.critique_prompt.format(
        prompts="", targets="writer_prompt", failures="", n_failures=1, n_rollouts=1, mean_reward="0.00"
    )
    assert parse_edits(scripted_optimizer({"messages": [{"role": "user", "content": critique}]}), ["x"]) == []


def test_compare_pairs_two_runs_on_the_same_questions_and_refuses_different_ones(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from examples.sql_agent.compare import main as compare_main

    test_ids = [t.id for t in load_split("test")][:20]
    a = {i: k < 5 for k, i in enumerate(test_ids)}  # A right on the first 5
    b = {i: k < 12 for k, i in enumerate(test_ids)}  # B right on the first 12: 7 more, none fewer
    for name, model, out in (("one", "sft_rl", a), ("two", "rl", b)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "metrics.json").write_text(json.dumps({"outcomes": {model: out}}))
    one, two = tmp_path / "one" / "metrics.json", tmp_path / "two" / "metrics.json"
    assert compare_main([f"{one}:sft_rl", f"{two}:rl"]) == 0
    printed = capsys.readouterr().out
    assert "test (20 questions): SFT + RL (one) 25.0%, RL (two) 60.0%" in printed and "+35.0 points" in printed
    assert "only RL (two) right 7" in printed and "independent" not in printed
    assert compare_main([f"{one}:sft", f"{two}:rl"]) == 1
    assert "no model 'sft' evaluated (it has: sft_rl)" in capsys.readouterr().err
    (tmp_path / "two" / "metrics.json").write_text(json.dumps({"outcomes": {"rl": dict(list(b.items())[:10])}}))
    assert compare_main([f"{one}:sft_rl", f"{two}:rl"]) == 1
    assert "test: the two runs evaluated different questions (20 vs 10)" in capsys.readouterr().err


def test_compare_curves_puts_two_runs_rl_rounds_side_by_side(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--curves``: both runs' rounds in one table (a round only one run has shows a dash for the other) and a PNG;
    a run without RL rounds is refused."""
    from examples.sql_agent.compare import main as compare_main

    outcome = {t.id: False for t in load_split("test")[:4]}
    rounds = {
        "air": [
            {"round": 0},
            *(
                {
                    "round": n,
                    "query_reply_rate": 0.5,
                    "executable_rate": n / 4,
                    "success_rate": 0.0,
                    "trained_transitions": 30,
                    "zero_variance_fraction": 0.25,
                }
                for n in (1, 2)
            ),
        ],
        "noair": [
            {
                "round": 1,
                "executable_rate": 0.1,
                "success_rate": 0.0,
                "trained_transitions": 0,
                "zero_variance_fraction": 1.0,
            }
        ],
    }
    for name, rows in rounds.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "metrics.json").write_text(json.dumps({"outcomes": {"rl": outcome}, "rl_rounds": rows}))
    png = tmp_path / "curves.png"
    args = [f"{tmp_path}/noair/metrics.json:rl", f"{tmp_path}/air/metrics.json:rl", "--curves", str(png)]
    assert compare_main(args) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "| 1 | – | 10% | 0% | 0 | 100% | 50% | 25% | 0% | 30 | 25% |" in lines
    assert "| 2 | – | – | – | – | – | 50% | 50% | 0% | 30 | 25% |" in lines
    assert png.stat().st_size > 10_000
    (tmp_path / "third").mkdir()
    (tmp_path / "third" / "metrics.json").write_text(json.dumps({"rl_rounds": rounds["noair"]}))
    assert compare_main([*args, "--also", f"{tmp_path}/third/metrics.json"]) == 0
    assert "| 1 | – | 10% | 0% | 0 | 100% | 50% | 25% | 0% | 30 | 25% | – | 10% | 0% | 0 | 100% |" in (
        capsys.readouterr().out.splitlines()
    )
    (tmp_path / "noair" / "metrics.json").write_text(json.dumps({"outcomes": {"rl": outcome}, "rl_rounds": []}))
    assert compare_main(args) == 1
    assert "no LightningRL rounds recorded" in capsys.readouterr().err


def test_air_format_rewards_replies_that_are_a_query_and_only_with_its_flag(tmp_path: Path) -> None:
    """``--air-format`` adds a +0.05 rule for writer/rewriter replies that are a query from their first word (replies
    the untrained model gives: prose, a CREATE TABLE, a query after an explanation, earn nothing); default AIR has
    the run_sql rules only, ``--no-air`` none, and ``--no-air`` with either flag that adds AIR is refused."""
    from agl.core.types import ATTR_OUTPUT_MESSAGES, Span

    def reply(text: str, agent: str = "writer") -> Span:
        return Span.model_validate(
            {
                "rollout_id": "r",
                "attempt_id": "a",
                "kind": "llm",
                "name": "chat",
                "status": "ok",
                "start_time": 0.0,
                "end_time": 0.1,
                "attributes": {ATTR_OUTPUT_MESSAGES: [{"role": "assistant", "content": text}]},
                "agent": agent,
            }
        )

    rules = air_rules(parse_settings(["--air-format", "--out", str(tmp_path)])[1])
    assert len(rules.rules) == 3
    fmt = rules.rules[2]
    for text in (
        "SELECT name FROM singer",
        "  ```sql\nselect count(*)\nfrom t\n```",
        "WITH x AS (SELECT 1) SELECT * FROM x",
    ):
        assert fmt(reply(text)) == 0.05, text
    assert fmt(reply("SELECT name FROM singer", agent="checker")) is None
    for text in (
        "The query should return the names.",
        "CREATE TABLE t (id INTEGER)",
        "Use: SELECT a FROM t",
        "SELECT 1",
    ):
        assert fmt(reply(text)) is None, text
    assert len(air_rules(parse_settings(["--no-warm-start", "--out", str(tmp_path)])[1]).rules) == 2
    assert air_rules(parse_settings(["--no-air", "--no-warm-start", "--out", str(tmp_path)])[1]).rules == []
    for flag in ("--air-format", "--air"):
        with pytest.raises(SystemExit):
            parse_settings(["--no-air", flag, "--out", str(tmp_path)])


def test_air_is_off_after_a_warm_start_unless_asked_for(tmp_path: Path) -> None:
    """After a warm start the policy games AIR's execution reward (docs/results/sql-agent.md), so the default
    warm-started run trains on the final reward alone; ``--air`` (or ``--air-format``) turns AIR on there, and RL from
    the untrained policy keeps it by default (the default model's run starts from its base: AIR on)."""
    warm = ["--warm-start", "--out", str(tmp_path)]
    assert air_rules(parse_settings(warm)[1]).rules == []
    assert air_rules(parse_settings(["--model", "smollm2-135m", "--out", str(tmp_path)])[1]).rules == []
    assert len(air_rules(parse_settings(["--air", *warm])[1]).rules) == 2
    assert len(air_rules(parse_settings(["--air-format", *warm])[1]).rules) == 3
    assert len(air_rules(parse_settings(["--no-warm-start", "--out", str(tmp_path)])[1]).rules) == 2
    assert len(air_rules(parse_settings(["--out", str(tmp_path)])[1]).rules) == 2


def test_the_default_model_starts_rl_from_its_base_and_smollm2_from_a_warm_start(tmp_path: Path) -> None:
    out = ["--out", str(tmp_path)]
    assert not parse_settings(out)[1].warm_start
    assert parse_settings(["--model", "smollm2-135m", *out])[1].warm_start
    assert parse_settings(["--warm-start", *out])[1].warm_start
    assert parse_settings(["--method", "sft", *out])[1].warm_start, "--method sft is the warm start"
    with pytest.raises(SystemExit):
        parse_settings(["--model", "no-such-model", *out])


@pytest.mark.slow
def test_quick_rft_run_samples_the_warm_started_policy_and_reports_three_models(
    tiny_policy: Path, tmp_path: Path
) -> None:
    """``--method rft``: base → SFT → SFT + RFT, the rejection-sampling rounds (two, ReST-EM) mixing the
    demonstrations in; a control matched to the run takes the steps of every round."""
    from examples.sql_agent.train import control_plan

    out = tmp_path / "rft"
    argv = ["--method", "rft", "--quick", "--no-cache", "--policy", str(tiny_policy), "--runners", "1"]
    assert main([*argv, "--rft-rounds", "2", "--rest-em", "--out", str(out)]) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert list(metrics["evaluations"]) == ["base", "sft", "sft_rft"]
    rft = metrics["rft"]
    assert rft["rollouts"] == rft["tasks"] * rft["k"] and rft["extra_samples"] == metrics["sft"]["samples"]
    assert [r["round"] for r in rft["rounds"]] == [1, 2] and rft["total_rollouts"] == 2 * rft["rollouts"]
    assert all(r["trained_from"] == "start" for r in rft["rounds"]), "ReST-EM trains each round from the start"
    assert rft["total_optimizer_steps"] == sum(r["optimizer_steps"] for r in rft["rounds"]) > rft["optimizer_steps"]
    assert control_plan("more", out).steps == rft["total_optimizer_steps"]
    report = (out / "report.md").read_text()
    assert "| SFT + RFT − SFT | test |" in report and "2 rounds (ReST-EM" in report


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--rft-rounds", "2"], "--rft-rounds is about rejection sampling"),
        (["--method", "rft", "--rest-em"], "--rest-em retrains from the start each round"),
        (["--method", "rft", "--rft-samples", "0"], "--rft-samples: must be >= 1"),
    ],
)
def test_rft_flags_are_refused_where_they_mean_nothing(
    flags: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        main([*flags, "--out", str(tmp_path / "run")])
    assert message in capsys.readouterr().err


def test_query_shapes_are_counted_per_tier() -> None:
    from examples.sql_agent.train import shape_shares

    finals = [
        ("join", "SELECT a FROM t JOIN u ON t.id = u.t_id"),
        ("join", "SELECT a FROM t WHERE id IN (SELECT t_id FROM u)"),
        ("easy", "select count(*) from t group  by a"),
        ("easy", ""),
    ]
    got = shape_shares(finals)
    assert got["shape/join"] == 0.25 and got["shape/join/join"] == 0.5 and got["shape/join/easy"] == 0.0
    assert got["shape/group_by"] == 0.25 and got["shape/group_by/easy"] == 0.5
    assert got["shape/subquery"] == 0.25 and got["shape/subquery/join"] == 0.5


@pytest.mark.slow
def test_an_sft_control_takes_the_optimizer_steps_of_the_rl_run_it_matches(tiny_policy: Path, tmp_path: Path) -> None:
    """``--method control --match RUN``: from the RL run's start, exactly its optimizer steps of its trained calls per
    step, on the gold SQL of the very questions it sampled (``labels``); evaluated on the same questions."""
    from examples.sql_agent.train import control_plan, sampled_tasks

    arm = tmp_path / "arm"
    argv = ["--no-warm-start", "--quick", "--no-cache", "--policy", str(tiny_policy), "--runners", "2"]
    argv += ["--no-rl.grpo.skip_zero_variance"]  # the tiny policy solves nothing: train its flat groups anyway
    assert main([*argv, "--rl-minutes", "1", "--out", str(arm)]) == 0
    rounds = [r for r in json.loads((arm / "metrics.json").read_text())["rl_rounds"] if int(r["round"]) > 0]
    steps = sum(int(r["optimizer_steps"]) for r in rounds)
    assert steps >= 1
    plan = control_plan("labels", arm)
    assert plan.start == tiny_policy and plan.steps == steps and plan.task_ids == sampled_tasks(arm / "train.db")
    assert len(plan.task_ids) == 2, "the quick run samples two questions a round"
    out = tmp_path / "control"
    control_argv = ["--method", "control", "--control", "labels", "--match", str(arm), "--quick", "--no-cache"]
    assert main([*control_argv, "--runners", "2", "--out", str(out)]) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    control = metrics["control"]
    assert control["optimizer_steps"] == control["matched_steps"] == steps
    assert control["samples"] == 2 and control["sequences_per_step"] == plan.sequences_per_step
    assert list(metrics["evaluations"]) == ["base", "control"] and set(metrics["comparisons"]) == {"control vs base"}
    arm_ids = json.loads((arm / "metrics.json").read_text())["outcomes"]["rl"].keys()
    assert metrics["outcomes"]["control"].keys() == arm_ids, "the control answers the arm's questions"
    assert "SFT control of the run" in (out / "report.md").read_text()


def test_a_control_needs_an_rl_or_rft_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--method", "control", "--out", str(tmp_path / "x")])
    assert "--method control needs --match" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--method", "control", "--match", str(tmp_path), "--out", str(tmp_path / "y")])
    assert "holds no finished demo run" in capsys.readouterr().err


def test_an_adapter_is_merged_onto_an_fp32_server_and_served_beside_a_bf16_one(
    tiny_policy: Path, tmp_path: Path
) -> None:
    """Every arm's LoRA adapter is evaluated the same way (``serve_checkpoint``): merged onto its base where the server
    runs fp32 (the served weights are the merged ones, no adapter left to apply per layer), served on the side where
    it runs bf16 (merging would round the adapter's small changes into bf16 weights)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_policy, dtype=torch.float32)
    name = "model.layers.0.mlp.down_proj.weight"
    before = model.state_dict()[name].clone()
    tuned = get_peft_model(model, LoraConfig(r=4, target_modules="all-linear", init_lora_weights=False))
    tuned.save_pretrained(str(tmp_path / "adapter"))
    merged = tuned.merge_and_unload().state_dict()
    server, routes = train.serve_checkpoint(tmp_path / "adapter", seed=0, dtype="float32")
    try:
        assert routes == {} and server.adapters == {} and server.weights_version == "tuned"
        assert not torch.allclose(merged[name], before, atol=1e-4), "the adapter changes the weights"
        assert torch.allclose(server.model.state_dict()[name], merged[name], atol=1e-6)
    finally:
        server.stop()
    server, routes = train.serve_checkpoint(tmp_path / "adapter", seed=0, dtype="bfloat16")
    try:
        assert server.adapters == {"tuned": "tuned"}
        assert {route.model for route in routes.values()} == {f"{server.model_name}/tuned"}
    finally:
        server.stop()
