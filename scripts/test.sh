#!/usr/bin/env bash
# Install everything and run the test suite (default: everything, slow real-model tests included).
#
#     bash scripts/test.sh                # all tests
#     bash scripts/test.sh -m "not slow"  # the fast suite only
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m pytest -q "$@"
