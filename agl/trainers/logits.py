"""Logits of the positions a loss reads, and only those.

Agent calls are long prompts with short responses (the SQL writer: ~400 prompt tokens, ~30 response tokens), and
both SFT and LightningRL score the response tokens only. A causal LM's forward pass projects every position onto the
vocabulary (49k entries for SmolLM2), in the forward and again in the backward pass: measured on the SQL demo's
demonstrations, TRL's chunked log-prob kernel over all positions was most of an SFT step with a small model. Here the
decoder runs as usual and the output layer runs on the positions that predict a scored token. The result is the
same as the full forward pass, row for row, where the model's logits are its output layer applied to the decoder's
last hidden state (Llama, Qwen, Mistral, SmolLM2 and most causal LMs); models that scale or cap their logits beyond
that get None and the caller computes them whole.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers.cache_utils import Cache, DynamicLayer

#: Config attributes that change logits after the output layer; a model with any of them set is computed whole.
_LOGIT_TRANSFORMS = ("final_logit_softcapping", "logit_scale", "logits_scaling", "output_multiplier_scale")


def plain_head(model: Any) -> bool:
    """Whether ``model``'s logits are its output layer applied to its decoder's last hidden state (true of Llama,
    Qwen, Mistral, SmolLM2 and most causal LMs, also through a peft wrapper, whose LoRA layers sit inside the
    decoder): then the functions below compute them for chosen positions only."""
    config = getattr(model, "config", None)
    if getattr(model, "get_decoder", None) is None or getattr(model, "get_output_embeddings", None) is None:
        return False
    if config is None or any(getattr(config, name, None) not in (None, 1, 1.0) for name in _LOGIT_TRANSFORMS):
        return False
    return model.get_output_embeddings() is not None


def selected_logits(
    model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor | None, predicts: torch.Tensor
) -> torch.Tensor | None:
    """The logits ``[N, vocab]`` of the positions ``p`` where ``predicts[b, p]`` is true, in row-major order (the
    logits at position ``p`` predict token ``p + 1``), or None when ``model`` is not a ``plain_head`` model (then
    use ``model(...).logits``)."""
    if not plain_head(model):
        return None
    hidden = model.get_decoder()(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)
    return model.get_output_embeddings()(hidden.last_hidden_state[predicts])


class PrefixLayer(DynamicLayer):
    """One decoder layer's keys and values of a shared prompt prefix, safe to replay. The prefix pass's cache *sets*
    them (a replay sets the same again instead of appending a second copy); the continuations' cache
    (``reading``) holds them repeated for the batch and reads them without storing their own (a replay reads the same
    prefix). So a decoder layer that recomputes its activations in the backward pass (``gradient_checkpointing``)
    may keep these caches, where it must drop one that grows."""

    read_only = False

    @classmethod
    def reading(cls, keys: torch.Tensor, values: torch.Tensor) -> PrefixLayer:
        """A layer that returns ``keys``/``values`` followed by each call's own, storing nothing."""
        layer = cls()
        layer.lazy_initialization(keys, values)
        layer.keys, layer.values, layer.read_only = keys, values, True
        return layer

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if self.read_only:
            assert self.keys is not None and self.values is not None, "reading() sets them"
            return torch.cat([self.keys, key_states], dim=-2), torch.cat([self.values, value_states], dim=-2)
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        self.keys, self.values = key_states, value_states
        return key_states, value_states


def shared_prefix_logits(
    model: Any,
    prefix_ids: torch.Tensor,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    predicts: torch.Tensor,
) -> torch.Tensor:
    """The logits ``[N, vocab]`` that predict the tokens ``input_ids[b, j]`` where ``predicts[b, j]`` is true, for
    sequences that all continue the prompt prefix ``prefix_ids`` (``[1, P]``): the decoder runs the prefix once,
    its key/value cache is repeated for the ``B`` continuations (``input_ids``, ``[B, L]``, right-padded as
    ``attention_mask`` says), and token ``j`` is predicted from continuation position ``j - 1``, or from the
    prefix's last position for ``j = 0``. Gradients flow through the shared cache into the prefix, once. Equal to
    the full sequences' logits up to float error; ``model`` must be a ``plain_head`` model."""
    decoder, head = model.get_decoder(), model.get_output_embeddings()
    n, width = input_ids.shape
    length = prefix_ids.shape[1]
    prefix = Cache(layer_class_to_replicate=PrefixLayer)
    head_out = decoder(input_ids=prefix_ids, cache=prefix, use_cache=True)
    recorded: list[Any] = list(prefix.layers)  # PrefixLayer, each set by the prefix pass
    repeated = [(layer.keys.repeat_interleave(n, 0), layer.values.repeat_interleave(n, 0)) for layer in recorded]
    cache = Cache(layers=[PrefixLayer.reading(keys, values) for keys, values in repeated])
    last = head_out.last_hidden_state[:, -1:].expand(n, 1, -1)
    if width == 1:  # every continuation is one token, predicted by the prefix alone
        return head(last[predicts[:, :1]])
    ones = torch.ones((n, length), dtype=attention_mask.dtype, device=attention_mask.device)
    positions = torch.arange(length, length + width - 1, device=input_ids.device).expand(n, -1)
    rest = decoder(
        input_ids=input_ids[:, :-1],
        attention_mask=torch.cat([ones, attention_mask[:, :-1]], dim=1),
        cache=cache,
        position_ids=positions,
        use_cache=True,
    ).last_hidden_state
    return head(torch.cat([last, rest], dim=1)[predicts])
