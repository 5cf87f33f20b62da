"""LightningRL: credit assignment, AIR, GRPO advantages and the clipped policy update, for any agent.

Names load lazily: importing this package (or the pure modules ``credit``, ``air``, ``grpo``) does not import torch;
the first use of ``PolicyUpdater`` or of the loss/batching helpers does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from agl._lazy import lazy_exports

if TYPE_CHECKING:
    from agl.trainers.rl.air import AirRule, AirRules, format_ok, tool_error, tool_ok
    from agl.trainers.rl.credit import CreditMode, assign_returns
    from agl.trainers.rl.grpo import AdvantageStats, GRPOConfig, grpo_advantages
    from agl.trainers.rl.lightning import LightningRL, LightningRLConfig
    from agl.trainers.rl.loss import policy_loss
    from agl.trainers.rl.update import PolicyUpdater
    from agl.trainers.rl.update_config import LossConfig, UpdateConfig

_EXPORTS = {
    "AirRule": "agl.trainers.rl.air",
    "AirRules": "agl.trainers.rl.air",
    "format_ok": "agl.trainers.rl.air",
    "tool_error": "agl.trainers.rl.air",
    "tool_ok": "agl.trainers.rl.air",
    "CreditMode": "agl.trainers.rl.credit",
    "assign_returns": "agl.trainers.rl.credit",
    "AdvantageStats": "agl.trainers.rl.grpo",
    "GRPOConfig": "agl.trainers.rl.grpo",
    "grpo_advantages": "agl.trainers.rl.grpo",
    "LightningRL": "agl.trainers.rl.lightning",
    "LightningRLConfig": "agl.trainers.rl.lightning",
    "LossConfig": "agl.trainers.rl.update_config",
    "policy_loss": "agl.trainers.rl.loss",
    "PolicyUpdater": "agl.trainers.rl.update",
    "UpdateConfig": "agl.trainers.rl.update_config",
}

__all__ = [
    "AdvantageStats",
    "AirRule",
    "AirRules",
    "CreditMode",
    "GRPOConfig",
    "LightningRL",
    "LightningRLConfig",
    "LossConfig",
    "PolicyUpdater",
    "UpdateConfig",
    "assign_returns",
    "format_ok",
    "grpo_advantages",
    "policy_loss",
    "tool_error",
    "tool_ok",
]


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
