"""retriever kind pgvector against a real PostgreSQL + pgvector server (pgserver's binaries) on 127.0.0.1.

The session fixture runs initdb and starts the server on a free TCP port with password authentication, and
stops it after the session; the tests are skipped, with the reason, only where the server cannot start.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Iterator
from itertools import islice
from pathlib import Path

import pytest

from selfrag.errors import ConfigError
from selfrag.inference.retrievers import RETRIEVERS
from selfrag.inference.retrievers.index import IndexConfig
from selfrag.inference.retrievers.index_build import run
from selfrag.inference.retrievers.localpg import LocalPostgres, free_port
from selfrag.inference.retrievers.pgvector import PgVectorError, PgVectorRetriever, parse_url
from selfrag.inference.retrievers.spec import RetrieverConfig, open_retriever

pytest.importorskip("psycopg", reason="pip install 'selfrag[pgvector]' (psycopg 3) for the pgvector tests")
pytest.importorskip("sentence_transformers", reason="pip install 'selfrag[dense]' for embeddings")

DEMO = Path(__file__).parents[2] / "data_gen" / "demo" / "corpus.jsonl"
QUERIES = [
    "When did the 1973 oil crisis begin?",
    "Which countries proclaimed the oil embargo?",
    "What happened to the price of oil by March 1974?",
    "What does computational complexity theory study?",
]


@pytest.fixture(scope="session")
def postgres() -> Iterator[LocalPostgres]:
    directory = Path(tempfile.mkdtemp(prefix="selfrag-pg-"))
    server = LocalPostgres(directory)
    try:
        server.start()
    except (OSError, RuntimeError, ConfigError) as error:
        shutil.rmtree(directory, ignore_errors=True)
        pytest.skip(f"a local PostgreSQL with pgvector could not start: {error}")
    try:
        yield server
    finally:
        server.stop()
        shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture(scope="session")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """60 real passages of the demo corpus: two articles' worth, so the queries have true and false matches."""
    lines = DEMO.read_text(encoding="utf-8").splitlines()
    path = tmp_path_factory.mktemp("corpus") / "corpus.jsonl"
    path.write_text("\n".join(lines[:40] + lines[-20:]) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="session")
def table_url(postgres: LocalPostgres, corpus: Path) -> str:
    url = postgres.url(table="demo")
    run(IndexConfig(corpus=str(corpus), output=url, kind="pgvector", batch_size=32))
    return url


def _ids(hits) -> list[str]:  # type: ignore[no-untyped-def]
    return [hit.passage.id for hit in hits]


def test_dense_hits_match_exact_search(table_url: str, corpus: Path) -> None:
    retriever = open_retriever(RetrieverConfig(url=table_url))
    exact = RETRIEVERS["dense"](corpus)
    assert isinstance(retriever, PgVectorRetriever)
    batched = retriever.search_many(QUERIES, 5)
    for query, hits, expected in zip(QUERIES, batched, exact.search_many(QUERIES, 5), strict=True):
        assert _ids(hits) == _ids(expected), query  # 60 vectors: HNSW with ef_search=100 is exact here
        assert [hit.score for hit in hits] == pytest.approx([hit.score for hit in expected], abs=1e-4)
        assert _ids(retriever.search(query, 5)) == _ids(hits)  # one query or a batch: the same hits
    assert retriever.meta["passages"] == 60 and retriever.meta["dimension"] == 384


def test_lexical_and_hybrid_modes(table_url: str) -> None:
    lexical = open_retriever(RetrieverConfig(url=table_url, mode="lexical"))
    hybrid = open_retriever(RetrieverConfig(url=table_url, mode="hybrid"))
    assert lexical is not None and hybrid is not None
    hits = lexical.search("OAPEC embargo", 3)
    assert hits and all("OAPEC" in hit.passage.text or "embargo" in hit.passage.text for hit in hits)
    assert lexical.search("the of and", 3) == []  # only stop words: no lexical match, no error
    fused = hybrid.search(QUERIES[0], 4)
    assert len(fused) == 4 and fused[0].passage.id == "1973-oil-crisis-0-0"


def test_the_cli_loads_and_every_stage_opens_the_same_table(postgres: LocalPostgres, corpus: Path) -> None:
    from selfrag.app.cli import main
    from selfrag.inference.ask import load_retriever

    url = postgres.url(table="cli")
    assert main(["index", f"corpus={corpus}", "kind=pgvector", f"output={url}", "batch_size=64"]) == 0
    by_section = open_retriever(RetrieverConfig(url=url))
    by_index_key = open_retriever(RetrieverConfig(index=url))
    by_ask = load_retriever(RetrieverConfig(index=url))
    assert by_section is not None and by_index_key is not None
    expected = [_ids(hits) for hits in by_section.search_many(QUERIES, 3)]
    assert [_ids(hits) for hits in by_index_key.search_many(QUERIES, 3)] == expected
    assert [_ids(by_ask.search(query, 3)) for query in QUERIES] == expected


