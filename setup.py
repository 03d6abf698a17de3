"""Builds flint_attention._C, the flint::decode_attention op (CPU path and the
sm_90a CUDA kernels) as one library that serves every Python >= 3.10, and
flint_attention._testing, the test-only ops (explicit launch plans, a PDL
writer) that tests and benchmarks load; the operator never does.

Without a CUDA toolkit (no nvcc), with a CPU-only torch, or with
FLINT_CPU_ONLY=1, it builds the op without the CUDA kernel: the CPU path, the
checks and the Meta (fake) kernel, from CPU_SOURCES alone (and no _testing);
CUDA tensors then get an error that says so.
"""

import glob
import os
import re
import sys

import torch
from setuptools import find_packages, setup
from torch.utils.cpp_extension import CUDA_HOME, BuildExtension, CppExtension, CUDAExtension

# The kernel uses Hopper-only instructions (cp.async.bulk, mbarrier tx counts,
# griddepcontrol, clusters): build for sm_90a alone, whatever GPU (if any) is here.
os.environ["TORCH_CUDA_ARCH_LIST"] = "9.0a"

ROOT = os.path.dirname(os.path.abspath(__file__))

# The op without the CUDA kernel: schema, checks (also the Meta kernel), CPU
# path, Autograd kernel. A CUDA build compiles every source under csrc/ but
# CPU_ONLY_SOURCES (and the test-only ones, csrc/testing/, into _testing).
CPU_SOURCES = [
    "csrc/registration.cpp",
    "csrc/ops/validation.cpp",
    "csrc/ops/params_from_tensors.cpp",
    "csrc/ops/decode_attention_cpu.cpp",
    "csrc/ops/decode_attention_autograd.cpp",
]
# Only in a build without the CUDA kernel: the error CUDA tensors get.
CPU_ONLY_SOURCES = ["csrc/cpu_only/no_cuda_kernel.cpp"]


def sources(*patterns):
    return sorted(f for p in patterns for f in glob.glob(p, recursive=True))


TESTING_SOURCES = sources("csrc/testing/*.cpp", "csrc/testing/*.cu")
OP_SOURCES = [f for f in sources("csrc/**/*.cpp", "csrc/**/*.cu")
              if f not in TESTING_SOURCES and f not in CPU_ONLY_SOURCES]


# The kernels: one row each in variants.h; Build writes each row's .cu (row N:
# FLINT_INSTANTIATE(N)) into the build folder, so that they compile in parallel.
VARIANTS_H = "csrc/decode_attention/kernels/variants.h"
VARIANT_ROW = re.compile(r"^\s*FLINT_VARIANT\(\s*(\w+)\s*,\s*(\w+)\s*,\s*(\d+)\s*,\s*(\d+)\s*\)", re.M)


def variant_names() -> list[str]:
    """Row N's kernel name, e.g. split_bf16_w4_s2, for each row of variants.h."""
    with open(os.path.join(ROOT, VARIANTS_H)) as f:
        text = f.read()
    rows = VARIANT_ROW.findall(text)
    # Every row, or the extension would lack a kernel (an undefined symbol at import).
    code = [line for line in text.splitlines() if not line.lstrip().startswith("//")]
    if not rows or len(rows) != sum(line.count("FLINT_VARIANT(") for line in code):
        sys.exit(f"flint setup: {VARIANTS_H}: a row that is not FLINT_VARIANT(family, format, warps, stages)")
    return [f"{family}_{fmt}_w{warps}_s{stages}" for family, fmt, warps, stages in rows]


def write_variant_sources(folder: str) -> list[str]:
    """One .cu per row of variants.h in `folder` (rewritten only when changed,
    so that ninja rebuilds only what changed); their paths."""
    os.makedirs(folder, exist_ok=True)
    paths = []
    for n, name in enumerate(variant_names()):
        path = os.path.join(folder, f"{name}.cu")
        text = f'#include "decode_attention/kernels/instantiate.cuh"\nFLINT_INSTANTIATE({n})\n'
        if not os.path.isfile(path) or open(path).read() != text:
            with open(path, "w") as f:
                f.write(text)
        paths.append(path)
    return paths


