"""Load a corpus into a pgvector table: ``selfrag index kind=pgvector output='postgresql://...?table=NAME'``.

    selfrag index kind=pgvector corpus=data/psgs_w100.tsv output='postgresql://u:pw@db:5432/rag?table=wiki'

The corpus is streamed: checked and counted in one pass (:func:`selfrag.corpus_stream.scan_corpus`), then read
again batch by batch. Embeds with the dense kind's sentence-transformers encoder (``embedding_model``), COPYs each
batch into ``<table>__build`` (one transaction a batch, so a killed load resumes after the last committed batch,
reading past the committed rows without embedding them), then
builds the HNSW and GIN indexes and swaps the table in, with its row in ``selfrag_indexes``, in one
transaction. See :mod:`selfrag.inference.retrievers.pgvector` for the schema and the reader.
"""

from __future__ import annotations

import json
import logging
import math
import struct
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import islice
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from selfrag.corpus_stream import StreamedCorpus
from selfrag.errors import InputError
from selfrag.trajectory import Passage

from .embeddings import SentenceEncoder
from .pgvector import META_TABLE, PgTarget, connect, embedding_dimension, ensure_extension, parse_url

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class PgBuild:
    """What one load needs: where, which encoder, the HNSW parameters and the corpus's fingerprint."""

    url: str
    model: str
    batch_size: int = 256
    device: str = "cpu"
    hnsw_m: int = 16
    hnsw_ef_construction: int = 64
    corpus: dict[str, Any] | None = None  # path, size, sha256 of the source: a resumed load must read the same
    #: PostgreSQL's ``maintenance_work_mem`` for the HNSW build (e.g. "8GB"); None: :func:`graph_memory`. pgvector
    #: builds far faster while the graph fits; past it, it goes on on disk many times slower.
    maintenance_work_mem: str | None = None


def graph_memory(passages: int, dimension: int, m: int) -> str:
    """A ``maintenance_work_mem`` that holds the HNSW graph being built: each node's vector (4 bytes a dimension)
    and its links (~8 bytes each, 2 m at the base layer), with half again for pgvector's own overhead; at least
    1GB. 1M passages at 384 dimensions: ~2.5GB (3GB held the graph there); 21M at 768: ~100GB."""
    megabytes = math.ceil(passages * (4 * dimension + 8 * 2 * m) * 1.5 / (1 << 20))
    return f"{max(1024, megabytes)}MB"


def build(spec: PgBuild, passages: Sequence[Passage] | StreamedCorpus) -> dict[str, Any]:
    """Embed ``passages`` with ``spec.model`` and load them into the table named by ``spec.url``.

    ``passages``: a list, or a :class:`~selfrag.corpus_stream.StreamedCorpus` read from its file batch by batch.
    """
    encoder = SentenceEncoder(spec.model, device=spec.device, batch_size=spec.batch_size)

    def embed(batch: Sequence[Passage]) -> np.ndarray:
        texts = [f"{p.title}\n{p.text}" if p.title else p.text for p in batch]
        return encoder.encode(texts)

    return load(spec, passages, embed, embedding_dimension(encoder))


def load(
    spec: PgBuild,
    passages: Sequence[Passage] | StreamedCorpus,
    embed: Callable[[Sequence[Passage]], np.ndarray],
    dimension: int,
) -> dict[str, Any]:
    """Load ``passages`` with the unit vectors ``embed`` gives each batch; returns the ``selfrag_indexes`` row.

    ``build`` embeds with the model; benchmarks pass precomputed or synthetic vectors (recorded as ``spec.model``).
    """
    target = parse_url(spec.url, field="output")
    connection = connect(target, field="output")
    try:
        ensure_extension(connection, target, create=True)
        options = {
            "hnsw_m": spec.hnsw_m, "hnsw_ef_construction": spec.hnsw_ef_construction, "corpus": spec.corpus,
            "passages": len(passages),
        }
        _create_meta(connection)
        start = _prepare_build_table(connection, target, spec.model, dimension, options)
        _copy_rows(connection, target, embed, passages, start, spec.batch_size)
        started = time.monotonic()
        logger.info("building the HNSW index (m=%d, ef_construction=%d)", spec.hnsw_m, spec.hnsw_ef_construction)
        build_table = target.build_table
        memory = spec.maintenance_work_mem or graph_memory(len(passages), dimension, spec.hnsw_m)
        logger.info("maintenance_work_mem %s for the HNSW graph", memory)
        connection.execute(f"SET maintenance_work_mem = '{memory}'")  # the graph in memory
        connection.execute(
            f"CREATE INDEX IF NOT EXISTS {build_table}_hnsw ON {build_table} USING hnsw (embedding vector_ip_ops) "
            f"WITH (m = {int(spec.hnsw_m)}, ef_construction = {int(spec.hnsw_ef_construction)})"
        )
        connection.execute(f"CREATE INDEX IF NOT EXISTS {build_table}_lexemes ON {build_table} USING gin (lexemes)")
        logger.info("indexes built in %.1f s", time.monotonic() - started)
        _swap(connection, target)
        return {"model": spec.model, "dimension": dimension, "passages": len(passages), "options": options}
    finally:
        connection.close()


