#ifndef MEMPROFD_CORE_DIST_PARAMETER_SHARDING_H_
#define MEMPROFD_CORE_DIST_PARAMETER_SHARDING_H_

// The parameters of a fully sharded (ZeRO-3) data-parallel run: each rank
// keeps only the parameters it owns (the partition of ZeRO-1 and ZeRO-2,
// OptimizerSharding's BalancedOwners: whole parameters, a contiguous run of
// the model per rank) and holds any other parameter only while a unit of the
// model that uses it runs.
//
//   Gather(unit)   every rank takes each of the unit's parameters from its
//                  owner (a broadcast per parameter, in model order): a
//                  non-owner's storage is allocated again and filled. Before
//                  the unit's forward, and before its backward (the hook on
//                  its output), so that a checkpointed layer's recomputation
//                  finds its weights.
//   Release(unit)  a non-owner frees the unit's parameters' storages (no
//                  collective). After the unit's forward; in backward, each
//                  parameter is freed as soon as its gradient is accumulated
//                  (a post-hook on its gradient accumulator, which runs after
//                  every node that reads the parameter).
//
// How a parameter is freed and brought back: its storage (one per
// parameter) is resized to 0 bytes and back, the storage object itself kept,
// as FSDP's first version does. So the tensors autograd saved in forward (a
// leaf is saved as itself, never copied), the offloader's filter of
// parameter storages and every view stay valid, and the parameter's version
// counter never moves (the broadcast writes through an alias with a counter
// of its own), so autograd does not see the refill as an in-place change.
// The refilled storage is tagged gathered_parameters with its module, the
// owner's stays parameters.
//
// Communication overlaps compute: once a unit's parameters are there,
// Gather starts the broadcasts of the next unit's (the next layer in
// forward, the previous one in backward) without waiting for them, so they
// travel while the unit computes; the next Gather waits for what is still in
// flight (the exposed time). So a rank holds at most two units of others'
// parameters at once, besides the head between its forward and its backward.
//
// A reader on rank 0 that needs the parameters one at a time (the snapshot
// writer at a step boundary, which must never hold a second copy of the
// model) streams them:
//
//   StreamParameter(k)  rank 0 broadcasts the index k, then every rank takes
//                       parameter k from its owner; rank 0 reads it and
//                       ReleaseParameter(k)s it.
//   EndStream()         rank 0 broadcasts -1.
//   FollowStream()      every other rank: joins each of rank 0's broadcasts,
//                       holding each parameter only while it travels, until
//                       the -1.
//
// So the order is rank 0's alone (the writer's file layout decides it), the
// collectives match on every rank, and each rank holds at most one of the
// others' parameters at a time.
//
// Every rank calls Gather with the same units in the same order (the same
// model and step): which parameters a call broadcasts, and in what order,
// depends only on that order, so the ranks' collectives match. The
// embedding's backward reads only the token ids, so the embedding is not
// gathered for it.
//
// Thread-safety: the trainer's owner thread (and the autograd hooks on it).
// The group and the model must outlive this.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/dist/accumulator_hooks.h"
#include "core/dist/process_group.h"
#include "core/train/step_listener.h"

namespace memprofd {

class LlamaModel;

struct ParameterShardingStats {
  // Bytes of the parameters this rank owns (kept whole all along).
  int64_t owned_bytes = 0;
  // Bytes of other ranks' parameters held now, and the most held at once
  // since the last ResetPeak: the gathered working set.
  int64_t gathered_bytes = 0;
  int64_t peak_gathered_bytes = 0;
  // Parameter broadcasts (gathers) since the last ResetPeak, and those of
  // them started ahead of their unit (the next unit's, overlapped).
  int64_t broadcasts = 0;
  int64_t prefetched = 0;
  // Time Gather and GatherAll spent waiting for broadcasts since the last
  // ResetPeak: the communication compute did not hide.
  double exposed_seconds = 0;
};

class ParameterSharding {
 public:
  // Takes `owners` (one per model->Parameters() entry, the owning rank) and
  // installs the free-after-gradient hooks; every parameter is still whole
  // (ReleaseAll frees the others'). INVALID_ARGUMENT when the owners do not
  // match the parameters or a parameter shares its storage with another
  // tensor; FAILED_PRECONDITION for a model with modules placed off the
  // device (their weights are views of host or disk memory, not the rank's
  // to free).
  static absl::StatusOr<std::unique_ptr<ParameterSharding>> Create(
      ProcessGroup* group, LlamaModel* model, std::vector<int> owners);
  ~ParameterSharding();  // removes the hooks; leaves the storages as they are
  ParameterSharding(const ParameterSharding&) = delete;
  ParameterSharding& operator=(const ParameterSharding&) = delete;

