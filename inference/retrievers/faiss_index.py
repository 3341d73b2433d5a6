"""FAISS indexes over passage embeddings: built from a factory string, searched with the hits read from the store.

    index = build_faiss(embeddings, "HNSW32", train_size=100_000, seed=0)       # or Flat, IVF4096,PQ64, ...
    faiss.write_index(index, "runs/faiss/index.faiss")
    retriever = FaissRetriever.load("runs/faiss", store, encoder, nprobe=32)

Scores are inner products (``METRIC_INNER_PRODUCT``): cosine for normalised embeddings (all-MiniLM-L6-v2),
the dot product for Contriever as in the paper. An index that needs training (IVF, PQ) is trained on a seeded
sample of ``train_size`` rows. ``nprobe`` (IVF) and ``efSearch`` (HNSW) are search-time settings: saved with the
index, and overridable when it is opened. ``pip install faiss-cpu`` (the ``faiss`` extra); on CUDA machines see
docs/retrieval.md for faiss-gpu.
"""

from __future__ import annotations

import logging
import mmap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from selfrag.errors import ConfigError
from selfrag.passages import PassageSource
from selfrag.retrieval import Hit

from .embeddings import TextEncoder

logger = logging.getLogger(__name__)

FAISS_FILE = "index.faiss"
_ADD_BLOCK = 65_536


def import_faiss() -> Any:
    try:
        import faiss
    except ImportError:
        raise ConfigError(["kind=faiss needs FAISS: pip install faiss-cpu (or faiss-gpu-cu12 with CUDA)"]) from None
    return faiss


def make_index(factory: str, dimension: int) -> Any:
    """An empty index of ``factory`` for vectors of ``dimension``; one line naming the fix when faiss refuses it."""
    faiss = import_faiss()
    try:
        return faiss.index_factory(dimension, factory, faiss.METRIC_INNER_PRODUCT)
    except RuntimeError as error:
        reason = str(error).strip().rsplit(": ", 1)[-1] or repr(error)  # the C++ location first, the reason last
        raise ConfigError([
            f"faiss_factory {factory!r} is not a FAISS index for {dimension}-dimensional vectors ({reason}); "
            "use e.g. Flat, HNSW32, IVF1024,Flat or IVF4096,PQ64 (PQm needs the dimension divisible by m)"
        ]) from None


def build_faiss(embeddings: np.ndarray, factory: str, train_size: int, seed: int, show_progress: bool = True) -> Any:
    """Train (when the index needs it) on a seeded sample of rows, then add every row in blocks."""
    from tqdm import tqdm

    rows, dimension = embeddings.shape
    index = make_index(factory, dimension)
    if not index.is_trained:
        sample = np.sort(np.random.default_rng(seed).choice(rows, size=min(rows, train_size), replace=False))
        vectors = np.ascontiguousarray(embeddings[sample], dtype=np.float32)
        check_trainable(index, factory, len(vectors))
        logger.info("training %s on %d of %d vectors", factory, len(vectors), rows)
        index.train(vectors)
    with tqdm(total=rows, unit="vector", desc=f"adding to {factory}", disable=not show_progress) as bar:
        for start in range(0, rows, _ADD_BLOCK):
            block = _rows(embeddings, start, min(rows, start + _ADD_BLOCK))
            index.add(block)
            bar.update(len(block))
    return index


def _rows(embeddings: np.ndarray, start: int, stop: int) -> np.ndarray:
    """Rows ``start:stop`` as a float32 array. Of a memory-mapped file, read through a map of those rows only,
    unmapped after: the mapped pages of a 21M-row matrix do not pile up in the build's resident memory."""
    if (isinstance(embeddings, np.memmap) and isinstance(embeddings.base, mmap.mmap)  # the file's map, not a view
            and embeddings.dtype == np.float32 and embeddings.filename is not None and embeddings.flags.c_contiguous):
        shape = (stop - start, *embeddings.shape[1:])
        rows = np.memmap(embeddings.filename, dtype=np.float32, mode="r", shape=shape,
                         offset=embeddings.offset + start * embeddings.strides[0])
        block = np.array(rows, dtype=np.float32)
        del rows
        return block
    return np.ascontiguousarray(embeddings[start:stop], dtype=np.float32)


