"""Hand-built trajectory records for the training tests (imported by name: pytest puts this folder on sys.path)."""

from __future__ import annotations

from typing import Any

from selfrag import reflection as rf
from selfrag.trajectory import Label, Passage, Record, Segment


def gold(value: str) -> Label:
    return Label(value, "gold")


def three_passage_record(record_id: str = "three", passage_text: str = "The Normans came from Normandy.") -> Record:
    """Three retrieved passages (relevant, irrelevant, relevant), each with its own sentence and support."""
    passages = [
        Passage("p1", "Normans", passage_text),
        Passage("p2", "Rollo", "Rollo was a Viking leader."),
        Passage("p3", "France", "Normandy is a region in France."),
    ]
    relevance = [rf.RELEVANT, rf.IRRELEVANT, rf.RELEVANT]
    support = [rf.FULLY_SUPPORTED, rf.NO_SUPPORT, rf.PARTIALLY_SUPPORTED]
    texts = ["The Normans lived in Normandy.", " Rollo led them.", " It is in France."]
    segments = tuple(
        Segment(text, gold(rf.RETRIEVAL), passage, gold(rel), gold(sup))
        for text, passage, rel, sup in zip(texts, passages, relevance, support, strict=True)
    )
    return Record(record_id, "Where did the Normans live?", segments, gold(rf.UTILITY_TOKENS[4]))


def no_retrieval_record(record_id: str = "plain", answer: str = "Four.", utility: int = 4) -> Record:
    segment = Segment(answer, gold(rf.NO_RETRIEVAL))
    return Record(record_id, "What is two plus two?", (segment,), gold(rf.UTILITY_TOKENS[utility - 1]))


def one_passage_record(record_id: str, relevant: bool) -> Record:
    passage = Passage(f"{record_id}-p", "Normandy", "Normandy is a region in France where the Normans lived.")
    relevance = rf.RELEVANT if relevant else rf.IRRELEVANT
    support = rf.FULLY_SUPPORTED if relevant else rf.NO_SUPPORT
    segment = Segment("They lived in Normandy.", gold(rf.RETRIEVAL), passage, gold(relevance), gold(support))
    return Record(record_id, "Where did the Normans live?", (segment,), gold(rf.UTILITY_TOKENS[4 if relevant else 1]))


def training_records() -> list[Record]:
    """Eight short records of the three shapes."""
    records: list[Record] = []
    for index in range(8):
        if index % 3 == 0:
            records.append(no_retrieval_record(f"r{index}", answer=f"It is {index}."))
        elif index % 3 == 1:
            records.append(one_passage_record(f"r{index}", relevant=index % 2 == 1))
        else:
            records.append(three_passage_record(f"r{index}"))
    return records


def initial_weights(config: Any) -> dict[str, Any]:
    """A copy of the weights ``config``'s run starts from (prepare_model is seeded), to check what training changed."""
    from selfrag.training.model import prepare_model

    return {name: value.detach().clone() for name, value in prepare_model(config).model.state_dict().items()}


def train_and_compare(config: Any) -> tuple[Any, dict[str, Any], dict[str, Any]]:
    """``config``'s run, the weights it started from and those it ended with; fails unless the loss went down."""
    from selfrag.training.run import run

    initial = initial_weights(config)
    result = run(config)
    losses = [entry["loss"] for entry in result.losses]
    assert losses[-1] < losses[0], f"the loss did not go down: {losses}"
    return result, initial, result.model.state_dict()
