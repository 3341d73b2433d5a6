#!/usr/bin/env bash
# One command for a fresh GPU machine: install the GPU extras, train the 8B recipe (or a stand-in) for a few dozen
# steps on the shipped demo data, export, serve through vLLM, check HF-vs-vLLM parity, score the judgement AUROC.
# The logic is benchmarks/gpu_check.py; its docstring lists the stages and the JSON it writes.
#
#     bash scripts/gpu_check.sh                   # Llama-3.1-8B-Instruct, the recipe's settings, 40 steps
#     bash scripts/gpu_check.sh --stand-in 1b     # Llama-3.2-1B-Instruct (a 24 GB card or less)
#     bash scripts/gpu_check.sh --dry-run         # no CUDA needed: configs, versions, memory estimate; exits 0
set -euo pipefail
cd "$(dirname "$0")/.."
dry=0
for arg in "$@"; do [ "$arg" = "--dry-run" ] && dry=1; done
if [ "$dry" = 1 ]; then
    [ -x .venv/bin/python ] || bash scripts/setup.sh
else
    if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
        echo "gpu_check: no NVIDIA GPU here (nvidia-smi finds none); run it on a GPU machine, or pass --dry-run" >&2
        exit 2
    fi
    # The CUDA torch wheel (the default index), then selfrag with the GPU extras (vLLM, bitsandbytes).
    TORCH_SPEC="${TORCH_SPEC:-torch}" bash scripts/setup.sh
    .venv/bin/python -m pip install --quiet --disable-pip-version-check -e ".[gpu]"
fi
exec .venv/bin/python benchmarks/gpu_check.py "$@"
