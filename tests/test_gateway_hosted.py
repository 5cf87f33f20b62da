"""The gateway with hosted models: token capture per ``LLM.token_ids`` against a backend that, like the hosted OpenAI
API, refuses request arguments it does not know — and APO of an agent on such a backend, end to end."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

import agl
from agl.core.server import AglServer
from agl.core.store.sqlite import SqliteStore
from agl.core.types import (
    ATTR_LOGPROBS,
    ATTR_PROMPT_IDS,
    ATTR_RESPONSE_IDS,
    ATTR_TOKEN_IDS,
    LLM,
    RolloutRequest,
    Span,
)
from agl.testing import FakeLLM
from agl.trainers.apo import APO, APOConfig
from tests.test_apo import START, TRAIN, agent_model, keyword_agent, optimizer_model

USER: Any = [{"role": "user", "content": "what is two plus two"}]

#: The chat completion arguments the hosted OpenAI API knows; any other is refused with a 400.
OPENAI_ARGUMENTS = frozenset(
    {
        "messages", "model", "audio", "frequency_penalty", "function_call", "functions", "logit_bias", "logprobs",
        "max_completion_tokens", "max_tokens", "metadata", "modalities", "n", "parallel_tool_calls", "prediction",
        "presence_penalty", "prompt_cache_key", "reasoning_effort", "response_format", "safety_identifier", "seed",
        "service_tier", "stop", "store", "stream", "stream_options", "temperature", "tool_choice", "tools",
        "top_logprobs", "top_p", "user", "verbosity", "web_search_options",
    }
)  # fmt: skip


class HostedLLM(FakeLLM):
    """A fake that answers like the hosted OpenAI API: an argument it does not know is a 400 with OpenAI's body."""

    def _answer(
        self, body: dict[str, Any], number: int
    ) -> tuple[int, dict[str, Any] | None, Iterator[dict[str, Any]] | None]:
        unknown = [key for key in body if key not in OPENAI_ARGUMENTS]
        if unknown:
            message = f"Unrecognized request argument supplied: {unknown[0]}"
            return (
                400,
                {"error": {"message": message, "type": "invalid_request_error", "param": None, "code": None}},
                None,
            )
        return super()._answer(body, number)


class LenientLLM(FakeLLM):
    """A fake that takes ``return_token_ids`` without complaint and ignores it (never returns ids)."""

    def _answer(
        self, body: dict[str, Any], number: int
    ) -> tuple[int, dict[str, Any] | None, Iterator[dict[str, Any]] | None]:
        return super()._answer({k: v for k, v in body.items() if k != "return_token_ids"}, number)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[AglServer]:
    with AglServer(SqliteStore(tmp_path / "s.db")) as srv:
        yield srv


def start_rollout(server: AglServer, llm: LLM) -> tuple[str, str]:
    store = server.store
    store.publish_resources({"main_llm": llm})
    store.enqueue([RolloutRequest(task={"q": "2+2"})])
    leased = store.lease("worker-1")
    assert leased is not None
    return leased[0].rollout_id, leased[1].attempt_id


