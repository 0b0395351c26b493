#ifndef MEMPROFD_CORE_SNAPSHOT_WRITER_H_
#define MEMPROFD_CORE_SNAPSHOT_WRITER_H_

// Writes save_pretrained-style snapshots: safetensors shards (+ index),
// config.json and memprofd_manifest.json, and for a checkpoint the optimizer
// files and trainer_state.json (checkpoint_files.h), atomically, streaming
// every tensor from wherever it lives (device, CPU, a mapped file) through
// one fixed staging buffer.

#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/snapshot/checkpoint_files.h"
#include "core/snapshot/manifest.h"
#include "core/snapshot/safetensors.h"
#include "core/snapshot/snapshot_options.h"

namespace memprofd {
namespace snapshot {

// Called after every chunk with tensor data bytes written so far and the
// total; runs on the writing thread and must be cheap.
using SnapshotProgressFn = std::function<void(int64_t bytes_written, int64_t total)>;
// Polled before every chunk; true stops the snapshot with CANCELLED.
using SnapshotCancelFn = std::function<bool()>;

// How the writer reaches tensors that are not resident all the time: the
// parameters of a fully sharded data-parallel run, each kept as flat shards
// over the ranks, which rank 0 gathers one at a time as it writes them.
// The writer acquires each weight (its index in the TensorList given to
// Write) just before reading its first byte and releases it as soon as its
// bytes are written, so that at most one acquired tensor is held at a time.
// The order is the writer's (the files' layout); the access follows it.
class TensorAccess {
 public:
  virtual ~TensorAccess() = default;
  // Makes tensors[index]'s data readable. The bytes this allocated for it
  // (0: it was resident), counted into the manifest's peak_gathered_bytes;
  // an error stops the write.
  virtual absl::StatusOr<int64_t> Acquire(size_t index) = 0;
  // Frees what Acquire allocated; called once per successful Acquire.
  virtual void Release(size_t index) = 0;
};

// Writes snapshots under one root directory. Memory: the only host memory it
// allocates is the staging buffer (options.staging_bytes, at most once per
// snapshot, only when some tensor needs it: see StagingBuffer), whatever the
// model size; it never copies a whole tensor. Host tensors already in the
// output dtype are written straight from their memory.
// Atomicity: a snapshot is written into `<root>/.tmp-<name>-XXXXXX`, every
// file and the directory fsynced, then renamed to `<root>/<name>` (never
// replacing anything) and the root fsynced; any failure, cancellation or
// kill leaves no `<root>/<name>` and touches no other snapshot (the hidden
// leftovers of a kill are removed by CleanLeftovers).
// Thread-compatible: call Write from the thread that owns the tensors (the
// daemon's owner thread), one at a time; or, for async mode, from a
// background thread on an AsyncSnapshotSource with
// options.enter_snapshot_phase = false.
class SnapshotWriter {
 public:
  // `root` is created on first write if missing.
  explicit SnapshotWriter(std::string root) : root_(std::move(root)) {}

  // Writes `tensors` (ordered as the state dict; the order decides sharding)
  // and `config_json` (config.json's text; empty: none is written; when the
  // dtype option converts, its "torch_dtype" is updated) as snapshot `name`.
  // Errors (the temporary directory is always removed):
  // - INVALID_ARGUMENT: bad name (see ValidateSnapshotName), bad options,
  //   duplicate tensor names, unsupported dtypes, config not JSON;
  // - ALREADY_EXISTS: `name` exists;
  // - FAILED_PRECONDITION / PERMISSION_DENIED: the root cannot be created
  //   or written, or a tensor has no data (meta);
  // - RESOURCE_EXHAUSTED: disk full or file too large (ENOSPC, EFBIG), or
  //   the staging buffer cannot be allocated;
  // - CANCELLED: `cancel` returned true;
  // - `access`'s errors (null: every tensor is resident).
  absl::StatusOr<SnapshotManifest> Write(
      absl::string_view name, const TensorList& tensors, absl::string_view config_json,
      const SnapshotOptions& options, const SnapshotProgressFn& progress = nullptr,
      const SnapshotCancelFn& cancel = nullptr, TensorAccess* access = nullptr) const;

  // The same, as a checkpoint: the weights as above, then the optimizer
  // tensors of `checkpoint` sharded as the weights are (optimizer.safetensors,
  // or optimizer-0000K-of-0000N.safetensors + optimizer.index.json), then
  // trainer_state.json, all in the one temporary directory and published by
  // the one rename; the manifest's kind is "checkpoint". With options.kind
  // kAdapter, the weights are a LoRA model's adapters in peft's layout
  // (adapter_config.json, adapter_model.safetensors): a checkpoint of the
  // adapters alone, resumed onto the same base (IsAdapterDirectory). Streams every
  // optimizer tensor through the same staging buffer. Write's errors, and
  // INVALID_ARGUMENT when options.dtype would convert a weight (a
  // checkpoint keeps the weights' own dtype, which is what makes a resume
  // exact) or an optimizer tensor name is also a weight name.
  absl::StatusOr<SnapshotManifest> WriteCheckpoint(
      absl::string_view name, const TensorList& tensors, absl::string_view config_json,
      const CheckpointPayload& checkpoint, const SnapshotOptions& options,
      const SnapshotProgressFn& progress = nullptr,
      const SnapshotCancelFn& cancel = nullptr, TensorAccess* access = nullptr) const;

  const std::string& root() const { return root_; }

 private:
  absl::StatusOr<SnapshotManifest> WriteImpl(
      absl::string_view name, const TensorList& tensors, absl::string_view config_json,
      const CheckpointPayload* checkpoint, const SnapshotOptions& options,
      const SnapshotProgressFn& progress, const SnapshotCancelFn& cancel,
      TensorAccess* access) const;

  std::string root_;
};

// The source of an async snapshot: host copies taken at a step boundary.
struct AsyncSnapshotSource {
  // Contiguous CPU tensors in the output dtype (the tied head already
  // dropped when options.tie_word_embeddings), in state-dict order; they
  // share nothing with the model, so training may go on while another
  // thread writes them (zero copy: Write allocates no staging buffer).
  TensorList tensors;
  // Host bytes they hold: what the async mode costs; pass it as
  // SnapshotOptions::held_host_bytes.
  int64_t host_bytes = 0;
};

// Copies `tensors` to host memory in the dtype `options` asks for, one
// tensor at a time (a device tensor that needs a dtype conversion makes one
// host temporary of its own size, freed at once). Call on the owner thread at a step
// boundary. INVALID_ARGUMENT / FAILED_PRECONDITION as Write for tensors it
// cannot save; RESOURCE_EXHAUSTED when host memory runs out (the copies made
// so far are freed); `access`'s errors (each tensor is acquired for its copy
// and released after it, as Write does).
absl::StatusOr<AsyncSnapshotSource> CopyForAsyncSnapshot(const TensorList& tensors,
                                                         const SnapshotOptions& options,
                                                         TensorAccess* access = nullptr);

}  // namespace snapshot
}  // namespace memprofd

#endif  // MEMPROFD_CORE_SNAPSHOT_WRITER_H_
