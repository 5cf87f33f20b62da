"""agl: make any LLM agent trainable with almost no change to its code.

Public names are imported lazily, so ``import agl`` stays fast and pulls in no torch and no agent framework.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from agl._lazy import lazy_exports

#: The one home of the version: pyproject.toml reads it (`[tool.setuptools.dynamic]`); CHANGELOG.md says what changed.
__version__ = "0.2.0"

_EXPORTS: dict[str, str] = {
    "emit_reward": "agl.core.emit",
    "emit_message": "agl.core.emit",
    "emit_exception": "agl.core.emit",
    "emit_object": "agl.core.emit",
    "agent_scope": "agl.core.emit",
    "span_scope": "agl.core.emit",
    "current_rollout": "agl.core.emit",
    "openai_client": "agl.clients",
    "async_openai_client": "agl.clients",
    "Trainer": "agl.core.trainer",
    "LightningRL": "agl.trainers.rl.lightning",
    "LightningRLConfig": "agl.trainers.rl.lightning",
    "LoraConfig": "agl.trainers.config",
    "ServingConfig": "agl.trainers.config",
    "TrainContext": "agl.core.context",
    "RolloutBatch": "agl.core.context",
    "FitResult": "agl.core.trainer",
    "CaptureError": "agl.core.trainer",
    "Algorithm": "agl.core.algorithm",
    "Baseline": "agl.core.algorithm",
    "select_agents": "agl.core.adapter",
    "CaptureFailure": "agl.core.adapter",
    "TIE_BREAK_REWARD": "agl.core.adapter",
    "open_store": "agl.core.store",
    "LLM": "agl.core.types",
    "PromptTemplate": "agl.core.types",
    "ModelWeights": "agl.core.types",
    "PolicyRoute": "agl.core.types",
    "ResourceSet": "agl.core.types",
    "Span": "agl.core.types",
    "Rollout": "agl.core.types",
    "Attempt": "agl.core.types",
    "Transition": "agl.core.types",
    "Trajectory": "agl.core.types",
}

__all__ = [
    "LLM",
    "TIE_BREAK_REWARD",
    "Algorithm",
    "Attempt",
    "Baseline",
    "CaptureError",
    "CaptureFailure",
    "FitResult",
    "LightningRL",
    "LightningRLConfig",
    "LoraConfig",
    "ModelWeights",
    "PolicyRoute",
    "PromptTemplate",
    "ResourceSet",
    "Rollout",
    "RolloutBatch",
    "ServingConfig",
    "Span",
    "TrainContext",
    "Trainer",
    "Trajectory",
    "Transition",
    "agent_scope",
    "async_openai_client",
    "current_rollout",
    "emit_exception",
    "emit_message",
    "emit_object",
    "emit_reward",
    "open_store",
    "openai_client",
    "select_agents",
    "span_scope",
]


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)


if TYPE_CHECKING:
    from agl.clients import async_openai_client, openai_client
    from agl.core.adapter import TIE_BREAK_REWARD, CaptureFailure, select_agents
    from agl.core.algorithm import Algorithm, Baseline
    from agl.core.context import RolloutBatch, TrainContext
    from agl.core.emit import (
        agent_scope,
        current_rollout,
        emit_exception,
        emit_message,
        emit_object,
        emit_reward,
        span_scope,
    )
    from agl.core.store import open_store
    from agl.core.trainer import CaptureError, FitResult, Trainer
    from agl.core.types import (
        LLM,
        Attempt,
        ModelWeights,
        PolicyRoute,
        PromptTemplate,
        ResourceSet,
        Rollout,
        Span,
        Trajectory,
        Transition,
    )
    from agl.trainers.config import LoraConfig, ServingConfig
    from agl.trainers.rl.lightning import LightningRL, LightningRLConfig
