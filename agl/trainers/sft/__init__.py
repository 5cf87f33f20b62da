"""SFT: supervised fine-tuning on selected rollouts (rejection-sampling fine-tuning), on exact token ids (imported
text-only traces: rendered with the chat template, marked text-derived).

Names load lazily: importing this package (or ``config``/``data``) does not import torch; training does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from agl._lazy import lazy_exports

if TYPE_CHECKING:
    from agl.trainers.sft.config import SFTConfig
    from agl.trainers.sft.data import (
        SFTSample,
        build_samples,
        render_messages,
        select_trajectories,
        to_sft_sample,
    )
    from agl.trainers.sft.sft import SFT
    from agl.trainers.sft.train import TrainResult, make_sft_trainer, sft_on_trajectories, train_samples

_EXPORTS = {
    "SFT": "agl.trainers.sft.sft",
    "SFTConfig": "agl.trainers.sft.config",
    "SFTSample": "agl.trainers.sft.data",
    "build_samples": "agl.trainers.sft.data",
    "render_messages": "agl.trainers.sft.data",
    "select_trajectories": "agl.trainers.sft.data",
    "to_sft_sample": "agl.trainers.sft.data",
    "TrainResult": "agl.trainers.sft.train",
    "make_sft_trainer": "agl.trainers.sft.train",
    "sft_on_trajectories": "agl.trainers.sft.train",
    "train_samples": "agl.trainers.sft.train",
}

__all__ = [
    "SFT",
    "SFTConfig",
    "SFTSample",
    "TrainResult",
    "build_samples",
    "make_sft_trainer",
    "render_messages",
    "select_trajectories",
    "sft_on_trajectories",
    "to_sft_sample",
    "train_samples",
]


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
