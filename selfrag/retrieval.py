"""Retrievers: one protocol, a BM25 implementation (``bm25s``) shared by data generation and inference.

A BM25 index saves to a directory (``save``) and loads back without re-tokenizing the corpus (``load``): its
matrices memory-mapped, its passages read from a :class:`~selfrag.passages.PassageStore` for the hits only.
``selfrag index`` writes it (see :mod:`selfrag.inference.retrievers`).
"""

from __future__ import annotations

import logging
import sys
from array import array
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from selfrag.passages import PassageSource, as_source
from selfrag.trajectory import Passage

logger = logging.getLogger(__name__)

TOKENIZE_BATCH = 10_000  # passages read from the store and tokenized at a time when a BM25 index is built


@dataclass(frozen=True)
class Hit:
    passage: Passage
    score: float


class Retriever(Protocol):
    def search(self, query: str, k: int) -> list[Hit]: ...

    def search_many(self, queries: Sequence[str], k: int) -> list[list[Hit]]: ...


class PrecomputedRetriever:
    """A query's own passages (``ctxs``, in their order, the first scored highest), else ``fallback``'s search.

    Shared by ``selfrag eval`` (examples with ctxs) and ``selfrag generate`` (queries with ctxs); queries
    without passages of their own go to the fallback retriever in one ``search_many`` call.
    """

    def __init__(self, by_query: Mapping[str, Sequence[Passage]], fallback: Retriever | None) -> None:
        self.by_query = {query: tuple(passages) for query, passages in by_query.items() if passages}
        self.fallback = fallback

    def search(self, query: str, k: int) -> list[Hit]:
        return self.search_many([query], k)[0]

    def search_many(self, queries: Sequence[str], k: int) -> list[list[Hit]]:
        results: list[list[Hit] | None] = [None] * len(queries)
        missing = []
        for index, query in enumerate(queries):
            own = self.by_query.get(query)
            if own:
                results[index] = [Hit(passage, float(len(own) - rank)) for rank, passage in enumerate(own[:k])]
            else:
                missing.append(index)
        if missing and self.fallback is not None:
            found = self.fallback.search_many([queries[i] for i in missing], k)
            for index, hits in zip(missing, found, strict=True):
                results[index] = hits
        return [hits or [] for hits in results]



def import_bm25s() -> Any:
    """``bm25s``, imported with JAX hidden from it.

    ``bm25s.selection`` imports ``jax.lax`` when JAX is installed and runs a top-k at import: that starts JAX's GPU
    backend, which preallocates 75% of the card for the life of the process (held under every later training of
    the run). selfrag ranks with NumPy's top-k
    (``backend_selection="numpy"``), so the import never needs JAX; a JAX imported before stays untouched.
    """
    if "bm25s" in sys.modules:  # imported before (by the caller, or a benchmark): its logger was quietened then,
        logging.getLogger("bm25s").setLevel(logging.WARNING)  # or is now
        return sys.modules["bm25s"]
    hidden = "jax" not in sys.modules
    if hidden:
        sys.modules["jax"] = None  # type: ignore[assignment]  # import jax raises ImportError: bm25s goes without
    try:
        import bm25s
    finally:
        if hidden and "jax" in sys.modules and sys.modules["jax"] is None:
            del sys.modules["jax"]
    logging.getLogger("bm25s").setLevel(logging.WARNING)  # bm25s sets DEBUG on its logger at import
    return bm25s

