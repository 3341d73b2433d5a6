"""`selfrag eval` resumes a killed run per batch and re-answers only the modes whose settings, data or model changed."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from selfrag.config import from_dict
from selfrag.evaluation import run as run_module
from selfrag.evaluation.config import EvalConfig
from selfrag.evaluation.resume import RESUME_DIR, AnswerStore
from selfrag.runs import run_fingerprint

PARIS = {"id": "paris", "title": "Paris", "text": "Paris is the capital of France."}
LYON = {"id": "lyon", "title": "Lyon", "text": "Lyon has silk."}
MODES = ["no_retrieval", "plain_rag", "single_pass"]


@pytest.fixture
def setup(loaders: Any, tmp_path: Path) -> tuple[Any, dict]:
    data = tmp_path / "data.jsonl"
    rows = [
        {"id": f"q{i}", "question": f"What is the capital of France, {i}?", "answers": ["Paris"], "ctxs": [LYON, PARIS]}
        for i in range(6)
    ]
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    model = tmp_path / "model"
    model.mkdir()
    (model / "selfrag.json").write_text('{"calibration": null}')
    engines = loaders
    settings = {
        "data": data,
        "model": str(model),
        "base_model": "b",
        "output_dir": tmp_path / "out",
        "modes": MODES,
        "batch_size": 2,
        "plots": False,
        "judge": {"kind": "overlap"},
    }
    return engines, settings


def answers(out: Path, mode: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (out / "records" / f"{mode}.jsonl").read_text().splitlines()]


def test_a_rerun_with_the_same_settings_decodes_nothing(setup: tuple[Any, dict]) -> None:
    engines, settings = setup
    first = run_module.run(from_dict(EvalConfig, settings))
    assert engines.counts()["trained"] > 0 and engines.counts()["plain"] == 12  # 6 questions x 2 plain modes
    before = engines.counts()
    second = run_module.run(from_dict(EvalConfig, settings))
    assert engines.counts() == before  # every mode's answers kept
    assert second.summaries == first.summaries


def test_a_changed_model_reanswers_single_pass_only(setup: tuple[Any, dict]) -> None:
    engines, settings = setup
    run_module.run(from_dict(EvalConfig, settings))
    plain_before, trained_before = engines.counts()["plain"], engines.counts()["trained"]
    # a calibration (or a retrained model) rewrites selfrag.json: single-pass answers can change, the base's cannot
    (Path(settings["model"]) / "selfrag.json").write_text('{"calibration": {"threshold": 0.7}}')
    run_module.run(from_dict(EvalConfig, settings))
    assert engines.counts()["plain"] == plain_before
    assert engines.counts()["trained"] == 2 * trained_before


def test_a_runtime_that_decodes_differently_reanswers_single_pass_only(
    setup: tuple[Any, dict], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Saved single-pass answers are the runtime's: a new BEHAVIOUR_VERSION (the same settings decoded another way)
    answers again; the base model's modes do not go through the runtime and are kept."""
    engines, settings = setup
    run_module.run(from_dict(EvalConfig, settings))
    plain_before, trained_before = engines.counts()["plain"], engines.counts()["trained"]
    run_module.run(from_dict(EvalConfig, settings))
    assert engines.counts()["trained"] == trained_before  # same version: kept
    versions = run_module.RUNTIME_VERSIONS
    monkeypatch.setattr(run_module, "RUNTIME_VERSIONS", {**versions, "single_pass": versions["single_pass"] + 1})
    run_module.run(from_dict(EvalConfig, settings))
    assert engines.counts()["plain"] == plain_before
    assert engines.counts()["trained"] == 2 * trained_before


def test_a_changed_setting_reanswers_every_mode_and_dropped_modes_leave_no_records(setup: tuple[Any, dict]) -> None:
    engines, settings = setup
    run_module.run(from_dict(EvalConfig, settings))
    out = settings["output_dir"]
    assert (out / "records" / "no_retrieval.jsonl").is_file()
    plain_before = engines.counts()["plain"]
    changed = {**settings, "inference": {"max_tokens": 32}, "modes": ["plain_rag"]}
    result = run_module.run(from_dict(EvalConfig, changed))
    assert engines.counts()["plain"] == plain_before + 6  # plain_rag again (max_tokens changed), nothing else
    assert set(result.summaries) == {"plain_rag"}
    assert not (out / "records" / "no_retrieval.jsonl").exists()  # not this run's: removed, never mixed in
    assert not (out / RESUME_DIR / "single_pass.jsonl").exists()


