"""`selfrag eval` takes the runtime's settings as one `inference` section, as ask and serve do (issue 54): the
baselines (no_retrieval, plain_rag) read top_k, max_tokens, abstain_text and the engine from that same section, so a
setting written once applies to every mode; an eval folder that recorded top_k, max_tokens, engine and
engine_options at the top level resumes, and one that recorded other values is answered again, naming them."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest

from selfrag.config import from_dict
from selfrag.evaluation import run as run_module
from selfrag.evaluation.config import EvalConfig
from selfrag.evaluation.resume import RESUME_DIR

PASSAGES = [
    {"id": "paris", "title": "Paris", "text": "Paris is the capital of France."},
    {"id": "france", "title": "France", "text": "France's capital is Paris."},
    {"id": "lyon", "title": "Lyon", "text": "Lyon has silk."},
]
MODES = ["no_retrieval", "plain_rag", "single_pass"]


@pytest.fixture
def recorder(loaders: Any) -> Any:
    """The scripted engine behind both loaders, recording the config each was built from and every request."""
    return loaders


@pytest.fixture
def settings(tmp_path: Path) -> dict[str, Any]:
    data = tmp_path / "data.jsonl"
    rows = [{"id": f"q{i}", "question": f"What is the capital of France, {i}?", "answers": ["Paris"],
             "ctxs": PASSAGES} for i in range(4)]
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    model = tmp_path / "model"
    model.mkdir()
    (model / "selfrag.json").write_text('{"calibration": null}')
    return {"data": data, "model": str(model), "base_model": "b", "output_dir": tmp_path / "out", "modes": MODES,
            "batch_size": 2, "plots": False, "judge": {"kind": "overlap"}}


def _records(out: Path, mode: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (out / "records" / f"{mode}.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("top_k", [1, 2])
def test_the_baselines_read_top_k_max_tokens_and_the_engine_from_the_inference_section(
    top_k: int, recorder: Any, settings: dict[str, Any]
) -> None:
    inference = {"top_k": top_k, "max_tokens": 5, "abstain_text": "No idea.", "engine": "hf",
                 "engine_options": {"batch_size": 3}}
    run_module.run(from_dict(EvalConfig, {**settings, "inference": inference}))
    out = settings["output_dir"]
    # plain RAG reads inference.top_k passages (each question has 3 of its own), no retrieval none
    assert [len(row["passages"]) for row in _records(out, "plain_rag")] == [top_k] * 4
    assert all(row["passages"] == [] for row in _records(out, "no_retrieval"))
    # ... and single-pass as many branches
    assert all(len(row["passages"]) == top_k for row in _records(out, "single_pass"))
    # every decode of the baselines asks for inference.max_tokens new tokens, and its prompt offers abstain_text
    plain = recorder.requests["plain"]
    assert len(plain) == 8 and {request.max_tokens for request in plain} == {5}
    rag_prompts = [recorder.engine.tokenizer.decode(list(request.prompt_ids)) for request in plain]
    assert sum("No idea." in prompt for prompt in rag_prompts) == 4  # plain RAG's 4 prompts, not no_retrieval's
    # both models' engines were built from the one inference section: engine and engine_options
    assert {kind for kind, _ in recorder.built} == {"plain", "trained"}
    assert all((config.engine, config.engine_options.batch_size) == ("hf", 3) for _, config in recorder.built)


def _as_recorded_before_the_section(settings: dict[str, Any], top_k: int | None = None) -> dict[str, Any]:
    """A mode's recorded settings as an eval of before the inference section wrote them: top_k, max_tokens, engine
    and engine_options.* at the top level, the (untyped) inference section as given: here empty, one key."""
    old: dict[str, Any] = {"inference": {}}
    for key, value in settings.items():
        if not key.startswith("inference."):
            old[key] = value
            continue
        name = key[len("inference."):]
        if name.split(".")[0] in ("top_k", "max_tokens", "engine", "engine_options"):
            old[name] = value
    if top_k is not None:
        old["top_k"] = top_k
    return old


def _rewrite_state(out: Path, top_k: int | None = None) -> None:
    path = out / RESUME_DIR / "state.json"
    state = json.loads(path.read_text())
    for entry in state.values():
        entry["settings"] = _as_recorded_before_the_section(entry["settings"], top_k)
    path.write_text(json.dumps(state))


def test_a_folder_recorded_under_the_top_level_spellings_resumes(
    recorder: Any, settings: dict[str, Any]
) -> None:
    config = from_dict(EvalConfig, settings)
    first = run_module.run(config)
    out = settings["output_dir"]
    recorded = json.loads((out / RESUME_DIR / "state.json").read_text())["plain_rag"]["settings"]
    assert recorded["inference.top_k"] == 3 and "top_k" not in recorded  # what today records
    _rewrite_state(out)
    assert "top_k" in json.loads((out / RESUME_DIR / "state.json").read_text())["plain_rag"]["settings"]
    before = {kind: len(requests) for kind, requests in recorder.requests.items()}
    again = run_module.run(config)
    assert {kind: len(requests) for kind, requests in recorder.requests.items()} == before  # nothing decoded again
    assert again.summaries == first.summaries


def test_a_folder_recorded_with_another_top_k_under_the_old_spelling_is_answered_again(
    recorder: Any, settings: dict[str, Any], caplog: pytest.LogCaptureFixture
) -> None:
    config = from_dict(EvalConfig, settings)
    run_module.run(config)
    out = settings["output_dir"]
    _rewrite_state(out, top_k=2)  # the old run read 2 passages per question; this one reads 3
    before = len(recorder.requests["plain"])
    with caplog.at_level(logging.INFO, logger="selfrag.evaluation.resume"):
        run_module.run(config)
    assert len(recorder.requests["plain"]) == before + 8  # both baselines answered again
    assert "inference.top_k=3 (was 2)" in caplog.text
