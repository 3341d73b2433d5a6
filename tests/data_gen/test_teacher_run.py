"""labeler=llm against a real OpenAI-compatible server on loopback: faults, cache, resume, shards, golden files."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from teacher_inputs import write_inputs
from teacher_server import TeacherServer

from selfrag.config import load_config
from selfrag.data_gen.config import GenerateConfig
from selfrag.data_gen.merge import MergeConfig, merge
from selfrag.data_gen.outputs import OUTPUT_FILES
from selfrag.data_gen.run import run
from selfrag.errors import ConfigError
from selfrag.trajectory import Record, parse_trajectory

REPO = Path(__file__).resolve().parents[2]
GOLDEN = REPO / "tests" / "assets" / "golden"

QUERIES = [
    {"id": "q1", "question": "What is the capital of France?", "answer": "Paris is the capital of France."},
    {
        "id": "q2",
        "question": "When was the Eiffel Tower in Paris built?",
        "output": "Paris is the capital of France. The Eiffel Tower was built in 1889 for a world fair. "
        "It is tall and pretty.",
    },
    {"id": "q3", "question": "Write a poem about rain."},
    {"id": "q4", "question": "What is the capital of Italy? #vocab", "answer": "Rome"},
    {"id": "q5", "question": "Which city is the capital of Germany? #malformed", "answer": "Berlin is its capital."},
    {"id": "q6", "question": "What is the capital of Spain? #hopeless", "answer": "Madrid"},
]


@pytest.fixture
def data(tmp_path: Path) -> tuple[Path, Path]:
    return write_inputs(tmp_path, QUERIES)


def overrides(url: str, data: tuple[Path, Path], output: Path, *extra: str) -> list[str]:
    return [
        "labeler=llm",
        "teacher.model=scripted-teacher",
        f"teacher.engine_options.base_url={url}",
        "teacher.engine_options.timeout=0.3",
        "teacher.engine_options.backoff=0.01",
        "split=all",
        f"passages={data[0]}",
        f"queries={data[1]}",
        f"output={output}",
        *extra,
    ]


def generate(url: str, data: tuple[Path, Path], output: Path, *extra: str):  # type: ignore[no-untyped-def]
    return run(load_config(GenerateConfig, None, overrides(url, data, output, *extra)))


def rows(path: Path) -> list[dict]:  # type: ignore[type-arg]
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_faults_every_question_labelled_or_dropped_with_reason(data: tuple[Path, Path], tmp_path: Path) -> None:
    with TeacherServer(faults=True, timeout_delay=0.6) as server:
        result = generate(server.url, data, tmp_path / "out")
    # Every kind of fault was injected and survived.
    assert {"429", "500", "malformed body", "timeout"} <= set(server.statuses)
    records = {row["meta"]["query_id"]: row for row in rows(tmp_path / "out" / "records.jsonl")}
    drops = rows(tmp_path / "out" / "drops.jsonl")
    dropped = {row["query_id"] for row in drops if row["question_dropped"]}
    assert set(records) == {"q1", "q2", "q3", "q5"}  # q5: malformed first replies, re-asked and labelled
    assert dropped == {"q4", "q6"} and set(records) | dropped == {q["id"] for q in QUERIES}
    reasons = {row["query_id"]: row["reason"] for row in drops}
    # A teacher that repeats its malformed reply after a correction is not asked a third time.
    again = "the same reply again after a correction (2 tries)"
    assert reasons["q6"] == f"retrieve: reply is not JSON, {again}"
    assert f"relevance: label outside the vocabulary, {again}" in [r["reason"] for r in drops if r["query_id"] == "q4"]
    stats = result.stats
    assert stats["questions_labelled"] == 4 and stats["questions_dropped"] == 2
    assert stats["drops"][f"relevance: label outside the vocabulary, {again}"] == 3
    for row in records.values():
        record = Record.from_json(row)
        assert parse_trajectory(record.render()).well_formed, record.render()
        labels = [seg[slot] for seg in row["segments"] for slot in ("retrieve", "relevance", "support") if seg[slot]]
        for label in [*labels, row["utility"]]:
            assert (
                label["labeler"] == "llm" and label["model"] == "scripted-teacher" and len(label["prompt_hash"]) == 16
            )
    assert records["q3"]["segments"][0]["retrieve"]["value"] == "[No Retrieval]"
    assert [s["retrieve"]["value"] for s in records["q2"]["segments"]] == [
        "[Retrieval]",
        "[Continue to Use Evidence]",
        "[No Retrieval]",
    ]
    critic = rows(tmp_path / "out" / "critic.jsonl")
    assert {row["type"] for row in critic} == {"retrieve", "relevance", "support", "utility"}
    assert all(row["target"] and row["prompt_hash"] for row in critic)


def test_rerun_answers_from_the_cache_and_writes_the_same_bytes(data: tuple[Path, Path], tmp_path: Path) -> None:
    with TeacherServer(faults=True, timeout_delay=0.6) as server:
        generate(server.url, data, tmp_path / "out")
        before = {name: (tmp_path / "out" / name).read_bytes() for name in OUTPUT_FILES}
        calls, usable = len(server.answered), len(server.usable_answered())
        (tmp_path / "out" / "journal.jsonl").unlink()  # forget finished questions: only the cache is left
        again = generate(server.url, data, tmp_path / "out")
        assert len(server.usable_answered()) == usable  # no usable reply asked again
    # only the unusable replies (q4, q5, q6's faults) were not cached: those are asked again
    assert again.stats["run"]["teacher_calls_made"] == len(server.answered) - calls > 0
    assert again.stats["run"]["teacher_calls_from_cache"] == usable
    assert {name: (tmp_path / "out" / name).read_bytes() for name in OUTPUT_FILES} == before


def test_other_settings_refused_unless_restart(data: tuple[Path, Path], tmp_path: Path) -> None:
    with TeacherServer() as server:
        generate(server.url, data, tmp_path / "out")
        # speed settings may change
        generate(server.url, data, tmp_path / "out", "teacher.engine_options.concurrency=2")
        with pytest.raises(ConfigError) as error:
            generate(server.url, data, tmp_path / "out", "top_k=2", "teacher.model=other")
        message = str(error.value)
        assert "top_k=2 (was 3)" in message and "teacher.model='other'" in message and "restart=true" in message
        result = generate(server.url, data, tmp_path / "out", "top_k=2", "restart=true")
    assert result.stats["run"]["questions_already_done"] == 0


def test_a_folder_written_when_the_seed_was_teacher_seed_resumes(data: tuple[Path, Path], tmp_path: Path) -> None:
    """teacher.seed is teacher.engine_options.seed now (the runtime's engine options): a folder whose fingerprint
    recorded teacher.seed resumes (and records it as spelled now); one made with another seed is refused, the key
    named as spelled now."""
    out = tmp_path / "out"
    fingerprint_file = out / "fingerprint.json"

    def record_as_before(seed: int) -> None:
        fingerprint = json.loads(fingerprint_file.read_text())
        del fingerprint["settings"]["teacher.engine_options.seed"]
        fingerprint["settings"]["teacher.seed"] = seed
        fingerprint_file.write_text(json.dumps(fingerprint))

    with TeacherServer() as server:
        first = generate(server.url, data, out)
        record_as_before(0)
        again = generate(server.url, data, out)
        assert again.stats["run"]["questions_already_done"] == len(QUERIES) == first.stats["questions"]
        assert again.stats["run"]["teacher_calls_made"] == 0
        assert "teacher.engine_options.seed" in json.loads(fingerprint_file.read_text())["settings"]
        record_as_before(5)
        with pytest.raises(ConfigError, match=r"teacher\.engine_options\.seed=0 \(was 5\)"):
            generate(server.url, data, out)


def test_api_key_is_sent_but_never_stored(data: tuple[Path, Path], tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    secret = "sk-test-DO-NOT-STORE-1234567890"
    monkeypatch.setenv("SELFRAG_TEST_KEY", secret)
    with TeacherServer() as server:
        generate(server.url, data, tmp_path / "out", "teacher.engine_options.api_key_env=SELFRAG_TEST_KEY")
    assert server.authorization == {f"Bearer {secret}"}
    for path in (tmp_path / "out").iterdir():
        assert secret.encode() not in path.read_bytes(), path
    monkeypatch.delenv("SELFRAG_TEST_KEY")
    with TeacherServer() as server, pytest.raises(Exception, match="SELFRAG_TEST_KEY is empty"):
        generate(server.url, data, tmp_path / "fresh", "teacher.engine_options.api_key_env=SELFRAG_TEST_KEY")


def test_heldout_split_is_by_question(data: tuple[Path, Path], tmp_path: Path) -> None:
    with TeacherServer() as server:
        result = generate(server.url, data, tmp_path / "out", "heldout=0.5", "seed=3")
    out = tmp_path / "out"
    train = {row["meta"]["query_id"] for row in rows(out / "records.jsonl")}
    held = {row["meta"]["query_id"] for row in rows(out / "heldout.jsonl")}
    assert train and held and not train & held
    assert {row["query_id"] for row in rows(out / "critic.jsonl")} <= train | {"q4", "q6"}
    assert {row["query_id"] for row in rows(out / "critic-heldout.jsonl")} <= held | {"q4", "q6"}
    assert result.stats["records"] == {"train": len(train), "heldout": len(held)}


def test_split_all_never_puts_a_dev_or_test_question_into_the_training_records(tmp_path: Path) -> None:
    """Before: split=all trained on every question marked dev or test. Now they go to the held-out files; split=test
    (asked for by name) still makes records of the test questions."""
    marked = [dict(query, meta={"split": split}) for query, split in zip(QUERIES[:3], ("train", "dev", "test"),
                                                                         strict=True)]
    unmarked = dict(QUERIES[0], id="q7", question="Which city is the capital of France?")
    data = write_inputs(tmp_path, [*marked, unmarked])
    with TeacherServer() as server:
        generate(server.url, data, tmp_path / "all")
        generate(server.url, data, tmp_path / "test", "split=test")
    train = {row["meta"]["query_id"] for row in rows(tmp_path / "all" / "records.jsonl")}
    held = {row["meta"]["query_id"] for row in rows(tmp_path / "all" / "heldout.jsonl")}
    assert train == {"q1", "q7"} and held == {"q2", "q3"}
    assert {row["query_id"] for row in rows(tmp_path / "all" / "critic.jsonl")} == {"q1", "q7"}
    assert {row["meta"]["query_id"] for row in rows(tmp_path / "test" / "records.jsonl")} == {"q3"}


def test_shards_merge_to_the_unsharded_output(data: tuple[Path, Path], tmp_path: Path) -> None:
    with TeacherServer() as server:
        generate(server.url, data, tmp_path / "whole")
        for index in range(3):
            generate(server.url, data, tmp_path / f"shard-{index}", f"shard={index}/3")
    shards = [tmp_path / f"shard-{index}" for index in range(3)]
    merge(load_config(MergeConfig, None, [f"shards=[{','.join(map(str, shards))}]", f"output={tmp_path / 'merged'}"]))
    for name in OUTPUT_FILES:
        assert (tmp_path / "merged" / name).read_bytes() == (tmp_path / "whole" / name).read_bytes(), name
    with pytest.raises(ConfigError, match="missing"):
        merge(load_config(MergeConfig, None, [f"shards=[{shards[0]},{shards[2]}]", f"output={tmp_path / 'bad'}"]))
    # a shard an older version wrote (its config.yaml says teacher.seed) merges with the others, read as spelled now
    written = shards[1] / "config.yaml"

    def spelled_before(seed: int) -> None:
        config = yaml.safe_load(written.read_text())
        config["teacher"]["engine_options"].pop("seed", None)
        config["teacher"]["seed"] = seed
        written.write_text(yaml.safe_dump(config))

    every = f"shards=[{','.join(map(str, shards))}]"
    spelled_before(0)
    merge(load_config(MergeConfig, None, [every, f"output={tmp_path / 'old-and-new'}"]))
    spelled_before(5)
    with pytest.raises(ConfigError, match=r"teacher\.engine_options\.seed=5 differs from 0"):
        merge(load_config(MergeConfig, None, [every, f"output={tmp_path / 'other-seed'}"]))


def test_teacher_writes_questions_when_there_are_none(data: tuple[Path, Path], tmp_path: Path) -> None:
    with TeacherServer() as server:
        result = generate(server.url, data, tmp_path / "out", "queries=null", "question_count=3", "seed=1")
    records = rows(tmp_path / "out" / "records.jsonl")
    assert result.stats["questions"] == 3 and len(records) == 3
    assert all(row["instruction"].startswith("What does the passage about") for row in records)
    assert all(row["source"] == "teacher" and row["id"].startswith("gen/") for row in records)


def test_golden_records_and_training_text(data: tuple[Path, Path], tmp_path: Path) -> None:
    """Fixed teacher replies -> exact records and rendered training text (golden files are written by hand)."""
    with TeacherServer() as server:
        generate(server.url, data, tmp_path / "out")
    got = (tmp_path / "out" / "records.jsonl").read_text(encoding="utf-8")
    assert got == (GOLDEN / "llm_records.jsonl").read_text(encoding="utf-8")
    text = "".join(Record.from_json(json.loads(line)).render() + "\n" for line in got.splitlines())
    assert text == (GOLDEN / "llm_records.rendered.txt").read_text(encoding="utf-8")
    critic = (tmp_path / "out" / "critic.jsonl").read_text(encoding="utf-8")
    assert critic == (GOLDEN / "llm_critic.jsonl").read_text(encoding="utf-8")


def _cached_keys(cache: Path) -> set[str]:
    if not cache.exists():
        return set()
    db = sqlite3.connect(cache)
    try:
        return {row[0] for row in db.execute("SELECT key FROM calls")}
    finally:
        db.close()


def _command(url: str, data: tuple[Path, Path], output: Path) -> list[str]:
    # a cache of the killed runs' own (the reference run's shared cache would answer every call)
    extra = ["teacher.engine_options.concurrency=2", f"teacher.cache={output / 'teacher-cache.sqlite'}"]
    return [sys.executable, "-m", "selfrag.app.cli", "generate", *overrides(url, data, output, *extra)]


def test_sigkill_at_several_points_then_resume_is_byte_identical(data: tuple[Path, Path], tmp_path: Path) -> None:
    many = [dict(q, id=f"{q['id']}-{n}", question=f"{q['question']} (variant {n})") for n in range(4) for q in QUERIES]
    data[1].write_text("".join(json.dumps(row) + "\n" for row in many))
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with TeacherServer(latency=0.02) as server:
        # the uninterrupted reference
        generate(server.url, data, tmp_path / "whole", "teacher.engine_options.concurrency=2")
        total = len(server.usable_answered())
        server.answered.clear()
        out = tmp_path / "killed"
        for kill_after in (total // 6, total // 3, (2 * total) // 3):
            cached_before = _cached_keys(out / "teacher-cache.sqlite")
            start = len(server.answered)
            process = subprocess.Popen(_command(server.url, data, out), env=env, stderr=subprocess.DEVNULL)
            deadline = time.monotonic() + 60
            while len(server.answered) < kill_after and process.poll() is None and time.monotonic() < deadline:
                time.sleep(0.005)
            process.send_signal(signal.SIGKILL)
            process.wait()
            assert not set(server.answered_keys()[start:]) & cached_before  # nothing cached was asked again
        cached_before = _cached_keys(out / "teacher-cache.sqlite")
        start = len(server.answered)
        final = subprocess.run(_command(server.url, data, out), env=env, capture_output=True, text=True)
        assert final.returncode == 0, final.stderr
        assert not set(server.answered_keys()[start:]) & cached_before
        # Only calls in flight at a kill (at most concurrency=2 each) may be answered twice in all (besides the
        # unusable replies, never cached: a rerun asks them again).
        assert len(server.usable_answered()) <= total + 3 * 2
    for name in OUTPUT_FILES:
        assert (out / name).read_bytes() == (tmp_path / "whole" / name).read_bytes(), name
    records = rows(out / "records.jsonl")
    assert len({row["id"] for row in records}) == len(records) == 16  # 4 variants x 4 labelled questions


@pytest.mark.slow
def test_hf_teacher_labels_with_the_real_small_model(data: tuple[Path, Path], tmp_path: Path) -> None:
    """SmolLM2-135M as a (weak) local teacher: batched chat calls; its labels are parsed or dropped, never crash."""
    config = load_config(
        GenerateConfig,
        None,
        [
            "labeler=llm",
            "teacher.engine=hf",
            "teacher.model=smollm2-135m-instruct",
            "teacher.engine_options.batch_size=8",
            "label_retries=0",
            "split=all",
            "limit=2",
            f"passages={data[0]}",
            f"queries={data[1]}",
            f"output={tmp_path / 'out'}",
        ],
    )
    result = run(config)
    assert result.stats["questions"] == 2
    assert result.stats["teacher"]["calls"] >= 2 and result.stats["teacher"]["completion_tokens"] > 0
    again = run(config)
    assert again.stats["run"]["teacher_calls_made"] == 0


def test_permanent_teacher_error_stops_with_a_config_error(data: tuple[Path, Path], tmp_path: Path) -> None:
    with TeacherServer() as server:
        server.handle = lambda handler, body: server._send(handler, 404, {"error": "no such model"}, {}, "404")  # type: ignore[method-assign]
        fix = "check teacher.engine_options.base_url, teacher.model"
        with pytest.raises(ConfigError, match=f"teacher: HTTP 404 .* {fix}"):
            generate(server.url, data, tmp_path / "out")


def test_folder_corpus_without_queries(tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "paris.md").write_text("Paris\n" + " ".join(["Paris is the capital of France."] * 30))
    (docs / "rome.txt").write_text("Rome is the capital of Italy. The Colosseum stands in Rome.")
    with TeacherServer() as server:
        config = load_config(
            GenerateConfig,
            None,
            [
                "labeler=llm",
                "teacher.model=scripted-teacher",
                f"teacher.engine_options.base_url={server.url}",
                f"passages={docs}",
                "queries=null",
                "chunk_words=60",
                "chunk_overlap=10",
                "question_count=10",
                "split=all",
                f"output={tmp_path / 'out'}",
            ],
        )
        result = run(config)
    chunks = rows(tmp_path / "out" / "corpus.jsonl")
    assert [(c["id"], c["source"], c["start_word"]) for c in chunks] == [
        ("paris.md#0", "paris.md", 0),
        ("paris.md#1", "paris.md", 50),
        ("paris.md#2", "paris.md", 100),
        ("paris.md#3", "paris.md", 150),
        ("rome.txt", "rome.txt", 0),
    ]
    assert result.stats["questions"] == 5  # question_count is capped by the chunks there are
    assert {row["id"] for row in rows(tmp_path / "out" / "records.jsonl")} == {f"gen/{c['id']}/llm" for c in chunks}


def test_a_rerun_names_the_questions_that_changed_and_their_file(data: tuple[Path, Path], tmp_path: Path,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    with TeacherServer() as server:
        generate(server.url, data, tmp_path / "out")
        edited = [{**query, "question": query["question"] + " Today?"} if query["id"] == "q1" else query
                  for query in QUERIES]
        data[1].write_text("".join(json.dumps(query) + "\n" for query in edited), encoding="utf-8")
        with caplog.at_level("WARNING", logger="selfrag.data_gen.teacher_run"):
            generate(server.url, data, tmp_path / "out")
    # was "1 questions changed since the run in OUT; labelling them again": neither the question nor the file
    assert f"1 question(s) changed since the run in {tmp_path / 'out'} ('q1'; from {data[1]})" in caplog.text
