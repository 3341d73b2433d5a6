"""The answer form the gold labeler trains (``answer_form``): a query's own answer, or a template reply.

    selfrag generate --config configs/data_gen/mixed-sources.yaml answer_form=template output=runs/template-data

``output`` (the default): a query answers with its ``output`` (an answers file: the base model's answer, its
one-sentence reply, or the gold passage's sentence, written by ``python -m selfrag.app.distill --form ...``), else
with its first gold answer. ``template``: every answerable query without an ``output`` answers with one sentence built
from its question and first gold answer ("What is the capital of France?" -> "The capital of France is Paris."),
holding the answer by construction and costing no model call.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import replace

from selfrag.corpus import Query

ANSWER_FORMS = ("output", "template")
#: "Who/What/Which is|was|are|were X?" -> "X is|was|are|were ANSWER." (else "The answer is ANSWER.")
_COPULA = re.compile(r"^(?:who|what|which)\s+(is|was|are|were)\s+(.+?)\s*\??$", re.IGNORECASE)


def template_reply(question: str, answer: str) -> str:
    """A one-sentence reply from the question and the gold span alone: "Who was X?" -> "X was ANSWER."; other
    questions -> "The answer is ANSWER." (holds the answer by construction; no model)."""
    answer = answer.strip().rstrip(".")
    found = _COPULA.match(question.strip())
    if found is None:
        return f"The answer is {answer}."
    verb, subject = found.group(1).lower(), found.group(2).strip()
    return f"{subject[:1].upper()}{subject[1:]} {verb} {answer}."


def with_answer_form(queries: Sequence[Query], form: str) -> list[Query]:
    """``queries`` answering in ``form`` (see the module docstring); a query with an ``output`` keeps it."""
    if form == "output":
        return list(queries)
    return [replace(query, output=template_reply(query.question, query.answers[0]))
            if query.output is None and query.answerable and query.answers else query for query in queries]
