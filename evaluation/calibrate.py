"""``selfrag calibrate``: measure the retrieval threshold, the relevance threshold and the support bound on a dev split.

    selfrag calibrate --config configs/eval/calibrate-demo.yaml model=runs/my-model data=my-data/questions.jsonl \
        split=dev retriever.corpus=my-data/corpus.jsonl target_false_abstain=0.1   # dev split: docs/own-data.md

On every dev question: one decode step gives ``p_retrieve``; one step on each retrieved passage gives its relevance
score; one always-retrieve pass (at the fitted relevance threshold) gives the best candidate's verdicts. Then:

* threshold: maximises the balanced accuracy of ``p_retrieve > threshold`` against the gold ``needs_retrieval``
  (a question without it needs retrieval, as generate labels it: :func:`selfrag.corpus.retrieval_needed`; kept at
  the default when no dev question says ``false``);
* relevance_threshold: the balanced accuracy of ``relevance score >= t`` against the gold passages (a retrieved
  passage is relevant when its id is in the question's ``gold_passage_ids``; kept at the default when no dev question
  names one), the cut nearest the model's own verdict (0.5) among those within one standard error of the best: a
  model can rank passages well and still call most of them ``[Irrelevant]`` (the cut moves), and a few gold dev
  passages cannot place a cut precisely (it moves less);
* support_bound: the largest bound whose false-abstain rate on answerable questions is at most the target,
  simulated as the runtime judges the best candidate (an ``[Irrelevant]`` verdict, no support verdict,
  ``[No support / Contradictory]`` or a support score below the bound: unsupported).

All three are written into the model's ``selfrag.json`` (``calibration``); the runtime uses them wherever its
config leaves ``threshold``/``relevance_threshold``/``support_bound`` at their defaults.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from selfrag import reflection as rf
from selfrag.artifacts import write_calibration
from selfrag.corpus import retrieval_needed
from selfrag.errors import InputError
from selfrag.fsutil import claim_output, hold_output, left_clean_if_refused, write_json
from selfrag.inference.engines.base import GenerationRequest
from selfrag.jsonl import write_jsonl_atomic
from selfrag.models import resolve_model
from selfrag.prompting import encode_prompt

from .config import CalibrateConfig
from .data import DEV_SPLIT_HINT, check_not_trained_on, check_passages, load_examples, passage_ids, searched
from .metrics import rate

logger = logging.getLogger(__name__)

GRID = tuple(round(0.05 * step, 2) for step in range(20))  # 0.0 … 0.95
#: what the calibration holds; part of the quickstart's stage fingerprint, so a new kind of calibration is redone
VERSION = 3


@dataclass(frozen=True, slots=True)
class DevRow:
    """One dev question as calibrate measured it (a line of calibration-records.jsonl)."""

    id: str
    answerable: bool
    needs_retrieval: bool | None  # the gold label (None: unmarked, which needs retrieval)
    p_retrieve: float | None  # the decision's, at the prompt (None: neither retrieve token has a log-prob)
    relevance_token: str | None  # the best candidate's verdicts, always retrieving (None: not given)
    support_token: str | None
    support: float | None
    rounds: int = 1  # retrieval rounds run, always retrieving
    rescued: bool = False  # a later round found what the first did not: its best candidate was accepted


@dataclass(frozen=True, slots=True)
class DevPassage:
    """One passage retrieved for a dev question: its relevance score and whether it is gold
    (a line of calibration-passages.jsonl)."""

    id: str
    passage_id: str
    relevance: float | None
    relevant: bool


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
            f"relevance_threshold = {c['relevance_threshold']:.3g}  ({c['relevance_threshold_reason']}; gold passages "
            f"judged [Relevant] {_pct(m.get('relevant_recall'))}, others [Irrelevant] "
            f"{_pct(m.get('irrelevant_rejected'))})",
            f"support_bound = {c['support_bound']:.2f}  (false abstains {_pct(m['false_abstain_rate'])} <= target "
            f"{c['target_false_abstain']:.0%}: {m['target_met']}; abstains on {_pct(m['abstain_rate_unanswerable'])} "
            "of unanswerable)",
        ]
        if "re_retrieved" in m:
            lines.append(f"re-retrieval: {m['re_retrieved']} of {c['dev_examples']} dev questions went on to another "
                         f"round; {m['rescued_by_re_retrieval']} of them were answered there (max_rounds=0 skips it)")
        lines.append(f"written to {self.path}" if self.path else "not written (write=false)")
        return "\n".join(lines)


def _dev_examples(config: CalibrateConfig) -> list[Any]:
    """The dev questions; a missing file or an empty split says how to make a dev split."""
    if not Path(config.data).is_file():
        raise InputError(f"data {str(config.data)!r} not found: calibration needs held-out dev questions; "
                         + DEV_SPLIT_HINT)
    try:
        return load_examples(config.data, config.format, config.limit, config.split)
    except InputError as error:
        if config.split is None or "holds no examples" not in str(error):
            raise
        raise InputError(f"{error}; {DEV_SPLIT_HINT}") from None


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1%}"


def run(config: CalibrateConfig) -> CalibrationResult:
    """Measure and write the calibration; refused on its inputs, it leaves no output_dir folder behind."""
    if config.output_dir is None:  # it writes into the model's folder: no train or rl may write there meanwhile
        with hold_output(config.model, "calibrate", key="model") if Path(config.model).is_dir() else nullcontext():
            return _run(config)
    with left_clean_if_refused(config.output_dir), hold_output(config.output_dir, "calibrate"):
        return _run(config)


def _run(config: CalibrateConfig) -> CalibrationResult:
    from selfrag.inference.config import PruningConfig
    from selfrag.inference.engines import build_engine
    from selfrag.inference.retrievers.spec import open_retriever
    from selfrag.inference.runtime import SelfRAG

    from .modes import ExampleRetriever

    if config.output_dir is not None:  # unset: the model's own folder, which calibrate writes into by design
        claim_output(config.output_dir, "calibrate", key="output_dir")
    examples = _dev_examples(config)
    check_not_trained_on(examples, config.model, config.data, config.split, "calibrate",
                         config.allow_trained_questions)
    check_passages(examples, searched(config.retriever), None, True)
    opened = open_retriever(config.retriever)
    check_passages(examples, searched(config.retriever), passage_ids(opened), True)
    retriever = ExampleRetriever(examples, opened)
    engine = build_engine(config.inference, config.model)  # inference.engine: hf, vllm or openai
    ids = engine.token_ids
    requests = [
        GenerationRequest(prompt_ids=tuple(encode_prompt(engine.tokenizer, e.prompt, engine.prompt_template)),
                          max_tokens=1, score_token_ids=ids.all_ids)
        for e in examples
    ]
    from selfrag.inference.scoring import retrieve_probability
    from selfrag.inference.trace import Retrieve, Support

    decisions = engine.generate(requests)
    prompts = [e.prompt for e in examples]
    # each retrieved passage's relevance score: one decode step per branch (the runtime's first step)
    # the runtime as configured, always retrieving, abstaining where unsupported, no earlier calibration read
    measured = dataclasses.replace(config.inference, mode="always", on_unsupported="abstain", use_calibration=False)
    probe = dataclasses.replace(measured, max_tokens=1, max_rounds=0, pruning=PruningConfig(enabled=False))
    passages = []
    for example, answer in zip(examples, SelfRAG(engine, retriever, probe).answer_many(prompts), strict=True):
        for candidate in answer.candidates:
            if candidate.passage is not None:
                passages.append(DevPassage(
                    id=example.id, passage_id=candidate.passage.id,
                    relevance=None if candidate.score is None else candidate.score.relevance,
                    relevant=candidate.passage.id in example.gold_passage_ids,
                ))
    labelled = any(example.gold_passage_ids for example in examples)
    relevance_threshold, relevance_reason = choose_relevance_threshold(passages if labelled else [])
    always = dataclasses.replace(measured, support_bound=0.0, relevance_threshold=relevance_threshold)
    answers = SelfRAG(engine, retriever, always).answer_many(prompts)
    rows = []
    for example, decision, answer in zip(examples, decisions, answers, strict=True):
        best = answer.candidates[answer.chosen] if answer.chosen is not None else None
        score = best.score if best is not None else None
        supports = [entry for entry in answer.trace if isinstance(entry, Support)]
        rows.append(DevRow(
            id=example.id,
            answerable=example.answerable,
            needs_retrieval=example.needs_retrieval,
            p_retrieve=retrieve_probability(decision.score_logprobs[0] if decision.score_logprobs else {}, ids),
            relevance_token=None if score is None else score.relevance_token,
            support_token=None if score is None else score.support_token,
            support=None if score is None else score.support,
            rounds=sum(isinstance(entry, Retrieve) for entry in answer.trace),
            rescued=bool(supports) and supports[-1].chosen == "accept" and supports[-1].round > 0,
        ))
    calibration = choose(rows, config.target_false_abstain)
    calibration.update({
        "relevance_threshold": relevance_threshold,
        "relevance_threshold_reason": relevance_reason,
        "data": str(config.data), "dev_examples": len(rows), "version": VERSION,
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
    })
    calibration["measured"].update(relevance_measures(passages, relevance_threshold))
    calibration["measured"].update(rounds_measures(rows))
    model_dir = Path(resolve_model(config.model))
    out = config.output_dir or model_dir
    write_jsonl_atomic(out / "calibration-records.jsonl", [asdict(row) for row in rows])
    write_jsonl_atomic(out / "calibration-passages.jsonl", [asdict(passage) for passage in passages])
    write_json(out / "calibration.json", calibration)
    path = write_calibration(model_dir, calibration) if config.write else None
    return CalibrationResult(calibration, path)


def simulate(rows: Sequence[DevRow], threshold: float, bound: float) -> list[tuple[bool, bool]]:
    """(retrieved, abstained) per row, as the runtime decides with this threshold and support bound."""
    outcome = []
    for row in rows:
        p = row.p_retrieve
        retrieved = (p > threshold) if p is not None else retrieval_needed(row.needs_retrieval)
        unsupported = row.relevance_token != rf.RELEVANT or row.support_token in (None, rf.NO_SUPPORT) or (
            bound > 0 and (row.support is None or row.support < bound)
        )
        outcome.append((retrieved, retrieved and unsupported))
    return outcome


def choose_threshold(rows: Sequence[DevRow]) -> tuple[float | None, str]:
    """The threshold of best balanced accuracy against gold ``needs_retrieval`` (the middle of a tied range)."""
    labelled = [r.p_retrieve for r in rows if r.p_retrieve is not None]
    # a question without needs_retrieval needs retrieval, as generate labels it (one rule: retrieval_needed)
    positives = [r.p_retrieve for r in rows if r.p_retrieve is not None and retrieval_needed(r.needs_retrieval)]
    negatives = [r.p_retrieve for r in rows if r.p_retrieve is not None and not retrieval_needed(r.needs_retrieval)]
    if not negatives:
        return None, ("no dev question has needs_retrieval: false (a question without the field needs retrieval, as "
                      "generate labels it); kept the default")
    if not positives:
        return None, "every dev question has needs_retrieval: false; kept the default"

    def balanced(t: float) -> float:
        hit = sum(p > t for p in positives) / len(positives)
        rejected = sum(p <= t for p in negatives) / len(negatives)
        return (hit + rejected) / 2

    scores = {t: balanced(t) for t in GRID}
    best = max(scores.values())
    tied = [t for t, s in scores.items() if s == best]
    return tied[len(tied) // 2], f"balanced accuracy {best:.1%} on {len(labelled)} labelled dev questions"


def choose_relevance_threshold(passages: Sequence[DevPassage]) -> tuple[float, str]:
    """The relevance threshold against the gold passages: of the cuts whose balanced accuracy is within one standard
    error of the best, the one nearest the model's own verdict (0.5, in log-odds). The default when the dev passages
    are not both relevant and irrelevant ones.

    The best cut alone over-fits a small dev set: it sits just under the lowest gold score, and with 4 gold passages
    that says little about the next one (the quickstart's 0.971 from 4 gold passages rejected 8 of 14 gold test
    passages the model itself called ``[Relevant]``). The one-standard-error rule (Breiman's, toward the simplest
    choice: not moving the model's verdict) moves the cut only as far as the dev data can tell apart. The standard
    error is the binomial one of the best cut's two rates, each smoothed by one hit and one miss (so a perfect
    split of few passages still has one).
    """
    from selfrag.inference.config import DEFAULT_RELEVANCE_THRESHOLD

    positives = [p.relevance for p in passages if p.relevance is not None and p.relevant]
    negatives = [p.relevance for p in passages if p.relevance is not None and not p.relevant]
    scored = len(positives) + len(negatives)
    if not positives or not negatives:
        return DEFAULT_RELEVANCE_THRESHOLD, (
            "the dev questions' retrieved passages are not both gold and other passages (gold_passage_ids); "
            f"kept the default {DEFAULT_RELEVANCE_THRESHOLD}, the model's own verdict"
        )
    # every distinct cut: the midpoints between neighbouring scores (scores may bunch up far from 0.5), and 0.5
    values = sorted(set(positives) | set(negatives))
    cuts = [(low + high) / 2 for low, high in zip(values, values[1:], strict=False)] or [values[0]]
    scores = {t: _balanced(positives, negatives, t) for t in [*cuts, DEFAULT_RELEVANCE_THRESHOLD]}
    best = max(scores.values())
    tied = [t for t in cuts if scores[t] == best]
    best_cut = tied[len(tied) // 2]
    se = _balanced_se(positives, negatives, best_cut)
    near = [t for t, s in scores.items() if s >= best - se - 1e-12]
    chosen = min(near, key=lambda t: (abs(_logit(t) - _logit(DEFAULT_RELEVANCE_THRESHOLD)), t))
    threshold = float(f"{chosen:.6g}")
    own = scores[DEFAULT_RELEVANCE_THRESHOLD]
    if threshold == DEFAULT_RELEVANCE_THRESHOLD:
        how = f"kept the model's own verdict (0.5): {own:.1%}, within one standard error ({se:.1%}) of the best"
    else:
        how = (f"the cut nearest 0.5 within one standard error ({se:.1%}) of the best; the model's own verdict "
               f"(0.5): {own:.1%}")
    return threshold, (
        f"balanced accuracy {scores[chosen]:.1%} on {scored} dev passages ({len(positives)} gold; best cut "
        f"{float(f'{best_cut:.3g}'):g}: {best:.1%}); {how}"
    )


def _balanced_se(positives: Sequence[float], negatives: Sequence[float], threshold: float) -> float:
    """Standard error of the balanced accuracy at ``threshold``: each class's rate smoothed by one hit and one miss."""
    hit = (sum(p >= threshold for p in positives) + 1) / (len(positives) + 2)
    rejected = (sum(n < threshold for n in negatives) + 1) / (len(negatives) + 2)
    return 0.5 * math.sqrt(hit * (1 - hit) / len(positives) + rejected * (1 - rejected) / len(negatives))


