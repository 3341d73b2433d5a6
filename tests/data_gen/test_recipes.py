"""Every recipe in configs/data_gen loads and validates (paths relative to the repository root exist)."""

from __future__ import annotations

from pathlib import Path

import pytest

from selfrag.config import load_config
from selfrag.data_gen.config import GenerateConfig

REPO = Path(__file__).resolve().parents[2]
RECIPES = sorted((REPO / "configs" / "data_gen").glob("*.yaml"))


@pytest.mark.parametrize("recipe", RECIPES, ids=[path.stem for path in RECIPES])
def test_recipe_loads(recipe: Path) -> None:
    config = load_config(GenerateConfig, recipe)
    assert (REPO / config.corpus).exists()
    assert config.queries is None or (REPO / config.queries).is_file()
    if config.labeler == "llm":
        assert config.teacher.model and config.teacher.api_key_env in (None, "OPENAI_API_KEY")


def test_recipes_cover_http_and_vllm_teachers() -> None:
    backends = {load_config(GenerateConfig, recipe).teacher.backend for recipe in RECIPES}
    assert {"openai", "vllm"} <= backends
