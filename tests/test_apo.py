"""APO: selection, edit parsing and checks, failure rendering, and the full loop against scripted fake LLMs.

The toy agent sends its prompt (filled with the question) to a fake model that answers correctly only when the prompt
holds the keyword the question's kind needs ("carefully" for math, "JSON" for format). The fake optimizer edits by a
fixed table, so the search is deterministic: plain beam search (top-k by mean) keeps two near-identical math prompts
and never combines the fixes, while Pareto selection keeps the format-only specialist and reaches the prompt that
solves every task.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import openai
import pytest

import agl
from agl.core.types import PromptTemplate, Trajectory, Transition
from agl.testing import FakeLLM
from agl.trainers.apo import APO, APOConfig, check_edit, pareto_front, pareto_select, parse_edits, top_k_by_mean
from agl.trainers.apo.feedback import render_rollout

# -- selection -------------------------------------------------------------------------------------------------------

TASKS4 = ["t1", "t2", "t3", "t4"]
SCORES = {
    "leader": {"t1": 1.0, "t2": 1.0, "t3": 1.0, "t4": 0.0},  # mean 0.75
    "close": {"t1": 0.9, "t2": 0.9, "t3": 0.9, "t4": 0.0},  # mean 0.675, best nowhere
    "specialist": {"t1": 0.0, "t2": 0.0, "t3": 0.0, "t4": 1.0},  # mean 0.25, alone best on t4
}


def test_pareto_keeps_a_low_mean_specialist_that_top_k_drops() -> None:
    assert top_k_by_mean(SCORES, TASKS4, 2) == ["leader", "close"]
    assert pareto_front(SCORES, TASKS4) == ["leader", "specialist"]
    assert pareto_select(SCORES, TASKS4, 2) == ["leader", "specialist"]


def test_pareto_ties_count_as_best_and_cap_prefers_coverage_then_mean() -> None:
    scores = {
        "a": {"t1": 1.0, "t2": 1.0, "t3": 0.0},  # mean 0.667
        "b": {"t1": 1.0, "t2": 1.0, "t3": 0.0},  # same scores: tied best on t1, t2
        "c": {"t1": 0.0, "t2": 0.0, "t3": 1.0},  # mean 0.333
        "d": {"t1": 0.5, "t2": 0.5, "t3": 0.5},  # mean 0.5, best nowhere
    }
    tasks = ["t1", "t2", "t3"]
    assert pareto_front(scores, tasks) == ["a", "b", "c"]
    assert pareto_select(scores, tasks, 2) == ["a", "c"], "c alone covers t3; b only repeats a"
    assert pareto_select(scores, tasks, 3) == ["a", "b", "c"]
    assert pareto_select(scores, tasks, 1) == ["a"]
    assert top_k_by_mean(scores, tasks, 3) == ["a", "b", "d"]
    everyone_fails = {"x": {"t1": 0.0}, "y": {"t1": 0.0}}
    assert pareto_select(everyone_fails, ["t1"], 1) == ["x"], "ties keep the earlier (incumbent) candidate"


# -- edits -----------------------------------------------------------------------------------------------------------


def test_parse_edits_single_target_tolerates_prose_fences_and_truncation() -> None:
    reply = (
        'Sure! Version one:\n<prompt name="sys">\nBe brief. {q}\n</prompt>\n'
        "and two:\n<PROMPT name=sys>```text\nBe precise. {q}\n```</PROMPT>\n"
        "<prompt>Unnamed works for a single target. {q}</prompt>\n"
        '<prompt name="other">ignored: not a target</prompt>\n'
        '<prompt name="sys">cut off by the token limit'
    )
    assert parse_edits(reply, ["sys"]) == [
        {"sys": "Be brief. {q}"},
        {"sys": "Be precise. {q}"},
        {"sys": "Unnamed works for a single target. {q}"},
    ]


def test_parse_edits_takes_an_untagged_reply_whole_only_when_asked() -> None:
    reply = "```\nThink step by step. {q}\n```"
    assert parse_edits(reply, ["sys"]) == []
    assert parse_edits(reply, ["sys"], untagged=True) == [{"sys": "Think step by step. {q}"}]
    assert parse_edits("   ", ["sys"], untagged=True) == []
    assert parse_edits("<prompt name=sys>cut off", ["sys"], untagged=True) == [], "a broken tag is not untagged"
    assert parse_edits("plain text", ["a", "b"], untagged=True) == [], "several targets need names"


def test_parse_edits_joint_candidates() -> None:
    reply = (
        '<candidate><prompt name="a">A1</prompt><prompt name="b">B1</prompt></candidate>\n'
        '<candidate>\n<prompt name="b">B2 only</prompt>\n</candidate>\n'
        "<candidate>nothing parseable</candidate>"
    )
    assert parse_edits(reply, ["a", "b"]) == [{"a": "A1", "b": "B1"}, {"b": "B2 only"}]
    assert parse_edits('<prompt name="a">A</prompt> <prompt name="b">B</prompt>', ["a", "b"]) == [{"a": "A", "b": "B"}]


def test_check_edit_rejects_dropped_added_or_broken_placeholders() -> None:
    original = PromptTemplate(template="Schema: {schema}\nQuestion: {question}")
    assert check_edit(original, "Use the schema {schema} to answer {question} in SQL.") is None
    assert check_edit(original, "Answer {question}.") == "drops placeholder(s) {schema}"
    assert check_edit(original, "{schema} {question} {dialect}") == "adds unknown placeholder(s) {dialect}"
    assert "not a valid str.format template" in (check_edit(original, "{schema} {question} {") or "")
    assert check_edit(original, '{schema} {question} as JSON {{"sql": ...}}') is None
    assert check_edit(original, "   ") == "empty prompt"


def test_render_rollout_shows_new_messages_tool_results_error_and_reward() -> None:
    first = [{"role": "system", "content": "SYS"}, {"role": "user", "content": "how many users?"}]
    call = {"id": "c1", "type": "function", "function": {"name": "run_sql", "arguments": '{"q": "SELECT"}'}}
    reply1 = {"role": "assistant", "content": None, "tool_calls": [call]}
    second: list[dict[str, Any]] = [
        *first,
        reply1,
        {"role": "tool", "tool_call_id": "c1", "content": "error: no such table"},
    ]
    traj = Trajectory(
        rollout_id="ro-1",
        attempt_id="at-1",
        task_id="t1",
        task={"question": "how many users?"},
        resources_version=1,
        status="failed",
        final_reward=None,
        error="ValueError: gave up",
        transitions=[
            Transition(span_id="s1", agent="writer", step=0, request_messages=first, response_message=reply1),
            Transition(
                span_id="s2",
                agent="writer",
                step=1,
                request_messages=second,
                response_message={"role": "assistant", "content": "I cannot"},
            ),
        ],
    )
    text = render_rollout(traj, 0.0, 3000)
    assert text.count("SYS") == 1, "the second call shows only what is new"
    assert "run_sql" in text and "[tool:c1] error: no such table" in text and "I cannot" in text
    assert "Error: ValueError: gave up" in text and text.endswith("Reward: 0")
    assert len(render_rollout(traj.model_copy(update={"error": "x" * 5000}), 0.0, 500)) < 600


# -- the loop --------------------------------------------------------------------------------------------------------

KEYWORDS = {"math": "carefully", "format": "JSON"}
START = "Answer. Q: {question}"
COMBINED = "Think carefully. Reply in JSON. Answer. Q: {question}"
DROPS_PLACEHOLDER = "Answer the question."
EDITS = {
    START: [
        "Think carefully. Answer. Q: {question}",
        "Work carefully. Answer. Q: {question}",
        "Reply in JSON. Answer. Q: {question}",
        DROPS_PLACEHOLDER,
    ],
    "Think carefully. Answer. Q: {question}": ["Think very carefully. Answer. Q: {question}"],
    "Work carefully. Answer. Q: {question}": ["Work very carefully. Answer. Q: {question}"],
    "Reply in JSON. Answer. Q: {question}": [COMBINED],
}


def keyword_agent(task: dict[str, Any], resources: dict[str, Any]) -> float:
    """Fills its prompt template with the question, asks the model, and scores an exact answer."""
    llm, prompt = resources["main_llm"], resources["system_prompt"]
    client = openai.OpenAI(base_url=llm.base_url, api_key=llm.api_key, max_retries=0)
    reply = client.chat.completions.create(
        model=llm.model, messages=[{"role": "user", "content": prompt.format(question=task["question"])}]
    )
    return 1.0 if reply.choices[0].message.content == task["answer"] else 0.0


def agent_model(body: dict[str, Any]) -> str:
    """Answers right only when the prompt holds the keyword the question's kind needs."""
    text = body["messages"][-1]["content"]
    question = text.rsplit("Q:", 1)[-1].strip()
    return f"A:{question}" if KEYWORDS[question.split("-")[0]] in text else "no idea"


