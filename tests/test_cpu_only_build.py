"""The build without the CUDA kernel (setup.py: no nvcc, a CPU-only torch, or
FLINT_CPU_ONLY=1), as a laptop user gets it from `pip install .`: built here
from a copy of the sources into a scratch folder (~1-2 minutes on 2 cores), it
imports, says it has no CUDA kernel, runs the CPU path, and gives CUDA tensors
its own error. The install goes to a --target folder: nothing installed on
this machine changes."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(shutil.which("c++") is None, reason="no C++ compiler")

ROOT = Path(__file__).resolve().parents[1]
BANNER = "flint setup: building WITHOUT the CUDA kernel"


def test_setup_finds_no_toolkit_where_cuda_home_has_no_nvcc(tmp_path):
    # setup.py decides before building anything; `--name` builds nothing.
    env = dict(os.environ, CUDA_HOME=str(tmp_path / "no-cuda"))
    env.pop("FLINT_CPU_ONLY", None)
    result = subprocess.run([sys.executable, "setup.py", "--name"], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert f"{BANNER} (no CUDA toolkit (nvcc) found" in result.stderr


CHECK = textwrap.dedent("""
    import torch, flint_attention
    from flint_attention.ops import HAS_CUDA_KERNEL
    from flint_attention.testing import BF16_VS_F64, assert_close, make_paged_inputs, reference_decode_attention
    assert not HAS_CUDA_KERNEL
    assert flint_attention.__file__.startswith(TARGET), flint_attention.__file__
    inp = make_paged_inputs(3, [5, 0, 40], 2, None, "cpu")
    args = (inp.q, inp.kv_cache, inp.block_tables, inp.seq_lens, inp.sinks, None, 0.1)
    assert_close(flint_attention.flint_decode_attention(*args, inp.out), reference_decode_attention(*args), BF16_VS_F64)
    # A CUDA tensor reaches the CUDA kernel slot; no GPU is needed to call it.
    cuda = torch._C.DispatchKeySet(torch._C.DispatchKey.CUDA)
    try:
        torch.ops.flint.decode_attention.default.redispatch(cuda, *args, inp.out, None, None)
    except RuntimeError as e:
        assert "this build of flint has no CUDA kernel" in str(e), e
    else:
        raise AssertionError("no error from the CUDA slot")
    for key in ["CPU", "CUDA", "Meta", "Autograd"]:
        assert torch._C._dispatch_has_kernel_for_dispatch_key("flint::decode_attention", key), key
    print("cpu-only ok")
""")


def test_pip_install_builds_the_cpu_only_extension(tmp_path):
    src, target = tmp_path / "src", tmp_path / "target"
    src.mkdir()
    for name in ["csrc", "python", "setup.py", "pyproject.toml", "README.md"]:
        copy = shutil.copytree if (ROOT / name).is_dir() else shutil.copy2
        copy(ROOT / name, src / name)
    for built in (src / "python" / "flint_attention").glob("*.so"):
        built.unlink()
    env = dict(os.environ, FLINT_CPU_ONLY="1", MAX_JOBS=os.environ.get("MAX_JOBS", "2"))
    build = subprocess.run(
        [sys.executable, "-m", "pip", "install", "-v", "--no-build-isolation", "--no-deps",
         "--target", str(target), str(src)],
        env=env, capture_output=True, text=True, timeout=1200,
    )
    assert build.returncode == 0, build.stdout[-4000:] + build.stderr[-4000:]
    assert BANNER in build.stdout + build.stderr
    [so] = (target / "flint_attention").glob("_C*.so")
    assert b".nv_fatbin" not in so.read_bytes(), "GPU code in a CPU-only build"

    env = dict(os.environ, PYTHONPATH=str(target))
    run = subprocess.run([sys.executable, "-c", f"TARGET = {str(target)!r}\n" + CHECK], env=env,
                         cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0 and "cpu-only ok" in run.stdout, run.stdout + run.stderr

