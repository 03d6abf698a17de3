// Programmatic dependent launch (PTX ISA "Parallel Synchronization and
// Communication Instructions: griddepcontrol"). Both are no-ops when the grid
// was launched without the programmatic-serialization attribute.
#pragma once

#include "ptx/arch.cuh"

namespace flint::ptx {

// griddepcontrol.wait: blocks until the prerequisite grids have completed and
// their memory operations are visible.
__device__ __forceinline__ void grid_dependency_wait() {
  asm volatile("griddepcontrol.wait;" ::: "memory");
}

// griddepcontrol.launch_dependents: lets the dependent grid start launching
// once every CTA of this grid has issued it (or exited).
__device__ __forceinline__ void launch_dependents() {
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}

}  // namespace flint::ptx
