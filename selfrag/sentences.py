"""Sentences of a text, the one splitter every stage uses: answers labelled sentence by sentence (data_gen's
assembler and gold labeler), passages with their answer sentences erased (data_gen's distractors), answers
judged claim by claim (evaluation).

    from selfrag.sentences import split_sentences
    split_sentences("It opened in 1793. Harold C. Case was 3.5 m tall.")
    # ['It opened in 1793.', 'Harold C. Case was 3.5 m tall.']

Microsoft's Bling Fire (a finite-state sentence breaker, ``blingfire`` on PyPI) splits; chosen by measurement
over the regular expressions it replaced, pysbd, syntok and sentencex on 150 hand-checked passages of the shipped
corpora (boundary F1 0.961 against 0.868-0.920; ``docs/sentences.md``, ``benchmarks/sentence_splitters.py``).
Each sentence is a slice of the input (whitespace around it trimmed), so the sentences of an answer rejoined by
single spaces give the answer back wherever it had single spaces between them.
"""

from __future__ import annotations

import functools
import platform
from types import ModuleType

from selfrag.errors import SelfragError

#: Which splitter made a run's sentences. Part of generate's ``inputs.json`` and of the quickstart's data-stage
#: fingerprint, so labels split one way are never resumed or mixed with labels split another; bump it whenever the
#: boundaries change (another library, version pin or rule). Runs from before it existed used regular expressions.
SPLITTER = "blingfire-0.1.8"


class SentenceSplitterError(SelfragError, ValueError):
    """Bling Fire did not load on this machine, or found no sentence in a text (names the fix)."""


@functools.cache
def _blingfire() -> ModuleType:
    try:
        import blingfire
    except (ImportError, OSError) as error:  # OSError: the wheel's shared library is not built for this machine
        machine = platform.machine()
        raise SentenceSplitterError(
            f"sentence splitting needs Bling Fire, which did not load on this {machine} machine ({error}); "
            "pip install 'selfrag' installs blingfire (x86-64) or blingfire2 (arm64, the same library built for "
            "arm64): reinstall selfrag, or pip install blingfire2 on arm64"
        ) from None
    return blingfire


def split_sentences(text: str) -> list[str]:
    """``text``'s sentences in order, each stripped of surrounding whitespace; never an empty one (``[]`` for a
    blank text)."""
    if not text.strip():
        return []
    try:
        _, spans = _blingfire().text_to_sentences_and_offsets(text)
    except AssertionError:  # its offset mapping checks itself; never seen on 27k shipped and random texts
        spans = []
    sentences = [text[start:end].strip() for start, end in spans]
    sentences = [sentence for sentence in sentences if sentence]
    if not sentences:  # Bling Fire reports its own failures only as an empty result: never guess a split
        raise SentenceSplitterError(
            f"Bling Fire found no sentence in a {len(text)}-character text starting {text[:60]!r}; "
            "please report it with the text"
        )
    return sentences
