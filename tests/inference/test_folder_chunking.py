"""Folder corpora for `index` and `ask`: the chunk size is a setting (200-word chunks made each short file one
passage), and the passages carry the Markdown titles."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from selfrag.app.cli import main
from selfrag.errors import ConfigError
from selfrag.inference.ask import load_retriever
from selfrag.inference.retrievers.spec import RetrieverConfig
from selfrag.passages import PassageStore


def _folder(tmp_path: Path) -> Path:
    folder = tmp_path / "docs"
    folder.mkdir()
    body = " ".join(f"word{i}" for i in range(30))
    (folder / "harbour.md").write_text(f"# Harbour of Velm\n\n{body}\n\n## Tides\n\nThe tide turns twice a day.\n")
    return folder


def test_index_takes_chunk_words_and_keeps_heading_titles(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = _folder(tmp_path)
    assert main(["index", f"corpus={folder}", f"output={tmp_path / 'index'}", "chunk_words=10",
                 "chunk_overlap=0"]) == 0
    store = PassageStore(tmp_path / "index" / "passages.sqlite")
    passages = [passage.to_json() for passage in store.by_rows(range(len(store)))]
    assert len(passages) == 4 and passages[0]["title"] == "Harbour of Velm"
    assert passages[-1]["title"] == "Harbour of Velm — Tides" and "#" not in passages[-1]["text"]
    options = json.loads((tmp_path / "index" / "index.json").read_text())["options"]
    assert (options["chunk_words"], options["chunk_overlap"]) == (10, 0)
    code = main(["index", f"corpus={folder}", f"output={tmp_path / 'bad'}", "chunk_words=10", "chunk_overlap=10"])
    assert code == 2 and "chunk_overlap must be in [0, chunk_words)" in capsys.readouterr().err


def test_ask_corpus_folder_takes_chunk_words(tmp_path: Path) -> None:
    folder = _folder(tmp_path)
    assert len(load_retriever(RetrieverConfig(corpus=str(folder))).passages) == 1  # type: ignore[attr-defined]
    small = load_retriever(RetrieverConfig(corpus=str(folder), chunk_words=10, chunk_overlap=0))
    assert len(small.passages) == 4  # type: ignore[attr-defined]
    dense = load_retriever(RetrieverConfig(corpus=str(folder), kind="dense", chunk_words=10, chunk_overlap=0))
    assert len(dense.passages) == 4  # type: ignore[attr-defined]
    with pytest.raises(ConfigError, match="rebuild it with selfrag index"):
        load_retriever(RetrieverConfig(index=str(tmp_path / "index"), chunk_words=10))


def test_ask_cli_passes_the_chunk_settings(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = _folder(tmp_path)
    code = main(["ask", f"model={tmp_path / 'no-model'}", f"retriever.corpus={folder}", "retriever.chunk_words=5",
                 "retriever.chunk_overlap=5", "q?"])
    assert code == 2 and "retriever.chunk_overlap must be in [0, chunk_words)" in capsys.readouterr().err
