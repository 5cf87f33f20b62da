"""Settings shared by the trainers that train weights (LightningRL, SFT and the policy update): how the policy is
served and published (``ServingConfig``) and the LoRA adapter they train (``LoraConfig``). Pure data, no torch; each
is nested once in ``LightningRLConfig``, ``SFTConfig`` and ``UpdateConfig`` rather than copied field by field."""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import json
import math
import struct
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

C = TypeVar("C")

#: ``ServingConfig``'s fields, which were once fields of ``LightningRLConfig`` and ``SFTConfig`` themselves.
SERVING_FIELDS = ("llm_resource", "policy_resource", "model_name", "max_batch_size", "temperature", "max_tokens")
#: The release in which the keyword arguments of moved config fields (``moved_fields``) stop being accepted.
MOVED_FIELDS_REMOVED_IN = "0.3"

#: Above this many parameters a model trained on a CPU gets a LoRA adapter by default (``AutoLora``): full
#: fine-tuning of Qwen2.5-Coder-0.5B in fp32 holds 2.5 GB of weights, 2.5 GB of gradients and 5 GB of AdamW state,
#: where its LoRA adapter (r 16, every linear layer) trains 8.8M parameters; SmolLM2-135M stays fully fine-tuned.
LORA_AUTO_PARAMETERS = 200_000_000


