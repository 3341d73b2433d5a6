"""Engine options are declared once (EngineOptions): the config keys, --help-config and every backend come from it."""

from __future__ import annotations

import dataclasses
import inspect
import sys
import types
from typing import Any

import pytest

pytest.importorskip("torch")

from openai_scripted_server import ScriptedServer  # noqa: E402

from selfrag.config import describe, load_config  # noqa: E402
from selfrag.errors import ConfigError  # noqa: E402
from selfrag.inference.config import InferenceConfig  # noqa: E402
from selfrag.inference.engines import EngineOptions, GenerationRequest, build_engine, load_engine  # noqa: E402
from selfrag.inference.engines import vllm as vllm_backend  # noqa: E402
from selfrag.inference.engines.hf import HFEngine  # noqa: E402
from selfrag.inference.engines.openai import OpenAIEngine  # noqa: E402
from selfrag.inference.engines.vllm import VLLMEngine  # noqa: E402

OPTION_NAMES = {spec.name for spec in dataclasses.fields(EngineOptions)}


def _change_default(monkeypatch: pytest.MonkeyPatch, name: str, value: Any) -> None:
    """As if the one line declaring ``name`` in EngineOptions said ``value``: its field (what --help-config and the
    config loader read) and the generated ``__init__``'s default."""
    names = [spec.name for spec in dataclasses.fields(EngineOptions)]
    monkeypatch.setattr(EngineOptions.__dataclass_fields__[name], "default", value)
    defaults = list(EngineOptions.__init__.__defaults__ or ())
    assert len(defaults) == len(names)
    defaults[names.index(name)] = value
    monkeypatch.setattr(EngineOptions.__init__, "__defaults__", tuple(defaults))


class _StubLLM:
    """Stands in for ``vllm.LLM`` (not installed here): records the keyword arguments it was built with."""

    built: list[dict[str, Any]] = []

    def __init__(self, **arguments: Any) -> None:
        _StubLLM.built.append(arguments)


def _stub_vllm(monkeypatch: pytest.MonkeyPatch) -> None:
    module = types.SimpleNamespace(LLM=_StubLLM, SamplingParams=lambda **kw: kw, __version__="stub")
    monkeypatch.setattr(vllm_backend, "import_vllm", lambda setting: module)
    monkeypatch.setitem(sys.modules, "vllm", None)  # _is_cpu_build's import fails: a GPU build, as on a GPU host
    _StubLLM.built.clear()


def test_no_backend_lists_an_option_of_its_own() -> None:
    for constructor in (HFEngine, HFEngine.plain, HFEngine.from_model, VLLMEngine, OpenAIEngine):
        parameters = set(inspect.signature(constructor).parameters)
        assert "options" in parameters and not parameters & OPTION_NAMES, constructor


def test_a_default_changed_in_engine_options_reaches_every_backend(  # type: ignore[no-untyped-def]
    merged_model_dir, monkeypatch
) -> None:
    model_dir = merged_model_dir(0)
    for name, value in (("seed", 7), ("batch_size", 3), ("top_logprobs", 5), ("gpu_memory_utilization", 0.5),
                        ("concurrency", 2), ("max_retries", 1)):
        _change_default(monkeypatch, name, value)
    assert "engine_options.seed (int, 7): hf/vllm/openai: seed of sampled decoding (temperature > 0)" in describe(
        InferenceConfig
    )
    configured = build_engine(load_config(InferenceConfig, None, ["engine=hf"]), model_dir)
    for hf in (HFEngine(model_dir), configured, load_engine(model_dir)):
        assert isinstance(hf, HFEngine)
        assert hf.batch_size == 3 and hf._generator.initial_seed() == 7

    _stub_vllm(monkeypatch)
    vllm = VLLMEngine(model_dir)
    [arguments] = _StubLLM.built
    assert arguments["seed"] == 7 and arguments["gpu_memory_utilization"] == 0.5
    assert arguments["dtype"] == "auto" and arguments["enforce_eager"] is False  # device=cpu is hf's, not vllm's
    sampled = GenerationRequest((1, 2), max_tokens=2, temperature=1.0, score_token_ids=(3,))
    params = vllm._sampling_params(sampled, 2)  # the stub has no logprob_token_ids: top-k from top_logprobs
    assert params["seed"] == 7 + 2 and params["logprobs"] == 5

    with ScriptedServer(HFEngine(model_dir)) as server:
        remote = OpenAIEngine(model_dir, base_url=server.url)
        assert remote.options.concurrency == 2 and remote.options.max_retries == 1
        body = remote._body(sampled, exact=False)
        assert body["seed"] == 7 and body["logprobs"] == 5


def test_a_wrong_option_is_one_line_naming_the_valid_ones() -> None:
    hf_options = "engine=hf takes device, dtype, batch_size, seed"
    with pytest.raises(ConfigError) as caught:
        HFEngine("unused", batch_sise=4)  # refused before any model is looked for
    assert caught.value.problems == [f"unknown engine option engine_options.batch_sise (did you mean batch_size?); "
                                     f"{hf_options}"]
    assert str(caught.value) == caught.value.problems[0]
    with pytest.raises(ConfigError) as caught:
        load_engine("unused", "openai", batch_size=4)
    assert caught.value.problems == [
        "engine_options.batch_size is an option of engine=hf, not of engine=openai; engine=openai takes seed, "
        "adapters, base_url, served_model, api_key_env, concurrency, timeout, max_retries, backoff, top_logprobs"
    ]
    with pytest.raises(ConfigError, match=r"^unknown engine option engine_options.colour; engine=vllm takes dtype, "):
        VLLMEngine("unused", colour="red")  # said before vLLM is imported (it is not installed here)
    with pytest.raises(ConfigError, match=r"^engine_options.batch_size must be at least 1, got 0$"):
        HFEngine.plain("unused", EngineOptions(batch_size=0))


def test_a_config_may_hold_other_backends_options(merged_model_dir) -> None:  # type: ignore[no-untyped-def]
    """One config file serves every engine=: options of another backend are ignored, not refused."""
    config = load_config(InferenceConfig, None, ["engine=hf", "engine_options.base_url=http://h:1/v1",
                                                 "engine_options.batch_size=2"])
    engine = build_engine(config, merged_model_dir(0))
    assert isinstance(engine, HFEngine) and engine.batch_size == 2
