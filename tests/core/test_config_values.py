"""Config values checked by type and range when the config loads: the exact line a user sees."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pytest

from selfrag.config import check_options, load_config, nested_problems
from selfrag.data_gen.config import GenerateConfig
from selfrag.errors import ConfigError
from selfrag.inference.config import InferenceConfig
from selfrag.training.config import TrainConfig

TRAIN_BASE = {"model": "smollm2-135m-instruct", "records": "r.jsonl", "output_dir": "out"}
GENERATE_BASE = {"passages": "c.jsonl", "queries": "q.jsonl", "output": "out"}


def problems(cls: type, overrides: list[str], path: Path | None = None, **base: object) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        load_config(cls, path, overrides, **base)
    return caught.value.problems


@pytest.mark.parametrize(
    ("cls", "override", "line"),
    [
        (
            TrainConfig,
            "training.batch_size=abc",
            "training.batch_size must be an integer, got 'abc'; e.g. training.batch_size=4",
        ),
        (
            TrainConfig,
            "training.learning_rate=abc",
            "training.learning_rate must be a number, got 'abc'; e.g. training.learning_rate=0.001",
        ),
        (
            TrainConfig,
            "training.learning_rate=nan",
            "training.learning_rate must be a finite number, got 'nan'; e.g. training.learning_rate=0.001",
        ),
        (
            TrainConfig,
            "training.learning_rate=inf",
            "training.learning_rate must be a finite number, got 'inf'; e.g. training.learning_rate=0.001",
        ),
        (
            TrainConfig,
            "training.learning_rate=-.inf",
            "training.learning_rate must be a finite number, got -inf; e.g. training.learning_rate=0.001",
        ),
        (
            TrainConfig,
            "lora.target_modules=5",
            "lora.target_modules must be a string or a list, got 5; e.g. lora.target_modules=all-linear",
        ),
        (
            TrainConfig,
            "lora.target_modules=q_proj",
            "lora.target_modules is the string 'q_proj', which PEFT reads as a regular expression over full module "
            "names and matches nothing; write a list: lora.target_modules=[q_proj]",
        ),
        (
            TrainConfig,
            "lora.target_modules=[q_proj, 3]",
            "lora.target_modules must be a string or a list, got ['q_proj', 3]; e.g. lora.target_modules=all-linear",
        ),
        (TrainConfig, "training=5", "training must be a mapping of keys, got 5; write training.KEY=VALUE"),
        (
            TrainConfig,
            "trl.warmup_steps=abc",
            "trl.warmup_steps must be a number, got 'abc'; e.g. trl.warmup_steps=0.5",
        ),
        (
            TrainConfig,
            "peft.use_rslora=maybe",
            "peft.use_rslora must be true or false, got 'maybe'; e.g. peft.use_rslora=true",
        ),
        (TrainConfig, "trl.max_lenght=5", "unknown trl option 'max_lenght'; did you mean trl.max_length?"),
        (InferenceConfig, "top_k=abc", "top_k must be an integer, got 'abc'; e.g. top_k=3"),
        (InferenceConfig, "threshold=abc", "threshold must be a number, got 'abc'; e.g. threshold=0.2"),
        (InferenceConfig, "max_tokens=abc", "max_tokens must be an integer, got 'abc'; e.g. max_tokens=64"),
        (InferenceConfig, "top_k=2.5", "top_k must be an integer, got 2.5; e.g. top_k=3"),
        (
            InferenceConfig,
            "weights.support=nan",
            "weights.support must be a finite number, got 'nan'; e.g. weights.support=1.0",
        ),
        (InferenceConfig, "mode=sometimes", "mode must be one of ['adaptive', 'always', 'never'], got 'sometimes'"),
        (InferenceConfig, "abstain_text=[a]", "abstain_text must be a string, got ['a']; e.g. abstain_text=text"),
        (GenerateConfig, "distractors=abc", "distractors must be an integer, got 'abc'; e.g. distractors=1"),
        (GenerateConfig, "limit=abc", "limit must be an integer, got 'abc'; e.g. limit=4"),
        (GenerateConfig, "split=true", "split must be one of ['train', 'test', 'all'], got True"),
    ],
)
def test_wrong_value_is_one_exact_line(cls: type, override: str, line: str) -> None:
    base = TRAIN_BASE if cls is TrainConfig else GENERATE_BASE if cls is GenerateConfig else {}
    assert problems(cls, [override], **base) == [line]


def test_a_wrong_type_is_reported_once_not_again_by_validate() -> None:
    # validate() would compare 'abc' < 1 (a TypeError) or report the default; the user sees one line per problem.
    found = problems(TrainConfig, ["training.batch_size=abc", "training.max_steps=0"], **TRAIN_BASE)
    assert found == [
        "training.batch_size must be an integer, got 'abc'; e.g. training.batch_size=4",
        "training.max_steps must be -1 (use epochs) or >= 1, got 0",
    ]


def test_all_problems_at_once_from_file_and_overrides(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("model: m\nrecords: r\n")
    found = problems(TrainConfig, ["output_dir=o", "bad key=1", "training.seed=x"], path=path)
    assert found == ["override key 'bad key' is not a dotted name like training.batch_size; write key=value"]
    found = problems(TrainConfig, ["output_dir=o", "training.seed=x", "lora.r=0", "nope=1"], path=path)
    assert found[0].startswith("unknown config key 'nope'; known keys: model, records, output_dir, ")
    assert found[1:] == [
        "lora.r must be >= 1, got 0",
        "training.seed must be an integer, got 'x'; e.g. training.seed=0",
    ]


def test_lists_and_strings_are_not_confused() -> None:
    config = load_config(TrainConfig, None, ["lora.target_modules=[q_proj, v_proj]"], **TRAIN_BASE)
    assert config.lora.target_modules == ["q_proj", "v_proj"]
    config = load_config(TrainConfig, None, ["lora.target_modules=all-linear"], **TRAIN_BASE)
    assert config.lora.target_modules == "all-linear"


def test_numbers_from_strings_and_integral_floats() -> None:
    config = load_config(InferenceConfig, None, ["threshold=1e-1", "top_k=4.0"])
    assert config.threshold == 0.1 and config.top_k == 4 and isinstance(config.top_k, int)


def test_config_file_not_utf8_is_file_line(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_bytes(b"model: m\nabstain_text: caf\xe9\n")
    assert problems(TrainConfig, [], path=path) == [
        f"{path}:2: not UTF-8 text (byte 0xe9 at column 18); "
        "save the file as UTF-8 (e.g. iconv -f latin1 -t utf-8) or remove that character"
    ]


def test_config_file_bad_yaml_is_file_line(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("model: m\nlora: {r: 4\n")
    (line,) = problems(TrainConfig, [], path=path)
    assert line.startswith(f"{path}:3: not valid YAML (") and line.endswith("); fix that line")


def test_problems_are_single_lines_and_unique() -> None:
    error = ConfigError(["a\nb", "a\nb", "c"])
    assert error.problems == ["a b", "c"]


@dataclass
class _Library:
    """Stands in for trl.SFTConfig: the fields and annotations a pass-through is checked against."""

    steps: int = 1
    rate: float | None = None
    names: list[str] | None = None
    mode: str | bool = "x"
    extra: dict = field(default_factory=dict)


def test_check_options_against_a_dataclass() -> None:
    found = check_options(
        "lib", {"steps": "many", "rate": "inf", "names": "a", "mode": 3, "extra": {"k": 1}, "stpes": 1}, _Library, {}
    )
    assert found == [
        "lib.steps must be an integer, got 'many'; e.g. lib.steps=4",
        "lib.rate must be a finite number, got 'inf'; e.g. lib.rate=0.5",
        "lib.names must be a list, got 'a'; write lib.names=[a, b]",
        "lib.mode must be a string or true/false, got 3",
        "unknown lib option 'stpes'; did you mean lib.steps?",
    ]
    assert check_options("lib", {"steps": 2, "rate": None, "names": ["a"]}, _Library, {"other": "x"}) == []
    assert check_options("lib", {"other": 1}, _Library, {"other": "lib.steps"}) == [
        "lib.other is set by this recipe; set lib.steps instead"
    ]


def test_nested_problems_for_a_config_passed_as_a_dict() -> None:
    # The quickstart's `train` and `inference` dicts: checked when the quickstart config loads, not at step 3.
    base = {"model": "m", "records": "r.jsonl", "output_dir": "o"}
    assert nested_problems(TrainConfig, {"lora": {"r": "x"}}, "train.", **base) == [
        "train.lora.r must be an integer, got 'x'; e.g. train.lora.r=16"
    ]
    assert nested_problems(InferenceConfig, {"top_k": 2}, "inference.") == []
    assert nested_problems(InferenceConfig, 5, "inference.") == [
        "inference must be a mapping of keys, got 5; write inference.KEY=VALUE"
    ]
