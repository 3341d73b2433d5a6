"""The real entry point on the tiny 2-layer model: a few steps, then reload, export and resume."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from training_records import initial_weights, train_and_compare, training_records

from selfrag.artifacts import META_FILE, load_meta, load_trained_questions, question_key, write_calibration
from selfrag.config import load_config
from selfrag.jsonl import write_jsonl_atomic
from selfrag.loading import load_model
from selfrag.training.config import TrainConfig
from selfrag.training.dataset import split_records
from selfrag.training.export import export
from selfrag.training.model import prepare_model
from selfrag.training.run import TrainResult, run


def make_config(base: Path, records: Path, out: Path, **training: Any) -> TrainConfig:
    settings = {"learning_rate": 1e-2, "max_steps": 8, "batch_size": 4, "logging_steps": 1,
                "eval_fraction": 0.25, "max_length": 512, **training}
    return load_config(TrainConfig, model=str(base), records=str(records), output_dir=str(out),
                       training=settings, lora={"r": 4, "alpha": 8, "dropout": 0.0})


def make_full_config(base: Path, records: Path, out: Path, **training: Any) -> TrainConfig:
    config = make_config(base, records, out, **{"learning_rate": 1e-3, **training})
    config.method = "full"
    return config


@pytest.fixture(scope="module")
def trained(tiny_base_dir: Path, records_path: Path, tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    config = make_config(tiny_base_dir, records_path, tmp_path_factory.mktemp("run") / "adapter", eval_steps=4)
    initial = initial_weights(config)
    return config, initial, run(config)


def sample_ids(tokenizer: Any) -> torch.Tensor:
    return torch.tensor([tokenizer.encode("Where did the Normans live? [Retrieval]<paragraph>x</paragraph>")])


def test_loss_falls_and_only_trainable_weights_change(trained) -> None:  # type: ignore[no-untyped-def]
    config, initial, result = trained
    assert isinstance(result, TrainResult) and len(result.losses) == 8
    assert result.losses[-1]["loss"] < result.losses[0]["loss"]
    final = result.model.state_dict()
    assert set(final) == set(initial)
    lora = [name for name in final if "lora_" in name]
    rows = [name for name in final if "trainable_tokens_delta" in name]
    assert lora and rows
    for name in lora:
        assert not torch.equal(final[name], initial[name]), f"LoRA weight {name} did not change"
    for name in rows:  # (15, hidden): every new token row moved
        assert (final[name] != initial[name]).any(dim=1).all(), f"some reflection rows in {name} did not change"
    for name in set(final) - set(lora) - set(rows):  # frozen base, old and new embedding rows included
        assert torch.equal(final[name], initial[name]), f"frozen weight {name} changed"


def test_outputs_and_metrics_are_written(trained) -> None:  # type: ignore[no-untyped-def]
    config, _, result = trained
    out = Path(config.output_dir)
    for name in ("adapter_config.json", "adapter_model.safetensors", "tokenizer.json", "config.yaml"):
        assert (out / name).is_file(), name
    meta = load_meta(out)
    assert meta is not None and meta.kind == "adapter" and meta.strategy == "add" and meta.prompt_template == "chat"
    metrics = json.loads((out / "metrics.json").read_text())
    assert len(metrics["train_losses"]) == 8
    assert set(metrics["reflection_accuracy"]) == {"retrieve", "relevance", "support", "utility", "counts"}
    assert metrics["held_out_examples"] == result.held_out_examples > 0
    # judged after step 4, and not again after step 8: the last entry is the judgement after training
    during = metrics["reflection_accuracy_at_checkpoints"]
    assert [entry["step"] for entry in during] == [4, 8]
    assert during[-1]["reflection_accuracy"] == metrics["reflection_accuracy"]
    assert set(during[0]["reflection_accuracy"]) == set(metrics["reflection_accuracy"])
    # what the steps cost: tokens/s over steps 2-8 (the first is warm-up), and their peak memory
    throughput = metrics["throughput"]
    assert throughput["steps"] == 7 and throughput["input_tokens"] > 0 and throughput["tokens_per_second"] > 0
    assert throughput["first_step_seconds"] > 0 and metrics["peak_memory"]["rss_gb"] > 0.1


def test_the_model_records_the_questions_it_trained_on_not_the_held_out_ones(trained) -> None:  # type: ignore[no-untyped-def]
    config, _, _ = trained
    train, held_out = split_records(training_records(), config.training.eval_fraction, config.training.seed)
    assert train and held_out
    keys = load_trained_questions(config.output_dir)
    assert keys == {question_key(record.instruction) for record in train}
    trained_texts = {record.instruction for record in train}  # (two hand-built records share a question's text)
    held_only = {question_key(record.instruction) for record in held_out if record.instruction not in trained_texts}
    assert held_only and not keys & held_only
    assert question_key("  Who wrote  HAMLET? ") == question_key("who wrote hamlet?")  # words, case-folded


def test_adapter_reloads_with_identical_logits_and_merges(trained, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    config, _, result = trained
    model, tokenizer, meta = load_model(config.output_dir)
    ids = sample_ids(tokenizer)
    result.model.eval()
    with torch.no_grad():
        expected = result.model(input_ids=ids).logits
        torch.testing.assert_close(model(input_ids=ids).logits, expected, rtol=0, atol=1e-6)
        merged_dir = export(config.output_dir, tmp_path / "merged")
        merged, _, merged_meta = load_model(merged_dir)
        torch.testing.assert_close(merged(input_ids=ids).logits, expected, rtol=0, atol=1e-4)
    assert merged_meta.kind == "merged" and merged_meta.token_ids == meta.token_ids
    assert load_trained_questions(merged_dir) == load_trained_questions(config.output_dir)  # export carries it
    head, embed = merged.get_output_embeddings().weight, merged.get_input_embeddings().weight
    assert head.data_ptr() == embed.data_ptr()  # still tied


def all_weights(model: Any) -> dict[str, torch.Tensor]:
    return {name: value.detach().clone() for name, value in model.state_dict().items()}


def lora_weights(model: Any) -> dict[str, torch.Tensor]:
    return {name: value.detach().clone() for name, value in model.state_dict().items()
            if "lora_" in name or "trainable_tokens_delta" in name}


def test_a_bf16_run_trains_in_autocast_and_scores_and_returns_its_model_in_full_precision(
    tiny_base_dir: Path, records_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """training.bf16: the steps run in bf16 autocast, but accelerate's autocast forward is taken off the model again:
    the held-out scores during and after training and the returned model compute in fp32, as a reload does."""
    from selfrag.training import run as run_module
    from selfrag.training import trainer as trainer_module

    scored_in: list[torch.dtype] = []
    accuracy = trainer_module.reflection_accuracy

    def spying(model: Any, examples: Any, token_ids: Any) -> Any:
        with torch.no_grad():
            scored_in.append(model(input_ids=sample_ids_of(examples)).logits.dtype)
        return accuracy(model, examples, token_ids)

    monkeypatch.setattr(trainer_module, "reflection_accuracy", spying)  # during training
    monkeypatch.setattr(run_module, "reflection_accuracy", spying)  # after it
    out = tmp_path / "bf16"
    config = make_config(tiny_base_dir, records_path, out, bf16=True, eval_steps=4)
    result = run(config)
    assert result.losses[-1]["loss"] < result.losses[0]["loss"]
    assert json.loads((out / "run.json").read_text())["settings"]["training.bf16"] is True
    # after step 4, and after training (step 8's score is that one), not in bf16 autocast
    assert scored_in == [torch.float32, torch.float32]
    assert "_original_forward" not in result.model.__dict__  # no autocast left on the returned model
    model, tokenizer, _ = load_model(out)
    ids = sample_ids(tokenizer)
    result.model.eval()
    with torch.no_grad():
        torch.testing.assert_close(model(input_ids=ids).logits, result.model(input_ids=ids).logits, rtol=0, atol=1e-6)


def sample_ids_of(examples: Any) -> torch.Tensor:
    return torch.tensor([examples[0]["input_ids"]])


@pytest.mark.parametrize("order", ["length", "question_batch", "full"])
def test_interrupted_and_resumed_run_ends_with_the_same_weights(
    tiny_base_dir: Path, records_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, order: str
) -> None:
    """question_batch reads its own batch list: the resumed run must skip exactly the finished batches too.
    "full": method=full (every weight, the row steps scaled by a callback) resumes from its checkpoint too."""
    from transformers import Trainer

    settings: dict[str, Any] = {"max_steps": 4, "save_steps": 2, "batch_size": 2, "order": order}
    build = make_config
    if order == "full":
        settings.update(order="length", row_lr_multiplier=10.0)
        build = make_full_config
    reference = run(build(tiny_base_dir, records_path, tmp_path / "uninterrupted", **settings))
    config = build(tiny_base_dir, records_path, tmp_path / "interrupted", **settings)
    real_step, calls = Trainer.training_step, []

    def killed_at_step_3(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(1)
        if len(calls) == 3:  # after checkpoint-2 was written
            raise KeyboardInterrupt
        return real_step(self, *args, **kwargs)

    monkeypatch.setattr(Trainer, "training_step", killed_at_step_3)
    with pytest.raises(KeyboardInterrupt):
        run(config)
    monkeypatch.setattr(Trainer, "training_step", real_step)
    assert not (Path(config.output_dir) / "adapter_model.safetensors").exists()
    assert not (Path(config.output_dir) / "model.safetensors").exists()
    # a later checkpoint the kill cut short while it was being saved (weights begun, no trainer_state.json): the
    # rerun must resume from the newest complete one, not fail on this one
    if order != "full":  # a checkpoint holds what the adapter does: LoRA and the trained rows, not the grown matrix
        from safetensors import safe_open

        saved = Path(config.output_dir) / "checkpoints" / "checkpoint-2" / "adapter_model.safetensors"
        with safe_open(str(saved), "pt") as handle:
            keys = list(handle.keys())
        assert keys and all("lora_" in key or "trainable_tokens_delta" in key for key in keys), keys
        assert any("trainable_tokens_delta" in key for key in keys)
    partial = Path(config.output_dir) / "checkpoints" / "checkpoint-3"
    partial.mkdir()
    (partial / "adapter_model.safetensors").write_bytes(b"cut short")
    resumed = run(config)
    assert resumed.resumed_from is not None and resumed.resumed_from.endswith("checkpoint-2")
    assert [entry["step"] for entry in resumed.losses] == [1.0, 2.0, 3.0, 4.0]
    weights = lora_weights if order != "full" else all_weights
    expected, actual = weights(reference.model), weights(resumed.model)
    assert expected.keys() == actual.keys() and expected
    for name in expected:
        torch.testing.assert_close(actual[name], expected[name], rtol=0, atol=1e-6, msg=name)
    assert [entry["loss"] for entry in resumed.losses] == pytest.approx([e["loss"] for e in reference.losses])


def test_rerun_with_other_settings_or_records_is_refused_unless_restart(
    tiny_base_dir: Path, records_path: Path, tmp_path: Path
) -> None:
    from selfrag.runs import RunMismatchError

    out = tmp_path / "adapter"
    run(make_config(tiny_base_dir, records_path, out, max_steps=2))
    adapter = (out / "adapter_model.safetensors").read_bytes()
    with pytest.raises(RunMismatchError, match=r"training.learning_rate=0.02 \(was 0.01\)") as error:
        run(make_config(tiny_base_dir, records_path, out, max_steps=2, learning_rate=2e-2))
    assert "restart=true" in str(error.value)
    edited = tmp_path / "edited.jsonl"
    write_jsonl_atomic(edited, [record.to_json() for record in training_records()[:-1]])
    with pytest.raises(RunMismatchError, match=r"records: content changed"):
        run(make_config(tiny_base_dir, edited, out, max_steps=2))
    assert (out / "adapter_model.safetensors").read_bytes() == adapter  # refused: untouched
    config = make_config(tiny_base_dir, edited, out, max_steps=2)
    config.restart = True
    again = run(config)
    assert again.resumed_from is None and [entry["step"] for entry in again.losses] == [1.0, 2.0]
    assert json.loads((out / "run.json").read_text())["inputs"]["records"].startswith("sha256:")


def test_a_run_from_before_a_setting_existed_resumes_at_its_default(
    tiny_base_dir: Path, records_path: Path, tmp_path: Path
) -> None:
    """run.json written before training.bf16 existed: the same run resumes (the setting counts as its default,
    fp32); asking for bf16 there is refused, naming it."""
    from selfrag.runs import RunMismatchError

    out = tmp_path / "adapter"
    run(make_config(tiny_base_dir, records_path, out, max_steps=2))
    recorded = json.loads((out / "run.json").read_text())
    assert recorded["settings"].pop("training.bf16") is False
    (out / "run.json").write_text(json.dumps(recorded))
    again = run(make_config(tiny_base_dir, records_path, out, max_steps=2))
    assert again.already_trained  # the same run, finished
    with pytest.raises(RunMismatchError, match=r"training.bf16=True \(was False\)"):
        run(make_config(tiny_base_dir, records_path, out, max_steps=2, bf16=True))


def test_rerunning_a_finished_run_is_a_no_op_that_keeps_its_calibration(
    tiny_base_dir: Path, records_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before: the rerun resumed from the last checkpoint, stepped past max_steps, rewrote the adapter and dropped the
    calibration from selfrag.json. restart=true still trains again from the start (and says the calibration went)."""
    from selfrag.app.cli import main

    out = tmp_path / "adapter"
    run(make_config(tiny_base_dir, records_path, out, max_steps=2))
    write_calibration(out, {"threshold": 0.4, "support_bound": 0.3})
    files = {path.relative_to(out): path.read_bytes() for path in out.rglob("*") if path.is_file()}
    again = run(make_config(tiny_base_dir, records_path, out, max_steps=2))
    assert again.already_trained and again.summary().startswith("already trained:")
    assert {path.relative_to(out): path.read_bytes() for path in out.rglob("*") if path.is_file()} == files
    argv = ["train", f"model={tiny_base_dir}", f"records={records_path}", f"output_dir={out}", "lora.r=4",
            "lora.alpha=8", "lora.dropout=0.0", "training.learning_rate=0.01", "training.max_steps=2",
            "training.batch_size=4", "training.logging_steps=1", "training.eval_fraction=0.25",
            "training.max_length=512"]
    assert main(argv) == 0 and "already trained" in capsys.readouterr().out
    assert (out / META_FILE).read_bytes() == files[Path(META_FILE)]
    assert main([*argv, "restart=true"]) == 0
    assert "calibration are gone; run selfrag calibrate again" in capsys.readouterr().out
    meta = load_meta(out)
    assert meta is not None and meta.calibration is None
    history = json.loads((out / "metrics.json").read_text())
    assert history["resumed_from"] is None and [entry["step"] for entry in history["train_losses"]] == [1.0, 2.0]


