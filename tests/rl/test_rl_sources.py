"""``selfrag rl`` over several sources, as a data recipe names them: ``more_queries`` joins question files,
``more_passages`` joins passage files to ``retriever.corpus`` in one index, ``per_source`` keeps the largest source
from crowding out the rest, and every further file is part of the run's fingerprint by content."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from selfrag.config import load_config
from selfrag.errors import ConfigError, InputError
from selfrag.rl.config import RLConfig
from selfrag.rl.run import open_rl_retriever, read_questions, rl_fingerprint


def _write(path: Path, rows: list[dict]) -> Path:  # type: ignore[type-arg]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


@pytest.fixture()
def sources(tmp_path: Path) -> dict[str, Path]:
    big = [{"id": f"sq-{n}", "question": f"What is item {n}?", "answers": [f"item {n}"],
            "meta": {"source": "squad_v2", "split": "train"}} for n in range(6)]
    small = [{"id": f"nq-{n}", "question": f"who painted picture {n}", "answers": [f"painter {n}"],
              "meta": {"source": "nq-open", "split": "train"}} for n in range(3)]
    small.append({"id": "nq-held", "question": "who painted the held-out one", "answers": ["nobody"],
                  "meta": {"source": "nq-open", "split": "test"}})
    untagged = [{"id": "gk-0", "question": "What is the capital of France?", "answers": ["Paris"],
                 "meta": {"split": "train"}}]
    corpus = [{"id": "c0", "title": "Items", "text": "Item 0 is the first of the items."}]
    more = [{"id": "m0", "title": "Zeppelin", "text": "The airship Hindenburg was painted silver by Ludwig Dürr."}]
    return {"queries": _write(tmp_path / "big.jsonl", big), "small": _write(tmp_path / "small.jsonl", small),
            "untagged": _write(tmp_path / "untagged.jsonl", untagged), "corpus": _write(tmp_path / "c.jsonl", corpus),
            "more": _write(tmp_path / "more.jsonl", more), "out": tmp_path / "rl"}


def _config(files: dict[str, Path], *overrides: str) -> RLConfig:
    return load_config(RLConfig, None, [f"retriever.corpus={files['corpus']}", *overrides], model="unused",
                       queries=str(files["queries"]), output_dir=str(files["out"]))


def test_more_queries_join_the_split_and_per_source_balances_them(sources: dict[str, Path]) -> None:
    joined = f"more_queries=[{sources['small']},{sources['untagged']}]"
    ids = [q.id for q in read_questions(_config(sources, joined))]
    assert ids == [*(f"sq-{n}" for n in range(6)), "nq-0", "nq-1", "nq-2", "gk-0"]  # the split: nq-held is a test one
    balanced = [q.id for q in read_questions(_config(sources, joined, "per_source=2"))]
    assert balanced == ["sq-0", "sq-1", "nq-0", "nq-1", "gk-0"]  # a file without meta.source is its own source
    assert [q.id for q in read_questions(_config(sources, joined, "per_source=2", "limit=3"))] == ["sq-0", "sq-1",
                                                                                                   "nq-0"]
    alone = [q.id for q in read_questions(_config(sources, "per_source=2"))]
    assert alone == ["sq-0", "sq-1"]


def test_per_source_groups_interleaved_sources_in_the_order_they_first_appear(sources: dict[str, Path],
                                                                               tmp_path: Path) -> None:
    rows = [{"id": f"{source}-{n}", "question": f"{source} question {n}?", "answers": ["x"],
             "meta": {"source": source, "split": "train"}} for n in range(3) for source in ("math", "chat")]
    mixed = _write(tmp_path / "mixed.jsonl", rows)  # math-0, chat-0, math-1, chat-1, ...
    ids = [q.id for q in read_questions(_config({**sources, "queries": mixed}, "per_source=2"))]
    assert ids == ["math-0", "math-1", "chat-0", "chat-1"]


def test_a_question_id_in_two_files_is_refused_with_both(sources: dict[str, Path], tmp_path: Path) -> None:
    again = _write(tmp_path / "again.jsonl", [{"id": "sq-3", "question": "Again?", "answers": ["yes"]}])
    with pytest.raises(InputError, match=r"again\.jsonl: query id 'sq-3' is also in .*big\.jsonl; .*prefix"):
        read_questions(_config(sources, f"more_queries=[{again}]"))


def test_more_passages_are_searched_with_the_corpus(sources: dict[str, Path], tmp_path: Path) -> None:
    alone = open_rl_retriever(_config(sources))
    assert [hit.passage.id for hit in alone.search("who painted the Hindenburg airship", k=2)] == ["c0"]
    joined = open_rl_retriever(_config(sources, f"more_passages=[{sources['more']}]"))
    assert joined.search("who painted the Hindenburg airship", k=1)[0].passage.id == "m0"
    dense = open_rl_retriever(_config(sources, f"more_passages=[{sources['more']}]", "retriever.kind=dense"))
    assert dense.kind == "dense" and dense.search("who painted the Hindenburg airship", k=1)[0].passage.id == "m0"
    clash = _write(tmp_path / "clash.jsonl", [{"id": "c0", "title": "Other", "text": "Another first passage."}])
    with pytest.raises(InputError, match=r"clash\.jsonl:1: duplicate passage id 'c0' \(first at .*c\.jsonl:1\)"):
        open_rl_retriever(_config(sources, f"more_passages=[{clash}]"))


def test_more_passages_need_an_in_memory_corpus(sources: dict[str, Path]) -> None:
    with pytest.raises(ConfigError, match="more_passages joins passage files to retriever.corpus"):
        load_config(RLConfig, None, [f"retriever.index={sources['out']}", f"more_passages=[{sources['more']}]"],
                    model="unused", queries=str(sources["queries"]), output_dir=str(sources["out"]))
    from selfrag.inference.retrievers.spec import RetrieverConfig, open_retriever

    with pytest.raises(ConfigError, match="further passage files join retriever.corpus"):  # the API, as every stage
        open_retriever(RetrieverConfig(index=str(sources["out"])), more=[sources["more"]])
    with pytest.raises(ConfigError, match="per_source must be at least 1"):
        _config(sources, "per_source=0")


def test_further_files_count_by_content_and_only_when_set(sources: dict[str, Path], tmp_path: Path) -> None:
    plain = rl_fingerprint(_config(sources))
    assert not any(key.startswith("more_") for key in plain["inputs"])  # a run made before they existed still matches
    joined = rl_fingerprint(_config(sources, f"more_queries=[{sources['small']}]"))
    moved = tmp_path / "moved.jsonl"
    moved.write_bytes(sources["small"].read_bytes())
    assert rl_fingerprint(_config(sources, f"more_queries=[{moved}]"))["inputs"] == joined["inputs"]
    assert rl_fingerprint(_config(sources, f"more_queries=[{moved}]"))["settings"] == joined["settings"]
    moved.write_text(moved.read_text(encoding="utf-8").replace("painter 0", "painter 9"), encoding="utf-8")
    assert rl_fingerprint(_config(sources, f"more_queries=[{moved}]"))["inputs"] != joined["inputs"]
