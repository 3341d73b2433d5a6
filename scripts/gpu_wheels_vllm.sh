#!/usr/bin/env bash
# vLLM for the lent GPU, in parts that travel over consecutive `run` calls (bash scripts/gpu_wheels.sh --vllm).
#
#     bash scripts/gpu_wheels.sh --vllm      # -> .whl-vllm/part-NN (<= 48 MiB each: VLLM_PART_MIB) + SHA256SUMS; the call sequence
#     bash scripts/gpu_wheels.sh --vllm --check-only   # the round trip again on the parts already there
#
# The lent machine reaches no registry and a call carries at most 64 MiB (the tracked tree, ~7 MiB, included). vllm
# 0.26.0's CUDA wheel pins torch==2.11.0 (the image's 2.11.0+cu130) and links libcudart.so.13; it is ~290 MiB. This
# downloads it and the packages its engine imports that the image lacks (VLLM_DEPS: the image has torch, triton,
# transformers, tokenizers, safetensors, huggingface-hub, peft, accelerate, numpy, pandas, pyarrow, pyyaml, requests,
# tqdm, regex, psutil, jinja2, pillow?; heavy extras vLLM imports only for features the check does not use are left
# out: torchvision/torchaudio/torchcodec, flashinfer, tilelang, cutlass-dsl, opencv, numba, opentelemetry, mcp),
# bundles them in one tar (recompressed with gzip -1 only where a sample shrinks by >= 5%: the wheels are already
# deflated), splits it, and checks here that the joined bundle's and every wheel's sha256 equal the originals and
# that the wheels install with pip --no-deps into a scratch target. gpu_check.sh joins and installs them there when
# .whl-vllm/SHA256SUMS is present (into /tmp/site beside .whl/'s wheels).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
DIR=.whl-vllm
PART=$((${VLLM_PART_MIB:-48} * 1024 * 1024))  # the tracked tree travels beside each part: 64 MiB a call in all
VLLM=vllm==0.26.0
# what vLLM's offline engine (LLM, LoRARequest, load_format=dummy) imports that the image lacks, pinned where vllm pins
VLLM_DEPS="${VLLM_DEPS:-blake3 cachetools cbor2 cloudpickle compressed-tensors==0.17.0 depyf==0.20.0 astor einops \
gguf ijson msgspec partial-json-parser py-cpuinfo pybase64 python-json-logger pyzmq sentencepiece setproctitle \
tiktoken openai-harmony prometheus_client diskcache lark==1.2.2 outlines_core==0.2.14 xgrammar==0.2.7 llguidance==1.7.6 \
mistral_common pydantic-extra-types pycountry jsonschema jsonschema-specifications referencing rpds-py watchfiles \
openai httpx2 httpcore2 truststore distro jiter httpx httpcore h11 anyio sniffio fastapi==0.136.3 starlette==1.10.0 \
pydantic pydantic-core annotated-types loguru jmespath \
typing-inspection prometheus-fastapi-instrumentator lm-format-enforcer==0.11.3 interegular ninja \
model-hosting-container-standards nvtx==0.2.15 apache-tvm-ffi==0.1.10}"
# what the lent image holds (device/KINDS.md, read 2026-11-17; versions where a session saw them)
IMAGE_HAS="absl-py accelerate==1.15.0 aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs certifi \
charset-normalizer click cloudpickle cmake colorama cuda-bindings cuda-core cuda-pathfinder cuda-toolkit einops \
filelock frozenlist fsspec h11 hf-xet httpcore httpx huggingface-hub==1.33.0 idna jinja2 markdown-it-py markupsafe \
matplotlib mdurl ml-dtypes mpmath msgpack multidict networkx ninja numba numpy==2.5.2 nvidia-cublas nvidia-cuda-cupti \
nvidia-cuda-nvrtc nvidia-cuda-runtime nvidia-cudnn-cu13 nvidia-cufft nvidia-cufile nvidia-curand nvidia-cusolver \
nvidia-cusparse nvidia-cusparselt-cu13 nvidia-ml-py nvidia-nccl-cu13 nvidia-nvjitlink nvidia-nvshmem-cu13 \
nvidia-nvtx opencv-python-headless packaging pandas peft pillow pip propcache protobuf psutil pyarrow py-cpuinfo \
pygments pyyaml regex requests rich safetensors==0.8.0 scipy sentencepiece==0.2.2 setuptools shellingham six sympy \
tiktoken==0.14.0 tokenizers==0.23.2 torch==2.11.0 torchaudio==2.11.0 torchvision==0.26.0 tqdm transformers==5.17.0 \
triton==3.6.0 typer typing-extensions urllib3 uvloop werkzeug wheel wrapt xxhash yarl zipp"
# declared by vLLM (kernels, video, tracing, servers) or its helpers but not imported by the offline engine's path;
# numpy: mistral_common asks < 2.4 where the image has 2.5.2, numba: vLLM pins 0.65.0 for n-gram speculation, the
# image has its own (both stay); pypdf: selfrag reads PDFs only when given one
UNUSED_BY_OFFLINE="anthropic mcp opentelemetry-sdk opentelemetry-api opentelemetry-exporter-otlp \
opentelemetry-semantic-conventions-ai torchcodec pynvvideocodec flashinfer-python tilelang nvidia-cudnn-frontend \
fastsafetensors nvidia-cutlass-dsl quack-kernels tokenspeed-mla humming-kernels supervisor numpy numba pypdf"
PLATFORM=(--python-version 3.12 --implementation cp --only-binary=:all:
          --platform manylinux_2_31_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64
          --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform any)
