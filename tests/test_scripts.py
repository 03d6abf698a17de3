"""scripts/setup.sh on a fresh machine: no torch, no pip, with or without a CUDA
toolkit. It must say what it does without a traceback (its probes are quiet),
go on without nvcc (the build without the CUDA kernel), and fail only where pip
is missing. A bare virtual environment stands in for the machine: nothing is
installed or built."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("nvcc", [True, False], ids=["nvcc", "no_nvcc"])
def test_setup_on_a_fresh_machine_prints_no_traceback(tmp_path, nvcc):
    if nvcc and shutil.which("nvcc") is None:
        pytest.skip("no nvcc on PATH here")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV", "FLINT_"))}
    env["PYTHON"] = str(venv / "bin" / "python")
    if not nvcc:
        env["PATH"] = os.pathsep.join(d for d in env["PATH"].split(os.pathsep) if not (Path(d) / "nvcc").exists())
        env["CUDA_HOME"] = str(tmp_path / "no-cuda")
    result = subprocess.run(["bash", str(ROOT / "scripts" / "setup.sh")], env=env,
                            capture_output=True, text=True, timeout=300)
    output = result.stdout + result.stderr
    assert "Traceback" not in output, output
    assert ("setup: nvcc not found: the extension is built without the CUDA kernel" in result.stderr) != nvcc
    assert "setup: installing torch==2.11.0 numpy pytest ninja wheel setuptools>=70" in result.stdout, output
    assert result.returncode != 0 and "No module named pip" in result.stderr, output
