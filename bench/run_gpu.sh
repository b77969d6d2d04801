#!/usr/bin/env bash
# All GPU benchmarks in one go on the H200 (≤ 8 minutes). Outputs (markdown + JSON) go to $OUT if set,
# else to ./bench-out. Needs: python with torch, pynvml, psutil, pandas; babysit's deps on PYTHONPATH.
#   bash bench/run_gpu.sh
set -u
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/bench-out}"
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
PY="${PYTHON:-python}"
run() {  # name, timeout, command...
  local name=$1 limit=$2; shift 2
  echo "== $name: $*" | tee -a "$OUT/summary.md"
  timeout "$limit" "$@" --json "$OUT/$name.json" > "$OUT/$name.md" 2> "$OUT/$name.stderr"
  echo "   exit $?" | tee -a "$OUT/summary.md"
  cat "$OUT/$name.md" >> "$OUT/summary.md"
}
nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1
run poll_cost          90 "$PY" bench/poll_cost.py --n 300 --naive-n 10
run detection_latency 150 "$PY" bench/detection_latency.py --gpu --trials 3
run daemon_overhead   150 "$PY" bench/daemon_overhead.py --gpu --runs 4 --seconds 100 --warmup 10
run scale             120 "$PY" bench/scale.py --sizes 10,100 --ticks 2
echo "done: $OUT/summary.md"