def check_trainable(index: Any, factory: str, count: int) -> None:
    """One line when ``count`` training vectors are too few for the index's lists or PQ centroids."""
    faiss = import_faiss()
    needed = 1
    try:
        needed = faiss.extract_index_ivf(index).nlist
    except RuntimeError:  # not an IVF index
        pass
    pq = _product_quantizer(index)
    if pq is not None:
        needed = max(needed, 1 << pq.nbits)
    if count < needed:
        raise ConfigError([
            f"faiss_factory {factory!r} needs at least {needed} training vectors, the corpus gives {count}; "
            f"use fewer lists (IVF{max(1, count // 39)}) or fewer PQ bits, or Flat/HNSW32 for a corpus this small"
        ])


def _product_quantizer(index: Any) -> Any | None:
    faiss = import_faiss()
    for candidate in (index, getattr(index, "index", None)):
        if candidate is None:
            continue
        downcast = faiss.downcast_index(candidate)
        if hasattr(downcast, "pq"):
            return downcast.pq
    return None


def set_search_parameters(index: Any, nprobe: int | None, ef_search: int | None, where: str) -> None:
    """Apply ``nprobe`` / ``efSearch``; one line when the index has no such parameter (e.g. nprobe on HNSW32)."""
    faiss = import_faiss()
    space = faiss.ParameterSpace()
    for name, field, value in (("nprobe", "nprobe", nprobe), ("efSearch", "ef_search", ef_search)):
        if value is None:
            continue
        if value < 1:
            raise ConfigError([f"{field} must be at least 1, got {value}"])
        if name == "nprobe" and not _is_ivf(index):
            raise ConfigError([f"{field}={value} applies to IVF indexes only, and {where} is not one; unset it"])
        try:
            space.set_index_parameter(index, name, int(value))
        except RuntimeError:
            problem = f"{field}={value} applies to HNSW indexes only, and {where} is not one; unset it"
            raise ConfigError([problem]) from None


def _is_ivf(index: Any) -> bool:
    try:
        import_faiss().extract_index_ivf(index)
    except RuntimeError:
        return False
    return True


class FaissRetriever:
    """Top-k by a FAISS index; the hits' passages read from a passage store by row (= FAISS label)."""

    kind = "faiss"

    def __init__(self, index: Any, passages: PassageSource, encoder: TextEncoder) -> None:
        if index.ntotal != len(passages):
            raise ValueError(f"the FAISS index holds {index.ntotal} vectors for {len(passages)} passages; rebuild it")
        if index.d != encoder.dimension:
            raise ConfigError([f"the FAISS index holds {index.d}-dimensional vectors, the query model makes "
                               f"{encoder.dimension}; open it with the embedding model it was built with"])
        self.index = index
        self.passages = passages
        self._encoder = encoder

    @classmethod
    def load(
        cls,
        directory: str | Path,
        passages: PassageSource,
        encoder: TextEncoder,
        nprobe: int | None = None,
        ef_search: int | None = None,
        factory: str = "",
    ) -> FaissRetriever:
        faiss = import_faiss()
        path = Path(directory) / FAISS_FILE
        index = faiss.read_index(str(path), _read_flags(faiss, factory))
        set_search_parameters(index, nprobe, ef_search, str(path))
        return cls(index, passages, encoder)

    def search(self, query: str, k: int) -> list[Hit]:
        return self.search_many([query], k)[0]

    def search_many(self, queries: Sequence[str], k: int) -> list[list[Hit]]:
        if not queries:
            return []
        return self.search_vectors(self._encoder.encode(queries), k)

    def search_vectors(self, vectors: np.ndarray, k: int) -> list[list[Hit]]:
        """Hits for query vectors (queries, dimension) already encoded."""
        scores, rows = self.index.search(np.ascontiguousarray(vectors, dtype=np.float32), min(k, self.index.ntotal))
        found = iter(self.passages.by_rows([int(r) for r in rows.ravel() if r >= 0]))
        return [[Hit(next(found), float(s)) for r, s in zip(row, line, strict=True) if r >= 0]
                for row, line in zip(rows, scores, strict=True)]


def _read_flags(faiss: Any, factory: str) -> int:
    """Memory-map what FAISS can: inverted lists of IVF indexes, the codes of flat and HNSW storage."""
    if "IVF" in factory.upper():
        return int(faiss.IO_FLAG_MMAP)
    return int(getattr(faiss, "IO_FLAG_MMAP_IFC", 0))  # FAISS >= 1.10
