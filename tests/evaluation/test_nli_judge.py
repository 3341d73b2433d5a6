"""The NLI judge: a sequence-classification model's P(entailment) of a sentence given its passages.

A tiny BERT classifier built here (its classifier bias sets the class, whatever the text) checks loading and the
label lookup; a scripted classifier, keyed on the words it reads, checks the premise/hypothesis order, truncation
and the per-claim rule (some cited passage entails the sentence).
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from selfrag.config import from_dict
from selfrag.errors import ConfigError, InputError
from selfrag.evaluation import run as run_module
from selfrag.evaluation.claims import Claim, NLIJudge
from selfrag.evaluation.config import EvalConfig
from selfrag.trajectory import Passage

WORDS = ["paris", "is", "the", "capital", "of", "france", "lyon", "has", "silk", "a", "city", ".", ","]
PARIS = Passage("paris", "Paris", "Paris is the capital of France.")
LYON = Passage("lyon", "Lyon", "Lyon has silk.")


def tiny_tokenizer(path: Path) -> Any:
    from transformers import BertTokenizerFast

    path.mkdir(parents=True, exist_ok=True)
    return BertTokenizerFast(vocab={w: i for i, w in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS])})


def tiny_nli(path: Path, labels: list[str], winner: str) -> Path:
    """A saved 1-layer BERT NLI model that always predicts ``winner`` (P ~0.99): the bias decides."""
    from transformers import BertConfig, BertForSequenceClassification

    tokenizer = tiny_tokenizer(path)
    config = BertConfig(vocab_size=len(tokenizer), hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=16, max_position_embeddings=64, num_labels=len(labels),
                        id2label=dict(enumerate(labels)), label2id={label: i for i, label in enumerate(labels)})
    model = BertForSequenceClassification(config)
    with torch.no_grad():
        model.classifier.weight.zero_()
        model.classifier.bias.copy_(torch.tensor([6.0 if label == winner else 0.0 for label in labels]))
    model.save_pretrained(str(path))
    tokenizer.save_pretrained(str(path))
    return path


@pytest.mark.parametrize(
    "labels", [["CONTRADICTION", "ENTAILMENT", "NEUTRAL"], ["entailment", "neutral", "contradiction"]]
)
def test_the_entailment_class_is_found_by_its_label(tmp_path: Path, labels: list[str]) -> None:
    claims = [Claim("q", "Paris is the capital.", (PARIS,))]
    named = {label.lower(): label for label in labels}
    entailing = NLIJudge.load(str(tiny_nli(tmp_path / "yes", labels, named["entailment"])))
    contradicting = NLIJudge.load(str(tiny_nli(tmp_path / "no", labels, named["contradiction"])))
    _, [p_yes] = entailing.probabilities(claims)
    _, [p_no] = contradicting.probabilities(claims)
    assert p_yes > 0.95 and p_no < 0.05
    assert entailing.judge(claims) == [True] and contradicting.judge(claims) == [False]


class KeyedClassifier(torch.nn.Module):
    """Entailment iff the hypothesis (segment 1) holds "capital" and the premise (segment 0) holds "paris"."""

    def __init__(self, tokenizer: Any) -> None:
        super().__init__()
        self.config = SimpleNamespace(id2label={0: "contradiction", 1: "entailment", 2: "neutral"}, name_or_path="k")
        self.paris, self.capital = tokenizer.convert_tokens_to_ids(["paris", "capital"])
        self.seen: list[list[int]] = []

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor, **_: Any) -> Any:
        assert self.paris != self.capital  # both are real words of the vocabulary, not [UNK]
        logits = []
        for ids, types in zip(input_ids.tolist(), token_type_ids.tolist(), strict=True):
            self.seen.append(ids)
            premise = {i for i, t in zip(ids, types, strict=True) if t == 0}
            hypothesis = {i for i, t in zip(ids, types, strict=True) if t == 1}
            entailed = self.paris in premise and self.capital in hypothesis
            logits.append([0.0, 8.0, 0.0] if entailed else [8.0, 0.0, 0.0])
        return SimpleNamespace(logits=torch.tensor(logits))


def test_a_claim_is_supported_when_some_cited_passage_entails_it(tmp_path: Path) -> None:
    tokenizer = tiny_tokenizer(tmp_path / "tok")
    model = KeyedClassifier(tokenizer)
    judge = NLIJudge(model, tokenizer, threshold=0.5, batch_size=2)
    claims = [
        Claim("q", "Paris is the capital.", (LYON, PARIS)),  # the second passage entails it
        Claim("q", "Paris is the capital.", (LYON,)),
        Claim("q", "Lyon has silk.", (PARIS,)),  # passage right, sentence not "capital": not entailed
        Claim("q", "Paris is the capital.", ()),  # nothing cited: not judged
    ]
    assert judge.judge(claims) == [True, False, False, None]
    assert len(model.seen) == 4  # one pair per (claim, passage), in batches of 2


def test_a_long_passage_is_cut_never_the_sentence(tmp_path: Path) -> None:
    tokenizer = tiny_tokenizer(tmp_path / "tok")
    model = KeyedClassifier(tokenizer)
    long = Passage("long", "Paris", "Paris is a city . " + "Lyon has silk . " * 40)
    judge = NLIJudge(model, tokenizer, max_length=20)  # longest_first would cut "capital" from the sentence
    assert judge.judge([Claim("q", "Lyon is a city of France , the capital of silk .", (long,))]) == [True]
    assert len(model.seen[0]) == 20  # truncated to max_length, and "capital" (late in the sentence) survived


def test_a_model_without_an_entailment_label_is_refused(tmp_path: Path) -> None:
    path = tiny_nli(tmp_path / "sentiment", ["negative", "positive"], "positive")
    with pytest.raises(InputError, match=r"labels \['negative', 'positive'\] name no single entailment class"):
        NLIJudge.load(str(path))


def test_a_missing_model_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(InputError) as error:
        NLIJudge.load(str(tmp_path / "nowhere"))
    assert "no NLI model could be loaded" in str(error.value) and "\n" not in str(error.value)


def test_kind_nli_needs_a_model(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="kind=nli needs judge.model"):
        from_dict(EvalConfig, {"data": tmp_path / "d.jsonl", "model": "m", "output_dir": tmp_path / "o",
                               "judge": {"kind": "nli"}})


def test_eval_judges_claims_with_the_nli_model_and_fails_early_on_a_bad_one(
    world_engine: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = tmp_path / "data.jsonl"
    ctxs = [{"id": p.id, "title": p.title, "text": p.text} for p in (PARIS,)]
    data.write_text(json.dumps({"id": "fr", "question": "What is the capital of France?", "answers": ["Paris"],
                                "ctxs": ctxs}) + "\n")
    loads: list[str] = []
    monkeypatch.setattr(run_module, "build_engine", lambda config, model: loads.append(model) or world_engine)
    monkeypatch.setattr(run_module, "build_plain_engine", lambda config, model: loads.append(model) or world_engine)
    settings = {"data": data, "model": "m", "base_model": "b", "modes": ["plain_rag"]}

    bad = from_dict(EvalConfig, {**settings, "output_dir": tmp_path / "bad",
                                 "judge": {"kind": "nli", "model": str(tmp_path / "nowhere")}})
    with pytest.raises(InputError, match="no NLI model could be loaded"):
        run_module.run(bad)
    assert loads == [] and not (tmp_path / "bad" / "records").exists()  # refused before any model or answer

    nli = tiny_nli(tmp_path / "nli", ["contradiction", "entailment", "neutral"], "entailment")
    good = from_dict(EvalConfig, {**settings, "output_dir": tmp_path / "good",
                                  "judge": {"kind": "nli", "model": str(nli)}})
    run_module.run(good)
    saved = json.loads((tmp_path / "good" / "results.json").read_text())
    assert saved["judge"] == "nli" and saved["modes"]["plain_rag"]["claims_judged"] == 1
    assert saved["modes"]["plain_rag"]["unsupported_claim_rate"] == 0.0  # the tiny model entails everything
    assert "unsupported claims (judge: nli" in (tmp_path / "good" / "table.md").read_text()
