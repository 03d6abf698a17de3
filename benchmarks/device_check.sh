#!/usr/bin/env bash
# One device-machine call: build, GPU tests, sanitizers, benchmark. A short
# summary is printed last.
#   bash benchmarks/device_check.sh [build] [tests] [variants] [sanitize] [sass] [bench] [timeline] [ncu] [demo]
# (no argument: everything). Extra pytest arguments via PYTEST_ARGS (split at
# spaces, quotes inside it do not group) and a -k expression via PYTEST_K (may
# hold spaces: PYTEST_K='a or b'); the tests run on PYTEST_WORKERS pytest-xdist
# workers (default 8) where xdist exists;
# benchmark arguments via BENCH_ARGS, the test paths via TEST_PATHS (default
# tests), a prefix for the log/summary names via RUN_TAG (two test runs side
# by side on two GPUs). tests/test_multi_device.py runs only where two GPUs
# are visible (the nvidia-h200-x2 kind without CUDA_VISIBLE_DEVICES).
# The device tool returns at most 8 files from $OUT, so each finished step's
# logs are appended to $OUT/logs-<steps>.tar and the summary goes to
# $OUT/summary-<steps>.txt; two invocations with different steps may run side
# by side (e.g. sanitize in the background while tests run).
# What a call shows goes into the session's log in benchmarks/logs/, a bench
# JSON worth keeping into benchmarks/results/ (with a line in its README), and
# a change of what is verified into benchmarks/RESULTS.md.
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/device_out}
mkdir -p "$OUT"
steps=${*:-build tests sanitize sass bench demo}
tag=${RUN_TAG:-}${steps// /_}
summary_file="$OUT/summary-$tag.txt"
: >"$summary_file"
note() { echo "$1" >>"$summary_file"; echo "== $1"; }
# Moves the named files (relative to $OUT) into this invocation's tar.
pack() {
  local have=()
  for f in "$@"; do [ -e "$OUT/$f" ] && have+=("$f"); done
  [ ${#have[@]} -gt 0 ] && tar -C "$OUT" -rf "$OUT/logs-$tag.tar" "${have[@]}" && (cd "$OUT" && rm -f "${have[@]}")
  return 0
}
export PYTHONUNBUFFERED=1
# The device image's default CXX (/opt/gcc/bin/g++) links libstdc++ statically;
# a second libstdc++ in the process crashes on the first std::locale use (e.g.
# formatting an int in an error message). Build with the system compiler.
[ -x /usr/bin/g++ ] && export CC=/usr/bin/gcc CXX=/usr/bin/g++

note "$(nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader)"
note "commit ${FLINT_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}, steps: $steps"
workers=
# 14 workers on one GPU ran 4 of the batch-1024 grid tests out of its 140 GB
# (2026-11-30); 8 did not.
python3 -c "import xdist" 2>/dev/null && workers="-n ${PYTEST_WORKERS:-8}"

for step in $steps; do
  t0=$(date +%s)
  case $step in
    build)
      if MAX_JOBS=16 python3 -m pip install --no-build-isolation -e . >"$OUT/build.log" 2>&1; then
        note "build ok ($(( $(date +%s) - t0 )) s)"
      else
        tail -40 "$OUT/build.log"; note "build FAILED"; break
      fi
      grep -E "registers|spill" "$OUT/build.log" | sort | uniq -c | sort -rn | head -8 >"$OUT/ptxas.txt"
      pack build.log ptxas.txt
      ;;
    tests)
      # The CPU-only torch.compile test takes a minute here and runs in CI anyway.
      pre=${RUN_TAG:-}  # names this run's logs apart from a side-by-side one
      rm -f "$OUT/${pre}errors.jsonl"
      FLINT_ERROR_LOG="$OUT/${pre}errors.jsonl" python3 -m pytest -q -p no:cacheprovider --durations=10 $workers \
        --deselect "tests/test_registration.py::test_torch_compile_fullgraph[cpu]" \
        ${TEST_PATHS:-tests} ${PYTEST_ARGS:-} ${PYTEST_K:+-k "$PYTEST_K"} 2>&1 | tee "$OUT/${pre}tests.log" | grep -vE '^(SKIPPED|PASSED)' | tail -40
      [ -s "$OUT/${pre}errors.jsonl" ] && python3 benchmarks/error_summary.py "$OUT/${pre}errors.jsonl" | tee "$OUT/${pre}errors.md"
      note "tests: $(tail -1 "$OUT/${pre}tests.log") ($(( $(date +%s) - t0 )) s)"
      pack ${pre}tests.log ${pre}errors.jsonl
      ;;
    variants)
      python3 -m pytest -q -p no:cacheprovider $workers tests/test_kernel_variants.py ${PYTEST_ARGS:-} ${PYTEST_K:+-k "$PYTEST_K"} 2>&1 |
        tee "$OUT/variants.log" | grep -vE '^(SKIPPED|PASSED)|PytestBenchmarkWarning|warner' | tail -25
      note "variants: $(tail -1 "$OUT/variants.log") ($(( $(date +%s) - t0 )) s)"
      pack variants.log
      ;;
    sanitize)
      # Every kernel path one launch each (sanitize_cases.py), then the tests
      # marked sanitizer_subset (SANITIZE_SUBSET=0: not); racecheck of the
      # subset took > 5 minutes on 2026-11-29, so it runs only with
      # RACECHECK_SUBSET=1. SANITIZE_TOOLS picks the tools (default all three).
      for tool in ${SANITIZE_TOOLS:-memcheck synccheck racecheck}; do
        subset=${SANITIZE_SUBSET:-1}
        [ $tool = racecheck ] && subset=${RACECHECK_SUBSET:-0}
        { compute-sanitizer --tool $tool --error-exitcode 9 python3 benchmarks/sanitize_cases.py &&
          if [ "$subset" = 1 ]; then
            compute-sanitizer --tool $tool --error-exitcode 9 python3 -m pytest -q -p no:cacheprovider \
              ${workers:+-n ${SANITIZE_WORKERS:-4}} -m sanitizer_subset tests
          fi; } >"$OUT/sanitize_$tool.log" 2>&1
        rc=$?
        note "compute-sanitizer $tool: rc=$rc, $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/sanitize_$tool.log" | tr '\n' ' '), $(grep -E '[0-9]+ passed' "$OUT/sanitize_$tool.log" | tail -1)"
        [ $rc -ne 0 ] && tail -30 "$OUT/sanitize_$tool.log"
        pack "sanitize_$tool.log"
      done
      ;;
    sass)
      # griddepcontrol.wait shows as ACQBULK, launch_dependents as PREEXIT.
      so=$(ls python/flint_attention/_C*.so | head -1)
      cuobjdump --dump-sass "$so" >"$OUT/sass.txt" 2>&1
      note "sass: $(grep -c 'Function :' "$OUT/sass.txt") kernels, ACQBULK x$(grep -c ACQBULK "$OUT/sass.txt"), PREEXIT x$(grep -c PREEXIT "$OUT/sass.txt"), UBLKCP x$(grep -c UBLKCP "$OUT/sass.txt"), HMMA x$(grep -c HMMA "$OUT/sass.txt"), LDL/STL x$(grep -cE '\b(LDL|STL)\b' "$OUT/sass.txt")"
      gzip -f "$OUT/sass.txt"; pack sass.txt.gz
      ;;
    bench)
      if [ -f benchmarks/bench_decode.py ]; then
        # Peers travel as wheels (benchmarks/WHEELS.md); only this step sees them.
        site=
        if ls .whl/*.whl >/dev/null 2>&1; then
          python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
            --target /tmp/site .whl/*.whl >"$OUT/wheels.log" 2>&1 && site=/tmp/site
        fi
        PYTHONPATH=$site FLINT_GIT_COMMIT=${FLINT_COMMIT:-} python3 benchmarks/bench_decode.py \
          --out-dir "$OUT" ${BENCH_ARGS:-} 2>&1 | tee "$OUT/bench.log" | tail -40
        note "bench done ($(( $(date +%s) - t0 )) s)"
        (cd "$OUT" && pack wheels.log bench.log $(ls bench_* 2>/dev/null))
      fi
      ;;
    timeline)
      # Per-CTA phase stamps in chains of calls (benchmarks/timeline.py); rows
      # and config via TIMELINE_ARGS.
      python3 benchmarks/timeline.py --json "$OUT/timeline.json" --raw "$OUT/timeline_raw.npz" ${TIMELINE_ARGS:-} 2>&1 |
        tee "$OUT/timeline.log" | tail -20
      note "timeline rc=$? ($(( $(date +%s) - t0 )) s)"
      pack timeline.log timeline.json timeline_raw.npz
      ;;
    ncu)
      # One profiled launch per row (NCU_ROWS), after 20 warm-up calls:
      # the report, its details page and the per-SASS-line source page (stall
      # reasons per instruction) as text, since no ncu is at hand elsewhere.
      for row in ${NCU_ROWS:-b1_l1k swa128_b64_l8k}; do
        ncu --clock-control none --set full --import-source yes -k regex:decode_attention \
          -s 20 -c 1 -f -o "$OUT/ncu_$row" python3 benchmarks/profile_row.py --row "$row" \
          ${NCU_PROFILE_ARGS:-} >"$OUT/ncu_$row.log" 2>&1
        note "ncu $row: rc=$?"
        ncu -i "$OUT/ncu_$row.ncu-rep" --page details >"$OUT/ncu_${row}_details.txt" 2>&1
        ncu -i "$OUT/ncu_$row.ncu-rep" --page source --csv --print-source sass \
          >"$OUT/ncu_${row}_source.csv" 2>&1
        gzip -f "$OUT/ncu_${row}_source.csv"
        pack "ncu_$row.log" "ncu_$row.ncu-rep" "ncu_${row}_details.txt" "ncu_${row}_source.csv.gz"
      done
      ;;
    demo)
      python3 -m flint_attention 2>&1 | tee "$OUT/demo.log" | tail -15
      note "demo rc=$? ($(( $(date +%s) - t0 )) s)"
      pack demo.log
      ;;
  esac
done
echo; echo "==== summary ($steps)"; cat "$summary_file"