class BM25Retriever:
    """BM25 over titles and texts, with English stop words and stemming (when PyStemmer is installed)."""

    kind = "bm25"

    def __init__(
        self,
        passages: Sequence[Passage] | PassageSource,
        stemmer_language: str | None = "english",
        index: Any | None = None,
    ) -> None:
        bm25s = import_bm25s()
        if not passages:
            raise ValueError("BM25Retriever needs at least one passage")
        self.passages = as_source(passages)
        self.stemmer_language = stemmer_language
        self._stemmer = make_stemmer(stemmer_language)
        self._index: Any
        if index is not None:  # loaded from disk: the corpus was tokenized when the index was built
            self._index = index
            return
        self._index = bm25s.BM25()
        self._index.index(tokenize_corpus(self.passages, self._stemmer), show_progress=False)

    def save(self, directory: str | Path) -> None:
        """Write the BM25 matrices (``bm25s`` format) into ``directory``; passages are saved by the caller."""
        self._index.save(str(directory), show_progress=False)

    @classmethod
    def load(
        cls,
        directory: str | Path,
        passages: Sequence[Passage] | PassageSource,
        stemmer_language: str | None = "english",
    ) -> BM25Retriever:
        bm25s = import_bm25s()
        index = bm25s.BM25.load(str(directory), mmap=True, show_progress=False)
        return cls(passages, stemmer_language=stemmer_language, index=index)

    def search(self, query: str, k: int) -> list[Hit]:
        return self.search_many([query], k)[0]

    def search_many(self, queries: Sequence[str], k: int) -> list[list[Hit]]:
        bm25s = import_bm25s()
        if not queries:
            return []
        k = min(k, len(self.passages))
        tokens = bm25s.tokenize(list(queries), stopwords="en", stemmer=self._stemmer, show_progress=False)
        # A query whose every word is a stop word has no tokens; bm25s then scores all passages 0.
        indices, scores = self._index.retrieve(tokens, k=k, show_progress=False, n_threads=1,
                                               backend_selection="numpy")
        found = self.passages.by_rows([int(i) for row in indices for i in row])
        results, start = [], 0
        for row_scores in scores:
            results.append([Hit(p, float(s)) for p, s in zip(found[start : start + len(row_scores)], row_scores,
                                                              strict=True)])
            start += len(row_scores)
        return results


def tokenize_corpus(passages: PassageSource, stemmer: object | None) -> Any:
    """bm25s's token ids of every passage, read ``TOKENIZE_BATCH`` passages at a time (from a store: the texts are never
    all in memory), packed 4 bytes a token (a list of Python lists costs ~8 bytes a token and ~60 a passage).

    bm25s's own ``Tokenizer.streaming_tokenize``, with its English stop words and the same stems as
    ``bm25s.tokenize`` (a passage of stop words only has no tokens, as there); the ids number the stems in order
    of first appearance (``bm25s.tokenize`` numbers them in a set's order), so the index's scores are the same.
    """
    import_bm25s()
    from bm25s.tokenization import Tokenized, Tokenizer

    tokenizer = Tokenizer(stopwords="en", stemmer=stemmer)  # type: ignore[arg-type]
    flat, ends = array("i"), array("q")
    for start in range(0, len(passages), TOKENIZE_BATCH):
        stop = min(len(passages), start + TOKENIZE_BATCH)
        texts = [passage.render() for passage in passages.iter_range(start, stop)]
        for ids in tokenizer.streaming_tokenize(texts, update_vocab=True, allow_empty=False):
            flat.extend(ids)
            ends.append(len(flat))
    return Tokenized(ids=_PackedTokens(flat, ends), vocab=tokenizer.get_vocab_dict())  # type: ignore[arg-type]


class _PackedTokens(Sequence[list[int]]):
    """Per-passage token ids over one flat array; bm25s reads them (three passes) as lists, one at a time."""

    def __init__(self, flat: array, ends: array) -> None:  # type: ignore[type-arg]
        self.flat, self.ends = flat, ends

    def __len__(self) -> int:
        return len(self.ends)

    def __getitem__(self, index: int) -> list[int]:  # type: ignore[override]
        start = self.ends[index - 1] if index > 0 else 0
        return self.flat[start : self.ends[index]].tolist()

    def __iter__(self) -> Iterator[list[int]]:
        start = 0
        for end in self.ends:
            yield self.flat[start:end].tolist()
            start = end


def make_stemmer(language: str | None) -> object | None:
    if language is None:
        return None
    try:
        import Stemmer
    except ImportError:  # stemming is optional; plain tokens still retrieve
        logger.warning("PyStemmer is not installed; BM25 runs without stemming")
        return None
    return Stemmer.Stemmer(language)
