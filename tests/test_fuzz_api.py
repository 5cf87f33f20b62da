"""Fuzzing the served API: requests generated from the server's own OpenAPI schema never get a 5xx, the server keeps
serving, and requests the schema does not allow change nothing in the store.

Generation is schemathesis (hypothesis strategies built from ``/openapi.json``), derandomized so a run is the same
every time. The gateway routes are fuzzed like the rest: generated rollout ids name no rollout, so no call reaches a
backend; gateway calls that do reach one are covered by ``test_server.py`` against the fake LLM.
"""

from __future__ import annotations

import sqlite3
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from schemathesis.core.result import Ok
from schemathesis.generation import GenerationMode

from agl.core.server import AglServer
from agl.core.store.base import StoreSettings
from agl.core.store.sqlite import SqliteStore
from agl.core.types import LLM, PromptTemplate, Record, RolloutRequest, Span

pytestmark = pytest.mark.slow

#: Generated requests per operation and phase (operations with few possible inputs get fewer).
EXAMPLES = 36
#: Requests the whole run must have sent at least.
MIN_REQUESTS = 1000


def table_dump(db: Path) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of every table of the SQLite file, read through a connection of its own."""
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table' ORDER BY name")]
        return {t: conn.execute(f'SELECT * FROM "{t}" ORDER BY rowid').fetchall() for t in tables}


def seed(store: SqliteStore) -> None:
    """State for the fuzzer to run into: resources, rollouts in several states, spans and records."""
    store.publish_resources(
        {"main_llm": LLM(base_url="http://127.0.0.1:9/v1", model="m"), "prompt": PromptTemplate(template="{q}")}
    )
    rollouts = store.enqueue([RolloutRequest(task={"q": i}, task_id=f"t{i}") for i in range(4)])
    leased = store.lease("seed-worker")
    assert leased is not None
    store.add_spans(
        [
            Span(rollout_id=r.rollout_id, attempt_id="at-seed", kind="tool", name="t", attributes={"i": 1.5})
            for r in rollouts
        ]
    )
    store.add_record(Record(kind="metrics", key="0", data={"reward": 0.5}))


def negatable(operation: dict[str, Any]) -> bool:
    """Whether schema-violating requests exist for an operation (a free-form path string cannot be made invalid)."""
    if "requestBody" in operation:
        return True
    return any(p["in"] != "path" or p["schema"].get("type") != "string" for p in operation.get("parameters", []))


def test_generated_requests_never_get_a_5xx_and_invalid_ones_change_nothing(tmp_path: Path) -> None:
    db = tmp_path / "fuzz.db"
    # reaping must not change the store mid-run: nothing goes stale while the fuzzer works
    store = SqliteStore(db, StoreSettings(heartbeat_timeout=86_400, attempt_timeout=86_400))
    seed(store)
    sent: Counter[str] = Counter()
    with AglServer(store) as server, requests.Session() as session:
        raw_schema = httpx.get(server.url + "/openapi.json", timeout=30).json()
        schema = schemathesis.openapi.from_url(server.url + "/openapi.json")
        operations = [result.ok() for result in schema.get_all_operations() if isinstance(result, Ok)]
        assert len(operations) >= 20, "every route is in the served schema"

        def fuzz(operation: Any, mode: GenerationMode, check: Callable[[Any], bool] = lambda _: True) -> None:
            @settings(
                max_examples=EXAMPLES,
                derandomize=True,
                deadline=None,
                database=None,
                suppress_health_check=list(HealthCheck),
                phases=[Phase.explicit, Phase.generate, Phase.shrink],
            )
            @given(case=operation.as_strategy(generation_mode=mode))
            def one(case: Any) -> None:
                if not check(case):
                    return
                response = case.call(base_url=server.url, session=session, timeout=60)
                sent[f"{mode.value} {operation.label}"] += 1
                assert response.status_code < 500, (
                    f"{case.method} {case.formatted_path} answered {response.status_code}: {response.text[:500]}\n"
                    f"{case.as_curl_command()}"
                )

            one()

        for operation in operations:
            fuzz(operation, GenerationMode.POSITIVE)

        before = table_dump(db)
        for operation in operations:
            if negatable(raw_schema["paths"][operation.path][operation.method.lower()]):
                # a mutation can come out valid after all: schemathesis marks those positive, and they may change
                # state legitimately, so only requests that really break the schema are sent
                fuzz(operation, GenerationMode.NEGATIVE, lambda case: case._meta.generation.mode.is_negative)
        server.flush()
        assert table_dump(db) == before, "a request the schema does not allow changed the store"
        assert sum(n for key, n in sent.items() if key.startswith("negative")) >= 300
        assert httpx.get(server.url + "/health", timeout=30).json() == {"status": "ok"}
    assert sum(sent.values()) >= MIN_REQUESTS, sent
