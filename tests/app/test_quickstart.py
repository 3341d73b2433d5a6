"""The quickstart's whole story on the tiny fixture model: data -> training steps -> answers -> report, resumable."""

from __future__ import annotations

import json
from pathlib import Path

from selfrag.app.quickstart import QuickstartConfig, run
from selfrag.config import from_dict


def test_quickstart_end_to_end_and_resume(tiny_base_dir: Path, tmp_path: Path) -> None:
    config = from_dict(
        QuickstartConfig,
        {
            "output_dir": tmp_path / "qs",
            "model": str(tiny_base_dir),
            "max_steps": 2,
            "test_questions": 4,
            "show": 2,
            "min_well_formed": 0,
            "train": {"training": {"batch_size": 2, "max_length": 512, "save_steps": 1}},
            "inference": {"max_tokens": 8},
        },
    )
    report = run(config)
    out = tmp_path / "qs"
    assert json.loads((out / "report.json").read_text())["questions"] == report["questions"]
    assert sum(report["questions"].values()) == 4
    assert 0.0 <= report["well_formed"]["all_outputs"] <= 1.0
    assert (out / "model" / "selfrag.json").is_file() and (out / "data" / "records.jsonl").is_file()
    answers = (out / "answers.jsonl").read_text().splitlines()
    assert len(answers) == 4

    # Run again: nothing is redone or duplicated.
    records_before = (out / "data" / "records.jsonl").read_text()
    run(config)
    assert (out / "answers.jsonl").read_text().splitlines() == answers
    assert (out / "data" / "records.jsonl").read_text() == records_before
