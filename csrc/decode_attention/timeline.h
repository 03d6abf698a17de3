// The phases the diagnostic timeline stamps (decode_attention/timeline.cuh),
// in the order a CTA reaches them. Host-visible: the test op sizes its buffer
// from kNumStamps. Stamps a CTA never reaches (it left early) are not
// written: the caller zeroes the buffer first.
#pragma once

namespace flint {

enum TimelineStamp : int {
  kStampEntry,      // first instruction
  kStampSeqLen,     // seq_len loaded (split and cluster kernels)
  kStampBlockIds,   // warp 0's first block ids loaded (split and cluster kernels)
  kStampPrologue,   // seq_len and block table read, leading pages issued
  kStampWaited,     // griddepcontrol.wait returned (launch_dependents)
  kStampStreamed,   // the CTA's pages are consumed
  kStampMerged,     // the CTA's warps merged (split kernel)
  kStampArrived,    // arrival counted (split merge through the workspace)
  kStampExit,       // output or partial written
  kNumStamps
};

}  // namespace flint
