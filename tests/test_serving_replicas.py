"""Tests of a policy server with several replicas (copies of the model, each with its own worker) behind one endpoint,
and of the remembered prompt prefixes' memory budget.

Real tiny Llama, real HTTP, no mocks. Replies are compared with those of a one-replica server: greedy and seeded
requests must not depend on which replica decoded them.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM

from agl.serving._kv import MIN_REUSED_PREFIX, _PromptPrefixes
from agl.serving.models import make_tiny_model
from agl.serving.policy_server import PolicyServer
from tests.test_serving import chat, greedy, make_adapter, swap_storm
from tests.waiting import wait_for

PROMPTS = [[{"role": "user", "content": f"Request {i}: " + "tell me more " * i}] for i in range(8)]
SYSTEM = {"role": "system", "content": "You answer questions about the schema. " + "Table t has columns a, b. " * 8}


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("tiny") / "model", seed=0)


@pytest.fixture(scope="module")
def single(tiny_dir: Path) -> Iterator[PolicyServer]:
    with PolicyServer(tiny_dir, seed=0, dtype="float32", replicas=1) as running:
        yield running


@pytest.fixture()
def pair(tiny_dir: Path, tmp_path: Path) -> Iterator[PolicyServer]:
    with PolicyServer(tiny_dir, seed=0, dtype="float32", replicas=2, weights_root=tmp_path) as running:
        yield running


def concurrently(server: PolicyServer, send: Any, count: int) -> dict[int, Any]:
    """``send(i)`` for every i at once, queued while batches are held so the router spreads them over replicas."""
    results: dict[int, Any] = {}
    threads = [threading.Thread(target=lambda i=i: results.__setitem__(i, send(i))) for i in range(count)]
    with server.hold_batches():
        for thread in threads:
            thread.start()
        wait_for(lambda: server.waiting_requests == count, 60, f"{count} queued requests", pause=0.005)
    for thread in threads:
        thread.join()
    return results


def per_replica_requests(server: PolicyServer) -> list[int]:
    return [engine.stats.requests for engine in server._engine.engines]


def test_replicas_share_concurrent_requests_and_answer_as_one_engine(single: PolicyServer, pair: PolicyServer) -> None:
    assert pair.replicas == 2 and pair.threads == 1
    lengths = [6, 9, 12, 4, 12, 8, 5, 10]
    alone = [greedy(single, PROMPTS[i], lengths[i])["choices"][0]["token_ids"] for i in range(8)]
    seeded = [chat(single, messages=PROMPTS[i], max_tokens=10, temperature=0.9, seed=50 + i) for i in range(8)]
    replies = concurrently(pair, lambda i: greedy(pair, PROMPTS[i], lengths[i])["choices"][0]["token_ids"], 8)
    assert [replies[i] for i in range(8)] == alone
    assert all(count > 0 for count in per_replica_requests(pair)), "the router left a replica idle"
    sampled = concurrently(
        pair, lambda i: chat(pair, messages=PROMPTS[i], max_tokens=10, temperature=0.9, seed=50 + i), 8
    )
    assert [sampled[i]["choices"][0]["message"] for i in range(8)] == [r["choices"][0]["message"] for r in seeded]
    stats = pair.stats
    assert stats.requests == sum(per_replica_requests(pair)) == 16
    assert stats.max_batch_size_seen == max(engine.stats.max_batch_size_seen for engine in pair._engine.engines)
    assert pair.waiting_requests == pair.running_requests == 0


def test_a_swap_reaches_every_replica_and_no_reply_mixes_versions(pair: PolicyServer, tmp_path: Path) -> None:
    """Clients keep sending while the weights are swapped, each swap issued while rows decode: every reply equals a
    one-replica run on the version it reports, and once a swap returns every replica serves the new version."""
    states = {"v0": {k: v.clone() for k, v in pair.model.state_dict().items()}}
    for seed in (1, 2):
        model = AutoModelForCausalLM.from_pretrained(make_tiny_model(tmp_path / f"m{seed}", seed=seed))
        states[f"v{seed}"] = model.state_dict()
    lengths = [14, 20, 9, 17]
    solo: dict[tuple[str, int], list[int]] = {}
    for version in ("v1", "v2", "v0"):
        pair.load_state_dict(states[version], version)
        for engine in pair._engine.engines:
            assert engine.weights_version == version
            assert torch.equal(engine.model.state_dict()["model.norm.weight"], states[version]["model.norm.weight"])
        replies = concurrently(pair, lambda i: greedy(pair, PROMPTS[i], lengths[i]), 4)
        assert {reply["agl_weights_version"] for reply in replies.values()} == {version}
        solo.update({(version, i): replies[i]["choices"][0]["token_ids"] for i in range(4)})
    assert len({tuple(solo[(v, 0)]) for v in states}) == 3, "the three versions should answer differently"

    def served_at_once(version: str) -> None:
        after = greedy(pair, PROMPTS[0], lengths[0])
        assert (after["agl_weights_version"], after["choices"][0]["token_ids"]) == (version, solo[(version, 0)])

    replies_seen = swap_storm(pair, states, PROMPTS[:4], lengths, busy_rows=2, after_swap=served_at_once)
    assert all(count > 0 for count in per_replica_requests(pair))
    for i, version, ids in replies_seen:
        assert ids == solo[(version, i)], f"request {i} reported {version} but did not decode on it alone"


def test_an_adapter_load_reaches_every_replica(
    single: PolicyServer, pair: PolicyServer, tiny_dir: Path, tmp_path: Path
) -> None:
    folders = {v: make_adapter(tiny_dir, tmp_path / f"a{v}", seed=v) for v in (1, 2)}
    single.load_adapter("a", folders[1], "a-v1")
    expected = [greedy_on(single, "policy/a", i) for i in range(6)]
    for version in (1, 2, 1):
        pair.load_adapter("a", folders[version], f"a-v{version}")
        assert [engine.adapters for engine in pair._engine.engines] == [{"a": f"a-v{version}"}] * 2
    replies = concurrently(pair, lambda i: greedy_on(pair, "policy/a", i), 6)
    assert [replies[i] for i in range(6)] == expected
    assert all(count > 0 for count in per_replica_requests(pair))


def greedy_on(server: PolicyServer, model: str, i: int) -> tuple[str, list[int]]:
    reply = chat(server, model=model, messages=PROMPTS[i], max_tokens=8, temperature=0, return_token_ids=True)
    return reply["agl_weights_version"], reply["choices"][0]["token_ids"]


def test_a_prompt_goes_to_the_replica_that_holds_its_beginning(pair: PolicyServer) -> None:
    questions = ["Count the rows.", "Sum column b, please.", "Average of a?", "Largest b?"]
    for question in questions:
        greedy(pair, [SYSTEM, {"role": "user", "content": question}], max_tokens=4)
    stats = pair.stats
    assert (stats.prefix_misses, stats.prefix_hits) == (1, 3), "later prompts went to a replica without the schema"
    assert sorted(per_replica_requests(pair)) == [0, 4]
    assert 0 < stats.reused_prompt_tokens < stats.prompt_tokens
    pair.stop()
    assert not any(engine.running for engine in pair._engine.engines)


def test_prompt_prefixes_keep_to_their_memory_budget_least_recently_used_first() -> None:
    def layers(tokens: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        return [(torch.zeros(1, 2, tokens, 4), torch.zeros(1, 2, tokens, 4)) for _ in range(3)]

    entry_bytes = 3 * 2 * 2 * 40 * 4 * 4  # layers x (keys, values) x heads x tokens x dim x fp32
    prefixes = _PromptPrefixes(max_bytes=3 * entry_bytes)
    prompts = {name: [k] * MIN_REUSED_PREFIX + list(range(100, 124)) for k, name in enumerate("abcd")}
    for name in "abc":
        prefixes.remember("base", prompts[name], layers(40))
    assert (len(prefixes), prefixes.bytes) == (3, 3 * entry_bytes)
    hit = prefixes.longest("base", [*prompts["a"][:30], 7, 7])
    assert hit is not None and hit[0] == 30  # "a" is now the most recently used
    assert prefixes.longest("other-adapter", prompts["a"]) is None
    prefixes.remember("base", prompts["d"], layers(40))  # evicts "b", the least recently used
    assert prefixes.longest("base", prompts["b"]) is None
    assert all(prefixes.longest("base", prompts[name]) is not None for name in "acd")
    assert prefixes.longest("base", prompts["a"][: MIN_REUSED_PREFIX - 1] + [9] * 30) is None  # too short a match
    prefixes.remember("base", [5] * 200, layers(200))  # bigger than the whole budget: not kept, nothing evicted
    assert len(prefixes) == 3
    prefixes.clear("base")
    assert (len(prefixes), prefixes.bytes) == (0, 0)


def test_replica_counts_are_validated(tiny_dir: Path) -> None:
    for wrong in (0, -1, "auto", True):
        with pytest.raises(ValueError, match="replicas"):
            PolicyServer(tiny_dir, replicas=wrong)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="prefix_cache_bytes"):
        PolicyServer(tiny_dir, prefix_cache_bytes=-1)
