"""Run fingerprints: the same run resumes, a different one is refused with what differs, restart starts over."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from selfrag.runs import RUN_FILE, RunMismatchError, check_rerun, differences, file_digest, run_fingerprint


def make(tmp_path: Path, records: str = "a\n", **settings: object) -> dict:
    path = tmp_path / "records.jsonl"
    path.write_text(records)
    base = {"model": "m", "output_dir": str(tmp_path / "out"), "training": {"learning_rate": 0.001, "seed": 0}}
    base["training"].update(settings)  # type: ignore[union-attr]
    return run_fingerprint("train", base, {"records": path}, ignore=("output_dir",))


def test_fingerprint_hashes_content_and_flattens_settings(tmp_path: Path) -> None:
    fingerprint = make(tmp_path)
    assert fingerprint["settings"] == {"model": "m", "training.learning_rate": 0.001, "training.seed": 0}
    assert fingerprint["inputs"]["records"] == file_digest(tmp_path / "records.jsonl")
    assert fingerprint["inputs"]["records"].startswith("sha256:")


def test_differences_name_each_changed_setting_and_input(tmp_path: Path) -> None:
    old = make(tmp_path)
    new = make(tmp_path, records="b\n", learning_rate=0.01)
    lines = differences(old, new)
    assert lines[0].startswith("records: content changed (")
    assert lines[1] == "training.learning_rate=0.01 (was 0.001)"
    assert differences(old, make(tmp_path)) == []


def test_same_run_resumes_and_different_run_is_refused(tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert check_rerun(out, make(tmp_path, seed=5), restart=False) == "fresh"
    # That run failed before writing anything (only run.json): a corrected rerun simply starts over.
    assert check_rerun(out, make(tmp_path), restart=False) == "fresh"
    assert json.loads((out / RUN_FILE).read_text())["settings"]["training.seed"] == 0
    (out / "checkpoints").mkdir()
    assert check_rerun(out, make(tmp_path), restart=False) == "resume"
    with pytest.raises(RunMismatchError) as error:
        check_rerun(out, make(tmp_path, seed=1), restart=False)
    message = str(error.value)
    assert "training.seed=1 (was 0)" in message and "set restart=true" in message
    assert "\n" not in message  # one line
    assert (out / "checkpoints").is_dir()  # refused: nothing deleted


def test_restart_deletes_the_old_run_and_starts_fresh(tmp_path: Path) -> None:
    out = tmp_path / "out"
    check_rerun(out, make(tmp_path), restart=False)
    (out / "checkpoints").mkdir()
    (out / "adapter_model.safetensors").write_text("old")
    assert check_rerun(out, make(tmp_path, records="new\n"), restart=True) == "fresh"
    assert sorted(path.name for path in out.iterdir()) == [RUN_FILE]
    assert json.loads((out / RUN_FILE).read_text())["inputs"] == make(tmp_path, records="new\n")["inputs"]


def test_foreign_non_empty_directory_is_never_deleted(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "thesis.tex").write_text("precious")
    for restart in (False, True):
        with pytest.raises(RunMismatchError, match="not empty and holds no run.json"):
            check_rerun(out, make(tmp_path), restart=restart)
    assert (out / "thesis.tex").read_text() == "precious"


def test_custom_key_is_named_in_the_refusal(tmp_path: Path) -> None:
    out = tmp_path / "out"
    check_rerun(out, make(tmp_path), restart=False)
    (out / "checkpoints").mkdir()
    with pytest.raises(RunMismatchError, match="set --restart=true"):
        check_rerun(out, make(tmp_path, seed=2), restart=False, key="--restart")
