"""``rewards.json``'s history: each logged step's reward per term, its wall seconds and memory.

    history = reward_history(trainer.state.log_history)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .reward import TERMS

#: rewards.json's names of the timings SelfRAGGRPOTrainer logs (means over the steps since the previous log)
TIMINGS = {"step_seconds": "time/step_seconds", "rollout_seconds": "time/rollout_seconds",
           "peak_allocated_gb": "memory/peak_allocated_gb", "completion_tokens": "completions/mean_length"}



def reward_history(log_history: Sequence[dict[str, Any]]) -> list[dict[str, float]]:
    """Each logged step's mean reward in all and per term (TRL's ``rewards/<term>/mean``), its wall seconds and the
    rollouts' part of them, the CUDA allocator's peak so far (GB) and the rollouts' mean length in tokens."""
    rows = []
    for entry in log_history:
        if "reward" not in entry:
            continue
        row = {"step": float(entry["step"]), "reward": float(entry["reward"])}
        row.update({term: float(entry[f"rewards/{term}/mean"]) for term in TERMS if f"rewards/{term}/mean" in entry})
        row.update({name: round(float(entry[key]), 3) for name, key in TIMINGS.items() if entry.get(key) is not None})
        rows.append(row)
    return rows
