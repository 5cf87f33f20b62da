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

Scale (``GRPOConfig.normalize_std`` and ``std_scope``): a group's centred returns ``ret_t - mean`` are divided by the
group's own std (``"group"``, GRPO), by the std of every trained group's centred returns in the batch together
(``"batch"``, the batch-normalised REINFORCE++ variant: a group whose returns barely differ keeps small advantages
instead of being blown up to unit scale), or not at all (``normalize_std=False``, Dr. GRPO).

Tie-break (``GRPOConfig.tie_break``): a call can carry a secondary score (``Transition.tie_break``, from a reward span
named ``agl.TIE_BREAK_REWARD``, e.g. a partial-credit F1 of the answer the call wrote). It never enters the return. A
group whose returns are all equal (flat) is scored by ``ret_t + tie_break_t`` instead (a missing score counts 0), so
rollouts that all failed (or all succeeded) still learn which of them came closer; if those scores are flat too the
group stays flat. A group whose returns differ ignores the scores entirely, so the secondary score can never outweigh
the real reward: it only orders rollouts the real reward cannot tell apart.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from agl.core.types import Trajectory, Transition

GroupBy = Literal["task", "task_agent", "task_agent_step"]
GROUP_BY: tuple[str, ...] = ("task", "task_agent", "task_agent_step")
StdScope = Literal["group", "batch"]
STD_SCOPES: tuple[str, ...] = ("group", "batch")


@dataclass
class GRPOConfig:
    """How returns become advantages.

    Attributes:
        normalize_std: divide ``ret_t - mean`` by a standard deviation (sample std, n-1, as in TRL/verl), the one
            ``std_scope`` names. Default True (GRPO). Set False (Dr. GRPO) to avoid up-weighting groups whose rewards
            barely differ.
        std_scope: which std divides, with ``normalize_std``: ``"group"`` (default, GRPO) the group's own, or
            ``"batch"``: one std for the whole batch, that of the centred returns ``ret_t - mean`` of every transition
            of every trained (non-flat) group, so groups keep their relative spread (REINFORCE++-style batch
            normalisation). With ``policies`` the batch is one policy's transitions of the round.
        skip_zero_variance: drop groups whose returns are all equal (within ``epsilon``): they carry no signal and
            only dilute the batch. Default True. With False their transitions stay in the batch with advantage 0.
        epsilon: added to the std before dividing, and the tolerance for "all equal". Default 1e-6.
        group_by: which transitions share a baseline (see the module docstring): ``"task"`` (default; all calls of
            the task's rollouts), ``"task_agent"`` (also the same agent) or ``"task_agent_step"`` (also the same call
            index among that agent's calls in the rollout: one transition per rollout and group). Use the finer ones
            when several agents or several calls per rollout make the pooled mean unfair.
        tie_break: score a group whose returns are all equal by ``ret_t + tie_break_t`` (``Transition.tie_break``,
            missing = 0) instead of treating it as flat (module docstring). Groups whose returns differ are untouched.
            Default False. With ``normalize_std`` and ``std_scope="group"`` a rescued group's advantages are unit-scale
            like any other group's; ``std_scope="batch"`` or ``normalize_std=False`` keep them as small as the score
            differences.
    """

    normalize_std: bool = True
    std_scope: StdScope = "group"
    skip_zero_variance: bool = True
    epsilon: float = 1e-6
    group_by: GroupBy = "task"
    tie_break: bool = False

    def __post_init__(self) -> None:
        if self.group_by not in GROUP_BY:
            raise ValueError(f"group_by: expected one of {GROUP_BY}, got {self.group_by!r}")
        if self.std_scope not in STD_SCOPES:
            raise ValueError(f"std_scope: expected one of {STD_SCOPES}, got {self.std_scope!r}")
        if self.std_scope == "batch" and not self.normalize_std:
            raise ValueError("std_scope='batch' divides by a std: it needs normalize_std=True")
        if self.epsilon < 0:
            raise ValueError(f"epsilon: must be >= 0, got {self.epsilon}")


@dataclass(frozen=True)
class AdvantageStats:
    """What ``grpo_advantages`` did: group counts and how many transitions it kept.

    ``zero_variance_groups`` counts the groups whose returns were all equal, whether skipped, kept with advantage 0,
    or rescued by their tie-break scores; ``tie_break_groups`` counts the rescued ones (trained on their scores).
    """

    groups: int
    skipped_groups: int
    transitions: int
    kept_transitions: int
    zero_variance_groups: int = 0
    tie_break_groups: int = 0


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