def optimizer_model(body: dict[str, Any]) -> str:
    """Critique: one line naming the prompt. Edit: the versions listed in ``EDITS`` for the current prompt."""
    text = body["messages"][-1]["content"]
    current = re.search(r'<prompt name="system_prompt">\n(.*?)\n</prompt>', text, re.S)
    assert current is not None, text
    if "Critique of the current prompt" not in text:
        return f"The prompt {current.group(1)!r} lacks an instruction the failed tasks need."
    versions = EDITS.get(current.group(1), [])
    return "Here are the versions:\n" + "\n".join(f'<prompt name="system_prompt">\n{v}\n</prompt>' for v in versions)


def _task(kind: str, i: int) -> dict[str, Any]:
    return {"id": f"{kind}{i}", "question": f"{kind}-{i}", "answer": f"A:{kind}-{i}"}


TRAIN = [_task("math", 1), _task("math", 2), _task("math", 3), _task("format", 1)]
VAL = [_task("math", 4), _task("format", 2)]


def _resources(model: FakeLLM, optimizer: FakeLLM, **extra: agl.PromptTemplate) -> dict[str, Any]:
    """The agent's model, the optimizer and the ``system_prompt`` starting at ``START``, plus ``extra`` prompts."""
    return {
        "main_llm": agl.LLM(base_url=model.base_url, model="fake"),
        "optimizer_llm": agl.LLM(base_url=optimizer.base_url, model="optimizer"),
        "system_prompt": agl.PromptTemplate(template=START, agent="solver"),
        **extra,
    }


