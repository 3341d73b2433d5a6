"""FAISS indexes over passage embeddings: built from a factory string, searched with the hits read from the store.

    index = build_faiss(embeddings, "IVF4096,PQ48", train_size=100_000, seed=0,
                        vectors_path=Path("runs/faiss/vectors.f16.npy"))       # or Flat, HNSW32, IVF4096,PQ64 ...
    faiss.write_index(index, "runs/faiss/index.faiss")
    retriever = FaissRetriever.load("runs/faiss", store, encoder, nprobe=32, rerank=200)

Scores are inner products (``METRIC_INNER_PRODUCT``): cosine for normalised embeddings (all-MiniLM-L6-v2), the dot
product for Contriever as in the paper. An index that needs training (IVF, PQ) is trained on a seeded sample of
``train_size`` rows (the trained, empty index is kept in the build folder, so a resumed build does not train again).
``nprobe`` (IVF) and ``efSearch`` (HNSW) are search-time settings: saved with the index, and overridable when it is
opened. ``rerank`` > 0: the index proposes that many candidates and they are re-scored by the exact inner product on
float16 copies of the vectors (``vectors.f16.npy``, written in blocks beside the index and read through a memory
map: file-backed pages, not the process's anonymous memory). ``pip install faiss-cpu`` (the ``faiss`` extra); on
CUDA machines see docs/retrieval.md for faiss-gpu.
"""

from __future__ import annotations

import json
import logging
import mmap
import os
from pathlib import Path
from typing import Any, TypeGuard

import numpy as np

from selfrag.errors import ConfigError, InputError
from selfrag.extras import require
from selfrag.passages import PassageSource
from selfrag.retrieval import Hit

from .embeddings import TextEncoder, VectorSearch

logger = logging.getLogger(__name__)

FAISS_FILE = "index.faiss"
VECTORS_FILE = "vectors.f16.npy"
TRAINED_FILE = "trained.faiss"
_ADD_BLOCK = 65_536


def import_faiss() -> Any:
    return require("faiss", "kind=faiss")


def make_index(factory: str, dimension: int) -> Any:
    """An empty index of ``factory`` for vectors of ``dimension``; one line naming the fix when faiss refuses it."""
    faiss = import_faiss()
    try:
        index = faiss.index_factory(dimension, factory, faiss.METRIC_INNER_PRODUCT)
    except RuntimeError as error:
        reason = str(error).strip().rsplit(": ", 1)[-1] or repr(error)  # the C++ location first, the reason last
        raise ConfigError([
            f"faiss_factory {factory!r} is not a FAISS index for {dimension}-dimensional vectors ({reason}); "
            "use e.g. Flat, HNSW32, IVF1024,Flat or IVF4096,PQ64 (PQm needs the dimension divisible by m)"
        ]) from None
    # The factory turns on polysemous training for PQ codes: minutes of annealing (measured: 265 s of 275 for
    # IVF256,PQ48 on 20k vectors) that only a Hamming-filtered search uses, and this one never does.
    for part in (index, faiss.try_extract_index_ivf(index)):
        if part is not None and hasattr(faiss.downcast_index(part), "do_polysemous_training"):
            faiss.downcast_index(part).do_polysemous_training = False
    return index


def build_faiss(
    embeddings: np.ndarray,
    factory: str,
    train_size: int,
    seed: int,
    show_progress: bool = True,
    vectors_path: Path | None = None,
    trained_path: Path | None = None,
) -> Any:
    """Train (when the index needs it) on a seeded sample of rows, then add every row in blocks.

    ``vectors_path``: also write the rows as float16 there (a ``.npy`` file), block by block. ``trained_path``: keep
    the trained, empty index there and, when it holds this factory trained on this sample, read it instead of
    training again (training is most of an IVF build's time).
    """
    from tqdm import tqdm

    rows, dimension = embeddings.shape
    index = _trained(embeddings, factory, train_size, seed, trained_path)
    writer = _HalfWriter(vectors_path, rows, dimension) if vectors_path is not None else None
    with tqdm(total=rows, unit="vector", desc=f"adding to {factory}", disable=not show_progress) as bar:
        for start in range(0, rows, _ADD_BLOCK):
            block = _rows(embeddings, start, min(rows, start + _ADD_BLOCK))
            index.add(block)
            if writer is not None:
                writer.write(start, block)
            bar.update(len(block))
    return index


