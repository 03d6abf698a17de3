// The flint op library: the schema of flint::decode_attention, once. Each
// kernel registers next to its code (ops/*.cpp): CPU, CUDA, Autograd, and Meta
// (for FakeTensor and torch.compile) in validation.cpp; a build without the
// CUDA kernel registers cpu_only/no_cuda_kernel.cpp for CUDA instead.
#include <Python.h>

#include <torch/library.h>

TORCH_LIBRARY(flint, m) {
  // The op writes `out` (and `lse` when given); the Python wrapper returns
  // out. k_scale and v_scale go with an fp8 (e4m3) cache only.
  m.def(
      "decode_attention(Tensor q, Tensor kv_cache, Tensor block_tables, Tensor seq_lens, "
      "Tensor? sinks, int? window, float scale, Tensor(a!) out, Tensor? k_scale=None, "
      "Tensor? v_scale=None, Tensor(b!)? lse=None) -> ()");
}

// setup.py defines FLINT_CPU_ONLY when it builds without the CUDA kernel.
#ifdef FLINT_CPU_ONLY
constexpr long kHasCudaKernel = 0;
#else
constexpr long kHasCudaKernel = 1;
#endif

// `import flint_attention._C` loads this library (and so runs the
// registrations above) without a pybind11 module; the limited API keeps one
// build valid for every Python >= 3.10. _C.HAS_CUDA_KERNEL says whether this
// build has the CUDA kernel.
extern "C" PyObject* PyInit__C(void) {
  static PyModuleDef module = {PyModuleDef_HEAD_INIT, "_C", nullptr, -1, nullptr};
  PyObject* m = PyModule_Create(&module);
  if (m != nullptr && PyModule_AddIntConstant(m, "HAS_CUDA_KERNEL", kHasCudaKernel) < 0) {
    Py_DECREF(m);
    return nullptr;
  }
  return m;
}
