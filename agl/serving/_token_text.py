"""The text and exact bytes of single token ids, for logprob entries."""

from __future__ import annotations

from typing import Any


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map used by byte-level BPE vocabularies."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    printable += list(range(ord("®"), ord("ÿ") + 1))
    mapping = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in mapping:
            mapping[b] = chr(256 + extra)
            extra += 1
    return mapping


class _TokenText:
    """Text and exact bytes of single token ids, cached. Byte-level BPE pieces are mapped back to their raw bytes."""

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer
        self._byte_of = {ch: b for b, ch in _bytes_to_unicode().items()}
        self._cache: dict[int, tuple[str, list[int]]] = {}

    def __call__(self, token_id: int) -> tuple[str, list[int]]:
        cached = self._cache.get(token_id)
        if cached is None:
            piece = self._tokenizer.convert_ids_to_tokens(token_id)
            if isinstance(piece, str) and piece and all(ch in self._byte_of for ch in piece):
                raw = bytes(self._byte_of[ch] for ch in piece)
            else:
                raw = self._tokenizer.decode([token_id]).encode("utf-8")
            cached = (raw.decode("utf-8", errors="replace"), list(raw))
            self._cache[token_id] = cached
        return cached

    def entry(self, token_id: int, logprob: float) -> dict[str, Any]:
        text, raw = self(token_id)
        return {"token": text, "logprob": logprob, "bytes": raw}
