#!/usr/bin/env bash
# Installs what is missing to build and test Flint, builds the extension into
# this checkout (editable install) and checks that it imports. Safe to re-run:
# it installs nothing that is there and rebuilds only when csrc/ or setup.py
# changed (FLINT_REBUILD=1 forces a build).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON:-python3}
cd "$ROOT"

# CUDA toolkit: the build needs nvcc (13.x, torch's CUDA major).
if ! command -v nvcc >/dev/null; then
  export CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
  export PATH="$CUDA_HOME/bin:$PATH"
fi
command -v nvcc >/dev/null || { echo "setup: nvcc not found; install the CUDA 13 toolkit or set CUDA_HOME" >&2; exit 1; }

# Python packages. torch 2.11.0 on PyPI is built for CUDA 13.0; keep any
# importable torch >= 2.11 (the GPU machine has one and no package index).
missing=()
"$PY" - <<'PY' || missing+=("torch==2.11.0")
import torch
major, minor = (int(x) for x in torch.__version__.split("+")[0].split(".")[:2])
raise SystemExit((major, minor) < (2, 11))
PY
for module in numpy pytest ninja wheel; do
  "$PY" -c "import $module" 2>/dev/null || missing+=("$module")
done
"$PY" -c 'from importlib.metadata import version; raise SystemExit(int(version("setuptools").split(".")[0]) < 70)' \
  2>/dev/null || missing+=("setuptools>=70")
# The transformers integration and its tests (the GPU machine has this version).
"$PY" -c "import transformers" 2>/dev/null || missing+=("transformers==5.17.0")
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  "$PY" -m pip install "${missing[@]}"
fi

# Build unless the extension in this checkout is newer than its sources and
# is the one Python imports.
installed=$(cd / && "$PY" -c 'import os, flint_attention; print(os.path.dirname(os.path.realpath(flint_attention.__file__)))' 2>/dev/null || true)
so=$(ls python/flint_attention/_C*.so 2>/dev/null | head -n 1 || true)
if [[ "${FLINT_REBUILD:-0}" == 1 || -z "$so" || "$installed" != "$ROOT/python/flint_attention" \
      || -n "$(find csrc setup.py pyproject.toml -newer "$so" -print -quit)" ]]; then
  echo "setup: building the extension (a few minutes at most)"
  MAX_JOBS=${MAX_JOBS:-$(nproc)} "$PY" -m pip install --no-build-isolation --no-deps -e .
fi

cd / && "$PY" -c '
import torch, flint_attention
cuda = torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)
print(f"setup: flint_attention {flint_attention.__version__} from {flint_attention.__file__}, torch {torch.__version__};",
      "Hopper GPU present" if cuda else "no Hopper GPU: the CPU path only")
'
