"""What a policy server's decoding worker is sent (generations, weight swaps, adapter loads) and what it sends back."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

import torch

MAX_TOP_LOGPROBS = 20


@dataclass(frozen=True)
class SamplingParams:
    """Per-request decoding settings, validated and clamped by the server.

    ``temperature == 0`` means greedy; ``top_p`` keeps the smallest set of tokens whose probability reaches it (the
    most likely token always stays); ``stop`` strings end the response and are cut from its text (the generated ids
    are kept whole); ``seed`` seeds this request's ``torch.Generator``; ``logprobs``/``top_logprobs`` ask for the
    log-probabilities of each sampled token and of the ``top_logprobs`` most likely alternatives, under the
    distribution sampled from: ``log_softmax(logits / temperature)``, at temperature 1 for greedy requests (see
    ``agl.core.types.logprob_temperature``), before top-p truncation.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int = 16
    stop: tuple[str, ...] = ()
    seed: int | None = None
    logprobs: bool = False
    top_logprobs: int = 0


@dataclass(frozen=True)
class ServerStats:
    """Counters of what the worker has done since start; ``max_batch_size_seen`` shows whether batching happened.

    ``abandoned`` counts requests whose client went away before they finished: skipped while queued, or stopped at
    the decoding step after the client left. ``prefix_hits`` counts prompts whose beginning had been prefilled before
    (their ``reused_prompt_tokens`` keys/values were reused instead of computed again), ``prefix_misses`` prompts
    prefilled whole; ``prompt_tokens`` counts every prompt token admitted, reused or not. With several replicas, the
    counters are summed over them and ``max_batch_size_seen`` is the largest batch of any one.
    """

    requests: int = 0
    batches: int = 0
    max_batch_size_seen: int = 0
    generated_tokens: int = 0
    abandoned: int = 0
    prompt_tokens: int = 0
    reused_prompt_tokens: int = 0
    prefix_hits: int = 0
    prefix_misses: int = 0

    def __add__(self, other: ServerStats) -> ServerStats:
        """The counters of two replicas together (``max_batch_size_seen``: the larger)."""
        summed = {name: getattr(self, name) + getattr(other, name) for name in self.__dataclass_fields__}
        return ServerStats(
            **{**summed, "max_batch_size_seen": max(self.max_batch_size_seen, other.max_batch_size_seen)}
        )


@dataclass
class _Started:
    """The request's batch began; it decodes entirely on ``weights_version``."""

    weights_version: str


@dataclass
class _Token:
    """One sampled token of a streamed request, with its logprob entry and the text it releases."""

    token_id: int
    logprob: dict[str, Any] | None
    text_delta: str


@dataclass
class _Finished:
    """The request is done: every generated id, their logprobs, the text (cut at a stop string) and why it ended."""

    token_ids: list[int]
    logprobs: list[dict[str, Any]] | None
    text: str
    finish_reason: str


@dataclass
class _Failed:
    """The request could not be completed; ``status`` is the HTTP status to report (500 or 503)."""

    status: int
    message: str


_Event = _Started | _Token | _Finished | _Failed


@dataclass
class _GenerationRequest:
    """One queued generation. ``deliver`` is thread-safe; ``cancelled`` is set when the client went away."""

    prompt_ids: list[int]
    params: SamplingParams
    stream: bool
    tool_mode: bool
    deliver: Callable[[_Event], None]
    adapter: str | None = None
    """The LoRA adapter the request decodes with (None: the base model); it must be loaded when the request is
    submitted (adapters are never removed, only replaced by newer versions)."""
    cancelled: threading.Event = field(default_factory=threading.Event)


@dataclass
class _Swap:
    """A weight swap queued for the worker; ``done`` is set once applied (or ``error`` is filled)."""

    state_dict: Mapping[str, torch.Tensor]
    version: str
    strict: bool
    share: bool = False  # serve these very tensors instead of copying them into the model's own
    done: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None


@dataclass
class _AdapterLoad:
    """A LoRA adapter (new, or a new version of one) queued for the worker; ``done`` is set once it is served."""

    name: str
    version: str
    config: Any
    weights: Mapping[str, torch.Tensor]
    done: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None


@dataclass
class _Forget:
    """Drop the remembered prompts' keys/values, queued for the worker; ``done`` is set once they are dropped."""

    done: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None


BASE = "__base__"
"""The adapter name peft's mixed-batch forward gives rows that decode on the base model."""


#: A command that changes what the worker serves or remembers: applied in queue order, between decoding steps.
_WeightsCommand = TypeVar("_WeightsCommand", _Swap, _AdapterLoad, _Forget)


class _Shutdown:
    """Queue marker that stops the worker."""


_SHUTDOWN = _Shutdown()
