#ifndef MEMPROFD_CORE_OFFLOAD_OFFLOAD_OPTIONS_H_
#define MEMPROFD_CORE_OFFLOAD_OFFLOAD_OPTIONS_H_

// Options and per-step statistics of the activation offloader. Plain structs:
// this header must stay free of LibTorch so that flag parsing, step reports
// and the server can use it cheaply.

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <tuple>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/offload/offload_fields.h"

namespace memprofd::offload {

// Where offloaded activations live until backward needs them.
enum class Target : int {
  // Host memory. With a CUDA compute device: pinned buffers filled on a side
  // stream. With a CPU compute device the activations already are in host
  // memory: nothing moves, every tensor is counted as SkipReason::kOnTarget.
  kHost = 0,
  // A spill file written by a background thread. The choice on CPU-only hosts.
  kDisk = 1,
};

// "host" / "disk".
absl::string_view TargetName(Target target);
// Parses "host" or "disk"; INVALID_ARGUMENT otherwise.
absl::StatusOr<Target> ParseTarget(absl::string_view name);
// Parses "auto" (kPrefetchAuto) or a depth >= 0; INVALID_ARGUMENT otherwise.
absl::StatusOr<int> ParsePrefetchDepth(absl::string_view text);

// prefetch_depth's default: 2 with a CUDA compute device, where copies back
// run on the GPU's copy engines; 0 with a CPU one, where bringing bytes back
// is CPU work (a read from the page cache) that only pays off with a core to
// spare (offload_bench measures both).
inline constexpr int kPrefetchAuto = -1;
inline constexpr int kCudaPrefetchDepth = 2;

struct OffloadOptions {
  // false: the hooks still run and account saved-activation bytes (so step
  // reports can show what offloading would save), but nothing moves; every
  // tensor is counted as SkipReason::kDisabled.
  bool enabled = false;
  Target target = Target::kDisk;
  // A storage whose first saved view covers fewer bytes than this stays on
  // the compute device. Compared with the bytes that would actually move (the
  // span the view covers), not with numel * element size. Later views of an
  // already offloaded storage always follow it, whatever their size.
  int64_t min_offload_bytes = 1024;
  // Copies out that may be in flight at once (>= 1). The source tensors of
  // in-flight copies stay resident, so this bounds the device memory the
  // offloader holds during forward: copies on the CUDA side stream, and
  // blocks queued for the spill-file writer.
  int max_copies_in_flight = 5;
  // Backward read-ahead (>= 0; 0 = off; kPrefetchAuto). When backward unpacks
  // an offloaded storage, the next `prefetch_depth` ones it will need (the
  // storages offloaded just before it in forward) start coming back in the
  // background: read from the spill file on a reader thread, and with a CUDA
  // compute device copied on a side stream that the consuming stream waits
  // for. At most this many storages are brought back ahead of need, so it
  // bounds the extra memory the read-ahead holds on the compute device.
  int prefetch_depth = kPrefetchAuto;
  // false: the output head (lm_head and loss) runs under a NoOffloadScope
  // nested in the offload scope (OffloadStepListener::HeadScope): its saved
  // tensors are counted and stay on the device (little compute, large
  // activations that backward needs first).
  bool offload_head = false;
  // Disk target (or host spill-over): directory of the spill file. The file
  // is unlinked right after it is created, so nothing is left behind.
  std::string spill_dir = "/tmp";
  // Host target with a CUDA compute device: once this many bytes are held in
  // host memory, further blocks go to the spill file. 0 = no limit.
  int64_t host_limit_bytes = 0;

  // Every field, for comparison. A field added above must be added here too:
  // a static_assert on the struct's size in offload_options.cc says so.
  auto Tie() const {
    return std::tie(enabled, target, min_offload_bytes, max_copies_in_flight,
                    prefetch_depth, offload_head, spill_dir, host_limit_bytes);
  }
  friend bool operator==(const OffloadOptions& a, const OffloadOptions& b) {
    return a.Tie() == b.Tie();
  }
  friend bool operator!=(const OffloadOptions& a, const OffloadOptions& b) {
    return !(a == b);
  }
};

// INVALID_ARGUMENT naming the first field out of range, as
// `<field_prefix><name>` ("offload." for a request's fields, "--" for the
// daemon's flags): min_offload_bytes or host_limit_bytes < 0, max_copies_in_flight
// < 1, prefetch_depth < 0 other than kPrefetchAuto, an empty spill_dir. The
// one check of these options: flags, requests and Offloader::Create use it.
absl::Status ValidateOffloadOptions(const OffloadOptions& options,
                                    absl::string_view field_prefix = "offload.");

// The offload options a request may give (offload_fields.h): every field left
// unset means "the daemon's" (its flags). Where it goes, paths and limits
// stay the daemon's.
struct OffloadOverrides {
#define MEMPROFD_OFFLOAD_OVERRIDE_(name, type, ...) std::optional<type> name;
  MEMPROFD_OFFLOAD_FIELDS(MEMPROFD_OFFLOAD_OVERRIDE_)
#undef MEMPROFD_OFFLOAD_OVERRIDE_

