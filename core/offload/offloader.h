#ifndef MEMPROFD_CORE_OFFLOAD_OFFLOADER_H_
#define MEMPROFD_CORE_OFFLOAD_OFFLOADER_H_

// The activation offloader: moves the tensors autograd saves for backward off
// the compute device during forward and brings them back when backward needs
// them, with bit-identical gradients.
//
// Mechanism: LibTorch's default autograd engine is replaced (once, before any
// backward) by a subclass whose get_default_saved_variable_hooks() hands every
// tensor saved inside an OffloadScope to the scope's Offloader. Each saved
// tensor gets its own hooks object holding its packed state, so state is
// freed with the graph (an unused branch leaks nothing). In backward, each
// unpack also starts bringing back the next storages backward will need
// (options.prefetch_depth of them, in reverse forward order) on a reader
// thread, so reads overlap with compute.
//
// Usage, on the thread that runs forward:
//   ASSIGN_OR_RETURN(auto offloader, Offloader::Create(options, device));
//   offloader->BeginStep(params_and_buffers);
//   { OffloadScope scope(offloader.get()); loss = model(x); }
//   offloader->MarkForwardEnd();  // optional: effectiveness at end of forward
//   loss.backward();
//   OffloadStats stats = offloader->EndStep();

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "core/offload/offload_options.h"

namespace memprofd::offload {

namespace internal {
class SavedTensorStore;
}  // namespace internal

// Makes LibTorch's default autograd engine the offloading one. Idempotent and
// thread-safe; must run before the first backward of the process (a backward
// that already ran keeps the old engine's threads) and is called by
// Offloader::Create. Fails if another engine (libtorch_python's) was installed
// first.
absl::Status InstallOffloadEngine();

// On the meta device (a dry run, core/plan: tensors with shapes and no data)
// the offloader decides and accounts as on a real device, but its copies are
// counted, not made, and a reload allocates the buffer without reading
// anything; no spill file. The read-ahead (prefetch_depth, kPrefetchAuto
// meaning 0 there: give the target device's depth) loads on the unpacking
// thread instead of a reader thread, whose allocations would escape the dry
// run's accounting: each unpack brings back the next prefetch_depth records
// at once, as a reader that keeps up does.
// When a copy out completes is the dry run's to say (MetaCopies): at once,
// releasing the device storage as a finished copy does, or held in flight
// with its source by the real offloader's limit: until max_copies_in_flight
// later copies have started, a reload needs it or the step ends.
//
// One offloader per training session. Thread-safety: Create, BeginStep,
// EndStep and the destructor belong to the owner thread (the one running
// forward); Totals and the *_held accessors may be called from any thread;
// the saved-tensor hooks it serves run on the forward thread (pack) and on
// autograd threads (unpack) and synchronize internally. Saved tensors packed
// by an offloader stay valid after it is destroyed (they own what they need),
// but no OffloadScope on it may be open then.
// When a dry run's copies out complete (above); ignored off the meta device.
enum class MetaCopies { kAtOnce, kInFlight };

class Offloader {
 public:
  // Installs the engine and, for the disk target (or the host target with a
  // host limit on a CUDA device), opens the spill file. INVALID_ARGUMENT for
  // bad options or a compute device that is neither CPU nor CUDA (or CUDA in a
  // build without it); the spill file's errno as a status when it cannot be
  // created (pick another spill_dir).
  static absl::StatusOr<std::unique_ptr<Offloader>> Create(
      const OffloadOptions& options, c10::Device compute,
      MetaCopies meta_copies = MetaCopies::kAtOnce);
  ~Offloader();
  Offloader(const Offloader&) = delete;
  Offloader& operator=(const Offloader&) = delete;

  // Starts a step: the storages of `params_and_buffers` (all parameters,
  // trainable or frozen, and buffers) are never copied, nor any view of them;
  // dedup restarts. Tensors without storage are ignored.
  void BeginStep(const std::vector<at::Tensor>& params_and_buffers);
  // Marks the end of a forward pass (of each micro-batch), before its
  // backward: decides for every storage offloaded so far this step whether
  // copying it freed its device memory (OffloadStats::effective_bytes) or
  // something else still holds it (ineffective_bytes). Storages offloaded
  // later (checkpoint recompute), or in steps that never call it, are decided
  // at their first reload or release. Owner thread; cost O(storages
  // offloaded this step), no copy is waited for.
  void MarkForwardEnd();
  // Ends a step, after its backward: drops the read-ahead still queued and
  // waits for the load under way (so the counters are complete), then returns
  // this step's statistics (counters since the previous EndStep or Create,
  // peak over that period, current gauges), adds them to Totals() and
  // restarts the counters.
  OffloadStats EndStep();
  // Everything since Create, with current gauges.
  OffloadStats Totals() const;

  // Offloaded bytes held in host memory / in the spill file, for memory
  // categories. Any thread.
  int64_t host_bytes_held() const;
  int64_t disk_bytes_held() const;
  // Bytes on the compute device kept alive by saved activations.
  int64_t resident_saved_bytes() const;
  // Current size of the spill file (0 without one).
  int64_t spill_file_bytes() const;

  // True when `t`'s storage is in the parameter filter of this step.
  bool IsParameterStorage(const at::Tensor& t) const;
  // Number of distinct storages in the filter.
  int64_t parameter_storage_count() const;

  // Waits until every queued copy out has completed, and stops the
  // read-ahead as EndStep does (for tests and benchmarks that read gauges at
  // a precise point).
  void Flush();

  const OffloadOptions& options() const;

 private:
  friend class OffloadScope;
  friend class NoOffloadScope;
  explicit Offloader(std::shared_ptr<internal::SavedTensorStore> store);
  std::shared_ptr<internal::SavedTensorStore> store_;
};

// Offloads the tensors autograd saves on this thread during its lifetime
// (nests; the innermost scope wins). A null offloader makes it a no-op, which
// lets callers build scopes unconditionally. Must not outlive the offloader.
// Not thread-safe: create and destroy it on one thread.
class OffloadScope {
 public:
  explicit OffloadScope(Offloader* offloader);
  ~OffloadScope();
  OffloadScope(const OffloadScope&) = delete;
  OffloadScope& operator=(const OffloadScope&) = delete;

 private:
  internal::SavedTensorStore* previous_store_;
  bool previous_exempt_;
};

// Keeps the tensors saved on this thread during its lifetime on the compute
// device. Inside an OffloadScope they are still counted (SkipReason::kExempt) and
// accounted as resident by that scope's offloader; outside any, the default
// constructor does nothing, while the Offloader* one reports them to
// `offloader` the same way (for a head that runs after the body's scope
// closed). OffloadStepListener nests one inside an OffloadScope for the head.
// Same threading rules as OffloadScope.
class NoOffloadScope {
 public:
  NoOffloadScope();
  explicit NoOffloadScope(Offloader* offloader);
  ~NoOffloadScope();
  NoOffloadScope(const NoOffloadScope&) = delete;
  NoOffloadScope& operator=(const NoOffloadScope&) = delete;

 private:
  internal::SavedTensorStore* previous_store_;
  bool previous_exempt_;
};

}  // namespace memprofd::offload

#endif  // MEMPROFD_CORE_OFFLOAD_OFFLOADER_H_
