"""Several sources in one gold run (issue #33 item 1): ``more_passages`` joins further corpora, ``more_queries`` are
selected by split and shard like ``queries``, ``more_answers`` adds answers files; ids clash with one clear line, and
an edited further file is new input, never reused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from selfrag.app.quickstart import DATA_RECIPE
from selfrag.config import load_config
from selfrag.data_gen.config import GenerateConfig
from selfrag.data_gen.run import run
from selfrag.errors import ConfigError, InputError
from selfrag.trajectory import Record

REPO = Path(__file__).resolve().parents[2]
SLICES = REPO / "data_gen" / "slices"


def _write(path: Path, rows: list[dict[str, object]]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


@pytest.fixture
def sources(tmp_path: Path) -> dict[str, Path]:
    """Two tiny sources: A (corpus + 4 questions, 1 of them test) and B (its own corpus + 6 questions, 2 of them
    test)."""
    a_corpus = _write(tmp_path / "a-corpus.jsonl", [
        {"id": f"a/{n}", "title": f"A {n}", "text": f"Town {n} has a harbour built in {1800 + n}."} for n in range(4)])
    a_queries = _write(tmp_path / "a-queries.jsonl", [
        {"id": f"a-{n}", "question": f"When was the harbour of town {n} built?", "answers": [str(1800 + n)],
         "gold_passage_ids": [f"a/{n}"], "meta": {"split": "test" if n == 3 else "train"}} for n in range(4)])
    b_corpus = _write(tmp_path / "b-corpus.jsonl", [
        {"id": f"b/{n}", "title": f"B {n}", "text": f"River {n} flows into lake Mor{n}a, far to the north."}
        for n in range(6)])
    b_queries = _write(tmp_path / "b-queries.jsonl", [
        {"id": f"b-{n}", "question": f"Which lake does river {n} flow into?", "answers": [f"Mor{n}a"],
         "gold_passage_ids": [f"b/{n}"], "meta": {"split": "test" if n >= 4 else "train"}} for n in range(6)])
    b_answers = _write(tmp_path / "b-answers.jsonl", [
        {"id": f"b-{n}", "output": f"River {n} flows into lake Mor{n}a."} for n in range(6)])
    return {"a_corpus": a_corpus, "a_queries": a_queries, "b_corpus": b_corpus, "b_queries": b_queries,
            "b_answers": b_answers}


def _run(sources: dict[str, Path], output: Path, **extra: object) -> list[Record]:
    settings = {"more_passages": f"[{sources['b_corpus']}]", "more_queries": f"[{sources['b_queries']}]",
                "heldout": 0, "easy_negatives": 1, "hard_negatives": 0, "support_negatives": 0, **extra}
    config = load_config(GenerateConfig, None, [f"{key}={value}" for key, value in settings.items()],
                         passages=str(sources["a_corpus"]), queries=str(sources["a_queries"]), output=str(output))
    result = run(config)
    return [Record.from_json(json.loads(line)) for line in result.records_path.read_text().splitlines()]


def test_a_further_source_is_labelled_on_its_own_passages_and_answers(sources: dict[str, Path],
                                                                     tmp_path: Path) -> None:
    records = _run(sources, tmp_path / "out", more_answers=f"[{sources['b_answers']}]")
    golds = {r.meta["query_id"]: r for r in records if r.meta["kind"] == "gold"}
    # the train split of B too (b-4 and b-5 are test questions), after the selected questions of A
    assert set(golds) == {"a-0", "a-1", "a-2", "b-0", "b-1", "b-2", "b-3"}
    assert golds["b-2"].segments[0].passage.id == "b/2"  # type: ignore[union-attr]  # B's passage, joined
    assert "".join(s.text for s in golds["b-2"].segments) == "River 2 flows into lake Mor2a."  # B's answers file
    assert "".join(s.text for s in golds["a-1"].segments) == "1801"  # A has no answers file: its span


def test_split_and_shard_select_from_the_further_files_too(sources: dict[str, Path], tmp_path: Path) -> None:
    test = {r.meta["query_id"] for r in _run(sources, tmp_path / "test", split="test")
            if r.meta["kind"] == "gold"}
    assert test == {"a-3", "b-4", "b-5"}
    halves = [{r.meta["query_id"] for r in _run(sources, tmp_path / f"shard{i}", shard=f"{i}/2", split="all")
               if r.meta["kind"] == "gold"} for i in range(2)]
    assert not halves[0] & halves[1]  # each further question in one shard only (they were in every shard)
    # split=all: the test questions go to heldout.jsonl, never to the training records
    assert halves[0] | halves[1] == {f"a-{n}" for n in range(3)} | {f"b-{n}" for n in range(4)}
    held = {json.loads(line)["meta"]["query_id"] for i in range(2)
            for line in (tmp_path / f"shard{i}" / "heldout.jsonl").read_text().splitlines()}
    assert held == test


def test_clashing_ids_are_one_line_naming_both_places(sources: dict[str, Path], tmp_path: Path) -> None:
    with pytest.raises(InputError, match=r"passage id 'a/0' is in more than one of passages / more_passages.*prefix"):
        _run(sources, tmp_path / "p", more_passages=f"[{sources['b_corpus']},{sources['a_corpus']}]")
    with pytest.raises(InputError, match=r"a-queries\.jsonl: query id 'a-0' is also in .*a-queries\.jsonl"):
        _run(sources, tmp_path / "q", more_queries=f"[{sources['a_queries']}]", more_passages="[]")
    with pytest.raises(InputError, match=r"id 'b-0' is answered in .*b-answers\.jsonl too"):
        _run(sources, tmp_path / "a", answers=sources["b_answers"], more_answers=f"[{sources['b_answers']}]")


def test_an_edited_further_corpus_or_answers_file_is_not_reused(sources: dict[str, Path], tmp_path: Path) -> None:
    answers = f"[{sources['b_answers']}]"
    first = _run(sources, tmp_path / "out", more_answers=answers)
    assert _run(sources, tmp_path / "out", more_answers=answers) == first  # unchanged: resumes, the same records
    sources["b_corpus"].write_text(sources["b_corpus"].read_text().replace("far to the north", "far to the south"))
    with pytest.raises(ConfigError, match=r"more_passages\[0\]"):
        _run(sources, tmp_path / "out", more_answers=answers)
    sources["b_answers"].write_text(sources["b_answers"].read_text().replace("flows into", "runs into"))
    with pytest.raises(ConfigError, match=r"more_answers\[0\]"):
        _run(sources, tmp_path / "out", more_answers=answers)
    again = _run(sources, tmp_path / "out", more_answers=answers, restart="true")  # starts over on the new files
    golds = {r.meta["query_id"]: r for r in again if r.meta["kind"] == "gold"}
    assert "".join(s.text for s in golds["b-1"].segments) == "River 1 runs into lake Mor1a."
    assert "far to the south" in golds["b-1"].segments[0].passage.text  # type: ignore[union-attr]


def test_the_mixed_source_recipe_labels_every_shipped_source() -> None:
    """configs/data_gen/mixed-sources.yaml: the demo's SQuAD recipe plus the four slices' training splits; the
    quickstart's mixed-sources-nq.yaml: the same plus nq-open-more."""
    import yaml

    recipe = yaml.safe_load((REPO / "configs" / "data_gen" / "mixed-sources.yaml").read_text(encoding="utf-8"))
    slices = sorted(p.name for p in SLICES.iterdir() if p.is_dir())
    assert slices == ["begin", "hotpotqa", "nq-open", "nq-open-more", "retrievalqa"]
    assert recipe["more_passages"] == [f"data_gen/slices/{s}/corpus.jsonl" for s in ["hotpotqa", "nq-open",
                                                                                      "retrievalqa", "begin"]]
    for path in recipe["more_passages"] + recipe["more_queries"] + recipe["more_answers"] + [recipe["answers"]]:
        assert (REPO / path).is_file(), path
    # the quickstart's recipe is the same plus nq-open-more, and nothing else
    quickstart = yaml.safe_load((REPO / DATA_RECIPE).read_text(encoding="utf-8"))
    assert DATA_RECIPE == Path("configs/data_gen/mixed-sources-nq.yaml")
    more = {key: f"data_gen/slices/nq-open-more/{name}.jsonl" for key, name in
            (("more_passages", "corpus"), ("more_queries", "queries"), ("more_answers", "answers-sentences"))}
    assert {key: value for key, value in quickstart.items() if key not in more} == {
        key: value for key, value in recipe.items() if key not in more}
    for key, path in more.items():
        assert [p for p in quickstart[key] if p != path] == recipe[key], key
        assert path in quickstart[key] and (REPO / path).is_file()
    # every answerable slice question with a span answer has a whole-sentence answer (BEGIN's are its responses)
    for name in ("hotpotqa", "nq-open", "nq-open-more", "retrievalqa"):
        answered = {json.loads(line)["id"] for line in (SLICES / name / "answers-sentences.jsonl").open()}
        questions = [json.loads(line) for line in (SLICES / name / "queries.jsonl").open()]
        assert {q["id"] for q in questions if q.get("answerable", True) and q.get("answers")} <= answered


