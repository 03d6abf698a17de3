#!/usr/bin/env bash
# A check of one kernel change in one call on the nvidia-h200-x2 kind (~5
# minutes), when a full device_verify_x2.sh does not fit the device time left:
#   build, then side by side
#   GPU 0: the benchmark (BENCH_ROWS) and the timeline, then the GPU cases of
#          QUICK_FILES (default: the kernel-variant, timeline, correctness
#          and PDL/cluster test files)
#   GPU 1: the three sanitizers on sanitize_cases.py and the SASS check, then
#          the test_gpu.py cases whose node ids match QUICK_GPU_GREP (an
#          extended regex; default: every grid case)
# BUDGET_S (default 330) after the start whatever still runs is stopped;
# everything lands in $OUT/quick.tar, the summaries print last.
set -u -o pipefail
cd "$(dirname "$0")/.."
FINAL=${OUT:-$PWD/device_out}
export OUT=$FINAL/work
mkdir -p "$OUT"
start=$(date +%s)
check=benchmarks/device_check.sh
rows=${BENCH_ROWS:-b1_l1k,b1_l8k,h1_b8_l8k,swa128_b1_l8k,swa128_b16_l8k,swa128_b64_l8k,swa128_b256_l8k}
files=${QUICK_FILES:-tests/test_kernel_variants.py tests/test_timeline.py tests/test_correctness.py tests/test_pdl_cluster.py}
bash $check build >/dev/null 2>&1
if grep -q "build ok" "$OUT/summary-build.txt"; then
  deadline=$(( start + ${BUDGET_S:-330} ))
  python3 -m pytest --collect-only -q -p no:cacheprovider tests/test_gpu.py 2>/dev/null |
    grep "::" | grep -E "${QUICK_GPU_GREP:-test_gpu_grid}" | tr '\n' ' ' >"$OUT/gpu_ids.txt"
  {
    CUDA_VISIBLE_DEVICES=0 BENCH_ARGS="--no-plot --impls flint --rows $rows" bash $check bench timeline
    CUDA_VISIBLE_DEVICES=0 RUN_TAG=gpu0_ TEST_PATHS="$files" PYTEST_ARGS='-k not(cpu)' bash $check tests
  } >"$OUT/gpu0.out" 2>&1 &
  gpu0=$!
  {
    CUDA_VISIBLE_DEVICES=1 SANITIZE_SUBSET=0 bash $check sanitize sass
    CUDA_VISIBLE_DEVICES=1 RUN_TAG=gpu1_ TEST_PATHS="$(cat "$OUT/gpu_ids.txt")" bash $check tests
  } >"$OUT/gpu1.out" 2>&1 &
  gpu1=$!
  ( sleep $(( deadline - $(date +%s) )); echo "deadline: stopping what still runs" | tee -a "$OUT/gpu0.out" >>"$OUT/gpu1.out"
    pkill -f compute-sanitizer; pkill -f pytest; pkill -f bench_decode ) &
  watchdog=$!
  wait $gpu0 $gpu1
  kill $watchdog 2>/dev/null
else
  tar -C "$OUT" -xOf "$OUT/logs-build.tar" build.log | tail -30
fi
tar -C "$OUT" -cf "$FINAL/quick.tar" .
echo "==== summaries"; for f in "$OUT"/summary-*.txt; do echo "-- $(basename "$f")"; tail -n +3 "$f"; done
grep -E '^\| (b|h|swa)[0-9]' "$OUT/gpu0.out" | head -12
