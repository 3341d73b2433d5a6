"""The retrieval rounds every mode shares: the prompted critic follows the single-pass runtime's loop entry for entry,
honours ``on_all_irrelevant``, and long form goes through the same round rule (a step whose every branch was pruned
is unsupported, not a crash)."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest
from runtime_scripts import FixedRetriever, KeyedEngine, Segments, passage_key

from selfrag import reflection as rf
from selfrag.inference.config import InferenceConfig, LongFormConfig, PruningConfig
from selfrag.inference.engines import GenerationRequest, Script, ScriptedEngine
from selfrag.inference.prompted import PromptedSelfRAG
from selfrag.inference.runtime import SelfRAG
from selfrag.prompting import encode_prompt, encode_text
from selfrag.trajectory import Passage

PARIS = Passage("p-paris", "Paris", "Paris is the capital of France.")
LYON = Passage("p-lyon", "Lyon", "Lyon is a city in France.")
Q = "What is the capital of France?"
#: the single-pass model's verdicts, as probabilities: relevant or not, fully supported or not at all
REL, IRR = {rf.RELEVANT: 0.9, rf.IRRELEVANT: 0.1}, {rf.RELEVANT: 0.1, rf.IRRELEVANT: 0.9}
FULL, NONE = ({rf.FULLY_SUPPORTED: 0.9, rf.PARTIALLY_SUPPORTED: 0.05, rf.NO_SUPPORT: 0.05},
              {rf.FULLY_SUPPORTED: 0.05, rf.PARTIALLY_SUPPORTED: 0.05, rf.NO_SUPPORT: 0.9})
U5 = ("[Utility:5]", {"[Utility:5]": 0.9, "[Utility:1]": 0.1})
OFF = PruningConfig(enabled=False)
#: the entries the shared loop writes (decide, relevance, critique and prune are each mode's own way of scoring)
SHARED = ("retrieve", "rank", "support", "partial", "abstain", "generate")

#: one scenario, told twice: (relevant, supported: yes, no or "partly") per passage for the single-pass model and for
#: the critic
Verdicts = dict[str, tuple[bool, bool | str]]
PART = {rf.FULLY_SUPPORTED: 0.2, rf.PARTIALLY_SUPPORTED: 0.7, rf.NO_SUPPORT: 0.1}
SUPPORT = {True: (rf.FULLY_SUPPORTED, FULL, "fully"), False: (rf.NO_SUPPORT, NONE, "no"),
           "partly": (rf.PARTIALLY_SUPPORTED, PART, "partially")}


def single_pass(tokenizer, ids, verdicts: Verdicts, alone: str) -> KeyedEngine:  # type: ignore[no-untyped-def]
    segments = Segments(tokenizer, ids)
    table = {}
    for passage in (PARIS, LYON):
        relevant, supported = verdicts[passage.id]
        table[passage_key(tokenizer, ids, passage)] = segments.script(
            (rf.RELEVANT, REL) if relevant else (rf.IRRELEVANT, IRR), f"{passage.title}.",
            SUPPORT[supported][:2], U5)
    no_retrieval = (*encode_prompt(tokenizer, Q), ids.id(rf.NO_RETRIEVAL))
    table[no_retrieval] = segments.script(alone, U5)
    return KeyedEngine(tokenizer, ids, table)


def critic(tokenizer, verdicts: Verdicts, alone: str, asked: list[str] | None = None) -> ScriptedEngine:  # type: ignore[no-untyped-def]
    """A plain instruct model (no reflection ids) that states the same verdicts in words."""

    def reply(prompt: str) -> str:
        if asked is not None:
            asked.append(prompt)
        passage = next((p for p in (PARIS, LYON) if p.text in prompt), None)
        if passage is None:
            return alone  # "Answer the question concisely."
        relevant, supported = verdicts[passage.id]
        if "Does the passage contain" in prompt:
            return "yes" if relevant else "no"
        if "Answer the question using" in prompt:
            return f"{passage.title}."
        if "Is the statement supported" in prompt:
            return SUPPORT[supported][2]
        raise AssertionError(prompt)

    def script(request: GenerationRequest) -> Script:
        prompt = tokenizer.decode(list(request.prompt_ids), skip_special_tokens=False)
        if "How useful" in prompt:
            return Script(tuple(encode_text(tokenizer, "5")))
        return Script(tuple(encode_text(tokenizer, reply(prompt))))

    return ScriptedEngine(tokenizer, None, script)  # type: ignore[arg-type]


def shared(trace: tuple[dict[str, Any], ...]) -> list[tuple[str, Any, list[str]]]:
    """Each shared entry's step, choice and fields (the critic's own count of calls aside)."""
    return [(entry["step"], entry["chosen"], sorted(set(entry) - {"critic_calls"}))
            for entry in trace if entry["step"] in SHARED]


SCENARIOS: dict[str, tuple[Verdicts, dict[str, Any]]] = {
    "accept": ({PARIS.id: (True, True), LYON.id: (True, True)}, {}),
    "re-retrieve, then abstain": ({PARIS.id: (True, False), LYON.id: (True, False)}, {"max_rounds": 1}),
    "re-retrieve, then flag": (
        {PARIS.id: (True, False), LYON.id: (True, False)}, {"max_rounds": 1, "on_unsupported": "flag"}),
    "irrelevant, then flag": (
        {PARIS.id: (False, False), LYON.id: (False, False)}, {"max_rounds": 0, "on_unsupported": "flag"}),
    "every passage irrelevant: no_retrieval": (
        {PARIS.id: (False, True), LYON.id: (False, True)}, {"max_rounds": 1, "on_all_irrelevant": "no_retrieval"}),
    "mode=never": ({PARIS.id: (True, True), LYON.id: (True, True)}, {"mode": "never"}),
    "partly supported, on_partial=drop": (
        {PARIS.id: (True, "partly"), LYON.id: (True, True)}, {"on_partial": "drop", "support_bound": 0.0}),
    "partly supported, on_partial=rewrite": (
        {PARIS.id: (True, "partly"), LYON.id: (True, True)}, {"on_partial": "rewrite", "support_bound": 0.0}),
}


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_the_prompted_critic_writes_the_single_pass_runtimes_trace(name, reflection_tokenizer, token_ids) -> None:  # type: ignore[no-untyped-def]
    verdicts, settings = SCENARIOS[name]
    config = InferenceConfig(**({"mode": "always", "top_k": 1, "pruning": OFF} | settings))
    engine = single_pass(reflection_tokenizer, token_ids, verdicts, "Four.")
    expected = SelfRAG(engine, FixedRetriever([PARIS, LYON]), config).answer(Q)
    answer = PromptedSelfRAG(critic(reflection_tokenizer, verdicts, "Four."), FixedRetriever([PARIS, LYON]),
                             config).answer(Q)
    assert shared(answer.to_json()["trace"]) == shared(expected.to_json()["trace"])
    assert (answer.answer, answer.abstained, answer.low_confidence, answer.citations) == (
        expected.answer, expected.abstained, expected.low_confidence, expected.citations)
    assert [why.split(":")[0] for why in answer.reasons] == [why.split(":")[0] for why in expected.reasons]


@pytest.mark.parametrize("setting", ["no_retrieval", "unsupported"])
def test_the_prompted_critic_honours_on_all_irrelevant(setting, reflection_tokenizer) -> None:  # type: ignore[no-untyped-def]
    asked: list[str] = []
    retriever = FixedRetriever([PARIS, LYON])
    verdicts = {PARIS.id: (False, True), LYON.id: (False, True)}
    config = InferenceConfig(mode="always", top_k=2, max_rounds=1, on_all_irrelevant=setting)
    answer = PromptedSelfRAG(critic(reflection_tokenizer, verdicts, "Four.", asked), retriever, config).answer(Q)
    support = [entry["chosen"] for entry in answer.to_json()["trace"] if entry["step"] == "support"]
    if setting == "unsupported":  # as before: answers from the passages, re-retrieve (nothing new), then abstain
        assert retriever.queries[0] == Q and len(retriever.queries) == 2 and answer.abstained
        assert "answer_without_retrieval" not in support
        return
    # both passages judged irrelevant: no second round and no answer written from them; the answer comes alone
    assert retriever.queries == [Q] and support == ["answer_without_retrieval"]
    assert not any("Answer the question using" in prompt for prompt in asked)
    assert answer.answer == "Four." and answer.citations == () and answer.retrieved
    assert answer.low_confidence and not answer.abstained
    assert answer.reasons[0].startswith(f"flagged: the model judged all 2 retrieved passages {rf.IRRELEVANT}")


def test_a_long_form_step_whose_every_branch_is_pruned_is_unsupported(reflection_tokenizer, token_ids) -> None:  # type: ignore[no-untyped-def]
    """Pruning stops a branch below relevance_bound; when it stops them all, the step re-retrieves and then gives up
    (the short form's rule), where it used to fail on an empty list of branches."""
    segments = Segments(reflection_tokenizer, token_ids)
    weak = {rf.RELEVANT: 0.05, rf.IRRELEVANT: 0.95}
    off_topic = segments.script((rf.IRRELEVANT, weak), "Off.", (rf.NO_SUPPORT, NONE), U5)
    engine = KeyedEngine(reflection_tokenizer, token_ids, {
        passage_key(reflection_tokenizer, token_ids, PARIS): off_topic,
        passage_key(reflection_tokenizer, token_ids, LYON): off_topic,
    })
    retriever = FixedRetriever([PARIS, LYON])
    config = InferenceConfig(form="long", mode="always", top_k=1, max_rounds=1, long_form=LongFormConfig(width=1))
    answer = SelfRAG(engine, retriever, config).answer(Q)
    assert len(retriever.queries) == 2 and answer.abstained and answer.answer == config.abstain_text
    support = [entry for entry in answer.to_json()["trace"] if entry["step"] == "support"]
    assert [entry["chosen"] for entry in support] == ["re-retrieve", "abstain"]
    assert all("pruning stopped every branch" in entry["reason"] for entry in support)


def _imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            found.add("." * node.level + (node.module or ""))
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found


def test_long_form_does_not_import_the_runtime_that_calls_it() -> None:
    """runtime -> longform only: the long form gets its engine, retriever and settings, not the SelfRAG object."""
    inference = Path(__file__).resolve().parents[2] / "inference"
    assert not {".runtime", "selfrag.inference.runtime"} & _imports(inference / "longform.py")
    assert not {".runtime", "selfrag.inference.runtime"} & _imports(inference / "prompted.py")


def test_every_module_of_the_runtime_stays_small() -> None:
    inference = Path(__file__).resolve().parents[2] / "inference"
    sizes: dict[str, int] = {path.name: len(path.read_text(encoding="utf-8").splitlines())
                             for path in inference.glob("*.py")}
    assert {name: size for name, size in sizes.items() if size > 420} == {}



def test_the_prompted_critic_streams_several_questions_as_the_runtime_does(reflection_tokenizer) -> None:  # type: ignore[no-untyped-def]
    """stream_many: one critic call per phase for all questions, each question's events ending with its answer."""
    from selfrag.inference.events import FinalEvent, TraceEvent

    verdicts = {PARIS.id: (True, True), LYON.id: (True, True)}
    config = InferenceConfig(mode="always", top_k=1)
    engine = critic(reflection_tokenizer, verdicts, "Four.")
    rag = PromptedSelfRAG(engine, FixedRetriever([PARIS, LYON]), config)
    events = list(rag.stream_many([Q, Q]))
    streamed_calls = len(engine.calls)
    answers = rag.answer_many([Q, Q])
    assert len(engine.calls) == 2 * streamed_calls  # the same batched calls as answer_many
    for index, answer in enumerate(answers):
        mine = [event for i, event in events if i == index]
        assert isinstance(mine[-1], FinalEvent) and mine[-1].answer == answer
        assert [e.entry for e in mine if isinstance(e, TraceEvent)] == list(answer.trace)
