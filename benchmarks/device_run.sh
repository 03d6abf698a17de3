#!/usr/bin/env bash
# One device call of this session's runs: the named steps in order, each under
# a time limit, a short summary last (and in $OUT/summary.txt).
#   bash benchmarks/device_run.sh build smoke ab memcheck tests racecheck synccheck bench
# TEST_FILES / TEST_K select the `tests` step, AB_ARGS / BENCH_ARGS the benchmarks.
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
pytest_gpu() {  # name, limit_s, pytest args...
  local name=$1 limit=$2; shift 2
  local t0=$(date +%s)
  timeout "$limit" python3 -m pytest -q -p no:cacheprovider -n 8 -k "${TEST_K:-not cpu}" "$@" >"$OUT/$name.log" 2>&1
  note "$name rc=$? ($(( $(date +%s) - t0 )) s): $(grep -E '[0-9]+ (passed|failed)' "$OUT/$name.log" | tail -1)"
  grep -E "^(FAILED|ERROR) " "$OUT/$name.log" | head -25 | tee -a "$summary"
}
sanitize() {  # tool, limit_s, args
  local t0=$(date +%s)
  timeout "$2" compute-sanitizer --tool "$1" --error-exitcode 9 python3 benchmarks/sanitize_cases.py ${3:-} >"$OUT/san_$1.log" 2>&1
  note "$1 rc=$? ($(( $(date +%s) - t0 )) s): $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|cases done' "$OUT/san_$1.log" | tr '\n' ' ')"
  grep -m3 -B2 -A12 "=========.*\(Invalid\|Race\|Barrier\|Error\)" "$OUT/san_$1.log" | head -40
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
    tests) pytest_gpu tests "${TESTS_S:-300}" ${TEST_FILES:-tests} ;;
    memcheck) sanitize memcheck "${SAN_S:-150}" ;;
    racecheck) sanitize racecheck "${SAN_S:-200}" --quick ;;
    synccheck) sanitize synccheck "${SAN_S:-120}" --quick ;;
    ab) timeout "${AB_S:-200}" python3 benchmarks/quick_ab.py ${AB_ARGS:-} 2>&1 | tee "$OUT/ab.log" | tail -70 ;;
    bench) timeout "${BENCH_S:-420}" python3 benchmarks/bench_decode.py --out-dir "$OUT" ${BENCH_ARGS:-} 2>&1 | tee "$OUT/bench.log" | tail -80 ;;
  esac
done
echo; echo "==== summary"; cat "$summary"
