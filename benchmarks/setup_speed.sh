#!/usr/bin/env bash
# How long set-up's installs take two ways, into fresh virtual environments, in alternating order:
#   pip     : pip compiles each file's bytecode as it installs (one core)
#   compileall: pip install --no-compile, then one `python -m compileall -j 0` (every core): what scripts/setup.sh does
# Both install TORCH_SPEC (torch==2.13.0) and this checkout with the server extra, from pip's cache when it has them.
#
#     bash benchmarks/setup_speed.sh          # 2 pairs; PAIRS=4 for more
#
# Prints each install's seconds and the ratio of the medians (pip / compileall), both measured in this run.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}
PAIRS=${PAIRS:-2}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT  # a venv with torch is ~1 GB
install() {  # $1: pip | compileall; prints the seconds
    local venv="$work/venv" start end flag=""
    rm -rf "$venv"
    "$PYTHON" -m venv "$venv"
    [ "$1" = compileall ] && flag=--no-compile
    start=$(date +%s.%N)
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check $flag "$TORCH_SPEC" >/dev/null
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check $flag -e ".[server]" >/dev/null
    if [ "$1" = compileall ]; then
        "$venv/bin/python" -m compileall -q -j 0 \
            "$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" >/dev/null 2>&1 || true
    fi
    end=$(date +%s.%N)
    "$PYTHON" -c "print(round($end - $start, 1))"
}
pip_times=()
all_times=()
for pair in $(seq "$PAIRS"); do
    if [ $((pair % 2)) = 1 ]; then order="pip compileall"; else order="compileall pip"; fi
    for arm in $order; do
        seconds=$(install "$arm")
        echo "pair $pair, $arm: $seconds s"
        if [ "$arm" = pip ]; then pip_times+=("$seconds"); else all_times+=("$seconds"); fi
    done
done
"$PYTHON" - "${pip_times[*]}" "${all_times[*]}" <<'PY'
import statistics, sys
pip, compiled = ([float(x) for x in arg.split()] for arg in sys.argv[1:3])
print(f"median: pip {statistics.median(pip):.1f} s, --no-compile + compileall {statistics.median(compiled):.1f} s; "
      f"ratio {statistics.median(pip) / statistics.median(compiled):.2f}x")
PY
