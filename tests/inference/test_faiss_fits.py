"""The compressed FAISS index with exact re-ranking (issue 46): recall against exact search on clustered vectors,
re-ranking from a memory-mapped float16 file (not anonymous memory), a killed build resumed without training again,
the factory picked by corpus size, and setting mistakes in one line."""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from selfrag.config import load_config
from selfrag.errors import ConfigError
from selfrag.inference.retrievers import faiss_index
from selfrag.inference.retrievers.dense import exact_top_k
from selfrag.inference.retrievers.faiss_index import ExactRerank
from selfrag.inference.retrievers.faiss_plan import default_nlist, default_pq_bytes, plan_faiss
from selfrag.inference.retrievers.index import IndexConfig, load_index
from selfrag.inference.retrievers.index_build import build
from selfrag.passages import PassageStore

pytest.importorskip("faiss")

DIMENSION = 32


class ClusteredEncoder:
    """Texts near one of 24 topic centres (picked by the text's hash), as sentence embeddings cluster by topic:
    exact neighbours are close and many, which is what makes product-quantized scores confuse them."""

    dimension = DIMENSION

    def __init__(self, fail_at_call: int | None = None) -> None:
        self.centres = np.random.default_rng(11).standard_normal((24, DIMENSION)).astype(np.float32)
        self.calls = 0

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        self.calls += 1
        rows = []
        for text in texts:
            rng = np.random.default_rng(int(hashlib.sha256(text.encode()).hexdigest()[:15], 16))
            rows.append(self.centres[rng.integers(24)] + 0.6 * rng.standard_normal(DIMENSION))
        vectors = np.asarray(rows, dtype=np.float32)
        return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


class Killed(BaseException):
    """Stands for the process dying: not an Exception, so no handler swallows it."""


def write_corpus(path: Path, count: int) -> Path:
    with path.open("w") as handle:
        for i in range(count):
            handle.write(json.dumps({"id": f"p{i}", "title": f"T{i % 50}", "text": f"passage number {i}"}) + "\n")
    return path


def config(corpus: Path, output: Path, *overrides: str) -> IndexConfig:
    base = [f"corpus={corpus}", f"output={output}", "kind=faiss", "shard_size=1000", "train_size=3000"]
    return load_config(IndexConfig, None, [*base, *overrides])


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_corpus(tmp_path_factory.mktemp("fits") / "corpus.jsonl", 3000)


def recall_at_10(retriever: object, encoder: ClusteredEncoder, store: PassageStore) -> float:
    matrix = encoder.encode([p.render() for p in store.by_rows(range(len(store)))])
    queries = encoder.encode([f"question {i}" for i in range(200)])
    truth, _ = exact_top_k(queries, matrix, 10)
    found = retriever.search_vectors(queries, 10)  # type: ignore[attr-defined]
    return float(np.mean([len({int(h.passage.id[1:]) for h in hits} & set(row.tolist())) / 10
                          for hits, row in zip(found, truth, strict=True)]))


def test_ivf_pq_with_exact_reranking_finds_the_exact_top_10(corpus: Path, tmp_path: Path) -> None:
    encoder = ClusteredEncoder()
    build(config(corpus, tmp_path / "x", "nlist=16", "pq_bytes=4", "nprobe=8", "rerank=100"), encoder=encoder,
          show_progress=False)
    options = json.loads((tmp_path / "x" / "index.json").read_text())["options"]
    assert (options["faiss_factory"], options["nprobe"], options["rerank"]) == ("IVF16,PQ4", 8, 100)
    assert np.load(tmp_path / "x" / "vectors.f16.npy", mmap_mode="r").shape == (3000, DIMENSION)
    store = PassageStore(tmp_path / "x" / "passages.sqlite")
    reranked = load_index(tmp_path / "x", encoder=encoder)
    assert isinstance(reranked.rerank.vectors, np.memmap)  # type: ignore[attr-defined]
    plain = load_index(tmp_path / "x", encoder=encoder, rerank=0)
    with_rerank, without = recall_at_10(reranked, encoder, store), recall_at_10(plain, encoder, store)
    assert with_rerank >= 0.95 and without < 0.8  # 4-byte codes alone lose the top 10; the exact re-rank finds it
    hits = reranked.search_vectors(encoder.encode(["question 3"]), 10)[0]  # type: ignore[attr-defined]
    assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True) and hits[0].passage.text


def test_reranking_reads_the_vectors_through_the_map_not_into_anonymous_memory(tmp_path: Path) -> None:
    rows, dimension = 200_000, 160  # a 64 MB float16 file
    path = tmp_path / "vectors.f16.npy"
    matrix = np.lib.format.open_memmap(path, mode="w+", dtype=np.float16, shape=(rows, dimension))
    rng = np.random.default_rng(0)
    for start in range(0, rows, 50_000):
        matrix[start : start + 50_000] = rng.standard_normal((50_000, dimension)).astype(np.float16)
    matrix.flush()
    del matrix
    rerank = ExactRerank.open(path, rows, dimension, candidates=2000)
    queries = rng.standard_normal((100, dimension)).astype(np.float32)
    candidates = np.arange(rows).reshape(100, 2000)  # every row of the file read once
    before = _memory()
    ranked = rerank.rerank(queries, candidates, 10)
    after = _memory()
    mib = 1 << 20
    assert (after["RssFile"] - before["RssFile"]) > 32 * mib  # the file's pages were read, through the map
    assert (after["RssAnon"] - before["RssAnon"]) < 16 * mib  # and not copied into the process
    vectors = np.load(path).astype(np.float32)
    best = np.argsort(-(vectors[:2000] @ queries[0]), kind="stable")[:10]
    assert ranked[0][0].tolist() == best.tolist()


