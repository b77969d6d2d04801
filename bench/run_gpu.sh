#!/usr/bin/env bash
# All GPU benchmarks in one go on the H200 (≤ 8 minutes). Outputs (markdown + JSON) go to $OUT if set,
# else to ./bench-out. Needs: python with torch, pynvml, psutil, pandas; babysit's deps on PYTHONPATH.
#   bash bench/run_gpu.sh [BEFORE_DIR]
# BEFORE_DIR: an export of the code before a change (bench/export_before.sh REV DIR); when given, the
# overhead, scale and abort benches measure it too, in the same run, beside the code now.
set -u
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/bench-out}"
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
PY="${PYTHON:-python}"
BEFORE=()
if [ $# -ge 1 ]; then BEFORE=(--before "$(cd "$1" && pwd)"); fi
run() {  # name, timeout, command...
  local name=$1 limit=$2; shift 2
  echo "== $name: $*" | tee -a "$OUT/summary.md"
  timeout "$limit" "$@" --json "$OUT/$name.json" > "$OUT/$name.md" 2> "$OUT/$name.stderr"
  echo "   exit $?" | tee -a "$OUT/summary.md"
  cat "$OUT/$name.md" >> "$OUT/summary.md"
}
nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1
run poll_cost          60 "$PY" bench/poll_cost.py --n 300 --naive-n 10
run detection_latency  75 "$PY" bench/detection_latency.py --gpu --trials 1
run daemon_overhead   200 "$PY" bench/daemon_overhead.py --gpu --runs 4 --seconds 40 --warmup 10 --idle 15 "${BEFORE[@]}"
run scale             100 "$PY" bench/scale.py --sizes 10,100 --ticks 2 "${BEFORE[@]}"
run abort_latency      70 "$PY" bench/abort_latency.py --trials 3 --no-wake-trials 0 "${BEFORE[@]}"
echo "done: $OUT/summary.md"
