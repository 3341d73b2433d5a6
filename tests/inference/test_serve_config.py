"""`selfrag serve` settings: the engines and options of `selfrag ask`, a corpus or a prebuilt index, checked at load."""

from __future__ import annotations

import pytest

from selfrag.config import load_config
from selfrag.errors import ConfigError
from selfrag.inference.server.config import ServeConfig


def problems(*overrides: str) -> str:
    with pytest.raises(ConfigError) as error:
        load_config(ServeConfig, None, ["model=m", *overrides])
    return str(error.value)


def test_exactly_one_of_corpus_or_index() -> None:
    assert "give exactly one of corpus=FILE" in problems()
    assert "give exactly one of corpus=FILE" in problems("corpus=c.jsonl", "index=runs/index")
    assert load_config(ServeConfig, None, ["model=m", "index=runs/index"]).index is not None


def test_engine_and_engine_options_are_checked_like_ask() -> None:
    message = problems("corpus=c.jsonl", "engine=tgi")
    assert "engine" in message and "tgi" in message
    assert "engine_options.batch_size must be an integer, got 'abc'" in problems("corpus=c.jsonl",
                                                                                 "engine_options.batch_size=abc")
    assert "engine_options.batch_size must be at least 1" in problems("corpus=c.jsonl", "engine_options.batch_size=0")
    assert "did you mean" in problems("corpus=c.jsonl", "engine_options.batch_sise=4")
    config = load_config(ServeConfig, None, ["model=m", "corpus=c.jsonl", "engine=openai",
                                             "engine_options.base_url=http://127.0.0.1:9/v1"])
    assert config.engine == "openai" and config.engine_options.base_url == "http://127.0.0.1:9/v1"
