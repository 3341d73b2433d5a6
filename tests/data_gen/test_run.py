"""run(): valid records, resumable after a kill, shards that partition, errors that name file:line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from selfrag.config import load_config
from selfrag.corpus import load_queries
from selfrag.data_gen import DEMO_CORPUS, DEMO_QUERIES
from selfrag.data_gen.config import GenerateConfig
from selfrag.data_gen.run import run, select_queries
from selfrag.errors import ConfigError, InputError
from selfrag.trajectory import Record, parse_trajectory

REPO = Path(__file__).resolve().parents[2]


def make_config(output: Path, corpus: Path = DEMO_CORPUS, queries: Path = DEMO_QUERIES, **extra) -> GenerateConfig:  # type: ignore[no-untyped-def]
    overrides = [f"{key}={value}" for key, value in extra.items()]
    return load_config(GenerateConfig, None, overrides, corpus=str(corpus), queries=str(queries), output=str(output))


def lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines()


def test_records_round_trip_and_parse(tmp_path: Path) -> None:
    result = run(make_config(tmp_path / "out", distractors=2, limit=310))
    rows = [json.loads(line) for line in lines(result.records_path)]
    assert len(rows) == result.records_written == result.stats["records"]
    for row in rows:
        record = Record.from_json(row)
        assert record.to_json() == row
        assert parse_trajectory(record.render()).well_formed, record.id
    kinds = result.stats["kinds"]
    assert kinds == {"gold": 249, "own-passage": 52, "no-retrieval": 9, "distractor": 600}
    assert result.stats["labels"]["retrieve"] == {"[No Retrieval]": 9, "[Retrieval]": 901}
    assert {row["meta"]["split"] for row in rows} == {"train"}
    written = json.loads((tmp_path / "out" / "stats.json").read_text())
    assert written["run"]["queries_selected"] == 310
    assert (tmp_path / "out" / "config.yaml").is_file()
    assert "[Fully supported] 249" in result.summary()


def test_resume_after_a_kill(tmp_path: Path) -> None:
    whole = run(make_config(tmp_path / "whole", limit=310))
    expected = lines(whole.records_path)
    # A killed run: the first 100 records plus half of the next line.
    killed = tmp_path / "killed"
    killed.mkdir()
    partial = "\n".join(expected[:100]) + "\n" + expected[100][: len(expected[100]) // 2]
    (killed / "records.jsonl").write_text(partial, encoding="utf-8")
    resumed = run(make_config(killed, limit=310))
    got = lines(resumed.records_path)
    assert len(got) == len(set(got)) == len(expected)
    assert set(got) == set(expected)
    assert resumed.records_written == len(expected) - 100
    # Running again writes nothing.
    again = run(make_config(killed, limit=310))
    assert again.records_written == 0 and lines(again.records_path) == got
    assert again.stats["run"]["queries_already_done"] == 310


def test_resume_refuses_other_settings(tmp_path: Path) -> None:
    run(make_config(tmp_path / "out", limit=5))
    run(make_config(tmp_path / "out", limit=10))  # more queries, same settings: fine
    with pytest.raises(ConfigError, match="distractors=3"):
        run(make_config(tmp_path / "out", distractors=3))


def test_shards_partition_the_queries(tiny_data: tuple[Path, Path], tmp_path: Path) -> None:
    queries = load_queries(tiny_data[1])
    shards = [select_queries(queries, "all", f"{index}/3") for index in range(3)]
    ids = [query.id for shard in shards for query in shard]
    assert sorted(ids) == sorted(query.id for query in queries)
    assert all(shards)
    outputs = [run(make_config(tmp_path / f"s{i}", *tiny_data, shard=f"{i}/3", split="all")) for i in range(3)]
    query_ids = [json.loads(line)["meta"]["query_id"] for out in outputs for line in lines(out.records_path)]
    assert set(query_ids) == {query.id for query in queries}
    assert sum(out.stats["queries"] for out in outputs) == len(queries)


def test_split_selection(tiny_data: tuple[Path, Path], tmp_path: Path) -> None:
    result = run(make_config(tmp_path / "out", *tiny_data, split="test"))
    assert result.stats["queries"] == 1 and result.stats["kinds"] == {"gold": 1, "distractor": 1}
    with pytest.raises(InputError, match="split=all"):
        run(make_config(tmp_path / "none", tiny_data[0], _no_split(tmp_path), split="train"))


def _no_split(tmp_path: Path) -> Path:
    path = tmp_path / "plain.jsonl"
    path.write_text('{"id": "a", "question": "Who?", "answers": ["x"], "needs_retrieval": false}\n')
    return path


def test_malformed_queries_line_names_file_and_line(tiny_data: tuple[Path, Path], tmp_path: Path) -> None:
    corpus, queries = tiny_data
    content = queries.read_text().splitlines()
    content[2] = '{"id": "broken", "question": '
    queries.write_text("\n".join(content) + "\n")
    with pytest.raises(InputError, match=rf"{queries}:3"):
        run(make_config(tmp_path / "out", corpus, queries))


def test_config_problems_are_collected(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="corpus is required"):
        load_config(GenerateConfig, None, ["queries=q.jsonl", "output=out"])
    with pytest.raises(ConfigError) as error:
        make_config(tmp_path, distractors=-1, shard="3/2", labeler="teacher", limit=0, abstain_text="' '")
    message = str(error.value)
    for needle in (
        "distractors must be >= 0, got -1",
        "shard must be 'i/N' with 0 <= i < N, got '3/2'",
        "labeler must be one of ['gold', 'llm'], got 'teacher'",
        "limit must be >= 1 or null, got 0",
        "abstain_text must not be empty",
    ):
        assert needle in message


def test_demo_config_loads() -> None:
    config = load_config(GenerateConfig, REPO / "configs/data_gen/squad-demo.yaml")
    assert (REPO / config.corpus).resolve() == DEMO_CORPUS.resolve()
    assert (REPO / config.queries).resolve() == DEMO_QUERIES.resolve()
