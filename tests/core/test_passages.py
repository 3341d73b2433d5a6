"""The on-disk passage store: rows and ids in, passages out, nothing read that was not asked for."""

from __future__ import annotations

import os
import sqlite3
import threading
from pathlib import Path

import pytest

from selfrag.errors import InputError
from selfrag.passages import PassageList, PassageStore, as_source, write_store
from selfrag.trajectory import Passage

PASSAGES = [
    Passage("p0", "Zürich", "Die Limmat fließt durch Zürich."),
    Passage("p1", "東京", "東京は日本の首都です。"),
    Passage("p2", "", "A passage with no title, an emoji 🚀 and a quote ' \" and a newline\nin it."),
    Passage("p3", "Paris", "Paris is the capital of France."),
]


@pytest.fixture()
def store(tmp_path: Path) -> PassageStore:
    assert write_store(tmp_path / "passages.sqlite", PASSAGES) == 4
    return PassageStore(tmp_path / "passages.sqlite")


def test_rows_come_back_in_the_order_asked_unicode_intact(store: PassageStore) -> None:
    assert len(store) == 4
    assert store.by_rows([3, 1, 1, 0]) == [PASSAGES[3], PASSAGES[1], PASSAGES[1], PASSAGES[0]]
    assert store.by_rows([2]) == [PASSAGES[2]]  # empty title, emoji, quotes and a newline round-trip
    assert store.by_rows([]) == []
    assert list(store.iter_range(1, 3)) == PASSAGES[1:3]


def test_by_ids_gives_none_for_missing_ids(store: PassageStore) -> None:
    assert store.by_ids(["p1", "nope", "p0", "p1"]) == [PASSAGES[1], None, PASSAGES[0], PASSAGES[1]]
    assert store.by_ids([]) == []


def test_many_rows_at_once_beyond_sqlites_parameter_limit(tmp_path: Path) -> None:
    many = [Passage(f"id{i}", "", f"text {i}") for i in range(2_500)]
    write_store(tmp_path / "many.sqlite", many)
    store = PassageStore(tmp_path / "many.sqlite")
    rows = list(range(2_499, -1, -1))
    assert store.by_rows(rows) == [many[i] for i in rows]


def test_out_of_range_rows_and_bad_files_say_so(store: PassageStore, tmp_path: Path) -> None:
    with pytest.raises(IndexError, match="row 4 is out of range"):
        store.by_rows([0, 4])
    with pytest.raises(IndexError, match="row -1"):
        store.by_rows([-1])
    with pytest.raises(InputError, match="does not exist; rebuild"):
        PassageStore(tmp_path / "missing.sqlite")
    (tmp_path / "junk.sqlite").write_text("not a database at all" * 100)
    with pytest.raises(InputError, match="is not a passage store"):
        PassageStore(tmp_path / "junk.sqlite")


def test_duplicate_ids_refused_in_one_line_and_nothing_left_behind(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="passage id 'p1' appears twice"):
        write_store(tmp_path / "dup.sqlite", [*PASSAGES, Passage("p1", "", "again")])
    assert not (tmp_path / "dup.sqlite").exists()
    assert not list(tmp_path.glob(".dup.sqlite.tmp-*"))


def test_store_is_read_only_and_usable_from_threads(store: PassageStore) -> None:
    results: list[list[Passage]] = []

    def read() -> None:
        results.append(store.by_rows([0, 3]))

    threads = [threading.Thread(target=read) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == [[PASSAGES[0], PASSAGES[3]]] * 4
    with pytest.raises(sqlite3.OperationalError, match="readonly"):
        store._connection().execute("DELETE FROM passages")


def test_store_works_in_a_forked_child(store: PassageStore) -> None:
    store.by_rows([0])  # the parent's connection exists before the fork
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        ok = store.by_rows([1]) == [PASSAGES[1]]
        os.write(write, b"1" if ok else b"0")
        os._exit(0)
    os.waitpid(pid, 0)
    assert os.read(read, 1) == b"1"


def test_as_source_wraps_lists_and_keeps_sources() -> None:
    source = as_source(PASSAGES)
    assert isinstance(source, PassageList) and source.by_rows([1]) == [PASSAGES[1]] and len(source) == 4
    assert as_source(source) is source