def test_a_killed_load_resumes_and_gives_the_same_table(postgres: LocalPostgres, corpus: Path) -> None:
    from selfrag.corpus_stream import scan_corpus
    from selfrag.inference.retrievers import pgvector_build
    from selfrag.inference.retrievers.pgvector import connect

    passages = scan_corpus(corpus)  # as `selfrag index kind=pgvector` reads it: from the file, batch by batch
    url = postgres.url(table="resumed")
    spec = pgvector_build.PgBuild(url, "all-minilm-l6-v2", batch_size=16, corpus={"sha256": "x"})
    calls = []
    original = pgvector_build._copy_rows

    def killed(connection, target, embed, rows, start, batch_size):  # type: ignore[no-untyped-def]
        calls.append(start)
        original(connection, target, embed, list(islice(rows, 32)), start, batch_size)  # two batches, then "kill"
        raise KeyboardInterrupt

    pgvector_build._copy_rows = killed  # type: ignore[assignment]
    try:
        with pytest.raises(KeyboardInterrupt):
            pgvector_build.build(spec, passages)
    finally:
        pgvector_build._copy_rows = original  # type: ignore[assignment]
    resumed_from = []

    def spy(connection, target, embed, rows, start, batch_size):  # type: ignore[no-untyped-def]
        resumed_from.append(start)
        original(connection, target, embed, rows, start, batch_size)

    pgvector_build._copy_rows = spy  # type: ignore[assignment]
    try:
        pgvector_build.build(spec, passages)
    finally:
        pgvector_build._copy_rows = original  # type: ignore[assignment]
    assert calls == [0] and resumed_from == [32]  # the 32 committed rows were not embedded again
    fresh = postgres.url(table="fresh")
    pgvector_build.build(pgvector_build.PgBuild(fresh, "all-minilm-l6-v2", batch_size=16), passages)
    target, fresh_target = parse_url(url), parse_url(fresh)
    with connect(target) as connection:
        def rows(table: str) -> list[tuple[object, ...]]:
            query = f"SELECT row, id, title, text, embedding::text FROM {table} ORDER BY row"
            return connection.execute(query).fetchall()  # type: ignore[no-any-return]

        assert rows(target.table) == rows(fresh_target.table)
        assert connection.execute("SELECT to_regclass('resumed__build')").fetchone()[0] is None


# --- errors: one line each, naming the fix ---------------------------------------------------------------


def _error(url: str, **options: object) -> str:
    with pytest.raises(PgVectorError) as caught:
        PgVectorRetriever(url, **options)  # type: ignore[arg-type]
    message = str(caught.value)
    assert "\n" not in message
    return message


def test_refused_connection_names_the_fix() -> None:
    message = _error(f"postgresql://selfrag:pw@127.0.0.1:{free_port()}/postgres?table=demo")
    assert "no PostgreSQL server answers at selfrag@127.0.0.1" in message and "start the server" in message
    assert "pw" not in message.replace("pg_ctl", "")


def test_wrong_password_and_database(postgres: LocalPostgres, table_url: str) -> None:
    message = _error(postgres.url(table="demo", password="wrong"))
    assert "refused the login" in message and "fix the user or password" in message and "wrong" not in message
    message = _error(postgres.url("nosuchdb", table="demo"))
    assert 'database "nosuchdb" does not exist' in message and "createdb" in message


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("http://127.0.0.1/db?table=demo", "is not a PostgreSQL URL; expected postgresql://"),
        ("postgresql://127.0.0.1/db", "table='' must name the index table"),
        ("postgresql://127.0.0.1/db?table=Robert;drop", "must name the index table"),
        ("postgresql://127.0.0.1/db?table=demo&bogus=1", "invalid URI query parameter"),
    ],
)
def test_wrong_url(url: str, expected: str) -> None:
    assert expected in _error(url)


def test_missing_table_and_extension(postgres: LocalPostgres, table_url: str) -> None:
    message = _error(postgres.url(table="absent"))
    assert "no index table 'absent'" in message and "selfrag index kind=pgvector" in message
    postgres.create_database("plain")
    message = _error(postgres.url("plain", table="demo"))
    assert "has no pgvector extension enabled; run CREATE EXTENSION vector" in message


def test_extension_not_installed_on_the_server(postgres: LocalPostgres) -> None:
    import psycopg

    from selfrag.inference.retrievers.pgvector import _extension_problem

    target = parse_url(postgres.url(table="demo"))
    with psycopg.connect(target.conninfo, autocommit=True) as connection:
        with pytest.raises(psycopg.Error) as caught:  # the server's own answer for an extension it lacks
            connection.execute("CREATE EXTENSION no_such_extension")
    message = _extension_problem(target, caught.value)
    assert "has no pgvector extension installed" in message and "apt install postgresql-16-pgvector" in message


def test_dimension_mismatch_between_table_and_query_model(table_url: str, tmp_path: Path) -> None:
    from sentence_transformers import SentenceTransformer, models

    from selfrag.inference.retrievers.dense import embedding_model_path

    base = SentenceTransformer(embedding_model_path("all-minilm-l6-v2"), device="cpu")
    projected = SentenceTransformer(modules=[base[0], base[1], models.Dense(384, 32)], device="cpu")
    projected.save(str(tmp_path / "model-32"))
    message = _error(table_url, model=str(tmp_path / "model-32"))
    assert "embeds in 32 dimensions but the table 'demo' holds 384-dimensional embeddings" in message
    assert "unset retriever.model" in message


