"""Every stable-hash split keeps the assignments it had: held-out questions (training and generate), generate's
shards, the converters' test split and the judgement study's question order.

The expected values live in tests/assets/golden/stable_splits.json, computed once by the five functions as they
were at commit 7d12181 (before they became one); this test only reads that file. A failure here means held-out
sets, shards or test questions moved for every user: never "fix" it by regenerating the file.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from selfrag.corpus import Query
from selfrag.data_gen.converters import split_of
from selfrag.data_gen.queries import select_queries
from selfrag.splits import SplitError, in_fraction, shard_of, stable_hash
from selfrag.training.dataset import split_records
from selfrag.training.judgement import select_items
from selfrag.trajectory import Record

GOLDEN = Path(__file__).resolve().parents[1] / "assets" / "golden" / "stable_splits.json"
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def golden() -> dict[str, Any]:
    return json.loads(GOLDEN.read_text(encoding="utf-8"))


def _bits(values: Any) -> str:
    return "".join("1" if value else "0" for value in values)


def _params(key: str) -> tuple[float, int]:
    fraction, seed = key.split(":")
    return float(fraction), int(seed)


def test_golden_covers_shipped_ids_and_both_sides(golden: dict[str, Any]) -> None:
    ids = golden["ids"]
    assert len(ids) == len(set(ids)) > 300
    assert "" in ids and "日本語-1" in ids  # the odd ones too
    assert golden["training.dataset.is_held_out"]["0.05:0"].count("1") > 10  # not a file of zeros


@pytest.mark.parametrize("caller", ["training.dataset.is_held_out", "data_gen.outputs.is_heldout"])
def test_held_out_splits_of_training_and_generate(golden: dict[str, Any], caller: str) -> None:
    """Both draws were already the same function of (id, fraction, seed); both are pinned."""
    for key, expected in golden[caller].items():
        fraction, seed = _params(key)
        assert _bits(in_fraction(i, fraction, seed) for i in golden["ids"]) == expected, (caller, key)


def test_training_splits_records_by_the_pinned_draw(golden: dict[str, Any]) -> None:
    ids = golden["ids"]
    records = [Record(f"r{n}", "q?", (), None, meta={"query_id": i}) for n, i in enumerate(ids)]
    train, held_out = split_records(records, 0.05, 0)
    expected = golden["training.dataset.is_held_out"]["0.05:0"]
    assert _bits(record.id in {r.id for r in held_out} for record in records) == expected
    assert len(train) + len(held_out) == len(records)


def test_converters_test_split(golden: dict[str, Any]) -> None:
    expected = golden["data_gen.converters.split_of"]
    assert _bits(split_of(i) == "test" for i in golden["ids"]) == expected["default"]
    for key in ("0.1", "0.2", "0.5"):
        assert _bits(split_of(i, float(key)) == "test" for i in golden["ids"]) == expected[key], key


def test_generate_shards(golden: dict[str, Any]) -> None:
    for key, expected in golden["data_gen.run.shard_of"].items():
        assert [shard_of(i, int(key)) for i in golden["ids"]] == expected, key


def test_generate_shard_selection_uses_the_same_shards(golden: dict[str, Any]) -> None:
    queries = [Query(i, "q?", meta={"split": "train"}) for i in golden["ids"]]
    expected = golden["data_gen.run.shard_of"]["4"]
    for index in range(4):
        chosen = [query.id for query in select_queries(queries, "train", f"{index}/4")]
        assert chosen == [i for i, shard in zip(golden["ids"], expected, strict=True) if shard == index]


def test_judgement_order(golden: dict[str, Any]) -> None:
    assert [f"{stable_hash(i):016x}" for i in golden["ids"]] == golden["training.judgement._stable"]
    ids = golden["ids"][:60]
    chosen = select_items([{"id": f"{q}-gold", "query_id": q, "kind": "gold"} for q in ids], 15)
    order = sorted(ids, key=lambda i: golden["training.judgement._stable"][golden["ids"].index(i)])
    assert [row["query_id"] for row in chosen] == order[:15]


def test_relevance_probe_order(golden: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(REPO / "studies"))
    sys.modules.pop("relevance_probe", None)
    from relevance_probe import stable_order

    assert [f"{stable_order(i):016x}" for i in golden["ids"]] == golden["studies.relevance_probe.stable_order"]


def test_stable_hash_parameters_are_checked() -> None:
    assert stable_hash("q", 3) == stable_hash("3:q")  # the seed is a prefix of the key
    assert stable_hash("q", algorithm="sha1", width=None) >= 2**64  # the whole 20-byte digest
    with pytest.raises(SplitError, match="algorithm must be one of"):
        stable_hash("q", algorithm="md5")  # type: ignore[arg-type]
    with pytest.raises(SplitError, match=r"width must be in \[1, 32\]"):
        stable_hash("q", width=33)
    with pytest.raises(SplitError, match="shard count must be at least 1"):
        shard_of("q", 0)


def test_a_larger_fraction_keeps_every_key_of_a_smaller_one(golden: dict[str, Any]) -> None:
    small = [i for i in golden["ids"] if in_fraction(i, 0.1, 0)]
    assert small and all(in_fraction(i, 0.3, 0) for i in small)
    assert not any(in_fraction(i, 0.0, 0) or in_fraction(i, -1.0, 0) for i in golden["ids"])
