"""kind=faiss and kind=dense indexes on a scripted encoder: resumable embedding shards, FAISS against exact search,
bad settings in one line, and opening an index without reading its passages or its corpus."""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from selfrag.config import load_config
from selfrag.errors import ConfigError, InputError
from selfrag.inference.retrievers import index_build
from selfrag.inference.retrievers.dense import exact_top_k
from selfrag.inference.retrievers.index import IndexConfig, load_index
from selfrag.inference.retrievers.index_build import build
from selfrag.passages import PassageStore

pytest.importorskip("faiss")

WORDS = "river city planet music war king science film ocean bridge mountain novel".split()


class HashEncoder:
    """A text's vector from its SHA-256 (the same text, the same vector, in any batch); counts what it encodes."""

    dimension = 16

    def __init__(self, fail_at_call: int | None = None) -> None:
        self.calls = 0
        self.encoded: list[str] = []
        self.fail_at_call = fail_at_call

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        self.calls += 1
        if self.calls == self.fail_at_call:
            raise Killed
        self.encoded.extend(texts)
        rows = [np.random.default_rng(int(hashlib.sha256(t.encode()).hexdigest()[:15], 16)).standard_normal(16)
                for t in texts]
        vectors = np.asarray(rows, dtype=np.float32)
        return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


class Killed(BaseException):
    """Stands for the process dying: not an Exception, so no handler swallows it."""


def write_corpus(path: Path, count: int) -> Path:
    rng = np.random.default_rng(7)
    with path.open("w") as handle:
        for i in range(count):
            text = " ".join(rng.choice(WORDS, size=8))
            handle.write(json.dumps({"id": f"d{i}", "title": f"T{i % 9}", "text": f"{text} {i}"}) + "\n")
    return path


def config(corpus: Path, output: Path, *overrides: str) -> IndexConfig:
    base = [f"corpus={corpus}", f"output={output}", "kind=faiss", "faiss_factory=Flat", "shard_size=10"]
    return load_config(IndexConfig, None, [*base, *overrides])


@pytest.fixture()
def corpus(tmp_path: Path) -> Path:
    return write_corpus(tmp_path / "corpus.jsonl", 95)


def test_killed_at_a_shard_boundary_resumes_only_the_unfinished_shards(corpus: Path, tmp_path: Path) -> None:
    with pytest.raises(Killed):  # dies when asked for shard 4, shards 0-3 written
        build(config(corpus, tmp_path / "a"), encoder=HashEncoder(fail_at_call=5), show_progress=False)
    assert not (tmp_path / "a").exists()  # nothing that opens
    resumed = HashEncoder()
    build(config(corpus, tmp_path / "a"), encoder=resumed, show_progress=False)
    assert resumed.calls == 6 and len(resumed.encoded) == 55  # shards 4..9 (the last one of 5 passages)
    build(config(corpus, tmp_path / "b"), encoder=HashEncoder(), show_progress=False)
    assert (tmp_path / "a" / "index.faiss").read_bytes() == (tmp_path / "b" / "index.faiss").read_bytes()
    assert not list(tmp_path.glob(".a.*")) and not (tmp_path / "a" / "embeddings.npy").exists()


