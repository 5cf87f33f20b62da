"""Dynamic sampling (DAPO-style): draw tasks until a round has enough informative groups.

A group (one task run ``group_size`` times) whose returns are all equal teaches GRPO nothing and is skipped; a round
of mostly solved or hopeless tasks then trains on little. With ``LightningRLConfig.min_informative_groups`` (K) a round
keeps drawing batches of tasks, all on the same weights, until K of its groups are informative or it has drawn
``max_draw_factor`` times its usual number of tasks. Which tasks are drawn follows what earlier draws showed about
each (``TaskRecord``, kept across rounds and in checkpoints):

1. tasks whose final rewards so far differed (for 0/1 rewards: a pass rate strictly between 0 and 1), then
2. tasks never drawn, then
3. the other tasks drawn before;

chosen at random (the trainer's seeded ``rng``) within a tier, never twice in a round, and never a task whose group
was flat ``FLAT_LIMIT`` (2) times: it is retired for the rest of training. Pure functions: running a batch is the
caller's ``run`` callback.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, MutableMapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

#: A task whose group was flat this many times is never drawn again.
FLAT_LIMIT = 2


@dataclass
class TaskRecord:
    """What earlier draws showed about one training task.

    Attributes:
        rollouts: its usable rollouts so far.
        low / high: the lowest and highest final reward among them (None before any).
        flat: how many of its groups had no signal at all (GRPO skipped every group of the task).
    """

    rollouts: int = 0
    low: float | None = None
    high: float | None = None
    flat: int = 0

    @property
    def mixed(self) -> bool:
        """Its final rewards so far differed: drawing it again is likely to give GRPO a signal."""
        return self.low is not None and self.high is not None and self.low < self.high

    @property
    def retired(self) -> bool:
        """Flat ``FLAT_LIMIT`` times: never drawn again."""
        return self.flat >= FLAT_LIMIT


@dataclass(frozen=True)
class GroupOutcome:
    """One task's group in one draw: the final rewards of its usable rollouts (a missing one counts 0) and whether
    GRPO finds a signal in it (``grpo.informative_tasks``)."""

    rewards: tuple[float, ...]
    informative: bool


@dataclass(frozen=True)
class RoundDraws:
    """What a round drew: task indices (in draw order), informative groups among them, batches run (``draws``), and
    the tasks left out of every draw because they were retired before the round began."""

    tasks: list[int]
    informative: int
    draws: int
    retired_skipped: int


def record_outcome(history: MutableMapping[str, TaskRecord], task_id: str, outcome: GroupOutcome) -> None:
    """Add one group's outcome to its task's record."""
    record = history.setdefault(task_id, TaskRecord())
    if outcome.rewards:
        record.rollouts += len(outcome.rewards)
        low, high = min(outcome.rewards), max(outcome.rewards)
        record.low = low if record.low is None else min(record.low, low)
        record.high = high if record.high is None else max(record.high, high)
        record.flat += not outcome.informative


def choose_tasks(
    ids: Sequence[str], history: Mapping[str, TaskRecord], k: int, rng: random.Random, taken: set[str]
) -> list[int]:
    """Indices (ascending) of up to ``k`` tasks of ``ids`` to draw next: none in ``taken`` and none retired; mixed
    tasks first, then never-drawn ones, then the rest, at random within a tier."""
    tiers: tuple[list[int], list[int], list[int]] = ([], [], [])
    seen: set[str] = set()
    for index, task_id in enumerate(ids):
        record = history.get(task_id)
        if task_id in taken or task_id in seen or (record is not None and record.retired):
            continue
        seen.add(task_id)
        if record is None or record.rollouts == 0:
            tiers[1].append(index)
        else:
            tiers[0 if record.mixed else 2].append(index)
    chosen: list[int] = []
    for tier in tiers:
        need = k - len(chosen)
        if need <= 0:
            break
        chosen.extend(tier if len(tier) <= need else rng.sample(tier, need))
    return sorted(chosen)


def retired_tasks(ids: Sequence[str], history: Mapping[str, TaskRecord]) -> int:
    """How many distinct tasks of ``ids`` are retired (flat ``FLAT_LIMIT`` times)."""
    return sum(history[i].retired for i in set(ids) if i in history)


def draw_round(
    ids: Sequence[str],
    history: MutableMapping[str, TaskRecord],
    *,
    per_draw: int,
    min_informative: int,
    cap: int,
    rng: random.Random,
    run: Callable[[list[int]], Mapping[str, GroupOutcome]],
) -> RoundDraws:
    """Draw batches of up to ``per_draw`` tasks (``choose_tasks``) and ``run`` each (it returns every task's group
    outcome by task id; a task with no usable rollout may be missing), recording outcomes in ``history`` after each
    batch, until ``min_informative`` groups of the round were informative, ``cap`` tasks were drawn, or no task is
    left to draw."""
    retired_skipped = retired_tasks(ids, history)
    taken: set[str] = set()
    drawn: list[int] = []
    informative = draws = 0
    while informative < min_informative and len(drawn) < cap:
        chosen = choose_tasks(ids, history, min(per_draw, cap - len(drawn)), rng, taken)
        if not chosen:
            break
        outcomes = run(chosen)
        draws += 1
        drawn.extend(chosen)
        taken.update(ids[i] for i in chosen)
        for task_id, outcome in outcomes.items():
            record_outcome(history, task_id, outcome)
            informative += outcome.informative
    return RoundDraws(drawn, informative, draws, retired_skipped)


def history_state(history: Mapping[str, TaskRecord]) -> dict[str, dict[str, float | int | None]]:
    """``history`` as plain values, for a checkpoint."""
    return {task_id: asdict(record) for task_id, record in history.items()}


def history_from_state(saved: Mapping[str, Mapping[str, Any]]) -> dict[str, TaskRecord]:
    """The history ``history_state`` saved."""
    return {task_id: TaskRecord(**values) for task_id, values in saved.items()}
