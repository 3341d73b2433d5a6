"""`selfrag index` then `selfrag ask` over several questions with one model load (issue 7, item 5)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from selfrag.app.cli import main


@pytest.fixture(scope="module")
def model_dir(merged_model_dir) -> Path:  # type: ignore[no-untyped-def]
    return merged_model_dir(2)  # type: ignore[no-any-return]


@pytest.fixture()
def corpus(tmp_path: Path) -> Path:
    path = tmp_path / "corpus.jsonl"
    rows = [{"id": "a", "title": "Paris", "text": "Paris is the capital of France."},
            {"id": "b", "title": "Rhine", "text": "The Rhine is a river."}]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def test_index_then_ask_many_questions_with_one_load(model_dir, corpus, tmp_path, capsys, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from selfrag.inference.engines import hf

    assert main(["index", f"corpus={corpus}", f"output={tmp_path / 'index'}"]) == 0
    assert "bm25 index of 2 passages" in capsys.readouterr().out
    loads = []
    original = hf.HFEngine.__init__

    def counting(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        loads.append(args)
        original(self, *args, **kwargs)

    monkeypatch.setattr(hf.HFEngine, "__init__", counting)
    questions = tmp_path / "questions.txt"
    questions.write_text('What is the capital of France?\n\n{"question": "Which river?"}\nWho?\n')
    code = main(["ask", f"model={model_dir}", f"retriever.index={tmp_path / 'index'}", "--questions", str(questions),
                 "--json", "inference.mode=always", "inference.top_k=2", "inference.max_tokens=4",
                 "inference.engine_options.batch_size=2"])
    assert code == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [line["question"] for line in lines] == ["What is the capital of France?", "Which river?", "Who?"]
    assert all("answer" in line and line["trace"] for line in lines)
    assert len(loads) == 1

    monkeypatch.setattr("sys.stdin", io.StringIO("What is the capital of France?\n"))
    argv = ["ask", f"model={model_dir}", f"retriever.corpus={corpus}", "--questions", "-", "inference.max_tokens=3"]
    assert main(argv) == 0
    assert "decisions:" in capsys.readouterr().out


@pytest.mark.parametrize(
    "extra, fragment",
    [
        ([], "no question given"),
        (["q?", "--questions", "-"], "give one question, or --questions"),
        (["--questions", "missing.txt"], "does not exist"),
    ],
)
def test_ask_argument_mistakes_are_one_line(extra, fragment, corpus, capsys) -> None:  # type: ignore[no-untyped-def]
    code = main(["ask", "model=m", f"retriever.corpus={corpus}", *extra])
    err = capsys.readouterr().err
    assert code == 2 and fragment in err and "Traceback" not in err


def test_ask_needs_exactly_one_retriever(model_dir, corpus, tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    code = main(["ask", f"model={model_dir}", "q?"])
    assert code == 2 and "retriever: no passages; set retriever.index=DIR" in capsys.readouterr().err
    code = main(["ask", f"model={model_dir}", f"retriever.index={tmp_path}", f"retriever.corpus={corpus}", "q?"])
    assert code == 2 and "set one of index, url, corpus" in capsys.readouterr().err
    code = main(["ask", f"model={model_dir}", f"retriever.index={tmp_path}", "q?"])
    assert code == 2 and "selfrag index" in capsys.readouterr().err


def test_unknown_engine_option_is_reported(corpus, capsys) -> None:  # type: ignore[no-untyped-def]
    code = main(["ask", "model=m", f"retriever.corpus={corpus}", "q?", "inference.engine=tgi",
                 "inference.engine_options.dtyp=x"])
    err = capsys.readouterr().err
    assert code == 2 and "inference.engine must be one of" in err
    assert "did you mean 'inference.engine_options.dtype'" in err