@pytest.mark.parametrize("key", ["more_queries", "more_answers", "more_passages", "answers"])
def test_a_missing_further_file_is_one_line_before_any_output(sources: dict[str, Path], tmp_path: Path,
                                                              key: str) -> None:
    missing = tmp_path / "nowhere.jsonl"
    where, fix = (key, "set answers=null") if key == "answers" else (rf"{key}\[0\]", f"drop it from {key}")
    with pytest.raises(InputError, match=rf"^{where}: file '{missing}' not found; check the path, or {fix}$"):
        _run(sources, tmp_path / "out", **{key: missing if key == "answers" else f"[{missing}]"})
    assert not (tmp_path / "out").exists()  # refused before any work: the folder it made is gone, nothing written


def test_a_folder_written_when_more_passages_was_more_corpora_resumes(sources: dict[str, Path],
                                                                      tmp_path: Path) -> None:
    """generate's ``more_passages=`` was ``more_corpora=`` (its files' digests inputs named more_corpora[N]): the old
    spelling is refused naming the new one, such a folder resumes, and an edited file is refused named as spelled
    now."""
    with pytest.raises(ConfigError) as refused:
        _run(sources, tmp_path / "refused", more_corpora=f"[{sources['b_corpus']}]")
    assert refused.value.problems == ["more_corpora was removed: write more_passages=[FILE, ...] (further passage "
                                      "files joined to passages)"]
    out = tmp_path / "out"
    first = _run(sources, out)
    fingerprint_file = out / "fingerprint.json"
    fingerprint = json.loads(fingerprint_file.read_text())
    fingerprint["inputs"]["more_corpora[0]"] = fingerprint["inputs"].pop("more_passages[0]")
    fingerprint_file.write_text(json.dumps(fingerprint))
    assert _run(sources, out) == first  # resumed: nothing relabelled
    assert "more_passages[0]" in json.loads(fingerprint_file.read_text())["inputs"]  # recorded as spelled now
    fingerprint = json.loads(fingerprint_file.read_text())
    fingerprint["inputs"]["more_corpora[0]"] = "sha256:" + "0" * 64  # an old run over other further passages
    del fingerprint["inputs"]["more_passages[0]"]
    fingerprint_file.write_text(json.dumps(fingerprint))
    with pytest.raises(ConfigError, match=r"more_passages\[0\]: content changed \(000000000000 -> "):
        _run(sources, out)
