#!/usr/bin/env bash
# Full verification in one call on the nvidia-h200-x2 kind: build, then
#   GPU 0: tests/test_gpu.py
#   GPU 1: the other test files, the SASS check, the sanitizers
# side by side, then tests/test_multi_device.py with both GPUs visible and the
# timeline on a quiet GPU. Everything lands in $OUT/verify.tar (the device tool
# returns few files) and the summaries are printed last. BUDGET_S bounds the
# parallel part so the packing always happens inside the call's time limit.
set -u -o pipefail
cd "$(dirname "$0")/.."
FINAL=${OUT:-$PWD/device_out}
export OUT=$FINAL/work
mkdir -p "$OUT"
check=benchmarks/device_check.sh
bash $check build >/dev/null 2>&1
grep -q "build ok" "$OUT/summary-build.txt" || { cat "$OUT/summary-build.txt"; tar -C "$OUT" -xOf "$OUT/logs-build.tar" build.log | tail -40; }
if grep -q "build ok" "$OUT/summary-build.txt"; then
  deadline=$(( $(date +%s) + ${BUDGET_S:-420} ))
  CUDA_VISIBLE_DEVICES=0 RUN_TAG=gpu0_ TEST_PATHS=tests/test_gpu.py \
    bash $check tests >"$OUT/gpu0.out" 2>&1 &
  gpu0=$!
  { CUDA_VISIBLE_DEVICES=1 RUN_TAG=gpu1_ TEST_PATHS="tests --ignore=tests/test_gpu.py" \
      bash $check tests sass
    CUDA_VISIBLE_DEVICES=1 SANITIZE_SUBSET=1 bash $check sanitize; } >"$OUT/gpu1.out" 2>&1 &
  gpu1=$!
  ( sleep $(( deadline - $(date +%s) )); echo "deadline: stopping what still runs" >>"$OUT/gpu1.out"
    pkill -f compute-sanitizer; pkill -f pytest ) &
  watchdog=$!
  wait $gpu0 $gpu1
  kill $watchdog 2>/dev/null
  RUN_TAG=both_ TEST_PATHS=tests/test_multi_device.py PYTEST_WORKERS=1 bash $check tests >"$OUT/both.out" 2>&1
  [ "${TIMELINE:-1}" = 1 ] && bash $check timeline >"$OUT/timeline.out" 2>&1
fi
tar -C "$OUT" -cf "$FINAL/verify.tar" . 
echo "==== summaries"; for f in "$OUT"/summary-*.txt; do echo "-- $(basename "$f")"; cat "$f"; done
