"""The trace is typed: every entry a frozen dataclass of :mod:`selfrag.inference.trace`, its ``to_dict`` the JSON that
docs/runtime.md documents (the table of kinds and fields), and a question's rounds end with a typed ``Outcome``."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import jsonschema
import pytest
from runtime_scripts import (
    FULL,
    LYON,
    NICE,
    NONE,
    PARIS,
    RELEVANT,
    UTILITY_5,
    FixedRetriever,
    critic_engine,
    keyed_runtime,
)

from selfrag import reflection as rf
from selfrag.inference.config import InferenceConfig, SkipConfig
from selfrag.inference.prompted import PromptedSelfRAG
from selfrag.inference.server.schemas import SelfragExtension, trace_entry_schema
from selfrag.inference.trace import (
    ENTRY_TYPES,
    CandidateScore,
    CriticRecord,
    CriticRelevance,
    Critique,
    Decide,
    Finish,
    Generate,
    Outcome,
    RankedCandidate,
    Retrieve,
    Skip,
    Support,
)

Q = "What is the capital of France?"
DOCS = Path(__file__).resolve().parents[2] / "docs" / "runtime.md"


def documented() -> dict[tuple[str, str], list[str]]:
    """docs/runtime.md's table: (step, class) -> its JSON keys in order, an optional one in brackets."""
    rows = re.findall(r"^\| `([a-z_]+)` \| `(\w+)` \| ([^|]+) \|$", DOCS.read_text(encoding="utf-8"), re.MULTILINE)
    return {(step, name): keys.split() for step, name, keys in rows}


def emitted_keys(cls: type) -> list[str]:
    """What the class's ``to_dict`` can write, spelled as the docs table spells it."""
    keys = []
    for field in dataclasses.fields(cls):
        name = field.metadata.get("under", field.name)
        if field.name == "counts":
            keys.append("[critic_calls]")  # the one count a mode adds (the prompted critic's)
        else:
            keys.append(f"[{name}]" if field.metadata.get("optional") else name)
    return keys


def test_the_documented_table_lists_every_entry_class_with_its_fields() -> None:
    table = documented()
    assert set(table) == {(cls.step, cls.__name__) for cls in ENTRY_TYPES}  # type: ignore[attr-defined]
    for cls in ENTRY_TYPES:
        assert table[(cls.step, cls.__name__)] == emitted_keys(cls), cls.__name__  # type: ignore[attr-defined]


def test_the_served_schema_documents_each_kind_of_entry() -> None:
    """GET /openapi.json: selfrag.trace's items are one object per entry class, ``step`` their discriminator."""
    items = SelfragExtension.model_json_schema()["properties"]["trace"]["items"]
    assert [kind["title"] for kind in items["oneOf"]] == [cls.__name__ for cls in ENTRY_TYPES]
    skip = next(kind for kind in items["oneOf"] if kind["title"] == "Skip")
    assert skip["properties"]["step"] == {"const": "skip"} and skip["required"] == ["step", "round", "rule", "chosen",
                                                                                     "reason"]
    assert skip["properties"]["rule"]["enum"] == ["repeated_query", "repeated_passages", "relevance_gap",
                                                  "unpaid_rounds"]
    validator = jsonschema.Draft202012Validator(trace_entry_schema())
    good = Skip(round=1, rule="unpaid_rounds", chosen="give_up", reason="r").to_dict()
    validator.validate(good)
    for bad in ({**good, "rule": "tired"}, {**good, "extra": 1}, {k: v for k, v in good.items() if k != "reason"}):
        with pytest.raises(jsonschema.ValidationError):
            validator.validate(bad)


