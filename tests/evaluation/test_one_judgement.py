"""One judgement for every mode (issue #55): a baseline abstains only with the abstain sentence its prompt asks for;
an answer that hedges is an answer, judged by its text and reported as hedged; the fine-tuned RAG baseline (mode
ft_rag) answers the plain-RAG prompt with its own model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from selfrag.config import ConfigError, from_dict, load_config
from selfrag.evaluation import metrics
from selfrag.evaluation import run as run_module
from selfrag.evaluation.config import EvalConfig
from selfrag.evaluation.modes import is_abstention, is_hedged
from selfrag.inference.engines import GenerationRequest, Script, ScriptedEngine
from selfrag.prompting import encode_text

ABSTAIN = "The sources do not say."


@pytest.mark.parametrize(("text", "abstained", "hedged"), [
    ("The sources do not say.", True, False),
    ("the sources do not say", True, False),
    ("", True, False),
    ("I don't know.", False, True),
    ("It is not mentioned, but probably Paris.", False, True),
    ("Paris is the capital.", False, False),
])
def test_only_the_abstain_sentence_abstains(text: str, abstained: bool, hedged: bool) -> None:
    assert is_abstention(text, ABSTAIN) is abstained
    assert is_hedged(text, ABSTAIN) is hedged


def test_a_hedged_answer_holding_the_gold_counts_and_is_reported() -> None:
    def row(answer: str, abstained: bool, hedged: bool) -> dict[str, object]:
        return {"answerable": True, "gold_answers": ["Paris"], "kind": "qa", "answer": answer, "abstained": abstained,
                "hedged": hedged, "retrieved": True, "engine_calls": 1, "prompt_tokens": 1, "generated_tokens": 1,
                "seconds": 1.0, "claims": []}

    summary = metrics.summarize([row("Not mentioned; maybe Paris.", False, True), row(ABSTAIN, True, False)])
    assert summary["match"] == 0.5  # the hedge holds the gold: not zeroed
    assert summary["hedged_rate"] == 0.5 and summary["false_abstain_rate"] == 0.5


def plain_engine(reflection_tokenizer, token_ids, reply: str) -> ScriptedEngine:  # type: ignore[no-untyped-def]
    def script(request: GenerationRequest) -> Script:
        return Script((*encode_text(reflection_tokenizer, reply), reflection_tokenizer.eos_token_id))

    return ScriptedEngine(reflection_tokenizer, token_ids, script)


def test_ft_rag_answers_with_its_own_model_and_both_baselines_are_judged_alike(
        world_engine, reflection_tokenizer, token_ids, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    data = tmp_path / "data.jsonl"
    paris = {"id": "paris", "title": "Paris", "text": "Paris is the capital of France."}
    data.write_text(json.dumps({"id": "fr", "question": "What is the capital of France?", "answers": ["Paris"],
                                "ctxs": [paris]}) + "\n")
    engines = {"b": plain_engine(reflection_tokenizer, token_ids, "I don't know, maybe Paris."),
               "ft": plain_engine(reflection_tokenizer, token_ids, ABSTAIN)}
    asked: list[str] = []

    def build_plain(config, model):  # type: ignore[no-untyped-def]
        asked.append(str(model))
        return engines[str(model)]

    monkeypatch.setattr(run_module, "build_engine", lambda config, model: world_engine)
    monkeypatch.setattr(run_module, "build_plain_engine", build_plain)
    config = from_dict(EvalConfig, {"data": data, "model": "m", "base_model": "b", "ft_rag_model": "ft",
                                    "output_dir": tmp_path / "out", "judge": {"kind": "overlap"},
                                    "modes": ["plain_rag", "ft_rag", "single_pass"]})
    run_module.run(config)
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    assert sorted(asked) == ["b", "ft"] and results["ft_rag_model"] == "ft"
    plain, tuned = results["modes"]["plain_rag"], results["modes"]["ft_rag"]
    assert plain["match"] == 1.0 and plain["hedged_rate"] == 1.0 and plain["false_abstain_rate"] == 0.0
    assert tuned["match"] == 0.0 and tuned["false_abstain_rate"] == 1.0 and tuned["hedged_rate"] == 0.0
    assert "| fine-tuned RAG |" in (tmp_path / "out" / "table.md").read_text().splitlines()[0]


def test_ft_rag_without_its_model_is_refused_with_the_fix(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="ft_rag_model"):
        load_config(EvalConfig, data=str(tmp_path / "d.jsonl"), model="m", output_dir=str(tmp_path / "o"),
                    modes=["plain_rag", "ft_rag"])
    with pytest.raises(ConfigError, match="lack ft_rag"):
        load_config(EvalConfig, data=str(tmp_path / "d.jsonl"), model="m", output_dir=str(tmp_path / "o"),
                    ft_rag_model="ft")
