"""What `selfrag generate` tells a user with their own data: counts that add up, an exit code that means something,
negatives that are there or said to be missing, edited inputs noticed, settings that do nothing refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from datagen_inputs import PASSAGES, QUERIES, write_jsonl
from teacher_inputs import write_inputs
from teacher_server import TeacherServer
from test_teacher_run import QUERIES as TEACHER_QUERIES
from test_teacher_run import generate

from selfrag.app.cli import main
from selfrag.config import load_config
from selfrag.data_gen.cache import default_cache_path
from selfrag.data_gen.config import GenerateConfig
from selfrag.data_gen.run import run
from selfrag.errors import ConfigError


def make(output: Path, corpus: Path, queries: Path, *extra: str) -> GenerateConfig:
    paths = [f"passages={corpus}", f"queries={queries}", f"output={output}", "split=all"]
    return load_config(GenerateConfig, None, [*paths, *extra])


def untitled(queries: list[dict]) -> list[dict]:  # type: ignore[type-arg]
    """The queries as a user writes them: gold passage ids, no meta.title, no own_passage_ids."""
    return [{**query, "meta": {"split": query["meta"]["split"]}} for query in queries]


def test_hard_negatives_without_meta_title_come_from_the_gold_passage_title(tmp_path: Path) -> None:
    corpus = write_jsonl(tmp_path / "corpus.jsonl", PASSAGES)
    queries = write_jsonl(tmp_path / "queries.jsonl", untitled(QUERIES[:4]))
    result = run(make(tmp_path / "out", corpus, queries, "distractors=0", "hard_negatives=1"))
    written = [result.records_path, result.records_path.with_name("heldout.jsonl")]  # q-rome is a test question
    hard = [json.loads(line) for path in written for line in path.read_text().splitlines()]
    hard = [row for row in hard if row["meta"]["kind"] == "hard"]
    # q-rome's gold passage (rome-0-1) is titled Rome: its hard negative is the other Rome passage. The answerable
    # Paris question has none ("Paris" is in every Paris passage's title: none is safe to call irrelevant), the
    # unanswerable one no article at all (no gold passage); both are said.
    assert {row["meta"]["query_id"]: row["segments"][0]["passage"]["id"] for row in hard} == {"q-rome": "rome-0-0"}
    assert result.stats["run"]["negatives_short"] == {
        "hard_negatives: the question's article is unknown (no meta.title, no gold passage with a title)": 1,
        "hard_negatives: too few passages of the question's article without the answer": 1,
    }


def test_missing_negatives_are_counted_with_the_reason(tmp_path: Path) -> None:
    corpus = write_jsonl(tmp_path / "corpus.jsonl", PASSAGES)
    no_article = [{"id": "q-lone", "question": "Which city is the capital of Germany?", "answers": ["Berlin"],
                   "needs_retrieval": True, "gold_passage_ids": ["berlin-0-0"], "meta": {"split": "train"}}]
    titled = [{**no_article[0], "id": "q-berlin"}]
    passages = [dict(p, title="") if p["id"] == "berlin-0-0" else p for p in PASSAGES]
    write_jsonl(corpus, passages)
    queries = write_jsonl(tmp_path / "queries.jsonl", no_article)
    result = run(make(tmp_path / "out", corpus, queries, "distractors=0", "hard_negatives=1"))
    short = result.stats["run"]["negatives_short"]
    assert short == {"hard_negatives: the question's article is unknown (no meta.title, no gold passage with a "
                     "title)": 1}
    assert "negatives short of what was asked: hard_negatives: the question's article is unknown" in result.summary()
    write_jsonl(corpus, PASSAGES)  # Berlin has one passage: nothing else of its article to draw
    queries = write_jsonl(tmp_path / "titled.jsonl", titled)
    result = run(make(tmp_path / "out2", corpus, queries, "distractors=0", "hard_negatives=1"))
    assert result.stats["run"]["negatives_short"] == {
        "hard_negatives: too few passages of the question's article without the answer": 1
    }


def test_summary_counts_add_up_with_held_out_records(tiny_data: tuple[Path, Path], tmp_path: Path) -> None:
    result = run(make(tmp_path / "out", *tiny_data, "heldout=0.4", "seed=1"))
    train, held = result.stats["records"], result.stats["heldout_records"]
    assert held > 0 and result.records_written == train + held
    first = result.summary().splitlines()[0]
    assert first.startswith(f"wrote {train + held} records now; in all {train} train records")
    assert f"and {held} held-out records in" in first


def test_zero_records_exit_non_zero(tiny_data: tuple[Path, Path], tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    bare = write_jsonl(tmp_path / "bare.jsonl", [{"id": "q", "question": "What?", "meta": {"split": "train"}}])
    code = main(["generate", f"passages={tiny_data[0]}", f"queries={bare}", f"output={tmp_path / 'out'}"])
    err = capsys.readouterr().err
    assert code == 1 and "no record written: 1 queries selected" in err and "answerable without answers x1" in err


def test_gold_queries_edited_in_place_are_refused_then_restart(tiny_data: tuple[Path, Path], tmp_path: Path) -> None:
    out = tmp_path / "out"
    run(make(out, *tiny_data))
    edited = [dict(QUERIES[0], answers=["Paris, France"]), *QUERIES[1:]]
    write_jsonl(tiny_data[1], edited)
    with pytest.raises(ConfigError, match=r"queries: content changed \(.*restart=true"):
        run(make(out, *tiny_data))
    result = run(make(out, *tiny_data, "restart=true"))
    assert "Paris, France" in result.records_path.read_text() and result.stats["run"]["queries_already_done"] == 0


def test_records_split_by_another_sentence_splitter_are_refused_then_restart(
    tiny_data: tuple[Path, Path], tmp_path: Path
) -> None:
    """A run from before selfrag.sentences (its inputs.json names no splitter: regular expressions, and no
    fingerprint.json) is not resumed: its answers and erased passages were cut into other sentences."""
    from selfrag.sentences import SPLITTER

    out = tmp_path / "out"
    run(make(out, *tiny_data))
    inputs = json.loads((out / "fingerprint.json").read_text())["inputs"]
    assert inputs["sentences"] == SPLITTER
    del inputs["sentences"]
    # such a run left config.yaml and an inputs.json that names no splitter (no fingerprint.json)
    (out / "fingerprint.json").unlink()
    (out / "inputs.json").write_text(json.dumps(inputs))
    with pytest.raises(ConfigError, match=r"without fingerprint.json \(an older selfrag's.*set restart=true"):
        run(make(out, *tiny_data))
    result = run(make(out, *tiny_data, "restart=true"))
    assert result.stats["run"]["queries_already_done"] == 0
    run(make(out, *tiny_data))  # now recorded: resumes


def test_negative_mix_keys_are_refused_with_the_teacher_labeler(tiny_data: tuple[Path, Path], tmp_path: Path) -> None:
    extra = ("labeler=llm", "teacher.model=m", "hard_negatives=1", "easy_negatives=1")
    with pytest.raises(ConfigError) as error:
        make(tmp_path / "out", *tiny_data, *extra)
    (problem,) = error.value.problems
    assert problem.startswith("easy_negatives=1, hard_negatives=1: negatives are drawn by labeler=gold only")
    assert "top_k=3" in problem


def test_teacher_cache_is_one_per_teacher_outside_the_run(tmp_path: Path, own_teacher_cache: Path) -> None:
    data = write_inputs(tmp_path, TEACHER_QUERIES[:3])
    with TeacherServer() as server:
        first = generate(server.url, data, tmp_path / "out")
        again = generate(server.url, data, tmp_path / "new-output")  # what the refusal advises: a new directory
        calls = len(server.answered)
        other = generate(server.url, data, tmp_path / "explicit", f"teacher.cache={tmp_path / 'mine.sqlite'}")
    cache = default_cache_path("openai", "scripted-teacher")
    assert cache.parent == own_teacher_cache and cache.is_file()
    assert first.stats["run"]["teacher_cache"] == str(cache)
    assert not (tmp_path / "out" / "teacher-cache.sqlite").exists()
    assert first.stats["run"]["teacher_calls_made"] > 0 and again.stats["run"]["teacher_calls_made"] == 0
    assert calls == first.stats["run"]["teacher_calls_made"]
    assert other.stats["run"]["teacher_calls_made"] == calls and (tmp_path / "mine.sqlite").is_file()
    assert default_cache_path("openai", "other-model") != cache


def test_an_older_runs_cache_in_the_output_is_still_used(tmp_path: Path) -> None:
    data = write_inputs(tmp_path, TEACHER_QUERIES[:2])
    out = tmp_path / "out"
    with TeacherServer() as server:
        generate(server.url, data, out, f"teacher.cache={out / 'teacher-cache.sqlite'}")
        (out / "journal.jsonl").unlink()
        again = generate(server.url, data, out)
    assert again.stats["run"]["teacher_cache"] == str(out / "teacher-cache.sqlite")
    assert again.stats["run"]["teacher_calls_made"] == 0



def test_a_fully_cached_rerun_pays_nothing_and_says_so(tmp_path: Path, own_teacher_cache: Path) -> None:
    """The summary's cost of this run is what it paid now; the data set's cost (from every label's tokens) is named as
    such, so a rerun answered from the cache does not read as a bill (issue #44, defect 5)."""
    from selfrag.data_gen.teacher_run import summarize

    data = write_inputs(tmp_path, TEACHER_QUERIES[:3])
    prices = ["teacher.price_input_per_million=2.0", "teacher.price_output_per_million=8.0"]
    with TeacherServer() as server:
        first = generate(server.url, data, tmp_path / "out", *prices)
        paid = first.stats["run"]["teacher_tokens_paid"]
        again = generate(server.url, data, tmp_path / "again", *prices)  # a new folder, every call in the cache
    assert first.stats["run"]["teacher_calls_made"] == len(server.answered) > 0
    assert paid["prompt"] >= first.stats["teacher"]["prompt_tokens"] > 0  # labels kept; paid also counts re-asks
    assert first.stats["run"]["cost_paid_now"] == round((paid["prompt"] * 2.0 + paid["completion"] * 8.0) / 1e6, 6)
    assert again.stats["run"]["teacher_calls_made"] == 0 and again.stats["run"]["cost_paid_now"] == 0.0
    assert again.stats["teacher"]["cost"] == first.stats["teacher"]["cost"] > 0
    line = next(line for line in summarize(again.stats, tmp_path / "again").splitlines() if line.startswith("teacher"))
    assert "0 calls paid now (cost 0.0)" in line and f"cost {again.stats['teacher']['cost']} in all" in line
