#!/usr/bin/env bash
# Install everything and run the test suite (default: everything, slow real-model tests included) on every core:
# pytest-xdist, one worker per core (at most 8), each test file on one worker, the files with slow tests first.
#
#     bash scripts/test.sh                # all tests
#     bash scripts/test.sh -m "not slow"  # the fast suite only
#     bash scripts/test.sh -n 0 -x --pdb  # in one process (to debug; -n 0 turns the workers off)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m pytest -q -n auto --maxprocesses 8 --dist loadfile --no-loadscope-reorder "$@"
