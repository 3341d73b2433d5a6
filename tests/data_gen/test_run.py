"""run(): valid records, resumable after a kill, shards that partition, errors that name file:line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from selfrag import reflection as rf
from selfrag.config import load_config
from selfrag.corpus import load_queries
from selfrag.data_gen import DEMO_CORPUS, DEMO_QUERIES
from selfrag.data_gen.config import GenerateConfig
from selfrag.data_gen.fingerprints import FINGERPRINT_FILE
from selfrag.data_gen.merge import MergeConfig, merge
from selfrag.data_gen.queries import select_queries
from selfrag.data_gen.run import run
from selfrag.errors import ConfigError, InputError
from selfrag.fsutil import OWNER_FILE
from selfrag.trajectory import Record, parse_trajectory

REPO = Path(__file__).resolve().parents[2]
GOLD_FILES = ("records.jsonl", "heldout.jsonl", "critic.jsonl", "critic-heldout.jsonl")


def make_config(output: Path, corpus: Path = DEMO_CORPUS, queries: Path = DEMO_QUERIES, **extra) -> GenerateConfig:  # type: ignore[no-untyped-def]
    overrides = [f"{key}={value}" for key, value in extra.items()]
    return load_config(GenerateConfig, None, overrides, passages=str(corpus), queries=str(queries), output=str(output))


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
    whole = run(make_config(tmp_path / "whole", limit=310, heldout=0.2))
    expected = {name: (tmp_path / "whole" / name).read_bytes() for name in GOLD_FILES}
    # A killed run: the first 100 records plus half of the next line, the same in heldout.jsonl, and a critic
    # file from an earlier render (it is rendered again from the records).
    killed = tmp_path / "killed"
    killed.mkdir()
    # A run writes its owner file, fingerprint.json and config.yaml before its first record: a kill leaves them.
    for name in ("config.yaml", OWNER_FILE, FINGERPRINT_FILE):
        (killed / name).write_bytes((tmp_path / "whole" / name).read_bytes())
    for name, keep in (("records.jsonl", 100), ("heldout.jsonl", 10)):
        full = lines(tmp_path / "whole" / name)
        (killed / name).write_text("\n".join(full[:keep]) + "\n" + full[keep][: len(full[keep]) // 2], encoding="utf-8")
    (killed / "critic.jsonl").write_text(lines(tmp_path / "whole" / "critic.jsonl")[0] + "\n", encoding="utf-8")
    resumed = run(make_config(killed, limit=310, heldout=0.2))
    got = lines(resumed.records_path)
    assert len(got) == len(set(got)) == len(lines(whole.records_path))
    assert {name: (killed / name).read_bytes() for name in GOLD_FILES} == expected
    assert resumed.records_written == whole.records_written - 110
    # Running again writes nothing.
    again = run(make_config(killed, limit=310, heldout=0.2))
    assert again.records_written == 0 and lines(again.records_path) == got
    assert again.stats["run"]["queries_already_done"] == 310
    assert {name: (killed / name).read_bytes() for name in GOLD_FILES} == expected


def test_critic_rows_and_heldout_split_are_by_question(tmp_path: Path) -> None:
    result = run(make_config(tmp_path / "out", distractors=1, limit=310, heldout=0.3, seed=3))
    out = tmp_path / "out"
    train = {json.loads(line)["meta"]["query_id"] for line in lines(out / "records.jsonl")}
    held = {json.loads(line)["meta"]["query_id"] for line in lines(out / "heldout.jsonl")}
    assert train and held and not train & held and len(train | held) == 310
    assert 0.2 < len(held) / 310 < 0.4
    critic = [json.loads(line) for line in lines(out / "critic.jsonl")]
    critic_held = [json.loads(line) for line in lines(out / "critic-heldout.jsonl")]
    assert {row["query_id"] for row in critic} == train and {row["query_id"] for row in critic_held} == held
    assert result.stats["critic_records"] == {"train": len(critic), "heldout": len(critic_held)}
    assert result.stats["heldout_records"] == len(lines(out / "heldout.jsonl"))
    # every relevance verdict of a record is a critic row; identical decisions of one question are written once
    relevance = {
        (row["query_id"], row["passage"]["id"], row["target"])
        for row in critic + critic_held
        if row["type"] == "relevance"
    }
    from_records = {
        (row["meta"]["query_id"], segment["passage"]["id"], segment["relevance"]["value"])
        for name in ("records.jsonl", "heldout.jsonl")
        for row in map(json.loads, lines(out / name))
        for segment in row["segments"]
        if segment.get("relevance")
    }
    assert relevance == from_records
    ids = [row["id"] for row in critic + critic_held]
    assert len(ids) == len(set(ids))
    assert "critic rows:" in result.summary()
    # the default keeps every question in records.jsonl (the split is meta.split's)
    plain = run(make_config(tmp_path / "plain", distractors=1, limit=310))
    assert plain.stats["heldout_records"] == 0 and (tmp_path / "plain" / "critic-heldout.jsonl").read_text() == ""


def test_resume_refuses_other_settings(tmp_path: Path) -> None:
    run(make_config(tmp_path / "out", limit=5))
    run(make_config(tmp_path / "out", limit=10))  # more queries, same settings: fine
    with pytest.raises(ConfigError, match="distractors=3"):
        run(make_config(tmp_path / "out", distractors=3))


def test_resume_reads_a_setting_added_later_as_its_default(tmp_path: Path) -> None:
    """A folder written before ``article_negatives`` existed resumes at 0 and refuses another value."""
    out = tmp_path / "out"
    run(make_config(out, limit=5))
    fingerprint_file = out / FINGERPRINT_FILE
    fingerprint = json.loads(fingerprint_file.read_text())
    del fingerprint["settings"]["article_negatives"]
    fingerprint_file.write_text(json.dumps(fingerprint))
    run(make_config(out, limit=10))
    with pytest.raises(ConfigError, match=r"article_negatives=1 \(was 0\)"):
        run(make_config(out, limit=10, article_negatives=1))


def test_a_folder_written_when_the_passages_were_corpus_resumes(tmp_path: Path) -> None:
    """generate's ``passages=`` was ``corpus=`` (its digest an input named corpus): such a folder resumes, and an edited
    passages file is still refused, named as the setting is spelled now."""
    out = tmp_path / "out"
    run(make_config(out, limit=5))
    fingerprint_file = out / FINGERPRINT_FILE
    fingerprint = json.loads(fingerprint_file.read_text())
    fingerprint["inputs"]["corpus"] = fingerprint["inputs"].pop("passages")
    fingerprint_file.write_text(json.dumps(fingerprint))
    assert run(make_config(out, limit=10)).records_written > 0  # resumed: only the 5 new questions' records
    fingerprint = json.loads(fingerprint_file.read_text())
    assert "passages" in fingerprint["inputs"] and "corpus" not in fingerprint["inputs"]  # recorded as spelled now
    fingerprint["inputs"]["corpus"] = "sha256:" + "0" * 64  # an old run over other passages
    del fingerprint["inputs"]["passages"]
    fingerprint_file.write_text(json.dumps(fingerprint))
    with pytest.raises(ConfigError, match=r"passages: content changed \(000000000000 -> "):
        run(make_config(out, limit=10))


def test_a_folder_in_the_older_format_is_refused_in_one_line_then_restart_starts_over(tmp_path: Path) -> None:
    """A folder written before fingerprint.json (settings in config.yaml, digests in inputs.json) is never resumed:
    nothing records what made its work. One line names the fix; restart=true deletes it and starts over."""
    out = tmp_path / "out"
    run(make_config(out, limit=5))
    (out / "inputs.json").write_text(json.dumps(json.loads((out / FINGERPRINT_FILE).read_text())["inputs"]))
    (out / FINGERPRINT_FILE).unlink()
    records = (out / "records.jsonl").read_text()
    with pytest.raises(ConfigError) as refused:
        run(make_config(out, limit=5))
    (problem,) = refused.value.problems
    assert "holds a generate run without fingerprint.json" in problem and "set restart=true" in problem
    assert (out / "records.jsonl").read_text() == records and not (out / FINGERPRINT_FILE).exists()  # untouched
    again = run(make_config(out, limit=5, restart=True))
    assert again.records_written > 0 and (out / "records.jsonl").read_text() == records  # labelled anew
    assert (out / FINGERPRINT_FILE).is_file()
    assert run(make_config(out, limit=5)).records_written == 0  # recorded now: resumes


def test_a_copied_folder_resumes_with_nothing_written(tmp_path: Path) -> None:
    """Fingerprints do not name the folder: a finished output copied elsewhere resumes, labelling nothing again."""
    import shutil

    first = run(make_config(tmp_path / "out", limit=20, heldout=0.2))
    shutil.copytree(tmp_path / "out", tmp_path / "moved" / "copy")
    copy = tmp_path / "moved" / "copy"
    again = run(make_config(copy, limit=20, heldout=0.2))
    assert first.records_written > 0 and again.records_written == 0
    assert again.stats["run"]["queries_already_done"] == 20
    assert {name: (copy / name).read_bytes() for name in GOLD_FILES} == {
        name: (tmp_path / "out" / name).read_bytes() for name in GOLD_FILES
    }


def records_by_query(path: Path) -> dict[str, dict[str, Record]]:
    """A records file as question id -> record kind -> record."""
    by_query: dict[str, dict[str, Record]] = {}
    for line in lines(path):
        record = Record.from_json(json.loads(line))
        by_query.setdefault(str(record.meta["query_id"]), {})[str(record.meta["kind"])] = record
    return by_query


def test_article_negatives_records(tmp_path: Path) -> None:
    result = run(make_config(tmp_path / "out", distractors=0, hard_negatives=1, article_negatives=1, limit=60))
    article = [kinds for kinds in records_by_query(result.records_path).values() if "article" in kinds]
    assert len(article) > 40 and result.stats["kinds"]["article"] == len(article)
    for kinds in article:
        passage, hard = kinds["article"].segments[0].passage, kinds["hard"].segments[0].passage
        assert passage is not None and hard is not None
        assert passage.title == hard.title and passage.id != hard.id
        assert kinds["article"].segments[0].relevance.value == rf.IRRELEVANT  # type: ignore[union-attr]


def test_erased_negatives_records(tmp_path: Path) -> None:
    """Each erased record is its question's gold passage less the sentences naming an answer, and a resume with
    another erased_negatives value is refused (the records would mix)."""
    out = tmp_path / "out"
    result = run(make_config(out, distractors=0, erased_negatives=1, limit=60))
    erased = [kinds for kinds in records_by_query(result.records_path).values() if "erased" in kinds]
    assert len(erased) > 20 and result.stats["kinds"]["erased"] == len(erased)
    for kinds in erased:
        passage, gold = kinds["erased"].segments[0].passage, kinds["gold"].segments[0].passage
        assert passage is not None and gold is not None
        assert passage.id == f"{gold.id}#erased" and passage.title == gold.title
        assert len(passage.text) < len(gold.text) and kinds["gold"].segments[0].text not in passage.text
        assert all(sentence in gold.text for sentence in passage.text.split(". "))  # nothing new, only less
        assert kinds["erased"].segments[0].relevance.value == rf.IRRELEVANT  # type: ignore[union-attr]
    with pytest.raises(ConfigError, match=r"erased_negatives=0 \(was 1\)"):
        run(make_config(out, distractors=0, limit=60))


def test_gold_shards_merge_records_and_critic(tiny_data: tuple[Path, Path], tmp_path: Path) -> None:
    whole = tmp_path / "whole"
    run(make_config(whole, *tiny_data, split="all", heldout=0.3))
    shards = [tmp_path / f"s{i}" for i in range(3)]
    for index, shard in enumerate(shards):
        run(make_config(shard, *tiny_data, split="all", heldout=0.3, shard=f"{index}/3"))
    merged = tmp_path / "merged"
    merge(load_config(MergeConfig, None, [f"shards=[{','.join(map(str, shards))}]", f"output={merged}"]))
    for name in ("critic.jsonl", "critic-heldout.jsonl"):
        assert (merged / name).read_bytes() == (whole / name).read_bytes(), name
    for name in ("records.jsonl", "heldout.jsonl"):
        assert sorted(lines(merged / name)) == sorted(lines(whole / name)), name


def test_shards_partition_the_queries(tiny_data: tuple[Path, Path], tmp_path: Path) -> None:
    queries = load_queries(tiny_data[1])
    shards = [select_queries(queries, "all", f"{index}/3") for index in range(3)]
    ids = [query.id for shard in shards for query in shard]
    assert sorted(ids) == sorted(query.id for query in queries)
    assert all(shards)
    outputs = [run(make_config(tmp_path / f"s{i}", *tiny_data, shard=f"{i}/3", split="all")) for i in range(3)]
    # a question marked test goes to heldout.jsonl (split=all never trains on it)
    written = [path for out in outputs for path in (out.records_path, out.output / "heldout.jsonl")]
    query_ids = [json.loads(line)["meta"]["query_id"] for path in written for line in lines(path)]
    assert set(query_ids) == {query.id for query in queries}
    held = {query.id for query in queries if query.meta.get("split") == "test"}
    assert held and sum(out.stats["queries"] for out in outputs) == len(queries) - len(held)


def test_split_selection(tiny_data: tuple[Path, Path], tmp_path: Path) -> None:
    result = run(make_config(tmp_path / "out", *tiny_data, split="test"))
    assert result.stats["queries"] == 1 and result.stats["kinds"] == {"gold": 1, "distractor": 1}
    with pytest.raises(InputError, match="split=all"):
        run(make_config(tmp_path / "none", tiny_data[0], _no_split(tmp_path), split="train"))


def test_the_readmes_own_data_example_keeps_dev_and_test_questions_out_of_training(tmp_path: Path) -> None:
    """Before: `split=all heldout=0.1` (the README's example) put the questions marked dev and test into
    records.jsonl. Now split=all sends them to heldout.jsonl; the default (split=train) takes only train ones."""
    own = REPO / "tests" / "assets" / "own_data"
    marked = {query.id: query.meta.get("split") for query in load_queries(own / "questions.jsonl")}
    for name, extra in (("all", {"split": "all", "heldout": 0.1}), ("default", {})):
        result = run(make_config(tmp_path / name, own / "corpus.jsonl", own / "questions.jsonl", **extra))
        trained = {json.loads(line)["meta"]["query_id"] for line in lines(result.records_path)}
        held = {json.loads(line)["meta"]["query_id"] for line in lines(tmp_path / name / "heldout.jsonl")}
        assert trained and {marked[query_id] for query_id in trained} == {"train"}, name
        critic = {json.loads(line)["query_id"] for line in lines(tmp_path / name / "critic.jsonl")}
        assert {marked[query_id] for query_id in critic} == {"train"}, name
        if name == "all":
            assert {query_id for query_id, split in marked.items() if split in ("dev", "test")} <= held


def test_training_records_an_older_version_wrote_of_test_questions_are_not_resumed(tmp_path: Path) -> None:
    own = REPO / "tests" / "assets" / "own_data"
    config = make_config(tmp_path / "out", own / "corpus.jsonl", own / "questions.jsonl", split="all")
    run(config)
    records, held = tmp_path / "out" / "records.jsonl", tmp_path / "out" / "heldout.jsonl"
    leaked = [line for line in lines(held) if json.loads(line)["meta"].get("split") == "test"][:1]
    records.write_text(records.read_text() + leaked[0] + "\n")  # as split=all wrote them before
    held.write_text("".join(line + "\n" for line in lines(held) if line != leaked[0]))
    with pytest.raises(InputError, match=rf"{records}:\d+: a record of a question marked 'test'.*restart=true"):
        run(config)
    config.restart = True
    run(config)
    assert {json.loads(line)["meta"].get("split") for line in lines(records)} == {"train"}
    assert leaked[0] in lines(held)


def test_a_gold_id_not_in_the_corpus_is_refused_up_front_and_the_corrected_file_reruns(
    tiny_data: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: the error came mid-run, without file:line, told the user to use another corpus, and the output it left
    refused the corrected rerun as "made differently" until restart=true."""
    from selfrag.data_gen import gold_run

    corpus, queries = tiny_data
    good = queries.read_text()
    lines_ = good.splitlines()
    row = json.loads(lines_[3])
    assert row["gold_passage_ids"] == ["rome-0-1"]
    lines_[3] = json.dumps({**row, "gold_passage_ids": ["rome-0-7"]})
    queries.write_text("\n".join(lines_) + "\n")

    def no_slow_work(*args: object, **kwargs: object) -> None:
        raise AssertionError("the gold ids are checked before any passage is searched")

    with monkeypatch.context() as patched:
        patched.setattr(gold_run, "evidence_for", no_slow_work)
        with pytest.raises(InputError) as error:
            run(make_config(tmp_path / "out", corpus, queries, split="all"))
    message = str(error.value)
    assert message.startswith(f"{queries}:4: gold_passage_ids names 'rome-0-7' (query 'q-rome')")
    assert "closest id there is 'rome-0-1'" in message and "correct the id on that line" in message
    assert not (tmp_path / "out" / "records.jsonl").exists()
    queries.write_text(good)  # corrected: the same command runs, no restart=true needed
    result = run(make_config(tmp_path / "out", corpus, queries, split="all"))
    assert result.stats["records"] + result.stats["heldout_records"] > 0


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
    with pytest.raises(ConfigError, match="passages is required"):
        load_config(GenerateConfig, None, ["queries=q.jsonl", "output=out"])
    with pytest.raises(ConfigError) as error:
        make_config(tmp_path, distractors=-1, shard="3/2", labeler="teacher", limit=0, abstain_text="' '",
                    erased_negatives=2)
    message = str(error.value)
    for needle in (
        "distractors must be >= 0, got -1",
        "shard must be 'i/N' with 0 <= i < N, got '3/2'",
        "labeler must be one of ['gold', 'llm'], got 'teacher'",
        "limit must be >= 1 or null, got 0",
        "abstain_text must not be empty",
        "erased_negatives must be 0 or 1 (a gold passage has one erased form), got 2",
    ):
        assert needle in message


def test_demo_config_loads() -> None:
    config = load_config(GenerateConfig, REPO / "configs/data_gen/squad-demo.yaml")
    assert (REPO / config.passages).resolve() == DEMO_CORPUS.resolve()
    assert (REPO / config.queries).resolve() == DEMO_QUERIES.resolve()


def test_begin_slice_yields_both_support_labels(tmp_path: Path) -> None:
    begin = REPO / "data_gen" / "slices" / "begin"
    result = run(make_config(tmp_path / "out", begin / "corpus.jsonl", begin / "queries.jsonl", split="all"))
    assert result.stats["run"]["skipped"] == {}
    # one record each, no negatives; split=all sends the test questions to heldout.jsonl
    assert result.stats["records"] + result.stats["heldout_records"] == 60 and result.stats["heldout_records"]
    assert result.stats["queries"] == result.stats["records"]
    support = result.stats["labels"]["support"]
    assert set(support) == {rf.FULLY_SUPPORTED, rf.NO_SUPPORT}
    assert result.stats["labels"]["relevance"] == {rf.RELEVANT: result.stats["records"]}
    assert result.stats["kinds"] == {"gold": support[rf.FULLY_SUPPORTED], "support-negative": support[rf.NO_SUPPORT]}
    for row in map(json.loads, lines(result.records_path)):
        unsupported = row["segments"][0]["support"]["value"] == rf.NO_SUPPORT
        assert row["meta"].get("untrained_text", False) is unsupported, row["id"]
    critic = result.stats["critic_labels"]["support"]  # train and held-out critic rows: one per question
    assert set(critic) == set(support) and sum(critic.values()) == 60


def test_bad_support_label_names_file_query_and_fix(tiny_data: tuple[Path, Path], tmp_path: Path) -> None:
    corpus, queries = tiny_data
    row = {
        "id": "b1",
        "question": "Hi?",
        "output": "Hello.",
        "gold_passage_ids": ["paris-0-0"],
        "meta": {"split": "train", "support": "Fully attributable"},
    }
    queries.write_text(queries.read_text() + json.dumps(row) + "\n")
    with pytest.raises(InputError) as error:
        run(make_config(tmp_path / "out", corpus, queries))
    message = str(error.value)
    assert "\n" not in message and message.startswith(f"{queries}: query 'b1': meta.support must be one of")
    assert "'Fully attributable'" in message and "[Fully supported]" in message
