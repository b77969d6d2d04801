#!/usr/bin/env bash
# All GPU benchmarks in one go on the H200 (about 5 minutes; each step has its own limit). Outputs go to $OUT if set, else ./bench-out:
# summary.md (every bench's markdown, exit status and stderr tail, written as each bench ends) and
# bench.tgz (the JSONs and full stderr): two files, since the GPU machine's tool returns at most 8.
# Needs: python with torch, pynvml, psutil, pandas; babysit's deps on PYTHONPATH.
#   bash bench/run_gpu.sh [BEFORE_DIR]
# BEFORE_DIR: an export of the code before a change (bench/export_before.sh REV DIR); when given, the
# overhead, scale and abort benches measure it too, in the same run, beside the code now.
# Issue 26's 1,000-run figures are a separate call: python3 bench/scale.py --sizes 1000 --ticks 5
# (launching 1,000 shims takes minutes; with --before, twice that). Both codes' guard and poll rounds in the
# same minutes: python3 bench/scale_together.py --runs 1000 --before DIR (~8 min; bench/README.md, section 4).
set -u
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/bench-out}"
mkdir -p "$OUT"
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
PY="${PYTHON:-python}"
BEFORE=()
if [ $# -ge 1 ]; then BEFORE=(--before "$(cd "$1" && pwd)"); fi
run() {  # name, timeout, command...
  local name=$1 limit=$2; shift 2
  echo "== $name: $* (at ${SECONDS}s)" | tee -a "$OUT/summary.md"
  timeout "$limit" "$@" --json "$WORK/$name.json" > "$WORK/$name.md" 2> "$WORK/$name.stderr"
  echo "   exit $? (at ${SECONDS}s)" | tee -a "$OUT/summary.md"
  cat "$WORK/$name.md" >> "$OUT/summary.md"
  tail -5 "$WORK/$name.stderr" >> "$OUT/summary.md"
  tar czf "$OUT/bench.tgz" -C "$WORK" .
}
nvidia-smi > "$WORK/nvidia-smi.txt" 2>&1
run poll_cost          60 "$PY" bench/poll_cost.py --n 300 --naive-n 10
run poll_snapshot      90 "$PY" bench/poll_snapshot.py --n 300 --rounds 2 "${BEFORE[@]}"
run gpu_read_parts     60 "$PY" bench/gpu_read_parts.py --n 1000 "${BEFORE[@]}"
run logger_cost        60 "$PY" bench/logger_cost.py --babysit-only
run stdout_ingest      90 "$PY" bench/stdout_ingest.py --rate 100000 --seconds 20
run detection_latency  75 "$PY" bench/detection_latency.py --gpu --trials 1
run daemon_overhead   200 "$PY" bench/daemon_overhead.py --gpu --runs 4 --seconds 40 --warmup 10 --idle 15 "${BEFORE[@]}"
run abort_latency      70 "$PY" bench/abort_latency.py --trials 3 --no-wake-trials 0 "${BEFORE[@]}"
run scale             100 "$PY" bench/scale.py --sizes 10,100 --ticks 2 "${BEFORE[@]}"
echo "done: $OUT/summary.md, $OUT/bench.tgz"