def _run(root: Path, selection: str) -> dict[str, Any]:
    with FakeLLM(agent_model) as model, FakeLLM(optimizer_model) as optimizer:
        resources = _resources(model, optimizer)
        cfg = APOConfig(
            prompts=["system_prompt"],
            beam_width=2,
            branch_factor=4,
            minibatch_size=4,
            rollout_budget=32,
            selection=selection,  # type: ignore[arg-type]
        )
        trainer = agl.Trainer(
            algorithm=APO(cfg), n_runners=2, store=f"sqlite:///{root / 'agl.db'}", resources=resources, progress=False
        )
        result = trainer.fit(keyword_agent, TRAIN, VAL)
        requests = [r["messages"][-1]["content"] for r in optimizer.requests]
    history = json.loads((root / "apo_history.json").read_text())
    store = agl.open_store(f"sqlite:///{root / 'agl.db'}")
    try:
        records = store.list_records("apo_candidate")
    finally:
        store.close()
    return {
        "result": result,
        "history": {c["id"]: c for c in history["candidates"]},
        "summary": history["summary"],
        "records": records,
        "optimizer_requests": requests,
        "report": (root / "apo_report.md").read_text(),
    }


@pytest.fixture(scope="module")
def pareto_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return _run(tmp_path_factory.mktemp("apo-pareto"), "pareto")


