"""GRPO advantages: each transition's return compared with the returns of the same task's group of rollouts.

Pure functions over ``Trajectory`` values whose transitions already carry ``ret`` (see ``credit.py``); they write
``Transition.advantage`` in place. No torch.

The score of a transition is its own return ``ret_t``; its baseline is the mean return of its group, chosen by
``GRPOConfig.group_by`` (a trajectory without a ``task_id`` stands for a task of its own):

* ``"task"`` (default): every transition of every rollout of the same task. With a single LLM call per rollout this
  is exactly GRPO, and with several calls a call whose return differs from its siblings' (discounted credit,
  intermediate/AIR rewards) gets its own advantage instead of the trajectory average. This is the same pooling as
  Agent Lightning's verl integration (all transitions of a task share one group id). Caveat: a rollout with more calls
  weighs more in the group mean, and calls of different roles (a writer and a checker) share one baseline.
* ``"task_agent"``: the transitions of the same task made by the same agent (``Transition.agent``): each agent's calls
  are compared only with that agent's calls on the task, so one role's rewards do not set another role's baseline.
  A rollout with more calls of that agent still weighs more.
* ``"task_agent_step"``: also by the call's index among that agent's calls in its rollout (its 1st, 2nd, ... call),
  so each rollout contributes at most one transition per group: the k-th writer call of a rollout is compared with
  the k-th writer calls of the other rollouts of the task. Groups get smaller (a call index that only one rollout
  reached is a single-transition group, zero-variance by definition), so fewer transitions may be trained on.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from agl.core.types import Trajectory, Transition

GroupBy = Literal["task", "task_agent", "task_agent_step"]
GROUP_BY: tuple[str, ...] = ("task", "task_agent", "task_agent_step")


@dataclass
class GRPOConfig:
    """How returns become advantages.

    Attributes:
        normalize_std: divide ``ret_t - mean`` by the group's standard deviation (sample std, n-1, as in TRL/verl).
            Default True (GRPO). Set False (Dr. GRPO) to avoid up-weighting groups whose rewards barely differ.
        skip_zero_variance: drop groups whose returns are all equal (within ``epsilon``): they carry no signal and
            only dilute the batch. Default True. With False their transitions stay in the batch with advantage 0.
        epsilon: added to the std before dividing, and the tolerance for "all equal". Default 1e-6.
        group_by: which transitions share a baseline (see the module docstring): ``"task"`` (default; all calls of
            the task's rollouts), ``"task_agent"`` (also the same agent) or ``"task_agent_step"`` (also the same call
            index among that agent's calls in the rollout: one transition per rollout and group). Use the finer ones
            when several agents or several calls per rollout make the pooled mean unfair.
    """

    normalize_std: bool = True
    skip_zero_variance: bool = True
    epsilon: float = 1e-6
    group_by: GroupBy = "task"

    def __post_init__(self) -> None:
        if self.group_by not in GROUP_BY:
            raise ValueError(f"group_by: expected one of {GROUP_BY}, got {self.group_by!r}")
        if self.epsilon < 0:
            raise ValueError(f"epsilon: must be >= 0, got {self.epsilon}")


@dataclass(frozen=True)
class AdvantageStats:
    """What ``grpo_advantages`` did: group counts and how many transitions it kept.

    ``zero_variance_groups`` counts the groups whose returns were all equal, whether skipped or kept with advantage 0.
    """

    groups: int
    skipped_groups: int
    transitions: int
    kept_transitions: int
    zero_variance_groups: int = 0


def group_key(trajectory: Trajectory) -> str:
    """The task a trajectory belongs to: its task id, or its own rollout id when it has none."""
    return trajectory.task_id if trajectory.task_id is not None else f"rollout:{trajectory.rollout_id}"


def transition_groups(trajectory: Trajectory, group_by: GroupBy = "task") -> list[tuple[str, ...]]:
    """The GRPO group of each transition of ``trajectory`` (in order), as ``group_by`` defines it."""
    if group_by not in GROUP_BY:
        raise ValueError(f"group_by: expected one of {GROUP_BY}, got {group_by!r}")
    task = group_key(trajectory)
    if group_by == "task":
        return [(task,) for _ in trajectory.transitions]
    if group_by == "task_agent":
        return [(task, str(t.agent)) for t in trajectory.transitions]
    seen: dict[str | None, int] = {}
    keys: list[tuple[str, ...]] = []
    for transition in trajectory.transitions:
        index = seen.get(transition.agent, 0)
        seen[transition.agent] = index + 1
        keys.append((task, str(transition.agent), str(index)))
    return keys


def sample_std(values: Sequence[float]) -> float:
    """The sample standard deviation (n-1, as TRL and verl use); 0 for fewer than two values."""
    if len(values) < 2:
        return 0.0
    mean = sum(values) / len(values)
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))


def grpo_advantages(
    trajectories: Sequence[Trajectory], config: GRPOConfig | None = None
) -> tuple[list[Transition], AdvantageStats]:
    """Fill ``advantage`` on the transitions of ``trajectories``; return the transitions to train on and stats.

    Groups are formed as ``cfg.group_by`` says (module docstring). For a group ``G`` with returns ``{ret}`` over all
    its transitions (mean ``mu``, sample std ``sigma``):
    ``advantage_t = (ret_t - mu) / (sigma + epsilon)`` with ``normalize_std``, else ``ret_t - mu``.
    A group whose returns span at most ``epsilon`` (e.g. a single transition) is zero-variance: with
    ``skip_zero_variance`` its transitions are left out (advantage stays None), otherwise they get 0.
    Transitions come back group by group (in order of first appearance), in trajectory order within a group.
    """
    cfg = config or GRPOConfig()
    groups: dict[tuple[str, ...], list[Transition]] = {}
    for trajectory in trajectories:
        for transition in trajectory.transitions:
            if transition.ret is None:
                raise ValueError(
                    f"transition {transition.span_id} of rollout {trajectory.rollout_id} has no return: "
                    "run credit assignment (assign_returns) first"
                )
        for key, transition in zip(transition_groups(trajectory, cfg.group_by), trajectory.transitions, strict=True):
            groups.setdefault(key, []).append(transition)
    kept: list[Transition] = []
    skipped = flat_groups = 0
    for members in groups.values():
        returns = [t.ret if t.ret is not None else 0.0 for t in members]
        mean = sum(returns) / len(returns)
        flat = max(returns) - min(returns) <= cfg.epsilon
        flat_groups += flat
        if flat and cfg.skip_zero_variance:
            skipped += 1
            continue
        scale = sample_std(returns) + cfg.epsilon if cfg.normalize_std else 1.0
        for transition, value in zip(members, returns, strict=True):
            transition.advantage = 0.0 if flat else (value - mean) / scale
            kept.append(transition)
    total = sum(len(m) for m in groups.values())
    return kept, AdvantageStats(len(groups), skipped, total, len(kept), flat_groups)