@dataclass(frozen=True)
class LoraConfig:
    """A LoRA adapter (peft) trained instead of all weights.

    Attributes:
        r: the adapter's rank. Default 16.
        alpha: its scale (``lora_alpha``). Default 32.
        dropout: dropout on the adapter's input. Default 0.0.
        target_modules: the modules it wraps: ``"all-linear"`` (default) or a list of module names such as
            ``["q_proj", "v_proj"]``.
    """

    r: int = 16
    alpha: int = 32
    dropout: float = 0.0
    target_modules: str | tuple[str, ...] = "all-linear"

    def __post_init__(self) -> None:
        if self.r < 1:
            raise ValueError(f"lora.r: must be >= 1, got {self.r}")
        if self.alpha <= 0:
            raise ValueError(f"lora.alpha: must be > 0, got {self.alpha}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"lora.dropout: must be in [0, 1), got {self.dropout}")
        if not isinstance(self.target_modules, str):
            object.__setattr__(self, "target_modules", tuple(self.target_modules))

    def peft(self) -> Any:
        """The ``peft.LoraConfig`` of a causal language model with these settings (imports peft)."""
        from peft import LoraConfig as PeftLoraConfig

        modules = self.target_modules if isinstance(self.target_modules, str) else list(self.target_modules)
        return PeftLoraConfig(
            r=self.r, lora_alpha=self.alpha, lora_dropout=self.dropout, target_modules=modules, task_type="CAUSAL_LM"
        )


@dataclass(frozen=True)
class AutoLora(LoraConfig):
    """The default of ``SFTConfig.lora`` and ``UpdateConfig.lora``: a LoRA adapter with these settings when the model
    has more than ``LORA_AUTO_PARAMETERS`` parameters and trains on a CPU, else full weights (None).
    ``resolve_lora`` decides, once the model folder and the device are known; give ``LoraConfig(...)`` or None to
    choose yourself."""


def parameter_count(model_dir: str | Path) -> int | None:
    """Parameters of the model in a ``save_pretrained`` folder, read from its safetensors headers (no torch, no
    weights loaded); None when the folder holds no safetensors file."""
    total, seen = 0, False
    for path in sorted(Path(model_dir).glob("*.safetensors")):
        with path.open("rb") as f:
            (size,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(size))
        for name, tensor in header.items():
            if name != "__metadata__":
                total += math.prod(tensor["shape"])
        seen = True
    return total if seen else None


def on_accelerator(device: str) -> bool:
    """Whether a trainer's ``device`` setting (``"auto"``, ``"cpu"``, ``"cuda"``, ``"cuda:1"``...) trains off the
    CPU: ``"auto"`` means CUDA when a GPU is visible."""
    if device != "auto":
        return device != "cpu"
    if importlib.util.find_spec("torch") is None:
        return False
    import torch

    return bool(torch.cuda.is_available())


def resolve_lora(lora: LoraConfig | None, model_dir: str | Path, device: str) -> LoraConfig | None:
    """What ``lora`` means for ``model_dir`` trained on ``device``: ``AutoLora`` becomes a plain ``LoraConfig`` with
    its settings (a model over ``LORA_AUTO_PARAMETERS`` parameters on a CPU) or None (full weights); a ``LoraConfig``
    or None given is kept."""
    if not isinstance(lora, AutoLora):
        return lora
    count = parameter_count(model_dir)
    if count is None or count <= LORA_AUTO_PARAMETERS or on_accelerator(device):
        return None
    return LoraConfig(r=lora.r, alpha=lora.alpha, dropout=lora.dropout, target_modules=lora.target_modules)


@dataclass(frozen=True)
class ServingConfig:
    """How a trainer serves the policy it trains and names it in the resources it publishes.

    Attributes:
        llm_resource: name of the ``LLM`` resource the agent calls. Default ``"main_llm"``.
        policy_resource: name of the ``ModelWeights`` resource describing the served weights. Default ``"policy"``.
        model_name: the model name the local policy server answers to (vLLM serves each version under its version
            name). Default ``"policy"``.
        max_batch_size: requests the local server decodes together. Default 8; raise it with many runners.
        temperature / max_tokens: default sampling of the published ``LLM`` resource (the agent may override them per
            call). Default 1.0 / 256: sampling near temperature 1 gives a group of rollouts the diversity that RL's
            advantages and rejection sampling need.
    """

    llm_resource: str = "main_llm"
    policy_resource: str = "policy"
    model_name: str = "policy"
    max_batch_size: int = 8
    temperature: float = 1.0
    max_tokens: int = 256

    def __post_init__(self) -> None:
        for name in ("max_batch_size", "max_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"serving.{name}: must be >= 1, got {getattr(self, name)}")
        if not self.temperature >= 0.0:
            raise ValueError(f"serving.temperature: must be >= 0, got {self.temperature}")
        if self.llm_resource == self.policy_resource:
            raise ValueError("serving: llm_resource and policy_resource must be different names")


def moved_fields(moves: Mapping[str, str]) -> Callable[[type[C]], type[C]]:
    """Class decorator for a config dataclass whose fields moved into nested configs (``{"lr": "update.lr"}``): the
    old keyword argument keeps working until ``MOVED_FIELDS_REMOVED_IN``, with a ``DeprecationWarning`` that names
    the new place, and its value lands there before the config's own checks run (over a nested config given
    alongside it, e.g. ``update=UpdateConfig(micro_batch_tokens=64), lr=1e-4``)."""

    def decorate(cls: type[C]) -> type[C]:
        init = cls.__init__
        defaults = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]

        @functools.wraps(init)
        def __init__(self: C, *args: Any, **kwargs: Any) -> None:
            for old in [k for k in kwargs if k in moves]:
                value = kwargs.pop(old)
                top, *rest = moves[old].split(".")
                current = kwargs[top] if top in kwargs else _field_default(defaults[top])
                warnings.warn(
                    f"{cls.__name__}({old}=...) moved to {_spelled(cls.__name__, moves[old], current)}; the old name "
                    f"stops working in agl {MOVED_FIELDS_REMOVED_IN}",
                    DeprecationWarning,
                    stacklevel=2,
                )
                kwargs[top] = _replaced(current, rest, value)
            init(self, *args, **kwargs)

        cls.__init__ = __init__  # type: ignore[method-assign,assignment]
        return cls

    return decorate


def _field_default(f: dataclasses.Field[Any]) -> Any:
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return f.default


def _replaced(config: Any, path: list[str], value: Any) -> Any:
    """``config`` with the field at ``path`` set to ``value`` (nested configs replaced, so their checks run)."""
    if not path:
        return value
    name, *rest = path
    return dataclasses.replace(config, **{name: _replaced(getattr(config, name), rest, value)})


def _spelled(owner: str, path: str, current: Any) -> str:
    """How the new place is written, ``LightningRLConfig(update=UpdateConfig(loss=LossConfig(kl_beta=...)))``, where
    ``current`` is the config at the path's first name; a TypeError when a config on the way is off (None)."""
    top, *rest = path.split(".")
    configs = [current]
    for name in rest[:-1]:
        configs.append(getattr(configs[-1], name))
    inner = "..."
    for name, config in zip(reversed(rest), reversed(configs), strict=True):
        if not dataclasses.is_dataclass(config) or isinstance(config, type):
            raise TypeError(f"{owner}.{path}: its parent is {config!r}, so it cannot be set; give the nested config")
        inner = f"{type(config).__name__}({name}={inner})"
    return f"{owner}({top}={inner})"
