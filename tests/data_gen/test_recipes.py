"""Every recipe in configs/data_gen and the transfer study's arms (studies/transfer/recipes) loads and validates
(paths relative to the repository root exist)."""

from __future__ import annotations

from pathlib import Path

import pytest

from selfrag.config import load_config
from selfrag.data_gen.config import GenerateConfig
from selfrag.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]
RECIPES = (sorted((REPO / "configs" / "data_gen").glob("*.yaml"))
           + sorted((REPO / "studies" / "transfer" / "recipes").glob("*.yaml")))


@pytest.mark.parametrize("recipe", RECIPES, ids=[path.stem for path in RECIPES])
def test_recipe_loads(recipe: Path) -> None:
    config = load_config(GenerateConfig, recipe)
    assert (REPO / config.passages).exists()
    assert config.queries is None or (REPO / config.queries).is_file()
    if config.labeler == "llm":
        assert config.teacher.model and config.teacher.api_key_env in (None, "OPENAI_API_KEY")


def test_recipes_cover_http_and_vllm_teachers() -> None:
    engines = {load_config(GenerateConfig, recipe).teacher.engine for recipe in RECIPES}
    assert {"openai", "vllm"} <= engines


@pytest.mark.parametrize(("override", "line"), [
    ("teacher.backend=openai", "teacher.backend was removed: write teacher.engine=openai|vllm|hf"),
    ("teacher.engine=transformers", "teacher.engine=transformers is refused: write teacher.engine=hf"),
    ("teacher.max_concurrency=4", "teacher.max_concurrency was removed: write teacher.concurrency=N"),
    ("teacher.timeout_s=5", "teacher.timeout_s was removed: write teacher.timeout=SECONDS"),
    ("teacher.backoff_s=2", "teacher.backoff_s was removed: write teacher.backoff=SECONDS"),
    ("teacher.engine_args={dtype: bfloat16}", "teacher.engine_args was removed: write teacher.vllm_args={...}"),
])
def test_the_teachers_engine_settings_are_spelled_as_engine_options(override: str, line: str) -> None:
    """teacher.engine / concurrency / timeout / backoff / vllm_args, as engine= and engine_options.* spell them; each
    old spelling is refused in one line naming the new one."""
    with pytest.raises(ConfigError) as error:
        load_config(GenerateConfig, REPO / "configs/data_gen/http-teacher.yaml", [override])
    [problem] = error.value.problems
    assert problem.startswith(line), problem
    new = ["teacher.engine=hf", "teacher.concurrency=4", "teacher.timeout=5", "teacher.backoff=2",
           "teacher.vllm_args={max_model_len: 4096}", "teacher.dtype=bfloat16"]
    teacher = load_config(GenerateConfig, REPO / "configs/data_gen/http-teacher.yaml", new).teacher
    assert (teacher.engine, teacher.concurrency, teacher.timeout, teacher.backoff) == ("hf", 4, 5.0, 2.0)
    assert (teacher.vllm_args, teacher.dtype, teacher.device) == ({"max_model_len": 4096}, "bfloat16", "cpu")
