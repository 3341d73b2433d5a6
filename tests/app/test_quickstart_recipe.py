"""The quickstart's recipe parts: a test split with >= 40 answerable questions (enough to tell two modes' answers
apart), the data recipe's further files resolved from the repository and fingerprinted by content, and the held-out
labels made from every held-out question with the data set's own answers."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from selfrag.app.quickstart import (
    REPO,
    QuickstartConfig,
    Stages,
    _query_kind,
    data_files,
    data_settings,
    held_out_splits,
)
from selfrag.config import from_dict
from selfrag.corpus import load_queries
from selfrag.data_gen import DEMO_CORPUS, DEMO_QUERIES
from selfrag.data_gen.config import GenerateConfig
from selfrag.errors import ConfigError


def test_the_default_test_split_has_40_answerable_questions_none_in_dev_or_training() -> None:
    config = QuickstartConfig()
    queries = load_queries(DEMO_QUERIES)
    dev, test = held_out_splits(queries, config.dev_questions, config.test_questions, config.test_mix)
    kinds = Counter(_query_kind(q) for q in test)
    assert kinds == {"answerable": 40, "unanswerable": 10, "no-retrieval": 10}
    assert Counter(_query_kind(q) for q in dev) == {"answerable": 4, "unanswerable": 4, "no-retrieval": 4}
    assert not {q.id for q in dev} & {q.id for q in test}
    assert all(q.meta["split"] == "test" for q in dev + test)  # the 5 articles no training question uses
    # the first rounds take 4 answerable, 1 unanswerable, 1 no-retrieval in turn: a smaller table keeps the mix
    _, short = held_out_splits(queries, config.dev_questions, 6, config.test_mix)
    assert [_query_kind(q) for q in short] == ["answerable"] * 4 + ["unanswerable", "no-retrieval"]


@pytest.mark.parametrize("mix", [[1, 1], [0, 0, 0], [1, -1, 1]])
def test_a_bad_test_mix_is_one_line_naming_the_field(mix: list[int]) -> None:
    with pytest.raises(ConfigError, match=r"test_mix must be 3 counts >= 0 \(answerable, unanswerable, no-retrieval"):
        from_dict(QuickstartConfig, {"test_mix": mix})


def test_the_data_recipe_files_resolve_from_the_repository_and_test_labels_take_every_question(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("labeler: gold\nlimit: 200\nmore_queries: [data_gen/demo/general-knowledge.jsonl]\n"
                      "answers: data_gen/demo/general-knowledge.jsonl\n"
                      "more_passages: [data_gen/slices/nq-open/corpus.jsonl]\n"
                      "more_answers: [data_gen/slices/nq-open/answers-sentences.jsonl]\n")
    monkeypatch.chdir(tmp_path)  # not the repository root
    config = from_dict(QuickstartConfig, {"data_recipe": recipe})
    train = data_settings(config, DEMO_CORPUS, DEMO_QUERIES, tmp_path / "data", "train")
    assert train["limit"] == 200
    assert train["more_queries"] == [REPO / "data_gen/demo/general-knowledge.jsonl"]
    assert train["answers"] == REPO / "data_gen/demo/general-knowledge.jsonl"
    assert train["more_passages"] == [REPO / "data_gen/slices/nq-open/corpus.jsonl"]
    assert train["more_answers"] == [REPO / "data_gen/slices/nq-open/answers-sentences.jsonl"]
    test = data_settings(config, DEMO_CORPUS, DEMO_QUERIES, tmp_path / "gold-test", "test")
    # every held-out question labelled, answering in the trained form (support judged on what the model writes)
    assert test["limit"] is None and test["more_queries"] == []
    assert test["more_passages"] == [] and test["more_answers"] == []  # further sources train only
    assert test["answers"] == REPO / "data_gen/demo/general-knowledge.jsonl"


def test_an_edited_answers_file_redoes_the_data_stage(tmp_path: Path) -> None:
    answers = tmp_path / "answers.jsonl"
    answers.write_text('{"id": "a", "output": "One."}\n')
    config = from_dict(GenerateConfig, {"output": tmp_path / "run" / "data", "passages": DEMO_CORPUS,
                                        "queries": DEMO_QUERIES, "answers": answers})
    assert set(data_files(config)) == {"answers"}  # only the files set: older folders' inputs stay unchanged
    inputs = {"passages": DEMO_CORPUS, "queries": DEMO_QUERIES, **data_files(config)}
    data = tmp_path / "run" / "data"
    first = Stages(tmp_path / "run").check("data", config, inputs, [data])
    data.mkdir(parents=True)
    (data / "records.jsonl").write_text("{}\n")
    assert Stages(tmp_path / "run").check("data", config, inputs, [data]) == first and data.exists()  # unchanged
    answers.write_text('{"id": "a", "output": "Two."}\n')
    assert Stages(tmp_path / "run").check("data", config, inputs, [data]) != first
    assert not data.exists()  # the old records are cleared, not mixed with the new answers
