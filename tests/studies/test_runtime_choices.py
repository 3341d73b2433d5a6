"""The runtime-choices study: every arm is the quickstart's own evaluation config with one valid change, and the
table's paired counts compare each arm with the default question by question."""

from __future__ import annotations

from pathlib import Path

import pytest
import runtime_choices as study

from selfrag.config import from_dict
from selfrag.evaluation.config import EvalConfig


def _quickstart_eval(tmp_path: Path) -> dict[str, object]:
    """What the quickstart writes as eval/config.yaml, in the keys the arms touch."""
    return {"data": str(tmp_path / "test.jsonl"), "model": str(tmp_path / "model"),
            "retriever": {"corpus": str(tmp_path / "c.jsonl")},
            "output_dir": str(tmp_path / "eval"), "batch_size": 4,
            "inference": {"top_k": 3, "max_tokens": 96, "max_rounds": 2,
                          "weights": {"relevance": 1.0, "support": 1.0, "utility": 0.5}},
            "judge": {"kind": "overlap"}, "modes": ["no_retrieval", "plain_rag", "single_pass"]}


@pytest.mark.parametrize("arm", sorted(study.ARMS))
def test_each_arm_is_a_valid_eval_config_that_changes_one_thing(arm: str, tmp_path: Path) -> None:
    base = _quickstart_eval(tmp_path)
    settings = study.merge(base, study.ARMS[arm][1])
    config = from_dict(EvalConfig, settings)
    default = from_dict(EvalConfig, base)
    if arm == "default":
        assert config == default
    else:
        assert config != default
    assert settings["inference"]["max_rounds"] == 2  # a change merges into the quickstart's keys, never replaces them


def test_a_quickstart_folder_of_before_the_inference_section_is_read_in_todays_spelling(tmp_path: Path) -> None:
    """An eval/config.yaml written with top_k, max_tokens, engine and engine_options at the top level (and corpus, as
    before the retriever section) is read as today's config, so an older quickstart folder still runs every arm."""
    import yaml

    new = _quickstart_eval(tmp_path)
    old = {**new, "corpus": new["retriever"]["corpus"], "inference": {"max_rounds": 2, "weights": {  # type: ignore[index]
        "relevance": 1.0, "support": 1.0, "utility": 0.5}}, "top_k": 3, "max_tokens": 96, "engine": "hf",
        "engine_options": {"device": "cpu"}}
    del old["retriever"]
    (tmp_path / "eval").mkdir()
    (tmp_path / "eval" / "config.yaml").write_text(yaml.safe_dump(old))
    read = study.quickstart_eval(tmp_path)
    assert from_dict(EvalConfig, read) == from_dict(EvalConfig, new)


def test_merge_keeps_the_other_weights() -> None:
    merged = study.merge({"inference": {"weights": {"relevance": 1.0, "utility": 0.5}, "top_k": 3}},
                         {"inference": {"weights": {"utility": 0.0}}})
    assert merged == {"inference": {"weights": {"relevance": 1.0, "utility": 0.0}, "top_k": 3}}


def test_paired_counts_compare_question_by_question(tmp_path: Path) -> None:
    def rows(answers: dict[str, str]) -> list[dict[str, object]]:
        return [{"id": q, "answer": a, "gold_answers": ["Cork"], "abstained": a == "", "answerable": True, "kind": "qa",
                 "claims": [], "seconds": 1.0, "retrieved": True, "engine_calls": 1, "prompt_tokens": 1,
                 "generated_tokens": 1} for q, a in answers.items()]

    default = study.holds_gold(rows({"q1": "In Cork.", "q2": "Dublin.", "q3": ""}))
    assert default == {"q1": True, "q2": False, "q3": False}
    out = tmp_path / "arm" / "records"
    out.mkdir(parents=True)
    import json

    (out / "single_pass.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows(
        {"q1": "", "q2": "Cork, Ireland.", "q3": "Cork."})), encoding="utf-8")
    line = study.row("x", "what", tmp_path / "arm", default)
    assert "| 2/3 = 66.7% [" in line and "| +2 / -1 |" in line  # q2, q3 gained; q1 lost (abstained)
    assert study.share(0, 0) == "n/a"