def test_killed_mid_shard_between_its_pieces(corpus: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from selfrag.inference.retrievers import embeddings

    monkeypatch.setattr(embeddings, "_PIECE", 4)  # shards of 10 encoded as 4 + 4 + 2
    with pytest.raises(Killed):  # call 5 is shard 1's second piece: its first piece is already in the matrix
        build(config(corpus, tmp_path / "a", "kind=dense"), encoder=HashEncoder(fail_at_call=5), show_progress=False)
    assert (tmp_path / ".a.building" / "embeddings.npy.done").read_text() == "0\n"
    resumed = HashEncoder()
    build(config(corpus, tmp_path / "a", "kind=dense"), encoder=resumed, show_progress=False)
    assert len(resumed.encoded) == 85 and resumed.calls == 9 * 3 - 1  # shards 1..9, the last of 5 = 4 + 1
    build(config(corpus, tmp_path / "b", "kind=dense"), encoder=HashEncoder(), show_progress=False)
    assert (tmp_path / "a" / "embeddings.npy").read_bytes() == (tmp_path / "b" / "embeddings.npy").read_bytes()


def test_killed_after_writing_rows_before_recording_the_shard(
    corpus: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    flushes = {"count": 0}
    real_flush = np.memmap.flush

    def flush_then_die(self: np.memmap) -> None:
        flushes["count"] += 1
        if flushes["count"] == 3:  # shard 2's rows are in the matrix; its record never written
            raise Killed
        real_flush(self)

    monkeypatch.setattr(np.memmap, "flush", flush_then_die)
    with pytest.raises(Killed):
        build(config(corpus, tmp_path / "a", "kind=dense"), encoder=HashEncoder(), show_progress=False)
    monkeypatch.setattr(np.memmap, "flush", real_flush)
    work = tmp_path / ".a.building"
    assert (work / "embeddings.npy.done").read_text() == "0\n1\n"
    np.load(work / "embeddings.npy", mmap_mode="r+")[25:30] = 9.0  # torn rows of the unrecorded shard
    resumed = HashEncoder()
    build(config(corpus, tmp_path / "a", "kind=dense"), encoder=resumed, show_progress=False)
    assert len(resumed.encoded) == 75
    build(config(corpus, tmp_path / "b", "kind=dense"), encoder=HashEncoder(), show_progress=False)
    assert (tmp_path / "a" / "embeddings.npy").read_bytes() == (tmp_path / "b" / "embeddings.npy").read_bytes()
    assert (tmp_path / "a" / "passages.sqlite").read_bytes() == (tmp_path / "b" / "passages.sqlite").read_bytes()


def test_a_changed_setting_or_corpus_recomputes_never_mixes(
    corpus: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with pytest.raises(Killed):
        build(config(corpus, tmp_path / "a"), encoder=HashEncoder(fail_at_call=3), show_progress=False)
    again = HashEncoder()
    with caplog.at_level(logging.WARNING):
        build(config(corpus, tmp_path / "a", "batch_size=8"), encoder=again, show_progress=False)
    assert "batch_size changed" in caplog.text and len(again.encoded) == 95
    with pytest.raises(Killed):
        build(config(corpus, tmp_path / "c"), encoder=HashEncoder(fail_at_call=3), show_progress=False)
    write_corpus(corpus, 96)
    caplog.clear()
    fresh = HashEncoder()
    with caplog.at_level(logging.WARNING):
        build(config(corpus, tmp_path / "c"), encoder=fresh, show_progress=False)
    assert "corpus_sha256 changed" in caplog.text and len(fresh.encoded) == 96
    # Only the FAISS settings changed: the embedding shards of the unfinished build are kept.
    with pytest.raises(Killed):
        build(config(corpus, tmp_path / "d"), encoder=HashEncoder(fail_at_call=10), show_progress=False)
    kept = HashEncoder()
    build(config(corpus, tmp_path / "d", "faiss_factory=HNSW32"), encoder=kept, show_progress=False)
    assert len(kept.encoded) == 6  # the last shard only


@pytest.mark.parametrize(
    ("factory", "overrides"),
    [("Flat", []), ("HNSW32", ["ef_search=200"]), ("IVF4,Flat", ["nprobe=4", "train_size=200"])],
)
def test_faiss_search_agrees_with_exact_search(corpus: Path, tmp_path: Path, factory: str, overrides: list) -> None:
    encoder = HashEncoder()
    build(config(corpus, tmp_path / "f", f"faiss_factory={factory}", *overrides), encoder=encoder,
          show_progress=False)
    retriever = load_index(tmp_path / "f", encoder=encoder)
    store = PassageStore(tmp_path / "f" / "passages.sqlite")
    matrix = encoder.encode([p.render() for p in store.by_rows(range(len(store)))])
    queries = [f"{a} {b}" for a, b in zip(WORDS, WORDS[3:] + WORDS[:3], strict=True)]
    rows, scores = exact_top_k(encoder.encode(queries), matrix, 10)
    for query, hits, exact_rows, exact_scores in zip(queries, retriever.search_many(queries, 10), rows, scores,
                                                     strict=True):
        assert [h.passage.id for h in hits] == [f"d{r}" for r in exact_rows], query
        assert [h.score for h in hits] == pytest.approx(exact_scores.tolist(), abs=1e-5)
        assert hits[0].passage.text and hits[0].passage.title  # full passages


def test_dense_index_is_memory_mapped_and_exact(corpus: Path, tmp_path: Path) -> None:
    encoder = HashEncoder()
    build(config(corpus, tmp_path / "d", "kind=dense"), encoder=encoder, show_progress=False)
    retriever = load_index(tmp_path / "d", encoder=encoder)
    assert isinstance(retriever.embeddings, np.memmap)  # type: ignore[attr-defined]
    hits = retriever.search("river city", 95)
    assert len(hits) == 95 and len({h.passage.id for h in hits}) == 95
    assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)


def test_opening_reads_neither_the_corpus_nor_every_passage(
    corpus: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    encoder = HashEncoder()
    build(config(corpus, tmp_path / "f"), encoder=encoder, show_progress=False)
    run_bm25 = load_config(IndexConfig, None, [f"corpus={corpus}", f"output={tmp_path / 'b'}"])
    build(run_bm25, show_progress=False)

    def forbidden(*args: object, **kwargs: object) -> None:
        raise AssertionError("opening an index must not read the corpus")

    monkeypatch.setattr(index_build, "corpus_digest", forbidden)
    monkeypatch.setattr("selfrag.corpus.load_corpus", forbidden)
    requested: list[int] = []
    real_by_rows = PassageStore.by_rows

    def counting(self: PassageStore, rows: Sequence[int]) -> list:  # type: ignore[type-arg]
        requested.extend(rows)
        return real_by_rows(self, rows)

    monkeypatch.setattr(PassageStore, "by_rows", counting)
    for path, kwargs in ((tmp_path / "f", {"encoder": encoder}), (tmp_path / "b", {})):
        retriever = load_index(path, **kwargs)  # type: ignore[arg-type]
        assert requested == []
        assert len(retriever.search_many(["river city", "planet music"], 3)[1]) == 3
        assert len(requested) == 6
        requested.clear()


def test_an_index_of_an_older_format_is_refused_in_one_line(corpus: Path, tmp_path: Path) -> None:
    """A format-1 folder (an older selfrag's: passages.jsonl read in full) is not opened: one line, the fix."""
    build(load_config(IndexConfig, None, [f"corpus={corpus}", f"output={tmp_path / 'b'}"]), show_progress=False)
    meta = json.loads((tmp_path / "b" / "index.json").read_text())
    (tmp_path / "b" / "index.json").write_text(json.dumps({**meta, "version": 1}))
    (tmp_path / "b" / "passages.jsonl").write_text(corpus.read_text())
    with pytest.raises(InputError) as refused:
        load_index(tmp_path / "b")
    message = str(refused.value)
    assert "\n" not in message and "index of format version 1" in message
    assert "delete it and rebuild it with `selfrag index`" in message


def test_bad_settings_fail_in_one_line_before_any_embedding(corpus: Path, tmp_path: Path) -> None:
    cases = [
        (["faiss_factory=Bogus32"], r"'Bogus32' is not a FAISS index for 16-dimensional vectors \(could not parse"),
        (["faiss_factory=IVF4,PQ5"], "PQm needs the dimension divisible by m"),
        (["faiss_factory=HNSW32", "nprobe=8"], "nprobe=8 applies to IVF indexes only"),
        (["faiss_factory=IVF4,Flat", "ef_search=8"], "ef_search=8 applies to HNSW indexes only"),
    ]
    for overrides, message in cases:
        encoder = HashEncoder()
        with pytest.raises(ConfigError, match=message) as raised:
            build(config(corpus, tmp_path / "x", *overrides), encoder=encoder, show_progress=False)
        assert encoder.calls == 0 and "\n" not in str(raised.value)
    encoder = HashEncoder()
    with pytest.raises(ConfigError, match=r"needs at least 64 training vectors, the corpus gives 50; use fewer lists"):
        build(config(corpus, tmp_path / "x", "faiss_factory=IVF64,Flat", "train_size=50"), encoder=encoder,
              show_progress=False)
    assert encoder.calls == 0
    with pytest.raises(ConfigError, match="nprobe=3 applies to kind=faiss only, got kind=bm25"):
        load_config(IndexConfig, None, [f"corpus={corpus}", f"output={tmp_path}", "nprobe=3"])
    with pytest.raises(ConfigError, match="pooling must be one of"):
        load_config(IndexConfig, None, [f"corpus={corpus}", f"output={tmp_path}", "pooling=median"])
    build(config(corpus, tmp_path / "h", "faiss_factory=HNSW32"), encoder=HashEncoder(), show_progress=False)
    with pytest.raises(ConfigError, match="nprobe=2 applies to IVF indexes only"):
        load_index(tmp_path / "h", nprobe=2, encoder=HashEncoder())
    build(load_config(IndexConfig, None, [f"corpus={corpus}", f"output={tmp_path / 'b'}"]), show_progress=False)
    with pytest.raises(ConfigError, match="apply to faiss indexes, and .* is a bm25 index"):
        load_index(tmp_path / "b", ef_search=5)
    with pytest.raises(InputError, match="does not exist"):
        build(config(tmp_path / "nope.jsonl", tmp_path / "x"), encoder=HashEncoder())


def test_search_settings_saved_and_overridden_at_open(corpus: Path, tmp_path: Path) -> None:
    encoder = HashEncoder()
    build(config(corpus, tmp_path / "i", "faiss_factory=IVF4,Flat", "nprobe=2", "train_size=95"), encoder=encoder,
          show_progress=False)
    faiss = pytest.importorskip("faiss")
    assert faiss.extract_index_ivf(load_index(tmp_path / "i", encoder=encoder).index).nprobe == 2  # type: ignore[attr-defined]
    wider = load_index(tmp_path / "i", nprobe=4, encoder=encoder)
    assert faiss.extract_index_ivf(wider.index).nprobe == 4  # type: ignore[attr-defined]


def test_a_second_build_of_the_same_output_stops_in_one_line(corpus: Path, tmp_path: Path) -> None:
    import fcntl

    with (tmp_path / ".a.selfrag-lock").open("w") as held:  # as another process's `selfrag index` holds it
        fcntl.flock(held, fcntl.LOCK_EX)
        with pytest.raises(InputError, match="output '.*a' is in use by another process"):
            build(config(corpus, tmp_path / "a"), encoder=HashEncoder(), show_progress=False)
