"""Evaluation data: QA, closed-set (ARC style), true/false claims, and reflection labels, with file:line errors.

    examples = load_examples("data/nq-dev.jsonl")            # format detected from the first line
    labels = load_reflection_labels("data/labels.jsonl")

Formats, one JSON object a line:

* QA: ``{"question", "answers": [...], "ctxs": [{"title", "text"}]}`` — the paper's and FlashRAG's files.
  ``ctxs`` is optional (without it passages come from the configured corpus); ``answer`` (one string) may
  stand for ``answers``. Optional: ``id``, ``answerable`` (false: the corpus has no answer, ``answers`` may be
  empty or left out), ``needs_retrieval``, ``gold_passage_ids``.
* Closed set: ``{"question", "choices": {"text": [...], "label": [...]}, "answerKey"}`` (ARC).
* Claims: ``{"claim", "label": true|false}``; the model is asked whether the claim is true.
* Reflection labels: ``{"question", "passage": {"title", "text"}, "answer", "labels": {TYPE: TOKEN}}`` with
  TYPE any of ``retrieve``, ``relevance``, ``support``, ``utility`` and TOKEN its reflection token
  (``[Relevant]``; the brackets may be left out).
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from selfrag import reflection as rf
from selfrag.artifacts import TRAINED_FILE, load_trained_questions, question_key
from selfrag.corpus import Query, parse_ctxs
from selfrag.errors import ConfigError, InputError
from selfrag.jsonl import read_jsonl
from selfrag.reflection import Group
from selfrag.splits import EVERY_SPLIT, in_split
from selfrag.trajectory import Passage, Record

Kind = Literal["qa", "choice", "claim"]
#: The paper's own files (evaluation/paper_data.py): its prompt and metric.
PAPER_FORMATS = ("popqa", "triviaqa", "pubhealth", "arc_challenge")
FORMATS = ("auto", "qa", "choice", "claim", *PAPER_FORMATS)
LABEL_GROUPS: dict[str, Group] = {
    "retrieve": Group.RETRIEVE,
    "relevance": Group.RELEVANCE,
    "support": Group.SUPPORT,
    "utility": Group.UTILITY,
}
logger = logging.getLogger(__name__)
CLAIM_PROMPT = "Is the following claim true or false? Answer true or false.\nClaim: {claim}"


@dataclass(frozen=True)
class Example:
    """One evaluation question. ``answers`` are the gold strings (for a closed set: the right choice's text and
    label; for a claim: ``true`` or ``false``); ``ctxs`` the passages shipped with it (empty: use the corpus)."""

    id: str
    question: str
    answers: tuple[str, ...]
    kind: Kind = "qa"
    choices: tuple[tuple[str, str], ...] = ()  # (label, text)
    answer_key: str | None = None
    ctxs: tuple[Passage, ...] = ()
    answerable: bool = True
    needs_retrieval: bool | None = None
    gold_passage_ids: tuple[str, ...] = ()
    instruction: str | None = None  # the whole prompt as given (the paper's formats); None: built from the question
    metric: Literal["exact", "match"] = "exact"  # qa: exact match, or the paper's match (a gold string occurs)

    @property
    def prompt(self) -> str:
        """The instruction given to every mode: the question, with its choices for a closed set."""
        if self.instruction is not None:
            return self.instruction
        if self.kind == "choice":
            options = "\n".join(f"{label}. {text}" for label, text in self.choices)
            return f"{self.question}\n{options}\nAnswer with the letter of the right choice."
        return self.question


@dataclass(frozen=True)
class LabelExample:
    """One reflection-label item: gold tokens for any subset of the four types."""

    id: str
    question: str
    passage: Passage | None
    answer: str
    labels: Mapping[str, str] = field(default_factory=dict)


def detect_format(row: Mapping[str, Any]) -> Kind:
    if "choices" in row:
        return "choice"
    if "claim" in row:
        return "claim"
    return "qa"


def load_examples(
    path: str | Path, data_format: str = "auto", limit: int | None = None, split: str | None = None
) -> list[Example]:
    """Read an evaluation file; ``data_format`` ``auto`` detects it from the first line's keys; ``split`` keeps
    only lines whose ``meta.split`` equals it (the demo's ``queries.jsonl`` holds train and test); ``all`` or None
    keeps every line (:func:`selfrag.splits.in_split`, as in every command)."""
    if data_format not in FORMATS:
        raise InputError(f"format must be one of {list(FORMATS)}, got {data_format!r}")
    path = Path(path)
    examples: list[Example] = []
    seen: dict[str, int] = {}
    kind: str | None = None if data_format == "auto" else data_format
    for number, row in read_jsonl(path, "evaluation data"):
        where = f"{path}:{number}"
        if not in_split((row.get("meta") or {}).get("split"), split):
            continue
        kind = kind or detect_format(row)
        example = _reader(kind)(row, where, f"{path.stem}-{number}")
        if example.id in seen:
            raise InputError(
                f"{where}: duplicate id {example.id!r} (first on line {seen[example.id]}); ids must be unique"
            )
        seen[example.id] = number
        examples.append(example)
        if limit is not None and len(examples) >= limit:
            break
    if not examples:
        where = f" with meta.split={split!r}" if split not in (None, EVERY_SPLIT) else ""
        raise InputError(f"evaluation file {str(path)!r} holds no examples{where}; add JSONL lines (see the README)")
    return examples


def _string(row: Mapping[str, Any], name: str, where: str, fix: str) -> str:
    value = row.get(name)
    if not isinstance(value, str) or not value.strip():
        raise InputError(f"{where}: field {name!r} must be a non-empty string, got {value!r}; {fix}")
    return value


def _common(row: Mapping[str, Any], where: str, default_id: str) -> dict[str, Any]:
    passages = parse_ctxs(row, where, str(row.get("id", default_id)))
    needs_retrieval = row.get("needs_retrieval")
    if needs_retrieval is not None and not isinstance(needs_retrieval, bool):
        raise InputError(f"{where}: field 'needs_retrieval' must be true, false or null, got {needs_retrieval!r}")
    gold = row.get("gold_passage_ids", [])
    if not isinstance(gold, list):
        raise InputError(f"{where}: field 'gold_passage_ids' must be a list of ids, got {gold!r}")
    return {
        "id": str(row.get("id", default_id)),
        "ctxs": passages,
        "needs_retrieval": needs_retrieval,
        "gold_passage_ids": tuple(str(g) for g in gold),
    }


def _qa(row: Mapping[str, Any], where: str, default_id: str) -> Example:
    question = _string(row, "question", where, 'add "question" to that line')
    answerable = row.get("answerable", True)
    if not isinstance(answerable, bool):
        raise InputError(f"{where}: field 'answerable' must be true or false, got {answerable!r}")
    if "answers" not in row and "answer" not in row and answerable:
        raise InputError(f'{where}: no "answers"; give "answers": ["..."] (or "answerable": false where none exists)')
    # an unanswerable question needs no answers (generate reads it so too): asked, it should abstain
    answers = row["answers"] if "answers" in row else [row["answer"]] if "answer" in row else []
    if not isinstance(answers, list) or not all(isinstance(a, str) for a in answers):
        raise InputError(f"{where}: field 'answers' must be a list of strings, got {answers!r}")
    if answerable and not any(a.strip() for a in answers):
        raise InputError(f'{where}: "answers" is empty; give the gold answers, or mark it "answerable": false')
    return Example(question=question, answers=tuple(answers), answerable=answerable, **_common(row, where, default_id))


def _choice(row: Mapping[str, Any], where: str, default_id: str) -> Example:
    question = _string(row, "question", where, 'add "question" to that line')
    choices = row.get("choices")
    if not isinstance(choices, Mapping) or not isinstance(choices.get("text"), list) or not isinstance(
        choices.get("label"), list
    ):
        raise InputError(f'{where}: field "choices" must be {{"text": [...], "label": [...]}} (ARC), got {choices!r}')
    texts, labels = choices["text"], [str(label) for label in choices["label"]]
    if len(texts) != len(labels) or len(texts) < 2:
        raise InputError(
            f"{where}: choices has {len(texts)} texts and {len(labels)} labels; give the same number, at least 2"
        )
    key = row.get("answerKey")
    if str(key) not in labels:
        raise InputError(f"{where}: answerKey {key!r} is not one of the choice labels {labels}")
    text = texts[labels.index(str(key))]
    return Example(
        question=question,
        answers=(str(text), str(key)),
        kind="choice",
        choices=tuple(zip(labels, (str(t) for t in texts), strict=True)),
        answer_key=str(key),
        **_common(row, where, default_id),
    )


def _claim(row: Mapping[str, Any], where: str, default_id: str) -> Example:
    claim = _string(row, "claim", where, 'add "claim" to that line')
    label = row.get("label")
    if isinstance(label, str) and label.strip().lower() in ("true", "false"):
        label = label.strip().lower() == "true"
    if not isinstance(label, bool):
        raise InputError(f'{where}: field "label" must be true or false, got {label!r}')
    return Example(
        question=CLAIM_PROMPT.format(claim=claim),
        answers=("true" if label else "false",),
        kind="claim",
        **_common(row, where, default_id),
    )


_PARSERS = {"qa": _qa, "choice": _choice, "claim": _claim}


def _reader(data_format: str) -> Any:
    if data_format in PAPER_FORMATS:
        from selfrag.evaluation.paper_data import paper_reader

        return paper_reader(data_format, _PARSERS)
    return _PARSERS[data_format]


def load_reflection_labels(path: str | Path, limit: int | None = None) -> list[LabelExample]:
    """Read reflection labels ``{question, passage, answer, labels}`` (see the module docstring)."""
    path = Path(path)
    items: list[LabelExample] = []
    for number, row in read_jsonl(path, "reflection labels"):
        items.append(_label_example(row, f"{path}:{number}", f"{path.stem}-{number}"))
        if limit is not None and len(items) >= limit:
            break
    if not items:
        raise InputError(f"reflection label file {str(path)!r} holds no items")
    return items


def _label_example(row: Mapping[str, Any], where: str, default_id: str) -> LabelExample:
    question = _string(row, "question", where, 'add "question" to that line')
    labels = row.get("labels")
    if not isinstance(labels, Mapping) or not labels:
        raise InputError(f'{where}: field "labels" must map some of {list(LABEL_GROUPS)} to tokens, got {labels!r}')
    tokens: dict[str, str] = {}
    for name, value in labels.items():
        if name not in LABEL_GROUPS:
            raise InputError(f"{where}: unknown label type {name!r}; use {list(LABEL_GROUPS)}")
        tokens[name] = _token(value, LABEL_GROUPS[name], f"{where}: labels.{name}")
    passage = None
    if row.get("passage") is not None:
        raw = row["passage"]
        if not isinstance(raw, Mapping) or not isinstance(raw.get("text"), str):
            raise InputError(f'{where}: field "passage" must be {{"title", "text"}}, got {raw!r}')
        passage = Passage(str(raw.get("id", f"{default_id}-passage")), str(raw.get("title", "")), raw["text"])
    answer = row.get("answer", "")
    if not isinstance(answer, str):
        raise InputError(f'{where}: field "answer" must be a string, got {answer!r}')
    needs_passage = [name for name in ("relevance", "support") if name in tokens]
    if needs_passage and passage is None:
        raise InputError(f'{where}: labels {needs_passage} judge a passage; add "passage": {{"title", "text"}}')
    needs_answer = [name for name in ("support", "utility") if name in tokens]
    if needs_answer and not answer.strip():
        raise InputError(f'{where}: labels {needs_answer} judge an answer; add "answer": "..."')
    return LabelExample(str(row.get("id", default_id)), question, passage, answer, tokens)


def _token(value: Any, group: Group, where: str) -> str:
    allowed = rf.tokens_of(group)
    if isinstance(value, str):
        text = value.strip()
        candidate = text if text.startswith("[") else f"[{text}]"
        if candidate in allowed:
            return candidate
    raise InputError(f"{where} must be one of {list(allowed)}, got {value!r}")


# -- converters used by the quickstart: the demo's queries and gold records in these formats ------------------


def query_to_row(query: Query) -> dict[str, Any]:
    """A demo :class:`~selfrag.corpus.Query` as a QA line (no ctxs: passages come from the corpus)."""
    return {
        "id": query.id,
        "question": query.question,
        "answers": list(query.answers),
        "answerable": query.answerable,
        "needs_retrieval": query.needs_retrieval,
        "gold_passage_ids": list(query.gold_passage_ids),
    }


def records_to_label_rows(records: Iterable[Record]) -> list[dict[str, Any]]:
    """Gold trajectory records as reflection-label lines: the first segment's passage, the whole answer."""
    rows = []
    for record in records:
        if not record.segments:
            continue
        first = record.segments[0]
        slots = {"retrieve": first.retrieve, "relevance": first.relevance, "support": first.support}
        labels = {name: label.value for name, label in slots.items() if label is not None}
        if record.utility is not None:
            labels["utility"] = record.utility.value
        if not labels:
            continue
        answer = " ".join(segment.text.strip() for segment in record.segments if segment.text.strip())
        rows.append({
            "id": record.id,
            "question": record.instruction,
            "passage": None if first.passage is None else first.passage.to_json(),
            "answer": answer,
            "labels": labels,
        })
    return rows


#: how to make a dev split of one's own questions (said where calibration finds none)
DEV_SPLIT_HINT = (
    'mark held-out lines of your questions file with "meta": {"split": "dev"} (generate split=train never trains on '
    "them) and pass data=QUESTIONS split=dev; see docs/own-data.md (the quickstart writes its own to "
    "<output_dir>/splits/dev.jsonl)"
)


#: the setting that evaluates on a model's own training questions anyway (eval and calibrate)
ALLOW_TRAINED = "allow_trained_questions"


def check_not_trained_on(examples: Sequence[Example], model: str, data: str | Path, split: str | None, command: str,
                         allow: bool) -> int:
    """Refuse, before any model loads, examples whose question ``model`` was trained on (its ``trained-questions.json``,
    written by ``selfrag train``; a model without one is not checked); with ``allow``, warn instead. Returns how many
    examples are among the training questions."""
    directory = Path(model).expanduser()
    trained = load_trained_questions(directory) if directory.is_dir() else None
    if not trained:
        return 0
    seen = [example for example in examples
            if question_key(example.question) in trained or question_key(example.prompt) in trained]
    if not seen:
        return 0
    which = f"{data}" + (f" split={split}" if split is not None else "")
    what = (f"{len(seen)} of {len(examples)} questions of {which} (first: {seen[0].id!r}) are among the questions "
            f"{model} was trained on ({TRAINED_FILE})")
    if allow:
        logger.warning("%s: %s; measured anyway (%s=true): their figures flatter the model", command, what,
                       ALLOW_TRAINED)
        return len(seen)
    held = "dev" if command == "calibrate" else "test"
    raise InputError(
        f"{what}; {command} needs questions the model never saw: mark them \"{held}\" in meta.split and train on "
        f"records made without them (generate's default split=train, or split=all, keeps dev and test questions out of "
        f"records.jsonl), or set {ALLOW_TRAINED}=true to {command} on them anyway"
    )


def check_passages(examples: Sequence[Example], corpus: object | None, passage_ids: Collection[str] | None,
                   needs_passages: bool) -> None:
    """Refuse, before any model loads, data whose examples have no ``ctxs`` and nothing to search (``corpus``: the
    corpus or prebuilt index named, see :func:`searched`), and a corpus that holds none of the data's gold passage
    ids (a recipe's corpus left in place for other data)."""
    without = [example.id for example in examples if not example.ctxs]
    if without and corpus is None and needs_passages:
        raise ConfigError([
            f"{len(without)} examples (first: {without[0]!r}) have no ctxs and no retriever is set; pass "
            "retriever.corpus=FILE (the corpus these questions were written against), retriever.index=DIR or "
            "retriever.url=postgresql://... (a prebuilt index of it), or add ctxs to the data"
        ])
    gold = {gold_id for example in examples if not example.ctxs for gold_id in example.gold_passage_ids}
    if gold and passage_ids is not None and not gold & set(passage_ids):
        raise ConfigError([
            f"{corpus} holds none of the {len(gold)} gold passage ids of the data (e.g. {sorted(gold)[0]!r}); "
            "it is not this data's corpus: pass retriever.corpus=YOUR_CORPUS (the one the gold_passage_ids name)"
        ])


def searched(retriever: Any) -> object | None:
    """What a stage searches, for messages: the prebuilt index, URL or corpus of its retriever section."""
    return getattr(retriever, "index", None) or getattr(retriever, "url", None) or getattr(retriever, "corpus", None)


def passage_ids(retriever: object | None) -> list[str] | None:
    """The ids of a retriever's passages where it holds them as a list (BM25 built in memory); None for an index
    read from disk or a server (checking would read every passage)."""
    from selfrag.passages import PassageList

    passages = getattr(retriever, "passages", None)
    if isinstance(passages, PassageList):
        passages = passages.passages
    return [passage.id for passage in passages] if isinstance(passages, list) else None
