#!/usr/bin/env bash
# An A/B of builds on the GPU machine, in one call: each argument is a source
# tree (this checkout, ".", or an older commit unpacked beside it:
#   git archive COMMIT csrc python setup.py pyproject.toml | tar -x -C ab/NAME
# on the build machine, before the device call), built in place, all at once;
# then tools/quick_ab.py --plans default (AB_ROWS, AB_KV) runs against
# each tree's package in turn, ROUNDS rounds (default 2), so that drift
# between the builds' turns shows as a round-to-round difference. SKIP_BUILD=1:
# the trees as an earlier call on this machine built them.
#   bash tools/ab_builds.sh . ab/base ab/old
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/device_out}
mkdir -p "$OUT"
here=$PWD
[ -x /usr/bin/g++ ] && export CC=/usr/bin/gcc CXX=/usr/bin/g++
jobs=$(( $(nproc) / $# ))
[ "$jobs" -lt 1 ] && jobs=1
t0=$(date +%s)
[ -n "${SKIP_BUILD:-}" ] || for tree in "$@"; do
  log=$OUT/build_$(basename "$(realpath "$tree")").log
  (cd "$tree" && MAX_JOBS=$jobs python3 setup.py build_ext --inplace >"$log" 2>&1 \
     || echo "== build FAILED: $tree") &
done
wait
echo "== builds done ($(( $(date +%s) - t0 )) s)"
for r in $(seq 1 "${ROUNDS:-2}"); do
  for tree in "$@"; do
    echo "== round $r: $tree"
    PYTHONUNBUFFERED=1 PYTHONPATH=$(realpath "$tree")/python \
      timeout "${AB_S:-150}" python3 "$here/tools/quick_ab.py" --plans default \
      --rows "${AB_ROWS:-b1_l1k,b1_l1k_w8192,b1_l8k,h1_tp_64k}" --kv "${AB_KV:-bf16,fp8}" \
      2>&1 | grep -E "^\| [a-z0-9_]+ \| (bf16|fp8)|done|Error|error" | tee -a "$OUT/ab_builds.log"
  done
done
