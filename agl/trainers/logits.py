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

#: Config attributes that change logits after the output layer; a model with any of them set is computed whole.
_LOGIT_TRANSFORMS = ("final_logit_softcapping", "logit_scale", "logits_scaling", "output_multiplier_scale")


def selected_logits(
    model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor | None, predicts: torch.Tensor
) -> torch.Tensor | None:
    """The logits ``[N, vocab]`` of the positions ``p`` where ``predicts[b, p]`` is true, in row-major order (the
    logits at position ``p`` predict token ``p + 1``), or None when ``model`` is not a plain decoder plus output
    layer (then use ``model(...).logits``). Works through a peft wrapper (its LoRA layers sit inside the decoder)."""
    decoder = getattr(model, "get_decoder", None)
    head = getattr(model, "get_output_embeddings", None)
    config = getattr(model, "config", None)
    if decoder is None or head is None or config is None:
        return None
    if any(getattr(config, name, None) not in (None, 1, 1.0) for name in _LOGIT_TRANSFORMS):
        return None
    layer = head()
    if layer is None:
        return None
    hidden = decoder()(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).last_hidden_state
    return layer(hidden[predicts])