def _trained(embeddings: np.ndarray, factory: str, train_size: int, seed: int, trained_path: Path | None) -> Any:
    faiss = import_faiss()
    rows, dimension = embeddings.shape
    index = make_index(factory, dimension)
    if index.is_trained:
        return index
    key = {"factory": factory, "train_size": train_size, "seed": seed, "rows": rows, "dimension": dimension}
    record = trained_path.with_suffix(".json") if trained_path is not None else None
    if trained_path is not None and record is not None and trained_path.is_file() and record.is_file():
        if json.loads(record.read_text(encoding="utf-8")) == key:
            logger.info("reading the trained %s from %s (trained by an earlier run of this build)", factory,
                        trained_path)
            return faiss.read_index(str(trained_path))
    sample = np.sort(np.random.default_rng(seed).choice(rows, size=min(rows, train_size), replace=False))
    vectors = _rows_at(embeddings, sample)
    check_trainable(index, factory, len(vectors))
    logger.info("training %s on %d of %d vectors", factory, len(vectors), rows)
    index.train(vectors)
    if trained_path is not None and record is not None:
        partial = trained_path.with_name(trained_path.name + ".partial")
        faiss.write_index(index, str(partial))
        os.replace(partial, trained_path)  # present means complete; its key written after it
        record.write_text(json.dumps(key) + "\n", encoding="utf-8")
    return index


class _HalfWriter:
    """Rows written as float16 into a ``.npy`` file, each block through a map of its own rows (unmapped after)."""

    def __init__(self, path: Path, rows: int, dimension: int) -> None:
        matrix = np.lib.format.open_memmap(path, mode="w+", dtype=np.float16, shape=(rows, dimension))
        self.path, self.offset, self.dimension = path, matrix.offset, dimension
        del matrix

    def write(self, start: int, block: np.ndarray) -> None:
        rows = np.memmap(self.path, dtype=np.float16, mode="r+", shape=block.shape,
                         offset=self.offset + start * self.dimension * 2)
        rows[:] = block
        rows.flush()
        del rows


