"""Unsupported-claim judges: is a sentence of an answer supported by the passages it came from?

* ``critic``: the trained model itself: ``prompt + [Retrieval]<paragraph>passage</paragraph>[Relevant] + sentence``
  and its support score at the next position, ``(p(Full) + 0.5 p(Partial)) / sum`` >= threshold;
* ``llm``: any model through an engine, asked yes/no;
* ``nli``: a natural-language-inference classifier (premise: the passage, hypothesis: the sentence), supported
  when P(entailment) >= threshold — any transformers sequence-classification model whose labels name entailment;
* ``overlap``: no model: the share of the sentence's content words found in the passage >= threshold.

A sentence with no passage gets ``None`` (not judged): an answer given without retrieval cites nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from selfrag import reflection as rf
from selfrag.inference.engines.base import Engine, GenerationRequest
from selfrag.inference.scoring import support_score
from selfrag.prompting import encode_prompt, encode_text, passage_ids
from selfrag.reflection import Group
from selfrag.trajectory import Passage

from .metrics import claim_prediction, normalize

LLM_JUDGE_PROMPT = (
    "Passage:\n{passage}\n\nSentence: {sentence}\n\n"
    "Does the passage fully support the sentence? Answer yes or no."
)
_STOP = set("a an the of in on at to for and or but is are was were be been by with from as that this it its".split())


@dataclass(frozen=True)
class Claim:
    question: str
    sentence: str
    passages: tuple[Passage, ...]


class Judge(Protocol):
    def judge(self, claims: Sequence[Claim]) -> list[bool | None]: ...


def _pairs(claims: Sequence[Claim]) -> list[tuple[int, Passage]]:
    return [(index, passage) for index, claim in enumerate(claims) for passage in claim.passages]


def _any_per_claim(
    claims: Sequence[Claim], pairs: list[tuple[int, Passage]], verdicts: list[bool]
) -> list[bool | None]:
    result: list[bool | None] = [None if not claim.passages else False for claim in claims]
    for (index, _), verdict in zip(pairs, verdicts, strict=True):
        result[index] = bool(result[index]) or verdict
    return result


class CriticJudge:
    """The trained model's own support verdict, read teacher-forced (one decode step per claim and passage)."""

    def __init__(self, engine: Engine, threshold: float = 0.5) -> None:
        self.engine, self.threshold = engine, threshold

    def scores(self, claims: Sequence[Claim]) -> tuple[list[tuple[int, Passage]], list[float]]:
        tokenizer, ids = self.engine.tokenizer, self.engine.token_ids
        pairs = _pairs(claims)
        requests = [
            GenerationRequest(
                prompt_ids=(
                    *encode_prompt(tokenizer, claims[index].question, self.engine.prompt_template),
                    *passage_ids(tokenizer, ids, passage),
                    ids.id(rf.RELEVANT),
                    *encode_text(tokenizer, claims[index].sentence),
                ),
                max_tokens=1,
                score_token_ids=ids.ids(Group.SUPPORT),
            )
            for index, passage in pairs
        ]
        generations = self.engine.generate(requests) if requests else []
        values = [support_score(g.score_logprobs[0] if g.score_logprobs else {}, ids) for g in generations]
        return pairs, [0.0 if value is None else value for value in values]

    def judge(self, claims: Sequence[Claim]) -> list[bool | None]:
        pairs, scores = self.scores(claims)
        return _any_per_claim(claims, pairs, [score >= self.threshold for score in scores])


class LLMJudge:
    """A model asked whether the passage supports the sentence; ``yes``/``true`` counts as supported."""

    def __init__(self, engine: Engine, max_tokens: int = 4) -> None:
        self.engine, self.max_tokens = engine, max_tokens

    def judge(self, claims: Sequence[Claim]) -> list[bool | None]:
        pairs = _pairs(claims)
        requests = [
            GenerationRequest(
                prompt_ids=tuple(
                    encode_prompt(
                        self.engine.tokenizer,
                        LLM_JUDGE_PROMPT.format(passage=passage.render(), sentence=claims[index].sentence),
                        self.engine.prompt_template,
                    )
                ),
                max_tokens=self.max_tokens,
            )
            for index, passage in pairs
        ]
        generations = self.engine.generate(requests) if requests else []
        return _any_per_claim(claims, pairs, [claim_prediction(g.text) == "true" for g in generations])


