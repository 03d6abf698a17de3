#!/usr/bin/env bash
# Sets up (scripts/setup.sh), then runs the test suite; arguments go to pytest
# (e.g. -k cpu, -m sanitizer_subset). GPU tests skip without a Hopper GPU.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
bash "$ROOT/scripts/setup.sh"
. "$ROOT/scripts/python.sh"  # PY: the Python setup.sh set up
cd "$ROOT"
# Test this checkout even if another checkout was installed in editable mode since.
export PYTHONPATH="$ROOT/python${PYTHONPATH:+:$PYTHONPATH}"
exec "$PY" -m pytest -q tests "$@"
