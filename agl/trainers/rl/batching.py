"""Transitions → padded tensors for the policy loss, split into micro-batches by a token budget.

Token ids are taken exactly as recorded (never re-tokenized). Every per-token tensor is aligned with ``input_ids``:
position ``j`` holds the value for token ``j`` (``response_mask[b, j] = 1`` when token ``j`` is a response token,
``old_logprobs[b, j]`` its behaviour log-prob). The loss shifts logits by one to score token ``j`` from position
``j - 1``. Sequences are right-padded. Pure functions; tensors are built on the CPU and moved by the caller.

Truncation (only with ``max_length``): the prompt is cut from the left so prompt + response fits; the response is
never shortened unless it alone leaves no room for one prompt token, in which case its tail is cut (those tokens are
simply not trained on). A left-truncated prompt changes the context, so the new log-probs drift from the recorded ones;
the clipped ratio bounds the effect. Both cases are counted in ``MicroBatch.truncated``.

Shared prefixes (``share_prefixes``): the calls of one GRPO group send the same prompt, and an agent's later calls
repeat its system prompt and context, so the prompts of a round share long prefixes while the responses are short.
Such calls are laid out as one micro-batch whose ``prefix_ids`` hold the common prefix once: the model runs the prefix
a single time and each sequence's remainder (the rest of its prompt, then its response) over that prefix's key/value
cache. ``input_ids`` and every per-token tensor then cover the remainders only, and token ``j`` of a remainder is
scored from position ``j - 1`` of the remainder, or from the prefix's last position for ``j = 0``. The log-probs are
those of the full sequences up to float error; the prefix's compute and activations are paid once per micro-batch
instead of once per sequence.

Temperature: each sequence carries the temperature its response was sampled at (``Transition.temperature``, or the
caller's default when the call recorded none), as ``logprob_temperature`` maps it: the loss scores the response at
that temperature, the distribution the tokens were drawn from and the one the behaviour log-probs describe. A greedy
call (temperature 0) is scored at temperature 1, like its behaviour log-probs, and counted in ``MicroBatch.greedy``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch

from agl.core.types import Transition, logprob_temperature


@dataclass(frozen=True)
class Sample:
    """One transition laid out as a single token sequence: ``input_ids[response_start:]`` is the response."""

    input_ids: list[int]
    response_start: int
    old_logprobs: list[float]
    advantage: float
    truncated: bool
    temperature: float = 1.0
    greedy: bool = False


def to_sample(transition: Transition, max_length: int | None = None, default_temperature: float = 1.0) -> Sample:
    """Lay out one transition (prompt + response), truncating as the module docstring says; a transition that recorded
    no temperature was sampled at ``default_temperature``."""
    prompt, response, logprobs = transition.prompt_ids, transition.response_ids, transition.response_logprobs
    if not prompt or not response:
        raise ValueError(f"transition {transition.span_id} has no token ids; it cannot be trained on")
    if len(logprobs) != len(response):
        raise ValueError(
            f"transition {transition.span_id}: {len(response)} response tokens but {len(logprobs)} logprobs; "
            "the backend must return one logprob per sampled token"
        )
    if transition.advantage is None:
        raise ValueError(f"transition {transition.span_id} has no advantage: compute advantages first")
    sampled_at = transition.temperature if transition.temperature is not None else default_temperature
    try:
        temperature = logprob_temperature(sampled_at)
    except ValueError as exc:
        raise ValueError(f"transition {transition.span_id}: {exc}") from None
    truncated = False
    if max_length is not None and len(prompt) + len(response) > max_length:
        if max_length < 2:
            raise ValueError(f"max_length: must be >= 2, got {max_length}")
        truncated = True
        response, logprobs = response[: max_length - 1], logprobs[: max_length - 1]
        prompt = prompt[len(prompt) - (max_length - len(response)) :]
    return Sample(
        list(prompt) + list(response),
        len(prompt),
        list(logprobs),
        float(transition.advantage),
        truncated,
        temperature,
        sampled_at == 0,
    )


@dataclass
class MicroBatch:
    """Padded tensors for one forward/backward pass (shapes ``[B, L]`` except ``advantages`` and ``temperatures``:
    ``[B]``, each sequence's scoring temperature). ``truncated``/``greedy`` count the sequences cut to fit and the
    ones sampled greedily. ``prefix_ids`` (``[1, P]``), when set, is a prompt prefix every sequence shares and the
    ``[B, L]`` tensors hold what follows it (see the module docstring)."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    response_mask: torch.Tensor
    old_logprobs: torch.Tensor
    advantages: torch.Tensor
    truncated: int
    temperatures: torch.Tensor
    greedy: int = 0
    prefix_ids: torch.Tensor | None = None

    @property
    def response_tokens(self) -> int:
        return int(self.response_mask.sum().item())

    @property
    def sequences(self) -> int:
        return int(self.input_ids.shape[0])

    def to(self, device: torch.device | str) -> MicroBatch:
        return MicroBatch(
            self.input_ids.to(device),
            self.attention_mask.to(device),
            self.response_mask.to(device),
            self.old_logprobs.to(device),
            self.advantages.to(device),
            self.truncated,
            self.temperatures.to(device),
            self.greedy,
            None if self.prefix_ids is None else self.prefix_ids.to(device),
        )

    @property
    def tokens(self) -> int:
        """Tokens the model reads in this micro-batch: the shared prefix once, then every sequence's own."""
        own = int(self.attention_mask.sum().item())
        return own if self.prefix_ids is None else own + int(self.prefix_ids.shape[1])


def collate(samples: Sequence[Sample], pad_id: int) -> MicroBatch:
    """Right-pad ``samples`` into one ``MicroBatch``."""
    if not samples:
        raise ValueError("collate: no samples")
    width = max(len(s.input_ids) for s in samples)
    n = len(samples)
    input_ids = torch.full((n, width), pad_id, dtype=torch.long)
    attention = torch.zeros((n, width), dtype=torch.long)
    response = torch.zeros((n, width), dtype=torch.float32)
    old = torch.zeros((n, width), dtype=torch.float32)
    for b, s in enumerate(samples):
        length, start = len(s.input_ids), s.response_start
        input_ids[b, :length] = torch.tensor(s.input_ids, dtype=torch.long)
        attention[b, :length] = 1
        response[b, start:length] = 1.0
        old[b, start:length] = torch.tensor(s.old_logprobs, dtype=torch.float32)
    advantages = torch.tensor([s.advantage for s in samples], dtype=torch.float32)
    temperatures = torch.tensor([s.temperature for s in samples], dtype=torch.float32)
    truncated, greedy = sum(s.truncated for s in samples), sum(s.greedy for s in samples)
    return MicroBatch(input_ids, attention, response, old, advantages, truncated, temperatures, greedy)


def collate_shared(samples: Sequence[Sample], prefix_length: int, pad_id: int) -> MicroBatch:
    """One ``MicroBatch`` of ``samples`` whose first ``prefix_length`` tokens are the same prompt tokens: the prefix
    once in ``prefix_ids``, each sample's remainder right-padded in the ``[B, L]`` tensors."""
    if len(samples) < 2:
        raise ValueError("collate_shared: a shared prefix needs at least two samples")
    prefix = samples[0].input_ids[:prefix_length]
    if prefix_length < 1 or any(
        s.input_ids[:prefix_length] != prefix or s.response_start < prefix_length for s in samples
    ):
        raise ValueError(f"collate_shared: the samples do not share a {prefix_length}-token prompt prefix")
    rest = [
        replace(
            s,
            input_ids=s.input_ids[prefix_length:],
            response_start=s.response_start - prefix_length,
        )
        for s in samples
    ]
    batch = collate(rest, pad_id)
    batch.prefix_ids = torch.tensor([prefix], dtype=torch.long)
    return batch


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two token sequences."""
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def plan_shared(
    samples: Sequence[Sample], token_budget: int, min_shared: int
) -> tuple[list[tuple[int, list[int]]], list[int]]:
    """Group samples whose prompts share at least ``min_shared`` leading tokens: ``([(prefix length, indices)],
    the other indices)``. Prompts are sorted so that similar ones are neighbours, then gathered greedily while the
    group's remainders, padded (count × longest remainder), stay within ``token_budget`` (the shared prefix is read
    once and not counted) and the common prefix stays at least ``min_shared`` tokens. A group of one is not shared.
    Deterministic."""
    order = sorted(range(len(samples)), key=lambda i: (samples[i].input_ids[: samples[i].response_start], i))
    groups: list[tuple[int, list[int]]] = []
    single: list[int] = []

    def close(prefix: int, members: list[int]) -> None:
        if len(members) > 1:
            groups.append((prefix, members))
        else:
            single.extend(members)

    members: list[int] = []
    prefix = 0
    for i in order:
        prompt = samples[i].input_ids[: samples[i].response_start]
        if members:
            shared = min(prefix, common_prefix(samples[members[0]].input_ids[:prefix], prompt))
            widest = max(len(samples[j].input_ids) - shared for j in [*members, i])
            if shared >= min_shared and (len(members) + 1) * widest <= token_budget:
                members.append(i)
                prefix = shared
                continue
            close(prefix, members)
        members, prefix = [i], len(prompt)
    if members:
        close(prefix, members)
    return groups, sorted(single)


def plan_micro_batches(lengths: Sequence[int], token_budget: int) -> list[list[int]]:
    """Group sequence indices so each group's padded size (count × longest) stays within ``token_budget``.

    Indices are sorted by length (longest first, ties by index) so similar lengths share a batch and padding stays
    small; a sequence longer than the budget gets a batch of its own. Deterministic.
    """
    if token_budget < 1:
        raise ValueError(f"token_budget: must be >= 1, got {token_budget}")
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    plans: list[list[int]] = []
    current: list[int] = []
    for i in order:
        width = lengths[current[0]] if current else lengths[i]
        if current and (len(current) + 1) * width > token_budget:
            plans.append(current)
            current = []
        current.append(i)
    if current:
        plans.append(current)
    return plans


def make_micro_batches(
    transitions: Sequence[Transition],
    *,
    token_budget: int,
    pad_id: int,
    max_length: int | None = None,
    default_temperature: float = 1.0,
    share_prefixes: int | None = None,
) -> list[MicroBatch]:
    """Lay out, plan and collate ``transitions`` (each must have token ids, logprobs and an advantage; those without a
    recorded temperature were sampled at ``default_temperature``). With ``share_prefixes`` = N, prompts that share
    at least N leading tokens are batched over their common prefix (``plan_shared``), the rest as full sequences."""
    samples = [to_sample(t, max_length, default_temperature) for t in transitions]
    shared: list[tuple[int, list[int]]] = []
    rest = list(range(len(samples)))
    if share_prefixes is not None:
        shared, rest = plan_shared(samples, token_budget, share_prefixes)
    batches = [collate_shared([samples[i] for i in members], prefix, pad_id) for prefix, members in shared]
    plans = plan_micro_batches([len(samples[i].input_ids) for i in rest], token_budget)
    return batches + [collate([samples[rest[i]] for i in plan], pad_id) for plan in plans]