def _rows_at(embeddings: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """Rows by number as a float32 array; of a memory-mapped file, read with ``pread``, row by row: touching scattered
    rows through a map faults in their neighbours too (the kernel's fault-around), so a 10% training sample mapped
    in most of a 1M-row file (1.4 GB of the build's peak RSS, measured)."""
    if _is_file_map(embeddings):
        picked = np.empty((len(rows), *embeddings.shape[1:]), dtype=np.float32)
        width = embeddings.strides[0]
        with open(str(embeddings.filename), "rb") as handle:
            for number, row in enumerate(rows):
                data = os.pread(handle.fileno(), width, embeddings.offset + int(row) * width)
                picked[number] = np.frombuffer(data, dtype=np.float32)
        return picked
    return np.ascontiguousarray(embeddings[rows], dtype=np.float32)


def _is_file_map(embeddings: np.ndarray) -> TypeGuard[np.memmap[Any, Any]]:
    return (isinstance(embeddings, np.memmap) and isinstance(embeddings.base, mmap.mmap)  # the file's map, not a view
            and embeddings.dtype == np.float32 and embeddings.filename is not None
            and embeddings.flags.c_contiguous)


def _rows(embeddings: np.ndarray, start: int, stop: int) -> np.ndarray:
    """Rows ``start:stop`` as a float32 array. Of a memory-mapped file, read through a map of those rows only,
    unmapped after: the mapped pages of a 21M-row matrix do not pile up in the build's resident memory."""
    if _is_file_map(embeddings):
        shape = (stop - start, *embeddings.shape[1:])
        rows = np.memmap(str(embeddings.filename), dtype=np.float32, mode="r", shape=shape,
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


class ExactRerank:
    """Candidates re-scored by the exact inner product on float16 vectors read through a memory map.

    Each query reads its candidates' rows (in row order) from the mapped file: those pages are file-backed and
    shared with the page cache, and the process holds only the (candidates, dimension) copy it scores.
    """

    def __init__(self, vectors: np.ndarray, candidates: int) -> None:
        if candidates < 1:
            raise ConfigError([f"rerank must be at least 1 to re-rank, got {candidates}; rerank=0 turns it off"])
        self.vectors = vectors  # (passages, dimension) float16, memory-mapped
        self.candidates = candidates

    @classmethod
    def open(cls, path: Path, rows: int, dimension: int, candidates: int) -> ExactRerank:
        if not path.is_file():
            raise ConfigError([f"rerank={candidates} needs {path}, and this index was built without it (rerank=0); "
                               "unset rerank or rebuild the index with rerank set"])
        vectors = np.load(path, mmap_mode="r")
        if vectors.shape != (rows, dimension) or vectors.dtype != np.float16:
            raise InputError(f"{path} holds a {vectors.dtype} {vectors.shape} matrix, expected float16 "
                             f"{(rows, dimension)}; rebuild the index with `selfrag index`")
        return cls(vectors, candidates)

    def rerank(self, queries: np.ndarray, candidates: np.ndarray, k: int) -> list[tuple[np.ndarray, np.ndarray]]:
        """The best ``k`` of each query's candidate rows (-1 = none) by exact score: (rows, scores), best first."""
        results = []
        for query, row in zip(queries, candidates, strict=True):
            rows = np.unique(row[row >= 0])  # sorted: the file is read front to back
            scores = np.asarray(self.vectors[rows], dtype=np.float32) @ query  # (candidates,)
            best = np.lexsort((rows, -scores))[:k]  # ties by row, as exact search
            results.append((rows[best], scores[best]))
        return results


class FaissRetriever(VectorSearch):
    """Top-k by a FAISS index (its candidates re-ranked exactly when ``rerank`` is given); the hits' passages read
    from a passage store by row (= FAISS label)."""

    kind = "faiss"

    def __init__(
        self, index: Any, passages: PassageSource, encoder: TextEncoder, rerank: ExactRerank | None = None
    ) -> None:
        if index.ntotal != len(passages):
            raise ValueError(f"the FAISS index holds {index.ntotal} vectors for {len(passages)} passages; rebuild it")
        if index.d != encoder.dimension:
            raise ConfigError([f"the FAISS index holds {index.d}-dimensional vectors, the query model makes "
                               f"{encoder.dimension}; open it with the embedding model it was built with"])
        self.index = index
        self.passages = passages
        self.rerank = rerank
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
        rerank: int | None = None,
    ) -> FaissRetriever:
        faiss = import_faiss()
        path = Path(directory) / FAISS_FILE
        index = faiss.read_index(str(path), _read_flags(faiss, factory))
        set_search_parameters(index, nprobe, ef_search, str(path))
        if rerank is not None and rerank < 0:
            raise ConfigError([f"rerank must be at least 0, got {rerank}; 0 turns re-ranking off"])
        exact = ExactRerank.open(Path(directory) / VECTORS_FILE, index.ntotal, index.d, rerank) if rerank else None
        return cls(index, passages, encoder, exact)

    def search_vectors(self, vectors: np.ndarray, k: int) -> list[list[Hit]]:
        queries = np.ascontiguousarray(vectors, dtype=np.float32)
        k = min(k, self.index.ntotal)
        if self.rerank is None:
            scores, rows = self.index.search(queries, k)
            ranked = [(row[row >= 0], line[row >= 0]) for row, line in zip(rows, scores, strict=True)]
        else:
            _, candidates = self.index.search(queries, min(max(k, self.rerank.candidates), self.index.ntotal))
            ranked = self.rerank.rerank(queries, candidates, k)
        found = iter(self.passages.by_rows([int(r) for rows, _ in ranked for r in rows]))
        return [[Hit(next(found), float(s)) for s in scores] for _, scores in ranked]


def _read_flags(faiss: Any, factory: str) -> int:
    """Memory-map what FAISS can: inverted lists of IVF indexes, the codes of flat and HNSW storage."""
    if "IVF" in factory.upper():
        return int(faiss.IO_FLAG_MMAP)
    return int(getattr(faiss, "IO_FLAG_MMAP_IFC", 0))  # FAISS >= 1.10