  friend bool operator==(const OffloadOverrides& a, const OffloadOverrides& b) {
#define MEMPROFD_OFFLOAD_EQUAL_(name, ...) &&a.name == b.name
    return true MEMPROFD_OFFLOAD_FIELDS(MEMPROFD_OFFLOAD_EQUAL_);
#undef MEMPROFD_OFFLOAD_EQUAL_
  }
  friend bool operator!=(const OffloadOverrides& a, const OffloadOverrides& b) {
    return !(a == b);
  }
};

// `defaults` with each field `request` gives in its place; then validated
// (ValidateOffloadOptions): INVALID_ARGUMENT names the request's field.
absl::StatusOr<OffloadOptions> MergeOffloadOverrides(const OffloadOptions& defaults,
                                                     const OffloadOverrides& request);

// Why the offloader left a saved tensor where it was. The one list of
// reasons: step reports (the proto's skipped_<name> fields) and metrics (the
// outcome label) take their names from SkipReasonName.
enum class SkipReason : int {
  // Parameters, buffers and their views (by storage), and leaves that
  // require grad.
  kParameter,
  // First view of a storage covering fewer than min_offload_bytes.
  kSmall,
  // Scalars wrapped into tensors (what Python's arg parser makes of
  // `x * 2.5`). LibTorch 2.6+ never passes them to saved-tensor hooks, so
  // this stays 0 there; the check guards the offloader if that changes.
  kWrappedNumber,
  // Sparse, quantized, nested, MKL-DNN or meta tensors, lazy conj/neg views.
  kNoStorage,
  // Already on the target (host target with a CPU compute device).
  kOnTarget,
  // Saved inside a NoOffloadScope.
  kExempt,
  // On a device that is neither the compute device nor the CPU.
  kOtherDevice,
  // Offloading disabled in the options (accounting only).
  kDisabled,
};
inline constexpr SkipReason kSkipReasons[] = {
    SkipReason::kParameter,   SkipReason::kSmall,    SkipReason::kWrappedNumber,
    SkipReason::kNoStorage,   SkipReason::kOnTarget, SkipReason::kExempt,
    SkipReason::kOtherDevice, SkipReason::kDisabled};
inline constexpr size_t kNumSkipReasons = std::size(kSkipReasons);

// "parameter", "small", "wrapped_number", "no_storage", "on_target",
// "exempt", "other_device", "disabled".
absl::string_view SkipReasonName(SkipReason reason);

// What the offloader did, per step (Offloader::EndStep) or in total
// (Offloader::Totals). Every saved tensor is counted exactly once:
//   tensors_seen = tensors_offloaded + skipped_total().
// Counters are cumulative over the period; the *_held and resident_* fields
// are gauges read when the stats were taken.
struct OffloadStats {
  int64_t tensors_seen = 0;
  // Saved tensors whose data left the compute device (dedup hits included).
  int64_t tensors_offloaded = 0;
  // Saved tensors left where they were, by reason (index: SkipReason).
  std::array<int64_t, kNumSkipReasons> skipped = {};
  int64_t& skipped_of(SkipReason reason) { return skipped[static_cast<size_t>(reason)]; }
  int64_t skipped_of(SkipReason reason) const {
    return skipped[static_cast<size_t>(reason)];
  }
  // Offloaded tensors whose storage was already (partly) offloaded this step,
  // and the bytes of their spans that therefore did not move again.
  int64_t dedup_hits = 0;
  int64_t dedup_bytes_saved = 0;
  // Bytes copied off the compute device, and back.
  int64_t bytes_out = 0;
  int64_t bytes_in = 0;
  // The part of bytes_in that the backward read-ahead brought back before an
  // unpack asked for it.
  int64_t bytes_prefetched = 0;
  // Host time unpacks spent waiting for offloaded bytes to come back (reading
  // them, or waiting for a read-ahead already under way): what offloading
  // adds to backward. With a CUDA device the copies themselves are
  // asynchronous; the consuming stream waits for them, not the host.
  int64_t reload_wait_ns = 0;
  // The TRL baseline: what TRL's activation offloader (key: storage pointer
  // + offset and dtype; numel * element size, the whole storage for
  // broadcasts) would have copied off for the same saved tensors, at its best
  // (dedup over the whole step).
  int64_t trl_baseline_bytes_out = 0;
  // Bytes on the compute device that saved activations keep alive: storages
  // of kept (non-parameter) tensors, sources of in-flight copies, reloaded
  // buffers. Peak over the period, and the value when the stats were taken.
  int64_t peak_resident_saved_bytes = 0;
  int64_t resident_saved_bytes = 0;
  // Offloaded bytes held in host memory and in the spill file right now.
  int64_t host_bytes_held = 0;
  int64_t disk_bytes_held = 0;
  // Offload effectiveness: the bytes_out of storages whose compute-device
  // memory really went free once copied (nothing but saved tensors' hooks
  // referred to them), and of storages something else kept alive (a view held
  // elsewhere, a tensor kept in a custom function's ctx or by the caller): the
  // bytes moved, the device memory stayed. Decided once per storage, at the
  // end of forward (Offloader::MarkForwardEnd) or, for a storage offloaded
  // after it (the checkpoint recompute in backward) or without it, at its
  // first reload or release. Once every storage of the period is decided,
  // effective_bytes + ineffective_bytes == bytes_out.
  int64_t effective_bytes = 0;
  int64_t ineffective_bytes = 0;

  // Adds `other`'s counters, keeps the larger peak and takes `other`'s gauges
  // (`other` is the later period).
  void Add(const OffloadStats& other);
  // Sum of `skipped` over every reason.
  int64_t skipped_total() const;
};

}  // namespace memprofd::offload

#endif  // MEMPROFD_CORE_OFFLOAD_OFFLOAD_OPTIONS_H_
