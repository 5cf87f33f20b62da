"""FakeLLM against the official openai client: sync/async, streaming or not, tool calls, errors, vLLM-style ids."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from agl.testing import FakeLLM, FakeReply, fake_token_ids

ASK_IDS: dict[str, Any] = {"return_token_ids": True}
USER: Any = [{"role": "user", "content": "what is two plus two"}]


@pytest.fixture
def fake() -> Iterator[FakeLLM]:
    with FakeLLM() as llm:
        yield llm


def client(llm: FakeLLM) -> openai.OpenAI:
    return openai.OpenAI(base_url=llm.base_url, api_key="test", max_retries=0)


def test_echo_without_ids_unless_asked(fake: FakeLLM) -> None:
    r = client(fake).chat.completions.create(model="fake-model", messages=USER)
    assert r.choices[0].message.content == "what is two plus two"
    assert r.choices[0].finish_reason == "stop"
    assert r.choices[0].logprobs is None
    assert (r.model_extra or {}).get("prompt_token_ids") is None
    assert (r.choices[0].model_extra or {}).get("token_ids") is None
    assert fake.replies[0].token_ids is None and fake.replies[0].logprobs is None
    assert r.usage is not None and r.usage.completion_tokens == len(fake_token_ids("what is two plus two"))


def test_ids_and_logprobs_when_asked(fake: FakeLLM) -> None:
    r = client(fake).chat.completions.create(model="fake-model", messages=USER, logprobs=True, extra_body=ASK_IDS)
    served = fake.replies[0]
    ids = (r.choices[0].model_extra or {})["token_ids"]
    assert ids == served.token_ids == fake_token_ids("what is two plus two")
    assert (r.model_extra or {})["prompt_token_ids"] == served.prompt_token_ids
    assert r.choices[0].logprobs is not None and r.choices[0].logprobs.content is not None
    logprobs = [e.logprob for e in r.choices[0].logprobs.content]
    assert logprobs == served.logprobs and len(logprobs) == len(ids) and all(lp <= 0 for lp in logprobs)
    assert "".join(e.token for e in r.choices[0].logprobs.content) == "what is two plus two"


def test_token_ids_are_deterministic_and_text_dependent() -> None:
    assert fake_token_ids("hello world") == fake_token_ids("hello world")
    assert fake_token_ids("hello world") != fake_token_ids("hello there")
    with FakeLLM(["x"], cycle=True) as llm:
        c = client(llm)
        for text in ("first prompt", "second prompt", "first prompt"):
            c.chat.completions.create(model="m", messages=[{"role": "user", "content": text}], extra_body=ASK_IDS)
        a, b, a2 = (r.prompt_token_ids for r in llm.replies)
        assert a == a2 and a != b


def test_stream_ids_split_across_chunks(fake: FakeLLM) -> None:
    chunks = list(
        client(fake).chat.completions.create(
            model="fake-model",
            messages=USER,
            stream=True,
            logprobs=True,
            stream_options={"include_usage": True},
            extra_body=ASK_IDS,
        )
    )
    served = fake.replies[0]
    assert (chunks[0].model_extra or {})["prompt_token_ids"] == served.prompt_token_ids
    with_choice = [c for c in chunks if c.choices]
    assert len(with_choice) > 3, "content must arrive in several chunks"
    text = "".join(c.choices[0].delta.content or "" for c in with_choice)
    ids = [i for c in with_choice for i in (c.choices[0].model_extra or {})["token_ids"]]
    logprobs = [e.logprob for c in with_choice if c.choices[0].logprobs for e in c.choices[0].logprobs.content or []]
    assert text == "what is two plus two"
    assert ids == served.token_ids and logprobs == served.logprobs
    for c in with_choice:
        n_ids = len((c.choices[0].model_extra or {})["token_ids"])
        n_lp = len(c.choices[0].logprobs.content or []) if c.choices[0].logprobs else 0
        assert n_ids == n_lp
    assert with_choice[-1].choices[0].finish_reason == "stop"
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == len(ids)


def test_stream_without_usage_or_ids(fake: FakeLLM) -> None:
    chunks = list(client(fake).chat.completions.create(model="m", messages=USER, stream=True))
    assert all(c.usage is None for c in chunks)
    assert all("token_ids" not in (c.choices[0].model_extra or {}) for c in chunks if c.choices)


def test_tool_calls_non_stream_and_stream() -> None:
    reply = FakeReply(content="Adding.", tool_calls=[{"name": "add", "arguments": {"a": 1, "b": 2}}, {"name": "noop"}])
    with FakeLLM([reply], cycle=True) as llm:
        c = client(llm)
        r = c.chat.completions.create(model="m", messages=USER, extra_body=ASK_IDS)
        msg = r.choices[0].message
        assert r.choices[0].finish_reason == "tool_calls"
        assert msg.content == "Adding." and msg.tool_calls is not None
        assert [(t.function.name, json.loads(t.function.arguments)) for t in msg.tool_calls] == [  # type: ignore[union-attr]
            ("add", {"a": 1, "b": 2}),
            ("noop", {}),
        ]
        assert msg.tool_calls[0].type == "function" and msg.tool_calls[0].id
        assert llm.replies[0].token_ids == fake_token_ids("Adding.") + fake_token_ids(
            '\n<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>\n'
            '<tool_call>{"name": "noop", "arguments": {}}</tool_call>'
        )

        calls: dict[int, dict[str, str]] = {}
        ids: list[int] = []
        finish = None
        for chunk in c.chat.completions.create(model="m", messages=USER, stream=True, extra_body=ASK_IDS):
            choice = chunk.choices[0]
            ids += (choice.model_extra or {})["token_ids"]
            finish = choice.finish_reason or finish
            for d in choice.delta.tool_calls or []:
                call = calls.setdefault(d.index, {"name": "", "arguments": ""})
                if d.function and d.function.name:
                    assert call["name"] == "", "the name arrives once, before the arguments"
                    call["name"] = d.function.name
                call["arguments"] += (d.function.arguments or "") if d.function else ""
        assert finish == "tool_calls"
        assert [(v["name"], json.loads(v["arguments"])) for _, v in sorted(calls.items())] == [
            ("add", {"a": 1, "b": 2}),
            ("noop", {}),
        ]
        assert ids == llm.replies[1].token_ids == llm.replies[0].token_ids


def test_error_replies() -> None:
    script: list[FakeReply | str] = [FakeReply(status=400, error="context too long"), FakeReply(status=503), "fine"]
    with FakeLLM(script) as llm:
        c = client(llm)
        with pytest.raises(openai.BadRequestError, match="context too long") as bad:
            c.chat.completions.create(model="m", messages=USER)
        assert bad.value.status_code == 400
        with pytest.raises(openai.APIStatusError) as unavailable:
            c.chat.completions.create(model="m", messages=USER, stream=True)
        assert unavailable.value.status_code == 503
        assert c.chat.completions.create(model="m", messages=USER).choices[0].message.content == "fine"
        with pytest.raises(openai.InternalServerError, match="exhausted"):
            c.chat.completions.create(model="m", messages=USER)
        assert [r.status for r in llm.replies] == [400, 503, 200, 500]


def test_cycle_and_callable_scripts() -> None:
    with FakeLLM(["a", "b"], cycle=True) as llm:
        c = client(llm)
        got = [c.chat.completions.create(model="m", messages=USER).choices[0].message.content for _ in range(3)]
        assert got == ["a", "b", "a"]

    def answer(body: dict[str, Any]) -> str:
        return f"{len(body['messages'])} messages, temperature {body.get('temperature')}"

    with FakeLLM(answer) as llm:
        r = client(llm).chat.completions.create(model="m", messages=USER * 2, temperature=0.5)
        assert r.choices[0].message.content == "2 messages, temperature 0.5"


def test_records_requests_with_headers(fake: FakeLLM) -> None:
    client(fake).chat.completions.create(model="m", messages=USER, extra_headers={"X-Agl-Agent": "solver"})
    [req] = fake.requests
    assert req["messages"] == USER and req["model"] == "m"
    assert req.headers["x-agl-agent"] == "solver" and req.path == "/v1/chat/completions"


def test_models_and_bad_requests(fake: FakeLLM) -> None:
    assert [m.id for m in client(fake).models.list()] == ["fake-model"]
    bad = httpx.post(
        fake.base_url + "/chat/completions", content=b"{nope", headers={"content-type": "application/json"}
    )
    assert bad.status_code == 400 and "malformed JSON" in bad.json()["error"]["message"]
    assert httpx.get(fake.base_url + "/nothing").status_code == 404


def test_async_client_stream_and_non_stream(fake: FakeLLM) -> None:
    async def main() -> tuple[str | None, str]:
        c = openai.AsyncOpenAI(base_url=fake.base_url, api_key="test", max_retries=0)
        r = await c.chat.completions.create(model="m", messages=USER, extra_body=ASK_IDS)
        text = ""
        async for chunk in await c.chat.completions.create(model="m", messages=USER, stream=True):
            if chunk.choices:
                text += chunk.choices[0].delta.content or ""
        await c.close()
        return r.choices[0].message.content, text

    whole, streamed = asyncio.run(main())
    assert whole == streamed == "what is two plus two"
    assert fake.replies[0].token_ids == fake_token_ids("what is two plus two")
