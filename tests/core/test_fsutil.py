"""fsutil: UTF-8 errors as file:line, atomic writes that survive a kill, output paths refused before work."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import pytest

from selfrag.errors import InputError
from selfrag.fsutil import (
    check_config_outputs,
    check_output_path,
    read_text,
    remove_stale_temp_files,
    write_json,
    write_text,
)


def test_read_text_names_line_and_column_of_a_bad_byte(tmp_path: Path) -> None:
    path = tmp_path / "notes.txt"
    path.write_bytes("first line\nsecond caf\xe9\n".encode("latin-1"))
    with pytest.raises(InputError) as caught:
        read_text(path, "corpus file")
    assert str(caught.value) == (
        f"{path}:2: not UTF-8 text (byte 0xe9 at column 11); "
        "save the file as UTF-8 (e.g. iconv -f latin1 -t utf-8) or remove that character"
    )


def test_read_text_drops_a_bom_and_reports_missing_files(tmp_path: Path) -> None:
    path = tmp_path / "bom.txt"
    path.write_bytes(b"\xef\xbb\xbfhello")
    assert read_text(path) == "hello"
    with pytest.raises(InputError, match=r"corpus file '.*none.txt' not found; check the path"):
        read_text(tmp_path / "none.txt", "corpus file")
    with pytest.raises(InputError, match="is a directory; pass a file"):
        read_text(tmp_path)


def test_write_json_round_trips_and_leaves_no_temp_file(tmp_path: Path) -> None:
    path = write_json(tmp_path / "deep" / "stats.json", {"records": 3, "name": "café"})
    assert json.loads(path.read_text(encoding="utf-8")) == {"records": 3, "name": "café"}
    assert sorted(p.name for p in path.parent.iterdir()) == ["stats.json"]


def test_failed_rename_keeps_old_file_and_removes_temp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write_text(tmp_path / "config.yaml", "old: 1\n")

    def killed(*args: object) -> None:
        raise KeyboardInterrupt  # the process dies between the temp write and the rename

    monkeypatch.setattr(os, "replace", killed)
    with pytest.raises(KeyboardInterrupt):
        write_text(path, "new: 2\n")
    assert path.read_text() == "old: 1\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.yaml"]


def test_remove_stale_temp_files(tmp_path: Path) -> None:
    (tmp_path / ".config.yaml.tmp-123").write_text("half")
    (tmp_path / "config.yaml").write_text("whole")
    assert [p.name for p in remove_stale_temp_files(tmp_path)] == [".config.yaml.tmp-123"]
    assert [p.name for p in tmp_path.iterdir()] == ["config.yaml"]


def test_output_that_is_an_existing_file(tmp_path: Path) -> None:
    existing = tmp_path / "notes.txt"
    existing.write_text("x")
    with pytest.raises(InputError) as caught:
        check_output_path(existing, key="output")
    assert str(caught.value) == f"output {str(existing)!r} is an existing file, not a directory; give a directory path"


def test_export_a_a_is_refused_before_any_work(tmp_path: Path) -> None:
    # `selfrag export A A` would overwrite the adapter with the merged model.
    adapter = tmp_path / "A"
    adapter.mkdir()
    with pytest.raises(InputError) as caught:
        check_output_path(adapter, key="output", inputs=[adapter])
    assert str(caught.value) == f"output {str(adapter)!r} is also an input; write the output to a new path"
    with pytest.raises(InputError, match="is inside the input directory"):
        check_output_path(adapter / "merged", key="output", inputs=[adapter])
    with pytest.raises(InputError, match="contains the input"):
        check_output_path(tmp_path, key="output", inputs=[adapter / "records.jsonl"])
    assert check_output_path(tmp_path / "B", key="output", inputs=[adapter]) == tmp_path / "B"


@dataclass
class _Config:
    corpus: Path
    output: Path
    model: str = "smollm2-135m-instruct"


def test_check_config_outputs_uses_every_other_path_as_input(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("{}\n")
    with pytest.raises(InputError, match="is an existing file"):
        check_config_outputs(_Config(corpus=corpus, output=corpus))
    (tmp_path / "m").mkdir()
    with pytest.raises(InputError, match="is also an input"):
        check_config_outputs(_Config(corpus=tmp_path / "c", output=tmp_path / "m", model=str(tmp_path / "m")))
    check_config_outputs(_Config(corpus=corpus, output=tmp_path / "out"))
