#!/usr/bin/env bash
# Sets up (scripts/setup.sh), then runs the main job, python -m flint_attention:
# a realistic decode batch, checked against the float64 reference and timed.
# Arguments go to it (--seed N, --reps N).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
bash "$ROOT/scripts/setup.sh"
. "$ROOT/scripts/python.sh"  # PY: the Python setup.sh set up
export PYTHONPATH="$ROOT/python${PYTHONPATH:+:$PYTHONPATH}"
exec "$PY" -m flint_attention "$@"
