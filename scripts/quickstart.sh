#!/usr/bin/env bash
# Install everything and run the quickstart: demo data -> LoRA fine-tune of SmolLM2-135M -> answers (CPU, ~11-14 min after set-up;
# prompted=true adds the prompted-critic baseline, ~7 min more).
#
#     bash scripts/quickstart.sh                 # extra key=value overrides are passed on, e.g. max_steps=5
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --quickstart   # what the quickstart runs; bash scripts/test.sh adds the rest
exec .venv/bin/selfrag quickstart "$@"
