"""executor=ray's driver loop (``label_each``) without Ray: each question is journaled as its result arrives, in
whatever order the workers finish, so a driver stopped mid-run keeps every finished question and a rerun repeats
none. A fake completion order stands in for ``ray.wait``; the real cluster run is in test_ray_executor.py."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from selfrag.data_gen.outputs import Journal
from selfrag.data_gen.ray_executor import label_each

ROWS = [{"query": f"q{number:02d}"} for number in range(20)]


class FakeCluster:
    """``submit`` and ``next_done`` over workers that finish their questions in a seeded random order."""

    def __init__(self, seed: int) -> None:
        self.random = random.Random(seed)
        self.submitted: list[tuple[int, str]] = []
        self.most_in_flight = 0
        self.in_flight: dict[int, int] = {}

    def submit(self, worker: int, row: dict[str, Any]) -> tuple[int, str]:
        self.submitted.append((worker, row["query"]))
        self.in_flight[worker] = self.in_flight.get(worker, 0) + 1
        self.most_in_flight = max(self.most_in_flight, max(self.in_flight.values()))
        return worker, row["query"]

    def next_done(self, handles: list[tuple[int, str]]) -> tuple[tuple[int, str], dict[str, Any]]:
        handle = self.random.choice(handles)  # any question in flight may finish first
        self.in_flight[handle[0]] -= 1
        return handle, {"query_id": handle[1], "entry": {"query_id": handle[1], "record": {"id": handle[1]}}}


class Stop(Exception):
    """The driver killed (SIGINT / SIGKILL) while questions are in flight."""


def journal_lines(path: Path) -> list[str]:
    return [json.loads(line)["query_id"] for line in path.read_text().splitlines()]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_each_result_is_journaled_as_it_arrives_and_a_rerun_repeats_none(tmp_path: Path, seed: int) -> None:
    path = tmp_path / "journal.jsonl"
    journal = Journal(path)
    cluster = FakeCluster(seed)
    arrived: list[str] = []

    def add(result: dict[str, Any]) -> None:
        journal.add(result["entry"])
        arrived.append(result["query_id"])
        # on disk the moment it arrives: the journal holds exactly the results handed over so far, in that order
        assert journal_lines(path) == arrived
        if len(arrived) == 7:
            raise Stop

    with pytest.raises(Stop):
        label_each(ROWS, 2, 4, cluster.submit, cluster.next_done, add)
    journal.close()
    assert journal_lines(path) == arrived and len(arrived) == 7  # 7 of 20 finished, all 7 journaled, none twice
    assert cluster.most_in_flight == 4  # per worker, never more (and kept full: a finished one is replaced)
    # the rerun (teacher_run's resume: the journal read back, the rest labelled)
    resumed = Journal(path)
    todo = [row for row in ROWS if row["query"] not in resumed.done]
    again = FakeCluster(seed + 10)
    label_each(todo, 2, 4, again.submit, again.next_done, lambda result: resumed.add(result["entry"]))
    resumed.close()
    assert not {query for _, query in again.submitted} & set(arrived)  # no finished question asked again
    final = journal_lines(path)
    assert sorted(final) == [row["query"] for row in ROWS] and len(final) == len(set(final))


def test_a_worker_gets_its_next_question_as_soon_as_one_of_its_own_finishes() -> None:
    cluster = FakeCluster(3)
    label_each(ROWS[:9], 3, 2, cluster.submit, cluster.next_done, lambda result: None)
    first = cluster.submitted[:6]
    assert [worker for worker, _ in first] == [0, 0, 1, 1, 2, 2]  # every worker full before any result
    assert sorted(query for _, query in cluster.submitted) == [row["query"] for row in ROWS[:9]]  # each once
    assert cluster.most_in_flight == 2 and all(count == 0 for count in cluster.in_flight.values())


def test_no_rows_submits_nothing() -> None:
    cluster = FakeCluster(0)
    label_each([], 2, 4, cluster.submit, cluster.next_done, lambda result: None)
    assert cluster.submitted == []
