#ifndef MEMPROFD_CORE_MEMORY_OP_ATTRIBUTION_H_
#define MEMPROFD_CORE_MEMORY_OP_ATTRIBUTION_H_

// The op half of attribution: LibTorch RecordFunction callbacks that set the
// calling thread's op (core/common/attribution.h) to the aten op running in
// forward ("aten::mm") and to the autograd node running in backward
// ("MmBackward0"). A backward node also gets the module its forward op ran
// in, through the sequence number autograd gives both, so that gradients of
// activations are attributed to the module that made the activation. No
// LibTorch in this header.
//
// Cost: LibTorch builds a RecordFunction for every op while a callback is
// installed; the callbacks themselves do a few thread-local loads and stores
// and a hash lookup of the op name. memory_bench prints the step time with
// and without.

#include <cstdint>

namespace memprofd {
namespace memory {

// Installs the callbacks process-wide (a LibTorch global callback) for its
// lifetime: every thread's ops set that thread's op, autograd's worker
// threads included. Threads that push no module scope get ops without a
// module. Create and destroy on one thread; one at a time in a process.
class OpAttribution {
 public:
  OpAttribution();
  ~OpAttribution();
  OpAttribution(const OpAttribution&) = delete;
  OpAttribution& operator=(const OpAttribution&) = delete;

 private:
  uint64_t handle_ = 0;
};

// The same callbacks for the calling thread only, for its lifetime: a dry run
// (core/plan) gets its ops attributed whether or not a training has
// OpAttribution installed (with both, an op is marked twice, to the same
// effect). Thread-local callbacks are copied into the thread's parallel
// regions and autograd work, which costs the per-region rebuild
// OpAttribution avoids; a dry run does no arithmetic, so that is moot there.
// Create and destroy on one thread.
class ThreadOpAttribution {
 public:
  ThreadOpAttribution();
  ~ThreadOpAttribution();
  ThreadOpAttribution(const ThreadOpAttribution&) = delete;
  ThreadOpAttribution& operator=(const ThreadOpAttribution&) = delete;

 private:
  uint64_t handle_ = 0;
};

}  // namespace memory
}  // namespace memprofd

#endif  // MEMPROFD_CORE_MEMORY_OP_ATTRIBUTION_H_
