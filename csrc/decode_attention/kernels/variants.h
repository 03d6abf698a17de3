// The compiled kernels, one row each: the only place a variant is named.
// FLINT_VARIANT(family, format, warps, stages), family one of balanced,
// split, cluster4 (split CTAs merged in a cluster of 4) or warp_per_head;
// format bf16 or fp8. Row N is variant_entry<N> (registry.h); setup.py turns
// each row into a .cu of its own in the build folder (FLINT_INSTANTIATE(N),
// instantiate.cuh), so that the kernels compile in parallel. The order is
// the order of flint_testing.variant(i).
//
// No include guard: an includer defines FLINT_VARIANT, includes this file and
// undefines it.
FLINT_VARIANT(balanced, bf16, 8, 2)
FLINT_VARIANT(balanced, fp8, 8, 4)
FLINT_VARIANT(split, bf16, 4, 2)
FLINT_VARIANT(split, bf16, 4, 3)
FLINT_VARIANT(split, bf16, 8, 2)
FLINT_VARIANT(split, bf16, 9, 2)
FLINT_VARIANT(cluster4, bf16, 4, 2)
FLINT_VARIANT(warp_per_head, bf16, 4, 3)
FLINT_VARIANT(split, fp8, 4, 4)
FLINT_VARIANT(split, fp8, 4, 6)
FLINT_VARIANT(split, fp8, 8, 4)
FLINT_VARIANT(split, fp8, 9, 4)
FLINT_VARIANT(cluster4, fp8, 4, 4)
FLINT_VARIANT(warp_per_head, fp8, 4, 6)
