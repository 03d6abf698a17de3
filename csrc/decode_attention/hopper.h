// The limits of Hopper (sm_90) that the kernels and their launch are sized by.
#pragma once

namespace flint::hopper {

// Shared memory of one SM (228 KB), and what one CTA may ask for of it (227 KB
// of dynamic shared memory: the SM keeps 1 KB per CTA for itself).
constexpr int kSmemPerSm = 228 * 1024;
constexpr int kMaxSmemPerCta = 227 * 1024;

// A grid's y and z dimensions (the split kernels' kv heads and batch).
constexpr int kMaxGridYZ = 65535;

}  // namespace flint::hopper
