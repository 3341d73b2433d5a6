"""Reflection-token accuracy per type on held-out examples, teacher-forced, in fp32.

    scores = reflection_accuracy(model, examples, token_ids)
    # {"retrieve": 0.9, "relevance": 0.5, "support": None, "utility": 0.7, "counts": {"retrieve": 10, ...}}

At each position whose label is a Retrieve/IsREL/IsSUP/IsUSE token, the prediction is the argmax of the
logits restricted to that token group's ids; it is compared with the label. ``None`` where a type has no
labels. Scoring in bf16 ties a third of the IsREL pairs, hence fp32.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from selfrag.reflection import ReflectionIds
from selfrag.training.dataset import SCORED_GROUPS, reflection_positions
from selfrag.training.judgement import score_examples


@torch.no_grad()
def reflection_accuracy(model: Any, examples: Sequence[dict[str, Any]], token_ids: ReflectionIds) -> dict[str, Any]:
    """Accuracy per reflection type over ``examples`` (each with ``input_ids`` and ``labels``).

    Scored in length-sorted batches with logits only at the reflection positions
    (:func:`selfrag.training.judgement.score_examples`), not one full forward per example.
    """
    correct = {group: 0 for group in SCORED_GROUPS}
    counts = {group: 0 for group in SCORED_GROUPS}
    scored = [example for example in examples if any(reflection_positions(example, token_ids).values())]
    for row in score_examples(model, scored, token_ids):
        for group in SCORED_GROUPS:
            for label, predicted in row["pairs"].get(group.value, []):
                correct[group] += int(predicted == label)
                counts[group] += 1
    result: dict[str, Any] = {
        group.value: (correct[group] / counts[group] if counts[group] else None) for group in SCORED_GROUPS
    }
    result["counts"] = {group.value: counts[group] for group in SCORED_GROUPS}
    return result