mib() { awk -v bytes="$1" 'BEGIN { printf "%.1f MiB", bytes / 1048576 }'; }
started=$(date +%s)
if [ "${1:-}" != "--check-only" ]; then
    rm -rf "$DIR" && mkdir -p "$DIR/wheels"
    # at the .venv's version where it has the package (pydantic with its own pydantic-core, ...), else the newest
    # shellcheck disable=SC2086
    read -r -a pins <<<"$("$PY" - $VLLM_DEPS <<'PIN'
import importlib.metadata as metadata, sys
pins = []
for name in sys.argv[1:]:
    try:
        pins.append(name if "==" in name else f"{name}=={metadata.version(name)}")
    except metadata.PackageNotFoundError:
        pins.append(name)
print(" ".join(pins))
PIN
)"
    echo "gpu_wheels --vllm: downloading $VLLM and ${#pins[@]} packages it imports"
    for spec in "$VLLM" "${pins[@]}"; do  # one at a time: a package missing for this platform is named, not fatal
        "$PY" -m pip download --quiet --disable-pip-version-check --no-deps "${PLATFORM[@]}" -d "$DIR/wheels" \
            "$spec" 2>&1 | grep -v "is ignored: it is neither a file nor a directory" | grep -v "^$" \
            | sed "s/^/  $spec: /" || true
    done
    (cd "$DIR/wheels" && sha256sum -- *.whl) > "$DIR/wheels.sha256"
    tar -cf "$DIR/bundle.tar" -C "$DIR/wheels" .
    rm -rf "$DIR/wheels"
    size=$(stat -c %s "$DIR/bundle.tar")
    sample=$(head -c "$PART" "$DIR/bundle.tar" | gzip -1 | wc -c)
    saved=$(awk -v a="$sample" -v b="$(( size < PART ? size : PART ))" 'BEGIN { printf "%.1f", 100 * (1 - a / b) }')
    echo "gpu_wheels --vllm: bundle $(mib "$size"); gzip -1 on its first part saves ${saved}%"
    if awk -v s="$saved" 'BEGIN { exit !(s >= 5) }'; then
        gzip -1 "$DIR/bundle.tar" && bundle="$DIR/bundle.tar.gz"
    else
        bundle="$DIR/bundle.tar"
    fi
    (cd "$DIR" && sha256sum -- "$(basename "$bundle")") > "$DIR/SHA256SUMS"
    split -b "$PART" -d -a 2 "$bundle" "$DIR/part-"
    rm -f "$bundle"
fi
# --- the round trip here, as gpu_check.sh does it there --------------------------------------------------------------
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
name=$(cut -d' ' -f3 "$DIR/SHA256SUMS")
cat "$DIR"/part-* > "$scratch/$name"
(cd "$scratch" && sha256sum --quiet -c "$OLDPWD/$DIR/SHA256SUMS") && echo "gpu_wheels --vllm: joined $name: sha256 equal"
mkdir "$scratch/wheels"
tar -xf "$scratch/$name" -C "$scratch/wheels" && rm -f "$scratch/$name"
(cd "$scratch/wheels" && sha256sum --quiet -c "$OLDPWD/$DIR/wheels.sha256") \
    && echo "gpu_wheels --vllm: $(ls "$scratch/wheels" | wc -l) wheels: every sha256 equal"
# every carried wheel's requirements met by the bundle, .whl/ or the image (device/KINDS.md's list, versions where
# seen): two lent-GPU calls were lost to an openai that imports httpx2 and an xgrammar too new for vLLM's tvm-ffi pin
"$PY" scripts/wheel_requirements.py "$scratch/wheels" $( [ -d .whl ] && echo .whl ) --have $IMAGE_HAS \
    --ignore $UNUSED_BY_OFFLINE || { echo "gpu_wheels --vllm: requirements unmet (above): fix VLLM_DEPS" >&2; exit 1; }
echo "gpu_wheels --vllm: every wheel's requirements met (bundle, .whl/, image)"
# for the image's CPython 3.12 on x86-64 (the .venv's python may differ): pip checks every wheel's tags against it
"$PY" -m pip install --quiet --disable-pip-version-check --no-deps --no-index --no-compile "${PLATFORM[@]}" \
    --target "$scratch/site" "$scratch"/wheels/*.whl
version=$(PYTHONPATH="$scratch/site" "$PY" -c "import importlib.metadata as m; print(m.version('vllm'))")
echo "gpu_wheels --vllm: installed with pip --no-deps (CPython 3.12, x86-64) into a scratch target: vllm $version, \
$(du -sm "$scratch/site" | cut -f1) MB"
echo "gpu_wheels --vllm: $(ls "$DIR"/part-* | wc -l) parts in $DIR/ ($((  $(date +%s) - started )) s):"
for part in "$DIR"/part-*; do printf "  %10d  %s\n" "$(stat -c %s "$part")" "$part"; done
# --- the call sequence --------------------------------------------------------------------------------------------
echo "Call sequence (the machine keeps carried files while warm: make the calls back to back):"
number=0
for part in "$DIR"/part-*; do
    number=$((number + 1))
    echo "  run(carry=[\"$part\"], command=\"ls -l $DIR\", timeout_s=60)          # part $number"
done
shape=$(git ls-files --others --ignored --exclude-standard configs/models/llama-3.1-8b | awk '{printf ", \"%s\"", $0}')
echo "  run(carry=[\".whl\"$shape, \"$DIR/SHA256SUMS\", \"$DIR/wheels.sha256\"], timeout_s=600,"
echo "      command=\"bash scripts/gpu_check.sh --random-init --stages vllm ... --output /tmp/gc\")   # joins, installs"
echo "  (bash scripts/gpu_wheels.sh first: .whl/ is the default set; rm -rf $DIR afterwards: ~$(du -sh "$DIR" | cut -f1))"