def _memory() -> dict[str, int]:
    fields = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("RssAnon", "RssFile"):
            fields[key] = int(value.split()[0]) * 1024
    return fields


def test_a_build_killed_while_adding_resumes_without_training_again(
    corpus: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    overrides = ("nlist=16", "pq_bytes=4", "nprobe=8")
    writes = {"count": 0}
    real_write = faiss_index._HalfWriter.write

    def write_then_die(self: faiss_index._HalfWriter, start: int, block: np.ndarray) -> None:
        writes["count"] += 1
        if writes["count"] == 3:  # trained, two blocks added and written, killed at the third
            raise Killed
        real_write(self, start, block)

    monkeypatch.setattr(faiss_index, "_ADD_BLOCK", 1000)
    monkeypatch.setattr(faiss_index._HalfWriter, "write", write_then_die)
    with caplog.at_level(logging.INFO, logger="selfrag.inference.retrievers.faiss_index"), pytest.raises(Killed):
        build(config(corpus, tmp_path / "a", *overrides), encoder=ClusteredEncoder(), show_progress=False)
    assert "training IVF16,PQ4" in caplog.text and (tmp_path / ".a.building" / "trained.faiss").is_file()
    assert not (tmp_path / "a").exists()
    monkeypatch.setattr(faiss_index._HalfWriter, "write", real_write)
    caplog.clear()
    resumed = ClusteredEncoder()
    with caplog.at_level(logging.INFO, logger="selfrag.inference.retrievers.faiss_index"):
        build(config(corpus, tmp_path / "a", *overrides), encoder=resumed, show_progress=False)
    assert "reading the trained IVF16,PQ4" in caplog.text and "training" not in caplog.text
    assert resumed.calls == 0  # the embeddings were all recorded before the kill
    build(config(corpus, tmp_path / "b", *overrides), encoder=ClusteredEncoder(), show_progress=False)
    for name in ("index.faiss", "vectors.f16.npy"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == sorted(p.name for p in (tmp_path / "b").iterdir())
    assert not (tmp_path / "a" / "trained.faiss").exists() and not (tmp_path / "a" / "embeddings.npy").exists()


def test_the_factory_is_picked_by_corpus_size(corpus: Path, tmp_path: Path) -> None:
    assert plan_faiss(None, 2_834, 384) == plan_faiss(None, 100_000, 384)
    assert plan_faiss(None, 2_834, 384).factory == "Flat" and plan_faiss(None, 2_834, 384).rerank == 0
    assert plan_faiss(None, 1_000_000, 384).factory == "IVF1024,PQ48"
    assert plan_faiss(None, 21_000_000, 768).factory == "IVF4096,PQ96"
    assert (plan_faiss(None, 1_000_000, 384).rerank, plan_faiss(None, 1_000_000, 384).nprobe) == (450, 32)
    assert (plan_faiss(None, 21_000_000, 384).rerank, plan_faiss(None, 21_000_000, 384).nprobe) == (2050, 64)
    assert plan_faiss("HNSW32", 21_000_000, 384).rerank == 0 and plan_faiss("IVF64,PQ8", 9_000, 32).rerank == 200
    assert plan_faiss("IVF64,PQ8", 9_000, 32, rerank=0).rerank == 0
    assert default_nlist(3000) == 64 and default_nlist(200_000) == 512 and default_pq_bytes(100) == 10
    build(config(corpus, tmp_path / "small"), encoder=ClusteredEncoder(), show_progress=False)
    options = json.loads((tmp_path / "small" / "index.json").read_text())["options"]
    assert options["faiss_factory"] == "Flat" and options["rerank"] == 0
    assert not (tmp_path / "small" / "vectors.f16.npy").exists()


def test_a_setting_mistake_is_one_line_before_any_embedding(corpus: Path, tmp_path: Path) -> None:
    cases = [
        (["rerank=-1"], "rerank must be at least 0, got -1"),
        (["nlist=0"], "nlist must be at least 1, got 0"),
        (["faiss_factory=Flat", "nlist=16"], "nlist/pq_bytes shape the picked index, and faiss_factory=Flat"),
        (["nlist=16", "pq_bytes=5"], "pq_bytes=5 must divide the vectors' dimension 32; e.g. pq_bytes=4"),
        (["nprobe=8"], "nprobe=8 applies to IVF indexes, and 3000 passages get Flat"),
        (["nlsit=16"], "nlsit"),
    ]
    for overrides, message in cases:
        encoder = ClusteredEncoder()
        with pytest.raises(ConfigError, match=message) as raised:
            build(config(corpus, tmp_path / "x", *overrides), encoder=encoder, show_progress=False)
        assert encoder.calls == 0 and "\n" not in str(raised.value), overrides
    with pytest.raises(ConfigError, match="rerank=1 applies to kind=faiss only"):
        load_config(IndexConfig, None, [f"corpus={corpus}", f"output={tmp_path}", "rerank=1"])
    build(config(corpus, tmp_path / "flat"), encoder=ClusteredEncoder(), show_progress=False)
    with pytest.raises(ConfigError, match="rerank=5 needs .*vectors.f16.npy, and this index was built without it"):
        load_index(tmp_path / "flat", encoder=ClusteredEncoder(), rerank=5)
