"""The options vLLM is started with for rollouts: a policy built with random weights has none for vLLM to load.

Found on the lent H200 (2026-11-30): ``selfrag rl random_init=true`` with ``rollout.engine=auto`` took vLLM, which
failed at start with "Cannot find any model weights" in the 8B shape's folder (config and tokenizer only)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from selfrag.inference.engines.options import resolve_options
from selfrag.rl.policy import Policy
from selfrag.rl.vllm_rollouts import rollout_options


def _policy(random_init: bool) -> Policy:
    nothing: Any = None
    return Policy(nothing, nothing, nothing, nothing, Path("shape"), random_init)


def test_random_weights_start_vllm_with_dummy_weights() -> None:
    options = resolve_options("vllm", None, {"gpu_memory_utilization": 0.3, "max_loras": 1})
    chosen = rollout_options(_policy(True), options)
    assert chosen.vllm_args == {"load_format": "dummy"}
    assert chosen.gpu_memory_utilization == options.gpu_memory_utilization  # the rest as given
    assert options.vllm_args == {}  # the config's own options are not changed


def test_real_weights_and_a_users_load_format_are_left_as_they_are() -> None:
    options = resolve_options("vllm", None, {"vllm_args": {"load_format": "safetensors", "block_size": 32}})
    assert rollout_options(_policy(False), options) is options
    assert rollout_options(_policy(True), options).vllm_args == {"load_format": "safetensors", "block_size": 32}
