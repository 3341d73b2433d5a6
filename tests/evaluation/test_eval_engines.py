"""`selfrag eval` and `selfrag calibrate` build their engines with inference's build_engine (issue 29, item 6).

They loaded the trained model with an hf-only loader of their own, so `engine=openai` (or vllm) could not be used
to evaluate or calibrate the model a server serves. Here both run with inference.engine=openai against a scripted
OpenAI-compatible server on loopback, backed by the hf engine over the same tiny model, and must give exactly what
engine=hf gives.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from selfrag.config import from_dict  # noqa: E402
from selfrag.errors import ConfigError  # noqa: E402
from selfrag.evaluation import calibrate  # noqa: E402
from selfrag.evaluation import run as run_module  # noqa: E402
from selfrag.evaluation.config import CalibrateConfig, EvalConfig  # noqa: E402
from selfrag.inference.engines.hf import HFEngine  # noqa: E402

SERVER = Path(__file__).resolve().parents[1] / "inference" / "openai_scripted_server.py"
CTXS = [
    {"id": "paris", "title": "Paris", "text": "Paris is the capital of France."},
    {"id": "rhine", "title": "Rhine", "text": "The Rhine is a river in the north."},
]


def scripted_server() -> Any:
    spec = importlib.util.spec_from_file_location("openai_scripted_server", SERVER)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("openai_scripted_server", module)
    spec.loader.exec_module(module)
    return module.ScriptedServer


@pytest.fixture(scope="module")
def model_dir(merged_model_dir) -> Path:  # type: ignore[no-untyped-def]
    """A tiny merged model with the reflection tokens, its weights spread so that it decodes varied tokens."""
    return merged_model_dir(11)  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("eval-engines-data") / "dev.jsonl"
    rows = [
        {"id": f"q{i}", "question": question, "answers": ["Paris"], "ctxs": CTXS, "needs_retrieval": i % 2 == 0,
         "gold_passage_ids": ["paris"]}
        for i, question in enumerate(["What is the capital of France?", "Which river is in the north?",
                                      "Name the capital.", "Where does the Rhine flow?"])
    ]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def _answers(out: Path) -> list[tuple[Any, ...]]:
    """Per question what was decided and answered (the server decodes one request at a time where hf batches them,
    so the probabilities agree to ~1e-6, not to the last bit: they are compared apart, approximately)."""
    rows = [json.loads(line) for line in (out / "records" / "single_pass.jsonl").read_text().splitlines()]
    return [(row["answer"], row["abstained"], row["retrieved"], row["cited"],
             [(step["step"], step.get("chosen")) for step in row["trace"]]) for row in rows]


def _p_retrieve(out: Path) -> list[float | None]:
    return [json.loads(line)["p_retrieve"] for line in (out / "records" / "single_pass.jsonl").read_text().splitlines()]


def test_eval_runs_on_engine_openai_and_answers_as_engine_hf(model_dir: Path, data: Path, tmp_path: Path) -> None:
    settings = {"data": data, "model": str(model_dir), "modes": ["single_pass"],
                "inference": {"max_tokens": 6, "top_k": 2}, "judge": {"kind": "critic"}, "plots": False, "show": 0}
    local = run_module.run(from_dict(EvalConfig, {**settings, "output_dir": tmp_path / "hf"}))
    with scripted_server()(HFEngine(model_dir)) as server:
        remote = run_module.run(from_dict(EvalConfig, {
            **settings, "output_dir": tmp_path / "openai",
            "inference": {**settings["inference"], "engine": "openai", "engine_options": {"base_url": server.url}},
        }))
        assert server.bodies, "eval with inference.engine=openai sent nothing to the server"
        assert all(body["model"] == "scripted-model" for body in server.bodies)
    assert _answers(tmp_path / "openai") == _answers(tmp_path / "hf")
    assert _p_retrieve(tmp_path / "openai") == pytest.approx(_p_retrieve(tmp_path / "hf"), abs=1e-5)
    assert any(retrieved for _, _, retrieved, _, _ in _answers(tmp_path / "hf"))  # passages were judged too
    metrics = ("match", "retrieval_rate", "unsupported_claim_rate", "abstain_rate")
    assert {k: remote.summaries["single_pass"].get(k) for k in metrics} == {
        k: local.summaries["single_pass"].get(k) for k in metrics}
    assert "engine: openai" in (tmp_path / "openai" / "config.yaml").read_text()  # the resolved config says so


def test_calibrate_runs_on_engine_openai_and_measures_what_engine_hf_does(
    model_dir: Path, data: Path, tmp_path: Path
) -> None:
    settings = {"data": data, "model": str(model_dir), "inference": {"max_tokens": 6, "top_k": 2}, "write": False}
    local = calibrate.run(from_dict(CalibrateConfig, {**settings, "output_dir": tmp_path / "hf"}))
    with scripted_server()(HFEngine(model_dir)) as server:
        remote = calibrate.run(from_dict(CalibrateConfig, {
            **settings, "output_dir": tmp_path / "openai",
            "inference": {**settings["inference"], "engine": "openai", "engine_options": {"base_url": server.url}},
        }))
        assert server.bodies, "calibrate with inference.engine=openai sent nothing to the server"
    values = ("threshold", "relevance_threshold", "support_bound")
    assert {k: remote.calibration[k] for k in values} == {k: local.calibration[k] for k in values}
    assert remote.calibration["measured"] == pytest.approx(local.calibration["measured"], abs=1e-5)

    def rows(out: Path) -> list[dict[str, Any]]:
        return [json.loads(line) for line in (out / "calibration-records.jsonl").read_text().splitlines()]

    for mine, theirs in zip(rows(tmp_path / "openai"), rows(tmp_path / "hf"), strict=True):
        assert mine == {**theirs, **{k: pytest.approx(theirs[k], abs=1e-5) for k in ("p_retrieve", "support")
                                      if theirs[k] is not None}}


def test_eval_refuses_base_model_modes_an_engine_cannot_load_before_anything_loads(data: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        from_dict(EvalConfig, {"data": data, "model": "m", "output_dir": tmp_path / "out",
                               "inference": {"engine": "openai"}})
    [problem] = caught.value.problems
    assert "inference.engine=openai cannot run no_retrieval, plain_rag" in problem and "drop them from modes" in problem
    assert "inference.engine=hf or vllm only" in problem
    # vllm loads a base model for the one-decode baselines (VLLMEngine.plain), not for the prompted critic
    both = {"data": data, "model": "m", "output_dir": tmp_path / "out", "inference": {"engine": "vllm"},
            "modes": ["no_retrieval", "plain_rag", "single_pass"]}
    vllm_at = {"inference": {"engine": "vllm", "engine_options": {"gpu_memory_utilization": 0.45}}}
    with pytest.raises(ConfigError) as caught:  # two vLLM engines at 0.9 of one GPU each: refused with the fix
        from_dict(EvalConfig, both)
    [problem] = caught.value.problems
    assert problem.startswith("inference.engine=vllm loads two vLLM engines here (the base model for no_retrieval, "
                              "plain_rag, and the trained model)")
    assert problem.endswith("now 0.9; set inference.engine_options.gpu_memory_utilization=0.45, or run single_pass "
                            "and the baselines in two evals")
    accepted = from_dict(EvalConfig, {**both, **vllm_at})
    assert accepted.inference.engine == "vllm"
    assert from_dict(EvalConfig, {**both, "modes": ["plain_rag"]}).modes == ["plain_rag"]
    with pytest.raises(ConfigError) as caught:
        from_dict(EvalConfig, {**both, **vllm_at, "modes": ["plain_rag", "prompted", "single_pass"]})
    [problem] = caught.value.problems
    assert problem.startswith("inference.engine=vllm cannot run prompted (") and "inference.engine=hf only" in problem
    # the engine at the top level, as eval took it once: refused naming the inference section
    with pytest.raises(ConfigError) as caught:
        from_dict(EvalConfig, {"data": data, "model": "m", "output_dir": tmp_path / "out", "modes": ["single_pass"],
                               "engine": "vllm"})
    assert caught.value.problems == ["engine was removed: write inference.engine (the runtime's settings are one "
                                     "inference section in every command)"]
