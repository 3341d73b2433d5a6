"""Run fingerprints: the same run resumes, a different one is refused with what differs, restart starts over."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from selfrag.fsutil import OWNER_FILE, write_owner
from selfrag.runs import (
    RUN_FILE,
    Ledger,
    RunMismatchError,
    Verdict,
    check_rerun,
    differences,
    directory_digest,
    file_digest,
    fingerprint_digest,
    run_fingerprint,
    setting_defaults,
    setting_renames,
)


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


def test_a_changed_input_is_named_by_its_path_which_is_never_compared(tmp_path: Path) -> None:
    # was "corpus: content changed (hash -> hash)", no path (issue 44)
    settings = {"corpus": str(tmp_path / "corpus.jsonl"), "top_k": 3}
    old = run_fingerprint("generate", settings, digests={"corpus": "sha256:" + "a" * 64})
    new = run_fingerprint("generate", settings, digests={"corpus": "sha256:" + "b" * 64})
    assert differences(old, new) == [f"corpus: content changed ({'a' * 12} -> {'b' * 12}) in {tmp_path}/corpus.jsonl"]
    assert make(tmp_path)["sources"] == {"records": str(tmp_path / "records.jsonl")}
    moved = run_fingerprint("generate", {**settings, "corpus": "b.jsonl"}, digests={"corpus": "sha256:" + "a" * 64})
    assert differences(old, moved) == [] and fingerprint_digest(old) == fingerprint_digest(moved)


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


def test_restart_starts_over_even_when_nothing_changed(tmp_path: Path) -> None:
    """The README says restart=true starts over; before, the same settings and inputs resumed instead."""
    out = tmp_path / "out"
    check_rerun(out, make(tmp_path), restart=False)
    (out / "journal.jsonl").write_text("{}\n")
    assert check_rerun(out, make(tmp_path), restart=False) == "resume"
    assert check_rerun(out, make(tmp_path), restart=True, partial=True) == "fresh"  # the early check deletes nothing
    assert (out / "journal.jsonl").is_file()
    assert check_rerun(out, make(tmp_path), restart=True) == "fresh"
    assert sorted(path.name for path in out.iterdir()) == [RUN_FILE]


def test_a_run_that_wrote_only_empty_files_does_not_block_a_corrected_rerun(tmp_path: Path) -> None:
    """A run refused on a bad input after it opened its (still empty) output files: the corrected input starts
    fresh instead of being refused as "made differently"."""
    out = tmp_path / "out"
    check_rerun(out, make(tmp_path), restart=False)
    (out / "records.jsonl").write_text("")
    assert check_rerun(out, make(tmp_path, records="fixed\n"), restart=False) == "fresh"
    (out / "records.jsonl").write_text("{}\n")
    with pytest.raises(RunMismatchError, match="records: content changed"):
        check_rerun(out, make(tmp_path, records="fixed again\n"), restart=False)


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


def test_paths_inside_the_output_are_relative_and_inputs_count_by_content(tmp_path: Path) -> None:
    out, elsewhere = tmp_path / "a" / "out", tmp_path / "b" / "out"
    for folder in (out, elsewhere):
        (folder / "data").mkdir(parents=True)
        (folder / "data" / "records.jsonl").write_text("same\n")

    def fingerprint(folder: Path) -> dict:  # type: ignore[type-arg]
        records = folder / "data" / "records.jsonl"
        settings = {"records": str(records), "model": "/models/base", "output_dir": str(folder)}
        return run_fingerprint("train", settings, {"records": records}, ignore=("output_dir",), root=folder)

    assert fingerprint(out) == fingerprint(elsewhere)  # a moved or copied folder is the same run
    assert fingerprint(out)["settings"] == {"model": "/models/base"}  # the input's path is not compared
    assert run_fingerprint("s", {"file": str(out / "x.txt")}, root=out)["settings"] == {"file": "$OUTPUT/x.txt"}
    (elsewhere / "data" / "records.jsonl").write_text("edited\n")
    assert differences(fingerprint(out), fingerprint(elsewhere))[0].startswith("records: content changed (")


def test_a_setting_the_older_run_did_not_record_counts_as_its_default() -> None:
    old = run_fingerprint("generate", {"distractors": 2})
    new = run_fingerprint("generate", {"distractors": 2, "erased_negatives": 0})
    assert differences(old, new, {"erased_negatives": 0}) == []
    assert differences(old, {**new, "settings": {"distractors": 2, "erased_negatives": 1}}, {"erased_negatives": 0}) \
        == ["erased_negatives=1 (was 0)"]
    assert differences(old, new) == ["erased_negatives=0 (was unset)"]


def test_a_setting_the_older_run_recorded_under_a_renamed_key_is_read_as_spelled_now() -> None:
    old = run_fingerprint("rl", {"reward": {"judge": "nli", "judge_model": "m"}, "rollout": {"top_k": 3}})
    new = run_fingerprint("rl", {"reward": {"judge": {"kind": "nli", "model": "m", "threshold": 0.5}}})
    renamed = {"reward.judge": "reward.judge.kind", "reward.judge_model": "reward.judge.model", "rollout.top_k": None}
    assert differences(old, new, {"reward.judge.threshold": 0.5}, renamed) == []
    assert differences(old, new, {"reward.judge.threshold": 0.7}, renamed) == ["reward.judge.threshold=0.5 (was 0.7)"]
    assert "rollout.top_k=unset (was 3)" in differences(old, new, {"reward.judge.threshold": 0.5})


def test_a_section_renamed_renames_every_key_under_it_and_inputs_are_renamed_alike() -> None:
    """eval recorded engine_options.* at the top level before the inference section; generate's passages input was
    its corpus: a key ending in ``.`` renames every key under it, and an input is read as its setting is renamed."""
    old = run_fingerprint("plain_rag", {"top_k": 3, "engine_options": {"device": "cpu", "dtype": "auto"},
                                        "inference": {}}, digests={"corpus": "sha256:" + "a" * 64})
    new = run_fingerprint("plain_rag", {"inference": {"top_k": 3, "engine_options": {"device": "cpu", "dtype": "auto"},
                                                      "mode": "adaptive"}}, digests={"passages": "sha256:" + "a" * 64})
    renamed = {"top_k": "inference.top_k", "engine_options.": "inference.engine_options.", "inference": None,
               "corpus": "passages"}
    defaults = {"inference.mode": "adaptive"}
    assert differences(old, new, defaults, renamed) == []
    moved = {**new, "settings": {**new["settings"], "inference.engine_options.device": "cuda"},
             "inputs": {"passages": "sha256:" + "b" * 64}}
    assert differences(old, moved, defaults, renamed) == [
        "passages: content changed (aaaaaaaaaaaa -> bbbbbbbbbbbb)",
        "inference.engine_options.device='cuda' (was 'cpu')",
    ]
    assert "inference.top_k=3 (was unset)" in differences(old, new, defaults)  # without the renames: a change


@pytest.mark.parametrize("stage", ["rl", "generate", "eval", "calibrate"])
def test_each_renamed_setting_names_a_setting_of_its_config(stage: str) -> None:
    from selfrag.data_gen.config import GenerateConfig
    from selfrag.evaluation.config import CalibrateConfig, EvalConfig
    from selfrag.rl.config import RLConfig

    cls = {"rl": RLConfig, "generate": GenerateConfig, "eval": EvalConfig, "calibrate": CalibrateConfig}[stage]
    defaults = setting_defaults(cls)
    renamed = setting_renames(cls)
    assert renamed and all(key not in defaults for key in renamed)
    # a renamed key names a setting now; a renamed section (ending in '.') the prefix of some
    assert all(now is None or now in defaults or now.endswith(".") and any(key.startswith(now) for key in defaults)
               for now in renamed.values())


def test_the_owner_file_is_not_work_and_survives_a_restart(tmp_path: Path) -> None:
    out = tmp_path / "out"
    write_owner(out, "train")
    assert check_rerun(out, make(tmp_path), restart=False) == "fresh"  # claimed, but empty of work
    assert check_rerun(out, make(tmp_path, seed=3), restart=False) == "fresh"  # only bookkeeping: starts over
    (out / "adapter.bin").write_text("work")
    assert check_rerun(out, make(tmp_path, seed=4), restart=True) == "fresh"
    assert sorted(path.name for path in out.iterdir()) == [OWNER_FILE, RUN_FILE]


def test_a_fingerprint_an_older_version_wrote_is_refused_in_one_line_never_resumed(tmp_path: Path) -> None:
    """The same settings and inputs under another fingerprint version (an older selfrag's) are not resumed: one line
    naming the version and the fix; ``restart=true`` deletes the old run and starts over."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "records.jsonl").write_text("done\n")
    (out / RUN_FILE).write_text(json.dumps({**make(tmp_path), "version": 1}))
    with pytest.raises(RunMismatchError) as refused:
        check_rerun(out, make(tmp_path), restart=False)
    message = str(refused.value)
    assert "\n" not in message and "fingerprint version 1 of an older selfrag" in message
    assert "set restart=true to delete it and start over" in message
    assert (out / "records.jsonl").read_text() == "done\n"  # nothing deleted
    assert check_rerun(out, make(tmp_path), restart=True) == "fresh"
    assert not (out / "records.jsonl").exists() and json.loads((out / RUN_FILE).read_text())["version"] == 2


def test_ledger_keeps_same_and_redoes_changed_or_an_older_versions_entry(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "stages.json")
    first = run_fingerprint("train", {"epochs": 1})
    assert ledger.check("train", first).state == "new"
    ledger.finish("train")
    again = Ledger(tmp_path / "stages.json")
    assert again.check("train", first) == Verdict("same", finished=True)
    changed = again.check("train", run_fingerprint("train", {"epochs": 2}))
    assert changed.state == "changed" and changed.changes == ["epochs=2 (was 1)"] and not again.finished("train")
    # an older version's entry (a bare hash, marked finished) is redone, never kept
    (tmp_path / "stages.json").write_text(json.dumps({"train": {"fingerprint": "abc", "finished": True}}))
    older = Ledger(tmp_path / "stages.json").check("train", first)
    assert older == Verdict("changed", ["recorded by an older selfrag"])
    assert not Ledger(tmp_path / "stages.json").finished("train")


def test_directory_digest_follows_content_not_file_times(tmp_path: Path) -> None:
    model = tmp_path / "model"
    (model / "checkpoints").mkdir(parents=True)
    (model / "adapter.safetensors").write_bytes(b"weights")
    (model / "checkpoints" / "step-1").write_text("skipped")
    before = directory_digest(model, skip=("checkpoints",))
    os.utime(model / "adapter.safetensors", (1, 1))
    (model / "checkpoints" / "step-2").write_text("skipped too")
    assert directory_digest(model, skip=("checkpoints",)) == before
    (model / "adapter.safetensors").write_bytes(b"retrained")
    assert directory_digest(model, skip=("checkpoints",)) != before
