"""The index build streams the corpus: DPR TSV / JSONL read line by line into the passage store (never a list),
a repeated id refused by the store's key and named with both lines, BM25 tokenized from the store in batches with
the same hits as the in-memory index, embeddings read back a block at a time; pgvector's one-pass scan."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import numpy as np
import pytest

from selfrag import corpus_stream, retrieval
from selfrag.config import load_config
from selfrag.corpus import load_corpus
from selfrag.corpus_stream import scan_corpus
from selfrag.errors import InputError
from selfrag.inference.retrievers import index_build
from selfrag.inference.retrievers.index import IndexConfig, load_index
from selfrag.inference.retrievers.index_build import build
from selfrag.passages import PassageStore
from selfrag.retrieval import BM25Retriever
from selfrag.trajectory import Passage

WORDS = "river city planet music war king science film ocean bridge mountain novel the of and".split()


def write_tsv(path: Path, count: int, extra: str = "") -> Path:
    rng = np.random.default_rng(3)
    lines = ["id\ttext\ttitle"]
    for i in range(count):
        lines.append(f"{i + 1}\t{' '.join(rng.choice(WORDS, size=9))} {i}\tTopic {i % 7}")
    path.write_text("\n".join(lines) + "\n" + extra, encoding="utf-8")
    return path


def bm25_config(corpus: Path, output: Path) -> IndexConfig:
    return load_config(IndexConfig, None, [f"corpus={corpus}", f"output={output}"])


def test_the_store_is_written_from_a_stream_never_a_list(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    received = []
    real_write_store = index_build.write_store

    def spy(path: Path, passages: Iterable[Passage], **options: object) -> int:
        received.append(type(passages))
        assert not isinstance(passages, list | tuple)  # a generator over the corpus lines
        return real_write_store(path, passages, **options)  # type: ignore[arg-type]

    monkeypatch.setattr(index_build, "write_store", spy)
    corpus = write_tsv(tmp_path / "psgs_w100.tsv", 30)
    build(bm25_config(corpus, tmp_path / "index"), show_progress=False)
    assert len(received) == 1
    store = PassageStore(tmp_path / "index" / "passages.sqlite")
    assert store.by_rows(range(len(store))) == load_corpus(corpus)


@pytest.mark.parametrize(
    ("name", "content", "expected"),
    [
        ("psgs_w100.tsv", "id\ttext\ttitle\n1\tone\tA\n2\ttwo\tB\n1\tthree\tC\n",
         r"psgs_w100.tsv:4: duplicate passage id '1' \(first on line 2\); ids must be unique"),
        ("corpus.jsonl", '{"id": "a", "text": "x"}\n\n{"id": "b", "text": "y"}\n{"id": "a", "text": "z"}\n',
         r"corpus.jsonl:4: duplicate passage id 'a' \(first on line 1\); ids must be unique"),
        ("psgs_w100.tsv", "id\ttext\ttitle\n1\tone\tA\n2\t \tB\n", r"psgs_w100.tsv:3: field 'text' is empty"),
    ],
)
def test_a_bad_corpus_line_is_one_line_naming_file_and_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, content: str, expected: str
) -> None:
    monkeypatch.setattr("selfrag.passages._BATCH", 2)  # the duplicate lands in a later batch than its first
    corpus = tmp_path / name
    corpus.write_text(content, encoding="utf-8")
    with pytest.raises(InputError, match=expected) as caught:
        build(bm25_config(corpus, tmp_path / "index"), show_progress=False)
    assert "\n" not in str(caught.value)
    assert not (tmp_path / "index").exists()
    work = tmp_path / ".index.building"  # kept for a rerun; no store, not even a half-written one
    assert not [entry.name for entry in work.iterdir() if "passages" in entry.name]


def test_a_duplicate_within_one_batch_and_across_batches(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    corpus = write_tsv(tmp_path / "psgs_w100.tsv", 12, extra="5\tagain\tX\n")
    for batch in (3, 100):
        monkeypatch.setattr("selfrag.passages._BATCH", batch)
        with pytest.raises(InputError, match=r"psgs_w100.tsv:14: duplicate passage id '5' \(first on line 6\)"):
            build(bm25_config(corpus, tmp_path / f"index{batch}"), show_progress=False)


def test_streamed_bm25_gives_the_in_memory_hits(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ranges = []
    real_iter_range = PassageStore.iter_range

    def spy(self: PassageStore, start: int, stop: int):  # type: ignore[no-untyped-def]
        ranges.append((start, stop))
        return real_iter_range(self, start, stop)

    monkeypatch.setattr(retrieval, "TOKENIZE_BATCH", 7)
    monkeypatch.setattr(PassageStore, "iter_range", spy)
    corpus = write_tsv(tmp_path / "psgs_w100.tsv", 30, extra="31\tthe of and\tthe\n")  # stop words only: no tokens
    build(bm25_config(corpus, tmp_path / "index"), show_progress=False)
    assert ranges == [(0, 7), (7, 14), (14, 21), (21, 28), (28, 31)]  # the texts, 7 at a time
    streamed = load_index(tmp_path / "index")
    in_memory = BM25Retriever(load_corpus(corpus))
    queries = ["river city 3", "king of the ocean", "novel film 12", "the of", "zebra"]
    for mine, theirs in zip(streamed.search_many(queries, 5), in_memory.search_many(queries, 5), strict=True):
        assert [(h.passage, h.score) for h in mine] == [(h.passage, h.score) for h in theirs]


def test_bm25s_own_tokenize_and_the_streamed_tokens_score_alike() -> None:
    import bm25s

    passages = load_corpus_like(40)
    stemmer = retrieval.make_stemmer("english")
    theirs = bm25s.BM25()
    theirs.index(bm25s.tokenize([p.render() for p in passages], stopwords="en", stemmer=stemmer,
                                show_progress=False), show_progress=False)
    mine = BM25Retriever(passages)
    queries = bm25s.tokenize(["river king", "ocean bridge 7", "the"], stopwords="en", stemmer=stemmer,
                             show_progress=False)
    expected = theirs.retrieve(queries, k=6, show_progress=False, n_threads=1)
    found = mine._index.retrieve(queries, k=6, show_progress=False, n_threads=1)
    assert np.array_equal(found[0], expected[0]) and np.array_equal(found[1], expected[1])


def load_corpus_like(count: int) -> list[Passage]:
    rng = np.random.default_rng(5)
    return [Passage(f"p{i}", f"T{i % 4}", " ".join(rng.choice(WORDS, size=10))) for i in range(count)]


def test_faiss_build_reads_the_embeddings_a_block_at_a_time(tmp_path: Path) -> None:
    from selfrag.inference.retrievers.faiss_index import _rows

    path = tmp_path / "e.npy"
    matrix = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=(50, 4))
    matrix[:] = np.arange(200, dtype=np.float32).reshape(50, 4)
    matrix.flush()
    mapped = np.load(path, mmap_mode="r")
    assert np.array_equal(_rows(mapped, 10, 30), mapped[10:30])
    assert np.array_equal(_rows(mapped[5:], 10, 30), mapped[15:35])  # a view is read through its own offset
    assert np.array_equal(_rows(np.asarray(mapped), 0, 3), mapped[:3])


def test_scan_checks_every_line_counts_and_reads_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    corpus = write_tsv(tmp_path / "psgs_w100.tsv", 20)
    scanned = scan_corpus(corpus)
    assert len(scanned) == 20 and list(scanned) == load_corpus(corpus) and list(scanned) == list(scanned)
    monkeypatch.setattr(corpus_stream, "_id_hash", lambda passage_id: 7)  # every hash collides; ids are unique
    assert len(scan_corpus(corpus)) == 20
    duplicated = write_tsv(tmp_path / "dup.tsv", 20, extra="3\tagain\tX\n")
    with pytest.raises(InputError, match=r"dup.tsv:22: duplicate passage id '3' \(first on line 4\)"):
        scan_corpus(duplicated)
