"""The critique of one continuation (:class:`CandidateScore`): what scoring computes and the trace records."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class CandidateScore:
    """The critique of one continuation: each component (None when missing), tokens and the total."""

    relevance: float | None
    support: float | None
    utility: float | None
    total: float
    relevance_token: str | None  # the token the model generated for each group (None: not generated)
    support_token: str | None
    utility_token: str | None
    missing: tuple[str, ...]  # components whose score could not be read
    #: 1/(1 + the passage's 0-based rank in its retrieval round), counted where ``weights.retrieval`` is not 0
    retrieval: float | None = None

    def to_json(self) -> dict[str, object]:
        components = {"relevance": self.relevance, "support": self.support, "utility": self.utility}
        if self.retrieval is not None:
            components["retrieval"] = self.retrieval
        return {
            "score": self.total,
            "components": components,
            "tokens": {"relevance": self.relevance_token, "support": self.support_token, "utility": self.utility_token},
            "missing": list(self.missing),
        }
