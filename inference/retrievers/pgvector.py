"""PostgreSQL + pgvector: one retrieval index shared by every worker, eval run and server replica.

    selfrag index kind=pgvector corpus=data/psgs.tsv output='postgresql://user:pw@db:5432/rag?table=wiki'
    selfrag ask model=DIR retriever.url='postgresql://user@db:5432/rag?table=wiki' "who wrote Hamlet?"
    selfrag generate --config ... retriever.url='postgresql://user:pw@db:5432/rag?table=wiki'

One table per index: ``row`` (0-based corpus order), ``id``, ``title``, ``text``, ``embedding vector(d)``
(L2-normalised sentence-transformers embeddings, the same encoder as the dense kind) and ``lexemes`` (a
generated ``tsvector`` of title and text, GIN-indexed, for lexical search). The embeddings get an HNSW index
on inner product (= cosine on unit vectors). ``selfrag_indexes`` records each table's embedding model,
dimension and passage count, so a query model that does not match the table is refused before any search.
Rows are bulk-loaded with COPY into ``<table>__build``, batch by batch with a progress bar; a killed load
resumes where it stopped, and the finished table replaces the old one in one transaction, so readers never
see a half-built index. A query batch is one round trip (a LATERAL join over the batch's vectors).
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import numpy as np

from selfrag.errors import ConfigError
from selfrag.extras import require
from selfrag.retrieval import Hit
from selfrag.trajectory import Passage

from .embeddings import DEFAULT_EMBEDDING_MODEL, SentenceEncoder

logger = logging.getLogger(__name__)

META_TABLE = "selfrag_indexes"
MODES = ("dense", "lexical", "hybrid")
URL_FORM = "postgresql://user:password@host:5432/database?table=NAME"
_TABLE_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,40}$")
_RRF_K = 60  # reciprocal rank fusion constant (Cormack et al., 2009)


class PgVectorError(ConfigError):
    """The server, URL, extension or table is not what ``retriever.kind=pgvector`` needs; one line, with the fix."""

    def __init__(self, message: str) -> None:
        super().__init__([message])


@dataclass(frozen=True)
class PgTarget:
    """A parsed ``postgresql://...?table=NAME`` URL: the libpq connection URL and the table."""

    conninfo: str
    table: str
    where: str  # user@host:port/database, never the password

    @property
    def build_table(self) -> str:
        return f"{self.table}__build"


def parse_url(url: str, field: str = "retriever.url") -> PgTarget:
    """Split off ``table`` (required) from the libpq URL; refuse anything that is not ``postgresql://``."""
    parts = urlsplit(url)
    if parts.scheme not in ("postgresql", "postgres") or not parts.hostname and not parts.path.strip("/"):
        raise PgVectorError(f"{field}={_redact(url)!r} is not a PostgreSQL URL; expected {URL_FORM}")
    query = dict(parse_qsl(parts.query))
    table = query.pop("table", "")
    if not _TABLE_NAME.match(table):
        raise PgVectorError(
            f"{field}: table={table!r} must name the index table (lower-case letters, digits, _; at most 41); "
            f"expected {URL_FORM}"
        )
    conninfo = urlunsplit((parts.scheme, parts.netloc, parts.path, urlencode(query), ""))
    where = f"{parts.username or ''}@{parts.hostname or 'localhost'}:{parts.port or 5432}{parts.path or '/'}"
    return PgTarget(conninfo, table, where)


def _redact(url: str) -> str:
    return re.sub(r"(://[^:/@]*:)[^@]*@", r"\1***@", url)


def connect(target: PgTarget, field: str = "retriever.url") -> Any:
    """A psycopg connection (autocommit); each failure a user can fix becomes one line naming the fix."""
    psycopg = require("psycopg", "retriever kind pgvector")
    try:
        return psycopg.connect(target.conninfo, autocommit=True, connect_timeout=10)
    except psycopg.ProgrammingError as error:  # libpq could not parse the URL
        raise PgVectorError(f"{field}: {_first_line(error)}; expected {URL_FORM}") from None
    except psycopg.OperationalError as error:
        raise PgVectorError(_connection_problem(field, target, _first_line(error))) from None


def _connection_problem(field: str, target: PgTarget, message: str) -> str:
    lowered = message.lower()
    if "password authentication failed" in lowered or "no password supplied" in lowered:
        return (f"{field}: the server at {target.where} refused the login ({message}); "
                "fix the user or password in the URL (postgresql://USER:PASSWORD@...) or set PGPASSWORD")
    if "database" in lowered and "does not exist" in lowered:
        return f"{field}: {message} on {target.where}; create it (createdb NAME) or fix the database in the URL"
    if "connection refused" in lowered or "could not connect" in lowered or "timeout" in lowered:
        return (f"{field}: no PostgreSQL server answers at {target.where} ({message}); start the server "
                "(pg_ctl start, systemctl start postgresql) or fix the host and port in the URL")
    if "could not translate host name" in lowered or "name or service not known" in lowered:
        return f"{field}: unknown host in {target.where} ({message}); fix the host in the URL"
    return f"{field}: cannot connect to {target.where} ({message}); check the URL, expected {URL_FORM}"


