#!/usr/bin/env bash
# Installs what is missing to build and test Flint, builds the extension into
# this checkout (editable install) and checks that it imports. Safe to re-run:
# it installs nothing that is there and rebuilds only when csrc/ or setup.py
# changed, or when the build would now get (or lose) the CUDA kernel
# (FLINT_REBUILD=1 forces a build). Without nvcc, or with FLINT_CPU_ONLY=1, the
# extension is built without the CUDA kernel: the CPU path only. The Python is
# $PYTHON (default python3), or this clone's .venv where that one refuses pip
# install (PEP 668; scripts/python.sh).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
. "$ROOT/scripts/python.sh"
cd "$ROOT"

# CUDA toolkit: the kernel needs nvcc (13.x, torch's CUDA major).
if ! command -v nvcc >/dev/null && [[ -x "${CUDA_HOME:-/usr/local/cuda}/bin/nvcc" ]]; then
  export CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
  export PATH="$CUDA_HOME/bin:$PATH"
fi
want_cuda=1
if [[ "${FLINT_CPU_ONLY:-0}" != 0 && -n "${FLINT_CPU_ONLY:-}" ]]; then
  want_cuda=0
elif ! command -v nvcc >/dev/null; then
  want_cuda=0
  echo "setup: nvcc not found: the extension is built without the CUDA kernel (the CPU path only); for the kernel, install the CUDA 13 toolkit or set CUDA_HOME" >&2
fi

# Python packages. torch 2.11.0 on PyPI is built for CUDA 13.0; keep any
# importable torch >= 2.11 (the GPU machine has one and no package index).
missing=()
"$PY" - <<'PY' || missing+=("torch==2.11.0")
try:
    import torch
except ImportError:  # a fresh machine: installed below
    raise SystemExit(1)
major, minor = (int(x) for x in torch.__version__.split("+")[0].split(".")[:2])
raise SystemExit((major, minor) < (2, 11))
PY
for module in numpy pytest ninja wheel; do
  "$PY" -c "import $module" 2>/dev/null || missing+=("$module")
done
# setuptools 77 reads the license as an SPDX expression (pyproject.toml).
"$PY" -c 'from importlib.metadata import version; raise SystemExit(int(version("setuptools").split(".")[0]) < 77)' \
  2>/dev/null || missing+=("setuptools>=77")
# The transformers integration and its tests: this version (FlintForCausalLM is new in it).
"$PY" -c 'from importlib.metadata import version; raise SystemExit(version("transformers") != "5.23.0")' \
  2>/dev/null || missing+=("transformers==5.23.0")
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  "$PY" -m pip install "${missing[@]}"
fi

# A CPU-only torch cannot build the kernel either (setup.py says so too).
if [[ $want_cuda == 1 ]] && ! "$PY" -c 'import torch; raise SystemExit(torch.version.cuda is None)' 2>/dev/null; then
  want_cuda=0
fi

# Build unless the extension in this checkout is newer than its sources, is
# the one Python imports, and has the CUDA kernel exactly when it can.
installed=$(cd / && "$PY" -c 'import os, flint_attention; print(os.path.dirname(os.path.realpath(flint_attention.__file__)))' 2>/dev/null || true)
has_cuda=$(cd / && "$PY" -c 'from flint_attention import ops; print(int(ops.HAS_CUDA_KERNEL))' 2>/dev/null || true)
so=$(ls python/flint_attention/_C*.so 2>/dev/null | head -n 1 || true)
if [[ "${FLINT_REBUILD:-0}" == 1 || -z "$so" || "$installed" != "$ROOT/python/flint_attention" \
      || "$has_cuda" != "$want_cuda" || -n "$(find csrc setup.py pyproject.toml -newer "$so" -print -quit)" ]]; then
  echo "setup: building the extension (a few minutes at most)"
  MAX_JOBS=${MAX_JOBS:-$(nproc)} "$PY" -m pip install --no-build-isolation --no-deps -e .
fi

cd / && "$PY" -c '
import sys, torch, flint_attention
from flint_attention.ops import HAS_CUDA_KERNEL
cuda = torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)
print(f"setup: {sys.executable}: flint_attention {flint_attention.__version__} from {flint_attention.__file__}, torch {torch.__version__};",
      ("Hopper GPU present" if cuda else "no Hopper GPU: the CPU path only") if HAS_CUDA_KERNEL
      else "built without the CUDA kernel: the CPU path only")
'
