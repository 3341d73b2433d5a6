"""``selfrag calibrate``: measure the retrieval threshold and the support bound on a dev split.

    selfrag calibrate --config configs/eval/demo.yaml model=runs/model data=runs/dev.jsonl target_false_abstain=0.1

On every dev question: one decode step gives ``p_retrieve``; one always-retrieve pass gives the best
candidate's support verdict and score. Then, simulated exactly as the runtime decides:

* threshold: maximises the balanced accuracy of ``p_retrieve > threshold`` against the gold ``needs_retrieval``
  (kept at the default when the dev data has no such labels);
* support_bound: the largest bound whose false-abstain rate on answerable questions is at most the target.

Both are written into the model's ``selfrag.json`` (``calibration``); the runtime uses them whenever its
config leaves ``threshold``/``support_bound`` unset.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from selfrag import reflection as rf
from selfrag.artifacts import write_calibration
from selfrag.fsutil import write_json
from selfrag.inference.engines.base import GenerationRequest
from selfrag.jsonl import write_jsonl_atomic
from selfrag.models import resolve_model
from selfrag.prompting import encode_prompt

from .config import CalibrateConfig
from .data import load_examples
from .metrics import rate

logger = logging.getLogger(__name__)

GRID = tuple(round(0.05 * step, 2) for step in range(20))  # 0.0 … 0.95


@dataclass
class CalibrationResult:
    calibration: dict[str, Any]
    path: Path | None

    def summary(self) -> str:
        c, m = self.calibration, self.calibration["measured"]
        lines = [
            f"threshold     = {c['threshold']:.2f}  (retrieve decision = gold on "
            f"{_pct(m['retrieve_decision_accuracy'])} "
            f"of dev questions; {c['threshold_reason']})",
            f"support_bound = {c['support_bound']:.2f}  (false abstains {_pct(m['false_abstain_rate'])} <= target "
            f"{c['target_false_abstain']:.0%}: {m['target_met']}; abstains on {_pct(m['abstain_rate_unanswerable'])} "
            "of unanswerable)",
        ]
        lines.append(f"written to {self.path}" if self.path else "not written (write=false)")
        return "\n".join(lines)


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1%}"


def run(config: CalibrateConfig) -> CalibrationResult:
    from selfrag.inference.config import InferenceConfig
    from selfrag.inference.retrievers import build_bm25
    from selfrag.inference.runtime import SelfRAG

    from .engines import load_trained
    from .modes import ExampleRetriever

    examples = load_examples(config.data, config.format, config.limit, config.split)
    retriever = ExampleRetriever(examples, build_bm25(config.corpus) if config.corpus else None)
    engine = load_trained(config.model)
    ids = engine.token_ids
    requests = [
        GenerationRequest(prompt_ids=tuple(encode_prompt(engine.tokenizer, e.prompt, engine.prompt_template)),
                          max_tokens=1, score_token_ids=ids.all_ids)
        for e in examples
    ]
    from selfrag.inference.scoring import retrieve_probability

    decisions = engine.generate(requests)
    always = InferenceConfig(mode="always", top_k=config.top_k, max_tokens=config.max_tokens, support_bound=0.0)
    answers = SelfRAG(engine, retriever, always).answer_many([e.prompt for e in examples])
    rows = []
    for example, decision, answer in zip(examples, decisions, answers, strict=True):
        best = answer.candidates[answer.chosen] if answer.chosen is not None else None
        score = best.score if best is not None else None
        rows.append({
            "id": example.id,
            "answerable": example.answerable,
            "needs_retrieval": example.needs_retrieval,
            "p_retrieve": retrieve_probability(decision.score_logprobs[0] if decision.score_logprobs else {}, ids),
            "support_token": None if score is None else score.support_token,
            "support": None if score is None else score.support,
        })
    calibration = choose(rows, config.target_false_abstain)
    calibration.update({"data": str(config.data), "dev_examples": len(rows),
                        "date": datetime.now(UTC).isoformat(timespec="seconds")})
    model_dir = Path(resolve_model(config.model))
    out = config.output_dir or model_dir
    write_jsonl_atomic(out / "calibration-records.jsonl", rows)
    write_json(out / "calibration.json", calibration)
    path = write_calibration(model_dir, calibration) if config.write else None
    return CalibrationResult(calibration, path)


def simulate(rows: Sequence[dict[str, Any]], threshold: float, bound: float) -> list[tuple[bool, bool]]:
    """(retrieved, abstained) per row, as the runtime decides with this threshold and support bound."""
    outcome = []
    for row in rows:
        p = row["p_retrieve"]
        retrieved = (p > threshold) if p is not None else bool(row["needs_retrieval"])
        unsupported = row["support_token"] in (None, rf.NO_SUPPORT) or (
            bound > 0 and (row["support"] is None or row["support"] < bound)
        )
        outcome.append((retrieved, retrieved and unsupported))
    return outcome


def choose_threshold(rows: Sequence[dict[str, Any]]) -> tuple[float | None, str]:
    """The threshold of best balanced accuracy against gold ``needs_retrieval`` (the middle of a tied range)."""
    labelled = [r for r in rows if r["needs_retrieval"] is not None and r["p_retrieve"] is not None]
    positives = [r for r in labelled if r["needs_retrieval"]]
    negatives = [r for r in labelled if not r["needs_retrieval"]]
    if not positives or not negatives:
        return None, "the dev data lacks questions that need and that do not need retrieval; kept the default"

    def balanced(t: float) -> float:
        hit = sum(r["p_retrieve"] > t for r in positives) / len(positives)
        rejected = sum(r["p_retrieve"] <= t for r in negatives) / len(negatives)
        return (hit + rejected) / 2

    scores = {t: balanced(t) for t in GRID}
    best = max(scores.values())
    tied = [t for t, s in scores.items() if s == best]
    return tied[len(tied) // 2], f"balanced accuracy {best:.1%} on {len(labelled)} labelled dev questions"


def choose(rows: Sequence[dict[str, Any]], target: float) -> dict[str, Any]:
    from selfrag.inference.config import DEFAULT_THRESHOLD

    threshold, reason = choose_threshold(rows)
    threshold = DEFAULT_THRESHOLD if threshold is None else threshold
    answerable = [i for i, r in enumerate(rows) if r["answerable"]]
    unanswerable = [i for i, r in enumerate(rows) if not r["answerable"]]

    def false_abstain(bound: float) -> float | None:
        outcome = simulate(rows, threshold, bound)
        return rate(sum(outcome[i][1] for i in answerable), len(answerable))

    feasible = [b for b in GRID if (false_abstain(b) or 0.0) <= target]
    bound = max(feasible) if feasible else 0.0
    outcome = simulate(rows, threshold, bound)
    pairs = zip(outcome, rows, strict=True)
    decided = [(o[0], r["needs_retrieval"]) for o, r in pairs if r["needs_retrieval"] is not None]
    return {
        "threshold": threshold,
        "threshold_reason": reason,
        "support_bound": bound,
        "target_false_abstain": target,
        "measured": {
            "target_met": bool(feasible),
            "false_abstain_rate": false_abstain(bound),
            "abstain_rate_unanswerable": rate(sum(outcome[i][1] for i in unanswerable), len(unanswerable)),
            "retrieve_decision_accuracy": rate(sum(a == b for a, b in decided), len(decided)),
            "note": None if feasible else (
                "even support_bound 0 abstains too often: the model's own [No support / Contradictory] verdicts "
                "exceed the target; use on_unsupported=flag or train longer"
            ),
        },
    }