@pytest.fixture(scope="module")
def mean_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return _run(tmp_path_factory.mktemp("apo-mean"), "mean")


@pytest.mark.slow
def test_apo_finds_and_publishes_the_prompt_that_solves_every_task(pareto_run: dict[str, Any]) -> None:
    result = pareto_run["result"]
    published = result.resources.resources["system_prompt"]
    assert published.template == COMBINED and published.agent == "solver"
    assert result.metrics["val/mean_reward"] == 1.0 and result.metrics["val/start_mean_reward"] == 0.0
    assert result.metrics["published_version"] == result.resources.version
    assert result.metrics["rollouts"] == 32 and result.metrics["stop_reason"] == "rollout budget"
    assert set(result.resources.resources) == {"main_llm", "optimizer_llm", "system_prompt"}


@pytest.mark.slow
def test_pareto_keeps_the_specialist_in_the_loop_and_beam_only_drops_it(
    pareto_run: dict[str, Any], mean_run: dict[str, Any]
) -> None:
    specialist = "Reply in JSON. Answer. Q: {question}"
    pareto = {c["prompts"]["system_prompt"]: c for c in pareto_run["history"].values()}
    mean = {c["prompts"]["system_prompt"]: c for c in mean_run["history"].values()}
    assert pareto[specialist]["mean"] == 0.25 < pareto["Work carefully. Answer. Q: {question}"]["mean"] == 0.75
    assert pareto[specialist]["survived"] == [1], "best on the format task: kept despite its low mean"
    assert mean[specialist]["survived"] == [], "top-k by mean keeps the two math prompts instead"
    assert COMBINED not in mean, "so beam-only search never reaches the combined prompt"
    assert pareto[COMBINED]["parent"] == pareto[specialist]["id"]
    assert mean_run["result"].metrics["val/mean_reward"] == 0.5


@pytest.mark.slow
def test_candidate_dropping_a_placeholder_is_rejected_and_never_run(pareto_run: dict[str, Any]) -> None:
    [bad] = [c for c in pareto_run["history"].values() if c["prompts"]["system_prompt"] == DROPS_PLACEHOLDER]
    assert bad["status"] == "rejected" and bad["reason"] == "system_prompt: drops placeholder(s) {question}"
    assert bad["resources_version"] is None and bad["rewards"] == {}
    assert "Rejected: system_prompt: drops placeholder(s) {question}" in pareto_run["report"]


@pytest.mark.slow
def test_history_is_kept_in_the_store_json_and_report(pareto_run: dict[str, Any]) -> None:
    history, records = pareto_run["history"], pareto_run["records"]
    assert set(history) == {r.key for r in records}
    latest = {r.key: r.data for r in records}
    assert latest == {cid: {k: v for k, v in c.items()} for cid, c in history.items()}
    start = history["c0"]
    assert start["parent"] is None and start["prompts"] == {"system_prompt": START}
    child = history["c1"]
    assert child["parent"] == "c0" and "lacks an instruction" in child["critique"]
    assert child["scores"] == {"math1": 1.0, "math2": 1.0, "math3": 1.0, "format1": 0.0}
    assert pareto_run["summary"]["chosen"] == next(
        c["id"] for c in history.values() if c["prompts"]["system_prompt"] == COMBINED
    )
    report = pareto_run["report"]
    assert report.startswith("# APO report") and "| c3 | c0 | 1 | evaluated |" in report and COMBINED in report


@pytest.mark.slow
def test_optimizer_sees_failures_with_task_messages_and_reward(pareto_run: dict[str, Any]) -> None:
    critique = pareto_run["optimizer_requests"][0]
    assert "4 of 4 rollouts failed" in critique
    assert '"question": "math-1"' in critique and "[user] Answer. Q: math-1" in critique
    assert "→ response [assistant] no idea" in critique and "Reward: 0" in critique
    edit = pareto_run["optimizer_requests"][1]
    assert (
        "lacks an instruction" in edit
        and "{question}" in edit
        and '<prompt name="system_prompt"> and </prompt>' in edit
    )


