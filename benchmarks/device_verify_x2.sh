#!/usr/bin/env bash
# Verification and a short benchmark in one call on the nvidia-h200-x2 kind
# (device runs 6-13 of 2026-11-30 used this layout):
#   build (editable install), then side by side
#   GPU 0: the benchmark (BENCH_ROWS) and the timeline, then 70% of the
#          selected test_gpu.py cases
#   GPU 1: the three sanitizers on sanitize_cases.py and the SASS check,
#          OTHER_TESTS without their CPU-only cases (CI runs those), then the
#          other 30% of the selected test_gpu.py cases
#   then tests/test_multi_device.py with both GPUs visible (MULTI_DEVICE=0
#   skips it).
# The whole verification (the defaults) takes ~510 s. A check of one kernel
# change fits ~5 minutes by narrowing the tests, e.g. (run 12's selection):
#   GPU_TESTS_GREP='test_gpu_grid\[(b133|b256|b1024)-' MULTI_DEVICE=0 BUDGET_S=330 \
#   OTHER_TESTS='tests/test_kernel_variants.py tests/test_timeline.py tests/test_correctness.py tests/test_pdl_cluster.py'
# BENCH_IMPLS (default flint) names the benchmarked implementations, e.g.
# flint,xqa,sdpa with the FlashInfer wheels carried (benchmarks/WHEELS.md), and
# BENCH_KV_DTYPES (default bf16) the cache dtypes (bf16,fp8 adds every row's fp8 twin).
# GPU_TESTS_GREP is an extended regex over test_gpu.py's node ids (default:
# all); GPU_TESTS_FILE, a file of node ids (one per line or space-separated),
# selects them instead (the ones a cut-short run left). SANITIZE=0 skips the
# sanitizers and the SASS check, OTHER_TESTS=none the other test files.
# BUDGET_S (default 500) after the start, whatever still runs is stopped, so
# that the logs are packed inside the call's time limit; everything lands in
# $OUT/verify.tar (the device tool returns few files) and the summaries are
# printed last.
set -u -o pipefail
cd "$(dirname "$0")/.."
FINAL=${OUT:-$PWD/device_out}
export OUT=$FINAL/work
mkdir -p "$OUT"
start=$(date +%s)
check=benchmarks/device_check.sh
rows=${BENCH_ROWS:-b1_l1k,b1_l8k,h1_b8_l8k,b4_l8k,b1_l32k,swa128_b1_l8k,swa128_b16_l8k,swa128_b64_l8k,swa128_b256_l8k}
other=${OTHER_TESTS:-tests --ignore=tests/test_gpu.py}
bash $check build >/dev/null 2>&1
if grep -q "build ok" "$OUT/summary-build.txt"; then
  deadline=$(( start + ${BUDGET_S:-500} ))
  # The selected test_gpu.py node ids, 7 of every 10 to GPU 0 (its grid is the slow part).
  if [ -n "${GPU_TESTS_FILE:-}" ]; then
    tr ' ' '\n' <"$GPU_TESTS_FILE" | grep "::" >"$OUT/gpu_ids.txt"
  else
    python3 -m pytest --collect-only -q -p no:cacheprovider tests/test_gpu.py 2>/dev/null |
      grep "::" | grep -E "${GPU_TESTS_GREP:-.}" >"$OUT/gpu_ids.txt"
  fi
  awk 'NR % 10 < 7' "$OUT/gpu_ids.txt" | tr '\n' ' ' >"$OUT/gpu_a.txt"
  awk 'NR % 10 >= 7' "$OUT/gpu_ids.txt" | tr '\n' ' ' >"$OUT/gpu_b.txt"
  # Runs test_gpu.py ids from file $2 on GPU $1, unless there are none (an
  # empty TEST_PATHS would run every test).
  gpu_tests() {
    [ -s "$2" ] || return 0
    CUDA_VISIBLE_DEVICES=$1 RUN_TAG=$3 TEST_PATHS="$(cat "$2")" bash $check tests
  }
  {
    CUDA_VISIBLE_DEVICES=0 BENCH_ARGS="--no-plot --impls ${BENCH_IMPLS:-flint} --kv-dtypes ${BENCH_KV_DTYPES:-bf16} --rows $rows" bash $check bench timeline
    gpu_tests 0 "$OUT/gpu_a.txt" gpu0_
  } >"$OUT/gpu0.out" 2>&1 &
  gpu0=$!
  {
    [ "${SANITIZE:-1}" = 0 ] || CUDA_VISIBLE_DEVICES=1 SANITIZE_SUBSET=0 bash $check sanitize sass
    [ "$other" = none ] ||
      CUDA_VISIBLE_DEVICES=1 RUN_TAG=gpu1o_ TEST_PATHS="$other" PYTEST_ARGS='-k not(cpu)' bash $check tests
    gpu_tests 1 "$OUT/gpu_b.txt" gpu1_
  } >"$OUT/gpu1.out" 2>&1 &
  gpu1=$!
  ( sleep $(( deadline - $(date +%s) )); echo "deadline: stopping what still runs" | tee -a "$OUT/gpu0.out" >>"$OUT/gpu1.out"
    pkill -f compute-sanitizer; pkill -f pytest; pkill -f bench_decode ) &
  watchdog=$!
  wait $gpu0 $gpu1
  # Its sleep too: it holds the output open, and the device call would last
  # until the deadline (run 14 idled ~2 minutes that way).
  pkill -P $watchdog 2>/dev/null; kill $watchdog 2>/dev/null
  if [ "${MULTI_DEVICE:-1}" = 1 ]; then
    RUN_TAG=both_ TEST_PATHS=tests/test_multi_device.py PYTEST_WORKERS=1 bash $check tests >"$OUT/both.out" 2>&1
  fi
else
  tar -C "$OUT" -xOf "$OUT/logs-build.tar" build.log | tail -30
fi
tar -C "$OUT" -cf "$FINAL/verify.tar" .
echo "==== summaries"; for f in "$OUT"/summary-*.txt; do echo "-- $(basename "$f")"; tail -n +3 "$f"; done
grep -E '^\| (b|h|swa)[0-9]' "$OUT/gpu0.out" | head -16
