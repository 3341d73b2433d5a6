"""The Self-RAG paper's evaluation files (its ``eval_data/``), read with the paper's prompt and metric.

    examples = load_examples("eval_data/popqa_longtail_w_gs.jsonl", "popqa")

Each line of the released files carries its top retrieved passages as ``ctxs`` ({"id", "title", "text", ...}).
The instruction is built as the paper's ``run_short_form.py`` builds it (``TASK_INST`` + the question), and the
score is the paper's ``match`` (a gold string occurs in the answer, normalised) for the open QA sets:

* ``popqa``  (``popqa_longtail_w_gs.jsonl``): ``{"question", "answers": [...], "ctxs"}``; the question alone.
* ``triviaqa`` (``triviaqa_test_w_gs.jsonl``): the same layout.
* ``pubhealth`` (``health_claims_processed.jsonl``): ``{"question": claim, "answers": ["true"|"false"], "ctxs"}``
  (``output`` or ``label`` may stand for ``answers``; SUPPORTS/REFUTES read as true/false); the instruction is the
  paper's fever one: ``Is the following statement correct or not? ...\\n\\n## Input:\\n\\n{claim}``.
* ``arc_challenge`` (``arc_challenge_processed.jsonl``): ARC's ``{"question", "choices": {"text", "label"},
  "answerKey", "ctxs"}``; labels 1-4 read as A-D, as the paper does; the instruction lists ``A: ...`` lines.

The paper's settings per set (``--ndocs``, ``--max_new_tokens``) are in :data:`PAPER_TASKS`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from selfrag.errors import InputError

#: The paper's ``TASK_INST`` for the two sets that have one (retrieval_lm/utils.py).
FEVER_INSTRUCTION = "Is the following statement correct or not? Say true if it's correct; otherwise say false."
ARC_INSTRUCTION = "Given four answer candidates, A, B, C and D, choose the best answer choice."
NUMERIC_LABELS = {"1": "A", "2": "B", "3": "C", "4": "D", "5": "E"}
VERDICTS = {"true": "true", "false": "false", "supports": "true", "refutes": "false"}


@dataclass(frozen=True)
class PaperTask:
    """One of the paper's short-form sets: its file, the passages and tokens its README ran with, its table."""

    file: str
    top_k: int
    max_tokens: int
    paper_7b: float
    paper_13b: float


#: The paper's Table 2 (Self-RAG 7B / 13B) and its README's run settings.
PAPER_TASKS: dict[str, PaperTask] = {
    "popqa": PaperTask("popqa_longtail_w_gs.jsonl", 10, 100, 54.9, 55.8),
    "triviaqa": PaperTask("triviaqa_test_w_gs.jsonl", 10, 100, 66.4, 69.3),
    "pubhealth": PaperTask("health_claims_processed.jsonl", 5, 50, 72.4, 74.5),
    "arc_challenge": PaperTask("arc_challenge_processed.jsonl", 5, 50, 67.3, 73.1),
}


def paper_reader(name: str, parsers: Mapping[str, Callable[..., Any]]) -> Callable[..., Any]:
    """The row reader of format ``name``, built on data.py's readers (``parsers``: kind -> reader)."""

    def qa(row: Mapping[str, Any], where: str, default_id: str) -> Any:
        example = parsers["qa"](row, where, default_id)
        return replace(example, instruction=example.question, metric="match")

    def pubhealth(row: Mapping[str, Any], where: str, default_id: str) -> Any:
        example = parsers["qa"]({**row, "answers": [_verdict(row, where)]}, where, default_id)
        return replace(example, kind="claim", instruction=f"{FEVER_INSTRUCTION}\n\n## Input:\n\n{example.question}")

    def arc(row: Mapping[str, Any], where: str, default_id: str) -> Any:
        choices = row.get("choices")
        if isinstance(choices, Mapping) and isinstance(choices.get("label"), list):
            labels = [NUMERIC_LABELS.get(str(label), str(label)) for label in choices["label"]]
            key = NUMERIC_LABELS.get(str(row.get("answerKey")), row.get("answerKey"))
            row = {**row, "choices": {**choices, "label": labels}, "answerKey": key}
        example = parsers["choice"](row, where, default_id)
        options = dict(example.choices)
        listed = "".join(f"\n{label}: {options.get(label, '')}" for label in "ABCD")  # the paper pads a missing D
        listed += f"\nE: {options['E']}" if "E" in options else ""
        return replace(example, instruction=f"{ARC_INSTRUCTION}\n\n### Input:\n{example.question}{listed}")

    return {"popqa": qa, "triviaqa": qa, "pubhealth": pubhealth, "arc_challenge": arc}[name]


def _verdict(row: Mapping[str, Any], where: str) -> str:
    for key in ("answers", "output", "label", "answer"):
        value = row.get(key)
        value = value[0] if isinstance(value, list) and value else value
        if isinstance(value, bool):
            return "true" if value else "false"
        if isinstance(value, str) and value.strip().lower() in VERDICTS:
            return VERDICTS[value.strip().lower()]
    raise InputError(
        f'{where}: no verdict; PubHealth lines need "answers": ["true"] or ["false"] (or SUPPORTS / REFUTES), '
        f"got {({k: row.get(k) for k in ('answers', 'output', 'label')})!r}"
    )