def _groups(trajectories: Sequence[Trajectory], group_by: GroupBy) -> dict[tuple[str, ...], list[Transition]]:
    """The transitions of ``trajectories`` by GRPO group (groups in order of first appearance); every transition
    must already have its return."""
    groups: dict[tuple[str, ...], list[Transition]] = {}
    for trajectory in trajectories:
        for transition in trajectory.transitions:
            if transition.ret is None:
                raise ValueError(
                    f"transition {transition.span_id} of rollout {trajectory.rollout_id} has no return: "
                    "run credit assignment (assign_returns) first"
                )
        for key, transition in zip(transition_groups(trajectory, group_by), trajectory.transitions, strict=True):
            groups.setdefault(key, []).append(transition)
    return groups


def _is_flat(values: Sequence[float], epsilon: float) -> bool:
    return max(values) - min(values) <= epsilon


@dataclass(frozen=True)
class _Scored:
    """One group's members and the values its advantages come from: its returns, or (``rescued``) its returns plus
    tie-break scores. ``flat``: its returns were all equal; ``dead``: so were its scores (no signal at all)."""

    members: list[Transition]
    values: list[float]
    flat: bool
    rescued: bool

    @property
    def dead(self) -> bool:
        return self.flat and not self.rescued

    @property
    def centred(self) -> list[float]:
        mean = sum(self.values) / len(self.values)
        return [v - mean for v in self.values]


def _score(members: list[Transition], cfg: GRPOConfig) -> _Scored:
    returns = [t.ret if t.ret is not None else 0.0 for t in members]
    if not _is_flat(returns, cfg.epsilon):
        return _Scored(members, returns, flat=False, rescued=False)
    if cfg.tie_break:
        scores = [r + (t.tie_break or 0.0) for r, t in zip(returns, members, strict=True)]
        if not _is_flat(scores, cfg.epsilon):
            return _Scored(members, scores, flat=True, rescued=True)
    return _Scored(members, returns, flat=True, rescued=False)


def informative_tasks(trajectories: Sequence[Trajectory], config: GRPOConfig | None = None) -> dict[str, bool]:
    """For each task among ``trajectories`` (``group_key``): whether ``grpo_advantages`` would find a signal in at
    least one of its groups (returns that differ, or with ``tie_break`` scores that do). Needs returns; writes
    nothing."""
    cfg = config or GRPOConfig()
    out: dict[str, bool] = {}
    for key, members in _groups(trajectories, cfg.group_by).items():
        out[key[0]] = out.get(key[0], False) or not _score(members, cfg).dead
    return out


def grpo_advantages(
    trajectories: Sequence[Trajectory], config: GRPOConfig | None = None
) -> tuple[list[Transition], AdvantageStats]:
    """Fill ``advantage`` on the transitions of ``trajectories``; return the transitions to train on and stats.

    Groups are formed as ``cfg.group_by`` says (module docstring). For a group ``G`` with values ``{v}`` over all its
    transitions (their returns; for a flat group rescued by ``tie_break``, returns plus tie-break scores) and mean
    ``mu``: ``advantage_t = (v_t - mu) / (sigma + epsilon)`` with ``normalize_std``, else ``v_t - mu``, where
    ``sigma`` is the group's sample std (``std_scope="group"``) or the sample std of ``v - mu`` over every transition
    of every non-flat or rescued group of the batch (``"batch"``).
    A group whose values span at most ``epsilon`` (e.g. a single transition) is zero-variance: with
    ``skip_zero_variance`` its transitions are left out (advantage stays None), otherwise they get 0.
    Transitions come back group by group (in order of first appearance), in trajectory order within a group.
    """
    cfg = config or GRPOConfig()
    groups = _groups(trajectories, cfg.group_by)
    scored = [_score(members, cfg) for members in groups.values()]
    trained = [g for g in scored if not (g.dead and cfg.skip_zero_variance)]
    batch_scale = 1.0
    if cfg.normalize_std and cfg.std_scope == "batch":
        batch_scale = sample_std([c for g in trained if not g.dead for c in g.centred]) + cfg.epsilon
    kept: list[Transition] = []
    for group in trained:
        scale = batch_scale
        if cfg.normalize_std and cfg.std_scope == "group":
            scale = sample_std(group.values) + cfg.epsilon
        for transition, value in zip(group.members, group.centred, strict=True):
            transition.advantage = 0.0 if group.dead else value / scale
            kept.append(transition)
    return kept, AdvantageStats(
        groups=len(groups),
        skipped_groups=len(scored) - len(trained),
        transitions=sum(len(m) for m in groups.values()),
        kept_transitions=len(kept),
        zero_variance_groups=sum(g.flat for g in scored),
        tie_break_groups=sum(g.rescued for g in scored),
    )
