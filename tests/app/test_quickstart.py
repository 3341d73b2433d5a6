"""The quickstart's whole story on the tiny fixture model: data -> CPU recipe training -> calibration -> the
evaluation (three modes, and the prompted-critic baseline when asked); a rerun keeps what did not change and redoes
what a changed setting affects."""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from selfrag.app.quickstart import QuickstartConfig, relevance_judged, run
from selfrag.config import from_dict
from selfrag.errors import SelfragError


def _config(tiny_base_dir: Path, out: Path, max_steps: int) -> QuickstartConfig:
    return from_dict(
        QuickstartConfig,
        {
            "output_dir": out,
            "model": str(tiny_base_dir),
            "max_steps": max_steps,
            "test_questions": 4,
            "dev_questions": 3,
            "show": 2,
            "min_well_formed": 0,
            "train": {"training": {"batch_size": 2, "max_length": 512, "save_steps": 1}},
            # the untrained tiny model scores every passage under 0.5: a low cut lets its branches reach an answer,
            # so the format check below has outputs to count
            "inference": {"max_tokens": 6, "relevance_threshold": 0.01},
        },
    )


def _recomputed(*args: object, **kwargs: object) -> None:
    raise AssertionError("a stage was recomputed")


def test_quickstart_end_to_end_and_rerun(
    tiny_base_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "qs"
    report = run(_config(tiny_base_dir, out, max_steps=2))

    # trained with the CPU recipe's settings (lr, LoRA rank) and the given steps
    resolved = (out / "model" / "config.yaml").read_text()
    assert "learning_rate: 0.001" in resolved and "r: 16" in resolved and "max_steps: 2" in resolved
    calibration = json.loads((out / "model" / "selfrag.json").read_text())["calibration"]
    assert 0 <= calibration["threshold"] <= 1 and calibration["dev_examples"] == 3
    assert 0 <= calibration["relevance_threshold"] <= 1 and calibration["version"] == 3
    measured = calibration["measured"]
    assert 0 <= measured["rescued_by_re_retrieval"] <= measured["re_retrieved"] <= 3
    passages_file = out / "calibration" / "calibration-passages.jsonl"
    scored = [json.loads(line) for line in passages_file.read_text().splitlines()]
    assert len(scored) == 3 * 3 and all(isinstance(p["relevant"], bool) for p in scored)  # 3 dev questions x top 3
    results = json.loads((out / "eval" / "results.json").read_text())
    assert report["eval"]["modes"] == results["modes"]
    assert set(results["modes"]) == {"no_retrieval", "plain_rag", "single_pass"}  # prompted only when asked
    assert results["modes"]["single_pass"]["examples"] == 4
    assert (out / "eval" / "quality.png").is_file() and (out / "eval" / "table.md").is_file()
    # claims are judged by a judge no mode answers with (not the trained model's own IsSUP), and the table says which
    assert results["judge"] == "overlap"
    assert "unsupported claims (judge: overlap; lower is better)" in (out / "eval" / "table.md").read_text()
    assert report["relevance_judged"] == relevance_judged(results)
    records = (out / "eval" / "records" / "single_pass.jsonl").read_text()
    stages = json.loads((out / "stages.json").read_text())
    assert all(stages[name]["finished"] for name in ("train", "calibrate", "eval"))
    # the elapsed time of each stage, printed at the end and kept in report.json
    assert list(report["stage_seconds"]) == ["model", "data", "train", "calibrate", "eval"]
    assert all(seconds >= 0 for seconds in report["stage_seconds"].values())
    assert "time per stage: model " in capsys.readouterr().out

    # the same settings again: nothing is recomputed
    run(_config(tiny_base_dir, out, max_steps=2))
    assert (out / "eval" / "records" / "single_pass.jsonl").read_text() == records
    assert json.loads((out / "stages.json").read_text()) == stages

    # the finished folder copied elsewhere (file times not kept, like `cp -r`), the original gone: kept as it is,
    # nothing trained, calibrated, answered or labelled again
    copy = tmp_path / "elsewhere" / "qs"
    shutil.copytree(out, copy, copy_function=shutil.copyfile)
    shutil.move(out, tmp_path / "gone")
    capsys.readouterr()
    with monkeypatch.context() as patched:
        for module in ("selfrag.training.run", "selfrag.evaluation.calibrate", "selfrag.evaluation.run"):
            patched.setattr(f"{module}.run", _recomputed)
        run(_config(tiny_base_dir, copy, max_steps=2))
    printed = capsys.readouterr().out
    assert "wrote 0 records now" in printed and "already trained" in printed and "redoing" not in printed
    assert json.loads((copy / "stages.json").read_text()) == stages
    assert (copy / "eval" / "records" / "single_pass.jsonl").read_text() == records
    shutil.move(tmp_path / "gone", out)

    # an unmet format target ends the run with one line naming the setting that lengthens it: the recipe sets
    # max_steps, so `epochs=2` (the old advice) would change nothing; the check recomputes nothing either
    share = report["well_formed"]["share"]
    assert share is not None and share < 1
    strict = _config(tiny_base_dir, out, max_steps=2)
    strict.min_well_formed = 1.0
    with pytest.raises(SelfragError, match=r"well-formed trajectories \(target 100%\) after 2 steps; train longer "
                                           r"\(max_steps=300\)"):
        run(strict)
    assert json.loads((out / "stages.json").read_text()) == stages

    # prompted=true adds the prompted-critic baseline and answers with it alone: the other modes' answers are kept
    with_prompted = _config(tiny_base_dir, out, max_steps=2)
    with_prompted.prompted = True
    report = run(with_prompted)
    assert set(report["eval"]["modes"]) == {"no_retrieval", "plain_rag", "prompted", "single_pass"}
    assert report["eval"]["modes"]["prompted"]["examples"] == 4
    assert (out / "eval" / "records" / "single_pass.jsonl").read_text() == records



@dataclass
class _Data:
    split: str = "train"


@dataclass
class _Train:
    records: Path
    epochs: int = 1


def test_changed_settings_redo_their_stage_and_later_ones(tmp_path: Path) -> None:
    """What a rerun with epochs=2 does: the train fingerprint changes, its outputs are cleared, and calibration
    and evaluation (whose fingerprints include it) are redone too; the data stage is kept."""
    from selfrag.app.quickstart import Stages

    model, data = tmp_path / "model", tmp_path / "data"
    stages = Stages(tmp_path)
    data_fp = stages.check("data", _Data(), {}, [data])
    data.mkdir()
    train_fp = stages.check("train", _Train(data / "records.jsonl"), {}, [model], after="data")
    calibrate_fp = stages.check("calibrate", _Data("dev"), {}, [], after="train")
    model.mkdir()  # the stage ran
    stages.done("train")
    assert stages.finished("train")

    again = Stages(tmp_path)
    assert again.check("data", _Data(), {}, [data]) == data_fp
    assert again.check("train", _Train(data / "records.jsonl"), {}, [model], after="data") == train_fp
    assert again.finished("train") and model.exists()  # unchanged: kept

    changed = again.check("train", _Train(data / "records.jsonl", epochs=2), {}, [model], after="data")
    assert changed != train_fp and not again.finished("train") and not model.exists()  # cleared, to be redone
    assert again.check("data", _Data(), {}, [data]) == data_fp and data.exists()
    assert again.check("calibrate", _Data("dev"), {}, [], after="train") != calibrate_fp  # later stages change with it
    entry = json.loads((tmp_path / "stages.json").read_text())["train"]
    assert entry["settings"]["epochs"] == 2 and entry["settings"]["records"] == "$OUTPUT/data/records.jsonl"


def _stage_configs(out: Path) -> dict[str, Any]:
    """The data, calibrate and eval configs the quickstart builds (its defaults), with their inputs."""
    from selfrag.app.quickstart import data_settings
    from selfrag.config import to_dict
    from selfrag.data_gen import DEMO_CORPUS, DEMO_QUERIES
    from selfrag.data_gen.config import GenerateConfig
    from selfrag.evaluation.config import CALIBRATED, CalibrateConfig, EvalConfig

    config = QuickstartConfig(output_dir=out)
    common = {"model": str(out / "model"), "retriever": {"corpus": DEMO_CORPUS}}
    return {
        "data": (from_dict(GenerateConfig, data_settings(config, DEMO_CORPUS, DEMO_QUERIES, out / "data", "train")),
                 {"passages": DEMO_CORPUS, "queries": DEMO_QUERIES}),
        "calibrate": (from_dict(CalibrateConfig, {
            **common, "data": out / "splits" / "dev.jsonl", "output_dir": out / "calibration",
            "inference": {**to_dict(config.inference), **dict.fromkeys(CALIBRATED)}}), {}),
        "eval": (from_dict(EvalConfig, {
            **common, "data": out / "splits" / "test.jsonl", "output_dir": out / "eval", "batch_size": 4,
            "inference": to_dict(config.inference), "judge": {"kind": "overlap"}}), {}),
    }


def _as_the_quickstart_of_before_recorded(state: dict[str, Any]) -> dict[str, Any]:
    """stages.json as a quickstart wrote it before the inference section and generate's passages= (issue 54): the
    data stage's passages an input named corpus, its further passage files a setting named more_corpora; calibrate's
    and eval's top_k, max_tokens, engine and engine_options at the top level, eval's inference the keys given (none:
    one key), calibrate's none."""
    from selfrag.inference.config import FORMER_TOP_LEVEL
    from selfrag.runs import fingerprint_digest

    state["data"]["inputs"]["corpus"] = state["data"]["inputs"].pop("passages")
    state["data"]["settings"]["more_corpora"] = state["data"]["settings"].pop("more_passages")
    for stage in ("calibrate", "eval"):
        old: dict[str, Any] = {"inference": {}} if stage == "eval" else {}
        for key, value in state[stage]["settings"].items():
            name = key.removeprefix("inference.")
            if name == key or name.split(".")[0] in FORMER_TOP_LEVEL:
                old[name] = value
        state[stage]["settings"] = old
    # each stage's digest as that quickstart computed it, from its own spelling, chained into the next stage
    for stage, after in (("data", None), ("calibrate", "data"), ("eval", "calibrate")):
        if after is not None:
            state[stage]["inputs"][after] = state[after]["fingerprint"]
        state[stage]["fingerprint"] = fingerprint_digest(
            {key: value for key, value in state[stage].items() if key not in ("fingerprint", "finished")})
    return state


def test_stages_recorded_under_the_old_spellings_are_kept(tmp_path: Path) -> None:
    """A quickstart folder of before the inference section keeps every stage: the renamed keys are read as spelled
    now (RENAMED_SETTINGS), and a kept stage's digest stays what the stages after it recorded."""
    from selfrag.app.quickstart import Stages

    configs = _stage_configs(tmp_path)
    stages = Stages(tmp_path)
    for stage, after in (("data", None), ("calibrate", "data"), ("eval", "calibrate")):
        config, inputs = configs[stage]
        stages.check(stage, config, inputs, [], after=after)
        stages.done(stage)
    path = tmp_path / "stages.json"
    recorded = json.loads(path.read_text())
    assert recorded["calibrate"]["settings"]["inference.max_tokens"] == 96 and "passages" in recorded["data"]["inputs"]
    assert recorded["data"]["settings"]["more_passages"]  # the data recipe's further sources
    path.write_text(json.dumps(_as_the_quickstart_of_before_recorded(recorded)))
    digests = {stage: entry["fingerprint"] for stage, entry in json.loads(path.read_text()).items()}

    for _ in range(2):  # and again once the entries are recorded as spelled now
        again = Stages(tmp_path)
        for stage, after in (("data", None), ("calibrate", "data"), ("eval", "calibrate")):
            config, inputs = configs[stage]
            assert again.check(stage, config, inputs, [], after=after) == digests[stage]
            assert again.finished(stage), stage
    assert "inference.top_k" in json.loads(path.read_text())["eval"]["settings"]

    # an old folder that ran with other values is redone, naming them as spelled now
    old = json.loads(path.read_text())
    old["calibrate"]["settings"]["inference.max_tokens"] = 64
    path.write_text(json.dumps(old))
    again = Stages(tmp_path)
    again.check("data", *configs["data"], [])
    again.check("calibrate", *configs["calibrate"], [], after="data")
    assert not again.finished("calibrate")


def test_a_stage_an_older_version_recorded_is_redone_never_kept(tmp_path: Path) -> None:
    """stages.json of an older version held a bare hash per stage: nothing says what it was made from, so the stage
    (and every later one) is redone, its outputs cleared, even where that entry says finished."""
    from selfrag.app.quickstart import Stages

    model = tmp_path / "model"
    model.mkdir()
    records = tmp_path / "data" / "records.jsonl"
    (tmp_path / "stages.json").write_text(json.dumps({
        "data": {"fingerprint": "0" * 16, "finished": True}, "train": {"fingerprint": "1" * 16, "finished": True},
    }))
    stages = Stages(tmp_path)
    stages.check("data", _Data(), {}, [])
    stages.check("train", _Train(records), {}, [model], after="data")
    assert not stages.finished("data") and not stages.finished("train") and not model.exists()
    assert "settings" in json.loads((tmp_path / "stages.json").read_text())["train"]  # recorded in today's format


def test_nested_extras_are_checked_when_the_config_loads(tmp_path: Path) -> None:
    """A wrong value inside train/inference/eval fails at once, each once, not minutes later at its stage."""
    import pytest

    from selfrag.errors import ConfigError

    with pytest.raises(ConfigError) as error:
        from_dict(QuickstartConfig, {
            "output_dir": tmp_path, "train": {"lora": {"r": "x"}}, "inference": {"top_k": "abc"},
            "eval": {"batch_size": "q"},
        })
    lines = str(error.value).splitlines()
    for line in ("train.lora.r must be an integer, got 'x'; e.g. train.lora.r=16",
                 "inference.top_k must be an integer, got 'abc'; e.g. inference.top_k=3",
                 "eval.batch_size must be an integer, got 'q'; e.g. eval.batch_size=1"):
        assert sum(line in text for text in lines) == 1, (line, lines)
    assert not (tmp_path / "data").exists()  # nothing ran


def test_relevance_judged_reads_the_evaluations_relevance_auroc() -> None:
    """The quickstart's verdict on its own model: learned at AUROC >= 0.7, not below, unknown without items."""
    def results(auroc: float | None, items: int) -> dict:  # type: ignore[type-arg]
        return {"reflection": {"relevance": {"auroc": auroc, "items": items}}}

    assert relevance_judged(results(0.51, 49)) == {"auroc": 0.51, "items": 49, "threshold": 0.7, "learned": False}
    assert relevance_judged(results(0.86, 49))["learned"] is True
    assert relevance_judged(results(0.7, 49))["learned"] is True
    assert relevance_judged(results(None, 0))["learned"] is None
    assert relevance_judged({})["learned"] is None
