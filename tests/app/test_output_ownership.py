"""Every command that writes refuses an output that holds an input or files it did not write (issue 34, item 1).

`selfrag index corpus=d/corpus.jsonl output=d` once deleted `d` whole, the corpus and the user's notes with it;
a gold `selfrag generate` into an index folder overwrote the index's config.yaml.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from selfrag.app.cli import main
from selfrag.errors import InputError
from selfrag.fsutil import OWNER_FILE, claim_output, read_owner

DEMO = Path(__file__).resolve().parents[2] / "data_gen" / "demo"


@pytest.fixture()
def corpus(tmp_path: Path) -> Path:
    path = tmp_path / "corpus.jsonl"
    rows = [{"id": "a", "title": "Paris", "text": "Paris is the capital of France."},
            {"id": "b", "title": "Rhine", "text": "The Rhine is a river."}]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_index_into_the_folder_that_holds_its_corpus_deletes_nothing(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    folder = tmp_path / "d"
    folder.mkdir()
    shutil.copy(DEMO / "corpus.jsonl", folder / "corpus.jsonl")
    (folder / "notes.txt").write_text("x\n")
    before = _snapshot(folder)
    assert main(["index", f"corpus={folder / 'corpus.jsonl'}", f"output={folder}"]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "contains the input" in error
    assert _snapshot(folder) == before


def test_index_into_a_folder_of_other_files_is_refused(corpus: Path, tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "notes.txt").write_text("keep me\n")
    assert main(["index", f"corpus={corpus}", f"output={folder}"]) == 2
    error = capsys.readouterr().err
    assert "not written by `selfrag index`" in error and "notes.txt" in error and "nothing was changed" in error
    assert _snapshot(folder) == {"notes.txt": b"keep me\n"}


def test_index_replaces_its_own_index_but_not_a_file_added_to_it(corpus: Path, tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    output = tmp_path / "index"
    assert main(["index", f"corpus={corpus}", f"output={output}"]) == 0
    owner = read_owner(output)
    assert owner is not None and owner["command"] == "index" and "index.json" in owner["files"]
    assert main(["index", f"corpus={corpus}", f"output={output}", "kind=bm25"]) == 0  # its own: rebuilt
    (output / "mine.txt").write_text("keep me\n")
    capsys.readouterr()
    assert main(["index", f"corpus={corpus}", f"output={output}"]) == 2
    assert "mine.txt, which `selfrag index` did not write" in capsys.readouterr().err
    assert (output / "mine.txt").read_text() == "keep me\n"


def test_an_index_an_older_version_wrote_is_refused_in_one_line_and_kept(  # type: ignore[no-untyped-def]
    corpus: Path, tmp_path: Path, capsys
) -> None:
    output = tmp_path / "index"
    output.mkdir()  # a format-1 BM25 index as an older version wrote it: no owner file
    (output / "index.json").write_text(json.dumps({"version": 1, "kind": "bm25", "passages": 2, "options": {}}))
    for name in ("passages.jsonl", "config.yaml", "params.index.json", "vocab.index.json"):
        (output / name).write_text("{}\n")
    before = _snapshot(output)
    capsys.readouterr()
    assert main(["index", f"corpus={corpus}", f"output={output}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not written by `selfrag index`" in err[0] and "give a new or empty directory" in err[0]
    assert _snapshot(output) == before  # nothing rebuilt over it, nothing deleted


def test_generate_into_an_index_folder_overwrites_nothing(corpus: Path, tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    index = tmp_path / "index"
    assert main(["index", f"corpus={corpus}", f"output={index}"]) == 0
    before = _snapshot(index)
    for older in (False, True):
        if older:  # an index written before the owner file existed: its config.yaml is not a generate run's
            (index / OWNER_FILE).unlink()
            before = _snapshot(index)
        capsys.readouterr()
        code = main(["generate", "--config", "configs/data_gen/squad-demo.yaml", f"output={index}", "limit=2"])
        assert code == 2
        assert "not written by `selfrag generate`" in capsys.readouterr().err
        assert _snapshot(index) == before


def test_claim_output_marks_a_new_folder_and_accepts_it_again(tmp_path: Path) -> None:
    output = tmp_path / "out"
    claim_output(output, "eval", key="output_dir")
    assert read_owner(output) == {"command": "eval", "files": []}
    (output / "results.json").write_text("{}")
    claim_output(output, "eval", key="output_dir")  # its own: accepted (the stage's own rerun rules decide)
    with pytest.raises(InputError, match=r"output_dir '.*out' is not empty .*`selfrag calibrate` \(it is the "
                                         r"output of `selfrag eval`\)"):
        claim_output(output, "calibrate", key="output_dir")


def test_claim_output_refuses_an_older_run_without_the_owner_file_and_marks_nothing(tmp_path: Path) -> None:
    output = tmp_path / "old-eval"
    output.mkdir()
    (output / "results.json").write_text("{}")  # an eval folder an older version wrote: no owner file
    with pytest.raises(InputError, match=r"\(it holds results\.json\); nothing was changed: give a new or empty"):
        claim_output(output, "eval")
    assert read_owner(output) is None and sorted(p.name for p in output.iterdir()) == ["results.json"]


def test_claim_output_refuses_a_file(tmp_path: Path) -> None:
    path = tmp_path / "file"
    path.write_text("x")
    with pytest.raises(InputError, match="is an existing file, not a directory"):
        claim_output(path, "eval")


@pytest.mark.parametrize("command", ["eval", "calibrate", "quickstart"])
def test_each_writing_command_refuses_a_folder_of_the_users(command: str, tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "table.md").write_text("my own table\n")
    data = tmp_path / "data.jsonl"
    data.write_text(json.dumps({"id": "q1", "question": "Who?", "answers": ["x"],
                                "ctxs": [{"id": "p", "title": "t", "text": "x"}]}) + "\n")
    args = {
        "eval": ["eval", f"data={data}", "model=m", f"output_dir={folder}"],
        "calibrate": ["calibrate", f"data={data}", "model=m", f"output_dir={folder}"],
        "quickstart": ["quickstart", f"output_dir={folder}"],
    }[command]
    assert main(args) == 2
    assert f"not written by `selfrag {command}`" in capsys.readouterr().err
    assert _snapshot(folder) == {"table.md": b"my own table\n"}