def test_training_on_questions_marked_test_is_said_and_recorded(
    tiny_base_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Records of test questions (generate split=test, or made before split=all kept them out) train when given, with
    a warning; the model lists them, so eval refuses them later."""
    import dataclasses
    import logging

    records = [dataclasses.replace(record, meta={**record.meta, "split": "test"}) for record in training_records()]
    path = tmp_path / "records.jsonl"
    write_jsonl_atomic(path, [record.to_json() for record in records])
    with caplog.at_level(logging.WARNING):
        run(make_config(tiny_base_dir, path, tmp_path / "adapter", max_steps=1, eval_fraction=0.0))
    assert "training on questions marked test; calibrate and eval will refuse those questions" in caplog.text
    assert load_trained_questions(tmp_path / "adapter") == {question_key(record.instruction) for record in records}


def test_cli_refusal_is_one_line_without_traceback(
    tiny_base_dir: Path, records_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from selfrag.app.cli import main

    out = tmp_path / "adapter"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    code = main(["train", f"model={tiny_base_dir}", f"records={records_path}", f"output_dir={out}"])
    err = capsys.readouterr().err
    assert code == 2 and "not empty and holds no run.json" in err and "Traceback" not in err
    assert (out / "notes.txt").read_text() == "mine"


def reserved_base(tiny_tokenizer: Any, path: Path) -> tuple[Path, Any]:
    """A tiny untied Llama base whose tokenizer has 16 Llama-3-style reserved tokens (strategy reserved)."""
    import copy

    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = copy.deepcopy(tiny_tokenizer)
    names = [f"<|reserved_special_token_{n}|>" for n in range(16)]
    tokenizer.add_special_tokens({"extra_special_tokens": names}, replace_extra_special_tokens=False)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=False)
    LlamaForCausalLM(config).save_pretrained(str(path))
    tokenizer.save_pretrained(str(path))
    return path, tokenizer


def test_reserved_strategy_trains_and_reloads(tiny_tokenizer, records_path: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    base, tokenizer = reserved_base(tiny_tokenizer, tmp_path / "base")
    train_config = make_config(base, records_path, tmp_path / "adapter", max_steps=3)
    train_config.tokens.strategy = "reserved"
    result = run(train_config)
    model, reloaded, meta = load_model(train_config.output_dir)
    assert meta.strategy == "reserved" and len(reloaded) == len(tokenizer)
    assert min(meta.token_ids.all_ids) >= len(tiny_tokenizer)  # the reserved ids, nothing appended
    ids = sample_ids(reloaded)
    result.model.eval()
    with torch.no_grad():
        torch.testing.assert_close(model(input_ids=ids).logits, result.model(input_ids=ids).logits, rtol=0, atol=1e-6)


@pytest.mark.parametrize("which", ["records", "eval_records"])
def test_a_bad_records_file_fails_before_the_model_loads(
    tmp_path: Path, records_path: Path, monkeypatch: pytest.MonkeyPatch, which: str
) -> None:
    import selfrag.training.run as train_run
    from selfrag.errors import SelfragError

    def no_model(config: TrainConfig) -> Any:
        raise AssertionError("the model was loaded before the records were read")

    monkeypatch.setattr(train_run, "prepare_model", no_model)
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(b'{"id": "a", "instruction": "Q\xff"}\n')
    paths = {"records": records_path, "eval_records": records_path, which: bad}
    config = load_config(TrainConfig, model="m", records=str(paths["records"]), output_dir=str(tmp_path / "out"),
                         eval_records=str(paths["eval_records"]))
    with pytest.raises(SelfragError) as error:
        train_run.run(config)
    assert f"{bad}:1" in str(error.value)


# --- method: full -----------------------------------------------------------------------------------------------


def test_full_fine_tuning_trains_every_weight_and_writes_a_whole_model(
    tiny_base_dir: Path, records_path: Path, tmp_path: Path
) -> None:
    config = make_full_config(tiny_base_dir, records_path, tmp_path / "full")
    result, initial, final = train_and_compare(config)
    assert set(final) == set(initial) and not any("lora_" in name for name in final)  # the plain model, no PEFT
    for name, value in final.items():
        assert not torch.equal(value, initial[name]), f"{name} did not train"
    embedding = final["model.embed_tokens.weight"]
    token_ids = load_meta(config.output_dir).token_ids  # type: ignore[union-attr]
    rows = torch.tensor(sorted(token_ids.all_ids))
    assert (embedding[rows] != initial["model.embed_tokens.weight"][rows]).any(dim=1).all()  # every new row moved

    out = Path(config.output_dir)
    assert (out / "model.safetensors").is_file() and not (out / "adapter_config.json").exists()
    meta = load_meta(out)
    assert meta is not None and meta.kind == "merged" and meta.strategy == "add"
    assert "fine-tuned model written to" in result.summary()
    model, tokenizer, _ = load_model(out)  # loads as it stands, no base, no adapter
    ids = sample_ids(tokenizer)
    result.model.eval()
    with torch.no_grad():
        torch.testing.assert_close(model(input_ids=ids).logits, result.model(input_ids=ids).logits, rtol=0, atol=1e-6)
    from selfrag.errors import InputError

    with pytest.raises(InputError, match="needs no export"):
        export(out, tmp_path / "merged")


def test_full_fine_tuning_scales_the_reflection_rows_steps(
    tiny_base_dir: Path, records_path: Path, tmp_path: Path
) -> None:
    """row_lr_multiplier under method=full: the rows' first step is k times the plain step, nothing else differs."""
    runs = {k: run(make_full_config(tiny_base_dir, records_path, tmp_path / f"x{k}", max_steps=1,
                                    row_lr_multiplier=k)) for k in (1.0, 10.0)}
    start = prepare_model(make_full_config(tiny_base_dir, records_path, tmp_path / "start")).model.state_dict()
    token_ids = load_meta(tmp_path / "x1.0").token_ids  # type: ignore[union-attr]
    rows = torch.tensor(sorted(token_ids.all_ids))
    others = torch.ones(start["model.embed_tokens.weight"].shape[0], dtype=torch.bool)
    others[rows] = False
    plain, scaled = (runs[k].model.state_dict() for k in (1.0, 10.0))
    base_rows = start["model.embed_tokens.weight"][rows]
    plain_step = plain["model.embed_tokens.weight"][rows] - base_rows
    assert plain_step.abs().max() > 0
    torch.testing.assert_close(scaled["model.embed_tokens.weight"][rows] - base_rows, 10 * plain_step,
                               rtol=1e-4, atol=1e-7)
    torch.testing.assert_close(scaled["model.embed_tokens.weight"][others], plain["model.embed_tokens.weight"][others],
                               rtol=0, atol=1e-7)  # a step is ~1e-3 (lr); threads leave ~1e-9 of noise
    for name in plain:
        if name != "model.embed_tokens.weight" and name != "lm_head.weight":
            torch.testing.assert_close(scaled[name], plain[name], rtol=0, atol=1e-7, msg=name)


def test_full_fine_tuning_with_reserved_tokens_starts_the_rows_at_the_mean(
    tiny_tokenizer, records_path: Path, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    base, tokenizer = reserved_base(tiny_tokenizer, tmp_path / "base")
    train_config = make_full_config(base, records_path, tmp_path / "full", max_steps=2)
    train_config.tokens.strategy = "reserved"
    prepared = prepare_model(train_config)
    rows = torch.tensor(sorted(prepared.meta.token_ids.all_ids))
    known = len(tiny_tokenizer)
    for weight in (prepared.model.get_input_embeddings().weight, prepared.model.get_output_embeddings().weight):
        mean = weight[:known].mean(dim=0)
        torch.testing.assert_close(weight[rows], mean.expand(len(rows), -1))
    result = run(train_config)
    meta = load_meta(train_config.output_dir)
    assert meta is not None and meta.kind == "merged" and meta.strategy == "reserved"
    model, reloaded, _ = load_model(train_config.output_dir)
    assert len(reloaded) == len(tokenizer)
    ids = sample_ids(reloaded)
    result.model.eval()
    with torch.no_grad():
        torch.testing.assert_close(model(input_ids=ids).logits, result.model(input_ids=ids).logits, rtol=0, atol=1e-6)


@pytest.mark.parametrize("sharded", [False, True])
def test_sharded_launches_refuse_what_shards_break(sharded: bool, tiny_base_dir: Path, records_path: Path,
                                                  tmp_path: Path) -> None:
    from types import SimpleNamespace

    from selfrag.errors import ConfigError
    from selfrag.training.trainer import check_sharding

    trainer = SimpleNamespace(is_fsdp_enabled=sharded, is_deepspeed_enabled=False)
    full = make_full_config(tiny_base_dir, records_path, tmp_path / "f", row_lr_multiplier=10.0)
    plain_full = make_full_config(tiny_base_dir, records_path, tmp_path / "g")
    lora = make_config(tiny_base_dir, records_path, tmp_path / "l")
    check_sharding(trainer, "reserved", plain_full)  # full + reserved: no gradient masks, nothing to refuse
    check_sharding(trainer, "add", lora)
    if not sharded:
        check_sharding(trainer, "add", full)
        check_sharding(trainer, "reserved", lora)
        return
    with pytest.raises(ConfigError, match="row_lr_multiplier=10.0 with method=full"):
        check_sharding(trainer, "add", full)
    with pytest.raises(ConfigError, match="tokens.strategy=reserved keeps the other rows"):
        check_sharding(trainer, "reserved", lora)


def test_profile_steps_write_where_the_time_goes_without_changing_the_run(tiny_base_dir: Path, records_path: Path,  # type: ignore[no-untyped-def]
                                                                          tmp_path: Path) -> None:
    from selfrag.training.run import train_fingerprint

    config = make_config(tiny_base_dir, records_path, tmp_path / "profiled", max_steps=3, eval_fraction=0.0,
                         profile_steps=1)
    run(config)
    text = (tmp_path / "profiled" / "profile.txt").read_text()
    assert text.startswith("training.profile_steps: 1 optimizer step(s) ending at step 2")
    assert "Self CPU" in text and "aten::" in text  # the operators' table
    plain = make_config(tiny_base_dir, records_path, tmp_path / "plain", max_steps=3, eval_fraction=0.0)
    assert train_fingerprint(config)["settings"] == train_fingerprint(plain)["settings"]  # the same run, resumable
    with pytest.raises(Exception, match="profile_steps must be >= 0"):
        make_config(tiny_base_dir, records_path, tmp_path / "bad", profile_steps=-1)
