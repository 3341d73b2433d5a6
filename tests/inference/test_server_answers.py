"""What a served answer says about itself (issue 56): the trace agrees with the answer, every reason is listed, and
a flagged answer cites the passage its text came from.

Scripted engine over the real loopback socket with the ``openai`` client (see server_harness.py); each test failed
on the server before: a cut answer's trace said ``support … chosen: abstain`` while the answer shipped flagged;
``low_confidence_reason`` held one reason of two; a flagged answer copied from a passage judged ``[Irrelevant]``
came with ``citations: []``.
"""

from __future__ import annotations

from typing import Any

import openai
from server_harness import (
    CAPITAL,
    CAPITAL_ANSWER,
    MODEL,
    PARIS,
    LiveServer,
    ScriptedBackendEngine,
    _continuation,
    serving,
)

from selfrag import reflection as rf
from selfrag.inference.engines import GenerationRequest, Script


class IrrelevantParis(ScriptedBackendEngine):
    """The model judges the Paris passage [Irrelevant] (0.3) yet copies its sentence, fully supported."""

    def _pick(self, request: GenerationRequest) -> Script:
        prompt = self.tokenizer.decode(list(request.prompt_ids), skip_special_tokens=False)
        if f"{rf.PARAGRAPH_OPEN}{PARIS.title}" in prompt:
            return _continuation(self.tokenizer, self.token_ids, CAPITAL_ANSWER, 0.3, (0.8, 0.15, 0.05))
        return super()._pick(request)


def _client(live: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{live.url}/v1", api_key="unused", max_retries=0)


def _ask(live: LiveServer, **extra: Any) -> Any:
    return _client(live).chat.completions.create(model=MODEL, messages=[{"role": "user", "content": CAPITAL}],
                                                 extra_body=extra)


def _stream(live: LiveServer, **extra: Any) -> list[dict[str, Any]]:
    chunks = _client(live).chat.completions.create(model=MODEL, messages=[{"role": "user", "content": CAPITAL}],
                                                   stream=True, extra_body=extra)
    return [chunk.model_extra["selfrag"] for chunk in chunks if chunk.model_extra.get("selfrag")]


def test_a_cut_answer_is_flagged_by_its_support_step_not_abstained_there(live: LiveServer) -> None:
    # max_tokens ends every branch before its support verdict; on_unsupported is the default, abstain
    response = _ask(live, mode="always", max_tokens=3)
    extension = response.model_extra["selfrag"]
    assert response.choices[0].finish_reason == "length"
    assert not extension["abstained"] and extension["low_confidence"]
    assert CAPITAL_ANSWER.startswith(response.choices[0].message.content)
    support = [step for step in extension["trace"] if step["step"] == "support"][-1]
    assert support["chosen"] == "flag" and "cut at max_tokens=3 before its support verdict" in support["why"]
    # the contract: no step of the trace abstains while the answer ships text
    assert not [step for step in extension["trace"] if step["chosen"] == "abstain"]
    assert any("cut at max_tokens=3" in reason for reason in extension["reasons"])
    streamed = [event for event in _stream(live, mode="always", max_tokens=3) if event["type"] == "trace"]
    assert [event["step"]["chosen"] for event in streamed if event["step"]["step"] == "support"][-1] == "flag"


def test_every_reason_is_listed(live: LiveServer) -> None:
    # every passage judged irrelevant -> answered without sources (flagged), and that answer cut by max_tokens
    extension = _ask(live, mode="always", relevance_threshold=1.0, on_all_irrelevant="no_retrieval",
                     max_tokens=1).model_extra["selfrag"]
    assert extension["low_confidence"] and not extension["abstained"]
    reasons = extension["reasons"]
    assert len(reasons) == 2, reasons
    assert reasons[0].startswith("flagged: ") and "answered without sources" in reasons[0]
    assert "cut at max_tokens=1" in reasons[1]
    assert "low_confidence_reason" not in extension and "abstain_reason" not in extension
    final = _stream(live, mode="always", relevance_threshold=1.0, on_all_irrelevant="no_retrieval",
                    max_tokens=1)[-1]
    assert final["type"] == "final" and final["reasons"] == reasons
    # an accepted answer has none
    assert _ask(live, mode="always").model_extra["selfrag"]["reasons"] == []


def test_a_flagged_answer_from_an_irrelevant_passage_cites_it_and_says_so(reflection_tokenizer: Any,
                                                                            token_ids: Any) -> None:
    with serving(IrrelevantParis(reflection_tokenizer, token_ids)) as live:
        _check_irrelevant_citation(live)


def _check_irrelevant_citation(live: LiveServer) -> None:
    # the model judged Paris [Irrelevant]; on_unsupported=flag ships the sentence it copied from it, flagged
    response = _ask(live, mode="always", top_k=1, on_unsupported="flag")
    extension = response.model_extra["selfrag"]
    assert response.choices[0].message.content == CAPITAL_ANSWER and extension["low_confidence"]
    [citation] = extension["citations"]
    assert citation["passage_id"] == PARIS.id and citation["relevance"] == rf.IRRELEVANT
    assert citation["sentences"] == [CAPITAL_ANSWER]
    assert rf.IRRELEVANT in extension["reasons"][0]
    events = _stream(live, mode="always", top_k=1, on_unsupported="flag")
    [cited] = [event["citation"] for event in events if event["type"] == "citation"]
    assert cited["passage_id"] == PARIS.id and cited["relevance"] == rf.IRRELEVANT
    assert [event["passage_id"] for event in events if event["type"] == "segment"] == [PARIS.id]
    # with on_unsupported=abstain nothing of it ships
    abstained = _ask(live, mode="always", top_k=1).model_extra["selfrag"]
    assert abstained["abstained"] and abstained["citations"] == []


def test_a_relevant_passages_citation_says_so(live: LiveServer) -> None:
    accepted = _ask(live, mode="always", top_k=1).model_extra["selfrag"]["citations"]
    assert [(c["passage_id"], c["relevance"]) for c in accepted] == [(PARIS.id, rf.RELEVANT)]