def why_cpu_only() -> str | None:
    """Why the CUDA kernel cannot or should not be built here, or None."""
    if os.environ.get("FLINT_CPU_ONLY", "0") not in ("", "0"):
        return "FLINT_CPU_ONLY is set"
    if torch.version.cuda is None:
        return f"torch {torch.__version__} is a CPU-only build"
    if CUDA_HOME is None or not os.path.isfile(os.path.join(CUDA_HOME, "bin", "nvcc")):
        return "no CUDA toolkit (nvcc) found: neither CUDA_HOME nor PATH nor /usr/local/cuda has one"
    return None


# torch >= 2.14's headers use C++20 (std::strong_ordering, std::bit_width); older
# ones build as C++20 too, so one standard serves every supported torch.
CXX_STD = "-std=c++20"
nvcc_flags = [
    "-O3",
    CXX_STD,
    "-gencode=arch=compute_90a,code=sm_90a",
    "-lineinfo",
    "--ptxas-options=-v,--warn-on-spills",
    "--expt-relaxed-constexpr",
    "-DPy_LIMITED_API=0x030a0000",
]
# -fopenmp: at::parallel_for is header-only and runs serially without it (the
# CPU path's threads share torch's own libgomp). -ffp-contract=off: the CPU path
# mirrors the kernel's rounding; no fma may appear that the source does not write.
cxx_flags = ["-O3", CXX_STD, "-DPy_LIMITED_API=0x030a0000", "-fopenmp", "-ffp-contract=off"]
common = dict(include_dirs=[os.path.join(ROOT, "csrc")], py_limited_api=True)


class Build(BuildExtension):
    """Builds _C first (with the kernels of variants.h), then links _testing
    against it (found next to it at run time through $ORIGIN), so the test ops
    launch the op's own kernels."""

    def build_extensions(self):
        self.extensions.sort(key=lambda e: e.name != "flint_attention._C")
        if reason is None:  # the kernels, generated here: not in git, not under csrc/
            op = self.extensions[0]
            generated = write_variant_sources(os.path.join(self.build_temp, "kernels"))
            op.sources = op.sources + [s for s in generated if s not in op.sources]
        # One extension at a time (`build_ext -j N` would link _testing before
        # _C exists); ninja compiles each one's sources in parallel (MAX_JOBS).
        self.parallel = None
        super().build_extensions()

    def build_extension(self, ext):
        if ext.name == "flint_attention._testing":
            op = self.get_ext_fullpath("flint_attention._C")
            ext.extra_link_args = ext.extra_link_args + [
                f"-L{os.path.dirname(op)}", f"-l:{os.path.basename(op)}", "-Wl,-rpath,$ORIGIN"]
        super().build_extension(ext)


reason = why_cpu_only()
if reason is None:
    cuda_flags = {"cxx": cxx_flags, "nvcc": nvcc_flags}
    extensions = [
        CUDAExtension("flint_attention._C", OP_SOURCES, extra_compile_args=cuda_flags,
                      extra_link_args=["-fopenmp"], **common),
        CUDAExtension("flint_attention._testing", TESTING_SOURCES, extra_compile_args=cuda_flags,
                      **common),
    ]
else:
    extensions = [
        CppExtension("flint_attention._C", CPU_SOURCES + CPU_ONLY_SOURCES,
                     extra_compile_args={"cxx": cxx_flags + ["-DFLINT_CPU_ONLY"]},
                     extra_link_args=["-fopenmp"], **common),
    ]
    print(
        f"\nflint setup: building WITHOUT the CUDA kernel ({reason}).\n"
        "flint setup: the op runs on CPU tensors only (the CPU path); CUDA tensors raise an error.\n"
        "flint setup: for the kernel, install the CUDA 13 toolkit and build again without FLINT_CPU_ONLY.\n",
        file=sys.stderr,
    )

setup(
    name="flint-attention",
    version="0.1.0",
    packages=find_packages("python"),
    package_dir={"": "python"},
    ext_modules=extensions,
    cmdclass={"build_ext": Build},
    options={"bdist_wheel": {"py_limited_api": "cp310"}},
)
