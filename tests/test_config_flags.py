"""``agl.config_flags``: a config dataclass's fields become flags whose help is the docstring and whose checks are the
config's own ``__post_init__``; a new field is a new flag with no other change."""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass, field
from typing import Literal

import pytest

from agl.config_flags import add_config_flags, apply_flags, config_from_args, field_docs, replace_fields
from agl.trainers.rl.lightning import LightningRLConfig


@dataclass(frozen=True)
class Inner:
    """Attributes:
    rate: how fast it goes. Default 0.5;
        must be > 0.
    low / high: the bounds of the range.
    """

    rate: float = 0.5
    low: int = 0
    high: int = 10

    def __post_init__(self) -> None:
        if self.rate <= 0:
            raise ValueError(f"inner.rate: must be > 0, got {self.rate}")
        if self.low > self.high:
            raise ValueError("inner: low must be <= high")


@dataclass
class Outer:
    """A test config.

    Section:
        size: items per step (>= 1).
        mode: how it runs: fast or careful.
        cap: at most this many (None = no cap).
        verbose: say more.
        inner: the inner settings.
        tags: not a scalar: no flag.
    """

    size: int = 4
    mode: Literal["fast", "careful"] = "fast"
    cap: int | None = None
    verbose: bool = False
    inner: Inner = field(default_factory=Inner)
    tags: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.size < 1:
            raise ValueError(f"size: must be >= 1, got {self.size}")


def parse(argv: list[str], cls: type = Outer, base: object = None) -> tuple[argparse.ArgumentParser, object]:
    parser = argparse.ArgumentParser(prog="demo")
    flags = add_config_flags(parser, cls, prefix="x", aliases={"size": ["--size"]})
    return parser, config_from_args(parser, parser.parse_args(argv), base or cls(), flags)


def test_docstring_entries_become_help_text() -> None:
    docs = field_docs(Inner)
    assert docs["rate"] == "how fast it goes. Default 0.5; must be > 0."
    assert docs["low"] == docs["high"] == "(low / high) the bounds of the range."
    assert field_docs(Outer)["size"] == "items per step (>= 1)."
    assert "Section" not in field_docs(Outer) and "A test config" not in " ".join(field_docs(Outer).values())


def test_nested_scalar_fields_become_flags_with_their_docstring_help(capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser(prog="demo")
    flags = add_config_flags(parser, Outer, prefix="x", base=Outer(size=6))
    assert list(flags) == ["size", "mode", "cap", "verbose", "inner.rate", "inner.low", "inner.high"]
    assert flags["inner.rate"].options == ("--x.inner.rate",)
    help_text = " ".join(parser.format_help().split())
    assert "--x.inner.rate FLOAT how fast it goes. Default 0.5; must be > 0. [here: 0.5]" in help_text
    assert "--x.size INT items per step (>= 1). [here: 6]" in help_text
    assert "--x.tags" not in help_text


def test_given_flags_replace_nested_fields_of_the_base_immutably() -> None:
    base = Outer(size=2, inner=Inner(rate=0.1))
    _, cfg = parse(["--x.inner.high", "20", "--size", "3", "--x.verbose"], base=base)
    assert isinstance(cfg, Outer)
    assert (cfg.size, cfg.verbose, cfg.inner) == (3, True, Inner(rate=0.1, low=0, high=20))
    assert base == Outer(size=2, inner=Inner(rate=0.1)) and base.inner.high == 10, "the base is left as it was"
    assert parse([], base=base)[1] is base, "no flag given: the base itself"
    assert parse(["--x.cap", "5"])[1].cap == 5  # type: ignore[attr-defined]
    assert parse(["--x.cap", "none"], base=Outer(cap=5))[1].cap is None  # type: ignore[attr-defined]


def test_literal_fields_get_choices(capsys: pytest.CaptureFixture[str]) -> None:
    assert parse(["--x.mode", "careful"])[1].mode == "careful"  # type: ignore[attr-defined]
    with pytest.raises(SystemExit):
        parse(["--x.mode", "reckless"])
    assert "invalid choice: 'reckless' (choose from 'fast', 'careful')" in capsys.readouterr().err


def test_a_value_the_config_refuses_is_a_parser_error_naming_the_flag(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse(["--size", "0"])
    assert "demo: error: argument --x.size/--size: must be >= 1, got 0" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse(["--x.inner.rate", "0"])
    assert "argument --x.inner.rate: must be > 0, got 0.0" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # a check across fields names the flags given
        parse(["--x.inner.low", "11", "--x.size", "2"])
    assert "argument --x.inner.low: inner: low must be <= high" in capsys.readouterr().err
    with pytest.raises(ValueError, match="size: must be >= 1"):
        replace_fields(Outer(), {"size": 0})


def test_a_new_field_is_a_new_flag_with_no_other_change() -> None:
    @dataclass
    class Grown(Outer):
        """More.

        Attributes:
            warmup: steps before the rate applies.
        """

        warmup: int = 0

    parser = argparse.ArgumentParser()
    flags = add_config_flags(parser, Grown, prefix="x")
    assert "warmup" in flags and "steps before the rate applies." in parser.format_help()
    cfg = apply_flags(parser, Grown(), {"warmup": 7}, flags)
    assert cfg.warmup == 7 and dataclasses.replace(cfg, warmup=0) == Grown()


def test_lightningrl_config_gets_a_flag_per_scalar_field() -> None:
    """The real config: nested serving/grpo/update/loss fields, Path-like and non-scalar fields left out."""
    parser = argparse.ArgumentParser()
    flags = add_config_flags(parser, LightningRLConfig, prefix="rl", exclude=["vllm"])
    assert {"update.lr", "update.loss.clip_high", "grpo.group_by", "serving.temperature", "rounds"} <= set(flags)
    assert not {"model_dir", "policies", "air", "checkpoint_dir", "resume_from", "update.lora.r"} & set(flags)
    assert not [p for p in flags if p.startswith("vllm")]
    base = LightningRLConfig(model_dir="m")
    cfg = config_from_args(parser, parser.parse_args(["--rl.update.loss.clip_high", "0.28"]), base, flags)
    assert cfg.update.loss.clip_high == 0.28 and base.update.loss.clip_high == 0.2
