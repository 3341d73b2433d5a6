"""Every recipe in configs/data_gen and the transfer study's arms (studies/transfer/recipes) loads and validates
(paths relative to the repository root exist)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from selfrag.config import load_config
from selfrag.data_gen.config import GenerateConfig, TeacherEngineOptions
from selfrag.errors import ConfigError
from selfrag.inference.engines.options import EngineOptions

REPO = Path(__file__).resolve().parents[2]
RECIPES = (sorted((REPO / "configs" / "data_gen").glob("*.yaml"))
           + sorted((REPO / "studies" / "transfer" / "recipes").glob("*.yaml")))


@pytest.mark.parametrize("recipe", RECIPES, ids=[path.stem for path in RECIPES])
def test_recipe_loads(recipe: Path) -> None:
    config = load_config(GenerateConfig, recipe)
    assert (REPO / config.passages).exists()
    assert config.queries is None or (REPO / config.queries).is_file()
    if config.labeler == "llm":
        assert config.teacher.model and config.teacher.engine_options.api_key_env in ("", "OPENAI_API_KEY")


def test_recipes_cover_http_and_vllm_teachers() -> None:
    engines = {load_config(GenerateConfig, recipe).teacher.engine for recipe in RECIPES}
    assert {"openai", "vllm"} <= engines


#: every spelling the teacher's engine settings had -> the key it names now (teacher.engine, or under engine_options)
OLD_SPELLINGS = [
    ("teacher.backend=openai", "teacher.backend was removed: write teacher.engine=openai|vllm|hf"),
    ("teacher.max_concurrency=4", "teacher.max_concurrency was removed: write teacher.engine_options.concurrency "),
    ("teacher.timeout_s=5", "teacher.timeout_s was removed: write teacher.engine_options.timeout "),
    ("teacher.backoff_s=2", "teacher.backoff_s was removed: write teacher.engine_options.backoff "),
    ("teacher.engine_args={dtype: bfloat16}",
     "teacher.engine_args was removed: write teacher.engine_options.vllm_args={...} for vllm.LLM's arguments, or "
     "teacher.engine_options.dtype / teacher.engine_options.device for engine=hf"),
    *[(f"teacher.{key}={value}", f"teacher.{key} was removed: write teacher.engine_options.{key} ")
      for key, value in [("base_url", "http://127.0.0.1:9/v1"), ("api_key_env", "KEY"), ("concurrency", 4),
                         ("batch_size", 4), ("timeout", 5), ("max_retries", 1), ("backoff", 2), ("seed", 3),
                         ("dtype", "bfloat16"), ("device", "cuda")]],
    ("teacher.vllm_args={max_model_len: 4096}",
     "teacher.vllm_args.max_model_len was removed: write teacher.engine_options.vllm_args.max_model_len "),
    ("teacher.tensor_parallel_size=2",
     "unknown config key 'teacher.tensor_parallel_size': write teacher.engine_options.tensor_parallel_size "),
    ("teacher.engine=transformers", "teacher.engine=transformers is refused: write teacher.engine=hf"),
]


@pytest.mark.parametrize(("override", "line"), OLD_SPELLINGS, ids=[old.split("=")[0] for old, _ in OLD_SPELLINGS])
def test_each_old_spelling_of_the_teachers_engine_is_refused_naming_the_new_key(override: str, line: str) -> None:
    """teacher.engine and teacher.engine_options.* (the runtime's EngineOptions, one declaration): each spelling the
    teacher's engine settings had (teacher.max_concurrency, then teacher.concurrency, ...) fails in one line naming
    the key to write."""
    with pytest.raises(ConfigError) as error:
        load_config(GenerateConfig, REPO / "configs/data_gen/http-teacher.yaml", [override])
    [problem] = error.value.problems
    assert problem.startswith(line), problem


def test_the_teachers_engine_options_are_the_runtimes_with_the_teachers_defaults() -> None:
    new = ["teacher.engine=hf", "teacher.engine_options.concurrency=4", "teacher.engine_options.timeout=5",
           "teacher.engine_options.backoff=2", "teacher.engine_options.vllm_args={max_model_len: 4096}",
           "teacher.engine_options.dtype=bfloat16", "teacher.engine_options.tensor_parallel_size=2"]
    teacher = load_config(GenerateConfig, REPO / "configs/data_gen/http-teacher.yaml", new).teacher
    options = teacher.engine_options
    assert isinstance(options, EngineOptions) and teacher.engine == "hf"
    assert (options.concurrency, options.timeout, options.backoff, options.max_retries) == (4, 5.0, 2.0, 5)
    assert (options.vllm_args, options.dtype, options.device) == ({"max_model_len": 4096}, "bfloat16", "cpu")
    assert (options.tensor_parallel_size, options.api_key_env) == (2, "OPENAI_API_KEY")
    # the same keys, help and checks as the runtime's; only these defaults differ (TeacherEngineOptions says why)
    runtime, ours = dataclasses.asdict(EngineOptions()), dataclasses.asdict(TeacherEngineOptions())
    assert {name for name in runtime if runtime[name] != ours[name]} == {"api_key_env", "concurrency", "max_retries",
                                                                         "backoff"}
    assert [(spec.name, spec.metadata["help"]) for spec in dataclasses.fields(TeacherEngineOptions)] == [
        (spec.name, spec.metadata["help"]) for spec in dataclasses.fields(EngineOptions)]


@pytest.mark.parametrize(("override", "line"), [
    ("teacher.engine_options.timeout=0", "teacher.engine_options.timeout must be > 0 seconds, got 0.0; e.g. 60"),
    ("teacher.engine_options.concurrency=0", "teacher.engine_options.concurrency must be at least 1, got 0"),
    ("teacher.engine_options.api_key_env=sk-123", "teacher.engine_options.api_key_env must be the NAME of an "
                                                  "environment variable, got 'sk-123'"),
    ("teacher.engine_options.adapters={a: runs/a}", "teacher.engine_options.adapters={'a': 'runs/a'} is not read by "
                                                    "the teacher"),
    ("teacher.engine_options.top_logprobs=5", "teacher.engine_options.top_logprobs=5 is not read by the teacher"),
])
def test_the_teachers_engine_options_are_checked_as_the_runtimes(override: str, line: str) -> None:
    with pytest.raises(ConfigError) as error:
        load_config(GenerateConfig, REPO / "configs/data_gen/http-teacher.yaml", [override])
    [problem] = error.value.problems
    assert problem.startswith(line), problem
