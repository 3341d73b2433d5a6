from __future__ import annotations

from pathlib import Path

import pytest

from selfrag import models
from selfrag.errors import ModelNotFoundError


def test_unknown_model_name_says_what_is_accepted() -> None:
    with pytest.raises(ModelNotFoundError, match="unknown model 'nonexistent-model'.*smollm2-135m-instruct"):
        models.resolve_model("nonexistent-model")


def test_local_directory_and_hub_id_pass_through(
    tiny_base_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert models.resolve_model(str(tiny_base_dir)) == str(tiny_base_dir)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)  # with hub access, a hub id goes to transformers as is
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    assert models.resolve_model("HuggingFaceTB/SmolLM2-135M-Instruct") == "HuggingFaceTB/SmolLM2-135M-Instruct"
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path / "hub"))
    with pytest.raises(ModelNotFoundError, match="hub downloads are off"):
        models.resolve_model("HuggingFaceTB/SmolLM2-135M-Instruct")
    with pytest.raises(ModelNotFoundError, match="no config.json"):
        models.resolve_model(str(tmp_path))


def test_interrupted_conversion_is_never_loaded(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    calls = []

    def crash(gguf: Path, out: Path) -> None:
        out.mkdir(parents=True)
        (out / "config.json").write_text("{}")  # half-written
        calls.append(out)
        raise RuntimeError("killed")

    monkeypatch.setattr(models, "_convert_gguf", crash)
    monkeypatch.setattr(models, "gguf_path", lambda source: tmp_path / "fake.gguf")
    with pytest.raises(RuntimeError):
        models.convert_alias("smollm2-135m-instruct", cache=tmp_path)
    assert not (tmp_path / "models" / "smollm2-135m-instruct").exists()

    def succeed(gguf: Path, out: Path) -> None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "config.json").write_text("{}")

    monkeypatch.setattr(models, "_convert_gguf", succeed)
    target = models.convert_alias("smollm2-135m-instruct", cache=tmp_path)
    assert (target / models.COMPLETE_MARKER).is_file()
    monkeypatch.setattr(models, "_convert_gguf", crash)
    assert models.convert_alias("smollm2-135m-instruct", cache=tmp_path) == target  # done once, reused


@pytest.mark.slow
def test_default_model_converts_once_and_reloads_fast(tmp_path: Path) -> None:
    """The GGUF is converted once into a safetensors folder that transformers loads directly; a second call reuses
    it untouched (its speed is measured in benchmarks, not asserted here: a loaded machine made that flaky)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target = models.convert_alias("smollm2-135m-instruct", cache=tmp_path)
    weights = sorted(Path(target).glob("*.safetensors"))
    assert weights, f"no safetensors in {target}"
    stamps = {path: path.stat().st_mtime_ns for path in Path(target).iterdir()}
    assert models.convert_alias("smollm2-135m-instruct", cache=tmp_path) == target
    assert {path: path.stat().st_mtime_ns for path in Path(target).iterdir()} == stamps  # not converted again
    model = AutoModelForCausalLM.from_pretrained(str(target))
    tokenizer = AutoTokenizer.from_pretrained(str(target))
    assert model.config.tie_word_embeddings and len(tokenizer) == 49152
    assert tokenizer.chat_template
