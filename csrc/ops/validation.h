// Argument checks shared by every backend of flint::decode_attention, and by its
// Meta kernel (FakeTensor, torch.compile).
#pragma once

#include "ops/decode_args.h"

namespace flint {

// Throws (TORCH_CHECK) with a message naming the argument, what was expected and
// what was given, for every input the kernel cannot take. Data-dependent limits
// (block ids, seq_len range, scale values) are not checked here: reading them
// needs a sync. It reads metadata only, through SymInts, so that it also runs on
// meta and fake tensors with symbolic shapes (the op's Meta kernel, registered
// in validation.cpp): there, alignment is judged from the storage
// offset, and all tensors are on the meta device, so devices go unchecked.
void check_decode_attention_args(const DecodeArgs& args);

}  // namespace flint
