"""Dashboard page load times on a SQLite store holding 100k spans (2,000 rollouts x 50 spans, 5% failed, 100 metrics
records, 20 resources versions): the median of a few loads of every page, served in-process (no network)."""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from fastapi.testclient import TestClient

from agl.core.store.sqlite import SqliteStore
from agl.core.types import LLM, PromptTemplate, Record, RolloutRequest, Span
from agl.dashboard import create_dashboard_app


def fill(store: SqliteStore, rollouts: int, spans_per: int) -> tuple[str, str]:
    """Rollouts with llm/tool/reward spans like real ones; returns (a rollout id, one of its span ids)."""
    for v in range(20):
        store.publish_resources(
            {
                "main_llm": LLM(base_url="http://127.0.0.1:9/v1", model="m"),
                "system_prompt": PromptTemplate(template=f"You are agent v{v}.\nAnswer {{question}} carefully."),
            }
        )
    store.enqueue([RolloutRequest(task={"q": i}, task_id=f"t{i}") for i in range(rollouts)])
    text = "x" * 600
    sample = ("", "")
    for i in range(rollouts):
        leased = store.lease(f"w{i % 8}")
        assert leased is not None
        ro, at = leased
        spans = [
            Span(
                rollout_id=ro.rollout_id,
                attempt_id=at.attempt_id,
                sequence=j + 1,
                kind=("llm", "tool", "reward")[j % 3],
                name=("chat.completions", "search", "r")[j % 3],
                agent="writer" if j % 2 else "checker",
                attributes={
                    "gen_ai.input.messages": [{"role": "user", "content": text}],
                    "gen_ai.output.messages": [{"role": "assistant", "content": text}],
                    "agl.prompt_token_ids": list(range(40)),
                    "agl.response_token_ids": list(range(20)),
                    "agl.reward": 0.1,
                },
            )
            for j in range(spans_per)
        ]
        store.add_spans(spans)
        if i % 20 == 0:
            store.complete_attempt(at.attempt_id, "failed", error="ValueError: bad")
        else:
            store.complete_attempt(at.attempt_id, "succeeded", final_reward=float(i % 2))
        sample = (ro.rollout_id, spans[-1].span_id)
    for step in range(100):
        store.add_record(Record(kind="metrics", key=str(step), data={"step": step, "reward": step / 100, "loss": 1.0}))
    return sample


def run(rollouts: int = 2_000, spans_per: int = 50, repeats: int = 5) -> dict[str, float]:
    """Median seconds per page."""
    with tempfile.TemporaryDirectory() as tmp:
        store = SqliteStore(Path(tmp) / "bench.db")
        start = time.perf_counter()
        rollout_id, span_id = fill(store, rollouts, spans_per)
        print(f"filled {rollouts * spans_per} spans in {time.perf_counter() - start:.1f}s")
        pages = {
            "runs": "/",
            "rollouts": "/rollouts",
            "rollouts page 20": "/rollouts?page=20",
            "rollouts agent filter": "/rollouts?agent=writer&page=10",
            "rollout": f"/rollouts/{rollout_id}",
            "span": f"/rollouts/{rollout_id}/spans/{span_id}",
            "curves": "/curves",
            "resources": "/resources?a=1&b=20",
            "failures": "/failures",
        }
        times: dict[str, float] = {}
        with TestClient(create_dashboard_app(store)) as client:
            for name, path in pages.items():
                took = []
                if name == "failures":  # the first load classifies every rollout; later ones what finished since
                    t0 = time.perf_counter()
                    assert client.get(path).status_code == 200
                    times["failures (first load)"] = time.perf_counter() - t0
                    print(f"{'failures (first load)':24s} {times['failures (first load)'] * 1000:8.1f} ms")
                for _ in range(repeats):
                    t0 = time.perf_counter()
                    response = client.get(path)
                    took.append(time.perf_counter() - t0)
                    assert response.status_code == 200, (path, response.text[:300])
                times[name] = statistics.median(took)
                print(f"{name:24s} {times[name] * 1000:8.1f} ms  ({path})")
        store.close()
    return times


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rollouts", type=int, default=2_000)
    parser.add_argument("--spans-per-rollout", type=int, default=50)
    args = parser.parse_args()
    run(args.rollouts, args.spans_per_rollout)