def test_a_killed_run_resumes_without_repeating_or_duplicating(setup: tuple[Any, dict]) -> None:
    engines, settings = setup
    engines.die_after = 4  # no_retrieval: 3 batches; plain_rag: the 1st batch, then killed in the 2nd
    with pytest.raises(engines.killed):
        run_module.run(from_dict(EvalConfig, settings))
    out = settings["output_dir"]
    assert len((out / RESUME_DIR / "plain_rag.jsonl").read_text().splitlines()) == 2
    # a kill in the middle of writing a line leaves a torn tail: it is dropped, not read as an answer
    with (out / RESUME_DIR / "plain_rag.jsonl").open("a") as handle:
        handle.write('{"id": "q2", "answ')
    engines.die_after = None
    plain_before = engines.counts()["plain"]
    run_module.run(from_dict(EvalConfig, settings))
    assert engines.counts()["plain"] - plain_before == 4  # plain_rag's last 4 questions only
    for mode in MODES:
        assert [row["id"] for row in answers(out, mode)] == [f"q{i}" for i in range(6)]


def test_a_rerun_stopped_while_answering_again_leaves_no_old_results_beside_its_settings(
    setup: tuple[Any, dict],
) -> None:
    """A changed setting answers a mode again; stopped in the middle, the folder holds this run's config.yaml and
    the modes it kept, never the old answers of the changed mode or the old results of the whole run."""
    engines, settings = setup
    run_module.run(from_dict(EvalConfig, settings))
    out = settings["output_dir"]
    assert (out / "results.json").is_file() and (out / "table.md").is_file()
    engines.calls, engines.die_after = 0, 1  # the first batch under the new setting, then killed
    changed = {**settings, "inference": {"max_tokens": 32}}  # every mode answers again
    with pytest.raises(engines.killed):
        run_module.run(from_dict(EvalConfig, changed))
    assert not (out / "results.json").exists() and not (out / "table.md").exists()
    for mode in MODES:  # killed in the first mode's answers: the later modes' old answers are gone too
        assert not (out / "records" / f"{mode}.jsonl").exists()
    assert "max_tokens: 32" in (out / "config.yaml").read_text()
    engines.die_after = None
    result = run_module.run(from_dict(EvalConfig, changed))  # the same command finishes it
    assert (out / "results.json").is_file() and list(result.summaries) == MODES
    assert [row["id"] for row in answers(out, "single_pass")] == [f"q{i}" for i in range(6)]
    engines.die_after = 0  # kept answers: nothing decodes, and nothing is removed
    run_module.run(from_dict(EvalConfig, changed))
    assert (out / "results.json").is_file() and (out / "records" / "single_pass.jsonl").is_file()


def test_a_mode_answered_again_removes_only_its_own_old_answers(setup: tuple[Any, dict]) -> None:
    """A runtime setting answers single-pass again: stopped there, the base model's kept modes keep their records."""
    engines, settings = setup
    run_module.run(from_dict(EvalConfig, settings))
    out = settings["output_dir"]
    versions = run_module.RUNTIME_VERSIONS
    engines.calls, engines.die_after = 0, 1  # single-pass's first batch, then killed
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(run_module, "RUNTIME_VERSIONS", {**versions, "single_pass": versions["single_pass"] + 1})
        with pytest.raises(engines.killed):
            run_module.run(from_dict(EvalConfig, settings))
    assert not (out / "records" / "single_pass.jsonl").exists() and not (out / "results.json").exists()
    assert (out / "records" / "plain_rag.jsonl").is_file() and (out / "records" / "no_retrieval.jsonl").is_file()


def test_a_rerun_without_labels_or_plots_leaves_none_of_the_earlier_runs(setup: tuple[Any, dict]) -> None:
    """Every answer kept, but the rerun writes no label predictions and no plots: the earlier run's are removed."""
    _, settings = setup
    out = settings["output_dir"]
    run_module.run(from_dict(EvalConfig, settings))
    for name in ("reflection.jsonl", "quality.png", "cost.png"):  # as an earlier run with labels and plots left them
        (out / name).write_text("old")
    run_module.run(from_dict(EvalConfig, settings))
    assert not any((out / name).exists() for name in ("reflection.jsonl", "quality.png", "cost.png"))
    assert (out / "results.json").is_file() and (out / "table.md").is_file()