def _first_line(error: BaseException) -> str:
    text = " ".join(str(error).split("\n")[0].split())
    return text.removeprefix("connection failed: ").strip() or type(error).__name__


def ensure_extension(connection: Any, target: PgTarget, create: bool) -> None:
    """Check (and with ``create``, enable) pgvector in the database, naming the fix when it is absent."""
    import psycopg

    if connection.execute("SELECT 1 FROM pg_extension WHERE extname = 'vector'").fetchone():
        return
    if not create:
        raise PgVectorError(
            f"the database {target.where} has no pgvector extension enabled; run CREATE EXTENSION vector there "
            "(or build the index with `selfrag index kind=pgvector`, which does)"
        )
    try:
        connection.execute("CREATE EXTENSION IF NOT EXISTS vector")
    except psycopg.Error as error:
        raise PgVectorError(_extension_problem(target, error)) from None


def _extension_problem(target: PgTarget, error: Any) -> str:
    state = getattr(error, "sqlstate", None)
    if state in ("58P01", "0A000"):  # no vector.control on the server (PostgreSQL 16: 0A000 "is not available")
        return (f"the PostgreSQL server of {target.where} has no pgvector extension installed "
                f"({_first_line(error)}); install it on the server (apt install postgresql-16-pgvector, "
                "or pip install pgserver for a local one)")
    if state == "42501":
        return (f"the user of {target.where} may not create the pgvector extension ({_first_line(error)}); "
                "ask the database owner or a superuser to run CREATE EXTENSION vector")
    return f"CREATE EXTENSION vector failed on {target.where}: {_first_line(error)}"


def read_meta(connection: Any, target: PgTarget) -> dict[str, Any]:
    """The index's row in ``selfrag_indexes``; one line naming the build command when the table is missing."""
    missing = PgVectorError(
        f"no index table {target.table!r} in {target.where}; load one with "
        f"`selfrag index kind=pgvector corpus=FILE output='postgresql://...?table={target.table}'`"
    )
    if not connection.execute("SELECT to_regclass(%s)", (META_TABLE,)).fetchone()[0]:
        raise missing
    row = connection.execute(
        f"SELECT model, dimension, passages, options FROM {META_TABLE} WHERE name = %s", (target.table,)
    ).fetchone()
    if row is None or not connection.execute("SELECT to_regclass(%s)", (target.table,)).fetchone()[0]:
        raise missing
    model, dimension, passages, options = row
    return {"model": model, "dimension": int(dimension), "passages": int(passages), "options": options or {}}


def embedding_dimension(encoder: Any) -> int:
    """The encoder's output size."""
    return int(encoder.dimension)


def vector_literal(vector: np.ndarray) -> str:
    return "[" + ",".join(f"{float(x):.8g}" for x in vector) + "]"