def check_typed(answer) -> list[dict]:  # type: ignore[no-untyped-def]
    """Every entry is one of the typed classes (frozen, slotted), and the JSON is each one's ``to_dict`` with the keys
    the docs list, required ones present, in the documented order; returns the JSON after a round trip."""
    table = documented()
    for entry in answer.trace:
        assert type(entry) in ENTRY_TYPES and not hasattr(entry, "__dict__")
        with pytest.raises(dataclasses.FrozenInstanceError):
            entry.reason = "changed"
        keys = [key.strip("[]") for key in table[(entry.step, type(entry).__name__)]]
        written = [key for key in entry.to_dict() if key != "step"]
        assert [key for key in keys if key in written] == written  # only documented keys, in their order
        required = [key for key in table[(entry.step, type(entry).__name__)] if not key.startswith("[")]
        assert set(required) <= set(written)
    shown = answer.to_json()["trace"]
    assert shown == [entry.to_dict() for entry in answer.trace] and all(step["step"] for step in shown)
    assert json.loads(json.dumps(shown)) == shown
    validator = jsonschema.Draft202012Validator(trace_entry_schema())
    for step in shown:  # exactly one kind of the served schema matches each entry
        validator.validate(step)
    return shown


@pytest.fixture
def build(reflection_tokenizer, token_ids):  # type: ignore[no-untyped-def]
    def branch(text: str, support=NONE):  # type: ignore[no-untyped-def]
        return [(rf.RELEVANT, RELEVANT), text, (max(support, key=support.get), support), ("[Utility:5]", UTILITY_5)]

    def make(table: dict, passages, **config):  # type: ignore[no-untyped-def]
        config.setdefault("mode", "always")
        config.setdefault("top_k", 1)
        keyed = {passage: branch(*steps) for passage, steps in table.items()}
        return keyed_runtime(reflection_tokenizer, token_ids, Q, keyed, passages, **config)[0]

    return make


def test_a_re_retrieval_that_ends_in_abstain_is_traced_in_typed_entries(build) -> None:  # type: ignore[no-untyped-def]
    rag = build({PARIS: ("Berlin.",), LYON: ("Rome.",)}, (PARIS, LYON), max_rounds=1)
    answer = rag.answer(Q)
    shown = check_typed(answer)
    assert answer.abstained
    decide, first = answer.trace[0], answer.trace[1]
    assert isinstance(decide, Decide) and decide.mode == "always" and decide.probabilities is None
    assert isinstance(first, Retrieve) and first.round == 0 and first.chosen == (PARIS.id,) and first.scores == (10.0,)
    assert shown[1] == {"step": "retrieve", "round": 0, "query": Q, "chosen": [PARIS.id], "scores": [10.0],
                        "reason": "top 1 passages for the question"}  # no "repeated": nothing was left out
    supports = [entry for entry in answer.trace if isinstance(entry, Support)]
    assert [s.chosen for s in supports] == ["re-retrieve", "rounds exhausted", "abstain"]
    assert supports[0].query == f"{Q} Berlin." and supports[0].round == 0 and supports[1].round == 1
    assert supports[-1].why is not None and supports[-1].why.startswith("best of all 2 rounds")
    assert shown[shown.index(supports[-1].to_dict())]["probabilities"] == {"support": supports[-1].support}


def test_a_work_ends_its_rounds_with_a_typed_outcome(build) -> None:  # type: ignore[no-untyped-def]
    rag = build({PARIS: ("Berlin.",), LYON: ("Paris.", FULL)}, (PARIS, LYON), max_rounds=1)
    works = rag._works([Q, "Where is Lyon?"], None)
    for _ in rag.phases(works):
        pass
    outcome = works[0].outcome
    assert outcome == Outcome("accept", 1, outcome.reason) and works[0].candidates[1].passage == LYON
    assert rag.finish(works[0]).answer == "Paris."


@pytest.mark.parametrize(("table", "passages", "rounds", "rule"), [
    ({PARIS: ("Berlin.",), LYON: ("Berlin.",), NICE: ("Rome.",)}, (PARIS, LYON, NICE), 2, "repeated_query"),
    ({PARIS: ("Berlin.",), LYON: ("Paris.", FULL)}, (PARIS, LYON), 1, "unpaid_rounds"),
])
def test_skipped_rounds_are_typed_skip_entries(build, table, passages, rounds, rule) -> None:  # type: ignore[no-untyped-def]
    rag = build(table, passages, max_rounds=rounds)
    if rule == "unpaid_rounds":  # the model's calibration measured that re-retrieval answered no dev question
        rag.engine.calibration = {"measured": {"re_retrieved": 7, "rescued_by_re_retrieval": 0}}
    answer = rag.answer(Q)
    shown = check_typed(answer)
    [skip] = [entry for entry in answer.trace if isinstance(entry, Skip)]
    assert skip.rule == rule and skip.chosen == "give_up" and skip.reason
    assert {"step": "skip", "round": skip.round, "rule": rule, "chosen": "give_up", "reason": skip.reason} in shown


