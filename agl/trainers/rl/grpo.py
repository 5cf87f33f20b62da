"""GRPO advantages: each transition's return compared with the returns of the same task's group of rollouts.

Pure functions over ``Trajectory`` values whose transitions already carry ``ret`` (see ``credit.py``); they write
``Transition.advantage`` in place. No torch.

The score of a transition is its own return ``ret_t``. The baseline is pooled over the group: every transition of every
rollout of the same task (``task_id``; a trajectory without one is a group of its own). So with a single LLM call per
rollout this is exactly GRPO, and with several calls a call whose return differs from its siblings' (discounted credit,
intermediate/AIR rewards) gets its own advantage instead of the trajectory average. This is the same pooling as
Agent Lightning's verl integration (all transitions of a task share one group id); its caveat is that rollouts with
more calls weigh more in the group mean.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from agl.core.types import Trajectory, Transition


@dataclass
class GRPOConfig:
    """How returns become advantages.

    Attributes:
        normalize_std: divide ``ret_t - mean`` by the group's standard deviation (sample std, n-1, as in TRL/verl).
            Default True (GRPO). Set False (Dr. GRPO) to avoid up-weighting groups whose rewards barely differ.
        skip_zero_variance: drop groups whose returns are all equal (within ``epsilon``): they carry no signal and
            only dilute the batch. Default True. With False their transitions stay in the batch with advantage 0.
        epsilon: added to the std before dividing, and the tolerance for "all equal". Default 1e-6.
    """

    normalize_std: bool = True
    skip_zero_variance: bool = True
    epsilon: float = 1e-6


@dataclass(frozen=True)
class AdvantageStats:
    """What ``grpo_advantages`` did: group counts and how many transitions it kept."""

    groups: int
    skipped_groups: int
    transitions: int
    kept_transitions: int


def group_key(trajectory: Trajectory) -> str:
    """The GRPO group of a trajectory: its task id, or its own rollout id when it has none."""
    return trajectory.task_id if trajectory.task_id is not None else f"rollout:{trajectory.rollout_id}"


def _std(values: Sequence[float], mean: float) -> float:
    if len(values) < 2:
        return 0.0
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))


def grpo_advantages(
    trajectories: Sequence[Trajectory], config: GRPOConfig | None = None
) -> tuple[list[Transition], AdvantageStats]:
    """Fill ``advantage`` on the transitions of ``trajectories``; return the transitions to train on and stats.

    For a group ``G`` with returns ``{ret}`` over all its transitions (mean ``mu``, sample std ``sigma``):
    ``advantage_t = (ret_t - mu) / (sigma + epsilon)`` with ``normalize_std``, else ``ret_t - mu``.
    A group whose returns span at most ``epsilon`` (e.g. a single transition) is zero-variance: with
    ``skip_zero_variance`` its transitions are left out (advantage stays None), otherwise they get 0.
    Transitions come back group by group (in order of first appearance), in trajectory order within a group.
    """
    cfg = config or GRPOConfig()
    groups: dict[str, list[Transition]] = {}
    for trajectory in trajectories:
        for transition in trajectory.transitions:
            if transition.ret is None:
                raise ValueError(
                    f"transition {transition.span_id} of rollout {trajectory.rollout_id} has no return: "
                    "run credit assignment (assign_returns) first"
                )
        groups.setdefault(group_key(trajectory), []).extend(trajectory.transitions)
    kept: list[Transition] = []
    skipped = 0
    for members in groups.values():
        returns = [t.ret if t.ret is not None else 0.0 for t in members]
        if not returns:
            continue
        mean = sum(returns) / len(returns)
        flat = max(returns) - min(returns) <= cfg.epsilon
        if flat and cfg.skip_zero_variance:
            skipped += 1
            continue
        scale = _std(returns, mean) + cfg.epsilon if cfg.normalize_std else 1.0
        for transition, value in zip(members, returns, strict=True):
            transition.advantage = 0.0 if flat else (value - mean) / scale
            kept.append(transition)
    total = sum(len(m) for m in groups.values())
    return kept, AdvantageStats(len(groups), skipped, total, len(kept))