  // Gathers `unit`'s parameters that are not held and waits for those in
  // flight, then starts the next unit's (above); backward for the gather
  // before the unit's backward (nothing for the embedding). The collective's
  // status on failure (the run is then broken).
  absl::Status Gather(const ModelUnit& unit, bool backward);
  // Frees `unit`'s parameters that others own.
  void Release(const ModelUnit& unit);
  // Every parameter, whole, on every rank (a broadcast of each not held);
  // the model is then as unsharded data parallel leaves it.
  absl::Status GatherAll();
  // Frees every parameter this rank does not own.
  void ReleaseAll();

  // The parameter stream (above). Call only where the model is sharded (no
  // unit gathered: at a step boundary). StreamParameter: rank 0 only;
  // returns the bytes it allocated to hold parameter k (0 when this rank
  // owns it); INVALID_ARGUMENT for k out of range, else the collectives'
  // status (the run is then broken). FollowStream: the other ranks; the
  // collectives' status, or INTERNAL for an index out of range.
  absl::StatusOr<int64_t> StreamParameter(size_t k);
  void ReleaseParameter(size_t k) { FreeOne(k); }
  absl::Status EndStream();
  absl::Status FollowStream();
  // The index of parameter `p` (the same tensor) in model->Parameters();
  // nullopt for a tensor that is not one of them.
  std::optional<size_t> IndexOf(const at::Tensor& p) const;

  const ParameterShardingStats& stats() const { return stats_; }
  void ResetPeak();

 private:
  ParameterSharding(ProcessGroup* group, LlamaModel* model,
                    std::vector<at::Tensor> params, std::vector<int> owners);
  // Parameter indices of `unit`, in model order (units_'s entry).
  const std::vector<size_t>& UnitParameters(const ModelUnit& unit) const;
  // The unit that runs after `unit` in forward, or in backward; nullopt for
  // none (the head in forward; the first layer in backward, since the
  // embedding is not gathered for its backward).
  std::optional<ModelUnit> NextUnit(const ModelUnit& unit, bool backward) const;
  // Allocates a parameter others own and starts its broadcast from the
  // owner; Complete waits for it.
  absl::Status StartGather(size_t index);
  absl::Status Complete(size_t index);
  // StartGather and Complete, unless the parameter is held.
  absl::Status GatherOne(size_t index);
  // Rank 0's stream index (-1: the end), broadcast from rank 0.
  absl::StatusOr<int64_t> BroadcastStreamIndex(int64_t index);
  void FreeOne(size_t index);

  ProcessGroup* const group_;
  LlamaModel* const model_;
  const std::vector<at::Tensor> params_;
  const std::vector<int> owners_;
  std::vector<int64_t> nbytes_;  // each parameter's storage bytes, whole
  std::vector<bool> held_;       // by every rank (the same on all)
  // Broadcasts started and not waited for, with the alias each writes to.
  std::vector<PendingCollective> pending_;
  std::vector<at::Tensor> aliases_;
  std::vector<int64_t> modules_;  // each parameter's ModuleId, for tagging
  // Each unit's parameter indices: the embedding, each layer, the head.
  std::vector<std::vector<size_t>> units_;
  std::unique_ptr<AccumulatorHooks> hooks_;  // frees each after its gradient
  ParameterShardingStats stats_;
};

}  // namespace memprofd

#endif  // MEMPROFD_CORE_DIST_PARAMETER_SHARDING_H_