def test_kept_answers_for_other_examples_are_not_reused(tmp_path: Path) -> None:
    store = AnswerStore(tmp_path)
    fp, other = run_fingerprint("plain_rag", {"top_k": 3}), run_fingerprint("plain_rag", {"top_k": 4})
    assert store.start("plain_rag", fp, ["a", "b"]) == []
    store.append("plain_rag", [{"id": "a"}])
    assert store.start("plain_rag", fp, ["a", "b"]) == [{"id": "a"}]
    assert store.start("plain_rag", fp, ["x", "b"]) == []  # same fingerprint, but not these examples
    assert store.start("plain_rag", other, ["a", "b"]) == []


def test_a_copied_output_folder_decodes_nothing(setup: tuple[Any, dict], tmp_path: Path) -> None:
    """The fingerprints are relative to the output folder: a copy elsewhere (``cp -r``: new file times) resumes."""
    engines, settings = setup
    first = run_module.run(from_dict(EvalConfig, settings))
    before = engines.counts()
    copy = tmp_path / "elsewhere" / "eval"
    shutil.copytree(settings["output_dir"], copy, copy_function=shutil.copyfile)  # file times not kept
    shutil.rmtree(settings["output_dir"])
    model_copy = tmp_path / "model-copy"
    shutil.copytree(settings["model"], model_copy, copy_function=shutil.copyfile)  # the model copied too
    moved = run_module.run(from_dict(EvalConfig, {**settings, "output_dir": copy, "model": str(model_copy)}))
    assert engines.counts() == before
    assert moved.summaries == first.summaries


def test_modes_an_older_version_recorded_are_answered_again(setup: tuple[Any, dict]) -> None:
    """state.json of an older version held a bare hash per mode: nothing says what made the answers, so each mode is
    answered again (never kept), and recorded in today's format."""
    engines, settings = setup
    config = from_dict(EvalConfig, settings)
    run_module.run(config)
    before = engines.counts()
    out = settings["output_dir"]
    (out / RESUME_DIR / "state.json").write_text(json.dumps({mode: {"fingerprint": "0" * 64, "finished": True}
                                                             for mode in MODES}))
    run_module.run(config)
    assert engines.counts()["plain"] == 2 * before["plain"]
    assert "settings" in json.loads((out / RESUME_DIR / "state.json").read_text())["plain_rag"]


def test_label_predictions_are_kept_until_the_model_labels_or_inference_settings_change(
    setup: tuple[Any, dict], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The label agreement's predictions are the trained model's on the labels file: a rerun that changes neither
    (nor the inference settings) reuses them instead of scoring every label again; any change scores them again."""
    from selfrag.evaluation import token_agreement

    _, settings = setup
    labels = tmp_path / "labels.jsonl"
    labels.write_text(json.dumps({"question": "q?", "passage": PARIS, "labels": {"relevance": "[Relevant]"}}) + "\n")
    settings = {**settings, "labels": labels}
    scored: list[int] = []
    real = token_agreement.predict

    def counted(engine: Any, items: Any) -> Any:
        scored.append(len(items))
        return real(engine, items)

    monkeypatch.setattr(token_agreement, "predict", counted)
    out = settings["output_dir"]
    first = run_module.run(from_dict(EvalConfig, settings))
    assert scored == [1] and first.reflection["relevance"]["items"] == 1
    # a new judge and mode list: every answer and every prediction kept, the same agreement written again
    second = run_module.run(from_dict(EvalConfig, {**settings, "modes": MODES[1:], "judge": {"kind": "critic"}}))
    assert scored == [1]
    assert second.reflection == first.reflection
    assert (out / "reflection.jsonl").read_text() and json.loads((out / "results.json").read_text())["reflection"]
    # changed labels, a changed inference setting, a changed model: each scores the labels again
    labels.write_text(labels.read_text() + json.dumps(
        {"question": "q2?", "passage": LYON, "labels": {"relevance": "[Irrelevant]"}}) + "\n")
    assert run_module.run(from_dict(EvalConfig, settings)).reflection["relevance"]["items"] == 2
    run_module.run(from_dict(EvalConfig, {**settings, "inference": {"max_tokens": 33}}))
    (Path(settings["model"]) / "selfrag.json").write_text('{"calibration": {"threshold": 0.7}}')
    run_module.run(from_dict(EvalConfig, settings))
    assert scored == [1, 2, 2, 2]
    # a cut or foreign predictions file is never read as kept predictions
    (out / RESUME_DIR / "reflection.json").write_text('{"key": ')
    run_module.run(from_dict(EvalConfig, settings))
    assert scored == [1, 2, 2, 2, 2]
