"""Trajectories from rollouts already in the store (imported traces), for trainers that learn without re-running the
agent: APO (``APO.fit_offline``) critiques and edits prompts from them; SFT (``sft_on_trajectories``) fine-tunes on
them, rendering text-only calls with the model's chat template (text-derived samples); RL, which trains on the exact
token ids the policy sampled, refuses rollouts that do not carry them (``NotTrainable`` says why).

Reads the store, then builds trajectories with ``agl.core.adapter`` like ``Trainer`` does for live rollouts.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from agl.core.adapter import build_trajectory, select_agents
from agl.core.store.base import Store
from agl.core.types import Rollout, Trajectory
from agl.otel.importer import IMPORTED


class NotTrainable(ValueError):
    """Stored rollouts an algorithm cannot train on; the message names them and says why."""


def _imported_rollouts(store: Store, source: str | None) -> list[Rollout]:
    out: list[Rollout] = []
    offset = 0
    while True:
        batch = store.list_rollouts(limit=500, offset=offset)
        for r in batch:
            mark = r.metadata.get(IMPORTED)
            if r.finished and isinstance(mark, dict) and (source is None or mark.get("source") == source):
                out.append(r)
        if len(batch) < 500:
            return out[::-1]  # oldest first
        offset += 500


def stored_trajectories(
    store: Store,
    rollout_ids: Sequence[str] | None = None,
    *,
    source: str | None = None,
    agents: str | Sequence[str] | None = None,
    algorithm: Any = None,
) -> list[Trajectory]:
    """The trajectories of finished stored rollouts: those named, else every imported one (of ``source`` when
    given), oldest first; each from its last attempt, transitions = the LLM calls of ``agents`` (None = all).

    With an ``algorithm`` whose ``requires_token_ids`` is set (LightningRL), ``NotTrainable`` is raised when any
    selected call has no token ids, naming the rollouts and why; not for one that ``trains_on_text`` (SFT).
    """
    rollouts = store.get_rollouts(list(rollout_ids)) if rollout_ids else _imported_rollouts(store, source)
    selector = select_agents(agents)
    out: list[Trajectory] = []
    for rollout in rollouts:
        attempts = store.list_attempts(rollout.rollout_id)
        attempt = attempts[-1].attempt_id if attempts else None
        spans = store.query_spans(attempt_id=attempt) if attempt else []
        out.append(build_trajectory(rollout, spans, selector, attempt))
    if getattr(algorithm, "requires_token_ids", False) and not getattr(algorithm, "trains_on_text", False):
        check_token_ids(out, type(algorithm).__name__)
    return out


def check_token_ids(trajectories: Sequence[Trajectory], algorithm: str) -> None:
    """``NotTrainable`` unless every transition of ``trajectories`` carries prompt and response token ids."""
    lacking = [t for t in trajectories if not t.transitions or any(not x.has_token_ids for x in t.transitions)]
    if not lacking:
        return
    names = ", ".join(t.rollout_id for t in lacking[:5]) + (f" and {len(lacking) - 5} more" if len(lacking) > 5 else "")
    raise NotTrainable(
        f"{algorithm} cannot train on {len(lacking)} of {len(trajectories)} stored rollouts ({names}): their LLM "
        f"calls carry no exact token ids. {algorithm} trains on the token ids the model sampled (prompt and "
        "response, with their logprobs for RL); a trace recorded outside agl holds only text, and re-tokenizing it "
        "would train on tokens the model never produced. Use APO (APO.fit_offline) or SFT (sft_on_trajectories) on "
        "these rollouts, or record the agent through agl's gateway with a backend that returns token ids (vLLM, "
        "agl.serving)"
    )