def two_prompt_agent(task: dict[str, Any], resources: dict[str, Any]) -> float:
    """Sends its style prompt followed by its filled question prompt."""
    llm = resources["main_llm"]
    text = f"{resources['style'].template} {resources['system_prompt'].format(question=task['question'])}"
    client = openai.OpenAI(base_url=llm.base_url, api_key=llm.api_key, max_retries=0)
    reply = client.chat.completions.create(model=llm.model, messages=[{"role": "user", "content": text}])
    return 1.0 if reply.choices[0].message.content == task["answer"] else 0.0


def in_turn_optimizer(body: dict[str, Any]) -> str:
    """Edits only the prompt the request targets: the question prompt gains "carefully", the style prompt "JSON"."""
    text = body["messages"][-1]["content"]
    if "Critique of the current prompt" not in text:
        return "Missing instructions."
    target = re.search(r'each between <prompt name="(\w+)">', text)
    assert target is not None, text
    new = "Think carefully. Answer. Q: {question}" if target.group(1) == "system_prompt" else "Reply in JSON."
    return f'<prompt name="{target.group(1)}">{new}</prompt>'


@pytest.mark.slow
def test_in_turn_mode_optimizes_one_prompt_per_iteration(tmp_path: Path) -> None:
    with FakeLLM(agent_model) as model, FakeLLM(in_turn_optimizer) as optimizer:
        resources = _resources(model, optimizer, style=agl.PromptTemplate(template="Be nice.", agent="solver"))
        cfg = APOConfig(
            prompts=["system_prompt", "style"], beam_width=1, branch_factor=1, rollout_budget=16, validation="off"
        )
        store = f"sqlite:///{tmp_path / 'agl.db'}"
        trainer = agl.Trainer(algorithm=APO(cfg), n_runners=2, store=store, resources=resources, progress=False)
        result = trainer.fit(two_prompt_agent, TRAIN)
    published = result.resources.resources
    assert published["system_prompt"].template == "Think carefully. Answer. Q: {question}"  # type: ignore[union-attr]
    assert published["style"].template == "Reply in JSON."  # type: ignore[union-attr]
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["targets"] for r in rows if "targets" in r] == ["system_prompt", "style"]
    assert result.metrics["train/mean_reward"] == 1.0


def prose_optimizer(body: dict[str, Any]) -> str:
    """Ignores the markup it is asked for: answers every request with a bare prompt."""
    return "Think carefully. Answer. Q: {question}"


@pytest.mark.slow
@pytest.mark.parametrize("untagged", [False, True])
def test_optimizer_reply_without_markup_is_counted_and_shown_or_taken_whole(tmp_path: Path, untagged: bool) -> None:
    with FakeLLM(agent_model) as model, FakeLLM(prose_optimizer) as optimizer:
        resources = _resources(model, optimizer)
        cfg = APOConfig(
            prompts=["system_prompt"], beam_width=1, branch_factor=1, rollout_budget=8, untagged_edits=untagged
        )
        store = f"sqlite:///{tmp_path / 'agl.db'}"
        trainer = agl.Trainer(algorithm=APO(cfg), n_runners=1, store=store, resources=resources, progress=False)
        result = trainer.fit(keyword_agent, TRAIN)
    report = (tmp_path / "apo_report.md").read_text()
    published = result.resources.resources["system_prompt"].template  # type: ignore[union-attr]
    if untagged:
        assert result.metrics["unparsed_replies"] == 0
        assert published == "Think carefully. Answer. Q: {question}"
        assert result.metrics["train/mean_reward"] == 0.75, "the bare reply ran as a candidate: math solved"
    else:
        assert result.metrics["unparsed_replies"] >= 1 and result.metrics["candidates"] == 1
        assert published == START
        assert "no usable version: " in report and "> Think carefully. Answer. Q: {question}" in report
