#!/usr/bin/env bash
# The wheels a lent GPU machine lacks for `bash scripts/gpu_check.sh --random-init` there, into .whl/ (git-ignored).
# That machine reaches no registry; its image has torch, transformers, peft, accelerate (and numpy, pyarrow, pandas,
# tokenizers, huggingface-hub, ...) but no trl, datasets, vllm or bitsandbytes. Whatever travels (the working tree and
# the carried .whl/) must stay under 64 MiB, so this downloads exactly what the check imports, pinned to the versions
# of .venv, with pip download --no-deps for CPython 3.12 on x86-64 (the image's), builds selfrag's own wheel from this
# tree, and checks the total.
#
#     bash scripts/gpu_wheels.sh                  # -> .whl/ and its size; exits 1 when it would not travel
#     bash scripts/gpu_wheels.sh --bitsandbytes   # also measure the bitsandbytes wheel (QLoRA) and say if it fits
#     bash scripts/gpu_wheels.sh --vllm           # vllm's CUDA wheel + what it imports that the image lacks, in parts
#
# --vllm (scripts/gpu_wheels_vllm.sh): vllm 0.26.0 (pins torch==2.11.0, the image's, and links libcudart.so.13) is
# about 290 MiB, over one call's 64 MiB, so it travels in parts of <= 48 MiB over consecutive calls (files a call
# carries stay on the machine while it is warm) and is joined there by gpu_check.sh; it prints the call sequence.
# It also builds the 8B shape's tokenizer here (configs/models/llama-3.1-8b, git-ignored, 8.5 MB): carried beside .whl/,
# the lent machine does not spend ~20 s of device time building it each call.
# Not carried: gguf and pypdf (the check converts no GGUF and reads no PDF). Run it again after changing the code: .whl/selfrag-source.sha256 records
# the tree it was built from, and gpu_check.sh refuses a stale selfrag wheel.
set -euo pipefail
cd "$(dirname "$0")/.."
LIMIT=$((64 * 1024 * 1024))
PY=.venv/bin/python
[ -x "$PY" ] || { echo "gpu_wheels: no .venv; run bash scripts/setup.sh first" >&2; exit 2; }
[ "${1:-}" = "--vllm" ] && exec bash scripts/gpu_wheels_vllm.sh "${@:2}"
# what selfrag train, the demo data stage and the runtime import that the image lacks, and what they import in turn
PACKAGES="trl datasets dill multiprocess bm25s PyStemmer blingfire"
pins=()
for name in $PACKAGES; do
    version=$("$PY" -c "import importlib.metadata as m, sys; print(m.version(sys.argv[1]))" "$name")
    pins+=("$name==$version")
done
PLATFORM=(--python-version 3.12 --implementation cp --only-binary=:all:
          --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64
          --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform any)
rm -rf .whl && mkdir -p .whl
echo "gpu_wheels: downloading ${pins[*]}"
"$PY" -m pip download --quiet --disable-pip-version-check --no-deps "${PLATFORM[@]}" -d .whl "${pins[@]}" 2>&1 \
    | grep -v "is ignored: it is neither a file nor a directory" || true
echo "gpu_wheels: building selfrag's wheel from this tree"
built=$(mktemp)
"$PY" -m pip wheel --quiet --disable-pip-version-check --no-deps --no-build-isolation -w .whl . >"$built" 2>&1 \
    || { cat "$built"; exit 1; }
rm -rf build "$built"
bash scripts/gpu_check.sh --source-digest > .whl/selfrag-source.sha256
ls -l .whl | awk 'NR > 1 {printf "  %10d  %s\n", $5, $9}'
SHAPE=configs/models/llama-3.1-8b
"$PY" -m selfrag.shapes "$SHAPE" >/dev/null
wheels=$(du -cb .whl/* | tail -1 | cut -f1)
tree=$(git ls-files -z | xargs -0 du -cb 2>/dev/null | grep total$ | awk '{s += $1} END {print s}')
shape=$(git ls-files --others --ignored --exclude-standard -z "$SHAPE" | xargs -0 du -cb | tail -1 | cut -f1)
total=$((wheels + tree + shape))
mib() { awk -v bytes="$1" 'BEGIN { printf "%.1f MiB", bytes / 1048576 }'; }
echo "gpu_wheels: .whl/ $(mib "$wheels") + tracked tree $(mib "$tree") + $SHAPE's built tokenizer $(mib "$shape") = \
$(mib "$total") (limit 64 MiB; untracked files travel too)"
# the carry list (the tool carries ignored paths; the shape folder's tracked files travel with the tree)
carry=$(git ls-files --others --ignored --exclude-standard "$SHAPE" | awk '{printf ", \"%s\"", $0}')
echo "gpu_wheels: carry [\".whl\"$carry]"
if [ "${1:-}" = "--bitsandbytes" ]; then
    bnb=$(mktemp -d)
    "$PY" -m pip download --quiet --disable-pip-version-check --no-deps "${PLATFORM[@]}" -d "$bnb" bitsandbytes 2>&1 \
        | grep -v "is ignored: it is neither a file nor a directory" || true
    size=$(du -cb "$bnb"/*.whl | tail -1 | cut -f1)
    echo -n "gpu_wheels: $(basename "$bnb"/*.whl) is $(mib "$size"): "
    if [ $((total + size)) -le $LIMIT ]; then echo "it fits beside them"; else
        echo "it does not fit beside them (QLoRA is skipped on the lent GPU)"; fi
    rm -rf "$bnb"
fi
if [ "$total" -gt "$LIMIT" ]; then
    echo "gpu_wheels: over the 64 MiB a call carries; drop a wheel or untracked files" >&2
    exit 1
fi
