"""Which candidates survive an iteration: Pareto selection over tasks, or plain top-k by mean. Pure functions.

Both take ``scores``: candidate id → {task id → score on that task}, for candidates that all ran on ``tasks``; the
order of ``scores`` breaks ties (earlier first, so an incumbent is not displaced by an equal newcomer). Both return
the survivors' ids, best mean first.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

Scores = Mapping[str, Mapping[str, float]]

_TIE = 1e-9


def mean_score(scores: Mapping[str, float], tasks: Sequence[str]) -> float:
    """Mean score over ``tasks`` (a missing task counts 0)."""
    return sum(scores.get(t, 0.0) for t in tasks) / len(tasks) if tasks else 0.0


def _ranked(scores: Scores, tasks: Sequence[str]) -> list[str]:
    order = {cid: i for i, cid in enumerate(scores)}
    return sorted(scores, key=lambda cid: (-mean_score(scores[cid], tasks), order[cid]))


def best_on(scores: Scores, tasks: Sequence[str]) -> dict[str, set[str]]:
    """For each candidate, the tasks on which it is best (ties allowed: every candidate at the top score is best)."""
    wins: dict[str, set[str]] = {cid: set() for cid in scores}
    for task in tasks:
        top = max(s.get(task, 0.0) for s in scores.values())
        for cid, s in scores.items():
            if s.get(task, 0.0) >= top - _TIE:
                wins[cid].add(task)
    return wins


def pareto_front(scores: Scores, tasks: Sequence[str]) -> list[str]:
    """Candidates that are best (ties allowed) on at least one task, best mean first."""
    wins = best_on(scores, tasks)
    return [cid for cid in _ranked(scores, tasks) if wins[cid]]


def pareto_select(scores: Scores, tasks: Sequence[str], beam_width: int) -> list[str]:
    """The Pareto front, capped to ``beam_width`` by mean with coverage first.

    Walking the front from the best mean down, a candidate is taken first if it is best on a task that no candidate
    taken so far is best on; remaining places go to the rest of the front by mean. So when the front is larger than
    the beam, specialists that alone solve some tasks keep their place over near-duplicates of the leader.
    """
    if beam_width < 1:
        raise ValueError(f"beam_width: must be >= 1, got {beam_width}")
    wins = best_on(scores, tasks)
    front = [cid for cid in _ranked(scores, tasks) if wins[cid]]
    kept: list[str] = []
    covered: set[str] = set()
    for cid in front:
        if len(kept) < beam_width and wins[cid] - covered:
            kept.append(cid)
            covered |= wins[cid]
    for cid in front:
        if len(kept) < beam_width and cid not in kept:
            kept.append(cid)
    rank = {cid: i for i, cid in enumerate(front)}
    return sorted(kept, key=rank.__getitem__)


def top_k_by_mean(scores: Scores, tasks: Sequence[str], beam_width: int) -> list[str]:
    """Plain beam selection: the ``beam_width`` candidates with the highest mean."""
    if beam_width < 1:
        raise ValueError(f"beam_width: must be >= 1, got {beam_width}")
    return _ranked(scores, tasks)[:beam_width]