def test_contradictory_settings_are_refused_in_one_line(table_url: str, corpus: Path) -> None:
    with pytest.raises(ConfigError, match=r"set one of index, url, corpus, got index and url"):
        open_retriever(RetrieverConfig(index="runs/index", url=table_url))
    with pytest.raises(ConfigError, match=r"retriever.mode applies to retriever.url \(pgvector\) only"):
        open_retriever(RetrieverConfig(index="runs/index", mode="hybrid"))
    with pytest.raises(ConfigError, match=r"corpus= and the retriever section both say"):
        open_retriever(RetrieverConfig(url=table_url), corpus=corpus)
    with pytest.raises(ConfigError, match="output must be postgresql://"):
        from selfrag.config import load_config

        load_config(IndexConfig, None, [f"corpus={corpus}", "output=runs/x", "kind=pgvector"])
    assert json.dumps(RetrieverConfig().__dict__)  # unset is None everywhere
    assert not RetrieverConfig().is_set()


def test_every_stage_config_opens_the_same_hits(table_url: str, tmp_path: Path) -> None:
    from selfrag.config import load_config
    from selfrag.data_gen.config import GenerateConfig
    from selfrag.evaluation.config import CalibrateConfig, EvalConfig
    from selfrag.inference.ask import load_retriever
    from selfrag.inference.server.config import ServeConfig

    section = [f"retriever.url={table_url}"]
    generate = load_config(GenerateConfig, None, ["labeler=llm", "teacher.model=m", "queries=q", "output=o", *section])
    evaluate = load_config(EvalConfig, None, ["data=d", "model=m", "output_dir=o", *section])
    calibrate = load_config(CalibrateConfig, None, ["data=d", "model=m", *section])
    serve = load_config(ServeConfig, None, ["model=m", f"retriever.index={table_url}"])
    opened = [
        open_retriever(generate.retriever),
        open_retriever(evaluate.retriever),
        open_retriever(calibrate.retriever),
        load_retriever(serve.retriever),
        open_retriever(index=table_url),
    ]
    hits = [[_ids(found) for found in retriever.search_many(QUERIES, 4)] for retriever in opened if retriever]
    assert len(hits) == 5 and all(found == hits[0] for found in hits)


@pytest.mark.skipif(not hasattr(__import__("os"), "geteuid") or __import__("os").geteuid() != 0,
                    reason="only root runs the server as nobody from a private copy")
def test_root_in_an_unreachable_checkout_runs_a_private_copy(monkeypatch: pytest.MonkeyPatch) -> None:
    import psycopg

    from selfrag.inference.retrievers import localpg

    real = localpg._reachable_by_others
    monkeypatch.setattr(localpg, "_reachable_by_others", lambda path: real(path) and "site-packages" not in str(path))
    directory = Path(tempfile.mkdtemp(prefix="selfrag-pg-copy-"))
    try:
        with LocalPostgres(directory) as server:
            assert "pgserver-copy" in str(server._bin)
            with psycopg.connect(server.url(), autocommit=True) as connection:
                connection.execute("CREATE EXTENSION vector")  # the copy carries pgvector and its libraries
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def test_the_hnsw_build_gets_memory_for_its_graph(
    postgres: LocalPostgres, corpus: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """pgvector's HNSW build slows many times once its graph outgrows maintenance_work_mem (1M passages: not done in
    26 min at 1GB, ~20 min at 3GB on 2 busy cores); the build sizes it to the graph unless the user sets it."""
    import logging

    import numpy as np

    from selfrag.corpus import load_corpus
    from selfrag.inference.retrievers.pgvector_build import PgBuild, graph_memory, load

    assert graph_memory(1_000, 384, 16) == "1024MB"  # small corpora: at least 1GB
    assert graph_memory(1_000_000, 384, 16) == "2564MB"  # holds the ~1.7 GB graph measured at 1M (3GB did)
    assert int(graph_memory(21_000_000, 768, 16)[:-2]) > 90_000  # the paper's corpus: ~100GB, on a big machine
    passages = load_corpus(corpus)[:50]
    vectors = np.eye(8, dtype=np.float32)[[i % 8 for i in range(len(passages))]]
    caplog.set_level(logging.INFO, logger="selfrag.inference.retrievers.pgvector_build")
    spec = PgBuild(postgres.url(table="sized"), "synthetic", maintenance_work_mem="64MB")
    load(spec, passages, lambda chunk: vectors[[passages.index(p) for p in chunk]], 8)
    assert "maintenance_work_mem 64MB for the HNSW graph" in caplog.text
    with pytest.raises(ConfigError, match=r"maintenance_work_mem must be a PostgreSQL size such as 512MB or 8GB, "
                                          r"got '3 gigs'"):
        from selfrag.config import load_config

        load_config(IndexConfig, None, [f"corpus={corpus}", f"output={postgres.url(table='x')}", "kind=pgvector",
                                        "maintenance_work_mem=3 gigs"])
