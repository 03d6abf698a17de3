"""Builds flint_attention._C: the flint::decode_attention op (CPU path and the
sm_90a CUDA kernel) as one library that serves every Python >= 3.10."""

import glob
import os

from setuptools import find_packages, setup
from torch.utils.cpp_extension import BuildExtension, CUDAExtension

# The kernel uses Hopper-only instructions (cp.async.bulk, mbarrier tx counts,
# griddepcontrol, clusters): build for sm_90a alone, whatever GPU (if any) is here.
os.environ["TORCH_CUDA_ARCH_LIST"] = "9.0a"

ROOT = os.path.dirname(os.path.abspath(__file__))
sources = sorted(
    glob.glob("csrc/**/*.cpp", recursive=True) + glob.glob("csrc/**/*.cu", recursive=True)
)

nvcc_flags = [
    "-O3",
    "-std=c++17",
    "-gencode=arch=compute_90a,code=sm_90a",
    "-lineinfo",
    "--ptxas-options=-v,--warn-on-spills",
    "--expt-relaxed-constexpr",
    "-DPy_LIMITED_API=0x030a0000",
]
# -fopenmp: at::parallel_for is header-only and runs serially without it (the
# CPU path's threads share torch's own libgomp). -ffp-contract=off: the CPU path
# mirrors the kernel's rounding; no fma may appear that the source does not write.
cxx_flags = ["-O3", "-std=c++17", "-DPy_LIMITED_API=0x030a0000", "-fopenmp", "-ffp-contract=off"]

setup(
    name="flint-attention",
    version="0.1.0",
    packages=find_packages("python"),
    package_dir={"": "python"},
    ext_modules=[
        CUDAExtension(
            name="flint_attention._C",
            sources=sources,
            include_dirs=[os.path.join(ROOT, "csrc")],
            extra_compile_args={"cxx": cxx_flags, "nvcc": nvcc_flags},
            extra_link_args=["-fopenmp"],
            py_limited_api=True,
        )
    ],
    cmdclass={"build_ext": BuildExtension},
    options={"bdist_wheel": {"py_limited_api": "cp310"}},
)