def _logit(p: float) -> float:
    p = min(max(p, 1e-9), 1 - 1e-9)
    return math.log(p / (1 - p))


def _balanced(positives: Sequence[float], negatives: Sequence[float], threshold: float) -> float:
    hit = sum(p >= threshold for p in positives) / len(positives)
    rejected = sum(n < threshold for n in negatives) / len(negatives)
    return (hit + rejected) / 2


def relevance_measures(passages: Sequence[DevPassage], threshold: float) -> dict[str, Any]:
    """How the relevance verdict at ``threshold`` and at 0.5 (the model's own) agrees with the gold passages."""
    gold = [p.relevance for p in passages if p.relevance is not None and p.relevant]
    other = [p.relevance for p in passages if p.relevance is not None and not p.relevant]
    return {
        "relevance_passages": len(gold) + len(other),
        "relevance_gold_passages": len(gold),
        "relevant_recall": rate(sum(value >= threshold for value in gold), len(gold)),
        "relevant_recall_at_0.5": rate(sum(value >= 0.5 for value in gold), len(gold)),
        "irrelevant_rejected": rate(sum(value < threshold for value in other), len(other)),
        "irrelevant_rejected_at_0.5": rate(sum(value < 0.5 for value in other), len(other)),
    }


def rounds_measures(rows: Sequence[DevRow]) -> dict[str, int]:
    """What re-retrieval did on the dev questions (always retrieving): how many went on to another round, and how many
    of those a later round answered (their best candidate accepted)."""
    again = [row for row in rows if row.rounds > 1]
    return {"re_retrieved": len(again), "rescued_by_re_retrieval": sum(row.rescued for row in again)}


def choose(rows: Sequence[DevRow], target: float) -> dict[str, Any]:
    from selfrag.inference.config import DEFAULT_THRESHOLD

    threshold, reason = choose_threshold(rows)
    threshold = DEFAULT_THRESHOLD if threshold is None else threshold
    answerable = [i for i, r in enumerate(rows) if r.answerable]
    unanswerable = [i for i, r in enumerate(rows) if not r.answerable]

    def false_abstain(bound: float) -> float | None:
        outcome = simulate(rows, threshold, bound)
        return rate(sum(outcome[i][1] for i in answerable), len(answerable))

    feasible = [b for b in GRID if (false_abstain(b) or 0.0) <= target]
    bound = max(feasible) if feasible else 0.0
    outcome = simulate(rows, threshold, bound)
    pairs = zip(outcome, rows, strict=True)
    decided = [(o[0], retrieval_needed(r.needs_retrieval)) for o, r in pairs]
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
                "even support_bound 0 abstains too often: the model's own verdicts on its best passage ([Irrelevant] "
                "at the relevance threshold, or [No support / Contradictory]) exceed the target; use "
                "on_unsupported=flag or train longer"
            ),
        },
    }
