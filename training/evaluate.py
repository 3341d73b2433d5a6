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


@torch.no_grad()
def reflection_accuracy(model: Any, examples: Sequence[dict[str, Any]], token_ids: ReflectionIds) -> dict[str, Any]:
    """Accuracy per reflection type over ``examples`` (each with ``input_ids`` and ``labels``)."""
    was_training = model.training
    model.eval()
    correct = {group: 0 for group in SCORED_GROUPS}
    counts = {group: 0 for group in SCORED_GROUPS}
    device = next(model.parameters()).device
    try:
        for example in examples:
            positions = reflection_positions(example, token_ids)
            if not any(positions.values()):
                continue
            input_ids = torch.tensor([example["input_ids"]], device=device)
            logits = model(input_ids=input_ids).logits[0].float()  # (seq, vocab)
            for group, group_positions in positions.items():
                ids = torch.tensor(token_ids.ids(group), device=device)
                for position in group_positions:
                    predicted = ids[logits[position - 1, ids].argmax()].item()
                    correct[group] += int(predicted == example["labels"][position])
                    counts[group] += 1
    finally:
        model.train(was_training)
    result: dict[str, Any] = {
        group.value: (correct[group] / counts[group] if counts[group] else None) for group in SCORED_GROUPS
    }
    result["counts"] = {group.value: counts[group] for group in SCORED_GROUPS}
    return result