class NLIJudge:
    """An NLI cross-encoder: a claim is supported when some passage it came from entails it, P(entailment) >=
    ``threshold``. The premise (the passage) is truncated to fit ``max_length``, never the sentence.

    ``NLIJudge.load(name)`` takes a local directory or a hub id (where the machine has hub access), e.g.
    ``cross-encoder/nli-deberta-v3-xsmall`` or ``MoritzLaurer/DeBERTa-v3-base-mnli-fever-anli``.
    """

    def __init__(
        self, model: Any, tokenizer: Any, threshold: float = 0.5, batch_size: int = 16, max_length: int = 512
    ) -> None:
        self.model, self.tokenizer, self.threshold = model, tokenizer, threshold
        self.batch_size, self.max_length = batch_size, max_length
        self.entailment = entailment_label(model.config, getattr(model.config, "name_or_path", "") or "the model")

    @classmethod
    def load(cls, name: str, threshold: float = 0.5) -> NLIJudge:
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        from selfrag.errors import InputError

        try:
            tokenizer = AutoTokenizer.from_pretrained(name)
            model = AutoModelForSequenceClassification.from_pretrained(name)
        except (OSError, ValueError) as error:
            first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            raise InputError(
                f"judge.model {name!r}: no NLI model could be loaded ({first}); pass a local directory of a "
                "transformers sequence-classification model, or a hub id on a machine with hub access"
            ) from None
        model.eval()
        return cls(model, tokenizer, threshold)

    def probabilities(self, claims: Sequence[Claim]) -> tuple[list[tuple[int, Passage]], list[float]]:
        import torch

        pairs = _pairs(claims)
        values: list[float] = []
        for start in range(0, len(pairs), self.batch_size):
            batch = pairs[start : start + self.batch_size]
            inputs = self.tokenizer(
                [passage.render() for _, passage in batch],
                [claims[index].sentence for index, _ in batch],
                truncation="only_first", max_length=self.max_length, padding=True, return_tensors="pt",
            )
            with torch.no_grad():
                logits = self.model(**inputs).logits.float()
            values += torch.softmax(logits, dim=-1)[:, self.entailment].tolist()
        return pairs, values

    def judge(self, claims: Sequence[Claim]) -> list[bool | None]:
        pairs, values = self.probabilities(claims)
        return _any_per_claim(claims, pairs, [value >= self.threshold for value in values])


def entailment_label(config: Any, name: str) -> int:
    """The class index whose label names entailment (``entailment``, ``ENTAILMENT``, ``entail`` ...)."""
    from selfrag.errors import InputError

    labels = {int(index): str(label) for index, label in (getattr(config, "id2label", None) or {}).items()}
    found = [index for index, label in labels.items() if label.lower().startswith("entail")]
    if len(found) != 1:
        raise InputError(
            f"judge.model {name}: its labels {sorted(labels.values())} name no single entailment class; use an NLI "
            "model (labels entailment / neutral / contradiction), e.g. cross-encoder/nli-deberta-v3-xsmall"
        )
    return found[0]


class OverlapJudge:
    """No model: supported when at least ``threshold`` of the sentence's content words occur in the passage."""

    def __init__(self, threshold: float = 0.5) -> None:
        self.threshold = threshold

    @staticmethod
    def overlap(sentence: str, passage: Passage) -> float:
        words = {w for w in normalize(sentence).split() if w not in _STOP}
        if not words:
            return 1.0
        found = set(normalize(passage.render()).split())
        return len(words & found) / len(words)

    def judge(self, claims: Sequence[Claim]) -> list[bool | None]:
        pairs = _pairs(claims)
        return _any_per_claim(
            claims, pairs, [self.overlap(claims[index].sentence, passage) >= self.threshold for index, passage in pairs]
        )
