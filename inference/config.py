"""Settings of the Self-RAG runtime (short form).

    config = load_config(InferenceConfig, "configs/inference/default.yaml", ["threshold=0.3", "weights.utility=0"])

Every field is documented; :meth:`InferenceConfig.validate` names the field, the value and the fix.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from selfrag.config import help_field

MODES = ("adaptive", "always", "never")
#: the built-in values; a model calibrated by ``selfrag calibrate`` replaces them (see ``use_calibration``)
DEFAULT_THRESHOLD = 0.2
DEFAULT_SUPPORT_BOUND = 0.0
ON_UNSUPPORTED = ("abstain", "flag")


@dataclass
class ScoreWeights:
    """Weights of the three critique scores in a candidate's combined score."""

    relevance: float = help_field("weight of the relevance score p(Relevant)/(p(Relevant)+p(Irrelevant))", 1.0)
    support: float = help_field("weight of the support score (p(Full)+0.5 p(Partial))/(sum of the three)", 1.0)
    utility: float = help_field("weight of the utility score sum(w_k p_k)/sum(p_k), w = -1, -0.5, 0, 0.5, 1", 0.5)


@dataclass
class InferenceConfig:
    """How the runtime decides, ranks and answers."""

    mode: Literal["adaptive", "always", "never"] = help_field(
        "adaptive: retrieve when p_retrieve > threshold; always: retrieve for every question; never: answer "
        "from the model alone",
        "adaptive",
    )
    threshold: float = help_field(
        "adaptive mode retrieves when P([Retrieval]) / (P([Retrieval]) + P([No Retrieval])) exceeds this",
        DEFAULT_THRESHOLD,
    )
    top_k: int = help_field("passages retrieved per question; each is decoded as one candidate continuation", 3)
    weights: ScoreWeights = help_field(
        "weights of relevance, support and utility in the ranking", default_factory=ScoreWeights
    )
    max_tokens: int = help_field("most new tokens per decode", 64)
    on_unsupported: Literal["abstain", "flag"] = help_field(
        "when the best continuation is unsupported ([No support / Contradictory], no support verdict, or a support "
        "score below support_bound): abstain (answer abstain_text) or flag (keep it, low_confidence=true)",
        "abstain",
    )
    support_bound: float = help_field(
        "the best continuation counts as unsupported when its support score is below this; 0 means only the "
        "support token the model generated counts",
        DEFAULT_SUPPORT_BOUND,
    )
    use_calibration: bool = help_field(
        "where threshold and support_bound are left at their defaults, use the values `selfrag calibrate` measured "
        "and wrote into the model's selfrag.json; false: always the values given here",
        True,
    )
    abstain_text: str = help_field("the answer given when the runtime abstains", "The sources do not say.")

    def validate(self) -> list[str]:
        """Problems with the values, each naming the field, the value and the fix (empty when valid)."""
        problems = []
        if self.mode not in MODES:
            problems.append(f"mode must be one of {list(MODES)}, got {self.mode!r}")
        if not 0.0 <= self.threshold <= 1.0:
            problems.append(
                f"threshold must be in [0, 1], got {self.threshold}; use mode=always to always retrieve "
                "or mode=never to never retrieve"
            )
        if self.top_k < 1:
            problems.append(f"top_k must be at least 1, got {self.top_k}; use mode=never to answer without passages")
        if self.max_tokens < 1:
            problems.append(f"max_tokens must be at least 1, got {self.max_tokens}")
        if self.on_unsupported not in ON_UNSUPPORTED:
            problems.append(f"on_unsupported must be one of {list(ON_UNSUPPORTED)}, got {self.on_unsupported!r}")
        if not 0.0 <= self.support_bound <= 1.0:
            problems.append(f"support_bound must be in [0, 1], got {self.support_bound}; use 0 to rely on the token")
        if not self.abstain_text.strip():
            problems.append("abstain_text is empty; give the sentence shown when the runtime abstains")
        for name in ("relevance", "support", "utility"):
            value = getattr(self.weights, name)
            if not isinstance(value, int | float) or not math.isfinite(value):
                problems.append(f"weights.{name} must be a finite number, got {value!r}")
        return problems

    def resolved(self, calibration: Mapping[str, Any] | None = None) -> InferenceConfig:
        """A copy whose threshold/support_bound, where left at their defaults, are the model's calibrated values."""
        if not self.use_calibration or not calibration:
            return self
        changes: dict[str, float] = {}
        if self.threshold == DEFAULT_THRESHOLD and isinstance(calibration.get("threshold"), int | float):
            changes["threshold"] = float(calibration["threshold"])
        if self.support_bound == DEFAULT_SUPPORT_BOUND and isinstance(calibration.get("support_bound"), int | float):
            changes["support_bound"] = float(calibration["support_bound"])
        return dataclasses.replace(self, **changes)
