// Where a kernel's time goes: the points each warp passes (phases) and the
// sections of a balanced warp's stream. The operator's kernels take the probes
// here, which compile to nothing; the testing extension's builds
// (csrc/testing/split_phases.cu, balanced_phases.cu; tools/phases_row.py)
// stamp the clock there.
#pragma once

namespace flint {

namespace detail {

// A warp's prologue in every kernel family (page_ring.cuh's wait_then_stream
// and the balanced kernel): the leading pages are out, the wait is over.
struct NoPrologueProbe {
  __device__ __forceinline__ void leading_issued() {}
  __device__ __forceinline__ void waited() {}
};

// Where a balanced warp's stream time goes, piece by piece: each probe.lap()
// gives the time since the previous one to a section (the testing build sums
// them per warp).
enum StreamSection : int {
  kPieceSetup,    // a piece's inputs and q (or, once, the stream's start past the wait)
  kFirstWait,     // waiting for a piece's first page
  kPageWait,      // waiting for its other pages
  kRefillSync,    // a refill's warp sync and block id
  kRefillArrive,  // its expect_tx (lane 0)
  kRefillCopy,    // its bulk copy (lane 0)
  kRefill,        // the rest of a refill: the producer's bookkeeping
  kPageMath,      // a page's fragments and online softmax
  kPieceEnd,      // a piece's output or partial
  kNumStreamSections
};

struct NoStreamProbe {
  __device__ __forceinline__ void lap(StreamSection) {}
};

}  // namespace detail

// Where a split launch's time goes: each warp passes these points in order (a
// CTA without a request stops at kSplitEntered; an idle split, or a request
// with nothing to attend, at kSplitShared; a warp past the merge warps at
// kSplitStreamed; a merging warp that does not arrive last at kSplitArrived).
enum SplitPhase : int {
  kSplitEntered,        // the kernel starts
  kSplitShared,         // this CTA's request, split and extent known
  kSplitLeadingIssued,  // the leading pages out, before griddepcontrol.wait
  kSplitWaited,         // past griddepcontrol.wait
  kSplitStreamed,       // the warp's pages consumed
  kSplitCtaMerged,      // the CTA's warps merged (the output, or this split's partial, stored)
  kSplitArrived,        // arrival at the splits' merge counted
  kSplitFinished,       // the last arrival's merge stored the output
  kNumSplitPhases
};

struct NoSplitProbe : detail::NoPrologueProbe {
  __device__ __forceinline__ void at(SplitPhase) {}
};

// Where a balanced launch's time goes: each warp passes these points in order
// (a warp whose CTA has no cross-CTA merge stops at kCtaMerged, one that does
// not merge last at kArrived).
enum BalancedPhase : int {
  kEntered,        // the kernel starts
  kDivided,        // the division and each warp's first request known
  kLeadingIssued,  // the leading pages out, before griddepcontrol.wait
  kWaited,         // past griddepcontrol.wait
  kStreamed,       // the warp's share consumed
  kCtaReady,       // every warp of the CTA streamed (and the empty rows zeroed)
  kCtaMerged,      // the CTA's merge done (outputs or workspace partials stored)
  kArrived,        // arrival at the cross-CTA merges counted
  kFinished,       // the last arrival's merges stored
  kNumBalancedPhases
};

struct NoProbe : detail::NoStreamProbe {
  __device__ __forceinline__ void at(BalancedPhase) {}
};

}  // namespace flint
