"""Policy serving: an OpenAI-compatible CPU server with exact token ids, logprobs and weight hot swap; vLLM (GPU, CPU).

Public names are loaded lazily, so ``import agl.serving`` does not import torch or transformers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from agl._lazy import lazy_exports

if TYPE_CHECKING:
    from agl.serving.chat_format import ParsedOutput, RequestError, parse_tool_calls, prepare_messages
    from agl.serving.models import (
        DEFAULT_MODEL,
        MODELS,
        ModelError,
        ModelHashMismatch,
        ModelMetadataMismatch,
        ModelNotInstalled,
        ModelSpec,
        make_tiny_model,
        model_names,
        prepare_model,
        prepare_smollm2,
        prepare_smollm2_tokenizer,
        prepare_tokenizer,
    )
    from agl.serving.policy_server import PolicyServer, SamplingParams, ServerStats
    from agl.serving.vllm import VllmConfig, VllmNotInstalledError, VllmServer, VllmStartupError, request_params

_EXPORTS = {
    "PolicyServer": "agl.serving.policy_server",
    "SamplingParams": "agl.serving.policy_server",
    "ServerStats": "agl.serving.policy_server",
    "DEFAULT_MODEL": "agl.serving.models",
    "MODELS": "agl.serving.models",
    "ModelError": "agl.serving.models",
    "ModelHashMismatch": "agl.serving.models",
    "ModelMetadataMismatch": "agl.serving.models",
    "ModelNotInstalled": "agl.serving.models",
    "ModelSpec": "agl.serving.models",
    "make_tiny_model": "agl.serving.models",
    "model_names": "agl.serving.models",
    "prepare_model": "agl.serving.models",
    "prepare_smollm2": "agl.serving.models",
    "prepare_smollm2_tokenizer": "agl.serving.models",
    "prepare_tokenizer": "agl.serving.models",
    "ParsedOutput": "agl.serving.chat_format",
    "RequestError": "agl.serving.chat_format",
    "parse_tool_calls": "agl.serving.chat_format",
    "prepare_messages": "agl.serving.chat_format",
    "VllmConfig": "agl.serving.vllm",
    "VllmServer": "agl.serving.vllm",
    "VllmStartupError": "agl.serving.vllm",
    "VllmNotInstalledError": "agl.serving.vllm",
    "request_params": "agl.serving.vllm",
}

__all__ = [
    "DEFAULT_MODEL",
    "MODELS",
    "ModelError",
    "ModelHashMismatch",
    "ModelMetadataMismatch",
    "ModelNotInstalled",
    "ModelSpec",
    "ParsedOutput",
    "PolicyServer",
    "RequestError",
    "SamplingParams",
    "ServerStats",
    "VllmConfig",
    "VllmNotInstalledError",
    "VllmServer",
    "VllmStartupError",
    "make_tiny_model",
    "model_names",
    "parse_tool_calls",
    "prepare_messages",
    "prepare_model",
    "prepare_smollm2",
    "prepare_smollm2_tokenizer",
    "prepare_tokenizer",
    "request_params",
]


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
