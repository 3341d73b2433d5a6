"""`selfrag export` refuses an output that would overwrite or mix with something, before it loads any model."""

from __future__ import annotations

from pathlib import Path

import pytest

from selfrag.artifacts import ModelMeta, save_meta
from selfrag.errors import InputError
from selfrag.reflection import TOKENS, ReflectionIds
from selfrag.training import export as export_module


@pytest.fixture()
def adapter_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A directory that looks like an adapter (selfrag.json); loading it would fail loudly."""
    path = tmp_path / "adapter"
    path.mkdir()
    ids = ReflectionIds.from_json({token: 1000 + index for index, token in enumerate(TOKENS)})
    save_meta(path, ModelMeta(ids, "add", "chat", "smollm2-135m-instruct", "adapter"))

    def must_not_load(*args: object, **kwargs: object) -> None:
        raise AssertionError("the output must be checked before any model is loaded")

    monkeypatch.setattr(export_module, "load_model", must_not_load)
    return path


@pytest.mark.parametrize(
    ("make_output", "message"),
    [
        (lambda adapter: adapter, "is the adapter itself"),
        (lambda adapter: adapter / "merged", "lies inside the adapter directory"),
        (lambda adapter: _file(adapter.parent / "model.bin"), "is an existing file"),
        (lambda adapter: _non_empty(adapter.parent / "full"), "is a non-empty directory"),
    ],
)
def test_bad_outputs_are_refused_up_front(adapter_dir: Path, make_output, message: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(InputError, match=message):
        export_module.export(adapter_dir, make_output(adapter_dir))


def test_a_merged_model_is_not_exported_again(adapter_dir: Path, tmp_path: Path) -> None:
    merged = tmp_path / "merged"
    merged.mkdir()
    ids = ReflectionIds.from_json({token: 1000 + index for index, token in enumerate(TOKENS)})
    save_meta(merged, ModelMeta(ids, "add", "chat", "smollm2-135m-instruct", "merged"))
    with pytest.raises(InputError, match="not an adapter"):
        export_module.export(merged, tmp_path / "again")


def test_cli_has_no_merge_flag_and_refuses_in_one_line(adapter_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from selfrag.app.cli import main

    with pytest.raises(SystemExit):
        main(["export", str(adapter_dir), str(adapter_dir.parent / "x"), "--merge"])
    capsys.readouterr()
    assert main(["export", str(adapter_dir), str(adapter_dir)]) == 2
    err = capsys.readouterr().err
    assert "is the adapter itself" in err and "Traceback" not in err


def _file(path: Path) -> Path:
    path.write_text("weights")
    return path


def _non_empty(path: Path) -> Path:
    path.mkdir()
    (path / "config.json").write_text("{}")
    return path
