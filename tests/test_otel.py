"""OpenTelemetry out and in, against a real Phoenix server (its own venv, .venv-otel: scripts/otel_receiver.sh).

Export: a real Trainer run (LangGraph agent, FakeLLM) exported over OTLP/HTTP, read back from Phoenix's REST API;
live export by ``Trainer(otlp_endpoint=...)`` and by an ``agl server --otlp`` process, each into its own Phoenix
project (chosen with OpenTelemetry's standard ``OTEL_RESOURCE_ATTRIBUTES``).
Import: the same agent run WITHOUT agl, traced by OpenInference's LangChain instrumentor into Phoenix (rewards as
Phoenix annotations) and into an OTLP JSON file; both imported into stores; APO learns a new prompt from them
without running the agent; RL refuses them (no token ids) but accepts an agl-exported trace that carries them.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

import agl
from agl.otel import NotTrainable, export_spans, import_traces, read_otlp_json, read_phoenix, stored_trajectories
from agl.otel.export import rollout_traces
from agl.testing import FakeLLM
from agl.trainers.apo import APO, APOConfig
from tests import agents_otel as A
from tests.server_process import kill, server_log, start_server
from tests.traced_elsewhere import run_elsewhere

ROOT = Path(__file__).resolve().parent.parent
PHOENIX = ROOT / ".venv-otel" / "bin" / "phoenix"
TASKS = [{"id": f"t{i}", "a": i, "b": 2 * i} for i in range(1, 4)]

pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def phoenix(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A Phoenix server on 127.0.0.1 (fresh SQLite database); fails with its log if it is not up within 120 s."""
    if not PHOENIX.exists():
        pytest.fail("Phoenix is not installed: run `bash scripts/otel_receiver.sh` (scripts/test.sh does)")
    work = tmp_path_factory.mktemp("phoenix")
    port = _free_port()
    env = {
        **os.environ,
        "PHOENIX_WORKING_DIR": str(work),
        "PHOENIX_HOST": "127.0.0.1",
        "PHOENIX_PORT": str(port),
        "PHOENIX_GRPC_PORT": str(_free_port()),
        "PHOENIX_TELEMETRY_ENABLED": "false",
    }
    log = open(work / "phoenix.log", "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen([str(PHOENIX), "serve"], env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    try:
        while True:
            try:
                if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                tail = (work / "phoenix.log").read_text(errors="replace")[-3000:]
                pytest.fail(f"Phoenix did not start (exit {proc.poll()}); its log ends:\n{tail}")
            time.sleep(0.25)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
        log.close()


def _phoenix_spans(url: str, project: str, expected: int) -> list[dict[str, Any]]:
    """The project's spans from Phoenix's REST API, once ``expected`` of them arrived (it ingests asynchronously)."""
    deadline = time.monotonic() + 30
    while True:
        spans: list[dict[str, Any]] = []
        cursor = None
        while True:
            params: dict[str, Any] = {"limit": 1000, **({"cursor": cursor} if cursor else {})}
            reply = httpx.get(f"{url}/v1/projects/{project}/spans", params=params, timeout=10)
            if reply.status_code == 404:
                break
            reply.raise_for_status()
            spans += reply.json()["data"]
            cursor = reply.json().get("next_cursor")
            if not cursor:
                break
        if len(spans) >= expected or time.monotonic() > deadline:
            return spans
        time.sleep(0.25)


def _wait_for_annotations(url: str, project: str, span_ids: list[str]) -> None:
    """Wait (at most 30 s) until Phoenix serves an annotation for each of ``span_ids``: it acknowledges a POST before
    the annotations can be read back, so an import right after it could find none of them."""
    deadline = time.monotonic() + 30
    while True:
        params: dict[str, Any] = {"span_ids": span_ids, "limit": 1000}
        reply = httpx.get(f"{url}/v1/projects/{project}/span_annotations", params=params, timeout=10)
        found = {a["span_id"] for a in reply.json().get("data", [])} if reply.status_code == 200 else set()
        if found >= set(span_ids) or time.monotonic() > deadline:
            return
        time.sleep(0.25)


def _resources(llm: FakeLLM) -> dict[str, Any]:
    return {
        "main_llm": agl.LLM(base_url=llm.base_url, model="fake-model", api_key="sk-secret-do-not-export"),
        "system_prompt": agl.PromptTemplate(template=A.PROMPT, agent="solver"),
    }


@pytest.fixture(scope="module")
def trained_store(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A store filled by a real Trainer run of the LangGraph agent against the fake LLM."""
    root = tmp_path_factory.mktemp("agl")
    url = f"sqlite:///{root / 'agl.db'}"
    with FakeLLM(A.reply) as llm:
        trainer = agl.Trainer(
            algorithm=agl.Baseline(), n_runners=1, store=url, resources=_resources(llm), progress=False
        )
        result = trainer.evaluate(A.agent, TASKS)
    assert result.summary["succeeded"] == len(TASKS)
    return url


def test_export_of_a_trainer_run_reads_back_from_phoenix_with_names_agents_tokens_and_parents(
    phoenix: str, trained_store: str, tmp_path: Path
) -> None:
    store = agl.open_store(trained_store)
    report = export_spans(store, phoenix)
    assert report.rollouts == len(TASKS) and report.traces == len(TASKS)
    spans = _phoenix_spans(phoenix, "default", report.spans)
    assert len(spans) == report.spans
    by_trace: dict[str, list[dict[str, Any]]] = {}
    for s in spans:
        by_trace.setdefault(s["context"]["trace_id"], []).append(s)
    assert len(by_trace) == len(TASKS), "one trace per rollout attempt"
    for trace in by_trace.values():
        ids = {s["context"]["span_id"]: s for s in trace}
        [root] = [s for s in trace if not s["parent_id"]]
        assert root["name"].startswith("rollout t") and root["attributes"]["agl.final_reward"] == 0.0
        assert root["attributes"]["agl.task_id"] in {t["id"] for t in TASKS}
        assert all(s["parent_id"] in ids for s in trace if s is not root), "every parent is in the trace"
        chats = [s for s in trace if s["span_kind"] == "LLM"]
        assert [s["name"] for s in chats] == ["chat fake-model"] * 2
        for chat in chats:
            a = chat["attributes"]
            assert a["gen_ai.operation.name"] == "chat" and a["gen_ai.agent.name"] == "solver"
            assert a["llm.token_count.prompt"] == a["gen_ai.usage.input_tokens"] > 0
            assert a["llm.token_count.completion"] == a["gen_ai.usage.output_tokens"] > 0
            assert a["llm.input_messages.0.message.role"] == "system"
            parts = json.loads(a["gen_ai.input.messages"])
            assert parts[0] == {
                "role": "system",
                "parts": [
                    {"type": "text", "content": A.PROMPT.format(question=a["llm.input_messages.1.message.content"])}
                ],
            }
            chain = chat
            while chain["parent_id"]:
                chain = ids[chain["parent_id"]]
                if chain["span_kind"] == "AGENT":
                    break
            assert chain["name"] == "invoke_agent solver", "a model call hangs under its agent's span"
        [tool] = [s for s in trace if s["span_kind"] == "TOOL"]
        assert tool["name"] == "execute_tool add" and tool["attributes"]["gen_ai.operation.name"] == "execute_tool"
    assert "sk-secret-do-not-export" not in json.dumps(spans), "no API key leaves agl"
    # exporting again sends the spans Phoenix holds, under the same ids (which Phoenix keys them by), not copies;
    # the same spans go to a file too, which says which ids were sent without waiting for Phoenix to ingest them
    again = export_spans(store, phoenix, file=tmp_path / "again.json")
    sent = json.loads((tmp_path / "again.json").read_text())["resourceSpans"]
    sent_ids = {(s["traceId"], s["spanId"]) for r in sent for scope in r["scopeSpans"] for s in scope["spans"]}
    held_ids = {(s["context"]["trace_id"], s["context"]["span_id"]) for s in spans}
    assert again.spans == report.spans and sent_ids == held_ids, "ids are stable: no copies"


def _assert_live_traces(url: str, project: str, store_url: str, rollouts: int) -> None:
    """Phoenix's ``project`` holds one agl trace per rollout of ``store_url`` (waiting for them, bounded), each with a
    root span, the two chat calls and the tool call of the agent."""
    store = agl.open_store(store_url)
    try:
        expected = sum(len(rollout_traces(store, r)) for r in store.list_rollouts(limit=100))
        wanted = {r.rollout_id for r in store.list_rollouts(limit=100)}
    finally:
        store.close()
    assert len(wanted) == rollouts
    spans = _phoenix_spans(url, project, expected)
    assert len(spans) == expected, f"{len(spans)} of {expected} spans reached Phoenix's project {project!r}"
    roots = [s for s in spans if not s["parent_id"]]
    assert {s["attributes"]["agl.rollout_id"] for s in roots} == wanted, "one trace per rollout, all of them"
    for root in roots:
        trace = [s for s in spans if s["context"]["trace_id"] == root["context"]["trace_id"]]
        assert sorted(s["name"] for s in trace if s["span_kind"] in ("LLM", "TOOL")) == [
            "chat fake-model",
            "chat fake-model",
            "execute_tool add",
        ]


def test_trainer_with_otlp_endpoint_exports_finished_rollouts_to_phoenix_while_it_runs(
    phoenix: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "openinference.project.name=live-trainer")
    url = f"sqlite:///{tmp_path / 'agl.db'}"
    with FakeLLM(A.reply) as llm:
        trainer = agl.Trainer(n_runners=1, store=url, resources=_resources(llm), progress=False, otlp_endpoint=phoenix)
        try:
            assert trainer.evaluate(A.agent, TASKS).summary["succeeded"] == len(TASKS)
            _assert_live_traces(phoenix, "live-trainer", url, len(TASKS))  # before close: sent while running
        finally:
            trainer.close()


def test_agl_server_with_otlp_exports_the_rollouts_it_serves_to_phoenix(
    phoenix: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "openinference.project.name=live-server")
    db, port = tmp_path / "agl.db", _free_port()
    proc = start_server(db, port, "--otlp", phoenix)
    try:
        with FakeLLM(A.reply) as llm:
            server = f"http://127.0.0.1:{port}"
            with agl.Trainer(n_runners=1, store=server, resources=_resources(llm), progress=False) as trainer:
                assert trainer.evaluate(A.agent, TASKS[:2]).summary["succeeded"] == 2
        _assert_live_traces(phoenix, "live-server", f"sqlite:///{db}", 2)  # the server still runs
    finally:
        kill(proc)
    assert "OTLP export failed" not in server_log(db).read_text(errors="replace")


def test_import_openinference_traces_from_phoenix_and_otlp_file_then_apo_learns_a_prompt_offline(
    phoenix: str, tmp_path: Path
) -> None:
    traces = tmp_path / "traces.json"
    ran = run_elsewhere(tmp_path, "openinference", phoenix, "prod-agent", json.dumps(TASKS), str(traces))
    rewards, roots = ran["rewards"], ran["roots"]
    assert rewards == [0.0] * len(TASKS), "the starting prompt fails every task"
    assert len(roots) == len(TASKS)
    seen = _phoenix_spans(phoenix, "prod-agent", ran["spans"])
    assert len(seen) == ran["spans"]
    notes = [
        {"span_id": root, "name": "reward", "annotator_kind": "HUMAN", "result": {"score": v}}
        for root, v in zip(roots, rewards, strict=True)
    ]
    httpx.post(f"{phoenix}/v1/span_annotations", json={"data": notes}, timeout=10).raise_for_status()
    _wait_for_annotations(phoenix, "prod-agent", roots)

    store = agl.open_store(f"sqlite:///{tmp_path / 'phoenix.db'}")
    report = import_traces(store, read_phoenix(phoenix, "prod-agent"), source="phoenix", reward="reward")
    assert report.rollouts == len(TASKS) and report.spans >= ran["spans"]
    assert import_traces(store, read_phoenix(phoenix, "prod-agent"), source="phoenix").skipped == len(TASKS)
    from_phoenix = stored_trajectories(store, source="phoenix", agents=["solver"])
    file_store = agl.open_store(f"sqlite:///{tmp_path / 'file.db'}")
    import_traces(file_store, read_otlp_json(traces), source="file")
    from_file = stored_trajectories(file_store, agents=["solver"])

    for trajectories in (from_phoenix, from_file):
        assert len(trajectories) == len(TASKS)
        for traj in trajectories:
            assert traj.status == "succeeded"
            assert [t.agent for t in traj.transitions] == ["solver", "solver"], "agent from LangGraph's node"
            first, second = traj.transitions
            assert first.request_messages[0]["content"].startswith("Add the two numbers.")
            assert first.response_message["tool_calls"][0]["function"]["name"] == "add"
            assert second.request_messages[-1]["role"] == "tool"
            assert second.response_message["content"].startswith("The answer is")
    assert [t.final_reward for t in from_phoenix] == rewards, "rewards from Phoenix annotations"

    with FakeLLM(A.optimizer_reply) as optimizer:
        resources = {
            "system_prompt": agl.PromptTemplate(template=A.PROMPT, agent="solver"),
            "optimizer_llm": agl.LLM(base_url=optimizer.base_url, model="optimizer"),
        }
        cfg = APOConfig(prompts=["system_prompt"], optimizer_llm="optimizer_llm", branch_factor=1)
        proposal = APO(cfg).fit_offline(resources, from_phoenix)
        critique_request = optimizer.requests[0]["messages"][-1]["content"]
    assert proposal.prompts == {"system_prompt": A.BETTER}
    assert proposal.failures == len(TASKS)
    assert "Add the two numbers." in critique_request and "tool calls: add(" in critique_request
    for task in TASKS:
        assert f"What is {task['a']} + {task['b']}?" in critique_request, "every imported failure is critiqued"


def test_rl_refuses_imported_rollouts_without_token_ids_and_accepts_agl_exported_ones(
    trained_store: str, tmp_path: Path
) -> None:
    from agl.trainers.rl import LightningRL, LightningRLConfig

    rl = LightningRL(LightningRLConfig(model_dir=tmp_path))
    text_only = agl.open_store(f"sqlite:///{tmp_path / 'text.db'}")
    llm_span = {
        "traceId": "0af7651916cd43dd8448eb211c80319c",
        "spanId": "b7ad6b7169203331",
        "name": "ChatOpenAI",
        "startTimeUnixNano": "1700000000000000000",
        "endTimeUnixNano": "1700000001000000000",
        "attributes": [
            {"key": "openinference.span.kind", "value": {"stringValue": "LLM"}},
            {"key": "llm.input_messages.0.message.role", "value": {"stringValue": "user"}},
            {"key": "llm.input_messages.0.message.content", "value": {"stringValue": "What is 1 + 2?"}},
            {"key": "llm.output_messages.0.message.role", "value": {"stringValue": "assistant"}},
            {"key": "llm.output_messages.0.message.content", "value": {"stringValue": "3"}},
        ],
    }
    path = tmp_path / "one.json"
    path.write_text(json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": [llm_span]}]}]}))
    import_traces(text_only, read_otlp_json(path), source="file")
    assert len(stored_trajectories(text_only)[0].transitions) == 1
    with pytest.raises(NotTrainable, match=r"LightningRL cannot train on 1 of 1 stored rollouts .* no exact token ids"):
        stored_trajectories(text_only, algorithm=rl)

    exported = tmp_path / "agl.json"
    export_spans(agl.open_store(trained_store), file=exported)
    round_trip = agl.open_store(f"sqlite:///{tmp_path / 'round.db'}")
    import_traces(round_trip, read_otlp_json(exported), source="agl")
    trajectories = stored_trajectories(round_trip, algorithm=rl)
    assert len(trajectories) == len(TASKS)
    assert all(t.has_token_ids for traj in trajectories for t in traj.transitions)
    assert [t.agent for t in trajectories[0].transitions] == ["solver", "solver"]
