"""eval and calibrate refuse questions the model was trained on (its trained-questions.json, written by train).

Before: the README's own-data path trained on questions marked dev and test, and neither command said a word."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from selfrag.app.cli import main
from selfrag.artifacts import save_trained_questions
from selfrag.corpus import load_queries
from selfrag.evaluation.data import check_not_trained_on, load_examples

OWN = Path(__file__).resolve().parents[1] / "assets" / "own_data"
QUESTIONS, CORPUS = OWN / "questions.jsonl", OWN / "corpus.jsonl"


def model_trained_on(tmp_path: Path, splits: tuple[str, ...]) -> Path:
    """A model folder that says it trained on the example's questions of ``splits`` (a case and spacing variant of
    each: the comparison is by words, case-folded). Nothing else is there: the refusal comes before any model loads."""
    model = tmp_path / "model"
    model.mkdir()
    texts = [f"  {q.question.upper()} " for q in load_queries(QUESTIONS) if q.meta.get("split") in splits]
    save_trained_questions(model, texts)
    return model


@pytest.mark.parametrize("command, split", [("eval", "test"), ("calibrate", "dev")])
def test_questions_the_model_trained_on_are_refused_in_one_line(
    command: str, split: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = model_trained_on(tmp_path, ("train", split))
    argv = [command, f"model={model}", f"data={QUESTIONS}", f"split={split}", f"retriever.corpus={CORPUS}"]
    argv += [f"output_dir={tmp_path / 'out'}"] if command == "eval" else []
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"3 of 3 questions of {QUESTIONS} split={split}" in err and "trained-questions.json" in err
    assert "allow_trained_questions=true" in err and "split=train" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_unseen_questions_pass_and_the_override_warns(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    model = model_trained_on(tmp_path, ("train", "dev"))
    test = load_examples(QUESTIONS, split="test")
    assert check_not_trained_on(test, str(model), QUESTIONS, "test", "eval", allow=False) == 0
    dev = load_examples(QUESTIONS, split="dev")
    with caplog.at_level(logging.WARNING):
        assert check_not_trained_on(dev, str(model), QUESTIONS, "dev", "calibrate", allow=True) == 3
    assert "measured anyway (allow_trained_questions=true)" in caplog.text
    # a model that does not say what it trained on (from elsewhere, or trained before the file) is not checked
    assert check_not_trained_on(dev, str(tmp_path), QUESTIONS, "dev", "calibrate", allow=False) == 0
    assert check_not_trained_on(dev, "smollm2-135m-instruct", QUESTIONS, "dev", "calibrate", allow=False) == 0


@pytest.mark.parametrize("allow", [True, False])
def test_eval_records_and_shows_the_override(allow: bool, world_engine, tmp_path: Path,  # type: ignore[no-untyped-def]
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """allow_trained_questions=true was said in a log line only: results.json and table.md read like a clean run."""
    import json

    from selfrag.config import from_dict
    from selfrag.evaluation import run as run_module
    from selfrag.evaluation.config import EvalConfig

    paris = {"id": "paris", "title": "Paris", "text": "Paris is the capital of France."}
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps({"id": f"q{n}", "question": question, "answers": ["Paris"], "ctxs": [paris]})
                            + "\n" for n, question in enumerate(["What is the capital of France?", "Where is Paris?"])))
    model = tmp_path / "model"
    model.mkdir()
    save_trained_questions(model, ["Where is Paris?"] if allow else ["Something else?"])
    monkeypatch.setattr(run_module, "build_engine", lambda config, name: world_engine)
    monkeypatch.setattr(run_module, "build_plain_engine", lambda config, name: world_engine)
    config = from_dict(EvalConfig, {
        "data": data, "model": str(model), "base_model": "b", "output_dir": tmp_path / "out", "modes": ["plain_rag"],
        "plots": False, "judge": {"kind": "overlap"}, "allow_trained_questions": allow})
    result = run_module.run(config)
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    assert results["allow_trained_questions"] is allow and results["trained_questions"] == (1 if allow else 0)
    table = (tmp_path / "out" / "table.md").read_text()
    note = "1 of 2 questions are among those the model was trained on (allow_trained_questions=true)"
    assert (note in table) is allow and (note in result.summary()) is allow
