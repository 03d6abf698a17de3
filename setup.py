"""Builds flint_attention._C, the flint::decode_attention op (CPU path and the
sm_90a CUDA kernels) as one library that serves every Python >= 3.10, and
flint_attention._testing, the test-only ops (explicit launch plans, a PDL
writer) that tests and benchmarks load; the operator never does."""

import glob
import os

from setuptools import find_packages, setup
from torch.utils.cpp_extension import BuildExtension, CUDAExtension

# The kernel uses Hopper-only instructions (cp.async.bulk, mbarrier tx counts,
# griddepcontrol, clusters): build for sm_90a alone, whatever GPU (if any) is here.
os.environ["TORCH_CUDA_ARCH_LIST"] = "9.0a"

ROOT = os.path.dirname(os.path.abspath(__file__))


def sources(*patterns):
    return sorted(f for p in patterns for f in glob.glob(p, recursive=True))


testing_sources = sources("csrc/testing/*.cpp", "csrc/testing/*.cu")
op_sources = [f for f in sources("csrc/**/*.cpp", "csrc/**/*.cu") if f not in testing_sources]

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


def extension(name, srcs, **kw):
    return CUDAExtension(
        name=name,
        sources=srcs,
        include_dirs=[os.path.join(ROOT, "csrc")],
        extra_compile_args={"cxx": cxx_flags, "nvcc": nvcc_flags},
        py_limited_api=True,
        **kw,
    )


class Build(BuildExtension):
    """Builds _C first, then links _testing against it (found next to it at
    run time through $ORIGIN), so the test ops launch the op's own kernels."""

    def build_extensions(self):
        self.extensions.sort(key=lambda e: e.name != "flint_attention._C")
        super().build_extensions()

    def build_extension(self, ext):
        if ext.name == "flint_attention._testing":
            op = self.get_ext_fullpath("flint_attention._C")
            ext.extra_link_args = ext.extra_link_args + [
                f"-L{os.path.dirname(op)}", f"-l:{os.path.basename(op)}", "-Wl,-rpath,$ORIGIN"]
        super().build_extension(ext)


setup(
    name="flint-attention",
    version="0.1.0",
    packages=find_packages("python"),
    package_dir={"": "python"},
    ext_modules=[
        extension("flint_attention._C", op_sources, extra_link_args=["-fopenmp"]),
        extension("flint_attention._testing", testing_sources),
    ],
    cmdclass={"build_ext": Build},
    options={"bdist_wheel": {"py_limited_api": "cp310"}},
)
