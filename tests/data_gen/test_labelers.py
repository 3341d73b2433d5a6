"""The LLM labeler's prompts: the paper's definitions, scales and demonstrations, the item in the paper's order."""

from __future__ import annotations

import json

import pytest

from selfrag import reflection as rf
from selfrag.data_gen import critic_prompts
from selfrag.data_gen.critic_prompts import DEMONSTRATIONS, INSTRUCTIONS, Demonstration
from selfrag.data_gen.labelers import FORMAT, VOCABULARY, LabelItem, parse_label, prompt_hash, render_prompt
from selfrag.trajectory import Passage

PASSAGE = Passage("p", "Paris", "Paris is the capital of France.")
KINDS = ("retrieve", "retrieve_sentence", "relevance", "support", "utility")


def item(kind: str) -> LabelItem:
    needs_passage = kind in ("retrieve_sentence", "relevance", "support")
    output = "Paris is the capital." if kind in ("retrieve_sentence", "support", "utility") else None
    preceding = "It is in Europe." if kind in ("retrieve_sentence", "support") else ""
    return LabelItem(kind, "What is the capital of France?", PASSAGE if needs_passage else None, output, preceding)  # type: ignore[arg-type]


@pytest.mark.parametrize("kind", KINDS)
def test_prompt_is_instruction_demonstrations_item_format(kind: str) -> None:
    prompt = render_prompt(item(kind))
    assert prompt.startswith(INSTRUCTIONS[kind] + "\n\n##\n")
    assert prompt.endswith(FORMAT.format(labels=", ".join(VOCABULARY[kind])))
    blocks = prompt.split("\n##\n")[1:]
    assert len(blocks) == len(DEMONSTRATIONS[kind]) + 1  # the item comes last
    for block, demo in zip(blocks, DEMONSTRATIONS[kind], strict=False):
        reply = block.rstrip("\n").rsplit("\nReply: ", 1)[1]
        assert parse_label(reply, kind) == (demo.label, None)  # each demonstration answers in the strict format
        assert json.loads(reply)["explanation"] == demo.explanation
    assert blocks[-1].startswith("Instruction: What is the capital of France?\n")


def test_item_fields_come_in_the_papers_order() -> None:
    support = render_prompt(item("support")).rsplit("\n##\n", 1)[1]
    assert support.index("Preceding sentences: It is in Europe.") < support.index("Output: Paris is the capital.")
    assert support.index("Output: ") < support.index("Evidence: Paris\nParis is the capital of France.")
    sentence = render_prompt(item("retrieve_sentence")).rsplit("\n##\n", 1)[1]
    assert sentence.index("Evidence: ") < sentence.index("Output: Paris is the capital.")
    relevance = render_prompt(item("relevance")).rsplit("\n##\n", 1)[1]
    assert "Output" not in relevance and "Preceding" not in relevance


def test_definitions_and_scales_are_the_papers() -> None:
    support = INSTRUCTIONS["support"]
    for definition in (
        "[Fully supported] - All information in output is supported by the evidence, or extractions from the "
        "evidence. This is only applicable when the output and part of the evidence are almost identical.",
        "[Partially supported] - The output is supported by the evidence to some extent, but there is major "
        "information in the output that is not discussed in the evidence.",
        "[No support / Contradictory] - The output completely ignores evidence, is unrelated to the evidence, or "
        "contradicts the evidence. This can also happen if the evidence is irrelevant to the instruction.",
    ):
        assert definition in support
    utility = INSTRUCTIONS["utility"]
    scale = [line for line in utility.splitlines() if line[:2] in ("1:", "2:", "3:", "4:", "5:")]
    assert [line[0] for line in scale] == ["5", "4", "3", "2", "1"]
    assert scale[0].startswith("5: The response provides a complete, highly detailed, and informative response")
    assert scale[-1] == "1: The response is barely on-topic or completely irrelevant."
    assert "[Utility:k]" in utility
    # the paper retrieves even for a widely known fact, and not for writing, personal experience or math
    retrieve = {demo.question: demo.label for demo in DEMONSTRATIONS["retrieve"]}
    assert retrieve["What is the capital of France?"] == rf.RETRIEVAL
    assert retrieve["Find the area of a circle given its radius. Radius = 4"] == rf.NO_RETRIEVAL
    assert [demo.label for demo in DEMONSTRATIONS["utility"]] == ["[Utility:2]", "[Utility:3]"]
    for kind in KINDS:
        assert all(demo.label in VOCABULARY[kind] for demo in DEMONSTRATIONS[kind])


def test_prompt_hash_covers_the_demonstrations(monkeypatch: pytest.MonkeyPatch) -> None:
    hashes = {kind: prompt_hash(kind) for kind in KINDS}
    assert len(set(hashes.values())) == len(KINDS)
    changed = (Demonstration("Q?", rf.RELEVANT, "another explanation", evidence="E"),)
    monkeypatch.setitem(critic_prompts.DEMONSTRATIONS, "relevance", changed)
    assert prompt_hash("relevance") != hashes["relevance"]
    assert prompt_hash("support") == hashes["support"]
