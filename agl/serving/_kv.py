"""The decoding engine's keys/values: rows' caches padded and merged into one batch, a cache layer that grows in
place, and the remembered prompt prefixes a new request skips the prefill of."""

from __future__ import annotations

from typing import Any

import torch


def _left_pad(tensor: torch.Tensor, width: int, dim: int = -2) -> torch.Tensor:
    """``tensor`` with ``width`` zero positions prepended along ``dim`` (masked out by the attention mask)."""
    if width == 0:
        return tensor
    shape = list(tensor.shape)
    shape[dim] = width
    return torch.cat([tensor.new_zeros(shape), tensor], dim=dim)


def _cache_layers(cache: Any) -> list[Any]:
    """The cache's per-layer key/value holders when rows can be merged into it, else an empty list.

    Only plain full-attention layers (``_RoomyLayer``: ``keys``/``values`` of shape [batch, heads, seq, dim]) can
    be padded and concatenated; with a cache of any other kind (sliding windows, older transformers) newcomers wait
    for the next batch.
    """
    layers = list(getattr(cache, "layers", None) or [])
    if not all(type(layer) is _RoomyLayer and layer.is_initialized for layer in layers):
        return []
    return layers


def _roomy_layer_class() -> type[Any] | None:
    """A ``DynamicLayer`` that appends in place into spare room instead of concatenating at every step.

    transformers' ``DynamicLayer`` grows its keys/values with ``torch.cat`` at each decoding step: every step copies
    the whole cache of every layer (measured with SmolLM2-135M, 8 rows of ~450 tokens, one CPU thread: 10-15% of a
    decoding step, a third of it under the profiler). This layer keeps its keys/values in buffers with room to grow;
    ``keys``/``values`` are views of the filled part. The engine may still replace ``keys``/``values`` (dropping
    rows, trimming padding, merging newcomers): the next ``update`` sees the views it handed out were replaced and
    copies once into a new buffer. Appends write only past the end of every view handed out, so a view kept elsewhere
    (a remembered prompt prefix) never changes. None on transformers releases without per-layer cache objects.
    """
    try:
        from transformers.cache_utils import DynamicLayer
    except ImportError:
        return None

    class RoomyLayer(DynamicLayer):
        _buffers: tuple[torch.Tensor, torch.Tensor] | None = None
        _handed: tuple[torch.Tensor, torch.Tensor] | None = None  # the views ``keys``/``values`` were last set to

        def update(
            self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
        ) -> tuple[torch.Tensor, torch.Tensor]:
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
            length = self.get_seq_length()
            end = length + key_states.shape[-2]
            handed = self._handed
            in_place = (
                self._buffers is not None
                and handed is not None
                and self.keys is handed[0]
                and self.values is handed[1]
                and end <= self._buffers[0].shape[-2]
            )
            if not in_place:
                self._buffers = self._grown(key_states, value_states, end)
            keys, values = self._buffers  # type: ignore[misc]
            keys[:, :, length:end] = key_states
            values[:, :, length:end] = value_states
            self.keys, self.values = keys[:, :, :end], values[:, :, :end]
            self._handed = (self.keys, self.values)
            return self.keys, self.values

        def _grown(
            self, key_states: torch.Tensor, value_states: torch.Tensor, needed: int
        ) -> tuple[torch.Tensor, torch.Tensor]:
            """New buffers with room past ``needed`` positions, holding the current keys/values."""
            length = self.get_seq_length()
            capacity = needed + max(64, needed // 4)
            grown = []
            for current, new in ((self.keys, key_states), (self.values, value_states)):
                buffer = new.new_empty((*new.shape[:2], capacity, new.shape[-1]))
                if length and current is not None:
                    buffer[:, :, :length] = current
                grown.append(buffer)
            return grown[0], grown[1]

    return RoomyLayer


_RoomyLayer = _roomy_layer_class()


MIN_REUSED_PREFIX = 16
"""Prompt tokens a new request must share with a remembered prompt for its keys/values to be reused."""


PREFIX_CACHE_BYTES = 512 * 2**20
"""Default memory a policy server keeps remembered prompt keys/values in (all replicas together).

One prompt token costs ``layers x 2 x kv_heads x head_dim x bytes per value``: 46 KiB for SmolLM2-135M in fp32, so
a 260-token SQL-agent prompt (system prompt + schema + question) takes 12 MiB and this budget holds ~40 of them.
The agent's few (prompt kind x database) beginnings then stay remembered while 8 runners interleave; the old fixed
four entries were evicted before their next use.
"""


class _PromptPrefixes:
    """The keys/values of recently prefilled prompts, so a prompt that starts the same way (an agent's system
    prompt, a shared schema) skips that part of its prefill.

    Entries hold one row's cache tensors ([1, heads, prompt length, head dim] per layer), which the engine never
    changes in place (a cache layer appends only past the end of the views it handed out). Their memory (the
    storage behind each tensor) is kept within ``max_bytes``: the least recently used entries (remembered or reused)
    go first, and a prompt bigger than the whole budget is not remembered. Keys/values depend on the weights: each
    entry belongs to the peft adapter (one version of one LoRA adapter, or ``BASE``) that computed it and serves only
    rows of that adapter; a swap of the base weights clears them all, a retired adapter version drops its own. Only
    the worker thread uses an instance.
    """

    def __init__(self, max_bytes: int = PREFIX_CACHE_BYTES) -> None:
        self.max_bytes = max_bytes
        # Most recently used first: (adapter key, prompt ids, per-layer keys/values, bytes).
        self._entries: list[tuple[str, list[int], list[tuple[torch.Tensor, torch.Tensor]], int]] = []

    @property
    def bytes(self) -> int:
        """Memory the remembered keys/values take."""
        return sum(entry[3] for entry in self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self, adapter_key: str | None = None) -> None:
        """Forget every entry, or only those of ``adapter_key``."""
        self._entries = [entry for entry in self._entries if adapter_key is not None and entry[0] != adapter_key]

    def remember(self, adapter_key: str, prompt: list[int], layers: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Keep ``prompt``'s per-layer keys/values, dropping the least recently used entries beyond the budget."""
        if not layers:
            return
        size = sum(_storage_bytes(keys) + _storage_bytes(values) for keys, values in layers)
        kept = [entry for entry in self._entries if (entry[0], entry[1]) != (adapter_key, prompt)]
        if size > self.max_bytes:
            self._entries = kept
            return
        entries = [(adapter_key, list(prompt), layers, size)]
        total = size
        for entry in kept:
            if total + entry[3] > self.max_bytes:
                break
            entries.append(entry)
            total += entry[3]
        self._entries = entries

    def longest(
        self, adapter_key: str, prompt: list[int]
    ) -> tuple[int, list[tuple[torch.Tensor, torch.Tensor]]] | None:
        """The longest prefix of ``prompt`` remembered for ``adapter_key`` (at least ``MIN_REUSED_PREFIX`` tokens,
        leaving at least the prompt's last token to run) and its keys/values, or None. The entry it comes from counts
        as just used."""
        best: tuple[int, int] | None = None  # (length, entry index)
        for index, (key, ids, _, _) in enumerate(self._entries):
            if key != adapter_key:
                continue
            limit = min(len(ids), len(prompt) - 1)
            length = 0
            while length < limit and ids[length] == prompt[length]:
                length += 1
            if length >= MIN_REUSED_PREFIX and (best is None or length > best[0]):
                best = (length, index)
        if best is None:
            return None
        entry = self._entries.pop(best[1])
        self._entries.insert(0, entry)
        return best[0], entry[2]


def _storage_bytes(tensor: torch.Tensor) -> int:
    """The memory a tensor keeps alive: its whole storage (a view of a cache buffer holds the buffer's spare room)."""
    return int(tensor.untyped_storage().nbytes())


def _new_cache(model: Any) -> Any:
    """A cache for one batch: transformers' own, its plain full-attention layers replaced by ``_RoomyLayer``s."""
    from transformers import DynamicCache

    try:
        cache = DynamicCache(config=model.config)
    except TypeError:  # transformers releases before the ``config`` argument
        return DynamicCache()
    layers = getattr(cache, "layers", None)
    if _RoomyLayer is not None and layers and all(type(layer) is _RoomyLayer.__base__ for layer in layers):
        cache.layers = [_RoomyLayer() for _ in layers]
    return cache
