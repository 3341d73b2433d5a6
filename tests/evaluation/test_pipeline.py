"""selfrag eval's whole run on a scripted engine: records, table, plots, judges, reflection agreement."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from selfrag import reflection as rf
from selfrag.config import from_dict
from selfrag.evaluation import run as run_module
from selfrag.evaluation.claims import Claim, CriticJudge, OverlapJudge
from selfrag.evaluation.config import EvalConfig
from selfrag.evaluation.data import LabelExample
from selfrag.evaluation.report import reflection_table
from selfrag.evaluation.token_agreement import agreement, predict
from selfrag.inference.engines import ScriptedEngine
from selfrag.trajectory import Passage

PARIS = {"id": "paris", "title": "Paris", "text": "Paris is the capital of France."}
LYON = {"id": "lyon", "title": "Lyon", "text": "Lyon has silk."}


def test_critic_judge_reads_the_support_token(world_engine: ScriptedEngine) -> None:
    judge = CriticJudge(world_engine, threshold=0.5)
    claims = [
        Claim("q?", "Paris is the capital.", (Passage(**LYON), Passage(**PARIS))),  # supported by one of them
        Claim("q?", "Paris is the capital.", (Passage(**LYON),)),
        Claim("q?", "Paris is the capital.", ()),  # no passage: not judged
    ]
    assert judge.judge(claims) == [True, False, None]
    assert len(world_engine.calls) == 1 and len(world_engine.calls[0]) == 3  # one batch, one step per pair


def test_overlap_judge() -> None:
    judge = OverlapJudge(threshold=0.5)
    assert judge.judge([Claim("q", "Paris is the capital of France.", (Passage(**PARIS),)),
                        Claim("q", "Lyon makes silk cheaply today.", (Passage(**PARIS),))]) == [True, False]


def test_reflection_predictions(world_engine: ScriptedEngine) -> None:
    items = [LabelExample("a", "q?", Passage(**PARIS), "Paris.", {"relevance": rf.RELEVANT, "utility": "[Utility:5]"}),
             LabelExample("b", "q?", Passage(**LYON), "", {"relevance": rf.IRRELEVANT}),
             LabelExample("c", "2+2?", None, "4", {"retrieve": rf.NO_RETRIEVAL})]
    rows = predict(world_engine, items)
    assert [(r["id"], r["type"]) for r in rows] == [("a", "relevance"), ("a", "utility"), ("b", "relevance"),
                                                   ("c", "retrieve")]
    result = agreement(rows)
    assert result["relevance"]["items"] == 2 and result["relevance"]["auroc"] == 1.0  # 0.9 for Paris, 0.2 for Lyon
    assert result["relevance"]["accuracy"] == 1.0
    assert result["relevance"]["confusion"]["matrix"] == [[1, 0, 0], [0, 1, 0]]
    assert result["retrieve"]["confusion"]["labels"] == list(rf.tokens_of(rf.Group.RETRIEVE))
    assert "at_threshold" not in result["relevance"]
    # the runtime's verdict at a calibrated cut: 0.9 and 0.2 are both >= 0.1, so Lyon is judged [Relevant] too
    low = agreement(rows, relevance_threshold=0.1)["relevance"]
    assert low["accuracy"] == 1.0 and low["at_threshold"]["threshold"] == 0.1  # the argmax figure is unchanged
    assert low["at_threshold"]["accuracy"] == 0.5 and low["at_threshold"]["confusion"]["matrix"] == [[1, 0, 0],
                                                                                                    [1, 0, 0]]
    table = reflection_table({"relevance": low})
    assert "| relevance: runtime verdict (score >= 0.1) | 2 | 50.0% | |" in table
    assert "relevance: gold (rows) x the runtime's verdict at score >= 0.1 (columns)" in table


def test_eval_run_end_to_end(world_engine: ScriptedEngine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = tmp_path / "data.jsonl"
    rows = [
        {"id": "fr", "question": "What is the capital of France?", "answers": ["Paris"], "ctxs": [LYON, PARIS]},
        {"id": "no", "question": "Who owns the moon?", "answers": [], "answerable": False, "ctxs": [LYON]},
    ]
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    labels = tmp_path / "labels.jsonl"
    labels.write_text(json.dumps({"question": "q?", "passage": PARIS, "labels": {"relevance": "[Relevant]"}}) + "\n")
    monkeypatch.setattr(run_module, "build_engine", lambda config, model: world_engine)
    monkeypatch.setattr(run_module, "build_plain_engine", lambda config, model: world_engine)
    config = from_dict(EvalConfig, {"data": data, "model": "m", "base_model": "b", "output_dir": tmp_path / "out",
                                    "labels": labels, "show": 2,
                                    "modes": ["no_retrieval", "plain_rag", "prompted", "single_pass"]})
    result = run_module.run(config)

    out = tmp_path / "out"
    results = json.loads((out / "results.json").read_text())
    single = results["modes"]["single_pass"]
    # single pass: the Paris passage wins for the answerable question; the Lyon-only one is unsupported -> abstain
    assert single["match"] == 1.0 and single["abstain_rate_unanswerable"] == 1.0 and single["false_abstain_rate"] == 0
    # decide, relevance, rest; the Lyon-only question stops at its [Irrelevant] verdict (skip.relevance_gap): 2
    assert single["unsupported_claim_rate"] == 0.0 and single["engine_calls_per_query"] == 2.5
    plain = results["modes"]["plain_rag"]
    # plain RAG says "Paris is the capital." to both; judged against Lyon only, the second is unsupported
    assert plain["match"] == 1.0 and plain["abstain_rate_unanswerable"] == 0.0
    assert plain["unsupported_claim_rate"] == 0.5 and plain["engine_calls_per_query"] == 1
    assert results["modes"]["no_retrieval"]["retrieval_rate"] == 0.0
    # engine calls are each question's own (the calls that held one of its requests), whatever the batch: both
    # questions in one batch of 2 still read 3 and 2, where the batch made 3 calls
    run_module.run(from_dict(EvalConfig, {
        "data": data, "model": "m", "base_model": "b", "output_dir": tmp_path / "out-batched", "batch_size": 2,
        "modes": ["plain_rag", "single_pass"]}))
    batched = json.loads((tmp_path / "out-batched" / "results.json").read_text())["modes"]
    assert batched["single_pass"]["engine_calls_per_query"] == 2.5
    assert batched["plain_rag"]["engine_calls_per_query"] == 1
    assert results["modes"]["no_retrieval"]["unsupported_claim_rate"] is None  # nothing cited, nothing judged
    assert "prompted" in results["modes"]
    assert results["reflection"]["relevance"]["items"] == 1
    assert results["reflection"]["relevance"]["at_threshold"]["threshold"] == 0.5  # uncalibrated: the default cut
    table = (out / "table.md").read_text()
    assert "| answer contains gold (answerable) | 100.0% |" in table and "single-pass Self-RAG" in table
    assert "| latency / plain RAG (p50, p95) |" in table
    assert (out / "quality.png").stat().st_size > 1000 and (out / "cost.png").stat().st_size > 1000
    records = [json.loads(line) for line in (out / "records" / "single_pass.jsonl").read_text().splitlines()]
    assert records[1]["abstained"] and records[0]["cited"][0]["id"] == "paris"
    assert records[0]["claims"] == [{"sentence": "Paris.", "supported": True}]
    assert "Q: What is the capital of France?" in result.summary()


def test_missing_corpus_is_one_config_error(tmp_path: Path) -> None:
    from selfrag.errors import ConfigError

    data = tmp_path / "data.jsonl"
    data.write_text(json.dumps({"question": "q?", "answers": ["a"]}) + "\n")
    config = from_dict(EvalConfig, {"data": data, "model": "m", "output_dir": tmp_path / "out"})
    with pytest.raises(ConfigError, match="no retriever is set; pass retriever.corpus=FILE .*retriever.index=DIR or "
                                          "retriever.url="):
        run_module.run(config)


def test_well_formed_counts_only_trained_outputs() -> None:
    """Pruned branches and branches the model marked [Irrelevant] (text after it is masked in training) are not
    outputs; every other candidate is, whether or not it parses."""
    from selfrag.evaluation.modes import well_formed_flags
    from selfrag.inference.answer import Candidate
    from selfrag.inference.trace import CandidateScore

    def candidate(relevance: str | None, well_formed: bool, pruned: bool = False) -> Candidate:
        score = CandidateScore(0.5, 0.5, 0.0, 1.0, relevance, rf.FULLY_SUPPORTED, "[Utility:5]", ())
        return Candidate(Passage("p", "t", "x"), "...", "a", well_formed, (), score, "stop", pruned=pruned)

    candidates = [
        candidate(rf.RELEVANT, True),
        candidate(rf.RELEVANT, False),  # a relevant branch that does not parse: counted, as a failure
        candidate(rf.IRRELEVANT, False),  # untrained text after [Irrelevant]: not an output
        candidate(rf.RELEVANT, False, pruned=True),  # stopped on purpose: not an output
        Candidate(None, "[No Retrieval]a", "a", True, (), None, "stop"),  # the no-retrieval path counts
    ]
    assert well_formed_flags(candidates) == [True, False, True]
