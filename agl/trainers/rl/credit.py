"""Credit assignment: the return of every transition of a trajectory, from its final and intermediate rewards.

Pure functions over ``Trajectory`` values (no torch, no I/O). They write ``Transition.ret`` in place.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

from agl.core.types import Trajectory

CreditMode = Literal["broadcast", "discounted", "per_step"]
CREDIT_MODES: tuple[str, ...] = ("broadcast", "discounted", "per_step")


def assign_returns(trajectory: Trajectory, mode: CreditMode = "broadcast", gamma: float = 1.0) -> list[float]:
    """Fill ``ret`` on every transition of ``trajectory`` and return the returns in step order.

    Notation: ``R`` is the final reward (0 when the rollout reported none), ``r_t`` the intermediate reward already
    attached to transition ``t`` (emitted rewards and AIR that landed after call ``t`` and before call ``t+1``),
    ``T`` the number of transitions.

    * ``broadcast``: ``ret_t = R + r_t``. Every call shares the outcome; a call's own intermediate reward adds to it.
      The usual choice: each LLM call is credited with how the whole rollout ended.
    * ``discounted``: ``ret_{T-1} = r_{T-1} + R`` and ``ret_t = r_t + gamma * ret_{t+1}``, i.e.
      ``ret_t = sum_{k>=t} gamma^(k-t) r_k + gamma^(T-1-t) R``. Later rewards count less for earlier calls; with
      ``gamma = 1`` each call gets the final reward plus every intermediate reward from its own step onwards.
    * ``per_step``: ``ret_t = r_t``. Only intermediate rewards; the final reward is ignored (for agents whose every
      call is judged on its own, e.g. by AIR rules).
    """
    if mode not in CREDIT_MODES:
        raise ValueError(f"credit mode: expected one of {CREDIT_MODES}, got {mode!r}")
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"gamma: must be in [0, 1], got {gamma}")
    final = trajectory.final_reward if trajectory.final_reward is not None else 0.0
    steps = trajectory.transitions
    returns: list[float] = [0.0] * len(steps)
    if mode == "broadcast":
        returns = [final + t.reward for t in steps]
    elif mode == "per_step":
        returns = [t.reward for t in steps]
    else:
        following = final
        for i in range(len(steps) - 1, -1, -1):
            carried = following if i == len(steps) - 1 else gamma * following
            returns[i] = steps[i].reward + carried
            following = returns[i]
    for transition, value in zip(steps, returns, strict=True):
        transition.ret = value
    return returns


def assign_all(trajectories: Iterable[Trajectory], mode: CreditMode = "broadcast", gamma: float = 1.0) -> None:
    """``assign_returns`` on each trajectory."""
    for trajectory in trajectories:
        assign_returns(trajectory, mode, gamma)
