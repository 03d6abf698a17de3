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
    assert "setup: installing torch==2.11.0 numpy pytest ninja wheel setuptools>=77" in result.stdout, output
    assert result.returncode != 0 and "No module named pip" in result.stderr, output


# A Python that refuses `pip install` (PEP 668), made from this one: its
# sitecustomize puts an EXTERNALLY-MANAGED file next to the standard library
# sysconfig reports, outside any virtual environment, as pip sees it.
SITECUSTOMIZE = """
import sys, sysconfig
sys.base_prefix = sys.prefix
_get_path = sysconfig.get_path
sysconfig.get_path = lambda name, *a, **k: {stdlib!r} if name == "stdlib" else _get_path(name, *a, **k)
"""


def externally_managed_python(tmp_path: Path) -> Path:
    stdlib, site = tmp_path / "stdlib", tmp_path / "site"
    stdlib.mkdir()
    site.mkdir()
    (stdlib / "EXTERNALLY-MANAGED").write_text("[externally-managed]\nError=use a virtual environment\n")
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE.format(stdlib=str(stdlib)))
    python = tmp_path / "python"
    python.write_text(f'#!/bin/sh\nPYTHONPATH={site} exec {sys.executable} "$@"\n')
    python.chmod(0o755)
    return python


def test_setup_makes_a_venv_where_pip_install_is_refused(tmp_path):
    python = externally_managed_python(tmp_path)
    refused = subprocess.run([str(python), "-m", "pip", "install", "--dry-run", "--no-index", "pip"],
                             capture_output=True, text=True)
    assert "externally-managed-environment" in refused.stderr, "the stub must look externally managed to pip"
    clone = tmp_path / "clone"
    shutil.copytree(ROOT / "scripts", clone / "scripts")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV", "FLINT_", "PIP_"))}
    # No package index: the install that follows fails at once, here.
    env.update(PYTHON=str(python), PIP_NO_INDEX="1")
    venv = clone / ".venv"

    def setup():
        return subprocess.run(["bash", str(clone / "scripts" / "setup.sh")], env=env,
                              capture_output=True, text=True, timeout=300)

    first = setup()
    assert (f"setup: {python} refuses pip install (externally managed, PEP 668): creating a virtual "
            f"environment for Flint, {venv}, used from now on") in first.stderr, first.stderr
    assert (venv / "bin" / "python").is_file()
    # ... and the installs go into it (the venv's own pip, which finds no index).
    assert "setup: installing torch==2.11.0" in first.stdout, first.stdout + first.stderr
    assert first.returncode != 0 and "externally-managed-environment" not in first.stderr, first.stderr
    assert "No matching distribution found for torch==2.11.0" in first.stderr, first.stderr

    second = setup()  # reuses it, without a word
    assert "creating a virtual environment" not in second.stderr, second.stderr
    assert "setup: installing torch==2.11.0" in second.stdout and "No matching distribution" in second.stderr
