"""Trajectories for the RL tests that work on returns and advantages: only what a test states varies."""

from __future__ import annotations

from typing import Any

from agl.core.types import Trajectory, Transition


def finished(
    rollout_id: str, task_id: str | None, final: float | None, steps: list[Transition], **fields: Any
) -> Trajectory:
    """A succeeded rollout of ``task_id`` with final reward ``final`` and the transitions ``steps``."""
    return Trajectory(
        rollout_id=rollout_id,
        attempt_id="at",
        task_id=task_id,
        resources_version=1,
        status="succeeded",
        final_reward=final,
        transitions=steps,
        **fields,
    )
