"""Config fields that moved into nested configs keep working under their old names, for one minor version, with a
warning that names the new place."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

import agl
from agl.trainers.config import MOVED_FIELDS_REMOVED_IN, LoraConfig
from agl.trainers.rl.lightning import MOVED_RL_FIELDS
from agl.trainers.rl.update_config import LossConfig, UpdateConfig
from agl.trainers.sft.config import MOVED_SFT_FIELDS, SFTConfig


def field_paths(cls: type[Any], prefix: str = "") -> set[str]:
    paths = set()
    for f in dataclasses.fields(cls):
        paths.add(prefix + f.name)
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        if dataclasses.is_dataclass(default):
            paths |= field_paths(type(default), f"{prefix}{f.name}.")
    return paths


@pytest.mark.parametrize(("cls", "moves"), [(agl.LightningRLConfig, MOVED_RL_FIELDS), (SFTConfig, MOVED_SFT_FIELDS)])
def test_every_moved_name_is_gone_and_points_at_a_field_that_exists(cls: type[Any], moves: dict[str, str]) -> None:
    paths = field_paths(cls)
    assert not set(moves) & paths, "an old name that is still a field would never reach its new place"
    assert set(moves.values()) <= paths


def test_an_old_keyword_warns_with_its_new_place_and_lands_there() -> None:
    with pytest.warns(DeprecationWarning, match=r"LightningRLConfig\(lr=\.\.\.\) moved to LightningRLConfig\(update="):
        cfg = agl.LightningRLConfig(model_dir="m", lr=3e-4)  # type: ignore[call-arg]
    assert cfg.update.lr == 3e-4
    with pytest.warns(DeprecationWarning, match=r"update=UpdateConfig\(loss=LossConfig\(kl_beta=\.\.\.\)\)\)"):
        cfg = agl.LightningRLConfig(
            model_dir="m",
            kl_beta=0.05,  # type: ignore[call-arg]
            update=UpdateConfig(micro_batch_tokens=64),
        )
    assert (cfg.update.loss.kl_beta, cfg.update.micro_batch_tokens) == (0.05, 64), "the given nested config is kept"
    with pytest.warns(DeprecationWarning, match=f"stops working in agl {MOVED_FIELDS_REMOVED_IN}"):
        sft = SFTConfig(model_dir="m", temperature=0.3, lora_r=4, lora=LoraConfig())  # type: ignore[call-arg]
    assert sft.serving.temperature == 0.3 and sft.lora is not None and sft.lora.r == 4


def test_a_moved_value_meets_the_checks_of_its_new_config() -> None:
    with pytest.warns(DeprecationWarning), pytest.raises(ValueError, match="clip_low"):
        agl.LightningRLConfig(model_dir="m", clip_low=-1.0)  # type: ignore[call-arg]
    assert LossConfig(clip_low=0.1).clip_low == 0.1


def test_a_moved_field_whose_parent_is_off_is_an_error_naming_the_new_place() -> None:
    with pytest.raises(TypeError, match=r"LightningRLConfig\.update\.lora\.r: its parent is None"):
        agl.LightningRLConfig(model_dir="m", lora_r=8, update=UpdateConfig(lora=None))  # type: ignore[call-arg]
