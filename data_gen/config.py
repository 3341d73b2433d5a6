"""Configuration of ``selfrag generate``: which queries, which corpus, which labeler, where to write."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from selfrag.config import help_field
from selfrag.data_gen.gold import ABSTAIN_TEXT


@dataclass
class GenerateConfig:
    """Settings of one data generation run (``selfrag generate --config FILE key=value ...``)."""

    corpus: Path = help_field("Corpus: JSONL lines {id, title, text}, or a folder of .txt/.md files.")
    queries: Path = help_field(
        "Queries JSONL: question, answers, answerable, gold_passage_ids, needs_retrieval, meta.split."
    )
    output: Path = help_field(
        "Output directory: records.jsonl, stats.json and config.yaml go here. A rerun into the same directory "
        "resumes; give each shard its own directory."
    )
    labeler: Literal["gold"] = help_field(
        "Who labels: 'gold' derives every reflection label from the data set's own annotations "
        "(answer spans, unanswerable flags, needs_retrieval).",
        default="gold",
    )
    split: Literal["train", "test", "all"] = help_field(
        "Which queries to use, by their meta.split; 'all' also takes queries without a split.", default="train"
    )
    distractors: int = help_field(
        "BM25 distractor passages per question: top-ranked passages that are not gold, not from the question's "
        "own paragraph and do not contain a gold answer. Each gives one [Irrelevant] record.",
        default=1,
    )
    easy_negatives: int = help_field(
        "Easy negatives per question: a passage of another article (meta.title), seeded by the question id. "
        "Each gives one [Irrelevant] record.",
        default=0,
    )
    hard_negatives: int = help_field(
        "Hard negatives per question: the best BM25 match from the question's own article that is not from its "
        "paragraph and does not contain an answer. Each gives one [Irrelevant] record.",
        default=0,
    )
    support_negatives: int = help_field(
        "Support negatives per answerable question: its gold passage with another question's answer of the same "
        "form (number/name/phrase, similar length) -> [Relevant] ... [No support / Contradictory]. The wrong "
        "answer's text is masked in training, so the model judges it but is never taught to say it.",
        default=0,
    )
    train_abstain_text: bool = help_field(
        "Train the abstain sentence after an [Irrelevant] verdict. false (default): its text is masked (the "
        "runtime drops such a continuation; trained, it taught most records to abstain).",
        default=False,
    )
    abstain_text: str = help_field(
        "The answer written when the passage does not support one (unanswerable questions, distractors).",
        default=ABSTAIN_TEXT,
    )
    shard: str = help_field(
        "'i/N': keep only queries whose stable id hash is i modulo N, so N machines split the work.", default="0/1"
    )
    seed: int = help_field(
        "Seeds Python's random module; the gold labeler is deterministic, later labelers sample with it.", default=0
    )
    limit: int | None = help_field(
        "Use only the first N selected queries (after split and shard); null: all.", default=None
    )

    def validate(self) -> list[str]:
        problems = []
        for name in ("distractors", "easy_negatives", "hard_negatives", "support_negatives"):
            if getattr(self, name) < 0:
                problems.append(f"{name} must be >= 0, got {getattr(self, name)}; use 0 for none")
        if not self.abstain_text.strip():
            problems.append(f"abstain_text must not be empty, got {self.abstain_text!r}; e.g. {ABSTAIN_TEXT!r}")
        try:
            parse_shard(self.shard)
        except ValueError as error:
            problems.append(str(error))
        if self.limit is not None and self.limit < 1:
            problems.append(f"limit must be >= 1 or null, got {self.limit}; use limit=null for every query")
        return problems


def parse_shard(shard: str) -> tuple[int, int]:
    """``"2/8"`` -> ``(2, 8)``; ``ValueError`` naming the field and the fix otherwise."""
    index, sep, count = shard.partition("/")
    if sep and index.strip().isdigit() and count.strip().isdigit():
        i, n = int(index), int(count)
        if n >= 1 and 0 <= i < n:
            return i, n
    raise ValueError(f"shard must be 'i/N' with 0 <= i < N, got {shard!r}; e.g. shard=0/4 for the first of 4 shards")