def _create_meta(connection: Any) -> None:
    connection.execute(
        f"CREATE TABLE IF NOT EXISTS {META_TABLE} (name text PRIMARY KEY, model text NOT NULL, "
        "dimension integer NOT NULL, passages bigint NOT NULL, options jsonb NOT NULL DEFAULT '{}', "
        "built_at timestamptz NOT NULL DEFAULT now())"
    )


def _prepare_build_table(
    connection: Any, target: PgTarget, model: str, dimension: int, options: dict[str, Any]
) -> int:
    """The first row still to load: the rows a killed load of the same corpus and settings committed, else 0."""
    build_table = target.build_table
    exists = connection.execute("SELECT to_regclass(%s)", (build_table,)).fetchone()[0]
    if exists:
        row = connection.execute(
            f"SELECT model, dimension, options FROM {META_TABLE} WHERE name = %s", (build_table,)
        ).fetchone()
        if row is not None and (row[0], int(row[1]), row[2]) == (model, dimension, _jsonable(options)):
            done = int(connection.execute(f"SELECT count(*) FROM {build_table}").fetchone()[0])
            logger.info("resuming the load into %s: %d of %d passages already there", build_table, done,
                        options["passages"])
            return done
        logger.info("dropping %s: an unfinished load with other settings", build_table)
    with connection.transaction():
        connection.execute(f"DROP TABLE IF EXISTS {build_table}")
        connection.execute(
            f"CREATE TABLE {build_table} (row bigint PRIMARY KEY, id text NOT NULL UNIQUE, title text NOT NULL, "
            f"text text NOT NULL, embedding vector({dimension}) NOT NULL, lexemes tsvector GENERATED ALWAYS AS "
            "(to_tsvector('english', title || ' ' || text)) STORED)"
        )
        connection.execute(
            f"INSERT INTO {META_TABLE} (name, model, dimension, passages, options) VALUES (%s, %s, %s, %s, %s) "
            "ON CONFLICT (name) DO UPDATE SET model = EXCLUDED.model, dimension = EXCLUDED.dimension, "
            "passages = EXCLUDED.passages, options = EXCLUDED.options, built_at = now()",
            (build_table, model, dimension, options["passages"], json.dumps(options)),
        )
    return 0


def _jsonable(options: dict[str, Any]) -> Any:
    return json.loads(json.dumps(options))


def _copy_rows(
    connection: Any,
    target: PgTarget,
    embed: Callable[[Sequence[Passage]], np.ndarray],
    passages: Sequence[Passage] | StreamedCorpus,
    start: int,
    batch_size: int,
) -> None:
    columns = f"{target.build_table} (row, id, title, text, embedding)"
    rows = iter(passages)
    next(islice(rows, start, start), None)  # a resumed load reads past the committed rows; nothing is embedded
    first = start
    with tqdm(total=len(passages), initial=start, desc="pgvector load", unit="passage", dynamic_ncols=True) as bar:
        while batch := list(islice(rows, batch_size)):
            vectors = embed(batch)
            payload = copy_payload(first, batch, vectors)
            with connection.transaction(), connection.cursor() as cursor, \
                    cursor.copy(f"COPY {columns} FROM STDIN (FORMAT binary)") as copy:
                copy.write(payload)
            first += len(batch)
            bar.update(len(batch))
    if first != len(passages):  # a streamed corpus read again: the file changed after it was checked
        raise InputError(f"the corpus gave {first} passages while loading, {len(passages)} when it was checked: it "
                         "changed during the load; run the command again on a corpus that stays put")


_COPY_HEADER = b"PGCOPY\n\xff\r\n\x00" + struct.pack("!ii", 0, 0)


def copy_payload(first: int, passages: Sequence[Passage], vectors: np.ndarray) -> bytes:
    """One batch in COPY's binary format (row, id, title, text, embedding): ~10x faster than text COPY, whose
    384 decimal floats a row cost more to print and parse than to send."""
    dimension = vectors.shape[1]
    big_endian = np.ascontiguousarray(vectors, dtype=">f4")
    vector_head = struct.pack("!ihh", 4 + 4 * dimension, dimension, 0)  # length; pgvector's dim and unused
    parts = [_COPY_HEADER]
    for offset, passage in enumerate(passages):
        parts.append(struct.pack("!hiq", 5, 8, first + offset))
        for value in (passage.id, passage.title, passage.text):
            encoded = value.encode("utf-8")
            parts.append(struct.pack("!i", len(encoded)) + encoded)
        parts.append(vector_head + big_endian[offset].tobytes())
    parts.append(struct.pack("!h", -1))
    return b"".join(parts)


def _swap(connection: Any, target: PgTarget) -> None:
    """Replace the served table by the finished one in one transaction; readers see the old or the new index."""
    table, build_table = target.table, target.build_table
    with connection.transaction():
        connection.execute(f"DROP TABLE IF EXISTS {table}")
        connection.execute(f"ALTER TABLE {build_table} RENAME TO {table}")
        connection.execute(f"ALTER INDEX {build_table}_hnsw RENAME TO {table}_hnsw")
        connection.execute(f"ALTER INDEX {build_table}_lexemes RENAME TO {table}_lexemes")
        connection.execute(f"DELETE FROM {META_TABLE} WHERE name = %s", (table,))
        connection.execute(f"UPDATE {META_TABLE} SET name = %s, built_at = now() WHERE name = %s", (table, build_table))
    connection.execute(f"ANALYZE {table}")
