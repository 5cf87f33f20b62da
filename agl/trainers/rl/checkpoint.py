"""RL checkpoints on disk: one folder per round, ``round-NNNN/policy`` (weights) and ``round-NNNN/trainer_state.pt``;
with per-agent policies ``round-NNNN/policies`` (an adapter folder per agent and ``manifest.json``) instead of
``policy``, and ``round-0000/policies`` holds the fresh adapters served before the first round.

The policy folder is written every round that updated the weights (it is what the published ``ModelWeights`` points
at); the trainer state (optimizer, round, weights version, RNG states, metrics so far) is added every
``checkpoint_every`` rounds and makes the folder resumable. Files are written into a temporary name and renamed, so a
crash never leaves a half-written state that ``latest_checkpoint`` would pick. Single writer (the algorithm).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import torch

STATE_FILE = "trainer_state.pt"
_PREFIX = "round-"


def round_dir(root: Path, round_number: int) -> Path:
    """The folder of the state after ``round_number`` rounds (1-based)."""
    return root / f"{_PREFIX}{round_number:04d}"


def round_dirs(root: Path) -> list[Path]:
    """Round folders under ``root``, oldest first."""
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if p.is_dir() and p.name.startswith(_PREFIX))


def save_state(folder: Path, state: dict[str, Any]) -> Path:
    """Write the trainer state into ``folder`` atomically."""
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f".{STATE_FILE}.tmp"
    torch.save(state, tmp)
    os.replace(tmp, folder / STATE_FILE)
    return folder / STATE_FILE


def load_state(folder: Path) -> dict[str, Any]:
    """Read what ``save_state`` wrote (tensors, numbers, strings and containers only)."""
    path = folder / STATE_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{folder} is not a resumable RL checkpoint (no {STATE_FILE})")
    state: dict[str, Any] = torch.load(path, map_location="cpu", weights_only=True)
    return state


def latest_checkpoint(root: Path) -> Path | None:
    """The newest resumable round folder under ``root``, or None."""
    resumable = [p for p in round_dirs(root) if (p / STATE_FILE).is_file()]
    return resumable[-1] if resumable else None


def prune(root: Path, keep: int | None) -> list[Path]:
    """Delete the oldest round folders beyond ``keep`` (None = keep all); the newest folder and the newest resumable
    one are always kept. Returns what was deleted."""
    if keep is None:
        return []
    folders = round_dirs(root)
    protected = {p for p in (folders[-1] if folders else None, latest_checkpoint(root)) if p is not None}
    removable = [p for p in folders if p not in protected]
    excess = max(0, len(folders) - max(keep, len(protected)))
    doomed = removable[:excess]
    for folder in doomed:
        shutil.rmtree(folder, ignore_errors=True)
    return doomed
