#!/usr/bin/env bash
# Full verification and a short benchmark in one call on the nvidia-h200-x2
# kind (device runs 6-8 of 2026-11-30 used this layout; ~510 s):
#   build (editable install), then side by side
#   GPU 0: the benchmark's short rows and the timeline, then 70% of test_gpu.py
#   GPU 1: the three sanitizers on sanitize_cases.py and the SASS check, the
#          other test files without their CPU-only cases (CI runs those),
#          then the other 30% of test_gpu.py
#   then tests/test_multi_device.py with both GPUs visible.
# BUDGET_S (default 500) after the start, whatever still runs is stopped, so
# that the logs are packed inside the call's time limit; everything lands in
# $OUT/verify.tar (the device tool returns few files) and the summaries are
# printed last. BENCH_ROWS overrides the benchmark rows.
set -u -o pipefail
cd "$(dirname "$0")/.."
FINAL=${OUT:-$PWD/device_out}
export OUT=$FINAL/work
mkdir -p "$OUT"
start=$(date +%s)
check=benchmarks/device_check.sh
rows=${BENCH_ROWS:-b1_l1k,b1_l8k,h1_b8_l8k,b4_l8k,b1_l32k,swa128_b1_l8k,swa128_b16_l8k,swa128_b64_l8k,swa128_b256_l8k}
bash $check build >/dev/null 2>&1
if grep -q "build ok" "$OUT/summary-build.txt"; then
  deadline=$(( start + ${BUDGET_S:-500} ))
  # test_gpu.py's node ids, 7 of every 10 to GPU 0 (its grid is the slow part).
  python3 -m pytest --collect-only -q -p no:cacheprovider tests/test_gpu.py 2>/dev/null |
    grep "::" >"$OUT/gpu_ids.txt"
  awk 'NR % 10 < 7' "$OUT/gpu_ids.txt" | tr '\n' ' ' >"$OUT/gpu_a.txt"
  awk 'NR % 10 >= 7' "$OUT/gpu_ids.txt" | tr '\n' ' ' >"$OUT/gpu_b.txt"
  {
    CUDA_VISIBLE_DEVICES=0 BENCH_ARGS="--no-plot --impls flint --rows $rows" bash $check bench timeline
    CUDA_VISIBLE_DEVICES=0 RUN_TAG=gpu0_ TEST_PATHS="$(cat "$OUT/gpu_a.txt")" bash $check tests
  } >"$OUT/gpu0.out" 2>&1 &
  gpu0=$!
  {
    CUDA_VISIBLE_DEVICES=1 SANITIZE_SUBSET=0 bash $check sanitize sass
    CUDA_VISIBLE_DEVICES=1 RUN_TAG=gpu1o_ TEST_PATHS="tests --ignore=tests/test_gpu.py" \
      PYTEST_ARGS='-k not(cpu)' bash $check tests
    CUDA_VISIBLE_DEVICES=1 RUN_TAG=gpu1_ TEST_PATHS="$(cat "$OUT/gpu_b.txt")" bash $check tests
  } >"$OUT/gpu1.out" 2>&1 &
  gpu1=$!
  ( sleep $(( deadline - $(date +%s) )); echo "deadline: stopping what still runs" | tee -a "$OUT/gpu0.out" >>"$OUT/gpu1.out"
    pkill -f compute-sanitizer; pkill -f pytest; pkill -f bench_decode ) &
  watchdog=$!
  wait $gpu0 $gpu1
  kill $watchdog 2>/dev/null
  RUN_TAG=both_ TEST_PATHS=tests/test_multi_device.py PYTEST_WORKERS=1 bash $check tests >"$OUT/both.out" 2>&1
else
  tar -C "$OUT" -xOf "$OUT/logs-build.tar" build.log | tail -30
fi
tar -C "$OUT" -cf "$FINAL/verify.tar" .
echo "==== summaries"; for f in "$OUT"/summary-*.txt; do echo "-- $(basename "$f")"; tail -n +3 "$f"; done
grep -E '^\| (b|h|swa)[0-9]' "$OUT/gpu0.out" | head -12
