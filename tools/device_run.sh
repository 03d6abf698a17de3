#!/usr/bin/env bash
# The GPU machine's one script: the named steps in order, each under a time
# limit, a short summary last (and in $OUT/summary.txt).
#   bash tools/device_run.sh build smoke tests memcheck racecheck synccheck sass ab phases bench ncu ncusrc transformers demo
#   build      the extension (pip install -e ., the system g++)
#   smoke      tests/test_balanced.py, test_fp8.py, test_kernel_variants.py (GPU ids)
#   tests      TEST_FILES (default: all of tests/) with -k TEST_K (default: not cpu) over
#              TEST_WORKERS processes (default 8; an H100's 80 GB holds fewer of
#              tests/test_gpu.py's large cases at once), its log
#              $OUT/$TESTS_NAME.log (default tests); on the GPU machine $OUT is set
#              (device_out/ is only the fallback)
#   memcheck / racecheck / synccheck   compute-sanitizer on tools/sanitize_cases.py
#              (racecheck: SAN_ARGS, default --quick; synccheck: every case in its own process
#              unless SAN_ARGS; SAN_TOOL_ARGS, SAN_TAG)
#   sass       every kernel of the shipped .so: PDL, bulk copies, MMA, no local memory
#   ab         tools/quick_ab.py (AB_ARGS): default vs split vs balanced plans, fast
#   phases     tools/phases_row.py (PHASES_ARGS): the balanced kernel's phase stamps
#              (PHASES_ARGS="--kernel split ...": the 9-warp split kernel's)
#   bench      benchmarks/bench_decode.py (BENCH_ARGS; peers from .whl and .peers,
#              copied with the tree: benchmarks/peers/WHEELS.md, README.md)
#   ncu        Nsight Compute of one steady-state launch per NCU_SPECS ("row plan [fp8]; ..."),
#              NCU_SECTIONS (default: speed of light, warp states, launch, occupancy,
#              compute workload -- pipe utilization -- and instruction mix)
#   ncusrc     ncu source counters of one launch per NCU_SPECS: warp-stall samples per
#              source line (tools/ncu_source.py; NCU_RANGES "FILE:FIRST-LAST ...")
#   transformers  the integration's GPU tests (tests/test_integration_transformers.py -k "gpu or
#              cuda_graph") on transformers 5.23 from .whl/tf (benchmarks/peers/WHEELS.md)
#   demo       python -m flint_attention
# Every step's log is in $OUT (default device_out/), the summary in $OUT/summary.txt.
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/device_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/python${PYTHONPATH:+:$PYTHONPATH}
# The image's default g++ links libstdc++ statically (a second copy next to torch's).
[ -x /usr/bin/g++ ] && export CC=/usr/bin/gcc CXX=/usr/bin/g++
summary=$OUT/summary.txt
note() { echo "== $1"; echo "$1" >>"$summary"; }
note "$(nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader) commit ${FLINT_COMMIT:-?}"
pytest_gpu() {  # name, limit_s, pytest args... (-v: a test's outcome is logged as it ends,
  # so a run stopped at its limit still says what passed and what failed)
  local name=$1 limit=$2; shift 2
  local t0=$(date +%s) log="$OUT/$name.log"
  timeout "$limit" python3 -m pytest -v -p no:cacheprovider -n "${TEST_WORKERS:-8}" -k "${TEST_K:-not cpu}" "$@" >"$log" 2>&1
  local rc=$? counts
  counts=$(for o in PASSED FAILED ERROR SKIPPED XFAIL; do echo -n "$o $(grep -c " $o " "$log") "; done)
  note "$name rc=$rc ($(( $(date +%s) - t0 )) s): $(grep -E '[0-9]+ (passed|failed)' "$log" | tail -1) [logged: $counts]"
  grep -E "(FAILED|ERROR) tests/" "$log" | head -25 | tee -a "$summary"
}
sanitize() {  # tool, limit_s, args (SAN_TOOL_ARGS: the tool's own options; SAN_TAG: log name suffix)
  local t0=$(date +%s) log="$OUT/san_$1${SAN_TAG:-}.log"
  timeout "$2" compute-sanitizer --tool "$1" ${SAN_TOOL_ARGS:-} --error-exitcode 9 python3 tools/sanitize_cases.py ${3:-} >"$log" 2>&1
  note "$1${SAN_TAG:-} ${3:-} rc=$? ($(( $(date +%s) - t0 )) s): $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|cases done' "$log" | tr '\n' ' ')"
  grep -m3 -B2 -A12 "=========.*\(Invalid\|Race\|Barrier\|Error\)" "$log" | head -40
}
synccheck_one() {  # limit_s, args: SAN_TOOL_ARGS default for synccheck only, not the later steps
  # 256 tracked barriers: the fp8 9-warp splits overflow the tool's default 64 and
  # fail their launch; the case loop below takes each case's own
  # (sanitize_cases.py --synccheck-args, read once; set but empty: the tool's default).
  SAN_TOOL_ARGS=${SAN_TOOL_ARGS---num-cuda-barriers 256} sanitize synccheck "$@"
}
for step in "$@"; do
  case $step in
    build)
      t0=$(date +%s)
      if MAX_JOBS=16 python3 -m pip install --no-build-isolation --no-deps -e . >"$OUT/build.log" 2>&1; then
        note "build ok ($(( $(date +%s) - t0 )) s)"
      else
        tail -40 "$OUT/build.log"; note "build FAILED"; break
      fi
      grep -E "registers|spill" "$OUT/build.log" | sort | uniq -c | sort -rn >"$OUT/ptxas.txt" ;;
    smoke) pytest_gpu smoke "${SMOKE_S:-200}" tests/test_balanced.py tests/test_fp8.py tests/test_kernel_variants.py ;;
    tests) pytest_gpu "${TESTS_NAME:-tests}" "${TESTS_S:-300}" ${TEST_FILES:-tests} ;;
    memcheck) sanitize memcheck "${SAN_S:-150}" ;;
    racecheck) sanitize racecheck "${SAN_S:-200}" "${SAN_ARGS:---quick}" ;;
    # synccheck: one process per case (and one for the balanced machinery). In one
    # process the tool's cuda::barrier tracking overflows after enough launches and the
    # next kernel fails (at 64 tracked; 1024 runs the tool out of memory), while every
    # case alone passes. SAN_ARGS: one process with those args.
    synccheck)
      if [ -n "${SAN_ARGS:-}" ]; then synccheck_one "${SAN_S:-120}" "$SAN_ARGS"
      else
        mapfile -t case_args < <(python3 tools/sanitize_cases.py --synccheck-args)
        for kv in bf16 fp8; do for c in "${!case_args[@]}"; do
          SAN_TOOL_ARGS="${case_args[$c]}" \
            SAN_TAG=_${kv}_$c synccheck_one "${SAN_S:-40}" "--case $c --kv $kv"
        done; done
        SAN_TAG=_balanced synccheck_one "${SAN_S:-90}" --balanced
      fi ;;
    ab) timeout "${AB_S:-200}" python3 tools/quick_ab.py ${AB_ARGS:-} 2>&1 | tee "$OUT/ab.log" | tail -70 ;;
    phases) timeout "${PHASES_S:-150}" python3 tools/phases_row.py ${PHASES_ARGS:-} 2>&1 | tee "$OUT/phases.log" | tail -120 ;;
    sass)
      for so in python/flint_attention/_C*.so; do
        cuobjdump --dump-sass "$so" >"$OUT/sass.txt" 2>&1
        note "sass $(basename "$so"): $(grep -c 'Function : .*decode_attention' "$OUT/sass.txt") decode kernels, ACQBULK x$(grep -c ACQBULK "$OUT/sass.txt"), PREEXIT x$(grep -c PREEXIT "$OUT/sass.txt"), UBLKCP x$(grep -c UBLKCP "$OUT/sass.txt"), UTMALDG x$(grep -c UTMALDG "$OUT/sass.txt"), HMMA x$(grep -c HMMA "$OUT/sass.txt"), LDL/STL x$(grep -cE '\b(LDL|STL)\b' "$OUT/sass.txt")"
      done
      gzip -f "$OUT/sass.txt" ;;
    bench)
      site=
      if ls .whl/*.whl >/dev/null 2>&1; then
        python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
          --target /tmp/site .whl/*.whl >"$OUT/wheels.log" 2>&1 && site=/tmp/site
      fi
      PYTHONPATH=$PYTHONPATH${site:+:$site} FLINT_GIT_COMMIT=${FLINT_COMMIT:-} timeout "${BENCH_S:-420}" \
        python3 benchmarks/bench_decode.py --out-dir "$OUT" --budget-s "${BENCH_BUDGET_S:-330}" \
        ${BENCH_ARGS:-} 2>"$OUT/bench.err" | tee "$OUT/bench.log" | tail -100
      note "bench rc=$?" ;;
    ncu)
      IFS=';' read -ra specs <<<"${NCU_SPECS:-b1_l8k default; b1_l8k split}"
      for spec in "${specs[@]}"; do
        set -- $spec
        timeout 90 ncu --clock-control none -k regex:decode_attention -s 20 -c 1 \
          ${NCU_SECTIONS:---section SpeedOfLight --section WarpStateStats --section LaunchStats --section Occupancy --section ComputeWorkloadAnalysis --section InstructionStats} \
          python3 tools/ncu_row.py "$1" "$2" ${3:-} >"$OUT/ncu_$1_$2${3:-}.txt" 2>&1
        note "ncu $1 $2 ${3:-}: $(grep -E 'Duration' "$OUT/ncu_$1_$2${3:-}.txt" | tr -s ' ' | tr '\n' ' ')"
      done ;;
    ncusrc)  # per-instruction warp-stall samples of one launch per NCU_SPECS (ncu_source.py)
      IFS=';' read -ra specs <<<"${NCU_SPECS:-b1_l8k default}"
      for spec in "${specs[@]}"; do
        set -- $spec
        rep=$OUT/src_$1_$2${3:-}
        timeout 150 ncu --clock-control none -k regex:decode_attention -s 20 -c 1 \
          --section SourceCounters --section WarpStateStats --import-source yes -f -o "$rep" \
          python3 tools/ncu_row.py "$1" "$2" ${3:-} >"$rep.log" 2>&1
        ncu -i "$rep.ncu-rep" --page source --csv --print-source cuda,sass >"$rep.csv" 2>"$rep.err"
        gzip -f "$rep.csv"; rm -f "$rep.ncu-rep"
        python3 tools/ncu_source.py "$rep.csv.gz" 60 ${NCU_RANGES:-} >"$rep.txt" 2>&1
        note "ncusrc $1 $2 ${3:-}: $(head -1 "$rep.txt")"
      done ;;
    transformers)
      python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/tfsite .whl/tf/*.whl \
        >"$OUT/tf_install.log" 2>&1 || note "transformers: installing .whl/tf failed ($OUT/tf_install.log)"
      PYTHONPATH=/tmp/tfsite:$PYTHONPATH TEST_WORKERS=1 TEST_K="gpu or cuda_graph" \
        pytest_gpu transformers "${TF_S:-150}" tests/test_integration_transformers.py ;;
    demo) python3 -m flint_attention 2>&1 | tee "$OUT/demo.log" | tail -15; note "demo rc=$?" ;;
  esac
done
echo; echo "==== summary"; cat "$summary"