class PgVectorRetriever:
    """Searches one pgvector table: ``dense`` (HNSW), ``lexical`` (full text) or ``hybrid`` (both, fused by RRF).

    Thread-safe: searches are serialised on the one connection (run them off an event loop with
    ``asyncio.to_thread``); open one retriever per process.
    """

    kind = "pgvector"

    def __init__(
        self,
        url: str,
        mode: str = "dense",
        ef_search: int = 100,
        model: str | None = None,
        device: str = "cpu",
        batch_size: int = 64,
    ) -> None:
        if mode not in MODES:
            raise PgVectorError(f"retriever.mode must be one of {list(MODES)}, got {mode!r}")
        if ef_search < 1:
            raise PgVectorError(f"retriever.ef_search must be >= 1, got {ef_search}; e.g. 100 (higher: better recall)")
        self.target = parse_url(url)
        self.mode = mode
        self.ef_search = ef_search
        self.batch_size = batch_size
        self._lock = threading.Lock()
        self._connection = connect(self.target)
        ensure_extension(self._connection, self.target, create=False)
        self.meta = read_meta(self._connection, self.target)
        self.passage_count = self.meta["passages"]
        self.model_name = model or self.meta["model"]
        self._encoder: Any = None
        if mode != "lexical":
            self._encoder = SentenceEncoder(self.model_name, device=device, batch_size=self.batch_size)
            dimension = embedding_dimension(self._encoder)
            if dimension != self.meta["dimension"]:
                raise PgVectorError(
                    f"retriever.model {self.model_name!r} embeds in {dimension} dimensions but the table "
                    f"{self.target.table!r} holds {self.meta['dimension']}-dimensional embeddings of "
                    f"{self.meta['model']!r}; query with that model (unset retriever.model) or rebuild the table"
                )

    def close(self) -> None:
        self._connection.close()

    def search(self, query: str, k: int) -> list[Hit]:
        return self.search_many([query], k)[0]

    def search_many(self, queries: Sequence[str], k: int) -> list[list[Hit]]:
        if not queries:
            return []
        k = max(1, min(k, self.passage_count))
        with self._lock:
            if self.mode == "dense":
                return self._dense(queries, k)
            if self.mode == "lexical":
                return self._lexical(queries, k)
            return [_fuse(a, b, k) for a, b in zip(self._dense(queries, 2 * k), self._lexical(queries, 2 * k),
                                                   strict=True)]

    def _dense(self, queries: Sequence[str], k: int) -> list[list[Hit]]:
        return self._nearest(self._encoder.encode(list(queries)), k)

    def search_vectors(self, vectors: np.ndarray, k: int) -> list[list[Hit]]:
        """The ``k`` nearest passages of each unit vector (rows of ``vectors``), by inner product, in one round trip."""
        if vectors.ndim != 2 or vectors.shape[1] != self.meta["dimension"]:
            raise PgVectorError(
                f"query vectors of shape {vectors.shape} for a table of dimension {self.meta['dimension']}; "
                "embed the queries with the table's model"
            )
        with self._lock:
            return self._nearest(vectors, max(1, min(k, self.passage_count)))

    def _nearest(self, vectors: np.ndarray, k: int) -> list[list[Hit]]:
        literals = [vector_literal(v) for v in vectors]
        table, dimension = self.target.table, self.meta["dimension"]
        with self._connection.transaction():
            # ef_search below k would cap the result at ef_search rows
            self._connection.execute(f"SET LOCAL hnsw.ef_search = {max(self.ef_search, k)}")
            # the vectors are parsed once each (MATERIALIZED), not once per row a scan compares
            rows = self._connection.execute(
                f"WITH q AS MATERIALIZED (SELECT n, v::vector({dimension}) AS v FROM unnest(%s::text[]) "
                "WITH ORDINALITY AS input(v, n)) "
                "SELECT q.n, p.id, p.title, p.text, p.score FROM q CROSS JOIN LATERAL (SELECT id, title, text, "
                f"-(embedding <#> q.v) AS score FROM {table} ORDER BY embedding <#> q.v LIMIT %s) AS p "
                "ORDER BY q.n, p.score DESC",
                (literals, k),
            ).fetchall()
        return _group(rows, len(vectors))

    def _lexical(self, queries: Sequence[str], k: int) -> list[list[Hit]]:
        # Any of the query's words (stemmed, stop words dropped), ranked by ts_rank_cd: an OR query, as BM25 is.
        rows = self._connection.execute(
            f"WITH q AS (SELECT n, (SELECT string_agg(quote_literal(word), ' | ') "
            f"FROM unnest(tsvector_to_array(to_tsvector('english', v))) AS word)::tsquery AS query "
            f"FROM unnest(%s::text[]) WITH ORDINALITY AS input(v, n)) "
            f"SELECT q.n, p.id, p.title, p.text, p.score FROM q CROSS JOIN LATERAL (SELECT id, title, text, "
            f"ts_rank_cd(lexemes, q.query) AS score FROM {self.target.table} WHERE lexemes @@ q.query "
            f"ORDER BY score DESC, row LIMIT %s) AS p ORDER BY q.n, p.score DESC",
            (list(queries), k),
        ).fetchall()
        return _group(rows, len(queries))


def _group(rows: Iterable[tuple[Any, ...]], count: int) -> list[list[Hit]]:
    results: list[list[Hit]] = [[] for _ in range(count)]
    for number, passage_id, title, text, score in rows:
        results[int(number) - 1].append(Hit(Passage(passage_id, title, text), float(score)))
    return results


def _fuse(dense: list[Hit], lexical: list[Hit], k: int) -> list[Hit]:
    """Reciprocal rank fusion of two ranked lists; ties keep the dense order."""
    scores: dict[str, float] = {}
    passages: dict[str, Passage] = {}
    for hits in (dense, lexical):
        for rank, hit in enumerate(hits):
            scores[hit.passage.id] = scores.get(hit.passage.id, 0.0) + 1.0 / (_RRF_K + rank + 1)
            passages.setdefault(hit.passage.id, hit.passage)
    ordered = sorted(scores, key=lambda pid: -scores[pid])[:k]
    return [Hit(passages[pid], scores[pid]) for pid in ordered]


__all__ = [
    "DEFAULT_EMBEDDING_MODEL", "MODES", "PgTarget", "PgVectorError", "PgVectorRetriever", "connect",
    "ensure_extension", "parse_url", "read_meta",
]