def test_a_round_far_below_the_relevance_cut_is_a_typed_skip_naming_the_branches(build) -> None:  # type: ignore[no-untyped-def]
    rag = build({PARIS: ("Lyon.",), LYON: ("Nice.",)}, (PARIS, LYON), top_k=2, max_rounds=0, relevance_threshold=0.95,
                skip=SkipConfig(relevance_gap=0.0))
    answer = rag.answer(Q)
    check_typed(answer)
    [skip] = [entry for entry in answer.trace if isinstance(entry, Skip)]
    assert skip.rule == "relevance_gap" and skip.chosen == (PARIS.id, LYON.id)
    assert skip.to_dict()["chosen"] == [PARIS.id, LYON.id]  # a tuple in code, a list in JSON


def test_the_prompted_critics_entries_are_typed(reflection_tokenizer) -> None:  # type: ignore[no-untyped-def]
    engine = critic_engine(reflection_tokenizer, "fully", "Paris.")
    answer = PromptedSelfRAG(engine, FixedRetriever([PARIS]), InferenceConfig(mode="always", top_k=1)).answer(Q)
    shown = check_typed(answer)
    relevance = next(entry for entry in answer.trace if isinstance(entry, CriticRelevance))
    assert relevance.critic[PARIS.id] == CriticRecord(("yes",), rf.RELEVANT)
    critique = next(entry for entry in answer.trace if isinstance(entry, Critique))
    assert critique.chosen == (rf.RELEVANT, rf.FULLY_SUPPORTED, "[Utility:5]")
    finish = answer.trace[-1]
    assert isinstance(finish, Finish) and finish.counts["critic_calls"] == 3
    assert shown[-1] == {"step": "finish", "chosen": "accept", "critic_calls": 3, "reason": "3 critic calls"}
    assert next(s for s in shown if s["step"] == "relevance")["critic"][PARIS.id] == {
        "replies": ["yes"], "verdict": rf.RELEVANT, "retried": False}


def test_to_dict_writes_the_documented_json_exactly() -> None:
    """Hand-built entries: optional fields left out while unset, required ones written as null, tuples as lists."""
    support = Support(round=1, passage_id=None, verdict=None, relevance_verdict=None, support=None, support_bound=0.2,
                      chosen="abstain", reason="no passage", why="best of all 2 rounds")
    assert support.to_dict() == {
        "step": "support", "round": 1, "passage_id": None, "verdict": None, "relevance_verdict": None,
        "probabilities": {"support": None}, "support_bound": 0.2, "chosen": "abstain", "reason": "no passage",
        "why": "best of all 2 rounds",
    }
    assert list(support.to_dict())[5:7] == ["probabilities", "support_bound"]
    generate = Generate(reason="r", well_formed=False, problems=("p",), generated="g", counts={"critic_calls": 2},
                        abstain="the reply has no answer text")
    assert list(generate.to_dict().items())[-2:] == [("critic_calls", 2), ("abstain", "the reply has no answer text")]
    score = CandidateScore(0.9, None, 0.5, 1.15, rf.RELEVANT, None, "[Utility:4]", ("support",))
    ranked = RankedCandidate(passage_id="p", score=score, well_formed=True, problems=("unused",), generated="x",
                             complete=False, round=0, rejected="lost")
    assert ranked.to_dict() == {"passage_id": "p", **score.to_json(), "well_formed": True, "generated": "x",
                                "complete": False, "rejected": "lost"}
    assert CriticRecord(("?", "no"), rf.NO_RETRIEVAL, fallback=True).to_dict() == {
        "replies": ["?", "no"], "verdict": rf.NO_RETRIEVAL, "fallback": True}