def client_for(server: AglServer, rollout_id: str, attempt_id: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/gw/{rollout_id}/{attempt_id}/main_llm/v1", api_key="x", max_retries=0)


def llm_spans(server: AglServer, rollout_id: str) -> list[Span]:
    server.flush()
    return server.store.query_spans(rollout_id=rollout_id, kind="llm")


def stream_text(client: openai.OpenAI, **extra: Any) -> str:
    chunks = client.chat.completions.create(model="gpt-test", messages=USER, stream=True, **extra)
    return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


def test_auto_learns_a_hosted_backend_refuses_token_fields_and_calls_it_without_them(server: AglServer) -> None:
    with HostedLLM(["four", "five", "six", "seven"]) as hosted:
        rid, aid = start_rollout(server, LLM(base_url=hosted.base_url, model="gpt-test"))
        client = client_for(server, rid, aid)
        assert client.chat.completions.create(model="gpt-test", messages=USER).choices[0].message.content == "four"
        first, retried = hosted.requests
        assert first["return_token_ids"] is True and first["logprobs"] is True, "asked once"
        assert "return_token_ids" not in retried and "logprobs" not in retried, "then again without agl's fields"
        assert retried["messages"] == USER and retried["model"] == "gpt-test"

        assert client.chat.completions.create(model="gpt-test", messages=USER).choices[0].message.content == "five"
        assert stream_text(client) == "six"
        assert len(hosted.requests) == 4, "learned: no more refused requests"
        assert all("return_token_ids" not in r and "logprobs" not in r for r in hosted.requests[1:])

        spans = llm_spans(server, rid)
        assert [s.status for s in spans] == ["ok"] * 3
        assert [s.attributes[ATTR_TOKEN_IDS] for s in spans] == ["unsupported"] * 3, "each span says: no ids"
        assert all(ATTR_RESPONSE_IDS not in s.attributes and ATTR_PROMPT_IDS not in s.attributes for s in spans)

        # the agent's own logprobs still reach the hosted backend, and come back to it
        reply = client.chat.completions.create(model="gpt-test", messages=USER, logprobs=True, top_logprobs=2)
        assert hosted.requests[-1]["logprobs"] is True and hosted.requests[-1]["top_logprobs"] == 2
        assert reply.choices[0].logprobs is not None and reply.choices[0].message.content == "seven"
        assert llm_spans(server, rid)[-1].attributes[ATTR_LOGPROBS] == hosted.replies[-1].logprobs


def test_auto_retry_without_token_fields_works_for_a_stream(server: AglServer) -> None:
    with HostedLLM(["streamed"]) as hosted:
        rid, aid = start_rollout(server, LLM(base_url=hosted.base_url, model="gpt-test"))
        assert stream_text(client_for(server, rid, aid), stream_options={"include_usage": True}) == "streamed"
        assert [("return_token_ids" in r, r["stream"]) for r in hosted.requests] == [(True, True), (False, True)]
        [span] = llm_spans(server, rid)
        assert span.status == "ok" and span.attributes[ATTR_TOKEN_IDS] == "unsupported"
        assert span.attributes["gen_ai.output.messages"][0]["content"] == "streamed"


def test_auto_still_captures_ids_from_a_backend_that_gives_them(server: AglServer) -> None:
    with FakeLLM(["four"]) as vllm:
        rid, aid = start_rollout(server, LLM(base_url=vllm.base_url, model="m"))
        client_for(server, rid, aid).chat.completions.create(model="m", messages=USER)
        [span] = llm_spans(server, rid)
        assert span.attributes[ATTR_RESPONSE_IDS] == vllm.replies[0].token_ids and ATTR_TOKEN_IDS not in span.attributes


def test_require_fails_loudly_naming_the_setting_and_the_backend(server: AglServer) -> None:
    with HostedLLM(["never"]) as hosted:
        rid, aid = start_rollout(server, LLM(base_url=hosted.base_url, model="gpt-test", token_ids="require"))
        client = client_for(server, rid, aid)
        for stream in (False, True):
            with pytest.raises(openai.BadRequestError) as refused:
                client.chat.completions.create(model="gpt-test", messages=USER, stream=stream)
            message = refused.value.response.json()["error"]
            assert "LLM.token_ids='require'" in message and hosted.base_url in message, message
            assert "Unrecognized request argument supplied: return_token_ids" in message
        assert len(hosted.requests) == 2 and all(r["return_token_ids"] is True for r in hosted.requests), "no retry"
        spans = llm_spans(server, rid)
        assert [(s.status, s.attributes["http.status_code"]) for s in spans] == [("error", 400)] * 2


def test_require_fails_a_backend_that_ignores_the_fields_and_auto_marks_the_ids_missing(server: AglServer) -> None:
    with LenientLLM(["a", "b", "c"]) as lenient:
        rid, aid = start_rollout(server, LLM(base_url=lenient.base_url, model="m", token_ids="require"))
        client = client_for(server, rid, aid)
        with pytest.raises(openai.BadRequestError, match=r"LLM.token_ids='require'.*answered without token ids"):
            client.chat.completions.create(model="m", messages=USER)
        with pytest.raises(openai.APIError, match=r"LLM.token_ids='require'.*answered without token ids"):
            stream_text(client)
        spans = llm_spans(server, rid)
        assert [(s.status, s.attributes["http.status_code"]) for s in spans] == [("error", 400)] * 2

        rid, aid = start_rollout(server, LLM(base_url=lenient.base_url, model="m"))
        client_for(server, rid, aid).chat.completions.create(model="m", messages=USER)
        [span] = llm_spans(server, rid)
        assert span.status == "ok" and span.attributes[ATTR_TOKEN_IDS] == "missing"


def test_off_never_sends_the_token_fields(server: AglServer) -> None:
    with FakeLLM(["one", "two"]) as vllm:
        rid, aid = start_rollout(server, LLM(base_url=vllm.base_url, model="m", token_ids="off"))
        client = client_for(server, rid, aid)
        client.chat.completions.create(model="m", messages=USER)
        assert stream_text(client) == "two"
        assert all("return_token_ids" not in r and "logprobs" not in r for r in vllm.requests)
        spans = llm_spans(server, rid)
        assert [s.attributes[ATTR_TOKEN_IDS] for s in spans] == ["off", "off"]
        assert all(ATTR_RESPONSE_IDS not in s.attributes for s in spans)


@pytest.mark.parametrize("mode", ["auto", "require"])
def test_the_agents_own_logprobs_false_reaches_the_backend(server: AglServer, mode: str) -> None:
    with FakeLLM(["one", "two"]) as vllm:
        llm = LLM(base_url=vllm.base_url, model="m", token_ids=mode)  # type: ignore[arg-type]
        rid, aid = start_rollout(server, llm)
        client = client_for(server, rid, aid)
        reply = client.chat.completions.create(model="m", messages=USER, logprobs=False)
        assert reply.choices[0].logprobs is None
        assert stream_text(client, logprobs=False) == "two"
        assert [r["logprobs"] for r in vllm.requests] == [False, False]
        assert [r["return_token_ids"] for r in vllm.requests] == [True, True]
        spans = llm_spans(server, rid)
        assert all(s.attributes[ATTR_RESPONSE_IDS] and ATTR_LOGPROBS not in s.attributes for s in spans)


def test_the_agents_body_is_forwarded_unchanged_but_for_the_token_fields(server: AglServer) -> None:
    with FakeLLM(["ok"]) as vllm:
        rid, aid = start_rollout(server, LLM(base_url=vllm.base_url, model="m"))
        body = {"model": "m", "messages": USER, "seed": 7, "n": 1, "x_vendor": {"a": [1, 2]}, "top_logprobs": 3}
        r = httpx.post(f"{server.url}/gw/{rid}/{aid}/main_llm/v1/chat/completions", json=body)
        assert r.status_code == 200, r.text
        sent = dict(vllm.requests[0])
        assert sent == {**body, "return_token_ids": True, "logprobs": True}


def test_the_learned_refusal_is_per_backend_and_model(server: AglServer) -> None:
    with HostedLLM(["a", "b", "c"], cycle=True) as hosted:
        rid, aid = start_rollout(server, LLM(base_url=hosted.base_url, model="gpt-test"))
        client = client_for(server, rid, aid)
        client.chat.completions.create(model="gpt-test", messages=USER)
        client.chat.completions.create(model="other-model", messages=USER)
        client.chat.completions.create(model="gpt-test", messages=USER)
        asked = [("return_token_ids" in r, r["model"]) for r in hosted.requests]
        learned_per_model = [(True, "gpt-test"), (False, "gpt-test"), (True, "other-model"), (False, "other-model")]
        assert asked == [*learned_per_model, (False, "gpt-test")]


# -- APO of an agent whose model is hosted -------------------------------------------------------------------------


@pytest.mark.slow
def test_apo_of_an_agent_on_a_hosted_model_completes_through_the_gateway(tmp_path: Path) -> None:
    with HostedLLM(agent_model) as hosted, FakeLLM(optimizer_model) as optimizer:
        resources = {
            "main_llm": agl.LLM(base_url=hosted.base_url, model="gpt-test"),
            "optimizer_llm": agl.LLM(base_url=optimizer.base_url, model="optimizer"),
            "system_prompt": agl.PromptTemplate(template=START, agent="solver"),
        }
        cfg = APOConfig(prompts=["system_prompt"], beam_width=1, branch_factor=2, rollout_budget=12, validation="off")
        db = tmp_path / "agl.db"
        trainer = agl.Trainer(
            algorithm=APO(cfg), n_runners=2, store=f"sqlite:///{db}", resources=resources, progress=False
        )
        result = trainer.fit(keyword_agent, TRAIN)
        refused = [r for r in hosted.requests if "return_token_ids" in r]
        answered = len(hosted.requests) - len(refused)
    published = result.resources.resources["system_prompt"].template  # type: ignore[union-attr]
    assert published != START and "carefully" in published, published
    assert result.metrics["train/mean_reward"] > 0
    assert 1 <= len(refused) <= 2, "learned after the first refusal (each of two runners may race to it)"
    store = agl.open_store(f"sqlite:///{db}")
    try:
        spans = store.query_spans(kind="llm")
    finally:
        store.close()
    assert len(spans) == answered >= 12, "every answered agent call went through the gateway and was recorded"
    assert all(s.status == "ok" and s.attributes[ATTR_TOKEN_IDS] == "unsupported" for s in spans)
    report = (tmp_path / "apo_report.md").read_text()
    assert report.startswith("# APO report"), json.dumps(result.metrics)
