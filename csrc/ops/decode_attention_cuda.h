// The CUDA path of flint::decode_attention, with the launch plan as an
// argument: the op passes the default plan (plan_launch); the test-only
// extension (csrc/testing) passes explicit ones for A/B runs and variant tests.
#pragma once

#include "decode_attention/launch_plan.h"
#include "ops/decode_args.h"

namespace flint {

// Checks, workspace, params and launch on the current stream; `plan` null:
// the default plan for the call.
void decode_attention_cuda_launch(const DecodeArgs& args, const LaunchPlan* plan);

// The default plan of a call on q's device (what the op launches).
LaunchPlan default_plan(const DecodeArgs& args);

}  // namespace flint
