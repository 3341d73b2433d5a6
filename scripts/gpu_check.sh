#!/usr/bin/env bash
# One command for a GPU machine. The logic is benchmarks/gpu_check.py (stages, JSON) and benchmarks/gpu_random_init.py.
#
#     bash scripts/gpu_check.sh --random-init     # no hub, no registry: the 8B shape with random weights (<= 8 min, H100)
#     bash scripts/gpu_check.sh                   # Llama-3.1-8B-Instruct from the hub, the recipe, export, vLLM parity
#     bash scripts/gpu_check.sh --stand-in 1b     # Llama-3.2-1B-Instruct (a 24 GB card or less)
#     bash scripts/gpu_check.sh --dry-run         # no CUDA needed: configs, versions, memory estimate, 8B meta counts
#     bash scripts/gpu_check.sh --random-init --device cpu --shape 1b --scale num_hidden_layers=2 ...   # CPU rehearsal
#     bash scripts/gpu_check.sh --random-init --strategies reserved --stages vllm rl \
#         --train-variants recipe packed packed-no-checkpointing packed-plan    # issue 53: the first call when lent
#
# --random-init on a machine that reaches no registry (the lent GPU): run `bash scripts/gpu_wheels.sh` here first and
# carry .whl/; this installs those wheels (pip --no-index --find-links .whl --no-deps) into /tmp/site for the image's
# python3, which already has torch, transformers, peft and accelerate. --source-digest prints the digest of the source
# that selfrag's wheel must be built from (gpu_wheels.sh records it; a stale wheel is refused). Where .whl-vllm/
# holds vLLM's parts (carried over the calls before: bash scripts/gpu_wheels.sh --vllm prints them), they are joined,
# checked against their sha256 and installed into /tmp/site too.
set -euo pipefail
cd "$(dirname "$0")/.."
source_digest() {
    find selfrag app data_gen training inference evaluation pyproject.toml -type f -not -path '*/__pycache__/*' \
        -not -name '*.pyc' | LC_ALL=C sort | xargs sha256sum | sha256sum | cut -d' ' -f1
}
dry=0; random=0; cpu=0; previous=""
for arg in "$@"; do
    case "$arg" in
        --source-digest) source_digest; exit 0 ;;
        --dry-run) dry=1 ;;
        --random-init) random=1 ;;
    esac
    [ "$previous" = "--device" ] && [ "$arg" = "cpu" ] && cpu=1
    previous="$arg"
done
export HF_HUB_OFFLINE="${HF_HUB_OFFLINE:-$random}" TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
PY=.venv/bin/python
if [ "$dry" = 1 ] || { [ "$random" = 1 ] && [ "$cpu" = 1 ]; }; then
    [ -x "$PY" ] || bash scripts/setup.sh
    exec "$PY" benchmarks/gpu_check.py "$@"
fi
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
    echo "gpu_check: no NVIDIA GPU here (nvidia-smi finds none); run it on a GPU machine, or pass --dry-run" >&2
    exit 2
fi
nvidia-smi -L
if [ "$random" = 1 ] && [ -d .whl ]; then
    if [ "$(cat .whl/selfrag-source.sha256)" != "$(source_digest)" ]; then
        echo "gpu_check: .whl/ holds a selfrag wheel of other source; run bash scripts/gpu_wheels.sh again" >&2
        exit 2
    fi
    python3 -m pip install --quiet --no-index --find-links .whl --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl
    if [ -f .whl-vllm/SHA256SUMS ]; then  # vLLM carried in parts over the previous calls (gpu_wheels.sh --vllm)
        bundle=$(cut -d' ' -f3 .whl-vllm/SHA256SUMS)
        cat .whl-vllm/part-* > "/tmp/$bundle"
        (cd /tmp && sha256sum --quiet -c "$OLDPWD/.whl-vllm/SHA256SUMS") || {
            echo "gpu_check: the joined vLLM bundle's sha256 differs: a part is missing or stale; carry them again" >&2
            exit 2; }
        rm -rf /tmp/vllm-wheels && mkdir /tmp/vllm-wheels && tar -xf "/tmp/$bundle" -C /tmp/vllm-wheels
        rm -f "/tmp/$bundle"
        (cd /tmp/vllm-wheels && sha256sum --quiet -c "$OLDPWD/.whl-vllm/wheels.sha256")
        python3 -m pip install --quiet --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
            /tmp/vllm-wheels/*.whl
        echo "gpu_check: vLLM joined from $(ls .whl-vllm/part-* | wc -l) parts (sha256 equal) and installed"
    fi
    export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
    # Seen on the lent H200 (2026-11-29), vLLM 0.26.0 from the carried parts: its sampler imports flashinfer, which is
    # not carried, unless told not to; and the LoRA engine failed saving its AOT-compiled graph (pickling), where the
    # plain one saved it. A fresh machine gains nothing from the compile cache, so it is off here (the second untested).
    python3 -c "import flashinfer" 2>/dev/null || export VLLM_USE_FLASHINFER_SAMPLER="${VLLM_USE_FLASHINFER_SAMPLER:-0}"
    export VLLM_USE_AOT_COMPILE="${VLLM_USE_AOT_COMPILE:-0}" VLLM_DISABLE_COMPILE_CACHE="${VLLM_DISABLE_COMPILE_CACHE:-1}"
    python3 -c "import importlib.metadata as m; print('gpu_check: image', {n: m.version(n) for n in \
('torch', 'transformers', 'peft', 'accelerate', 'pyarrow', 'trl', 'datasets', 'selfrag')})"
    exec python3 benchmarks/gpu_check.py "$@"
fi
# A GPU box with a registry: the CUDA torch wheel (the default index), then selfrag with the GPU extras (vLLM,
# bitsandbytes); --random-init there needs no extras.
TORCH_SPEC="${TORCH_SPEC:-torch}" bash scripts/setup.sh
[ "$random" = 1 ] || .venv/bin/python -m pip install --quiet --disable-pip-version-check -e ".[gpu]"
exec .venv/bin/python benchmarks/gpu_check.py "$@"
