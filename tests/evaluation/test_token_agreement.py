"""Teacher-forced reflection agreement on the tiny Llama: the hf engine's one forward per item gives the rows that one
one-token decode per (item, type) gives, for every type, with and without a passage."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from selfrag import reflection as rf  # noqa: E402
from selfrag.evaluation.counting import CountingEngine  # noqa: E402
from selfrag.evaluation.data import LabelExample  # noqa: E402
from selfrag.evaluation.token_agreement import predict  # noqa: E402
from selfrag.inference.engines import Generation, GenerationRequest, PrefixScorer  # noqa: E402
from selfrag.inference.engines.hf import HFEngine  # noqa: E402
from selfrag.trajectory import Passage  # noqa: E402

PARIS = Passage("paris", "Paris", "Paris is the capital and largest city of France, on the Seine.")
LYON = Passage("lyon", "Lyon", "Lyon has silk.")
ALL = {"retrieve": rf.RETRIEVAL, "relevance": rf.RELEVANT, "support": rf.FULLY_SUPPORTED, "utility": "[Utility:5]"}
ITEMS = [
    LabelExample("all", "What is the capital of France?", PARIS, "Paris is the capital.", ALL),
    LabelExample("negative", "What is the capital of France?", LYON, "Lyon.",
                 {"relevance": rf.IRRELEVANT, "support": rf.NO_SUPPORT, "utility": "[Utility:1]"}),
    LabelExample("support-only", "Which river runs through Paris, the capital city of France?", PARIS,
                 "The Seine runs through it.", {"support": rf.PARTIALLY_SUPPORTED}),
    LabelExample("relevance-only", "Who?", LYON, "", {"relevance": rf.IRRELEVANT}),
    LabelExample("no-passage", "What is two plus two?", None, "Four.",
                 {"retrieve": rf.NO_RETRIEVAL, "utility": "[Utility:4]"}),
    LabelExample("no-passage-utility", "Say hello.", None, "Hello there, how are you today?",
                 {"utility": "[Utility:3]"}),
    LabelExample("retrieve-only", "When was the Eiffel Tower built?", PARIS, "", {"retrieve": rf.RETRIEVAL}),
]


class PerPrefix:
    """The hf engine behind the protocol alone (no ``score_prefixes``): ``predict`` decodes one step per prefix."""

    def __init__(self, engine: HFEngine) -> None:
        self.tokenizer, self.token_ids = engine.tokenizer, engine.token_ids
        self.prompt_template, self.name, self._engine = engine.prompt_template, "per-prefix", engine

    @property
    def calibration(self) -> Mapping[str, Any] | None:
        return None

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Generation]:
        return self._engine.generate(requests)


@pytest.fixture(scope="module")
def engine(merged_model_dir) -> HFEngine:  # type: ignore[no-untyped-def]
    return HFEngine(merged_model_dir(3), batch_size=3)  # seven items: batches mix lengths


def test_one_forward_per_item_gives_the_per_prefix_rows(engine: HFEngine) -> None:
    old = predict(PerPrefix(engine), ITEMS)  # type: ignore[arg-type]
    new = predict(engine, ITEMS)
    assert len(new) == sum(len(item.labels) for item in ITEMS) == 13
    assert {row["type"] for row in new} == set(ALL)
    for mine, theirs in zip(new, old, strict=True):
        assert {k: mine[k] for k in ("id", "type", "gold", "predicted")} == \
            {k: theirs[k] for k in ("id", "type", "gold", "predicted")}
        assert mine["score"] == pytest.approx(theirs["score"], abs=1e-4)


@pytest.mark.parametrize("wrapped", [False, True], ids=["engine", "as-eval-wraps-it"])
def test_the_hf_engine_takes_the_one_forward_path(engine: HFEngine, wrapped: bool,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    assert isinstance(engine, PrefixScorer) and not isinstance(PerPrefix(engine), PrefixScorer)
    forwards: list[int] = []
    handle = engine.model.register_forward_hook(lambda _module, _args, _output: forwards.append(1))
    monkeypatch.setattr(engine, "generate", lambda requests: pytest.fail("predict decoded instead of scoring"))
    try:
        predict(CountingEngine(engine) if wrapped else engine, ITEMS)  # type: ignore[arg-type]
    finally:
        handle.remove()
    assert len(forwards) == 3  # seven items, batch_size 3: three forwards (one decode per row would take five)


def test_items_without_labels_give_no_rows_and_no_forward(engine: HFEngine) -> None:
    assert predict(engine, [LabelExample("none", "q?", PARIS, "a")]) == []
