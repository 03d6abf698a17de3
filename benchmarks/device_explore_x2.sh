#!/usr/bin/env bash
# EXPERIMENT call for branch exp/next on the nvidia-h200-x2 kind (~5
# minutes): are the early griddepcontrol.launch_dependents
# (FLINT_EARLY_TRIGGER=1) and the persistent warp-per-head grid
# (FLINT_WPH_PERSISTENT=1) gains, where, and what does the last CTA's merge
# wait on?
#   GPU 0: bench flint / early / persist / both / nopdl on the short rows;
#          timelines with the heuristic, with the early trigger and with
#          FLINT_PDL=0 (the last CTA's merge without a successor's loads beside
#          it); a launch-config sweep of the sliding rows with the early trigger.
#   GPU 1: the experiments' tests, sanitize_cases.py under memcheck and
#          racecheck with both switches on, ncu on b1_l1k, b1_l8k and
#          swa128_b64_l8k.
# Everything lands in $OUT/explore.tar; summaries print last.
set -u -o pipefail
cd "$(dirname "$0")/.."
FINAL=${OUT:-$PWD/device_out}
export OUT=$FINAL/work
mkdir -p "$OUT"
start=$(date +%s)
check=benchmarks/device_check.sh
rows="b1_l1k,b1_l8k,h1_b8_l8k,b4_l8k,b1_l32k,b16_l8k,swa128_b1_l8k,swa128_b16_l8k,swa128_b64_l8k,swa128_b256_l8k;custom:512,8,8192,128"
bash $check build >/dev/null 2>&1
if grep -q "build ok" "$OUT/summary-build.txt"; then
  deadline=$(( start + ${BUDGET_S:-330} ))
  {
    CUDA_VISIBLE_DEVICES=0 BENCH_ARGS="--no-plot --impls flint,early,waited,persist,waitedp --rows $rows" bash $check bench
    for mode in default waited; do
      env=()
      [ $mode = waited ] && env=(FLINT_EARLY_TRIGGER=2)
      [ $mode = nopdl ] && env=(FLINT_PDL=0)
      env CUDA_VISIBLE_DEVICES=0 ${env[@]+"${env[@]}"} RUN_TAG=${mode}_ bash $check timeline
      mv "$OUT/logs-${mode}_timeline.tar" "$OUT/logs-timeline-$mode.tar" 2>/dev/null
    done
    CUDA_VISIBLE_DEVICES=0 FLINT_EARLY_TRIGGER=2 FLINT_WPH_PERSISTENT=1 python3 benchmarks/bench_decode.py --out-dir "$OUT" --no-plot \
      --impls flint --sweep --sweep-limit 30 --rows swa128_b1_l8k,swa128_b16_l8k,swa128_b64_l8k,swa128_b256_l8k \
      >"$OUT/sweep_waited.log" 2>&1
  } >"$OUT/gpu0.out" 2>&1 &
  gpu0=$!
  {
    CUDA_VISIBLE_DEVICES=1 python3 -m pytest -q -p no:cacheprovider -n 4 tests/test_kernel_variants.py \
      -k "early or persistent" >"$OUT/early_tests.log" 2>&1
    echo "experiment tests: $(tail -1 "$OUT/early_tests.log")"
    for tool in memcheck racecheck; do
      CUDA_VISIBLE_DEVICES=1 FLINT_EARLY_TRIGGER=2 FLINT_WPH_PERSISTENT=1 compute-sanitizer --tool $tool --error-exitcode 9 \
        python3 benchmarks/sanitize_cases.py >"$OUT/sanitize_early_$tool.log" 2>&1
      echo "sanitize (early) $tool rc=$?: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/sanitize_early_$tool.log")"
    done
    CUDA_VISIBLE_DEVICES=1 FLINT_EARLY_TRIGGER=2 python3 benchmarks/bench_decode.py --out-dir "$OUT" --no-plot \
      --impls flint --sweep --sweep-limit 30 --rows b1_l1k,b1_l8k,h1_b8_l8k \
      >"$OUT/sweep_waited_full.log" 2>&1
  } >"$OUT/gpu1.out" 2>&1 &
  gpu1=$!
  ( sleep $(( deadline - $(date +%s) )); echo "deadline: stopping what still runs" | tee -a "$OUT/gpu0.out" >>"$OUT/gpu1.out"
    pkill -f compute-sanitizer; pkill -f pytest; pkill -f bench_decode; pkill -f ncu ) &
  watchdog=$!
  wait $gpu0 $gpu1
  kill $watchdog 2>/dev/null
else
  tar -C "$OUT" -xOf "$OUT/logs-build.tar" build.log | tail -30
fi
tar -C "$OUT" -cf "$FINAL/explore.tar" .
echo "==== summaries"; for f in "$OUT"/summary-*.txt; do echo "-- $(basename "$f")"; tail -n +3 "$f"; done
grep -E "^experiment tests|^sanitize" "$OUT/gpu1.out"
grep -E '^\| (b|h|swa)[0-9]' "$OUT/gpu0.out" | head -10
